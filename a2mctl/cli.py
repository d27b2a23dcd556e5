"""`a2m` — serve a tier or the router, run the whole federation, check it, move data in and out.

Subcommands import what they need lazily, so `a2m doctor` does not load
PostgreSQL drivers and a tier server loads only its own engine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path


def default_data_dir() -> Path:
    """Where `a2m up` and `a2m serve` keep data unless told otherwise: $A2M_DATA or the user's data dir."""
    if os.environ.get("A2M_DATA"):
        return Path(os.environ["A2M_DATA"])
    from platformdirs import user_data_dir

    return Path(user_data_dir("a2m-router"))


def _tokens(values: list[str]) -> dict[str, object]:
    """`--token TOKEN=principal`: a bearer token and the owner scope it grants."""
    out: dict[str, object] = {}
    for value in values:
        token, sep, principal = value.partition("=")
        if not sep or not token or not principal:
            raise SystemExit(f"--token expects TOKEN=PRINCIPAL, got {value!r}")
        out[token] = principal
    return out


def _option(text: str) -> tuple[str, object]:
    """`--option KEY=VALUE`: booleans and numbers are typed, so `review=false` means False."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise SystemExit(f"--option expects KEY=VALUE, got {text!r}")
    lowered = value.strip().lower()
    if lowered in ("true", "yes", "on"):
        return key, True
    if lowered in ("false", "no", "off"):
        return key, False
    for kind in (int, float):
        try:
            return key, kind(value)
        except ValueError:
            pass
    return key, value


def _serve(args: argparse.Namespace) -> int:
    from a2m.http import SERVICE, HTTPSettings
    from a2m.stdio import log_to_stderr

    log_to_stderr()
    tokens = _tokens(args.token)
    origins = frozenset(args.origin or [o for o in os.environ.get("A2M_ALLOWED_ORIGINS", "").split(",") if o])
    if args.what == "router":
        from router.config import ConfigError
        from router.server import build_router

        try:
            server = build_router(args.config)
        except ConfigError as exc:
            print(f"a2m serve router: {exc}", file=sys.stderr)
            return 2
        configured = server.http_settings(tokens)  # [auth] tokens and origins from router.toml, and --token
        tokens = dict(configured.tokens)
        origins |= configured.allowed_origins
    else:
        # Tier servers trust the router's service token to name owners; the router itself
        # only presents it to its tiers, so it is never a front-door token there.
        service_token = args.service_token or os.environ.get("A2M_SERVICE_TOKEN")
        if service_token:
            tokens[service_token] = SERVICE
        from a2m.embedder import make_embedder
        from backends.serve import build
        from backends.settings import TierSettings

        data = (Path(args.data).expanduser() if args.data else default_data_dir()).resolve()
        name = args.name or args.what
        options = dict(_option(opt) for opt in args.option)
        url = args.url or os.environ.get(f"A2M_{args.what.upper()}_URL")
        settings = TierSettings(name=name, data_dir=data / name, url=url, options=options)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        embedder = make_embedder(args.embedder or os.environ.get("A2M_EMBEDDER"),
                                 model=os.environ.get("A2M_EMBEDDER_MODEL"))
        server = build(args.what, settings, embedder=embedder)
    from a2m import tracing
    from a2m.dispatch import Dispatcher

    tracing.configure("a2m-router" if args.what == "router" else f"a2m-{name}")
    http_settings = HTTPSettings(allowed_origins=origins, tokens=tokens)
    if args.stdio:
        from a2m.stdio import serve_stdio

        asyncio.run(serve_stdio(Dispatcher(server), lifespan=server))
        return 0
    from a2m.http import HTTPApp, run

    def listening(url: str) -> None:
        # Whatever the log level (uvicorn's own line is at info), and on stderr: the port may have
        # been chosen just now (the default, 0, is any free port). `a2m up` prints its own line per
        # tier once all are ready, so the servers it starts are told to stay quiet (A2M_ANNOUNCE=0).
        if os.environ.get("A2M_ANNOUNCE", "1") != "0":
            print(f"a2m serve {args.what}: listening on {url}", file=sys.stderr, flush=True)

    run(HTTPApp(Dispatcher(server), http_settings, lifespan=server), host=args.host, port=args.port,
        log_level=args.log_level, on_listening=listening)
    return 0


def _up(args: argparse.Namespace) -> int:
    from .up import up

    return up(args)


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import doctor

    return asyncio.run(doctor(args.url, token=args.token))


def _transfer(args: argparse.Namespace) -> int:
    from . import transfer

    if args.command == "export":
        owners = ([None] if args.unowned or not args.owner else []) + (args.owner or [])
        return asyncio.run(transfer.export(args.url, args.file, token=args.token, embeddings=args.embeddings,
                                           owners=owners))
    return asyncio.run(transfer.import_(args.url, args.file, token=args.token, batch=args.batch))


def _bench(args: argparse.Namespace) -> int:
    import runpy

    # bench/ sits beside the packages in a source checkout (`make install` installs it editable);
    # a wheel carries only the packages.
    script = Path(__file__).resolve().parent.parent / "bench" / "run_all.py"
    if not script.is_file():
        print(f"a2m bench: the benchmarks are not installed here (no {script}); run `a2m bench` from a "
              "source checkout of a2m-router (`make bench`, or `pip install -e .` there)", file=sys.stderr)
        return 2
    sys.argv = [str(script)] + (["--quick"] if args.quick else [])
    runpy.run_path(str(script), run_name="__main__")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="a2m", description="a2m-router: a federated A2M memory service")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run one tier server or the router")
    serve.add_argument("what", choices=["working", "episodic", "semantic", "procedural", "corpus", "router"])
    serve.add_argument("--host", default=os.environ.get("A2M_HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(os.environ.get("A2M_PORT", "0") or 0))
    serve.add_argument("--stdio", action="store_true", help="speak JSON-RPC on stdin/stdout instead of HTTP")
    serve.add_argument("--data", help="data directory (default: $A2M_DATA or the user data dir)")
    serve.add_argument("--url", help="use this engine (redis://, postgresql://, http://qdrant:6333, a repo path)")
    serve.add_argument("--name", help="the tier's name in describe (default: the tier kind)")
    serve.add_argument("--config", help="router.toml (router only)")
    serve.add_argument("--embedder", help="none | local | an OpenAI-compatible base URL")
    serve.add_argument("--option", action="append", default=[], help="engine option KEY=VALUE")
    serve.add_argument("--token", action="append", default=[], help="bearer TOKEN=PRINCIPAL (repeatable)")
    serve.add_argument("--service-token", help="bearer token trusted to name any owner (the router's)")
    serve.add_argument("--origin", action="append", help="allowed browser Origin (repeatable)")
    serve.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug", "trace"])
    serve.set_defaults(run=_serve)

    up = sub.add_parser("up", help="run the whole federation on embedded engines")
    up.add_argument("--data", help="data directory (default: $A2M_DATA or the user data dir)")
    up.add_argument("--tiers", default="working,episodic,semantic,procedural",
                    help="which tier servers to start, comma-separated (default: all four)")
    up.add_argument("--port", type=int, default=8700, help="the router's port; tiers use the next ones")
    up.add_argument("--config", help="the router's router.toml (default: one written into the data dir on "
                                     "every start, for the tiers started on the ports above)")
    up.set_defaults(run=_up)

    doctor = sub.add_parser("doctor", help="health of a router (or any A2M URL) and its tiers")
    doctor.add_argument("url", nargs="?", default="http://127.0.0.1:8700/")
    doctor.add_argument("--token")
    doctor.set_defaults(run=_doctor)

    for name in ("export", "import"):
        p = sub.add_parser(name, help=f"{name} records as JSON Lines through any A2M endpoint")
        p.add_argument("url")
        p.add_argument("file", help="JSON Lines file ('-' for stdout/stdin)")
        p.add_argument("--token")
        if name == "export":
            p.add_argument("--embeddings", action="store_true", help="include vectors")
            p.add_argument("--owner", action="append", default=None,
                           help="export this owner's records (repeatable; default: the unowned partition)")
            p.add_argument("--unowned", action="store_true",
                           help="also export the unowned partition when --owner names owners")
        else:
            p.add_argument("--batch", type=int, default=500)
        p.set_defaults(run=_transfer)

    bench = sub.add_parser("bench", help="run every benchmark and print a table")
    bench.add_argument("--quick", action="store_true")
    bench.set_defaults(run=_bench)

    args = parser.parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
