"""Someone else's RAG, made for the corpus tests: a pgvector table and a Qdrant collection holding
the same four documents, each created the way its owner would, and read back behind the corpus
server's back to prove it never wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
