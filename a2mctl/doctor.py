"""`a2m doctor [URL]`: is this A2M endpoint, and every tier behind it, healthy?

It asks only what any A2M server answers (describe, /readyz, a recall), so it
works against the router, a single tier server, or someone else's A2M server.
The probe recall passes `touch: false`, so running doctor never changes what a
tier will promote. Exit status: 0 all up, 1 something is down, 2 unreachable (or it refused the
bearer token: HTTP 401).
"""

from __future__ import annotations

import asyncio
import datetime
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

PROBES = 5
# A router's rate limit (docs/configuration.md, [rate_limit]) is waited out, not reported as a tier
# down: up to this many refusals a call, each asking at most RATE_WAIT seconds. The wait is not timed.
RATE_REFUSALS = PROBES
RATE_WAIT = 10.0
PROBE_QUERY = "a2m doctor probe"


@dataclass
class TierReport:
    name: str
    kind: str | None = None
    engine: str | None = None
    url: str | None = None
    records: int | None = None
    p50_ms: float | None = None
    status: str = "up"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "up"


def _token_refused(exc: Any) -> bool:
    return isinstance(exc.data, dict) and exc.data.get("status") == 401


GET_TIMEOUT = 5.0  # seconds /readyz and /healthz each have to answer
GET_ROUNDS = 2  # times both are asked before a server silent to both is given up: describe's 10 s


async def _get(http: Any, url: str, ends: list[datetime.datetime] | None = None,
               silent: list[str] | None = None) -> int | None:
    """The status `url` answers GET with (None: unreachable); where `ends` is given, the notAfter of the
    certificate an https server presented is appended to it; a GET that timed out goes into `silent`."""
    import httpx

    try:
        response = await http.get(url, timeout=GET_TIMEOUT)
    except httpx.TimeoutException:
        if silent is not None:
            silent.append(url)
        return None
    except Exception:  # noqa: BLE001 — unreachable is an answer here
        return None
    if ends is not None and (end := _presented_end(response)) is not None:
        ends.append(end)
    return int(response.status_code)


def _presented_end(response: Any) -> datetime.datetime | None:
    """The notAfter of the certificate the server presented on `response`'s connection: None over http,
    or where cryptography cannot read it (OpenSSL verified it: not a reason to fail the check)."""
    stream = response.extensions.get("network_stream")
    tls = stream.get_extra_info("ssl_object") if stream is not None else None
    der = tls.getpeercert(binary_form=True) if tls is not None else None
    if not der:
        return None
    from cryptography import x509

    try:
        return x509.load_der_x509_certificate(der).not_valid_after_utc
    except ValueError:
        return None


async def _call(client: Any, method: str, params: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """`method`'s result and how long its answered call took in ms, after waiting out rate limits."""
    from a2m.client import waiting_out_rate_limits

    async def timed() -> tuple[dict[str, Any], float]:
        start = time.perf_counter()
        return await client.call(method, params, timeout=10.0), (time.perf_counter() - start) * 1000

    return await waiting_out_rate_limits(timed, most=RATE_WAIT, refusals=RATE_REFUSALS)


async def _probe(client: Any, tier: str | None) -> tuple[float | None, str]:
    """p50 of a few recalls in ms, or (None, why)."""
    from a2m.errors import A2MError

    params: dict[str, Any] = {"query": PROBE_QUERY, "limit": 5, "touch": False}
    if tier is not None:
        params["tier"] = tier
    took: list[float] = []
    for _ in range(PROBES):
        try:
            result, ms = await _call(client, "memory/recall", params)
        except A2MError as exc:
            return None, exc.message
        took.append(ms)
        if tier is not None and tier in (result.get("degraded") or []):
            return None, "left out of the recall (down or slow)"
    return statistics.median(took), ""


def _plain_http() -> Any:
    """The client for /readyz and /healthz: no proxy variables (trust_env=False), and the TLS context
    `a2m.client` connects with: its trust store (the system's, or SSL_CERT_FILE's private CA), not
    certifi's bundle, which httpx uses alone without trust_env (an HTTPS server with a private CA
    answered every call and still read `/readyz unreachable`), and the client certificate of
    $A2M_TLS_CLIENT_CERT / _KEY, without which a server asking for one (mutual TLS) read the same."""
    import httpx

    from a2m.http1 import client_tls

    return httpx.AsyncClient(trust_env=False, verify=client_tls().context())


async def check(url: str, token: str | None = None) -> tuple[dict[str, Any], list[TierReport]]:
    """Describe + readiness + probes. Raises `Unavailable` when `url` does not answer JSON-RPC."""
    from a2m.client import HTTPClient, Unavailable
    from a2m.errors import A2MError

    base = url.rstrip("/") + "/"
    ends: list[datetime.datetime] = []
    silent: list[str] = []
    async with _plain_http() as http:  # both at once: a server that answers nothing costs one wait a round
        for _ in range(GET_ROUNDS):  # a slow one (stalled, busy) answering within describe's 10 s is alive
            silent.clear()
            ready, health = await asyncio.gather(_get(http, base + "readyz", silent=silent),
                                                 _get(http, base + "healthz", ends, silent))
            if len(silent) < 2:
                break
    if len(silent) == 2:  # it took the connections and said nothing: a describe would wait too
        raise Unavailable(f"no response in {GET_ROUNDS * GET_TIMEOUT:g} s (to /readyz and /healthz)",
                          {"url": base})
    summary: dict[str, Any] = {"url": base, "readyz": ready, "healthz": health}
    if ends:  # an https server's certificate: doctor verified it, so it has not expired
        summary["certificate_expires"] = ends[0]
    async with HTTPClient(base, token=token, timeout=10.0) as client:
        try:
            described, _ = await _call(client, "memory/describe", {})
        except A2MError as exc:
            if (ready is None and health is None) or _token_refused(exc):
                raise  # not there, or it refused the token: nothing below could be asked either
            # It answers HTTP but cannot describe itself: a tier whose engine is down does this.
            summary["error"] = exc.message
            return summary, [TierReport(name=base, url=base, status="down", detail=exc.message)]
        summary.update(name=described.get("name"), protocol=described.get("protocol"))
        entries = described.get("tiers") or [{"name": described.get("name") or base}]
        single = len(entries) == 1 and "status" not in entries[0]
        reports = []
        for entry in entries:
            report = TierReport(
                name=str(entry.get("name")), kind=entry.get("kind"), engine=entry.get("engine"),
                url=entry.get("url") or (base if single else None), records=entry.get("count"),
            )
            if entry.get("status") == "down" or (single and ready not in (200, None)):
                report.records = None  # the router counts a tier it cannot reach as 0: unknown, not empty
                report.status, report.detail = "down", entry.get("error") or (
                    f"/readyz {ready}" if single else "did not answer describe")
            else:
                p50, why = await _probe(client, None if single else report.name)
                report.p50_ms = p50
                if p50 is None:
                    report.status, report.detail = "down", why
            reports.append(report)
        if "degraded" in described:
            summary["degraded"] = described["degraded"]
        if isinstance(described.get("owner_locks"), dict):  # a router's
            summary["owner_locks"] = described["owner_locks"]
    if not single:
        # Again, after the describe and probes went through every tier: a router's /readyz reads its
        # verdict on the default tier, which may date from before a kill the describe just found.
        async with _plain_http() as http:
            summary["readyz"] = await _get(http, base + "readyz")
    return summary, reports


def _certificate_line(ends: datetime.datetime) -> str:
    """The certificate's end and the days left, in yellow within EXPIRY_WARNING (as the server warns)."""
    from a2m.certificates import EXPIRY_WARNING, days

    left = ends - datetime.datetime.now(datetime.timezone.utc)
    line = f"certificate expires {ends:%Y-%m-%d %H:%M} UTC, in {days(left)}"
    return f"[yellow]! {line}: renew it[/]" if left <= EXPIRY_WARNING else line


async def doctor(url: str, token: str | None = None) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from a2m.client import Unavailable

    # Piped (a log, CI, `| grep`), rich would fold the table to 80 columns and cut URLs short;
    # a line per tier is more use there than a table that fits a terminal nobody has.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    try:
        summary, reports = await check(url, token)
    except Unavailable as exc:
        from .transfer import endpoint_problem, unreachable_reason

        if _token_refused(exc):
            console.print(f"[red]✗ {escape(endpoint_problem(url, exc, token))}[/]")
        else:
            console.print(f"[red]✗ {escape(url)} is unreachable:[/] {escape(unreachable_reason(exc, url))}")
        return 2
    title = f"{summary.get('name') or summary['url']} at {summary['url']}"
    table = Table(title=title, title_justify="left")
    for column in ("tier", "kind", "engine", "URL", "records", "p50 recall", "status"):
        table.add_column(column, justify="right" if column in ("records", "p50 recall") else "left")
    for r in reports:
        status = "[green]up[/]" if r.ok else f"[red]{r.status}[/]" + (f" ({r.detail})" if r.detail else "")
        table.add_row(r.name, r.kind or "—", r.engine or "—", r.url or "—",
                      "—" if r.records is None else f"{r.records:,}",
                      "—" if r.p50_ms is None else f"{r.p50_ms:.1f} ms", status)
    console.print(table)
    ready = summary.get("readyz")
    console.print(f"/readyz {ready if ready is not None else 'unreachable'} · "
                  f"/healthz {summary.get('healthz') if summary.get('healthz') is not None else 'unreachable'}")
    if "certificate_expires" in summary:
        console.print(_certificate_line(summary["certificate_expires"]))
    locks = summary.get("owner_locks") or {}
    if locks.get("status") == "down":
        console.print(f"[red]✗ {escape(str(locks.get('error') or 'the owner lock store (lock_url) is down'))}[/]: "
                      "moves, forgets and keyed writes fail until it is back")
    elif locks.get("shared"):
        console.print("owner locks: shared with the other router replicas (lock_url up)")
        if locks.get("evicts"):
            console.print(f"[yellow]! the lock_url Redis evicts keys at its maxmemory "
                          f"(maxmemory-policy {escape(str(locks['evicts']))})[/]: a held lock may be evicted; "
                          "set noeviction there")
    elif "shared" in locks:
        console.print("owner locks: this router's own (run one router replica, or set lock_url)")
    down = [r.name for r in reports if not r.ok] + (["lock_url"] if locks.get("status") == "down" else [])
    if down or ready != 200:
        console.print(f"[red]✗ not healthy:[/] {', '.join(down) if down else '/readyz is not 200'}")
        return 1
    console.print("[green]✓ all tiers up[/]")
    return 0
