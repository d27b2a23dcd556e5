"""The read-only corpus server over stdio, through the conformance suite, on both of its engines.

tests/backends/test_corpus.py runs the same servers over HTTP; the README promises both bindings
for every server here. Each test makes its own table or collection: qdrant-client's local-mode
directory opens in one process at a time, so nothing is shared with the HTTP tests' fixtures.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.episodic.embedded import EmbeddedPostgres
from tests.conformance.test_conformance import failures, run_stdio
from tests.support.corpora import COLLECTION_ARGS, TABLE_ARGS, make_collection, make_table, tree_digest
from tests.support.procs import a2m_command

pytestmark = pytest.mark.timeout(240)


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
        results = await run_stdio(a2m_command("serve", "corpus", "--stdio", "--url", dsn, *TABLE_ARGS,
                                                     "--data", str(tmp_path / "data")))
    finally:
        pg.stop()
    assert_conformant_and_read_only(results)


@pytest.mark.anyio
async def test_qdrant_corpus_over_stdio(tmp_path: Path) -> None:
    path = tmp_path / "qdrant"
    make_collection(path)
    before = tree_digest(path)
    results = await run_stdio(a2m_command("serve", "corpus", "--stdio", "--url", str(path),
                                                 *COLLECTION_ARGS, "--data", str(tmp_path / "data")))
    assert_conformant_and_read_only(results)
    assert tree_digest(path) == before  # the suite's writes were all refused
