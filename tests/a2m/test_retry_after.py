"""`a2m.errors.retry_after`: what a rate limit's refusal asks a client to wait, read the same way by
`a2m doctor`, `a2m export`/`import` and the discovery document's 429 (a wait it cannot use: None)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from a2m import errors
from a2m.errors import A2MError, retry_after


@pytest.mark.parametrize(("code", "data", "wait"), [
    (errors.QUOTA_EXCEEDED, {"retry_after": 2}, 2.0),  # an int is a number of seconds too
    (errors.QUOTA_EXCEEDED, {"retry_after": 0.25}, 0.25),
    (errors.QUOTA_EXCEEDED, {"retry_after": 0}, 0.0),
    (errors.QUOTA_EXCEEDED, {"retry_after": 10}, 10.0),  # `most` itself is waited
    (errors.QUOTA_EXCEEDED, {"retry_after": 10.001}, None),  # past it: the caller's own bound
    (errors.QUOTA_EXCEEDED, {"retry_after": 10**400}, None),  # no OverflowError
    (errors.QUOTA_EXCEEDED, {"retry_after": -1}, None),
    (errors.QUOTA_EXCEEDED, {"retry_after": math.nan}, None),
    (errors.QUOTA_EXCEEDED, {"retry_after": math.inf}, None),
    (errors.QUOTA_EXCEEDED, {"retry_after": True}, None),  # a bool is an int to isinstance
    (errors.QUOTA_EXCEEDED, {"retry_after": "1"}, None),
    (errors.QUOTA_EXCEEDED, {}, None),
    (errors.QUOTA_EXCEEDED, None, None),
    (errors.QUOTA_EXCEEDED, [1], None),
    (errors.INTERNAL_ERROR, {"retry_after": 1}, None),  # only a rate limit's refusal is waited out
])
def test_retry_after_reads_only_a_usable_wait(code: int, data: Any, wait: float | None) -> None:
    got = retry_after(A2MError(code, "refused", data), 10.0)
    assert got == wait and (got is None or type(got) is float)
