"""The read-only corpus adapters over a real pgvector table and a real Qdrant collection they did not create."""

from __future__ import annotations

import itertools
import subprocess
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import orjson
import psycopg
import pytest

from backends.episodic.embedded import EmbeddedPostgres
from tests.conformance.test_conformance import failures, run_http
from tests.conformance.wire import HTTPTransport, RPCError
from a2m.filters import Scope, matches
from tests.support.corpora import (COLLECTION_ARGS, DOCS, ODD_POINTS, ODD_UUID, POINTS, TABLE_ARGS, UUID_ID,
                                   langchain_points, llamaindex_points, make_collection, make_points, make_table,
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
        assert describe["tiers"][0]["shared"] is True  # decision 8: one corpus for every owner
        assert "events" not in describe["capabilities"] and "events" not in describe  # nothing to push
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
    given = {arg.partition("=")[0] for arg in extra}  # an option in `extra` replaces the default (given twice is refused)
    defaults = [arg for pair in zip(COLLECTION_ARGS[::2], COLLECTION_ARGS[1::2])
                if pair[1].partition("=")[0] not in given for arg in pair]
    return a2m_command("serve", "corpus", "--port", str(port), "--url", str(path), "--data", str(data),
                       *defaults, *extra), port


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
    assert point_id("5f1c2c9e-3d7a-4c59-9a53-1b7e2f0c4a11") == "5f1c2c9e-3d7a-4c59-9a53-1b7e2f0c4a11"
    # A record shows its UUID in Qdrant's spelling; other spellings name no record (ids are opaque text).
    assert [point_id(v) for v in ("5F1C2C9E-3D7A-4C59-9A53-1B7E2F0C4A11", "5f1c2c9e3d7a4c599a531b7e2f0c4a11",
                                  "{5f1c2c9e-3d7a-4c59-9a53-1b7e2f0c4a11}")] == [None] * 3
    assert _created_at(1767949200) == "2026-01-09T09:00:00.000Z"  # Unix seconds
    assert _created_at("2026-01-09T10:00:00+01:00") == "2026-01-09T09:00:00.000Z"
    # The forms Qdrant reads too (a naive stamp is UTC), so its time filter and the record agree.
    assert _created_at("2026-01-09T09:00:00.250") == "2026-01-09T09:00:00.250Z"
    assert _created_at("2026-01-09 09:00") == "2026-01-09T09:00:00.000Z"
    assert _created_at("2026-01-09") == "2026-01-09T00:00:00.000Z"
    assert [_created_at(v) for v in ("yesterday", None, True, 1e30, ["2026"])] == [EPOCH] * 5


# ---- the Qdrant adapter at the store level, against the reference semantics of a scope ----

@asynccontextmanager
async def opened(path, **spec: Any) -> AsyncIterator[Any]:  # type: ignore[no-untyped-def]
    from backends.corpus.qdrant import CollectionSpec, CollectionStore

    store = CollectionStore(CollectionSpec(collection="kb", **spec), path=str(path))
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def every_record(store: Any) -> list[Any]:
    """What each point shows, read behind the filters under test."""
    points, _ = await store.client.scroll("kb", limit=1000, with_payload=True)
    return [store._record(p, with_embedding=False) for p in points]


ODD_WHERES: list[dict[str, Any]] = [
    {}, {"src": "a"}, {"src": ["a", None]}, {"src": None}, {"src": []}, {"n": 5}, {"n": 5.0}, {"n": 2**53 + 1},
    {"n": True}, {"n": 1}, {"n": 6}, {"n": None}, {"tags": None}, {"tags": "x"}, {"flag": True}, {"flag": 1},
    {"a.b": 1}, {"": "empty"}, {"sp ace": "v"}, {'q"uote': "v"}, {"big": 1e30}, {"deep": None},
    {"content": ""}, {"content": "Shipping takes days."}, {"content": None}, {"text": None}, {"at": None},
    {"id": "1"}, {"id": ["1", "2", ODD_UUID.upper()]}, {"id": ["x", "-1"]}, {"unknown": None}, {"unknown": "x"},
]
ODD_RANGES = [(None, None), ("2026-01-01T00:00:00.000Z", None), (None, "2026-01-03T00:00:00.000Z"),
              ("1950-01-01T00:00:00.000Z", "1971-01-01T00:00:00.000Z"), ("2026-01-03T09:00:00.000Z", None)]


@pytest.mark.anyio
async def test_qdrant_timeline_and_recall_answer_what_the_reference_matcher_says(tmp_path) -> None:  # type: ignore[no-untyped-def]
    make_points(tmp_path / "odd", ODD_POINTS)
    async with opened(tmp_path / "odd", created_field="at") as store:
        every = await every_record(store)
        shown = {r.id: r.created_at for r in every}
        assert shown == {"1": "2026-01-02T09:00:00.000Z", "2": "2026-01-03T09:00:00.000Z",
                         "3": "1970-01-01T00:00:00.000Z", "4": "1970-01-01T00:00:00.000Z",
                         "5": "2026-01-09T09:00:00.000Z", ODD_UUID: "2026-02-01T00:00:00.000Z",
                         "7": "1960-01-01T00:00:00.000Z"}
        orjson.dumps([r.to_wire() for r in every])  # every payload value reaches the wire (10**30 as a float)
        wrong = []
        for where, (after, before) in itertools.product(ODD_WHERES, ODD_RANGES):
            scope = Scope(where=where, after=after, before=before)
            want = [r for r in every if matches(r, scope)]
            newest = sorted((r.created_at for r in want), reverse=True)
            for limit in (None, 1, 2):
                got = await store.select(scope, order="desc", limit=limit)
                stamps = [r.created_at for r in got]
                if ({r.id for r in got} - {r.id for r in want} or stamps != newest[:limit]
                        or len({r.id for r in got}) != len(got)):
                    wrong.append(("timeline", where, after, before, limit, [r.id for r in got], [r.id for r in want]))
            near = await store.search(scope, text=None, vector=[1.0, 0.5], limit=10)
            words = await store.search(scope, text="days", vector=None, limit=10)
            if {r.id for r in near} != {r.id for r in want}:
                wrong.append(("vector", where, after, before, [r.id for r in near], [r.id for r in want]))
            if {r.id for r in words} != {r.id for r in want if "days" in r.content}:
                wrong.append(("text", where, after, before, [r.id for r in words], [r.id for r in want]))
        assert not wrong, "\n".join(map(str, wrong))


@pytest.mark.anyio
async def test_qdrant_collections_without_points_or_dense_vectors_still_answer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    make_points(tmp_path / "empty", {})
    async with opened(tmp_path / "empty", created_field="at") as store:
        assert await store.select(Scope(), order="desc", limit=None) == []
        assert await store.select(Scope(), order="desc", limit=5) == []
        assert await store.search(Scope(), text="refunds", vector=[1.0, 0.0], limit=5) == []
    make_points(tmp_path / "sparse", {1: {"text": "sparse only days"}},
                vectors={})  # no dense vector: recall by words only
    async with opened(tmp_path / "sparse") as store:
        assert not store.searches_vectors and await store.dimensions() is None
        assert [r.id for r in await store.search(Scope(), text="days", vector=None, limit=5)] == ["1"]
        assert await store.search(Scope(), text="the of", vector=None, limit=5) == []  # stopwords only
        # Without created_field every record shows the epoch: a range that leaves it out reads nothing.
        assert await store.select(Scope(after="2000-01-01T00:00:00.000Z"), limit=5) == []
        assert [r.id for r in await store.select(Scope(before="2000-01-01T00:00:00.000Z"))] == ["1"]


@pytest.mark.anyio
async def test_qdrant_unix_seconds_order_and_bound_the_timeline(tmp_path) -> None:  # type: ignore[no-untyped-def]
    make_points(tmp_path / "secs", {1: {"text": "a", "t": 1767949200}, 2: {"text": "b", "t": 1767000000.5},
                                    3: {"text": "c"}, 4: {"text": "d", "t": 1e30}})  # 3 and 4: no readable time
    async with opened(tmp_path / "secs", created_field="t") as store:
        assert [r.id for r in await store.select(Scope(), order="desc", limit=3)] == ["1", "2", "4"]
        assert [r.id for r in await store.select(Scope())] == ["3", "4", "2", "1"]
        assert [r.id for r in await store.select(Scope(after="2026-01-01T00:00:00.000Z"))] == ["1"]
        assert [r.id for r in await store.select(Scope(before="2026-01-01T00:00:00.000Z"))] == ["3", "4", "2"]


# ---- the layouts LangChain and LlamaIndex write, mounted as they are ----

async def agrees_with_the_reference(store: Any, wheres: list[dict[str, Any]]) -> list[Any]:
    """The scopes whose timeline or vector recall differs from what `matches` says of every record."""
    every = await every_record(store)
    wrong = []
    for where in wheres:
        scope = Scope(where=where)
        want = {r.id for r in every if matches(r, scope)}
        got = {r.id for r in await store.select(scope, order="desc")}
        near = {r.id for r in await store.search(scope, text=None, vector=[1.0, 0.5], limit=10)}
        if got != want or near != want:
            wrong.append((where, got, near, want))
    return wrong


@pytest.mark.anyio
async def test_qdrant_langchain_layout_shows_and_filters_the_metadata_object(tmp_path) -> None:  # type: ignore[no-untyped-def]
    points = langchain_points()
    make_points(tmp_path / "lc", points)
    ids = list(points)
    async with opened(tmp_path / "lc", text_field="page_content", metadata_field="metadata",
                      created_field="written") as store:
        first = (await store.get(None, [ids[0]]))[0]
        assert first.content == DOCS[0][0] and first.created_at == "2026-01-02T09:00:00.000Z"
        assert first.metadata == {"source": "policy.md", "page": 1, "tags": ["money"]}
        assert (await store.get(None, [ids[3]]))[0].metadata == {}  # no metadata object: none shown
        # `where` names metadata keys; Qdrant tests them inside the object (a dotted key quoted).
        policy = Scope(where={"source": "policy.md", "a.b": None})
        assert '"key":"metadata.source"' in store._filter(policy).model_dump_json()
        assert '"key":"metadata.\\"a.b\\""' in store._filter(policy).model_dump_json()
        assert [r.id for r in await store.select(policy)] == [ids[0], ids[2]]  # in `written` order
        assert [r.id for r in await store.select(Scope(where={"a.b": "dotted"}))] == [ids[1]]
        hits = await store.search(Scope(where={"page": 2}), text="refunded cards", vector=None, limit=5)
        assert [r.id for r in hits] == [ids[2]]
        assert await store.search(Scope(where={"source": "shipping.md"}), text="refunds", vector=None, limit=5) == []
        assert not await agrees_with_the_reference(store, [
            {"source": "policy.md"}, {"source": None}, {"page": 1.0}, {"tags": "money"}, {"written": None},
            {"metadata": None}, {"page_content": None}, {"content": DOCS[3][0]}, {"a.b": ["dotted", None]}])
    # Without the option the payload is as it was: the object is one metadata key among the payload's.
    async with opened(tmp_path / "lc", text_field="page_content") as store:
        assert (await store.get(None, [ids[1]]))[0].metadata == {"metadata": points[ids[1]]["metadata"]}


@pytest.mark.anyio
async def test_qdrant_llamaindex_layout_reads_the_text_out_of_the_node_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from backends.corpus.qdrant import CollectionSpec

    spec = CollectionSpec.from_options({"collection": "kb", "text_field": "_node_content", "text_json_key": "text",
                                        "metadata_fields": "file_name,page_label,ref_doc_id"})
    assert (spec.text_field, spec.text_json_key, spec.metadata_field) == ("_node_content", "text", None)
    points = llamaindex_points()
    make_points(tmp_path / "li", points)
    ids = list(points)
    async with opened(tmp_path / "li", text_field="_node_content", text_json_key="text",
                      metadata_fields=["file_name", "page_label", "ref_doc_id"]) as store:
        first = (await store.get(None, [ids[0]]))[0]
        assert first.content == DOCS[0][0]
        assert first.metadata == {"file_name": "policy.txt", "page_label": "1", "ref_doc_id": "doc-policy"}
        hits = await store.search(Scope(), text="how long do refunds take", vector=None, limit=5)
        assert hits[0].id == ids[0]
        within = await store.search(Scope(where={"file_name": "shipping.txt"}), text="refunds", vector=None, limit=5)
        assert within == []
        assert not await agrees_with_the_reference(store, [
            {"file_name": "policy.txt"}, {"ref_doc_id": ["doc-shipping"]}, {"content": DOCS[1][0]},
            {"_node_type": None}, {"page_label": "3"}])


@pytest.mark.anyio
async def test_qdrant_corpus_server_takes_the_layout_options(tmp_path) -> None:  # type: ignore[no-untyped-def]
    points = langchain_points()
    make_points(tmp_path / "lc", points)
    port = free_port()
    command = a2m_command("serve", "corpus", "--port", str(port), "--url", str(tmp_path / "lc"), "--data",
                          str(tmp_path / "data"), "--option", "collection=kb", "--option", "text_field=page_content",
                          "--option", "metadata_field=metadata", "--option", "created_field=written")
    with http_server(command, port) as url:
        t = HTTPTransport(url)
        try:
            policy = (await t.call("memory/timeline", {"where": {"source": "policy.md"}}))["records"]
            assert [r["metadata"]["page"] for r in policy] == [1, 2]
            assert policy[0]["created_at"] == "2026-01-02T09:00:00.000Z" and policy[0]["content"] == DOCS[0][0]
        finally:
            await t.close()
