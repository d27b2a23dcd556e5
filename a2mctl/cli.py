"""`a2m` — serve a tier or the router, run the whole federation, check it, move data in and out.

Subcommands import what they need lazily, so `a2m doctor` does not load
PostgreSQL drivers and a tier server loads only its own engine.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any, Coroutine


def default_data_dir() -> Path:
    """Where `a2m up` and `a2m serve` keep data unless told otherwise: $A2M_DATA or the user's data dir."""
    if os.environ.get("A2M_DATA"):
        return Path(os.environ["A2M_DATA"])
    from platformdirs import user_data_dir

    return Path(user_data_dir("a2m-router"))


def _metrics_token(args: argparse.Namespace, tokens: dict[str, object],
                   presented: str | None = None, cursor_secret: str | None = None) -> str | None:
    """`--metrics-token` / $A2M_METRICS_TOKEN: the bearer token /metrics asks for (None: it is open).
    Never a caller's token: its holder could read every tenant's request counts. Nor the service
    token the router presents to its tiers (`presented`), which is in no caller's `tokens` there:
    the scraper holding it could name any owner on every tier."""
    from a2m.http import token_problem

    token = args.metrics_token or os.environ.get("A2M_METRICS_TOKEN") or None
    if token is None:
        return None
    problem = token_problem(token) or (
        "is also a bearer token callers present: give /metrics a token of its own" if token in tokens else
        "is the service token the router presents to its tiers: give /metrics a token of its own"
        if token == presented else
        "is the router's cursor_secret, which no caller may hold: give /metrics a token of its own"
        if token == cursor_secret else None)
    if problem:
        raise SystemExit(f"a2m serve {args.what}: --metrics-token / A2M_METRICS_TOKEN {problem}")
    return token


def _tls(args: argparse.Namespace) -> dict[str, str]:
    """`--tls-cert` / `--tls-key` ($A2M_TLS_CERT / $A2M_TLS_KEY): HTTPS where both are given, loaded
    here so that a wrong path, a key that is not the certificate's, a passphrase-protected key or an
    expired certificate (every client that verifies refuses it; probes that do not call it ready) is one
    line at start, not uvicorn's traceback after the engines started. `--tls-client-ca`
    ($A2M_TLS_CLIENT_CA): mutual TLS on top, the CA checked here the same way."""
    import datetime
    import ssl

    cert = args.tls_cert or os.environ.get("A2M_TLS_CERT") or None
    key = args.tls_key or os.environ.get("A2M_TLS_KEY") or None
    client_ca = args.tls_client_ca or os.environ.get("A2M_TLS_CLIENT_CA") or None
    if client_ca is not None and cert is None and key is None:
        raise SystemExit(f"a2m serve {args.what}: --tls-client-ca (A2M_TLS_CLIENT_CA) asks clients for a "
                         "certificate over HTTPS: give --tls-cert and --tls-key (A2M_TLS_CERT / A2M_TLS_KEY) too")
    if cert is None and key is None:
        return {}
    where = f"a2m serve {args.what}: --tls-cert / --tls-key (A2M_TLS_CERT / A2M_TLS_KEY)"
    if cert is None or key is None:
        raise SystemExit(f"{where}: give both, the certificate chain and its private key (PEM files)")
    if args.stdio:
        raise SystemExit(f"{where}: TLS is for HTTP, not --stdio")
    from a2m.certificates import ca_problem, expired_note, load_pair, not_after

    try:
        load_pair(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH), cert, key)
    except ValueError as exc:
        raise SystemExit(f"{where}: {exc}") from None
    try:
        ends: datetime.datetime | None = not_after(cert)
    except (ValueError, OSError):  # OpenSSL loaded it: served, and the server warns that its end is unread
        ends = None
    if ends is not None and ends <= datetime.datetime.now(datetime.timezone.utc):
        raise SystemExit(f"{where}: {expired_note(cert, ends)}: every client that verifies it would refuse "
                         "the connection; renew it")
    if client_ca is None:
        return {"tls_cert": cert, "tls_key": key}
    problem = ca_problem(client_ca)
    if problem:
        raise SystemExit(f"a2m serve {args.what}: --tls-client-ca (A2M_TLS_CLIENT_CA): {problem}")
    return {"tls_cert": cert, "tls_key": key, "tls_client_ca": client_ca}


def _client_certificate(command: str) -> None:
    """$A2M_TLS_CLIENT_CERT / $A2M_TLS_CLIENT_KEY, the certificate every outgoing https call presents
    (mutual TLS), loaded once here: one of them without the other, or a pair that does not load, is one
    line at start, not an error from the first call (the router's to its tiers, doctor's, export's)."""
    from a2m.http1 import client_tls

    try:
        client_tls()
    except ValueError as exc:
        raise SystemExit(f"{command}: {exc}") from None


def _tokens(values: list[str], service_token: str | None) -> dict[str, object]:
    """`--token TOKEN=principal`: a bearer token and the owner scope it grants; checked as router.toml's
    [auth] tokens are (a2m.http says what a header can carry)."""
    from a2m.http import token_problem

    out: dict[str, object] = {}
    for value in values:
        token, sep, principal = value.partition("=")
        if not sep or not token or not principal.strip():
            raise SystemExit(f"--token expects TOKEN=PRINCIPAL, got {value!r}")
        problem = token_problem(token)
        if problem:
            raise SystemExit(f"--token: the token of principal {principal!r} {problem}")
        if token == service_token:
            raise SystemExit(f"--token: the token of principal {principal!r} is the service token, which the "
                             f"tiers trust to name any owner: give {principal!r} a token of its own")
        if out.get(token, principal) != principal:
            raise SystemExit(f"--token: one token is given for both {out[token]!r} and {principal!r}")
        out[token] = principal
    return out


def _origins(values: list[str]) -> frozenset[str]:
    from a2m.http import origin_problem

    for origin in values:
        problem = origin_problem(origin)
        if problem:
            raise SystemExit(f"--origin / A2M_ALLOWED_ORIGINS: {problem}")
    return frozenset(values)


def _port(text: str) -> int:
    """A TCP port, 0 for any free one. Checked here: the event loop takes 99999 as 34463."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a port is a number from 0 to 65535, not {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a number from 0 to 65535, not {port}")
    return port


def reachable_from_network(host: str) -> bool:
    """Whether binding `host` listens beyond this machine (a name other than localhost counts as reachable)."""
    import ipaddress

    if host.lower() == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return True


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, not {text!r}")
    return value


def _seconds(text: str) -> float:
    """A positive, finite number of seconds (a flag's or its variable's text)."""
    import math

    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, not {text!r}")
    return value


def _wait(text: str) -> float:
    """Seconds to wait for something: 0 (not at all) or `_seconds`."""
    try:
        return 0.0 if float(text) == 0 else _seconds(text)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"expected 0 or a number of seconds above 0, not {text!r}") from None


def http_url_problem(text: str) -> str | None:
    """What is wrong with `text` as an A2M server's http(s) URL, or None: said at the command line,
    not as a traceback from deep in a client."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 — raises ValueError on a port out of range
    except ValueError as exc:
        return f"{text!r} is not a URL: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"expected an http(s):// URL such as http://127.0.0.1:8700/, not {text!r}"
    return None


def _http_url(text: str) -> str:
    problem = http_url_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def _option(text: str) -> tuple[str, str]:
    """`--option KEY=VALUE`, the value as written: the engine's check types it (backends.serve), so
    `collection=007` stays "007" and `review=false` is still False."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise SystemExit(f"--option expects KEY=VALUE, got {text!r}")
    return key, value


# Flags of `a2m serve` that one kind of server never reads, and where its setting lives instead:
# given there, they are refused rather than dropped (a router given --service-token called its tiers
# without one).
TIER_FLAGS = {
    "service_token": ("--service-token", "service_token in router.toml or $A2M_SERVICE_TOKEN"),
    "embedder": ("--embedder", "embedder in router.toml"),
    "data": ("--data", "the router keeps no data; its tiers do"),
    "url": ("--url", "each tier's url in router.toml [[tiers]]"),
    "name": ("--name", "name in router.toml"),
    "option": ("--option", "the router's settings are in router.toml"),
}


def _unread_flag(args: argparse.Namespace) -> str | None:
    """The first flag given that this server would never read, said with where its setting lives."""
    if args.what != "router":
        if args.config is not None:
            return ("--config is the router's router.toml; a tier server takes --url, --option and the other "
                    "flags of docs/configuration.md")
        return None
    for attr, (flag, instead) in TIER_FLAGS.items():
        if getattr(args, attr):
            return f"{flag} is a tier server's flag; for the router: {instead}"
    return None


class _Startup:
    """The server as the lifespan of its binding, keeping why its start failed.

    An engine that does not answer at start (a wrong `--url`, an engine down) ended `a2m serve` in
    uvicorn's `ERROR: StoreUnavailable(...)` and exit status 3, the status of a port in use, and over
    stdio in a traceback; kept here, it ends in one line naming the flag to check instead."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.failure: BaseException | None = None

    async def startup(self) -> None:
        try:
            await self.server.startup()
        except SystemExit as exc:  # a store's own refusal, said in full (a corpus's table not found)
            self.failure = exc  # raised as an Exception: uvicorn prints a traceback for a SystemExit here
            raise RuntimeError(str(exc.code)) from None
        except Exception as exc:
            self.failure = exc
            raise

    async def shutdown(self) -> None:
        await self.server.shutdown()


class _QuietStartupFailure(logging.Filter):
    """Drops uvicorn's own lines about a failed start (the exception's repr, "Application startup
    failed"), which `_start_failed` says once, with the flag to check."""

    def __init__(self, startup: _Startup) -> None:
        super().__init__()
        self.startup = startup

    def filter(self, record: logging.LogRecord) -> bool:
        return self.startup.failure is None


def _start_failed(args: argparse.Namespace, failure: BaseException) -> int:
    """The message for a server whose engine would not start or answer; exit status 1, as for a setting."""
    said = failure.code if isinstance(failure, SystemExit) else failure
    reason = " ".join(str(said).split()) or type(failure).__name__
    hint = ""
    if (not isinstance(failure, SystemExit) and args.what != "router"
            and (args.url or os.environ.get(f"A2M_{args.what.upper()}_URL"))):
        hint = (f"; check --url / A2M_{args.what.upper()}_URL (the engine's address and credentials) and that "
                "the engine there is running")
    print(f"a2m serve {args.what}: cannot start: {reason}{hint}", file=sys.stderr, flush=True)
    return 1


def _serve(args: argparse.Namespace) -> int:
    from a2m.http import DEFAULT_MAX_BODY, SERVICE, TIER_MAX_BODY, HTTPSettings
    from a2m.stdio import log_to_stderr

    unread = _unread_flag(args)
    if unread:
        print(f"a2m serve {args.what}: {unread}", file=sys.stderr)
        return 2
    tls = _tls(args)  # before anything is made: a bad pair left an empty data directory behind
    if args.what == "router":
        _client_certificate("a2m serve router")  # the pair it presents to https:// tiers
    # One flag for both logs. Without it uvicorn stays at warning (its start and stop steps are info)
    # and the server's own log (`a2m.*`, engines, router) at info, where its one-off notes are.
    level = getattr(logging, (args.log_level or "info").replace("trace", "debug").upper())
    log_to_stderr(level)
    if level > logging.DEBUG:  # httpx logs each request at info: a line per embed (tier) or tier call (router)
        logging.getLogger("httpx").setLevel(max(level, logging.WARNING))
    origins = _origins(args.origin or [o.strip() for o in os.environ.get("A2M_ALLOWED_ORIGINS", "").split(",")
                                       if o.strip()])
    if args.what == "router":
        from router.config import ConfigError
        from router.server import build_router

        try:
            server = build_router(args.config)
        except ConfigError as exc:
            print(f"a2m serve router: {exc}", file=sys.stderr)
            return 2
        from a2m.embedder import preload

        ignored = os.environ.get("A2M_EMBEDDER")
        if ignored and ignored != "none" and ignored != server.config.embedder:
            # A tier server's variable: set beside the rest of a shared environment (compose's), the router
            # ran without the embedder its operator meant, and said nothing.
            print(f"a2m serve router: warning: A2M_EMBEDDER={ignored} is a tier server's setting; the router embeds "
                  f"with router.toml's embedder ({server.config.embedder or 'none'}): set embedder there",
                  file=sys.stderr, flush=True)
        preload(server.embedder)
        configured = server.http_settings()  # [auth] tokens and origins from router.toml
        tokens = _tokens(args.token, server.config.service_token)
        clash = [t for t in tokens if t in configured.tokens and configured.tokens[t] != tokens[t]]
        if clash:
            raise SystemExit(f"--token: a token of router.toml's [auth] is given to {tokens[clash[0]]!r} here")
        tokens = {**configured.tokens, **tokens}
        if server.config.cursor_secret in tokens:
            raise SystemExit("a2m serve router: --token: a token is router.toml's cursor_secret (or "
                             "$A2M_CURSOR_SECRET): give the secret a value of its own")
        server.take_tokens(tokens)
        origins |= configured.allowed_origins
    else:
        # Tier servers trust the router's service token to name owners; the router itself
        # only presents it to its tiers, so it is never a front-door token there.
        service_token = args.service_token or os.environ.get("A2M_SERVICE_TOKEN")
        tokens = _tokens(args.token, service_token)
        if service_token:
            from a2m.http import token_problem

            problem = token_problem(service_token)
            if problem:
                raise SystemExit(f"--service-token / A2M_SERVICE_TOKEN {problem}")
            tokens[service_token] = SERVICE
        from a2m.embedder import make_embedder, preload
        from backends.serve import build
        from backends.settings import TierSettings

        data = (Path(args.data).expanduser() if args.data else default_data_dir()).resolve()
        name = args.name or args.what
        pairs = [_option(opt) for opt in args.option]
        options = dict(pairs)
        if len(options) < len(pairs):
            twice = sorted({k for k, _ in pairs if sum(1 for j, _ in pairs if j == k) > 1})
            raise SystemExit(f"a2m serve {args.what}: --option {', '.join(twice)} given more than once")
        url = args.url or os.environ.get(f"A2M_{args.what.upper()}_URL")
        settings = TierSettings(name=name, data_dir=data / name, url=url, options=options)
        try:
            settings.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SystemExit(f"a2m serve {args.what}: cannot make the data directory {settings.data_dir}: "
                             f"{exc.strerror}") from None
        try:
            embedder = make_embedder(args.embedder or os.environ.get("A2M_EMBEDDER"),
                                     model=os.environ.get("A2M_EMBEDDER_MODEL"))
        except ValueError as exc:
            raise SystemExit(f"a2m serve {args.what}: --embedder / A2M_EMBEDDER: {exc}") from None
        server = build(args.what, settings, embedder=embedder)
        preload(server.embedder)  # None where the tier never embeds
    from a2m import tracing
    from a2m.dispatch import Dispatcher

    try:
        tracing.configure("a2m-router" if args.what == "router" else f"a2m-{name}")
    except ValueError as exc:  # A2M_TRACE_FILE cannot be opened
        raise SystemExit(f"a2m serve {args.what}: {exc}") from None
    limits = {key: getattr(args, key) for key in ("body_timeout", "max_connections", "max_body_in_flight",
                                                  "shutdown_timeout")
              if getattr(args, key) is not None}  # else HTTPSettings' defaults
    # A tier's service token is among its `tokens`; the router's, which it presents, is not.
    router_only = (server.config.service_token, server.config.cursor_secret) if args.what == "router" else (None, None)
    metrics_token = _metrics_token(args, tokens, *router_only)
    http_settings = HTTPSettings(allowed_origins=origins, tokens=tokens, metrics_token=metrics_token,
                                 max_body=DEFAULT_MAX_BODY if args.what == "router" else TIER_MAX_BODY, **limits,
                                 **tls)
    startup = _Startup(server)
    if args.stdio:
        from a2m.stdio import serve_stdio

        try:
            asyncio.run(serve_stdio(Dispatcher(server), lifespan=startup))
        except Exception:
            if startup.failure is None:
                raise
            return _start_failed(args, startup.failure)
        return 0
    from a2m.http import HTTPApp, run

    if not tokens and reachable_from_network(args.host):
        print(f"a2m serve {args.what}: warning: {args.host} is reachable from the network and no bearer token is "
              "set, so any caller may name any owner (protocol §7); set --token (router.toml [auth] tokens) or "
              "A2M_SERVICE_TOKEN, or bind 127.0.0.1", file=sys.stderr, flush=True)

    def listening(url: str) -> None:
        # Whatever the log level (uvicorn's own line is at info), and on stderr: the port may have
        # been chosen just now (the default, 0, is any free port). `a2m up` prints its own line per
        # tier once all are ready, so the servers it starts are told to stay quiet (A2M_ANNOUNCE=0).
        if os.environ.get("A2M_ANNOUNCE", "1") != "0":
            print(f"a2m serve {args.what}: listening on {url}", file=sys.stderr, flush=True)

    quiet = _QuietStartupFailure(startup)
    logging.getLogger("uvicorn.error").addFilter(quiet)
    try:
        run(HTTPApp(Dispatcher(server), http_settings, lifespan=startup), host=args.host, port=args.port,
            log_level=args.log_level or "warning", on_listening=listening)
    except SystemExit:
        if startup.failure is None:  # it could not listen (a port in use): uvicorn's error is above
            print(f"a2m serve {args.what}: cannot listen on {args.host}:{args.port} (the error above): stop what "
                  "listens there, or choose another --port (0: any free port)", file=sys.stderr, flush=True)
            raise  # status 3, as documented
        return _start_failed(args, startup.failure)
    finally:  # this start's filter only: a later server in the same process (tests) keeps its errors
        logging.getLogger("uvicorn.error").removeFilter(quiet)
    return 0


def _up(args: argparse.Namespace) -> int:
    from .up import up

    return up(args)


def _bearer(given: str | None, endpoint: str) -> str | None:
    """`--token`, else $A2M_TOKEN for an http(s) endpoint: a token on the command line is visible to
    every user of the machine (`ps`). A stdio command line takes none, so the variable is not sent there."""
    if given is not None:
        return given
    return os.environ.get("A2M_TOKEN") or None if endpoint.startswith(("http://", "https://")) else None


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import doctor

    _client_certificate("a2m doctor")
    return asyncio.run(doctor(args.url, token=_bearer(args.token, args.url)))


def _stopped_by_sigterm_too(run: Coroutine[Any, Any, int]) -> int:
    """`asyncio.run(run)`, with SIGTERM stopping it as Ctrl-C does: the transfer's task is cancelled,
    so it says what it wrote and a half export file is removed. SIGTERM is how systemd, `timeout`,
    `docker stop` and Kubernetes stop a job; left to its default, it killed the transfer silently,
    an import without saying which lines were written, an export leaving `FILE.partial` behind.
    Exit status 143 (128 + SIGTERM), as a shell shows for a command SIGTERM stopped; 130 for Ctrl-C."""
    import signal

    terminated = False

    async def main() -> int:
        task, loop = asyncio.current_task(), asyncio.get_running_loop()

        def stop() -> None:
            nonlocal terminated
            terminated = True
            assert task is not None
            task.cancel()

        loop.add_signal_handler(signal.SIGTERM, stop)
        try:
            return await run
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:  # Ctrl-C: what was done is said already, a traceback would bury it
        return 130
    except asyncio.CancelledError:
        if terminated:
            return 128 + signal.SIGTERM
        raise


def _transfer(args: argparse.Namespace) -> int:
    from . import transfer

    _client_certificate(f"a2m {args.command}")
    if args.command == "export":
        owners = ([None] if args.unowned or not args.owner else []) + (args.owner or [])
        return _stopped_by_sigterm_too(transfer.export(args.url, args.file, token=_bearer(args.token, args.url),
                                                       embeddings=args.embeddings, owners=owners,
                                                       tier_wait=args.wait_for_tiers))
    return _stopped_by_sigterm_too(transfer.import_(args.url, args.file, token=_bearer(args.token, args.url),
                                                    batch=args.batch, tier_wait=args.wait_for_tiers))


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
    serve.add_argument("what", choices=["working", "episodic", "semantic", "procedural", "corpus", "router"],
                       help="a tier server, a read-only corpus over an existing table or collection, or the router")
    serve.add_argument("--host", default=os.environ.get("A2M_HOST", "127.0.0.1"),
                       help="the address to bind (default 127.0.0.1: this machine only); $A2M_HOST")
    serve.add_argument("--port", type=_port, default=os.environ.get("A2M_PORT") or "0",
                       help="0 (the default) for any free port; $A2M_PORT")
    serve.add_argument("--stdio", action="store_true", help="speak JSON-RPC on stdin/stdout instead of HTTP")
    serve.add_argument("--data", help="data directory; an embedded engine keeps its files in DATA/NAME (default: "
                                      "$A2M_DATA or the user data dir)")
    serve.add_argument("--url", help="use this engine (redis://, postgresql://, http://qdrant:6333, a repo path) "
                                     "instead of an embedded one; $A2M_<TIER>_URL, e.g. $A2M_EPISODIC_URL")
    serve.add_argument("--name", help="the tier's name in describe (default: the tier kind)")
    serve.add_argument("--config", help="router.toml (router only)")
    serve.add_argument("--embedder", help="none | local | an OpenAI-compatible base URL; $A2M_EMBEDDER")
    serve.add_argument("--option", action="append", default=[],
                       help="engine option KEY=VALUE (repeatable; each engine's are in docs/configuration.md)")
    serve.add_argument("--token", action="append", default=[], help="bearer TOKEN=PRINCIPAL (repeatable)")
    serve.add_argument("--service-token", help="bearer token trusted to name any owner (the router's); "
                                               "$A2M_SERVICE_TOKEN")
    serve.add_argument("--metrics-token", help="bearer token a /metrics scrape must present (default: open); "
                                               "$A2M_METRICS_TOKEN")
    serve.add_argument("--origin", action="append", help="allowed browser Origin (repeatable); "
                                                         "$A2M_ALLOWED_ORIGINS, comma-separated")
    serve.add_argument("--tls-cert", help="PEM certificate chain: serve HTTPS (with --tls-key; $A2M_TLS_CERT)")
    serve.add_argument("--tls-key", help="PEM private key of --tls-cert, unencrypted ($A2M_TLS_KEY)")
    serve.add_argument("--tls-client-ca", help="PEM CA: every connection must present a client certificate it "
                                               "signed (mutual TLS; with --tls-cert; $A2M_TLS_CLIENT_CA)")
    serve.add_argument("--body-timeout", type=_seconds, default=os.environ.get("A2M_BODY_TIMEOUT") or None,
                       help="seconds a request body may take to arrive, then 408 (default 30; $A2M_BODY_TIMEOUT)")
    serve.add_argument("--max-connections", type=_positive, default=os.environ.get("A2M_MAX_CONNECTIONS") or None,
                       help="connections or requests at once before 503 (default 1024; $A2M_MAX_CONNECTIONS)")
    serve.add_argument("--max-body-in-flight", type=_positive, default=os.environ.get("A2M_MAX_BODY_IN_FLIGHT") or None,
                       help="bytes of request bodies held at once; a body past them waits (default: 4 of the "
                            "largest body, 64 MiB on the router, 512 MiB on a tier; $A2M_MAX_BODY_IN_FLIGHT)")
    serve.add_argument("--shutdown-timeout", type=_seconds, default=os.environ.get("A2M_SHUTDOWN_TIMEOUT") or None,
                       help="seconds a stop waits for requests in progress (default 20; $A2M_SHUTDOWN_TIMEOUT)")
    serve.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug", "trace"],
                       help="the server's log and uvicorn's (default: the server's at info, uvicorn's at warning)")
    serve.set_defaults(run=_serve)

    up = sub.add_parser("up", help="run the whole federation on embedded engines")
    up.add_argument("--data", help="data directory (default: $A2M_DATA or the user data dir)")
    up.add_argument("--tiers", default="working,episodic,semantic,procedural",
                    help="which tier servers to start, comma-separated (default: all four)")
    up.add_argument("--port", type=_port, default=8700,
                    help="the router's port (default 8700); the tiers take the next four")
    up.add_argument("--config", help="the router's router.toml (default: one written into the data dir on "
                                     "every start, for the tiers started on the ports above)")
    up.set_defaults(run=_up)

    doctor = sub.add_parser("doctor", help="health of a router (or any A2M URL) and its tiers")
    doctor.add_argument("url", nargs="?", type=_http_url, default="http://127.0.0.1:8700/",
                        help="the router, or any A2M server (default http://127.0.0.1:8700/)")
    doctor.add_argument("--token", help="bearer token (default: $A2M_TOKEN, which `ps` does not show)")
    doctor.set_defaults(run=_doctor)

    for name in ("export", "import"):
        p = sub.add_parser(name, help=f"{name} records as JSON Lines through any A2M endpoint")
        p.add_argument("url", help="an http(s) URL (the router, or any A2M server), or the quoted command line "
                                   "of a server speaking A2M on stdio")
        p.add_argument("file", help="JSON Lines file ('-' for stdout/stdin)")
        p.add_argument("--token", help="bearer token for an http(s) URL (default: $A2M_TOKEN, which `ps` does "
                                       "not show)")
        if name == "export":
            p.add_argument("--embeddings", action="store_true", help="include vectors")
            p.add_argument("--owner", action="append", default=None,
                           help="export this owner's records (repeatable; default: the unowned partition)")
            p.add_argument("--unowned", action="store_true",
                           help="also export the unowned partition when --owner names owners")
        else:
            p.add_argument("--batch", type=_positive, default=500, help="records per memory/remember call")
        p.add_argument("--wait-for-tiers", type=_wait, default=30.0, metavar="SECONDS",
                       help=f"how long a tier the router answers without may take to come back before "
                            f"the {name} stops (default 30)")
        p.set_defaults(run=_transfer)

    bench = sub.add_parser("bench", help="run every benchmark and print a table")
    bench.add_argument("--quick", action="store_true", help="reduced sizes: a few minutes instead of the full run")
    bench.set_defaults(run=_bench)

    args = parser.parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
