"""`python -m tests.conformance --http URL | --stdio COMMAND [--token T] [--only TEXT]`; exit 1 on any failure."""

from __future__ import annotations

import argparse
import asyncio
import sys

from .suite import run
from .wire import HTTPTransport, StdioTransport


async def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.conformance", description=__doc__)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--http", metavar="URL")
    target.add_argument("--stdio", metavar="COMMAND")
    parser.add_argument("--token", help="bearer token for an authenticated HTTP server")
    parser.add_argument("--only", help="run only checks whose name contains this text")
    args = parser.parse_args()
    if args.http:
        transport = HTTPTransport(args.http, args.token)
    else:
        transport = StdioTransport(args.stdio)
        await transport.start()
    try:
        results = await run(transport, only=args.only)
    finally:
        await transport.close()
    return 1 if any(r.outcome == "fail" for r in results) else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
