"""Mutual TLS between real processes: a tier served with `--tls-client-ca` takes the router that presents
$A2M_TLS_CLIENT_CERT / _KEY and no other, and a router without them says why the tier is down; `a2m
doctor` and `export` present the pair too. Bad settings are one line at start.

On a zero-trust network the service token alone let anyone who had read it (a log, an environment
dump) call a tier as the router; with a client CA the caller must also hold a key the CA signed.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from a2m.client import HTTPClient
from a2mctl.cli import main
from tests.support.pki import ca, key_and_cert, signed
from tests.support.procs import ROOT, a2m_command, free_port, stop, wait_ready

pytestmark = pytest.mark.timeout(120)


def _serve(tmp_path: Path, name: str, *args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("A2M_TLS_")}
    return subprocess.Popen(a2m_command("serve", *args), cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / f"{name}.log", "ab"), env={**clean, "PYTHONPATH": str(ROOT), **env})


def _wait_tier(url: str, proc: subprocess.Popen[bytes], client: ssl.SSLContext) -> None:
    """procs.wait_ready, presenting a client certificate: /readyz asks for one too."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the tier exited with {proc.returncode}"
        try:
            if httpx.get(url + "readyz", timeout=1.0, verify=client).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


@pytest.fixture
def mtls_tier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, dict[str, str]]]:
    """A procedural tier on HTTPS asking for client certificates of CA A; its URL and the environment of a
    client that presents one (this process's environment too)."""
    authority = ca(tmp_path, "ca")
    server = signed(tmp_path, "tier", authority)
    client = signed(tmp_path, "router", authority, client=True)
    port = free_port()
    tier = _serve(tmp_path, "tier", "procedural", "--port", str(port), "--data", str(tmp_path / "data"),
                  "--tls-client-ca", str(authority[1]),
                  env={"A2M_TLS_CERT": str(server[1]), "A2M_TLS_KEY": str(server[0])})
    presenting = {"SSL_CERT_FILE": str(authority[1]), "A2M_TLS_CLIENT_CERT": str(client[1]),
                  "A2M_TLS_CLIENT_KEY": str(client[0])}
    for name, value in presenting.items():
        monkeypatch.setenv(name, value)
    url = f"https://127.0.0.1:{port}/"
    try:
        context = ssl.create_default_context(cafile=str(authority[1]))
        context.load_cert_chain(client[1], client[0])
        _wait_tier(url, tier, context)
        yield url, presenting
    finally:
        stop(tier)  # type: ignore[arg-type]


def _router(tmp_path: Path, name: str, tier_url: str, env: dict[str, str],
            ready: bool = True) -> tuple[str, subprocess.Popen[bytes]]:
    config = tmp_path / f"{name}.toml"
    config.write_text(f'default_tier = "procedural"\n[[tiers]]\nname = "procedural"\nkind = "procedural"\n'
                      f'url = "{tier_url}"\n')
    port = free_port()
    router = _serve(tmp_path, name, "router", "--port", str(port), "--config", str(config), env=env)
    url = f"http://127.0.0.1:{port}/"
    if ready:
        wait_ready(url, router)  # type: ignore[arg-type]
        return url, router
    log, deadline = tmp_path / f"{name}.log", time.monotonic() + 90  # /readyz: 503 while its default tier is down
    while "listening on" not in log.read_text() and router.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "listening on" in log.read_text(), log.read_text()[-2000:]
    return url, router


@pytest.mark.anyio
async def test_a_router_presenting_a_client_certificate_reaches_an_mtls_tier_and_one_without_says_why_not(
        tmp_path: Path, mtls_tier: tuple[str, dict[str, str]]) -> None:
    tier_url, presenting = mtls_tier
    routers = []
    try:
        url, router = _router(tmp_path, "router", tier_url, presenting)
        routers.append(router)
        async with HTTPClient(url) as client:
            await client.call("memory/remember", {"records": [{"content": "rotate the keys", "key": "ops/keys"}]})
            found = await client.call("memory/recall", {"query": "rotate the keys"})
            assert [r["content"] for r in found["records"]] == ["rotate the keys"]
        # Without the pair: the tier is down, and the router's log and describe say a certificate is missing
        # (the tier's TLS ends the connection without a word: "connection closed before the response").
        bare, router = _router(tmp_path, "bare", tier_url, {"SSL_CERT_FILE": presenting["SSL_CERT_FILE"]},
                               ready=False)
        routers.append(router)
        async with HTTPClient(bare) as client:
            described = await client.call("memory/describe")
        tier = next(t for t in described["tiers"] if t["name"] == "procedural")
        assert tier["status"] == "down" and "requires a client certificate" in tier["error"], tier
        assert "set A2M_TLS_CLIENT_CERT and A2M_TLS_CLIENT_KEY" in tier["error"]
        log = (tmp_path / "bare.log").read_text()
        assert "tier procedural is down" in log and "requires a client certificate" in log, log[-2000:]
    finally:
        for proc in routers:
            stop(proc)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_doctor_and_export_present_the_client_certificate(
        tmp_path: Path, mtls_tier: tuple[str, dict[str, str]]) -> None:
    """doctor's /readyz and /healthz go through httpx, its calls and export's through a2m.http1: each
    must present the pair, or an mTLS tier reads as unreachable."""
    from a2mctl import transfer
    from a2mctl.doctor import check

    tier_url, _ = mtls_tier
    summary, reports = await check(tier_url)
    assert [r.status for r in reports] == ["up"] and (summary["readyz"], summary["healthz"]) == (200, 200), summary
    assert await transfer.export(tier_url, str(tmp_path / "out.jsonl"), token=None, embeddings=False,
                                 owners=[None]) == 0


@pytest.mark.parametrize("case, message", [
    ("alone", "--tls-client-ca (A2M_TLS_CLIENT_CA) asks clients for a certificate over HTTPS: give --tls-cert"),
    ("missing", "--tls-client-ca (A2M_TLS_CLIENT_CA): cannot read"),
    ("not pem", "is not a PEM CA certificate"),
    ("a leaf", "holds no CA certificate"),
])
def test_a_client_ca_that_cannot_be_checked_against_is_one_line_at_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, message: str) -> None:
    for name in ("A2M_TLS_CERT", "A2M_TLS_KEY", "A2M_TLS_CLIENT_CA"):
        monkeypatch.delenv(name, raising=False)
    authority = ca(tmp_path, "ca")
    server = signed(tmp_path, "tier", authority)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    leaf = signed(tmp_path, "leaf", authority, client=True)[1]
    tls = ["--tls-cert", str(server[1]), "--tls-key", str(server[0])]
    args = {"alone": ["--tls-client-ca", str(authority[1])],
            "missing": [*tls, "--tls-client-ca", str(tmp_path / "nowhere.pem")],
            "not pem": [*tls, "--tls-client-ca", str(garbage)],
            "a leaf": [*tls, "--tls-client-ca", str(leaf)]}[case]
    with pytest.raises(SystemExit) as refused:
        main(["serve", "procedural", "--port", "0", "--data", str(tmp_path / "d"), *args])
    assert isinstance(refused.value.code, str) and message in refused.value.code, refused.value.code
    assert "\n" not in refused.value.code
    assert not (tmp_path / "d").exists()  # refused before anything was made


def test_the_client_ca_variable_is_read_and_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key, cert = key_and_cert(tmp_path, "a2m")
    monkeypatch.setenv("A2M_TLS_CLIENT_CA", str(tmp_path / "nowhere.pem"))
    with pytest.raises(SystemExit, match="A2M_TLS_CLIENT_CA.*cannot read"):
        main(["serve", "procedural", "--port", "0", "--data", str(tmp_path / "d"), "--tls-cert", str(cert),
              "--tls-key", str(key)])


@pytest.mark.parametrize("command", [["doctor", "https://127.0.0.1:1/"], ["export", "https://127.0.0.1:1/", "-"],
                                     ["serve", "router", "--config", "/nonexistent/router.toml"]])
def test_a_client_certificate_without_its_key_is_one_line_at_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    _, cert = key_and_cert(tmp_path, "client")
    monkeypatch.setenv("A2M_TLS_CLIENT_CERT", str(cert))
    monkeypatch.delenv("A2M_TLS_CLIENT_KEY", raising=False)
    with pytest.raises(SystemExit) as refused:  # the router's before its router.toml is read
        main(command)
    assert isinstance(refused.value.code, str) and refused.value.code.startswith(f"a2m {command[0]}")
    assert "A2M_TLS_CLIENT_CERT and A2M_TLS_CLIENT_KEY go together" in refused.value.code
