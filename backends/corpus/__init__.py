"""A read-only A2M tier over an existing PostgreSQL/pgvector table or Qdrant collection: mount a
RAG without copying it.

    a2m serve corpus --url postgresql://... --option table=docs --option text_column=body \
        --option vector_column=embedding --option metadata_columns=source,lang
    a2m serve corpus --url http://qdrant:6333 --option collection=docs --option text_field=page_content
    a2m serve corpus --url postgresql://... --option table=langchain_pg_embedding --option text_column=document \
        --option vector_column=embedding --option metadata_column=cmetadata --option row_filter=collection_id=UUID

Writes answer -32004 (read only). The `--url` picks the adapter: `postgresql://`
a table (pgtable.py), `http(s)://` a Qdrant server, and a directory a
collection in qdrant-client's local mode (qdrant.py). Options: see
docs/configuration.md, which has a recipe for each LangChain and LlamaIndex
store; `kind` is the tier kind the router sees (default semantic).
"""

from __future__ import annotations

from pathlib import Path

from backends.settings import TierSettings
from backends.store import Store

KIND = "semantic"
READ_ONLY = True
CAPABILITIES = frozenset({"core", "tiers", "embeddings", "external", "prompt"})


def make_store(settings: TierSettings) -> Store:
    url = settings.url or ""
    if url.startswith(("postgresql://", "postgres://")):
        from .pgtable import TableSpec, TableStore

        return TableStore(url, TableSpec.from_options(settings.options))
    if url.startswith(("http://", "https://")) or (url and Path(url).is_dir()):
        from .qdrant import CollectionSpec, CollectionStore

        spec = CollectionSpec.from_options(settings.options)
        return CollectionStore(spec, url=url) if url.startswith("http") else CollectionStore(spec, path=url)
    if url and "://" not in url and "=" not in url:  # a local collection's folder, meant
        found = "a file, not a directory" if Path(url).exists() else "no such directory"
        raise SystemExit(f"a2m serve corpus: --url {url!r}: {found} (a qdrant-client local collection is "
                         "mounted by its folder, the path given as QdrantClient(path=...))")
    raise SystemExit("a2m serve corpus needs --url: postgresql://... (a table), http://host:6333 (a Qdrant "
                     f"collection) or the directory of a qdrant-client local collection; got {url or 'none'!r}")
