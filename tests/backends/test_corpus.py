"""The read-only corpus adapter over a real pgvector table it did not create."""

from __future__ import annotations

import psycopg
import pytest

from backends.episodic.embedded import EmbeddedPostgres
from tests.conformance.test_conformance import failures, run_http
from tests.conformance.wire import HTTPTransport, RPCError
from tests.support.procs import a2m_command, free_port, http_server

DOCS = [
    ("Refunds are issued within 14 days of a return.", "policy", [1.0, 0.0, 0.0, 0.0]),
    ("Shipping to Italy takes 3 to 5 business days.", "shipping", [0.0, 1.0, 0.0, 0.0]),
    ("Gift cards never expire and cannot be refunded.", "policy", [0.0, 0.0, 1.0, 0.0]),
    ("Our warehouse in Bologna ships every weekday.", "shipping", [0.0, 0.7, 0.0, 0.7]),
]


@pytest.fixture(scope="module")
def corpus_url(tmp_path_factory):  # type: ignore[no-untyped-def]
    pg = EmbeddedPostgres(tmp_path_factory.mktemp("corpus-pg"))
    dsn = pg.start()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute("CREATE TABLE kb (doc_id serial PRIMARY KEY, body text, source text, emb vector(4),"
                     " written timestamptz DEFAULT now())")
        for body, source, emb in DOCS:
            conn.execute("INSERT INTO kb (body, source, emb) VALUES (%s, %s, %s::vector)", (body, source, str(emb)))
    port = free_port()
    command = a2m_command("serve", "corpus", "--port", str(port), "--url", dsn, "--option", "table=kb",
                          "--data", str(tmp_path_factory.mktemp("corpus-data")),  # not the user's data dir
                          "--option", "id_column=doc_id", "--option", "text_column=body",
                          "--option", "vector_column=emb", "--option", "created_column=written",
                          "--option", "metadata_columns=source")
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
