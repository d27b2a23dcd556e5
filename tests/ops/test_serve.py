"""`a2m serve <tier>` as a user types it: a relative `--data`, from wherever the shell is."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support.procs import ROOT, a2m_command, free_port, stop, wait_ready

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("tier", ["working", "procedural"])
def test_serve_with_a_relative_data_dir(tmp_path: Path, tier: str) -> None:
    # The working tier used to hand redis-server paths relative to a cwd it had already moved into.
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "memory/remember", "params": {"records": [{"content": "relative dirs"}]}},
        {"jsonrpc": "2.0", "id": 2, "method": "memory/recall", "params": {"query": "relative"}},
    ]
    done = subprocess.run(
        a2m_command("serve", tier, "--stdio", "--data", "./data"), cwd=tmp_path, timeout=90,
        input=b"".join(orjson.dumps(r) + b"\n" for r in requests), capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    replies = {r["id"]: r for r in map(orjson.loads, done.stdout.splitlines())}
    assert "error" not in replies[1], replies[1]
    assert [r["content"] for r in replies[2]["result"]["records"]] == ["relative dirs"]
    assert (tmp_path / "data" / tier).is_dir() and not (tmp_path / "data" / tier / "data").exists()


def _serve_http(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(a2m_command("serve", "procedural", "--data", str(tmp_path / "data"), *extra), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def _first_stderr_line(proc: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """The server's first line on stderr, read by a thread so a silent server fails the test, not hangs it."""
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stderr is not None
    threading.Thread(target=lambda: lines.put(proc.stderr.readline()), daemon=True).start()  # type: ignore[union-attr]
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return ""


@pytest.mark.parametrize("log_level", ["warning", "critical"])
def test_serve_without_a_port_says_where_it_listens(tmp_path: Path, log_level: str) -> None:
    # The default port is 0, any free one: without this line nobody could find the server.
    proc = _serve_http(tmp_path, "--log-level", log_level, env={"A2M_PORT": ""})
    try:
        line = _first_stderr_line(proc)
        found = re.fullmatch(r"a2m serve procedural: listening on (http://127\.0\.0\.1:(\d+)/)\n", line)
        assert found, line
        assert int(found.group(2)) != 0
        assert httpx.get(found.group(1) + "readyz", timeout=5.0, trust_env=False).status_code == 200
    finally:
        stop(proc)  # type: ignore[arg-type]
    assert proc.stdout is not None and proc.stdout.read() == ""


def test_serve_with_a_port_says_so_too_unless_a2m_up_runs_it(tmp_path: Path) -> None:
    port = free_port()
    proc = _serve_http(tmp_path, "--port", str(port))
    try:
        assert _first_stderr_line(proc) == f"a2m serve procedural: listening on http://127.0.0.1:{port}/\n"
    finally:
        stop(proc)  # type: ignore[arg-type]
    # `a2m up` prints its own line per tier once all are ready, so the servers it starts stay quiet.
    from a2mctl.up import _child_env

    assert _child_env(tmp_path / "data", port, None)["A2M_ANNOUNCE"] == "0"
    proc = _serve_http(tmp_path, "--port", str(port), env={"A2M_ANNOUNCE": "0"})
    try:
        wait_ready(f"http://127.0.0.1:{port}/", proc)  # type: ignore[arg-type]
    finally:
        stop(proc)  # type: ignore[arg-type]
    assert proc.stderr is not None and "listening on" not in proc.stderr.read()


# ---- a setting a tier server cannot start with: its message, a non-zero exit, no traceback ----------

def _refused(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(a2m_command("serve", *args), cwd=tmp_path, timeout=60, input=b"", capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    stderr = done.stderr.decode()
    assert done.returncode != 0 and "Traceback" not in stderr, stderr[-3000:]
    return stderr


@pytest.mark.parametrize("args, message", [
    # A file where --data should be a folder: mkdir's NotADirectoryError used to end it in a traceback.
    (("procedural", "--data", "{file}"), "{file} is a file, not a directory"),
    (("procedural", "--data", "{file}/below"), "{file} is a file, not a directory"),
    # --name is the data directory's last part: '../x' put it beside --data.
    (("procedural", "--name", "../elsewhere"), "--name must be a tier name"),
    # A misspelt option was dropped without a word: this tier ran without its review gate.
    (("procedural", "--option", "reveiw=true"),
     "a2m serve procedural: --option reveiw is not an option of a2m serve procedural (did you mean 'review'?)"),
    (("procedural", "--option", "review=maybe"), "--option review must be true or false (yes/no, on/off), got 'maybe'"),
    # int('abc') in the store's constructor: a traceback.
    (("episodic", "--option", "ef_search=abc"), "--option ef_search must be a whole number, 1..1000; got 'abc'"),
    # redis-py's own ValueError, as a traceback.
    (("working", "--url", "http://127.0.0.1:6379"), "--url (A2M_WORKING_URL) must be a Redis URL"),
    (("procedural", "--url", "{file}"), "{file} is a file, not a repository directory"),
])
def test_serve_refuses_a_bad_setting_with_its_name(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    argv = [a.format(file=afile) for a in args]
    if "--data" not in argv:
        argv += ["--data", str(tmp_path / "data")]
    assert message.format(file=afile) in _refused(tmp_path, *argv, "--stdio")


def test_serve_router_refuses_an_unreadable_config(tmp_path: Path) -> None:
    # A directory as --config used to end in IsADirectoryError's traceback.
    stderr = _refused(tmp_path, "router", "--stdio", "--config", str(tmp_path))
    assert f"a2m serve router: router config {tmp_path} cannot be read" in stderr


def test_serve_on_a_port_in_use_says_so(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(a2m_command("serve", "procedural", "--data", str(tmp_path / "data"), "--port",
                                          str(port)), cwd=tmp_path, timeout=60, input=b"", capture_output=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    stderr = done.stderr.decode()
    assert done.returncode == 3 and "Traceback" not in stderr, stderr[-3000:]
    assert "address already in use" in stderr
    assert f"a2m serve procedural: cannot listen on 127.0.0.1:{port} (the error above): stop what listens there, " \
           "or choose another --port" in stderr, stderr


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_serve_says_which_flag_to_check_when_its_engine_does_not_answer(tmp_path: Path, transport: str) -> None:
    """A Redis URL nothing answers at: over HTTP uvicorn's `ERROR: StoreUnavailable(...)` and exit status
    3 (a port in use's), over stdio a traceback; now one line naming the engine's error and the flag."""
    nobody = free_port()  # nothing listens: the connection is refused, by a real socket
    args = ["working", "--url", f"redis://127.0.0.1:{nobody}/0", "--data", str(tmp_path / "data")]
    done = subprocess.run(a2m_command("serve", *args, *(["--stdio"] if transport == "stdio" else ["--port", "0"])),
                          cwd=tmp_path, timeout=60, input=b"", capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr and "StoreUnavailable" not in stderr and "startup failed" not in stderr, stderr
    assert stderr.startswith("a2m serve working: cannot start: redis: ") and stderr.count("\n") == 1, stderr
    assert f"127.0.0.1:{nobody}" in stderr and "check --url / A2M_WORKING_URL" in stderr, stderr


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_serve_corpus_that_refuses_its_mount_says_so_without_a_traceback(tmp_path: Path, transport: str) -> None:
    """A corpus store refuses its mount with a message of its own (a SystemExit in its open), which
    uvicorn printed as "Exception in 'lifespan' protocol" and a traceback."""
    from tests.support.corpora import make_points

    make_points(tmp_path / "local", {})  # local-mode storage holding collection kb
    args = ["corpus", "--url", str(tmp_path / "local"), "--option", "collection=nope"]
    done = subprocess.run(a2m_command("serve", *args, *(["--stdio"] if transport == "stdio" else ["--port", "0"])),
                          cwd=tmp_path, timeout=60, input=b"", capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    stderr = done.stderr.decode()
    assert done.returncode == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert stderr == f"a2m serve corpus: cannot start: corpus: no collection 'nope' at {tmp_path / 'local'}; " \
                     "it has ['kb']\n", stderr


@pytest.mark.parametrize("args, env, message", [
    (("procedural", "--stdio"), {"A2M_PORT": "eighty"}, "a port is a number from 0 to 65535, not 'eighty'"),
    (("procedural", "--stdio", "--embedder", "bogus"), {}, "unknown embedder 'bogus'"),
    (("procedural", "--stdio", "--embedder", "http://127.0.0.1:9/v1"), {"A2M_EMBEDDER_TIMEOUT": "soon"},
     "--embedder / A2M_EMBEDDER: A2M_EMBEDDER_TIMEOUT must be a number of seconds above 0, got 'soon'"),
    # Read as a URL since the embedder takes a bare host: one that names no host, or none at all, was a
    # traceback (httpx.InvalidURL) or an embedder posting to `http:/v1/embeddings` on every write.
    (("procedural", "--stdio", "--embedder", "https://[::1/v1"), {},
     "--embedder / A2M_EMBEDDER: the embedder URL must be http(s)://HOST[:PORT][/PATH]"),
    (("procedural", "--stdio", "--embedder", "http://"), {},
     "--embedder / A2M_EMBEDDER: the embedder URL must be http(s)://HOST[:PORT][/PATH]"),
    # A user token that is the service token would hand that user the trust to name any owner.
    (("procedural", "--stdio", "--token", "t=alice", "--service-token", "t"), {}, "is the service token"),
    (("procedural", "--stdio", "--token", " t =alice"), {}, "printable ASCII without spaces around it"),
    (("procedural", "--stdio"), {"A2M_ALLOWED_ORIGINS": "https://App.example.com/"},
     "write 'https://app.example.com'"),
])
def test_serve_refuses_a_bad_command_line_setting_without_a_traceback(
        tmp_path: Path, args: tuple[str, ...], env: dict[str, str], message: str) -> None:
    assert message in _refused(tmp_path, *args, "--data", str(tmp_path / "data"), env=env)


def test_a_local_embedder_without_its_extra_is_refused_as_a_tier_flag_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The router refused `embedder = "local"` without the `embed` extra; a tier server's `--embedder
    local` started, and every record then went without a vector, logged one by one. make_embedder
    refuses it now, which `a2m serve` answers as any bad --embedder (the case above)."""
    from a2m.embedder import make_embedder

    monkeypatch.setattr("a2m.embedder.LOCAL_MODULES", ("a2m_no_such_module",))
    with pytest.raises(ValueError, match="local needs the `embed` extra"):
        make_embedder("local")


# ---- engine options, checked in-process (backends.serve.check, as `a2m serve` runs it) ---------------

def _check(tier: str, tmp_path: Path, url: str | None = None, /, **options: object) -> dict:
    from backends.serve import check
    from backends.settings import TierSettings

    return check(tier, TierSettings(tier, tmp_path / tier, url=url, options=dict(options))).options


@pytest.mark.parametrize("engine, url, options, message", [
    ("working", None, {"appendfsync": "sometimes"}, "--option appendfsync must be one of everysec, always, no"),
    ("working", None, {"timeout": float("nan")}, "--option timeout must be a number of seconds, above 0"),
    ("working", None, {"redis_server": "/nonexistent/redis-server"},
     "--option redis_server: /nonexistent/redis-server is not an executable file"),
    # Options of the embedded server, dropped when --url names a Redis of the user's own.
    ("working", "redis://127.0.0.1:6379/0", {"appendfsync": "always"}, "--option appendfsync sets up the embedded"),
    ("episodic", None, {"iterative_scan": "loose"}, "--option iterative_scan must be one of off, relaxed_order"),
    ("episodic", None, {"pool_min": 5, "pool_max": 2}, "--option pool_min (5) is above pool_max (2)"),
    ("episodic", None, {"hnsw_m": 40}, "--option hnsw_ef_construction (64) must be at least twice hnsw_m (40)"),
    ("episodic", None, {"connect_timeout": 2.5}, "--option connect_timeout must be a whole number"),
    ("episodic", None, {"index_quiet_s": -1}, "--option index_quiet_s must be a number of seconds, at least 0"),
    ("episodic", "mysql://db/memories", {}, "--url (A2M_EPISODIC_URL) must be a PostgreSQL connection string"),
    ("semantic", "qdrant:6333", {}, "--url (A2M_SEMANTIC_URL) must be a Qdrant server's http(s) URL"),
    ("semantic", None, {"engine": "server"}, "--option engine must be one of edge, local"),
    # Read by one Qdrant engine only, and dropped by the others.
    ("semantic", None, {"collection": "facts"}, "--option collection is read only with --url or engine=local"),
    ("semantic", None, {"engine": "local", "api_key": "k"}, "--option api_key is read only with --url"),
    ("semantic", "http://qdrant:6333", {"engine": "local"}, "--option engine picks an embedded Qdrant"),
    ("procedural", "git@example.com:org/procedures.git", {}, "a remote to push to is --option remote="),
    ("procedural", None, {"author": True}, "--option author takes text, got True"),
    ("procedural", None, {"approvers": " , "}, "--option approvers names nobody, so no one could approve"),
    ("procedural", None, {"approvers": []}, "--option approvers names nobody, so no one could approve"),
    ("procedural", None, {"kind": "scratch"}, "--option kind must be one of working, episodic, semantic, procedural"),
    # The URL picks the corpus adapter: the other adapter's options were dropped.
    ("corpus", "postgresql://db/docs", {"table": "docs", "text_field": "body"},
     "--option text_field is not an option of a2m serve corpus mounting a table (a postgresql:// --url) "
     "(did you mean 'text_column'?)"),
    ("corpus", "http://qdrant:6333", {"collection": "docs", "text_column": "body"},
     "--option text_column is not an option of a2m serve corpus mounting a Qdrant collection (did you mean "
     "'text_field'?)"),
])
def test_engine_options_are_checked_before_anything_starts(tmp_path: Path, engine: str, url: str | None,
                                                           options: dict, message: str) -> None:
    from backends.settings import SettingsError

    with pytest.raises(SettingsError) as caught:
        _check(engine, tmp_path, url, **options)
    assert isinstance(caught.value, ValueError)
    assert str(caught.value).startswith(f"a2m serve {engine}: ") and message in str(caught.value)


@pytest.mark.parametrize("name", ['say "hi"', "cost$5", "back`tick", "back\\slash"])
def test_the_embedded_postgresql_refuses_a_data_dir_a_shell_would_change(tmp_path: Path, name: str) -> None:
    """pg_ctl passes the data directory through a shell inside double quotes, where `"`, `$`, a
    backtick and a backslash change it: the server never started, with pg_ctl's error. Refused at
    start by name; a PostgreSQL of the user's own (--url) has no such path."""
    from backends.settings import SettingsError

    with pytest.raises(SettingsError, match="the embedded PostgreSQL cannot run under"):
        _check("episodic", tmp_path / name, None)
    assert _check("episodic", tmp_path / name, "host=/tmp dbname=a2m") == {}
    assert _check("episodic", tmp_path / "with space & more", None) == {}  # routed elsewhere (decision 91)


def test_engine_options_as_the_command_line_gives_them_are_kept(tmp_path: Path) -> None:
    # `--option approvers=42` arrives as an int: approver_names() would have failed on it at approve time.
    assert _check("procedural", tmp_path, review=True, approvers=42, remote="") == \
        {"review": True, "approvers": "42", "remote": ""}
    assert _check("episodic", tmp_path, "host=/tmp dbname=a2m", hnsw_m=8, hnsw_ef_construction=32,
                  index_quiet_s=0, pool_timeout=1.5) == \
        {"hnsw_m": 8, "hnsw_ef_construction": 32, "index_quiet_s": 0, "pool_timeout": 1.5}
    assert _check("working", tmp_path, "unix:///tmp/redis.sock", prefix="a2m:w", timeout=1) == \
        {"prefix": "a2m:w", "timeout": 1}
    assert _check("semantic", tmp_path, "https://xyz.cloud.qdrant.io:6333", collection=2024, api_key="k") == \
        {"collection": "2024", "api_key": "k"}
    assert _check("corpus", tmp_path, "http://qdrant:6333", collection="docs", kind="episodic",
                  metadata_field="metadata") == {"collection": "docs", "kind": "episodic", "metadata_field": "metadata"}


def test_engine_options_as_written_on_the_command_line_are_typed_by_the_engine(tmp_path: Path) -> None:
    # `--option` passes the text written: the command line once read `collection=007` as 7 and
    # `api_key=1e5` as 100000.0, so a text option could change before the engine saw it.
    assert _check("semantic", tmp_path, "http://qdrant:6333", collection="007", api_key="1e5") == \
        {"collection": "007", "api_key": "1e5"}
    assert _check("procedural", tmp_path, review="off", approvers="42") == {"review": False, "approvers": "42"}
    assert _check("procedural", tmp_path, case_insensitive="true") == {"case_insensitive": True}
    assert _check("episodic", tmp_path, "host=/tmp dbname=a2m", ef_search="64", pool_timeout="2.5") == \
        {"ef_search": 64, "pool_timeout": 2.5}
    from backends.settings import SettingsError

    with pytest.raises(SettingsError, match="--option ef_search must be a whole number"):
        _check("episodic", tmp_path, None, ef_search="many")
    with pytest.raises(SettingsError, match="--option review must be true or false"):
        _check("procedural", tmp_path, None, review="maybe")


@pytest.mark.parametrize("args, env, message", [
    (("--token", "shared=alice", "--metrics-token", "shared"), {}, "is also a bearer token callers present"),
    (("--service-token", "svc-1"), {"A2M_METRICS_TOKEN": "svc-1"}, "is also a bearer token callers present"),
    (("--metrics-token", " spaced "), {}, "must be printable ASCII"),
])
def test_a_metrics_token_a_caller_holds_is_refused(tmp_path: Path, args: tuple[str, ...], env: dict[str, str],
                                                   message: str) -> None:
    stderr = _refused(tmp_path, "procedural", "--port", "0", "--data", str(tmp_path / "data"), *args, env=env)
    assert "--metrics-token / A2M_METRICS_TOKEN" in stderr and message in stderr, stderr[-2000:]


@pytest.mark.parametrize("written", [True, False])
def test_a_routers_metrics_token_that_is_its_service_token_is_refused(tmp_path: Path, written: bool) -> None:
    """The router presents its service token to the tiers, so it is in no caller's tokens there: the
    router took it as its /metrics token, and the scraper holding it could name any owner on every tier."""
    config = tmp_path / "router.toml"
    config.write_text(('service_token = "svc-1"\n' if written else "")
                      + '[[tiers]]\nname = "working"\nkind = "working"\nurl = "http://127.0.0.1:9/"\n')
    env = {"A2M_METRICS_TOKEN": "svc-1", **({} if written else {"A2M_SERVICE_TOKEN": "svc-1"})}
    stderr = _refused(tmp_path, "router", "--port", "0", "--config", str(config), env=env)
    assert "--metrics-token / A2M_METRICS_TOKEN is the service token the router presents" in stderr, stderr[-2000:]


def test_a_token_on_the_command_line_that_is_the_cursor_secret_is_refused(tmp_path: Path) -> None:
    """router.toml checks its own tokens against `cursor_secret`; a `--token` is checked here: its
    holder could open the cursors it is handed."""
    secret = "s" * 32
    config = tmp_path / "router.toml"
    config.write_text('[[tiers]]\nname = "working"\nkind = "working"\nurl = "http://127.0.0.1:9/"\n')
    stderr = _refused(tmp_path, "router", "--port", "0", "--config", str(config), "--token", f"{secret}=alice",
                      env={"A2M_CURSOR_SECRET": secret})
    assert "--token: a token is router.toml's cursor_secret" in stderr, stderr[-2000:]


def test_a_routers_metrics_token_that_is_its_cursor_secret_is_refused(tmp_path: Path) -> None:
    """The scraper holding the cursor secret could open the cursors a caller shows it and count other
    owners' writes between two of them: the secret is no caller's, so it is no scraper's either."""
    secret = "m" * 32
    config = tmp_path / "router.toml"
    config.write_text('[[tiers]]\nname = "working"\nkind = "working"\nurl = "http://127.0.0.1:9/"\n')
    stderr = _refused(tmp_path, "router", "--port", "0", "--config", str(config),
                      env={"A2M_CURSOR_SECRET": secret, "A2M_METRICS_TOKEN": secret})
    assert "--metrics-token / A2M_METRICS_TOKEN is the router's cursor_secret" in stderr, stderr[-2000:]


def test_an_option_given_twice_is_refused(tmp_path: Path) -> None:
    stderr = _refused(tmp_path, "procedural", "--stdio", "--data", str(tmp_path / "data"),
                      "--option", "review=true", "--option", "review=false")
    assert "--option review given more than once" in stderr


@pytest.mark.anyio
async def test_a_tier_server_takes_a_body_past_the_front_doors_limit(tmp_path: Path) -> None:
    """The router forwards a caller's batch (at most 16 MiB) with the vectors its embedder adds: a tier
    that refused bodies past 16 MiB (413) failed such writes, and spills of large records."""
    from a2m.client import HTTPClient
    from a2m.http import DEFAULT_MAX_BODY
    from tests.support.procs import http_server

    port = free_port()
    records = [{"content": f"{i} " + "x" * 990_000} for i in range(20)]
    assert 20 * 990_000 > DEFAULT_MAX_BODY
    command = a2m_command("serve", "working", "--port", str(port), "--data", str(tmp_path / "data"))
    with http_server(command, port) as url:
        async with HTTPClient(url, timeout=60) as tier:
            ids = (await tier.call("memory/remember", {"records": records}))["ids"]
            assert len(ids) == 20
            assert (await tier.call("memory/describe", {}))["tiers"][0]["count"] == 20


def test_a_server_started_with_a_metrics_token_asks_a_scrape_for_it(tmp_path: Path) -> None:
    import httpx

    from tests.support.procs import http_server

    port = free_port()
    command = a2m_command("serve", "procedural", "--port", str(port), "--data", str(tmp_path / "data"))
    with http_server(command, port, env={"A2M_METRICS_TOKEN": "scrape-me"}) as url:
        assert httpx.get(url + "metrics", trust_env=False).status_code == 401
        scraped = httpx.get(url + "metrics", headers={"authorization": "Bearer scrape-me"}, trust_env=False)
        assert scraped.status_code == 200 and "a2m_http_refused_total" in scraped.text


@pytest.mark.parametrize(("log_level", "shown"), [(None, True), ("info", True), ("error", False)])
def test_log_level_reaches_the_servers_own_log(tmp_path: Path, log_level: str | None, shown: bool) -> None:
    # `--log-level` set only uvicorn's level: `--log-level error` still printed the server's own
    # info lines (here tracing's one line at start). Without the flag that line is kept.
    extra = ["--log-level", log_level] if log_level else []
    proc = _serve_http(tmp_path, *extra, env={"A2M_TRACE_FILE": str(tmp_path / "spans.jsonl")})
    seen = []
    try:
        while not seen or "listening on" not in seen[-1]:  # tracing's line comes before this one
            seen.append(_first_stderr_line(proc))
            assert seen[-1], seen
    finally:
        stop(proc)  # type: ignore[arg-type]
    assert proc.stderr is not None
    seen.append(proc.stderr.read())
    assert any("tracing on as a2m-procedural" in line for line in seen) is shown, seen


def test_a_tier_servers_http_embedder_does_not_log_each_request(tmp_path: Path) -> None:
    """httpx logs each request at info, the tier server's default level: a tier with an HTTP
    embedder wrote a line for every write and every recall with a query (the router silenced it)."""
    from tests.router.test_router_embedder import Embeddings, serving

    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "memory/remember", "params": {"records": [{"content": "kettle notes"}]}},
        {"jsonrpc": "2.0", "id": 2, "method": "memory/recall", "params": {"query": "kettle"}},
    ]
    with serving(Embeddings()) as stand_in:
        done = subprocess.run(
            a2m_command("serve", "semantic", "--stdio", "--data", str(tmp_path / "data"),
                        "--embedder", f"http://127.0.0.1:{stand_in.server_address[1]}/v1"),
            cwd=tmp_path, timeout=90, input=b"".join(orjson.dumps(r) + b"\n" for r in requests), capture_output=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        asked = len(stand_in.inputs)
    replies = {r["id"]: r for r in map(orjson.loads, done.stdout.splitlines())}
    assert done.returncode == 0 and [r["content"] for r in replies[2]["result"]["records"]] == ["kettle notes"]
    assert asked == 2  # the record, then the query
    assert "HTTP Request" not in done.stderr.decode(), done.stderr.decode()[-2000:]


def test_the_http_limits_are_set_by_flag_or_variable(tmp_path: Path) -> None:
    """--body-timeout (a stalled body is answered 408) and $A2M_MAX_CONNECTIONS (503 past it) reach the server."""
    import socket

    port = free_port()
    proc = _serve_http(tmp_path, "--port", str(port), "--body-timeout", "0.5", env={"A2M_MAX_CONNECTIONS": "3"})
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_ready(url, proc)  # type: ignore[arg-type]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as stalled:
            stalled.sendall(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: 40\r\n\r\n{")
            assert stalled.recv(1024).startswith(b"HTTP/1.1 408 ")
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        try:
            deadline, status = time.monotonic() + 10, 200
            while status != 503 and time.monotonic() < deadline:  # until the server has taken all three
                status = httpx.get(url + "healthz", timeout=5.0, trust_env=False).status_code
            assert status == 503
        finally:
            for sock in idle:
                sock.close()
    finally:
        stop(proc)  # type: ignore[arg-type]


def test_the_body_budget_is_set_by_flag_or_variable(tmp_path: Path) -> None:
    """$A2M_MAX_BODY_IN_FLIGHT reaches the server: a body past what a stalled one holds is not read
    until the stalled one has all arrived and is answered, then it is served.

    Ordered by the server's own gauge and by the stalled body's arrival, not by sleeps and a 0.5 s
    body deadline: a server loop held 0.3 s (a loaded machine) read both heads in one tick of that
    deadline and answered the waiting body 503."""
    import select
    import socket

    port = free_port()
    proc = _serve_http(tmp_path, "--port", str(port), env={"A2M_MAX_BODY_IN_FLIGHT": "200000"})
    head = b"POST / HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    start, end = b'{"jsonrpc":"2.0","id":1,"method":"memory/remember","params":{"records":[{"content":"', b'"}]}}'
    body = start + b"x" * (150_000 - len(start) - len(end)) + end

    def held() -> float:
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10, trust_env=False).text
        return float(re.search(r"^a2m_http_body_bytes_held (\S+)$", metrics, re.M).group(1))  # type: ignore[union-attr]

    try:
        wait_ready(f"http://127.0.0.1:{port}/", proc)  # type: ignore[arg-type]
        with socket.create_connection(("127.0.0.1", port), timeout=30) as stalled, \
                socket.create_connection(("127.0.0.1", port), timeout=30) as waiting:
            stalled.sendall(head % len(body) + body[:1000])
            deadline = time.monotonic() + 30
            while held() < len(body):  # the server took the stalled body's bytes: the next one comes after
                assert time.monotonic() < deadline
                time.sleep(0.05)
            waiting.sendall(head % len(body) + body)
            assert not select.select([waiting], [], [], 0.5)[0]  # not answered while the stalled one holds them
            stalled.sendall(body[1000:])
            assert stalled.recv(1024).startswith(b"HTTP/1.1 200 ")
            assert waiting.recv(1024).startswith(b"HTTP/1.1 200 ")
    finally:
        stop(proc)  # type: ignore[arg-type]


def test_a_failed_start_leaves_no_filter_on_uvicorns_log(tmp_path: Path) -> None:
    """The filter that keeps uvicorn's own lines about a failed start quiet stayed on `uvicorn.error`:
    in a process that serves again (tests, an embedding application), every later server's uvicorn
    errors were dropped."""
    import logging

    from a2mctl.cli import _QuietStartupFailure, main

    nobody = free_port()
    assert main(["serve", "working", "--url", f"redis://127.0.0.1:{nobody}/0", "--data", str(tmp_path / "d"),
                 "--port", "0"]) == 1
    assert not [f for f in logging.getLogger("uvicorn.error").filters if isinstance(f, _QuietStartupFailure)]
