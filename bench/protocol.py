"""Protocol overhead: `memory/describe` over HTTP on loopback vs a bare ASGI handler, same run.

Prints one JSON object: p50/p99 latency (sequential) and requests/s (16
concurrent) for (a) a bare ASGI app returning a constant JSON-RPC response,
(b) the a2m dispatcher + HTTP binding answering describe, each through the
a2m client (`a2m.http1`, what the router uses) and, for the client choice
(docs/decisions.md 5), through httpx's default transport and aiohttp when it is
installed. `client_cpu_us` is the calling process's CPU per sequential call:
the part of a tier call the router itself pays. Target: the dispatcher adds at
most 30% to the bare p50.

    python bench/protocol.py [--requests 2000] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import orjson
import uvloop  # what the router runs on (uvicorn loop="uvloop")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULT = b'"result":{"protocol":"a2m/0.1","name":"bare"}}'


async def bare_app(scope, receive, send):  # type: ignore[no-untyped-def]
    """The least a JSON-RPC server does: read the body and answer its id (the a2m client checks
    that the answer's id is its request's) with a constant result."""
    if scope["type"] != "http":
        return
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    answer = b'{"jsonrpc":"2.0","id":%s,%s' % (orjson.dumps(orjson.loads(body).get("id")), RESULT)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})


def serve(kind: str, port: int) -> None:
    import uvicorn

    if kind == "bare":
        app = bare_app
    else:
        from a2m.dispatch import Dispatcher
        from a2m.http import HTTPApp
        from backends.surface import TierServer
        from tests.support.memstore import CAPABILITIES, MemoryStore

        server = TierServer(MemoryStore(), name="bench", kind="episodic", capabilities=CAPABILITIES)
        app = HTTPApp(Dispatcher(server), lifespan=server)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", http="httptools", loop="uvloop",
                access_log=False)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered) - 1e-9) - 1)]  # nearest rank: p99 of 100 is the 99th


async def measure(url: str, requests: int, concurrency: int, transport: str) -> dict[str, object]:
    """`a2m-client`: the a2m HTTPClient the router uses; `httpx-default` and `aiohttp`: for the client choice."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "memory/describe", "params": {}}).encode()
    if transport == "a2m-client":
        from a2m.client import HTTPClient

        a2m_client = HTTPClient(url)

        async def post() -> None:
            await a2m_client.call("memory/describe", {})

        close = a2m_client.close
    elif transport == "aiohttp":
        import aiohttp

        session = aiohttp.ClientSession(headers={"content-type": "application/json"})

        async def post() -> None:
            async with session.post(url, data=body) as reply:
                assert reply.status == 200
                await reply.read()

        close = session.close
    else:
        import httpx

        httpx_client = httpx.AsyncClient()

        async def post() -> None:
            reply = await httpx_client.post(url, content=body, headers={"content-type": "application/json"})
            assert reply.status_code == 200

        close = httpx_client.aclose
    try:
        for _ in range(30):  # warm-up: connections, caches
            await post()
        latencies = []
        cpu_started = time.process_time()
        for _ in range(requests):
            started = time.perf_counter()
            await post()
            latencies.append((time.perf_counter() - started) * 1000)
        cpu_us = (time.process_time() - cpu_started) / requests * 1e6
        per_worker = max(1, requests // concurrency)

        async def worker() -> None:
            for _ in range(per_worker):
                await post()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    finally:
        await close()
    return {"latencies_ms": latencies, "client_cpu_us": round(cpu_us, 1),
            "rps_concurrent": round(per_worker * concurrency / elapsed, 1)}


def start(kind: str, port: int) -> subprocess.Popen[bytes]:
    import httpx

    proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, "--port", str(port)], cwd=ROOT)
    for _ in range(200):
        try:
            httpx.post(f"http://127.0.0.1:{port}/", content=b"{}", timeout=0.5)
            return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{kind} server did not start")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--serve", choices=["bare", "a2m"])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return
    from tests.support.procs import free_port

    requests = 600 if args.quick else args.requests
    rounds = 6  # both servers run at once and are measured in alternating rounds, so drift on a
    #             shared machine lands on both sides instead of on whichever ran second
    results: dict[str, object] = {"benchmark": "protocol", "requests": requests, "rounds": rounds,
                                  "concurrency": args.concurrency,
                                  "machine": f"{platform.machine()} {os.cpu_count()} cpus", "python": platform.python_version()}
    ports = {kind: free_port() for kind in ("bare", "a2m")}
    procs = [start(kind, port) for kind, port in ports.items()]
    try:
        samples: dict[str, list[dict[str, object]]] = {}
        transports = ["a2m-client", "httpx-default"]
        if importlib.util.find_spec("aiohttp") is not None:
            transports.append("aiohttp")
        for _ in range(rounds):
            for transport in transports:
                for kind, port in ports.items():
                    samples.setdefault(f"{kind}/{transport}", []).append(uvloop.run(
                        measure(f"http://127.0.0.1:{port}/", max(50, requests // rounds), args.concurrency, transport)))
        for name, runs in samples.items():
            # p50/p99 over every round's samples together (a median of per-round p99s is no p99 of
            # the run: at --quick each round had 100 samples and its "p99" was its maximum)
            latencies = [x for r in runs for x in r["latencies_ms"]]  # type: ignore[attr-defined]
            results[name] = {"p50_ms": round(statistics.median(latencies), 3),
                             "p99_ms": round(percentile(latencies, 0.99), 3), "samples": len(latencies),
                             **{k: round(statistics.median(r[k] for r in runs), 3)  # type: ignore[misc]
                                for k in ("client_cpu_us", "rps_concurrent")}}
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()
    bare, a2m = results["bare/a2m-client"], results["a2m/a2m-client"]
    results["dispatcher_overhead_p50"] = round(a2m["p50_ms"] / bare["p50_ms"] - 1, 3)  # type: ignore[index]
    results["target_overhead_p50"] = 0.30
    results["meets"] = {"overhead_p50": results["dispatcher_overhead_p50"] <= 0.30}  # type: ignore[operator]
    print(json.dumps(results, indent=2))

if __name__ == "__main__":
    main()
