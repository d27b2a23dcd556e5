"""HTTPS served by `a2m serve` itself (`--tls-cert` / `--tls-key`), front door and tier alike.

Without it a router reachable over a network took bearer tokens in clear, and a tier on another
host took the service token in clear, unless a proxy stood in front of each. The certificate here is
made for 127.0.0.1 and trusted through SSL_CERT_FILE, as a private CA is trusted in production.
"""

from __future__ import annotations

import datetime
import os
import subprocess
from pathlib import Path
from contextlib import contextmanager
from typing import Iterator

import pytest

from a2m.client import HTTPClient, Unavailable
from tests.support.pki import key_and_cert
from tests.support.procs import ROOT, a2m_command, free_port, stop, wait_ready

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def pki(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """A key and a self-signed certificate for 127.0.0.1, trusted by this process (SSL_CERT_FILE)."""
    key, cert = key_and_cert(tmp_path, "a2m")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    yield key, cert


def _serve(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(a2m_command("serve", *args), cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / f"{args[0]}.log", "ab"),
                            env={**os.environ, "PYTHONPATH": str(ROOT), **env})


@contextmanager
def _https_tier(tmp_path: Path, key: Path, cert: Path) -> Iterator[str]:
    """A procedural tier serving HTTPS with `cert`, ready: its URL."""
    port = free_port()
    url = f"https://127.0.0.1:{port}/"
    tier = _serve(tmp_path, "procedural", "--port", str(port), "--data", str(tmp_path / "data"),
                  env={"A2M_TLS_CERT": str(cert), "A2M_TLS_KEY": str(key)})
    try:
        wait_ready(url, tier)  # type: ignore[arg-type]
        yield url
    finally:
        stop(tier)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_the_router_and_a_tier_serve_https_and_the_router_calls_the_tier_over_it(
        tmp_path: Path, pki: tuple[Path, Path]) -> None:
    key, cert = pki
    tls = {"A2M_TLS_CERT": str(cert), "A2M_TLS_KEY": str(key), "SSL_CERT_FILE": str(cert)}
    tier_port, router_port = free_port(), free_port()
    config = tmp_path / "router.toml"
    config.write_text(f'default_tier = "procedural"\n[[tiers]]\nname = "procedural"\nkind = "procedural"\n'
                      f'url = "https://127.0.0.1:{tier_port}/"\n')
    tier = _serve(tmp_path, "procedural", "--port", str(tier_port), "--data", str(tmp_path / "data"), env=tls)
    router = None
    try:
        wait_ready(f"https://127.0.0.1:{tier_port}/", tier)  # type: ignore[arg-type]
        router = _serve(tmp_path, "router", "--port", str(router_port), "--config", str(config), env=tls)
        wait_ready(f"https://127.0.0.1:{router_port}/", router)  # type: ignore[arg-type]
        async with HTTPClient(f"https://127.0.0.1:{router_port}/") as client:
            await client.call("memory/remember", {"records": [{"content": "rotate the keys", "key": "ops/keys"}]})
            found = await client.call("memory/fetch", {"key": "ops/keys"})
            assert found["record"]["content"] == "rotate the keys" and found["record"]["tier"] == "procedural"
        async with HTTPClient(f"http://127.0.0.1:{router_port}/", timeout=5) as plain:
            with pytest.raises(Unavailable):  # no clear-text answer on a TLS port
                await plain.call("memory/describe")
        assert "listening on https://127.0.0.1" in (tmp_path / "router.log").read_text()
    finally:
        for proc in (router, tier):
            if proc is not None:
                stop(proc)  # type: ignore[arg-type]


@pytest.mark.parametrize("case, message", [
    ("cert only", "give both, the certificate chain and its private key"),
    ("missing file", "cannot read"),
    ("another key", "are not a PEM certificate chain and its unencrypted private key"),
    ("encrypted key", "are not a PEM certificate chain and its unencrypted private key"),
    ("stdio", "TLS is for HTTP, not --stdio"),
    ("expired", "expired.pem expired on"),
])
def test_a_certificate_that_cannot_serve_is_one_line_at_start(tmp_path: Path, case: str, message: str) -> None:
    key, cert = key_and_cert(tmp_path, "a2m")
    other, _ = key_and_cert(tmp_path, "other")
    locked, locked_cert = key_and_cert(tmp_path, "locked", passphrase=b"hunter22")
    expired, expired_cert = key_and_cert(tmp_path, "expired", not_after=datetime.datetime.now(
        datetime.timezone.utc) - datetime.timedelta(days=1))
    args = {"cert only": ["--tls-cert", str(cert)],
            "missing file": ["--tls-cert", str(tmp_path / "nowhere.pem"), "--tls-key", str(key)],
            "another key": ["--tls-cert", str(cert), "--tls-key", str(other)],
            # a passphrase is not asked for (a server starts unattended): refused, never prompted
            "encrypted key": ["--tls-cert", str(locked_cert), "--tls-key", str(locked)],
            "stdio": ["--tls-cert", str(cert), "--tls-key", str(key), "--stdio"],
            # every client that verifies would refuse it, while probes that do not would call it ready
            "expired": ["--tls-cert", str(expired_cert), "--tls-key", str(expired)]}[case]
    done = subprocess.run(a2m_command("serve", "procedural", "--port", "0", "--data", str(tmp_path / "d"), *args),
                          cwd=tmp_path, timeout=60, input=b"", capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    stderr = done.stderr.decode()
    assert done.returncode != 0 and "Traceback" not in stderr and message in stderr, stderr[-2000:]
    assert not (tmp_path / "d").exists()  # refused before anything was made


def test_a_tier_whose_certificate_the_router_does_not_trust_is_named_in_the_router_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The router started before its tier (refused: logged), then the tier came up on HTTPS with a
    certificate the router does not trust (no SSL_CERT_FILE). The log said "Connection refused" for
    good: a new cause of the same outage was logged only where its exception type changed, and both
    are Unavailable. A certificate never trusted does not heal; the operator must read it."""
    import time

    import httpx

    key, cert = key_and_cert(tmp_path, "a2m")
    tier_port, router_port = free_port(), free_port()
    config = tmp_path / "router.toml"
    config.write_text(f'default_tier = "procedural"\n[[tiers]]\nname = "procedural"\nkind = "procedural"\n'
                      f'url = "https://127.0.0.1:{tier_port}/"\n')
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)  # the system's trust store: not this certificate
    router = _serve(tmp_path, "router", "--port", str(router_port), "--config", str(config), env={})
    tier = None
    log = tmp_path / "router.log"
    try:
        deadline = time.monotonic() + 60
        while "listening on" not in log.read_text() and router.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "Connection refused" in log.read_text()
        tier = _serve(tmp_path, "procedural", "--port", str(tier_port), "--data", str(tmp_path / "data"),
                      env={"A2M_TLS_CERT": str(cert), "A2M_TLS_KEY": str(key)})
        deadline = time.monotonic() + 40  # the router's backoff reaches 15 s between tries
        while "CERTIFICATE_VERIFY_FAILED" not in log.read_text() and time.monotonic() < deadline:
            httpx.get(f"http://127.0.0.1:{router_port}/readyz", timeout=10)  # a health check asks the tier
            time.sleep(0.5)
        assert "tier procedural is down" in log.read_text() and "CERTIFICATE_VERIFY_FAILED" in log.read_text(), \
            log.read_text()[-2000:]
    finally:
        for proc in (router, tier):
            if proc is not None:
                stop(proc)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_doctor_trusts_a_private_ca_in_ssl_cert_file_for_readyz_as_for_its_calls(
        tmp_path: Path, pki: tuple[Path, Path]) -> None:
    """`a2m doctor` asked /readyz and /healthz with httpx and trust_env=False, which never reads
    SSL_CERT_FILE (certifi's bundle alone): against a server with a private CA it described every
    tier as up and still said `/readyz unreachable`, not healthy, exit 1."""
    from a2mctl.doctor import check

    key, cert = pki
    with _https_tier(tmp_path, key, cert) as url:
        summary, reports = await check(url)
    assert [r.status for r in reports] == ["up"]
    assert (summary["readyz"], summary["healthz"]) == (200, 200), summary


@pytest.mark.anyio
async def test_doctor_says_when_the_certificate_it_was_presented_expires(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A renewal that failed: doctor said all was well until the certificate expired, and from then on
    that the server was unreachable."""
    from cryptography import x509

    from a2mctl.doctor import check, doctor

    key, cert = key_and_cert(tmp_path, "a2m", not_after=datetime.datetime.now(datetime.timezone.utc)
                             + datetime.timedelta(days=5, hours=1))
    ends = x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    with _https_tier(tmp_path, key, cert) as url:
        summary, _ = await check(url)
        assert summary["certificate_expires"] == ends
        assert await doctor(url) == 0  # a warning, not a failure: it still serves
    out = capsys.readouterr().out
    assert f"certificate expires {ends:%Y-%m-%d %H:%M} UTC, in 5 days: renew it" in out, out
    assert "expires on" in (tmp_path / "procedural.log").read_text()  # and the server said so at start
