"""A TLS server's certificate pair, served anew when it is renewed on disk (decision 136), and the CA
its clients' certificates must be signed by where it asks for them (mutual TLS, decision 139).

cert-manager and certbot renew in place; a server that read the files only at
start served the old certificate until someone restarted it, or until it
expired. A renewal that fails (a revoked DNS token, a stopped cron) is seen only
where someone looks at the served certificate's end: it is logged near and past
it, and told to a gauge.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import ssl
from typing import Any, Callable

log = logging.getLogger("a2m.http")

# Seconds between two looks at a served certificate's files: a renewed pair (cert-manager, certbot, a
# rewritten Kubernetes Secret) is served within this, without a restart.
CERT_CHECK_INTERVAL = 10.0

# A served certificate this close to its end is one whose renewal failed (certbot renews 30 days ahead,
# cert-manager a third of the lifetime ahead, 30 days of Let's Encrypt's 90): warned of, once.
EXPIRY_WARNING = datetime.timedelta(days=14)


def file_stamp(*paths: str) -> tuple[tuple[int, int, int], ...]:
    """What tells a rewritten file: (mtime, size, inode) of each path. stat follows symlinks, so a
    Kubernetes Secret volume's swapped `..data` link reads as a change too. OSError where one is unreadable."""
    return tuple((st.st_mtime_ns, st.st_size, st.st_ino) for st in map(os.stat, paths))


def load_pair(context: ssl.SSLContext, cert: str, key: str) -> None:
    """`context.load_cert_chain(cert, key)`, an encrypted key refused rather than prompted for on a tty.
    ValueError with one line saying why a pair does not load (the server's at start and on renewal, the
    client's of mutual TLS)."""
    try:
        context.load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as exc:  # an OSError too: first
        raise ValueError(f"{cert} and {key} are not a PEM certificate chain and its unencrypted private key "
                         f"({exc.reason or exc})") from None
    except OSError as exc:
        raise ValueError(f"cannot read {exc.filename or f'{cert} or {key}'}: {exc.strerror}") from None


def not_after(cert: str) -> datetime.datetime:
    """When the certificate served from the chain file `cert` ends (its notAfter, UTC): the file's first
    certificate, the leaf OpenSSL serves. ValueError where it holds no PEM certificate cryptography reads,
    OSError where it cannot be read."""
    from cryptography import x509  # 50 ms: not for every client that imports this module (a2m.http1)

    with open(cert, "rb") as file:
        return x509.load_pem_x509_certificates(file.read())[0].not_valid_after_utc


def days(delta: datetime.timedelta) -> str:
    """`delta` as whole days, said as a log line or doctor says them."""
    return f"{delta.days} day{'' if delta.days == 1 else 's'}"


def expired_note(cert: str, ends: datetime.datetime) -> str:
    """That the certificate in `cert` expired at `ends`, without how long ago: the refusal at start and
    of a renewal, which must read the same at each look to be logged once."""
    return f"the certificate in {cert} expired on {ends:%Y-%m-%d %H:%M} UTC"


def ca_problem(path: str) -> str | None:
    """Why `path` cannot be the CA a server checks client certificates against, or None. A file that
    loads but holds no CA certificate (a leaf, the server's own) is refused too: OpenSSL would take it
    and then fail every client's handshake, with nothing in the server's log."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_verify_locations(path)
    except ssl.SSLError as exc:  # an OSError too: first
        return f"{path} is not a PEM CA certificate ({exc.reason or exc})"
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror}"
    if not context.cert_store_stats()["x509_ca"]:
        return f"{path} holds no CA certificate (one with basicConstraints CA:TRUE), only a leaf's"
    return None


class Certificates:
    """A TLS server's certificate pair as it is on disk, looked at every few seconds (`watch`).

    A changed pair is loaded into a context of its own; only one that loads (the key is the certificate's
    and unencrypted, as `a2m serve` checks at start) is served, by switching each new handshake to it from
    uvicorn's context (`sni_callback`, called on every handshake, SNI or not). uvicorn's context itself is
    never loaded again: a load that fails half-way (the certificate read, then a key that is not its own,
    as a renewal caught between its two writes) leaves an OpenSSL context with no key, and every handshake
    after it fails. Open connections keep the pair they were made with. A pair that cannot be served is
    one warning, and the one served before stays in use until the files change into one that can.

    The served certificate's end is read with it (`not_after`): each one served is told to `expires`
    (unix seconds: the gauge), and one within EXPIRY_WARNING of its end, or past it, is one warning, again
    when it goes past it while served (a server that runs for months sees the end of a certificate it
    loaded with 60 days left). A renewal to a certificate already expired is not served, as any pair that
    cannot be.

    Where the server asks for client certificates (`config.ssl_ca_certs`, `ssl_cert_reqs`), a new context
    asks for them as uvicorn's did, and the CA file is looked at with the pair: a rotated CA bundle is
    checked against from the next handshake on, and one that does not load keeps the context served before.
    """

    def __init__(self, config: Any, cert: str, key: str, every: float,
                 expires: Callable[[float], None] | None = None) -> None:
        self.config, self.cert, self.key, self.every, self.expires = config, cert, key, every, expires
        self.files = (cert, key, config.ssl_ca_certs) if config.ssl_ca_certs else (cert, key)
        self.seen = self._look()  # taken before uvicorn loads the files: a change in between is seen, not missed
        self.served: ssl.SSLContext | None = None  # the newest pair that loaded; None: uvicorn's own
        self.problem: str | None = None  # why the pair on disk is not served (logged once)
        self.ends: datetime.datetime | None = None  # the served certificate's notAfter; None: unknown
        self.said: str | None = None  # what was logged of its end ("expires", "expired"), each said once
        self._serving(self._end())  # the pair uvicorn loads (one it cannot fails the start, and says why)

    def _look(self) -> tuple[tuple[int, int, int], ...] | None:
        try:
            return file_stamp(*self.files)
        except OSError:
            return None

    def _context(self) -> ssl.SSLContext:
        """The pair on disk in a context made as uvicorn makes its own (create_ssl_context, with what
        server() gives it), except that an encrypted key is refused rather than prompted for. ValueError:
        the pair does not load (`load_pair`), or the client CA cannot be checked against (`ca_problem`)."""
        config = self.config
        context = ssl.SSLContext(config.ssl_version)
        load_pair(context, self.cert, self.key)
        context.verify_mode = ssl.VerifyMode(config.ssl_cert_reqs)
        if config.ssl_ca_certs:
            problem = ca_problem(config.ssl_ca_certs)  # its own message: "not a certificate chain" would mislead
            if problem:
                raise ValueError(f"the client CA {problem}")
            context.load_verify_locations(config.ssl_ca_certs)
        if config.ssl_ciphers:
            context.set_ciphers(config.ssl_ciphers)
        alpn = getattr(config.http_protocol_class, "alpn_protocols", None)
        if alpn:
            context.set_alpn_protocols(alpn)
        return context

    def _end(self) -> datetime.datetime | Exception:
        """The certificate file's notAfter, or why cryptography could not read it: OpenSSL loaded it, and
        a stricter parse is no reason not to serve it."""
        try:
            return not_after(self.cert)
        except (ValueError, OSError) as exc:
            return exc

    def _serving(self, end: datetime.datetime | Exception) -> None:
        """The certificate ending at `end` is the one served now: told to `expires` (NaN where its end
        could not be read: unknown, rather than the end of the one before), and its end said if near."""
        self.ends = end if isinstance(end, datetime.datetime) else None
        self.said = None
        if self.expires is not None:
            self.expires(float("nan") if self.ends is None else self.ends.timestamp())
        if self.ends is None:
            log.warning("TLS: cannot read when the certificate in %s expires (%s): it is served, but its "
                        "end is not watched", self.cert, end)
        self._say_expiry()

    def _say_expiry(self) -> None:
        """The served certificate's end, logged once when it is EXPIRY_WARNING away and once when past."""
        if self.ends is None:
            return
        left = self.ends - datetime.datetime.now(datetime.timezone.utc)
        state = "expired" if left <= datetime.timedelta(0) else "expires" if left <= EXPIRY_WARNING else None
        if state is None or state == self.said:
            return
        self.said = state
        renew = f"renew it (the renewed files are served within {self.every:g} s, without a restart)"
        if state == "expired":
            log.warning("TLS: %s, %s ago: clients that verify it refuse every connection; %s",
                        expired_note(self.cert, self.ends), days(-left), renew)
        else:
            log.warning("TLS: the certificate in %s expires on %s UTC, in %s: %s", self.cert,
                        f"{self.ends:%Y-%m-%d %H:%M}", days(left), renew)

    def check(self) -> None:
        """One look: serve the pair on disk where it changed (or could not be served before), loads and
        has not expired; say the served certificate's end where it came near or passed."""
        self._say_expiry()
        try:
            stamp = file_stamp(*self.files)
        except OSError as exc:
            return self._refuse(f"cannot read {exc.filename or self.cert}: {exc.strerror}")
        if stamp == self.seen and self.problem is None:
            return
        self.seen = stamp
        try:
            context = self._context()
        except (ValueError, OSError) as exc:  # OSError: the CA file changed again since `ca_problem` read it
            return self._refuse(str(exc))
        end = self._end()
        if isinstance(end, datetime.datetime) and end <= datetime.datetime.now(datetime.timezone.utc):
            return self._refuse(expired_note(self.cert, end))  # it would fail every client that verifies it
        self.served, self.problem = context, None
        self.config.ssl.sni_callback = self._switch  # from the first reload on; before it, no call per handshake
        log.info("TLS: serving %s as they now are on disk: new connections get this certificate%s, "
                 "open ones keep theirs", self._named(), " and are checked against this client CA"
                 if len(self.files) > 2 else "")
        self._serving(end)

    def _refuse(self, problem: str) -> None:
        if problem != self.problem:
            log.warning("TLS: %s changed but cannot be served: %s; the certificate loaded before stays "
                        "in use, and the files are tried again every %g s", self._named(), problem, self.every)
        self.problem = problem

    def _named(self) -> str:
        """The files looked at, for the log: "cert and key", or "cert, key and ca"."""
        return ", ".join(self.files[:-1]) + " and " + self.files[-1]

    def _switch(self, connection: Any, server_name: str | None, context: ssl.SSLContext) -> None:
        if self.served is not None:
            connection.context = self.served

    async def watch(self) -> None:
        """`check` every `every` seconds until cancelled (the server's stop)."""
        while True:
            await asyncio.sleep(self.every)
            try:
                self.check()
            except Exception:  # a watcher that died would never reload again, and say nothing
                log.exception("TLS: looking at %s failed", self._named())
