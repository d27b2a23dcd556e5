"""The read-only corpus server over stdio, through the conformance suite, on both of its engines.

tests/backends/test_corpus.py runs the same servers over HTTP; the README promises both bindings
for every server here. Each test makes its own table or collection: qdrant-client's local-mode
directory opens in one process at a time, so nothing is shared with the HTTP tests' fixtures.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from backends.episodic.embedded import EmbeddedPostgres
from tests.conformance.test_conformance import failures
from tests.conformance.suite import run
from tests.conformance.wire import StdioTransport
from tests.support.corpora import COLLECTION_ARGS, TABLE_ARGS, make_collection, make_table, tree_digest
from tests.support.procs import a2m_command

pytestmark = pytest.mark.timeout(240)


async def run_corpus_stdio(command: list[str]) -> list:
    """As the conformance tests' run_stdio, and stdout must carry nothing but JSON-RPC."""
    transport = StdioTransport(shlex.join(command))
    await transport.start()
    try:
        results = await run(transport)
    finally:
        await transport.close()
    assert transport.exit_code == 0, "closing stdin must end the server cleanly"
    assert transport.bad_lines == [], transport.bad_lines[:3]
    return results


def assert_conformant_and_read_only(results: list) -> None:
    assert not failures(results), "\n".join(failures(results))
    assert any(r.group == "read-only" and r.outcome == "pass" for r in results)
    assert any(r.group == "stdio" and r.outcome == "pass" for r in results)  # the stdio binding's own checks ran


@pytest.mark.anyio
async def test_pgvector_corpus_over_stdio(tmp_path: Path) -> None:
    pg = EmbeddedPostgres(tmp_path / "pg")
    dsn = pg.start()
    try:
        make_table(dsn)
        results = await run_corpus_stdio(a2m_command("serve", "corpus", "--stdio", "--url", dsn, *TABLE_ARGS,
                                                     "--data", str(tmp_path / "data")))
    finally:
        pg.stop()
    assert_conformant_and_read_only(results)


@pytest.mark.anyio
async def test_qdrant_corpus_over_stdio(tmp_path: Path) -> None:
    path = tmp_path / "qdrant"
    make_collection(path)
    before = tree_digest(path)
    results = await run_corpus_stdio(a2m_command("serve", "corpus", "--stdio", "--url", str(path),
                                                 *COLLECTION_ARGS, "--data", str(tmp_path / "data")))
    assert_conformant_and_read_only(results)
    assert tree_digest(path) == before  # the suite's writes were all refused
