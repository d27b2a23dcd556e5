"""Shared fixtures. Tests are async through anyio's pytest plugin on asyncio."""

import os

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def scale(full: int, reduced: int) -> int:
    """Size of a scale test: `reduced` unless A2M_SCALE=full (CI runs reduced)."""
    return full if os.environ.get("A2M_SCALE") == "full" else reduced
