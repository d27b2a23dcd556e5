"""Mutual TLS on a served binding (uvicorn on loopback, real TLS): a server with `tls_client_ca` asks every
connection for a client certificate its CA signed, also after a renewal; a2m.http1's pool presents
$A2M_TLS_CLIENT_CERT / _KEY and follows their renewal without a restart."""

from __future__ import annotations

import asyncio
import http.client
import logging
import shutil
import ssl
import time
from pathlib import Path
from typing import Iterator

import pytest

from a2m.http import HTTPSettings
from a2m.http1 import ClientCertificateRefused, ConnectionPool
from tests.a2m.test_http_server import make_app, serving
from tests.support.pki import ca, key_and_cert, signed

pytestmark = pytest.mark.timeout(60)

CHECK_EVERY = 0.05  # seconds between a server's looks at its certificate files here
RELOAD_WAIT = 10  # seconds a renewal may take to be seen here


class PKI:
    """Two private CAs, A (the one the server trusts) and B, and the files made with them."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca_a, self.ca_b = ca(directory, "ca-a"), ca(directory, "ca-b")
        self.server = signed(directory, "server", self.ca_a)
        self.client_a = signed(directory, "client-a", self.ca_a, client=True)
        self.client_b = signed(directory, "client-b", self.ca_b, client=True)


@pytest.fixture
def pki(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PKI]:
    made = PKI(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(made.ca_a[1]))  # the server's certificate is CA A's
    monkeypatch.delenv("A2M_TLS_CLIENT_CERT", raising=False)
    monkeypatch.delenv("A2M_TLS_CLIENT_KEY", raising=False)
    yield made


def healthz(port: int, pki: PKI, client: tuple[Path, Path] | None) -> int | str:
    """GET /healthz on a new connection presenting `client` (key, certificate): the status, or the
    name of what ended the connection instead."""
    context = ssl.create_default_context(cafile=str(pki.ca_a[1]))
    if client is not None:
        context.load_cert_chain(client[1], client[0])
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        connection.request("GET", "/healthz")
        answer = connection.getresponse()
        answer.read()
        return answer.status
    except (OSError, http.client.HTTPException) as exc:  # closed, reset, or an alert
        return type(exc).__name__
    finally:
        connection.close()


def test_a_server_with_a_client_ca_serves_only_clients_with_a_certificate_that_ca_signed(pki: PKI) -> None:
    app = make_app(tls_cert=str(pki.server[1]), tls_key=str(pki.server[0]), tls_client_ca=str(pki.ca_a[1]))
    with serving(app) as (port, _, _):
        assert healthz(port, pki, None) != 200  # no certificate
        assert healthz(port, pki, pki.client_b) != 200  # one from another CA
        assert healthz(port, pki, pki.client_a) == 200


def test_a_client_ca_needs_tls() -> None:
    with pytest.raises(ValueError, match="tls_client_ca .* needs tls_cert"):
        HTTPSettings(tls_client_ca="/etc/a2m/ca.pem")


def wait_for(port: int, pki: PKI, client: tuple[Path, Path] | None, wanted: int | str) -> None:
    deadline = time.monotonic() + RELOAD_WAIT
    while (seen := healthz(port, pki, client)) != wanted and time.monotonic() < deadline:
        time.sleep(CHECK_EVERY)
    assert seen == wanted


def test_a_renewed_server_certificate_still_asks_for_client_certificates(pki: PKI, tmp_path: Path) -> None:
    """The renewal watcher serves a context of its own (decision 136), switched to in each handshake: one
    built without the client CA refused every client from the first renewal on, the router included.
    (The verify mode is the connection's own from its start, which OpenSSL keeps across the switch; the
    watcher copies it all the same.)"""
    key, cert = tmp_path / "tls.key", tmp_path / "tls.pem"
    shutil.copyfile(pki.server[0], key)
    shutil.copyfile(pki.server[1], cert)
    renewed = signed(tmp_path, "renewed", pki.ca_a)
    app = make_app(tls_cert=str(cert), tls_key=str(key), tls_client_ca=str(pki.ca_a[1]))
    with serving(app, cert_check_every=CHECK_EVERY) as (port, served, _):
        shutil.copyfile(renewed[1], cert)
        shutil.copyfile(renewed[0], key)
        deadline = time.monotonic() + RELOAD_WAIT
        while served.config.ssl.sni_callback is None and time.monotonic() < deadline:
            time.sleep(CHECK_EVERY)
        assert served.config.ssl.sni_callback is not None, "the renewed pair was never loaded"
        assert healthz(port, pki, pki.client_a) == 200  # the renewed pair, and the client CA's client
        assert healthz(port, pki, None) != 200
        assert healthz(port, pki, pki.client_b) != 200


def test_a_rotated_client_ca_is_checked_against_without_a_restart(
        pki: PKI, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The CA file is looked at with the pair: a CA rotated in place (a Secret's new bundle) is used from
    the next handshake on; a file that is no CA keeps the one loaded before, with one warning."""
    caplog.set_level(logging.INFO, logger="a2m.http")
    client_ca = tmp_path / "client-ca.pem"
    shutil.copyfile(pki.ca_a[1], client_ca)
    app = make_app(tls_cert=str(pki.server[1]), tls_key=str(pki.server[0]), tls_client_ca=str(client_ca))
    with serving(app, cert_check_every=CHECK_EVERY) as (port, _, _):
        assert healthz(port, pki, pki.client_b) != 200
        leaf = key_and_cert(tmp_path, "leaf")[1].read_bytes()
        client_ca.write_bytes(leaf.replace(b"BEGIN CERTIFICATE", b"BEGIN CERTIFICAT"))  # not PEM
        deadline = time.monotonic() + RELOAD_WAIT
        while "TLS:" not in caplog.text and time.monotonic() < deadline:
            time.sleep(CHECK_EVERY)
        assert healthz(port, pki, pki.client_a) == 200  # still CA A
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "the client CA" in warnings[0] and "not a PEM CA certificate" in warnings[0]
        client_ca.write_bytes(pki.ca_b[1].read_bytes())
        wait_for(port, pki, pki.client_b, 200)
        assert healthz(port, pki, pki.client_a) != 200


# --- The client: $A2M_TLS_CLIENT_CERT / $A2M_TLS_CLIENT_KEY on every outgoing https connection ---


def present(monkeypatch: pytest.MonkeyPatch, key: Path, cert: Path) -> None:
    monkeypatch.setenv("A2M_TLS_CLIENT_CERT", str(cert))
    monkeypatch.setenv("A2M_TLS_CLIENT_KEY", str(key))


@pytest.mark.anyio
async def test_the_pool_presents_the_client_certificate_and_says_what_a_refusal_means(
        pki: PKI, monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn's TLS (uvloop's) ends a refused client's connection without the alert OpenSSL wrote: the
    client read "connection closed before the response", which names no cause."""
    app = make_app(tls_cert=str(pki.server[1]), tls_key=str(pki.server[0]), tls_client_ca=str(pki.ca_a[1]))
    with serving(app) as (port, _, _):
        url = f"https://127.0.0.1:{port}/"
        with pytest.raises(ClientCertificateRefused, match="requires a client certificate .* none was presented; "
                                                           "set A2M_TLS_CLIENT_CERT and A2M_TLS_CLIENT_KEY"):
            await ConnectionPool(url).post(b"{}", timeout=5)
        present(monkeypatch, *pki.client_b)
        with pytest.raises(ClientCertificateRefused, match="refused the client certificate presented"):
            await ConnectionPool(url).post(b"{}", timeout=5)
        present(monkeypatch, *pki.client_a)
        pool = ConnectionPool(url)
        status, _ = await pool.post(b'{"jsonrpc":"2.0","id":1,"method":"memory/describe"}', timeout=5)
        assert status == 200
        await closed(pool)


async def closed(pool: ConnectionPool) -> None:
    """`pool`'s connections closed, TLS's close included, before the server stops: the server's stop
    (on a thread that blocks this loop) would wait its shutdown_timeout for them."""
    pool.close()
    await asyncio.sleep(0.2)


@pytest.mark.anyio
async def test_a_renewed_client_certificate_is_presented_by_new_connections_without_a_restart(
        pki: PKI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The pool read the pair once: a renewed client certificate was presented only after a restart.
    Half a renewal (the certificate written, its key not yet) keeps the pair loaded before, with one warning."""
    caplog.set_level(logging.INFO, logger="a2m.client")
    key, cert = tmp_path / "client.key", tmp_path / "client.pem"
    shutil.copyfile(pki.client_b[0], key)
    shutil.copyfile(pki.client_b[1], cert)
    present(monkeypatch, key, cert)
    app = make_app(tls_cert=str(pki.server[1]), tls_key=str(pki.server[0]), tls_client_ca=str(pki.ca_a[1]))
    body = b'{"jsonrpc":"2.0","id":1,"method":"memory/describe"}'
    with serving(app) as (port, _, _):
        pool = ConnectionPool(f"https://127.0.0.1:{port}/")
        with pytest.raises(ClientCertificateRefused):
            await pool.post(body, timeout=5)
        shutil.copyfile(pki.client_a[1], cert)  # renewed by CA A: the certificate first
        with pytest.raises(ClientCertificateRefused):  # its key is B's still: the pair loaded before is presented
            await pool.post(body, timeout=5)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "KEY_VALUES_MISMATCH" in warnings[0], warnings
        shutil.copyfile(pki.client_a[0], key)
        assert (await pool.post(body, timeout=5))[0] == 200
        assert (await pool.post(body, timeout=5))[0] == 200
        assert pool.idle == 1  # kept alive: the files are looked at for a new connection, not per request
        assert "TLS: presenting" in caplog.text
        await closed(pool)


@pytest.mark.parametrize("set_", ["A2M_TLS_CLIENT_CERT", "A2M_TLS_CLIENT_KEY"])
def test_a_client_certificate_without_its_key_is_refused_at_construction(
        pki: PKI, monkeypatch: pytest.MonkeyPatch, set_: str) -> None:
    monkeypatch.setenv(set_, str(pki.client_a[1]))
    with pytest.raises(ValueError, match=f"A2M_TLS_CLIENT_CERT and A2M_TLS_CLIENT_KEY go together.*set: {set_}"):
        ConnectionPool("https://127.0.0.1:1/")
    ConnectionPool("http://127.0.0.1:1/")  # plain HTTP presents nothing: it is not asked


def test_a_client_pair_that_does_not_load_is_refused_at_construction(
        pki: PKI, monkeypatch: pytest.MonkeyPatch) -> None:
    present(monkeypatch, pki.client_b[0], pki.client_a[1])
    with pytest.raises(ValueError, match="are not a PEM certificate chain and its unencrypted private key"):
        ConnectionPool("https://127.0.0.1:1/")
