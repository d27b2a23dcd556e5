"""A read-only A2M tier over an existing PostgreSQL/pgvector table: mount a RAG without copying it.

    a2m serve corpus --url postgresql://... --option table=docs --option text_column=body \
        --option vector_column=embedding --option metadata_columns=source,lang

Writes answer -32004 (read only). Options: `table` (required), `id_column`
(id), `text_column` (content), `vector_column`, `created_column`,
`metadata_columns` (comma separated; also the keys `where` can filter on),
`kind` (the tier kind the router sees; default semantic).
"""

from __future__ import annotations

from backends.settings import TierSettings
from backends.store import Store

KIND = "semantic"
READ_ONLY = True
CAPABILITIES = frozenset({"core", "tiers", "embeddings", "external", "prompt"})


def make_store(settings: TierSettings) -> Store:
    from .pgtable import TableStore, TableSpec

    if not settings.url:
        raise SystemExit("a2m serve corpus needs --url postgresql://... of the database that holds the table")
    return TableStore(settings.url, TableSpec.from_options(settings.options))
