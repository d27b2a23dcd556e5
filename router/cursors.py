"""The timeline cursor (docs/extensions.md, decision 120) as the router passes it: to and from the
one tier a timeline names, or made of each tier's over several (`walk.py`, decision 137), and
sealed when the router has bearer tokens.

A tier's cursor is its position, `<created_at>|<seq>|<id>`, and `seq` counts every write of the
tier, whoever's it was: two cursors of a principal's own would tell it how many records all other
owners wrote in between (the event log's cursors say nothing of other owners, for the same reason).
So a router with tokens hands out the tier's cursor encrypted and bound to the principal and the
tier (decision 122).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any, Mapping, Sequence

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESSIV

from a2m import errors
from a2m.errors import A2MError, invalid

from .federation import FanOut, Tier
from .walk import Positions

_REFUSED = "cursor must be true or the cursor of a previous timeline answer"
WALK_PREFIX = "w1."  # a cursor over several tiers: each tier's position, as JSON in base64url


class Cursors:
    """A timeline's cursor on its way down to the tier and back, sealed where `seal` is set."""

    def __init__(self, seal: CursorSeal | None) -> None:
        self.seal = seal

    def down(self, params: Mapping[str, Any], tier: Tier, owner: str | None) -> bool | str | None:
        """The cursor to send the one tier the call covers, None for none."""
        cursor = _asked(params)
        if isinstance(cursor, str) and self.seal is not None:
            return self.seal.open(cursor, owner, tier.name)
        return cursor

    def positions(self, params: Mapping[str, Any], tiers: Sequence[Tier], owner: str | None) -> Positions | None:
        """Where a walk over several tiers stands in each (`walk.py`); None without a cursor."""
        cursor = _asked(params)
        if cursor is None or cursor is True:
            return None if cursor is None else dict.fromkeys((t.name for t in tiers), True)
        names = [t.name for t in tiers]
        most = CursorSeal.MAX * max(len(names), 1)  # a tier's cursor each
        if len(cursor) > most:
            raise invalid(_REFUSED, field="cursor")
        text = cursor if self.seal is None else self.seal.open(cursor, owner, _walked(names), most)
        body = text[len(WALK_PREFIX):]
        try:
            if not text.startswith(WALK_PREFIX):
                raise ValueError(text)
            positions = orjson.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except (ValueError, binascii.Error):  # orjson.JSONDecodeError is a ValueError
            raise invalid(_REFUSED, field="cursor") from None
        if not isinstance(positions, dict) or not all(p is True or p is None or isinstance(p, str)
                                                      for p in positions.values()):
            raise invalid(_REFUSED, field="cursor")
        if sorted(positions) != sorted(names):
            raise invalid("the cursor walks other tiers than this timeline covers: ask with the params "
                          "of the timeline that answered it", field="cursor")
        return positions

    def walked(self, positions: Positions, owner: str | None, tiers: Sequence[Tier]) -> str | None:
        """The cursor naming `positions`; null where every tier is read through."""
        if all(p is None for p in positions.values()):
            return None
        names = [t.name for t in tiers]
        text = WALK_PREFIX + base64.urlsafe_b64encode(orjson.dumps({n: positions[n] for n in names})).decode()
        text = text.rstrip("=")
        return text if self.seal is None else self.seal.close(text, owner, _walked(names))

    def up(self, result: dict[str, Any], fan: FanOut, tier: str, owner: str | None) -> None:
        """The tier's cursor in `result`: null where the tier was not asked (nothing of it could
        match), none where it answered none (no cursor extension) or did not answer (named in
        `degraded`). A cursor the tier refused is the caller's mistake, answered as the tier did
        (-32602)."""
        error = fan.errors.get(tier)
        if isinstance(error, A2MError) and error.code == errors.INVALID_PARAMS:
            raise error
        if tier in fan.results:
            if "cursor" in fan.results[tier]:
                cursor = fan.results[tier]["cursor"]
                if isinstance(cursor, str) and self.seal is not None:
                    cursor = self.seal.close(cursor, owner, tier)
                result["cursor"] = cursor
        elif tier not in fan.degraded:
            result["cursor"] = None


def _asked(params: Mapping[str, Any]) -> bool | str | None:
    cursor = params.get("cursor")
    if cursor is not None and cursor is not True and not isinstance(cursor, str):
        raise invalid(_REFUSED, field="cursor")
    return cursor


def _walked(names: Sequence[str]) -> str:
    """What a walk's sealed cursor is bound to in place of one tier's name: all of them."""
    return "\x00".join(names)


class CursorSeal:
    """Tiers' cursors encrypted and authenticated with AES-SIV, the principal and the tier as
    associated data: one made for another principal or tier, or not by a router with these tokens,
    is refused like any cursor no tier made. Deterministic, so a walk that does not move on still
    answers the cursor it was asked with (`a2m.paging` stops on that). The key is drawn from
    `cursor_secret` where one is set, so a walk outlives a change of tokens; else from the tokens and
    the service token. Either way replicas and restarts of the router with the same settings open
    each other's cursors, and a principal knows neither the secret nor another's token."""

    PREFIX = "s2."
    UNPADDED = "s1."  # sealed before padding (a replica not yet upgraded): opened as they are
    MAX = 4096  # characters of a sealed cursor: a tier's is a timestamp, a number and an id
    # What is sealed is padded to a multiple of this many bytes: the ciphertext is as long as the
    # plaintext, and a tier's `seq` (which counts every owner's writes) is as many digits as it has.
    PAD = 128

    def __init__(self, key: bytes) -> None:
        self._siv = AESSIV(key)

    @classmethod
    def of(cls, tokens: Mapping[str, Any], service_token: str | None,
           secret: str | None = None) -> "CursorSeal | None":
        """None without tokens: every caller may then name any owner, and a cursor passes as it is."""
        if not tokens:
            return None
        if secret is not None:
            return cls(hashlib.sha512(b"a2m-router timeline cursor secret\x00" + secret.encode()).digest())
        drawn = repr([sorted((token, str(principal)) for token, principal in tokens.items()), service_token or ""])
        return cls(hashlib.sha512(b"a2m-router timeline cursor\x00" + drawn.encode()).digest())  # AES-256-SIV

    @staticmethod
    def _bound(owner: str | None, tier: str) -> list[bytes]:
        return [repr(owner).encode(), tier.encode()]

    def close(self, cursor: str, owner: str | None, tier: str) -> str:
        sealed = self._siv.encrypt(_padded(cursor.encode(), self.PAD), self._bound(owner, tier))
        return self.PREFIX + base64.urlsafe_b64encode(sealed).decode().rstrip("=")

    def open(self, sealed: str, owner: str | None, tier: str, most: int = MAX) -> str:
        """The tier's cursor in `sealed`; -32602 unless this router sealed it for `owner` on `tier`."""
        padded = sealed.startswith(self.PREFIX)
        if not (padded or sealed.startswith(self.UNPADDED)) or len(sealed) > most:
            raise invalid(_REFUSED, field="cursor")
        text = sealed[len(self.PREFIX):]
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            if base64.urlsafe_b64encode(raw).decode().rstrip("=") != text:  # one spelling per cursor
                raise ValueError(text)
            opened = self._siv.decrypt(raw, self._bound(owner, tier))
            return (_unpadded(opened) if padded else opened).decode()
        except (ValueError, InvalidTag):  # binascii.Error and UnicodeDecodeError are ValueErrors
            raise invalid(_REFUSED, field="cursor") from None


def _padded(data: bytes, block: int) -> bytes:
    """`data`, 0x80, then zeros to a multiple of `block` bytes (ISO/IEC 7816-4): one length for every
    cursor of a size, whatever number of digits a tier's position is written in."""
    return data + b"\x80" + b"\x00" * (-(len(data) + 1) % block)


def _unpadded(data: bytes) -> bytes:
    """`_padded`'s `data` (ValueError for anything it did not make)."""
    body = data.rstrip(b"\x00")
    if not body.endswith(b"\x80"):
        raise ValueError("not padded")
    return body[:-1]
