"""Tracing is on only where the environment asks for it, and then sends spans where it says.

Each case runs in a child process: a tracer provider is installed once per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.procs import ROOT, a2m_command

SCRIPT = """
import sys
from a2m import tracing
print("configured", tracing.configure("a2m-test"), tracing.enabled(), file=sys.stderr)
with tracing.server_span("memory/recall", None):
    pass
"""


def _traced(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "A2M_TRACE"))}
    return subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**clean, "PYTHONPATH": str(ROOT), **env})


def test_tracing_is_off_unless_asked_for() -> None:
    for env in ({}, {"OTEL_TRACES_EXPORTER": "none"}):
        done = _traced(env)
        assert "configured False False" in done.stderr and done.stdout == "", done.stderr


def test_an_exporter_list_installs_each_exporter_it_names() -> None:
    """OTEL_TRACES_EXPORTER is a comma-separated list (the OpenTelemetry spec): "console, zipkin"
    matched neither name, and tracing ran with no exporter at all, every span dropped."""
    done = _traced({"OTEL_TRACES_EXPORTER": "console, zipkin"})
    assert "configured True True" in done.stderr, done.stderr
    assert '"name": "a2m memory/recall"' in done.stdout, done.stdout
    assert "zipkin" in done.stderr and "otlp" in done.stderr  # what it cannot install, and what it can


def test_an_exporter_it_cannot_install_leaves_tracing_off_and_says_so() -> None:
    """"zipkin" alone used to install a tracer provider with no exporter: spans made, paid for and dropped."""
    done = _traced({"OTEL_TRACES_EXPORTER": "zipkin"})
    assert "configured False False" in done.stderr and "zipkin" in done.stderr, done.stderr
    assert done.stdout == ""


def test_a_trace_file_that_cannot_be_opened_stops_the_server_by_name(tmp_path: Path) -> None:
    """A2M_TRACE_FILE in a folder that does not exist ended `a2m serve` in FileNotFoundError's traceback."""
    spans = tmp_path / "missing" / "spans.jsonl"
    done = subprocess.run(a2m_command("serve", "procedural", "--stdio", "--data", str(tmp_path / "data")), cwd=ROOT,
                          input="", capture_output=True, text=True, timeout=60,
                          env={**os.environ, "A2M_TRACE_FILE": str(spans)})
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert f"a2m serve procedural: A2M_TRACE_FILE {spans} cannot be opened" in done.stderr, done.stderr
