"""Each tier server, on its real embedded engine, through the conformance suite over HTTP and stdio;
the read-only corpus server over stdio, mounting a Qdrant collection in qdrant-client's local mode."""

from __future__ import annotations

import pytest

from tests.support.corpora import COLLECTION_ARGS, make_collection
from tests.support.procs import a2m_command, free_port, http_server

from .test_conformance import failures, run_http, run_stdio

TIERS = ["working", "episodic", "semantic", "procedural"]


@pytest.mark.anyio
@pytest.mark.parametrize("tier", TIERS)
async def test_tier_over_http(tier: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    with http_server(a2m_command("serve", tier, "--port", str(port), "--data", str(tmp_path)), port) as url:
        results = await run_http(url)
    assert not failures(results), "\n".join(failures(results))
    assert sum(r.outcome == "pass" for r in results) >= 35


@pytest.mark.anyio
@pytest.mark.parametrize("tier", TIERS)
async def test_tier_over_stdio(tier: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    results = await run_stdio(a2m_command("serve", tier, "--stdio", "--data", str(tmp_path)))
    assert not failures(results), "\n".join(failures(results))
    assert any(r.name.startswith("over stdio, subscribe") and r.outcome == "pass" for r in results)


@pytest.mark.anyio
async def test_corpus_over_stdio(tmp_path) -> None:  # type: ignore[no-untyped-def]
    make_collection(tmp_path / "kb")
    results = await run_stdio(a2m_command("serve", "corpus", "--stdio", "--url", str(tmp_path / "kb"), *COLLECTION_ARGS))
    assert not failures(results), "\n".join(failures(results))
    assert any(r.group == "read-only" and r.outcome == "pass" for r in results)
