"""Child processes that never outlive their tier server (Linux: PR_SET_PDEATHSIG).

A tier server killed outright (SIGKILL, OOM) must not leave its engine or a
half-done `git` running: an orphan would keep writing after the next start has
recovered. PDEATHSIG fires when the *thread* that forked exits, so use it for
children started from a thread that lives as long as they should (the event
loop's thread, or a worker blocked waiting for the child).

`rotate_log` keeps an embedded engine's log bounded across its restarts.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
from pathlib import Path
from typing import Callable

_PR_SET_PDEATHSIG = 1

try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
except OSError:  # not Linux/glibc: callers still stop their children themselves
    _libc = None


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A `preexec_fn` that makes the child receive `sig` when this process dies."""
    parent = os.getpid()

    def setup() -> None:  # runs in the child, between fork and exec
        if _libc is not None:
            _libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return setup


LOG_LIMIT = 2**20  # an engine's log over this when it starts is moved to `<log>.1`


def rotate_log(path: Path, limit: int = LOG_LIMIT) -> None:
    """Move `path` to `path.1` (replacing it) when it is over `limit` bytes: two files at most.
    Only while no engine writes it (an engine keeps writing to the file it opened, renamed or not)."""
    try:
        if path.stat().st_size > limit:
            os.replace(path, path.with_name(path.name + ".1"))
    except FileNotFoundError:
        pass
