"""`a2m bench` outside a source checkout: bench/ ships only beside the sources, never in the wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import ROOT

pytestmark = pytest.mark.timeout(60)


def test_bench_without_bench_dir_says_to_use_a_source_checkout(tmp_path: Path) -> None:
    # As a wheel installs it: the a2mctl package alone in site-packages, no bench/ beside it.
    site = tmp_path / "site-packages"
    shutil.copytree(ROOT / "a2mctl", site / "a2mctl", ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "a2mctl.cli", "bench", "--quick"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PYTHONPATH": str(site)})
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("a2m bench: ") and "source checkout" in lines[0], lines[0]
