"""The read-only corpus adapters over a real pgvector table and a real Qdrant collection they did not create."""

from __future__ import annotations

import subprocess

import psycopg
import pytest

from backends.episodic.embedded import EmbeddedPostgres
from tests.conformance.test_conformance import failures, run_http
from tests.conformance.wire import HTTPTransport, RPCError
from tests.support.corpora import (COLLECTION_ARGS, DOCS, POINTS, TABLE_ARGS, UUID_ID, make_collection, make_table,
                                   tree_digest)
from tests.support.procs import a2m_command, free_port, http_server

@pytest.fixture(scope="module")
def corpus_url(tmp_path_factory):  # type: ignore[no-untyped-def]
    pg = EmbeddedPostgres(tmp_path_factory.mktemp("corpus-pg"))
    dsn = pg.start()
    make_table(dsn)
    port = free_port()
    command = a2m_command("serve", "corpus", "--port", str(port), "--url", dsn, *TABLE_ARGS,
                          "--data", str(tmp_path_factory.mktemp("corpus-data")))  # not the user's data dir
    try:
        with http_server(command, port) as url:
            yield url, dsn
    finally:
        pg.stop()


@pytest.mark.anyio
async def test_corpus_is_conformant_and_read_only(corpus_url) -> None:  # type: ignore[no-untyped-def]
    url, _ = corpus_url
    results = await run_http(url)
    assert not failures(results), failures(results)
    assert any(r.group == "read-only" and r.outcome == "pass" for r in results)


@pytest.mark.anyio
async def test_corpus_recalls_by_text_vector_and_filter_and_never_writes(corpus_url) -> None:  # type: ignore[no-untyped-def]
    url, dsn = corpus_url
    t = HTTPTransport(url)
    try:
        describe = await t.call("memory/describe", {})
        assert describe["tiers"][0]["read_only"] is True and describe["embeddings"]["dimensions"] == 4
        hits = (await t.call("memory/recall", {"query": "how long do refunds take"}))["records"]
        assert hits and hits[0]["content"].startswith("Refunds")
        near = (await t.call("memory/recall", {"embedding": [0.0, 1.0, 0.0, 0.1], "limit": 2}))["records"]
        assert [r["metadata"]["source"] for r in near] == ["shipping", "shipping"]
        policy = (await t.call("memory/timeline", {"where": {"source": "policy"}}))["records"]
        assert len(policy) == 2 and all(r["metadata"]["source"] == "policy" for r in policy)
        # a selector holding NUL matches nothing here either (PostgreSQL would refuse the parameter)
        for params in ({"where": {"source": "policy\u0000"}}, {"where": {"id": ["1\u0000"]}}):
            assert (await t.call("memory/timeline", params))["records"] == []
        with pytest.raises(RPCError) as err:
            await t.call("memory/remember", {"records": [{"content": "x"}]})
        assert err.value.code == -32004
        with pytest.raises(RPCError) as err:
            await t.call("memory/forget", {"ids": [hits[0]["id"]]})
        assert err.value.code == -32004
    finally:
        await t.close()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM kb").fetchone()[0] == len(DOCS)


# ---- the same adapter over a Qdrant collection (qdrant-client's local mode: the real engine code path) ----

def qdrant_corpus_command(path, data, *extra: str) -> tuple[list[str], int]:  # type: ignore[no-untyped-def]
    port = free_port()
    return a2m_command("serve", "corpus", "--port", str(port), "--url", str(path), "--data", str(data),
                       *COLLECTION_ARGS, *extra), port


@pytest.fixture(scope="module")
def qdrant_corpus(tmp_path_factory):  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("corpus-qdrant")
    make_collection(path)
    command, port = qdrant_corpus_command(path, tmp_path_factory.mktemp("corpus-qdrant-data"))
    with http_server(command, port) as url:
        yield url, path


@pytest.mark.anyio
async def test_qdrant_corpus_is_conformant_and_read_only(qdrant_corpus) -> None:  # type: ignore[no-untyped-def]
    url, _ = qdrant_corpus
    results = await run_http(url)
    assert not failures(results), failures(results)
    assert any(r.group == "read-only" and r.outcome == "pass" for r in results)


@pytest.mark.anyio
async def test_qdrant_corpus_recalls_filters_and_never_writes(qdrant_corpus) -> None:  # type: ignore[no-untyped-def]
    url, path = qdrant_corpus
    before = tree_digest(path)
    t = HTTPTransport(url)
    try:
        describe = await t.call("memory/describe", {})
        assert describe["tiers"][0]["read_only"] is True and describe["tiers"][0]["count"] == len(POINTS)
        assert describe["embeddings"]["dimensions"] == 4 and describe["embeddings"]["metric"] == "dot"
        hits = (await t.call("memory/recall", {"query": "how long do refunds take"}))["records"]
        assert hits and hits[0]["content"].startswith("Refunds") and hits[0]["id"] == "1"
        assert hits[0]["metadata"] == {"source": "policy", "tags": ["money", "returns"], "stars": 4}
        assert hits[0]["created_at"] == "2026-01-02T09:00:00.000Z"
        assert not (await t.call("memory/recall", {"query": "the and of"}))["records"]  # stopwords find nothing
        near = (await t.call("memory/recall", {"embedding": [0.0, 1.0, 0.0, 0.1], "limit": 2}))["records"]
        assert [r["metadata"]["source"] for r in near] == ["shipping", "shipping"]
        assert near[0]["id"] == UUID_ID

        async def timeline(**params: object) -> list[str]:
            return [r["id"] for r in (await t.call("memory/timeline", params))["records"]]

        assert await timeline() == ["1", "3", UUID_ID, "4"]  # creation order
        assert await timeline(limit=2) == [UUID_ID, "4"]  # the newest two
        assert await timeline(where={"source": "policy"}) == ["1", "3"]
        assert await timeline(where={"tags": "eu"}) == [UUID_ID]  # a list field matches any member
        assert await timeline(where={"stars": 5}) == [UUID_ID]  # 5 meets 5.0
        assert await timeline(where={"stars": None}) == ["3", "4"]  # absent or null
        assert await timeline(where={"content": DOCS[3][0]}) == ["4"]
        assert await timeline(where={"id": [UUID_ID, "3", "nope", "-1", "03", "99"]}) == ["3", UUID_ID]
        assert await timeline(after="2026-01-05T00:00:00Z", before="2026-02-10T00:00:00Z") == ["3", UUID_ID]
        assert await timeline(where={"session": "s1"}) == []  # a field no mounted record has
        assert await timeline(where={"source": "policy\u0000"}) == []
        within = (await t.call("memory/recall", {"query": "refunds", "where": {"source": "shipping"}}))["records"]
        assert within == []  # "refunds" is only in policy documents
        with pytest.raises(RPCError) as err:
            await t.call("memory/recall", {"embedding": [1.0, 0.0, 0.0]})
        assert err.value.code == -32008
        for method, params in (("memory/remember", {"records": [{"content": "x"}]}), ("memory/forget", {"ids": ["1"]})):
            with pytest.raises(RPCError) as err:
                await t.call(method, params)
            assert err.value.code == -32004
    finally:
        await t.close()
    assert tree_digest(path) == before


@pytest.mark.anyio
async def test_qdrant_corpus_ranks_by_the_vector_it_is_told_and_names_what_it_lacks(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "named"
    make_collection(path, named={"dense": 4, "small": 2})
    command, port = qdrant_corpus_command(path, tmp_path / "data")
    started = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert started.returncode != 0 and "vector_name" in started.stderr and "'dense'" in started.stderr
    command, port = qdrant_corpus_command(path, tmp_path / "data", "--option", "collection=kd")
    started = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert started.returncode != 0 and "no collection 'kd'" in started.stderr and "['kb']" in started.stderr
    command, port = qdrant_corpus_command(path, tmp_path / "data", "--option", "vector_name=dense",
                                          "--option", "metadata_fields=source")
    with http_server(command, port) as url:
        t = HTTPTransport(url)
        try:
            assert (await t.call("memory/describe", {}))["embeddings"]["metric"] == "cosine"
            near = (await t.call("memory/recall", {"embedding": [0.0, 0.0, 1.0, 0.0], "limit": 1,
                                                   "embeddings": True}))["records"]
            assert near[0]["id"] == "3" and near[0]["metadata"] == {"source": "policy"}
            assert near[0]["embedding"] == pytest.approx([0.0, 0.0, 1.0, 0.0])
        finally:
            await t.close()


def test_point_ids_and_payload_times_read_as_the_protocol_writes_them() -> None:
    from backends.corpus.qdrant import EPOCH, _created_at, point_id

    assert [point_id(v) for v in ("7", "007", "-1", "1.5", str(2**64), "nope", "٣")] == [7, None, None, None, None,
                                                                                       None, None]
    assert point_id("5F1C2C9E-3D7A-4C59-9A53-1B7E2F0C4A11") == "5f1c2c9e-3d7a-4c59-9a53-1b7e2f0c4a11"
    assert _created_at(1767949200) == "2026-01-09T09:00:00.000Z"  # Unix seconds
    assert _created_at("2026-01-09T10:00:00+01:00") == "2026-01-09T09:00:00.000Z"
    assert [_created_at(v) for v in ("yesterday", None, True, 1e30, ["2026"])] == [EPOCH] * 5
