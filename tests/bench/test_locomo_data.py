"""bench/locomo.py without its dataset: skipped where nobody asked for it, refused where someone did.

The LoCoMo dev split is not in this repository (its default directory sits beside the checkout),
so `a2m bench` in a fresh clone reported `locomo` as a failed benchmark, exit 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.locomo as locomo


@pytest.fixture
def no_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    missing = tmp_path / "locomo-dev"
    monkeypatch.setattr(locomo, "DEFAULT_DATA", missing)
    monkeypatch.delenv("A2M_LOCOMO", raising=False)
    return missing


def test_the_default_directory_without_conversations_is_a_skip(no_dataset: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    [result] = locomo.main(["--up", "--quick"])  # run_all's arguments; nothing is started
    assert result["bench"] == "locomo" and str(no_dataset) in result["skipped"]
    assert "A2M_LOCOMO" in result["skipped"]
    assert json.loads(capsys.readouterr().out) == result  # the line run_all reads


def test_a_directory_named_on_purpose_without_conversations_is_an_error(
        no_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit, match="no \\*.json conversation"):
        locomo.main(["--data", str(tmp_path / "elsewhere")])
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("A2M_LOCOMO", str(empty))
    with pytest.raises(SystemExit, match="no \\*.json conversation"):
        locomo.main([])
