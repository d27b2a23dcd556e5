"""Someone else's RAG, made for the corpus tests: a pgvector table and a Qdrant collection holding
the same four documents, each created the way its owner would, and read back behind the corpus
server's back to prove it never wrote."""

from __future__ import annotations

from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import psycopg

DOCS = [
    ("Refunds are issued within 14 days of a return.", "policy", [1.0, 0.0, 0.0, 0.0]),
    ("Shipping to Italy takes 3 to 5 business days.", "shipping", [0.0, 1.0, 0.0, 0.0]),
    ("Gift cards never expire and cannot be refunded.", "policy", [0.0, 0.0, 1.0, 0.0]),
    ("Our warehouse in Bologna ships every weekday.", "shipping", [0.0, 0.7, 0.0, 0.7]),
]
TABLE_ARGS = ["--option", "table=kb", "--option", "id_column=doc_id", "--option", "text_column=body",
              "--option", "vector_column=emb", "--option", "created_column=written",
              "--option", "metadata_columns=source"]

UUID_ID = "5f1c2c9e-3d7a-4c59-9a53-1b7e2f0c4a11"
POINTS: list[tuple[int | str, dict[str, Any], list[float]]] = [  # integer and UUID ids, a list, numbers, two time forms
    (1, {"body": DOCS[0][0], "source": "policy", "tags": ["money", "returns"], "stars": 4,
         "written": "2026-01-02T09:00:00Z"}, DOCS[0][2]),
    (UUID_ID, {"body": DOCS[1][0], "source": "shipping", "tags": ["eu"], "stars": 5.0,
               "written": "2026-02-02T09:00:00Z"}, DOCS[1][2]),
    (3, {"body": DOCS[2][0], "source": "policy", "tags": [], "written": "2026-01-09T10:00:00+01:00"}, DOCS[2][2]),
    (4, {"body": DOCS[3][0], "source": "shipping", "stars": None, "written": "2026-03-02T09:00:00Z"}, DOCS[3][2]),
]
COLLECTION_ARGS = ["--option", "collection=kb", "--option", "text_field=body", "--option", "created_field=written"]


def make_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute("CREATE TABLE kb (doc_id serial PRIMARY KEY, body text, source text, emb vector(4),"
                     " written timestamptz DEFAULT now())")
        for body, source, emb in DOCS:
            conn.execute("INSERT INTO kb (body, source, emb) VALUES (%s, %s, %s::vector)", (body, source, str(emb)))


@asynccontextmanager
async def opened_table(dsn: str, **spec: Any) -> AsyncIterator[Any]:
    """A table corpus store (`TableSpec(**spec)`) opened on `dsn`, closed after."""
    from backends.corpus.pgtable import TableSpec, TableStore

    store = TableStore(dsn, TableSpec(**spec))
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def table_rows(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT doc_id, body, source, emb::text, written FROM kb ORDER BY doc_id").fetchall()


def make_collection(path: Path, *, named: dict[str, int] | None = None) -> None:
    """Collection `kb` in qdrant-client's local mode at `path`: one unnamed dot-product vector, or
    the named cosine vectors `named` gives (name -> width, each a prefix of the document's)."""
    from qdrant_client import QdrantClient, models as m

    client = QdrantClient(path=str(path))
    try:
        if named:
            config: Any = {n: m.VectorParams(size=d, distance=m.Distance.COSINE) for n, d in named.items()}
            points = [m.PointStruct(id=i, payload=p, vector={n: v[:d] for n, d in named.items()}) for i, p, v in POINTS]
        else:
            config = m.VectorParams(size=4, distance=m.Distance.DOT)
            points = [m.PointStruct(id=i, payload=p, vector=v) for i, p, v in POINTS]
        client.create_collection("kb", vectors_config=config)
        client.upsert("kb", points=points)
    finally:
        client.close()


def tree_digest(path: Path) -> dict[str, bytes]:
    """Every file under a local-mode directory, byte for byte (its lock file aside): any write shows."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and not p.name.startswith(".lock")}


# ---- payloads as people's collections hold them, for the store-level Qdrant tests ----

ODD_UUID = "0b6f3c1e-8d2a-4e57-b9c4-7a1d2e3f4a5b"
# Times in the text forms Qdrant reads (one collection holds one form: Qdrant orders text and Unix seconds
# apart), values of every JSON kind, keys Qdrant must quote.
ODD_POINTS: dict[int | str, dict[str, Any]] = {
    1: {"text": "Refunds are issued within 14 days.", "at": "2026-01-02T09:00:00Z", "src": "a", "n": 5,
        "tags": ["x", "y"], "flag": True},
    2: {"text": "Shipping takes days.", "at": "2026-01-03T09:00:00", "src": "b", "n": 5.0, "tags": [],
        "flag": False},  # a naive stamp (Python's isoformat()): UTC to Qdrant
    3: {"text": "Gift cards never expire.", "src": "a", "n": None, "flag": 1},  # no time at all
    4: {"text": 42, "at": "yesterday", "src": ["a", "b"], "n": 2**53 + 1, "a.b": 1},
    5: {"at": "2026-01-09 09:00:00", "n": 1, "a": {"b": 1}, "": "empty", "sp ace": "v", 'q"uote': "v"},
    ODD_UUID: {"text": "", "at": "2026-02-01", "src": None, "n": [5, 6], "deep": {"x": [1, {"y": 2}]},
               "big": 10**30},  # a date alone; an integer no JSON encoder writes
    7: {"text": "the and of", "at": "1960-01-01T00:00:00Z", "src": "c", "n": True},
}


def make_points(path: Path, points: dict[int | str, dict[str, Any]], *, vectors: Any = 2) -> None:
    """Collection `kb` at `path` holding `points` as given. `vectors`: the width of one unnamed cosine
    vector (each point gets [1, i]), or a vectors config used as is with no vectors on the points."""
    from qdrant_client import QdrantClient, models as m

    client = QdrantClient(path=str(path))
    try:
        dense = isinstance(vectors, int)
        client.create_collection("kb", vectors_config=m.VectorParams(size=vectors, distance=m.Distance.COSINE)
                                 if dense else vectors)
        if points:
            client.upsert("kb", points=[m.PointStruct(id=i, payload=p, vector=[1.0, float(n)] if dense else {})
                                        for n, (i, p) in enumerate(points.items())])
    finally:
        client.close()


def langchain_points() -> dict[int | str, dict[str, Any]]:
    """What LangChain's QdrantVectorStore writes: the text under `page_content`, the document's
    metadata as one object under `metadata` (built by hand: no LangChain dependency)."""
    return {
        "6b1d9a52-0c1e-4f1a-9d4e-1a2b3c4d5e01": {"page_content": DOCS[0][0], "metadata": {
            "source": "policy.md", "page": 1, "written": "2026-01-02T09:00:00Z", "tags": ["money"]}},
        "6b1d9a52-0c1e-4f1a-9d4e-1a2b3c4d5e02": {"page_content": DOCS[1][0], "metadata": {
            "source": "shipping.md", "page": 1, "written": "2026-02-02T09:00:00Z", "a.b": "dotted"}},
        "6b1d9a52-0c1e-4f1a-9d4e-1a2b3c4d5e03": {"page_content": DOCS[2][0], "metadata": {
            "source": "policy.md", "page": 2, "written": "2026-01-09T09:00:00Z"}},
        "6b1d9a52-0c1e-4f1a-9d4e-1a2b3c4d5e04": {"page_content": DOCS[3][0], "metadata": None},
    }


def llamaindex_points() -> dict[int | str, dict[str, Any]]:
    """What LlamaIndex's QdrantVectorStore writes (`node_to_metadata_dict`): the node's metadata flat
    in the payload, the whole node JSON-encoded under `_node_content` (its text among it), and the
    source document's id three times over (built by hand: no LlamaIndex dependency)."""
    import json

    out: dict[int | str, dict[str, Any]] = {}
    for n, (text, source, _) in enumerate(DOCS):
        node_id = f"7c2e0b63-1d2f-4a2b-8e5f-2b3c4d5e6f{n:02d}"
        metadata = {"file_name": f"{source}.txt", "page_label": str(n + 1)}
        node = {"id_": node_id, "embedding": None, "metadata": metadata, "excluded_embed_metadata_keys": [],
                "excluded_llm_metadata_keys": [], "relationships": {}, "text": text, "mimetype": "text/plain",
                "start_char_idx": 0, "end_char_idx": len(text), "metadata_seperator": "\n",
                "text_template": "{metadata_str}\n\n{content}", "class_name": "TextNode"}
        out[node_id] = {**metadata, "_node_content": json.dumps(node), "_node_type": "TextNode",
                        "document_id": f"doc-{source}", "doc_id": f"doc-{source}", "ref_doc_id": f"doc-{source}"}
    return out


@contextmanager
def postgres_holding(path: Path, statements: str) -> Iterator[str]:
    """An embedded PostgreSQL in `path` that has run `statements` (someone's tables to mount): its DSN."""
    from backends.episodic.embedded import EmbeddedPostgres

    engine = EmbeddedPostgres(path)
    dsn = engine.start()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(statements)
        yield dsn
    finally:
        engine.stop()
