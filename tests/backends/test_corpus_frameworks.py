"""The RAG layouts people actually have, mounted with `a2m serve corpus` as the docs' recipes say.

Each store is built by hand exactly as its library creates it (no LangChain or LlamaIndex here):

- LangChain `PGVector`, langchain_postgres 0.0.x (SQLAlchemy's DDL for its `CollectionStore` and
  `EmbeddingStore`): `langchain_pg_collection (uuid, name, cmetadata json)` and
  `langchain_pg_embedding (id varchar, collection_id uuid, embedding vector, document varchar,
  cmetadata jsonb)` with its `ix_cmetadata_gin` (jsonb_path_ops) index; several collections share the
  table (here embedded at two widths). And langchain_community's older `PGVector` (0.2.x,
  `use_jsonb=False`): `uuid` key, `custom_id`, and `cmetadata json`. And langchain_postgres 0.0.14+'s
  `PGVectorStore` (`PGEngine.init_vectorstore_table`): a table per store, `langchain_id uuid`,
  `content`, `embedding vector(N)`, `langchain_metadata json`.
- LlamaIndex `PGVectorStore`, llama-index-vector-stores-postgres 0.2-0.4 (`get_data_model`):
  `data_<name> (id bigserial, text varchar, metadata_ json, node_id varchar, embedding vector(N))`, its
  btree on `metadata_->>'ref_doc_id'`, and with `hybrid_search=True` a generated `text_search_tsv`
  with its GIN index and an HNSW index (`hnsw_kwargs`). `metadata_` is `node_to_metadata_dict(node,
  remove_text=True, flat_metadata=False)`: the node's metadata flat, beside `_node_content`,
  `_node_type`, `doc_id`, `document_id`, `ref_doc_id`.
- Qdrant: langchain_qdrant 0.2's `QdrantVectorStore` (`page_content` and a `metadata` object, which
  `add_texts` without metadatas leaves null; its dense vector named "" — the default vector — or
  another name), and llama-index-vector-stores-qdrant 0.4's (`_node_content`, text kept in it, dense
  vector `text-dense` beside a sparse `text-sparse` when hybrid; the legacy payload's `text`).

Every engine is real: the embedded PostgreSQL 18 + pgvector, and qdrant-client's local mode.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from a2m.filters import Scope
from backends.episodic.embedded import EmbeddedPostgres
from tests.support.corpora import DOCS

from .test_corpus_mounting import records, serve

pytestmark = pytest.mark.timeout(300)

HANDBOOK = "1b5a3c2e-0d1f-4e2a-9b3c-4d5e6f7a8b01"  # langchain_pg_collection.uuid of each collection
FAQ = "1b5a3c2e-0d1f-4e2a-9b3c-4d5e6f7a8b02"
# The other collection, embedded by another model (3 wide): the unsized `vector` column holds both.
OTHER = [("Refunds for gift cards are never possible.", [0.9, 0.1, 0.0]),
         ("Refunds on sale items are store credit.", [1.0, 0.0, 0.1])]


def _vector(values: list[float]) -> str:
    return "[" + ",".join(map(str, values)) + "]"


def langchain_tables(conn: psycopg.Connection[Any]) -> None:
    """langchain_postgres's tables holding two collections; and langchain_community's in schema `legacy`."""
    conn.execute("""
        CREATE EXTENSION IF NOT EXISTS vector;
        CREATE TABLE langchain_pg_collection (
            uuid UUID NOT NULL, name VARCHAR NOT NULL, cmetadata JSON, PRIMARY KEY (uuid), UNIQUE (name));
        CREATE TABLE langchain_pg_embedding (
            id VARCHAR NOT NULL, collection_id UUID, embedding VECTOR, document VARCHAR, cmetadata JSONB,
            PRIMARY KEY (id),
            FOREIGN KEY(collection_id) REFERENCES langchain_pg_collection (uuid) ON DELETE CASCADE);
        CREATE INDEX ix_cmetadata_gin ON langchain_pg_embedding USING gin (cmetadata jsonb_path_ops);
        CREATE UNIQUE INDEX ix_langchain_pg_embedding_id ON langchain_pg_embedding (id);
        CREATE SCHEMA legacy;
        CREATE TABLE legacy.langchain_pg_collection (
            name VARCHAR, cmetadata JSON, uuid UUID NOT NULL, PRIMARY KEY (uuid));
        CREATE TABLE legacy.langchain_pg_embedding (
            collection_id UUID, embedding VECTOR, document VARCHAR, cmetadata JSON, custom_id VARCHAR,
            uuid UUID NOT NULL, PRIMARY KEY (uuid),
            FOREIGN KEY(collection_id) REFERENCES legacy.langchain_pg_collection (uuid) ON DELETE CASCADE);
    """)
    for schema in ("public", "legacy"):
        conn.execute(f"INSERT INTO {schema}.langchain_pg_collection (uuid, name, cmetadata) VALUES "
                     "(%s, 'handbook', NULL), (%s, 'faq', '{}')", (HANDBOOK, FAQ))
    for n, (text, source, vector) in enumerate(DOCS):
        metadata = json.dumps({"source": f"{source}.md", "page": n + 1, "tags": [source]})
        conn.execute("INSERT INTO langchain_pg_embedding VALUES (%s, %s, %s::vector, %s, %s::jsonb)",
                     (f"lc-{n}", HANDBOOK, _vector(vector), text, metadata))
        conn.execute("INSERT INTO legacy.langchain_pg_embedding VALUES (%s, %s::vector, %s, %s::json, %s, %s)",
                     (HANDBOOK, _vector(vector), text, metadata, f"lc-{n}", f"00000000-0000-4000-8000-00000000000{n}"))
    for n, (text, vector) in enumerate(OTHER):  # another collection in the same table: never mounted here
        metadata = json.dumps({"source": "policy.md", "page": 9})
        conn.execute("INSERT INTO langchain_pg_embedding VALUES (%s, %s, %s::vector, %s, %s::jsonb)",
                     (f"faq-{n}", FAQ, _vector(vector), text, metadata))
        conn.execute("INSERT INTO legacy.langchain_pg_embedding VALUES (%s, %s::vector, %s, %s::json, %s, %s)",
                     (FAQ, _vector(vector), text, metadata, f"faq-{n}", f"00000000-0000-4000-8000-00000000010{n}"))


def langchain_store_table(conn: psycopg.Connection[Any]) -> None:
    """langchain_postgres 0.0.14+'s `PGVectorStore`: `PGEngine.init_vectorstore_table("lc_store", 4)`
    (a table per store, metadata in the json `langchain_metadata`) and `apply_vector_index(HNSWIndex())`."""
    conn.execute("""
        CREATE TABLE "public"."lc_store"(
            "langchain_id" UUID PRIMARY KEY, "content" TEXT NOT NULL, "embedding" vector(4) NOT NULL,
            "langchain_metadata" JSON);
        CREATE INDEX langchain_vector_index ON "public"."lc_store" USING hnsw (embedding vector_cosine_ops);
    """)
    for n, (text, source, vector) in enumerate(DOCS):
        conn.execute("INSERT INTO lc_store VALUES (%s, %s, %s::vector, %s::json)",
                     (f"00000000-0000-4000-8000-00000000020{n}", text, _vector(vector),
                      json.dumps({"source": f"{source}.md", "page": n + 1})))


def llamaindex_metadata(n: int, source: str, text: str) -> str:
    """`metadata_` as `node_to_metadata_dict(node, remove_text=True, flat_metadata=False)` writes it."""
    node_id = f"7c2e0b63-1d2f-4a2b-8e5f-2b3c4d5e6f{n:02d}"
    metadata = {"file_name": f"{source}.txt", "page_label": str(n + 1)}
    node = {"id_": node_id, "embedding": None, "metadata": metadata, "excluded_embed_metadata_keys": [],
            "excluded_llm_metadata_keys": [], "relationships": {}, "text": "", "mimetype": "text/plain",
            "start_char_idx": 0, "end_char_idx": len(text), "metadata_seperator": "\n",
            "text_template": "{metadata_str}\n\n{content}", "class_name": "TextNode"}
    return json.dumps({**metadata, "_node_content": json.dumps(node), "_node_type": "TextNode",
                       "document_id": f"doc-{source}", "doc_id": f"doc-{source}", "ref_doc_id": f"doc-{source}"})


def llamaindex_tables(conn: psycopg.Connection[Any]) -> None:
    """`data_docs` as PGVectorStore makes it, and `data_hybrid` with `hybrid_search=True` and `hnsw_kwargs`."""
    conn.execute("""
        CREATE EXTENSION IF NOT EXISTS vector;
        CREATE TABLE public.data_docs (
            id BIGSERIAL NOT NULL, text VARCHAR NOT NULL, metadata_ JSON, node_id VARCHAR, embedding VECTOR(4),
            PRIMARY KEY (id));
        CREATE INDEX docs_idx_1 ON public.data_docs ((metadata_ ->> 'ref_doc_id'));
        CREATE TABLE public.data_hybrid (
            id BIGSERIAL NOT NULL, text VARCHAR NOT NULL, metadata_ JSON, node_id VARCHAR, embedding VECTOR(4),
            text_search_tsv TSVECTOR GENERATED ALWAYS AS (to_tsvector('english', text)) STORED,
            PRIMARY KEY (id));
        CREATE INDEX hybrid_idx ON public.data_hybrid USING gin (text_search_tsv);
        CREATE INDEX hybrid_idx_1 ON public.data_hybrid ((metadata_ ->> 'ref_doc_id'));
        CREATE INDEX IF NOT EXISTS public_data_hybrid_embedding_idx ON public.data_hybrid
            USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64);
    """)
    for table in ("data_docs", "data_hybrid"):
        for n, (text, source, vector) in enumerate(DOCS):
            conn.execute(f"INSERT INTO {table} (text, metadata_, node_id, embedding) VALUES (%s, %s::json, %s, "
                         "%s::vector)", (text, llamaindex_metadata(n, source, text),
                                         f"7c2e0b63-1d2f-4a2b-8e5f-2b3c4d5e6f{n:02d}", _vector(vector)))


@pytest.fixture(scope="module")
def rag_pg(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    pg = EmbeddedPostgres(tmp_path_factory.mktemp("rag-pg"))
    dsn = pg.start()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            langchain_tables(conn)
            langchain_store_table(conn)
            llamaindex_tables(conn)
        yield dsn
    finally:
        pg.stop()


# The recipes of docs/configuration.md ("Mounting LangChain / LlamaIndex stores"), as --option values.
LANGCHAIN_PG = ["table=langchain_pg_embedding", "text_column=document", "vector_column=embedding",
                "metadata_column=cmetadata", f"row_filter=collection_id={HANDBOOK}"]
LANGCHAIN_COMMUNITY_PG = ["table=legacy.langchain_pg_embedding", "id_column=custom_id", "text_column=document",
                          "vector_column=embedding", "metadata_column=cmetadata", f"row_filter=collection_id={HANDBOOK}"]
LANGCHAIN_PGVECTORSTORE = ["table=lc_store", "id_column=langchain_id", "vector_column=embedding",
                           "metadata_column=langchain_metadata"]
LLAMAINDEX_PG = ["table=data_docs", "id_column=node_id", "text_column=text", "vector_column=embedding",
                 "metadata_column=metadata_", "metadata_keys=file_name,page_label,ref_doc_id"]
LLAMAINDEX_HYBRID_PG = ["table=data_hybrid", "text_column=text", "vector_column=embedding",
                        "metadata_column=metadata_", "metadata_keys=file_name,page_label,ref_doc_id"]

# Recall by text, by vector, the timeline, and both with `where` on a metadata key.
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("memory/describe", {}),
    ("memory/recall", {"query": "refunds", "limit": 10}),
    ("memory/recall", {"embedding": [0.0, 1.0, 0.0, 0.0], "limit": 1}),
    ("memory/timeline", {}),
    ("memory/recall", {"query": "refunds", "where": {"SOURCE_KEY": "policy.SUFFIX"}, "limit": 10}),
    ("memory/timeline", {"where": {"SOURCE_KEY": "shipping.SUFFIX"}}),
]


def calls(source_key: str, suffix: str) -> list[tuple[str, dict[str, Any]]]:
    return json.loads(json.dumps(CALLS).replace("SOURCE_KEY", source_key).replace("SUFFIX", suffix))


def assert_mounted(answers: list[dict[str, Any]], *, metadata_key: str) -> None:
    """What each layout answers CALLS with: the four documents and nothing of any other collection."""
    described, text, vector, timeline, text_where, timeline_where = answers[:6]
    assert described["result"]["embeddings"]["dimensions"] == 4, described
    found = [r["content"] for r in records(text)]
    # "refunds" (and "refunded" where the engine stems); never the refunds of another collection
    assert DOCS[0][0] in found and set(found) <= {DOCS[0][0], DOCS[2][0]}, found
    assert [r["content"] for r in records(vector)] == [DOCS[1][0]]
    assert sorted(r["content"] for r in records(timeline)) == sorted(d[0] for d in DOCS)
    assert all(metadata_key in r["metadata"] for r in records(timeline)), records(timeline)
    assert DOCS[0][0] in {r["content"] for r in records(text_where)} <= {DOCS[0][0], DOCS[2][0]}
    assert {r["content"] for r in records(timeline_where)} == {DOCS[1][0], DOCS[3][0]}


# ---- PostgreSQL ---------------------------------------------------------------------------------------

def test_langchain_pgvector_mounts_one_collection_with_its_jsonb_metadata(rag_pg: str, tmp_path: Path) -> None:
    answers, done = serve(rag_pg, tmp_path, *LANGCHAIN_PG, calls=calls("source", "md"))
    assert done.returncode == 0, done.stderr
    assert_mounted(answers, metadata_key="source")
    first = next(r for r in records(answers[3]) if r["id"] == "lc-0")
    assert first["metadata"] == {"source": "policy.md", "page": 1, "tags": ["policy"]}
    assert answers[0]["result"]["tiers"][0]["count"] == len(DOCS)  # the faq collection is not counted


def test_langchain_community_pgvector_mounts_with_its_json_metadata(rag_pg: str, tmp_path: Path) -> None:
    answers, done = serve(rag_pg, tmp_path, *LANGCHAIN_COMMUNITY_PG, calls=calls("source", "md"))
    assert done.returncode == 0, done.stderr
    assert_mounted(answers, metadata_key="source")
    assert {r["id"] for r in records(answers[3])} == {f"lc-{n}" for n in range(4)}


def test_langchain_pgvectorstore_mounts_with_its_json_metadata(rag_pg: str, tmp_path: Path) -> None:
    """langchain_postgres's newer store: a table per store, so no row filter."""
    answers, done = serve(rag_pg, tmp_path, *LANGCHAIN_PGVECTORSTORE, calls=calls("source", "md"))
    assert done.returncode == 0, done.stderr
    assert_mounted(answers, metadata_key="source")
    assert "no HNSW" not in done.stderr, done.stderr


@pytest.mark.parametrize("options", [LLAMAINDEX_PG, LLAMAINDEX_HYBRID_PG], ids=["plain", "hybrid"])
def test_llamaindex_pgvectorstore_mounts_with_its_json_metadata(rag_pg: str, tmp_path: Path,
                                                                options: list[str]) -> None:
    answers, done = serve(rag_pg, tmp_path, *options, calls=calls("file_name", "txt"))
    assert done.returncode == 0, done.stderr
    assert_mounted(answers, metadata_key="file_name")
    shown = records(answers[3])[0]["metadata"]
    assert set(shown) == {"file_name", "page_label", "ref_doc_id"}, shown  # not _node_content
    if options is LLAMAINDEX_HYBRID_PG:
        assert {r["id"] for r in records(answers[3])} == {"1", "2", "3", "4"}  # the bigserial key
        assert "full-text index" not in done.stderr and "no HNSW" not in done.stderr, done.stderr


@pytest.mark.parametrize("options, says", [
    (["table=langchain_pg_embedding", "text_column=document", "metadata_column=document"],
     "metadata_column 'document' of table 'langchain_pg_embedding' is character varying; it must be a json or "
     "jsonb column"),
    (["table=langchain_pg_embedding", "text_column=document", "row_filter=collection_id"],
     "--option row_filter must be COLUMN=VALUE"),
    (["table=langchain_pg_embedding", "text_column=document", "row_filter=collection=handbook"],
     "has no column(s) ['collection']"),
    (["table=langchain_pg_embedding", "text_column=document", "row_filter=collection_id=handbook"],
     "row_filter: 'handbook' is not a value of collection_id (uuid): invalid input syntax for type uuid"),
    (["table=langchain_pg_embedding", "text_column=document", f"row_filter=collection_id={HANDBOOK[:-1]}9"],
     "row_filter: no row of table 'langchain_pg_embedding' has collection_id = "),
    (["table=data_docs", "text_column=text", "metadata_keys=file_name"], "metadata_keys needs metadata_column"),
    # Qdrant's name for it: was "did you mean 'metadata_keys'?"
    (["table=data_docs", "text_column=text", "metadata_field=metadata_"], "(did you mean 'metadata_column'?)"),
])
def test_a_layout_option_that_does_not_fit_the_table_is_refused_at_start(rag_pg: str, tmp_path: Path,
                                                                        options: list[str], says: str) -> None:
    _, done = serve(rag_pg, tmp_path, *options)
    assert done.returncode == 1 and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


# ---- Qdrant ------------------------------------------------------------------------------------------

def qdrant_collection(path: Path, payloads: list[dict[str, Any]], ids: list[str], vectors: Any,
                      sparse: dict[str, Any] | None = None) -> None:
    """Collection `kb` at `path` made as the library makes it: `vectors` is its vectors_config; each
    point gets its DOCS vector under every dense name."""
    from qdrant_client import QdrantClient, models as m

    client = QdrantClient(path=str(path))
    try:
        client.create_collection("kb", vectors_config=vectors, sparse_vectors_config=sparse)
        names = list(vectors) if isinstance(vectors, dict) else None
        client.upsert("kb", points=[m.PointStruct(id=i, payload=p, vector={n: d[2] for n in names} if names else d[2])
                                    for i, p, d in zip(ids, payloads, DOCS)])
    finally:
        client.close()


def langchain_payloads(metadata: bool = True) -> list[dict[str, Any]]:
    """`QdrantVectorStore._build_payloads`: `add_documents` gives each its metadata, `add_texts` without
    metadatas gives null."""
    return [{"page_content": text, "metadata": {"source": f"{source}.md", "page": n + 1} if metadata else None}
            for n, (text, source, _) in enumerate(DOCS)]


def llamaindex_payloads(legacy: bool = False) -> list[dict[str, Any]]:
    out = []
    for n, (text, source, _) in enumerate(DOCS):
        meta = json.loads(llamaindex_metadata(n, source, text))
        node = json.loads(meta["_node_content"])
        node["text"] = text  # the Qdrant store keeps the text in the node (remove_text=False)
        meta["_node_content"] = json.dumps(node)
        out.append({"text": text, "file_name": meta["file_name"], "doc_id": meta["doc_id"]} if legacy else meta)
    return out


LC_IDS = [f"6b1d9a52-0c1e-4f1a-9d4e-1a2b3c4d5e0{n}" for n in range(4)]
LI_IDS = [f"7c2e0b63-1d2f-4a2b-8e5f-2b3c4d5e6f{n:02d}" for n in range(4)]
LANGCHAIN_QDRANT = ["collection=kb", "text_field=page_content", "metadata_field=metadata"]
LLAMAINDEX_QDRANT = ["collection=kb", "text_field=_node_content", "text_json_key=text",
                     "metadata_fields=file_name,page_label,ref_doc_id"]


def _dense() -> Any:
    from qdrant_client import models as m

    return m.VectorParams(size=4, distance=m.Distance.COSINE)


@pytest.mark.parametrize("vector_name", ["", "dense"], ids=["default-vector", "named-vector"])
def test_langchain_qdrant_mounts(tmp_path: Path, vector_name: str) -> None:
    from qdrant_client import models as m

    qdrant_collection(tmp_path / "kb", langchain_payloads(), LC_IDS, {vector_name: _dense()},
                      sparse={"langchain-sparse": m.SparseVectorParams()})
    answers, done = serve(str(tmp_path / "kb"), tmp_path / "data", *LANGCHAIN_QDRANT, calls=[
        *calls("source", "md"), ("memory/recall", {"embedding": DOCS[1][2], "limit": 1, "embeddings": True})])
    assert done.returncode == 0, done.stderr
    assert_mounted(answers[:-1], metadata_key="source")
    assert [r["embedding"] for r in records(answers[-1])] == [DOCS[1][2]]  # the vector named "" too


def test_langchain_qdrant_written_without_metadata_mounts(tmp_path: Path) -> None:
    """`add_texts(texts)` leaves every point's `metadata` null: the recipe's metadata_field still fits."""
    qdrant_collection(tmp_path / "kb", langchain_payloads(metadata=False), LC_IDS, {"": _dense()})
    answers, done = serve(str(tmp_path / "kb"), tmp_path / "data", *LANGCHAIN_QDRANT,
                          calls=[("memory/timeline", {})])
    assert done.returncode == 0, done.stderr
    assert [r["metadata"] for r in records(answers[0])] == [{}] * 4


@pytest.mark.parametrize("hybrid", [False, True], ids=["plain", "hybrid"])
def test_llamaindex_qdrant_mounts(tmp_path: Path, hybrid: bool) -> None:
    from qdrant_client import models as m

    vectors = {"text-dense": _dense()} if hybrid else _dense()
    qdrant_collection(tmp_path / "kb", llamaindex_payloads(), LI_IDS, vectors,
                      sparse={"text-sparse": m.SparseVectorParams()} if hybrid else None)
    answers, done = serve(str(tmp_path / "kb"), tmp_path / "data", *LLAMAINDEX_QDRANT,
                          calls=calls("file_name", "txt"))
    assert done.returncode == 0, done.stderr
    assert_mounted(answers, metadata_key="file_name")


def test_legacy_llamaindex_qdrant_mounts(tmp_path: Path) -> None:
    """Before `_node_content` (llama_index 0.6), the text was the payload's `text`: the defaults read it."""
    qdrant_collection(tmp_path / "kb", llamaindex_payloads(legacy=True), LI_IDS, _dense())
    answers, done = serve(str(tmp_path / "kb"), tmp_path / "data", "collection=kb", calls=calls("file_name", "txt"))
    assert done.returncode == 0, done.stderr
    assert_mounted(answers, metadata_key="file_name")


# ---- a metadata object's keys answer `where` as the reference matcher does -----------------------------------

OBJECT_VALUES: list[Any] = ["x", "y", "5", "", 5, 5.0, 2**53 + 1, 0.1, True, False, None, ["x", 5], [], {"k": 1},
                            'q"uote', "a\\b"]
OBJECT_KEYS = ["source", "page", "tags", "odd key", "role"]  # `role`: where.role names the record field
DOCUMENTS: list[Any] = [None, "null", "[1, 2]", '"text"', "{}"]  # no object: records show no metadata


def make_object_table(dsn: str) -> None:
    """`objects`: the same random metadata in a jsonb and in a json column, two collections."""
    import random

    rng = random.Random(5150)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE objects (id serial PRIMARY KEY, coll int, body text, emb vector(3), "
                     "created timestamptz, meta jsonb, meta_js json)")
        conn.execute("CREATE INDEX objects_meta ON objects USING gin (meta jsonb_path_ops)")
        for n in range(120):
            if n % 11 == 3:
                document = rng.choice(DOCUMENTS)
            else:
                document = json.dumps({k: rng.choice(OBJECT_VALUES) for k in OBJECT_KEYS if rng.random() < 0.7})
            created = None if n % 7 == 0 else f"2026-01-{1 + n % 28:02d}T09:00:00Z"
            conn.execute("INSERT INTO objects (coll, body, emb, created, meta, meta_js) VALUES (%s, %s, %s::vector, "
                         "%s, %s::jsonb, %s::json)", (n % 3, rng.choice(["zebra one", "quartz two", None]),
                                                      _vector([rng.random(), rng.random(), rng.random()]), created,
                                                      document, document))


def object_wheres(every: list[Any]) -> list[dict[str, Any]]:
    """Each value some record shows under each key (list members too), values equal in JSON but
    spelled apart, null, and "any of" with null."""
    out: list[dict[str, Any]] = [{}]
    for key in OBJECT_KEYS + ["unknown"]:
        for value in ["x", "5", 5, 5.0, 2**53 + 1, 0.1, 1, True, False, "", 'q"uote', "a\\b", "nope"]:
            out.append({key: value})
        out += [{key: None}, {key: ["x", None]}, {key: []}, {key: [5, "y", True]}]
    return out + [{"source": "x", "page": 5}, {"content": "zebra one"}]


@pytest.mark.anyio
@pytest.mark.parametrize("column", ["meta", "meta_js"])
async def test_where_on_a_metadata_objects_keys_answers_as_the_reference_does(rag_pg: str, column: str) -> None:
    from tests.support.corpora import opened_table

    from .test_corpus_table_parity import agree

    with psycopg.connect(rag_pg, autocommit=True) as conn:
        if not conn.execute("SELECT to_regclass('objects')").fetchone()[0]:
            make_object_table(rag_pg)
    for keys in (None, ["source", "tags"]):
        async with opened_table(rag_pg, table="objects", text_column="body", vector_column="emb",
                                created_column="created", metadata_column=column, metadata_keys=keys,
                                row_filter=("coll", "1")) as store:
            every = await store.select(Scope(), with_embeddings=True)
            assert len(every) == 40 and any(r.metadata for r in every) and any(not r.metadata for r in every)
            assert keys is None or all(set(r.metadata) <= set(keys) for r in every)
            wrong: list[Any] = []
            for where in object_wheres(every):
                await agree(store, every, where, (None, None), wrong)
            assert not wrong, f"{len(wrong)} disagreements:\n" + "\n".join(map(str, wrong[:40]))
            assert await store.count(None) == 40
            assert [r.id for r in await store.get(None, ["1", "2"])] == ["2"]  # row 1 is another collection's


@pytest.mark.anyio
async def test_where_on_langchain_metadata_is_answered_by_its_gin_index(rag_pg: str,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    """`where: {source}` is `cmetadata @> '{"source": ...}'`, which LangChain's `ix_cmetadata_gin`
    (jsonb_path_ops) answers; start says the collection column has no index of its own."""
    from tests.support.corpora import opened_table

    from .test_corpus_mounting import explained, no_seq_scan

    with caplog.at_level("WARNING", logger="a2m.corpus"):
        async with opened_table(no_seq_scan(rag_pg), table="langchain_pg_embedding", text_column="document",
                                vector_column="embedding", metadata_column="cmetadata",
                                row_filter=("collection_id", HANDBOOK)) as store:
            plans = explained(store)
            found = await store.select(Scope(where={"source": "policy.md"}), limit=10)
            assert [r.id for r in found] == ["lc-0", "lc-2"]
            assert plans and all("ix_cmetadata_gin" in p for p in plans), plans
    assert "no index starts with it (e.g. CREATE INDEX ON langchain_pg_embedding (collection_id))" in caplog.text


# ---- through the router ---------------------------------------------------------------------------------------

@pytest.mark.anyio
async def test_the_framework_stores_join_a_federation_as_read_only_tiers(rag_pg: str, tmp_path: Path) -> None:
    """LangChain's pgvector collection, LlamaIndex's hybrid pgvector table and LlamaIndex's Qdrant
    collection, each `a2m serve corpus` by its recipe, mounted beside a working tier: a recall fuses
    all four, a caller vector and `where` on a metadata key reach each, a timeline names one, and the
    stores are left as they were."""
    from a2m.client import HTTPClient
    from a2m.errors import A2MError

    from .test_corpus_mounting import mounted

    qdrant_collection(tmp_path / "li", llamaindex_payloads(), LI_IDS, _dense())
    with psycopg.connect(rag_pg) as conn:
        before = conn.execute("SELECT count(*), md5(string_agg(id || document, ',' ORDER BY id)) "
                              "FROM langchain_pg_embedding").fetchone()

    def corpus(name: str, url: str, options: list[str]) -> dict[str, Any]:
        return {"name": name, "kind": "semantic", "read_only": True, "engine": "corpus", "serve": "real",
                "args": ["--url", url, *[a for o in options for a in ("--option", o)]]}

    tiers = [{"name": "working", "kind": "working", "capacity": 8},
             corpus("lc", rag_pg, LANGCHAIN_PG), corpus("li", rag_pg, LLAMAINDEX_HYBRID_PG),
             corpus("liq", str(tmp_path / "li"), LLAMAINDEX_QDRANT)]
    with mounted(tmp_path, tiers) as stack:
        from tests.conformance.test_conformance import failures, run_http

        for tier in ("lc", "li"):  # each a conformant read-only A2M server on its own
            results = await run_http(stack.tiers[tier].url)
            assert not failures(results), "\n".join(failures(results))
            assert any(r.group == "read-only" and r.outcome == "pass" for r in results)
        async with HTTPClient(stack.url) as router:
            layout = {t["name"]: t for t in (await router.call("memory/describe", {}))["tiers"]}
            assert {n: layout[n]["count"] for n in ("lc", "li", "liq")} == {"lc": 4, "li": 4, "liq": 4}
            said = (await router.call("memory/remember", {"owner": "ann", "records": [
                {"content": "the customer asked how refunds work", "session": "s1"}]}))["ids"]
            hits = (await router.call("memory/recall", {"owner": "ann", "query": "refunds", "limit": 20}))["records"]
            assert {h["tier"] for h in hits} == {"working", "lc", "li", "liq"} and said[0] in {h["id"] for h in hits}
            assert not {h["content"] for h in hits} & {text for text, _ in OTHER}  # not the faq collection
            for tier in ("lc", "li", "liq"):
                near = (await router.call("memory/recall", {"owner": "ann", "tier": tier, "limit": 1,
                                                            "embedding": [0.0, 1.0, 0.0, 0.0]}))["records"]
                assert [h["content"] for h in near] == [DOCS[1][0]], (tier, near)
            lc = (await router.call("memory/timeline", {"owner": "ann", "tier": "lc",
                                                        "where": {"source": "policy.md"}}))["records"]
            assert [r["metadata"]["page"] for r in lc] == [1, 3]
            li = (await router.call("memory/recall", {"owner": "ann", "query": "shipping weekday",
                                                      "where": {"file_name": "shipping.txt"}}))["records"]
            assert {(h["tier"], h["content"]) for h in li} >= {("li", DOCS[1][0]), ("liq", DOCS[3][0])}
            assert {h["metadata"]["file_name"] for h in li} == {"shipping.txt"}
            with pytest.raises(A2MError) as err:
                await router.call("memory/remember", {"owner": "ann", "records": [{"content": "x", "tier": "lc"}]})
            assert err.value.code == -32004
    with psycopg.connect(rag_pg) as conn:
        assert conn.execute("SELECT count(*), md5(string_agg(id || document, ',' ORDER BY id)) "
                            "FROM langchain_pg_embedding").fetchone() == before


@pytest.mark.anyio
async def test_where_on_a_key_no_record_shows_reads_no_row(rag_pg: str) -> None:
    """LlamaIndex's `_node_type` is left out by metadata_keys: `where` on it matches nothing, answered
    without reading the table (it was read to the end, a page four times longer each time)."""
    from tests.support.corpora import opened_table

    from .test_corpus_mounting import explained

    async with opened_table(rag_pg, table="data_docs", text_column="text", metadata_column="metadata_",
                            metadata_keys=["file_name"]) as store:
        plans = explained(store)
        assert await store.select(Scope(where={"_node_type": "TextNode"}), limit=1) == []
        assert plans and all("One-Time Filter: false" in p for p in plans), plans
        assert len(await store.select(Scope(where={"_node_type": None}))) == len(DOCS)
