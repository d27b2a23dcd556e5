"""Run the in-memory test fixture as an A2M server: `python -m tests.support.testserver [--stdio] [--port N] [--broken]`.

Extra switches make deliberately broken servers for the suite's self-test:
`--broken order` (timeline newest-first) and `--broken gating` (answers -32601
for a declared-off capability instead of -32003). `--capabilities a,b` declares
only those (and core), `--no-limits` no limits: the rules for undeclared
capabilities and for `limit: 0` without `max_recall_limit` then apply.
`--paged` answers the timeline cursor extension, `--max-recall-limit N` declares
a smaller cap than the tier servers' (a third-party server may). `--slow-writes S`
takes S seconds over each write, the request already running (a stalled engine).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from a2m.dispatch import Dispatcher
from a2m.errors import A2MError, METHOD_NOT_FOUND
from a2m.http import HTTPApp, HTTPSettings, run
from a2m.stdio import log_to_stderr, serve_stdio
from backends.surface import TierServer

from a2m.params import DEFAULT_LIMITS

from .memstore import CAPABILITIES, BrokenStore, MemoryStore, PagedStore, SlowStore


class GatingBrokenDispatcher(Dispatcher):
    async def call(self, method, params, ctx):  # type: ignore[no-untyped-def]
        if method == "memory/summarize":
            raise A2MError(METHOD_NOT_FOUND, "not here")
        return await super().call(method, params, ctx)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stdio", action="store_true")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--broken", choices=["order", "gating"])
    parser.add_argument("--read-only", action="store_true")
    parser.add_argument("--name", default="memory")
    parser.add_argument("--kind", default="episodic", choices=["working", "episodic", "semantic", "procedural"])
    parser.add_argument("--capabilities", help="declare only these (comma-separated; core is always declared)")
    parser.add_argument("--no-limits", action="store_true", help="declare no limits")
    parser.add_argument("--paged", action="store_true", help="answer the timeline cursor extension")
    parser.add_argument("--max-recall-limit", type=int, help="declare this max_recall_limit")
    parser.add_argument("--slow-writes", type=float, help="take this many seconds over each write")
    args = parser.parse_args()
    store = (BrokenStore() if args.broken == "order" else PagedStore() if args.paged
             else SlowStore(args.slow_writes) if args.slow_writes else MemoryStore())
    caps = CAPABILITIES - {"summarize"} if args.broken == "gating" else CAPABILITIES
    if args.capabilities is not None:
        caps = frozenset({"core", *filter(None, args.capabilities.split(","))})
    limits = {} if args.no_limits else dict(DEFAULT_LIMITS)
    if args.max_recall_limit:
        limits["max_recall_limit"] = args.max_recall_limit
    server = TierServer(store, name=args.name, kind=args.kind, capabilities=caps, read_only=args.read_only,
                        limits=limits)
    dispatcher = (GatingBrokenDispatcher if args.broken == "gating" else Dispatcher)(server)
    log_to_stderr()
    if args.stdio:
        asyncio.run(serve_stdio(dispatcher, lifespan=server))
    else:
        run(HTTPApp(dispatcher, HTTPSettings(allowed_origins=frozenset({"http://allowed.example"})), lifespan=server),
            port=args.port)
    sys.exit(0)


if __name__ == "__main__":
    main()
