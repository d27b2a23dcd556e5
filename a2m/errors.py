"""The protocol's error codes and the one exception that carries them.

Every layer raises `A2MError`; the dispatcher turns it into a JSON-RPC error
object and the client turns an error object back into `A2MError`, so a code
survives a hop through the router unchanged.
"""

from __future__ import annotations

from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
UNKNOWN_RECORD = -32001
UNKNOWN_TIER = -32002
CAPABILITY_NOT_SUPPORTED = -32003
READ_ONLY = -32004
SCOPE_DENIED = -32005
QUOTA_EXCEEDED = -32006
PROTOCOL_NOT_SUPPORTED = -32007
EMBEDDING_MISMATCH = -32008

_NAMES = {
    PARSE_ERROR: "parse error",
    INVALID_REQUEST: "invalid request",
    METHOD_NOT_FOUND: "method not found",
    INVALID_PARAMS: "invalid params",
    INTERNAL_ERROR: "internal error",
    UNKNOWN_RECORD: "unknown record",
    UNKNOWN_TIER: "unknown tier",
    CAPABILITY_NOT_SUPPORTED: "capability not supported",
    READ_ONLY: "read only",
    SCOPE_DENIED: "scope denied",
    QUOTA_EXCEEDED: "quota exceeded",
    PROTOCOL_NOT_SUPPORTED: "protocol not supported",
    EMBEDDING_MISMATCH: "embedding mismatch",
}


class A2MError(Exception):
    """A protocol error: `code` is one of the constants above, `data` is structured detail."""

    def __init__(self, code: int, message: str | None = None, data: Any = None) -> None:
        self.code = code
        self.message = message or _NAMES.get(code, "error")
        self.data = data
        super().__init__(f"{self.code} {self.message}")

    def to_error(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error

    @classmethod
    def from_error(cls, error: Any) -> "A2MError":
        if not isinstance(error, dict):
            return cls(INTERNAL_ERROR, "malformed error object", {"error": error})
        code = error.get("code")  # `type`, not isinstance: `true` is no code, and the router would pass it on
        return cls(code if type(code) is int else INTERNAL_ERROR, str(error.get("message", "")), error.get("data"))


def retry_after(exc: A2MError, most: float) -> float | None:
    """The seconds a rate limit's refusal (`-32006` with `data.retry_after`, as the router answers)
    asks the caller to wait, when that is a number from 0 to `most`; None for any other error."""
    wait = exc.data.get("retry_after") if isinstance(exc.data, dict) else None
    if exc.code != QUOTA_EXCEEDED or isinstance(wait, bool) or not isinstance(wait, (int, float)):
        return None
    return float(wait) if 0 <= wait <= most else None


def invalid(message: str, **data: Any) -> A2MError:
    """Shorthand for the most common error, `-32602`, with the offending field in `data`."""
    return A2MError(INVALID_PARAMS, message, data or None)
