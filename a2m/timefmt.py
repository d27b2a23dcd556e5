"""Timestamps on the wire: RFC 3339, UTC, `Z`, millisecond precision, never a number.

Stored and compared as the canonical string: with a fixed width and a fixed
zone, string order is time order, which lets every engine index them as text.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from .errors import invalid

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)

_CANONICAL = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z")


def format_ts(moment: datetime) -> str:
    """The canonical form: `2026-07-28T10:15:30.123Z`."""
    m = moment.astimezone(timezone.utc)  # an f-string: strftime was a tenth of an episodic recall's Python
    return f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:{m.second:02d}.{m.microsecond // 1000:03d}Z"


def shift_ms(stamp: str, ms: int) -> str | None:
    """`stamp` moved by `ms` milliseconds, or None past year 9999 or before year 1: no record lies
    there, so a bound it would have been is simply left off."""
    try:
        return format_ts(parse_ts(stamp) + timedelta(milliseconds=ms))
    except OverflowError:
        return None


def now() -> str:
    return format_ts(datetime.now(timezone.utc))


def parse_ts(value: object, field: str = "timestamp") -> datetime:
    """Parse an RFC 3339 timestamp with an explicit offset into UTC; anything else is `-32602`.

    Converted here, not by the caller: a stamp whose offset moves it past year
    9999 or before year 1 (`9999-12-31T23:30:00-01:00`) parses but has no UTC
    form, and Python says so with an OverflowError that would be a -32603.

    A leap second (`23:59:60`, RFC 3339 §5.6) is a valid stamp that datetime
    cannot hold: it is read as the minute's last millisecond (`23:59:59.999`),
    which never puts it before a stamp that precedes it, nor into the next minute."""
    if not isinstance(value, str) or (match := _RFC3339.match(value)) is None:
        raise invalid(f"{field} must be an RFC 3339 timestamp such as 2026-07-28T10:15:30.123Z", field=field)
    text = value.replace("z", "Z").replace("t", "T")
    if match.group(6) == "60":
        text = text[:17] + "59.999" + text[match.start(8):]
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        return datetime.fromisoformat(text).astimezone(timezone.utc)
    except ValueError:
        raise invalid(f"{field} is not a valid date and time", field=field) from None
    except OverflowError:
        raise invalid(f"{field} is outside the years 0001 to 9999 in UTC", field=field) from None


def normalize_ts(value: object, field: str = "timestamp") -> str:
    """Accept any RFC 3339 timestamp with an offset and return the canonical UTC form.

    A stamp already canonical (what every server and export writes) is only
    checked to be a real date: a write of 500 records dated by a loader spent
    a tenth of its validation parsing and re-printing them."""
    if isinstance(value, str) and _canonical(value):
        return value
    return format_ts(parse_ts(value, field))


def _canonical(value: str) -> bool:
    if _CANONICAL.fullmatch(value) is None:  # ASCII digits only: str.isdigit takes other scripts' digits
        return False
    try:
        datetime.fromisoformat(value)  # the digits and ranges: month 13 or "2026-02-30" fail here
    except ValueError:
        return False
    return True


def to_epoch(value: str) -> float:
    """Seconds since the epoch. The canonical form (what every server writes) skips the validating
    regex: the router's fusion reads the stamp of every candidate of every recall."""
    if len(value) == 24 and value[10] == "T" and value[-1] == "Z":
        try:
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            pass
    return parse_ts(value).timestamp()
