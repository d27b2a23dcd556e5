"""Build a tier server from its engine package and run it over HTTP or stdio.

`a2m serve <tier>` lands here. Each engine package exposes `KIND`,
`CAPABILITIES`, `make_store(settings)` and optionally `extensions(store)` and
`EXTENSION_DOCS`; this module is the only place that turns a name into one.

`build` checks the engine's URL and options first (`check`): an unknown or
misspelt option, a value of the wrong type or out of range, or one that the
chosen engine would never read is a `SettingsError` naming it, before anything
starts; a silently dropped `--option reveiw=true` would be a tier without its
review gate.
"""

from __future__ import annotations

import difflib
import importlib
import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from a2m.capabilities import TIER_KINDS
from a2m.dispatch import Dispatcher
from a2m.embedder import Embedder
from a2m.events import EventLog
from a2m.http import HTTPApp, HTTPSettings

from .settings import SettingsError, TierSettings
from .surface import TierServer

ENGINES = {"working": "backends.working", "episodic": "backends.episodic",
           "semantic": "backends.semantic", "procedural": "backends.procedural", "corpus": "backends.corpus"}

# ---- engine options -----------------------------------------------------------------------------------
# `--option KEY=VALUE` arrives as the text written (a2mctl.cli), Python callers may pass typed values;
# each check takes (key, value) and gives the value the engine reads, typed, or raises. Text is kept as
# written: `collection=007` is "007", not 7.

Check = Callable[[str, Any], Any]
FLAGS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def _text(key: str, value: Any) -> Any:
    if isinstance(value, bool):
        raise SettingsError(f"--option {key} takes text, got {value!r}")
    if isinstance(value, (int, float)):  # a Python caller's number
        return str(value)
    if isinstance(value, str) or isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise SettingsError(f"--option {key} takes text, got {value!r}")


def _number(value: Any, kind: type) -> Any:
    """`value` as `kind` if it is one, or text that reads as one; else the value unchanged (refused by the caller)."""
    if isinstance(value, str):
        try:
            return kind(value.strip())
        except ValueError:
            return value
    return value


def typed(value: str) -> Any:
    """The old reading of option text, for an engine module named by its path (its options are its own
    business): booleans, then integers, then floats, else the text."""
    if value.strip().lower() in ("true", "yes", "on", "false", "no", "off"):
        return FLAGS[value.strip().lower()]
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _choice(*allowed: str) -> Check:
    def check(key: str, value: Any) -> Any:
        if value not in allowed:
            raise SettingsError(f"--option {key} must be one of {', '.join(allowed)}, got {value!r}")
        return value
    return check


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in FLAGS:
        return FLAGS[value.strip().lower()]
    if value in (0, 1) and not isinstance(value, float):
        return bool(value)
    raise SettingsError(f"--option {key} must be true or false (yes/no, on/off), got {value!r}")


def _int(low: int, high: int | None = None) -> Check:
    def check(key: str, value: Any) -> int:
        value = _number(value, int)
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            span = f"{low}..{high}" if high is not None else f"at least {low}"
            raise SettingsError(f"--option {key} must be a whole number, {span}; got {value!r}")
        return value
    return check


def _seconds(zero: bool = False) -> Check:
    def check(key: str, value: Any) -> float:
        value = _number(value, float)
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or value < 0 or (value == 0 and not zero)):
            raise SettingsError(f"--option {key} must be a number of seconds, {'at least 0' if zero else 'above 0'}"
                                f"; got {value!r}")
        return value
    return check


def _program(key: str, value: Any) -> str:
    path = Path(str(_text(key, value))).expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise SettingsError(f"--option {key}: {path} is not an executable file")
    return str(path)


KIND_OPTION: dict[str, Check] = {"kind": _choice(*TIER_KINDS)}  # the kind declared in describe
TABLE_OPTIONS = {key: _text for key in ("table", "id_column", "text_column", "vector_column", "created_column",
                                        "metadata_columns", "metadata_column", "metadata_keys", "row_filter")}
COLLECTION_OPTIONS = {key: _text for key in ("collection", "text_field", "vector_name", "created_field",
                                             "metadata_fields", "metadata_field", "text_json_key", "api_key")}
OPTIONS: dict[str, dict[str, Check]] = {
    "working": {"prefix": _text, "appendfsync": _choice("everysec", "always", "no"), "redis_server": _program,
                "timeout": _seconds(), "connect_timeout": _seconds()},
    "episodic": {"vector_search": _choice("hnsw", "exact"), "ef_search": _int(1, 1000),
                 "iterative_scan": _choice("off", "relaxed_order", "strict_order"), "pool_min": _int(0),
                 "pool_max": _int(1), "pool_timeout": _seconds(), "connect_timeout": _int(1),
                 "statement_timeout": _seconds(zero=True),
                 "hnsw_m": _int(2, 100), "hnsw_ef_construction": _int(4, 1000), "index_quiet_s": _seconds(zero=True)},
    "semantic": {"engine": _choice("edge", "local"), "collection": _text, "api_key": _text},
    "procedural": {"author": _text, "review": _flag, "approvers": _text, "remote": _text, "case_insensitive": _flag},
    "corpus": {**TABLE_OPTIONS, **COLLECTION_OPTIONS},
}
# The corpus adapters' names for one thing: a table's option given to a collection, or back, is pointed here.
COUNTERPARTS = {"text_field": "text_column", "created_field": "created_column", "metadata_fields": "metadata_columns",
                "vector_name": "vector_column", "collection": "table", "metadata_field": "metadata_column"}
COUNTERPARTS.update({v: k for k, v in list(COUNTERPARTS.items())})
# Options only an engine the URL (or its absence) does not pick would read: refused rather than dropped.
EMBEDDED_ONLY = {"working": ("appendfsync", "redis_server")}


def _unknown(engine: str, key: str, known: Mapping[str, Check], why: str = "") -> SettingsError:
    guess = [COUNTERPARTS[key]] if COUNTERPARTS.get(key) in known else difflib.get_close_matches(key, sorted(known), n=1)
    hint = f" (did you mean {guess[0]!r}?)" if guess else ""
    return SettingsError(f"--option {key} is not an option of a2m serve {engine}{why}{hint}; its options: "
                         f"{', '.join(sorted(known))}")


def _check_url(engine: str, url: str) -> None:
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    if engine == "working" and scheme not in ("redis", "rediss", "unix"):
        raise SettingsError(f"--url (A2M_WORKING_URL) must be a Redis URL: redis://host:6379/0, rediss://… or "
                            f"unix:///path/redis.sock; got {url!r}")
    if engine == "episodic" and (scheme not in ("postgresql", "postgres") if scheme else "=" not in url):
        raise SettingsError(f"--url (A2M_EPISODIC_URL) must be a PostgreSQL connection string: "
                            f"postgresql://user@host:5432/db or 'host=… dbname=…'; got {url!r}")
    if engine == "semantic":
        try:
            host = urlsplit(url).hostname
            urlsplit(url).port  # noqa: B018 -- a port out of range or not a number raises ValueError
        except ValueError:
            host = None
        if scheme not in ("http", "https") or not host:
            raise SettingsError(f"--url (A2M_SEMANTIC_URL) must be a Qdrant server's http(s) URL: "
                                f"http://qdrant:6333; got {url!r}")
    if engine == "procedural":
        if scheme or url.startswith("git@"):
            raise SettingsError(f"--url (A2M_PROCEDURAL_URL) is the repository's path on this machine; a "
                                f"remote to push to is --option remote={url}")
        path = Path(url).expanduser()
        if path.exists() and not path.is_dir():
            raise SettingsError(f"--url (A2M_PROCEDURAL_URL): {path} is a file, not a repository directory")


def check(engine: str, settings: TierSettings) -> TierSettings:
    """The settings `engine` is built with, options typed as it reads them; SettingsError if it cannot be."""
    if engine not in OPTIONS:  # an engine module named by its path: its options are its own business
        return replace(settings, options={k: typed(v) if isinstance(v, str) else v for k, v in settings.options.items()})
    try:
        return _checked(engine, settings)
    except SettingsError as exc:
        raise SettingsError(f"a2m serve {engine}: {exc}") from None


def _checked(engine: str, settings: TierSettings) -> TierSettings:
    if settings.url is not None:
        _check_url(engine, settings.url)
    known, why = {**KIND_OPTION, **OPTIONS[engine]}, ""
    if engine == "corpus":  # the URL picks the adapter: the other one's options would be dropped
        table = (settings.url or "").startswith(("postgresql://", "postgres://"))
        known = {**KIND_OPTION, **(TABLE_OPTIONS if table else COLLECTION_OPTIONS)}
        why = " mounting a table (a postgresql:// --url)" if table else " mounting a Qdrant collection"
    options: dict[str, Any] = {}
    for key, value in settings.options.items():
        if key not in known:
            raise _unknown(engine, key, known, why)
        if settings.url is not None and key in EMBEDDED_ONLY.get(engine, ()):
            raise SettingsError(f"--option {key} sets up the embedded engine, and --url names one of your own: "
                                f"set it there, or leave the option out")
        options[key] = known[key](key, value)
    if engine == "semantic":
        mode = options.get("engine", "edge")
        if settings.url is not None and "engine" in options:
            raise SettingsError("--option engine picks an embedded Qdrant, and --url names a Qdrant server: "
                                "leave one out")
        for key in ("collection", "api_key"):
            if key in options and settings.url is None and (key == "api_key" or mode == "edge"):
                raise SettingsError(f"--option {key} is read only with "
                                    f"{'--url (a Qdrant server)' if key == 'api_key' else '--url or engine=local'}: "
                                    f"the embedded Edge shard has none")
    if engine == "procedural" and "approvers" in options:
        from backends.procedural.history import approver_names  # read as the tier will read it

        if not approver_names(options["approvers"]):
            raise SettingsError("--option approvers names nobody, so no one could approve: name the owners who may "
                                "(approvers=lead,ops), or leave it out for anyone")
    if engine == "episodic":
        from backends.episodic.embedded import shell_changes  # the embedded server's own rule for its paths

        if settings.url is None and (odd := shell_changes(settings.data_dir.resolve())):
            raise SettingsError(f"the embedded PostgreSQL cannot run under {settings.data_dir}: pg_ctl passes the "
                                f"path through a shell, where {' '.join(odd)} change it; choose another --data "
                                f"(or A2M_DATA), or name a PostgreSQL of your own with --url")
        low, high = options.get("pool_min", 1), options.get("pool_max", 10)
        if low > high:
            raise SettingsError(f"--option pool_min ({low}) is above pool_max ({high})")
        m, ef = options.get("hnsw_m", 16), options.get("hnsw_ef_construction", 64)
        if ef < 2 * m:
            raise SettingsError(f"--option hnsw_ef_construction ({ef}) must be at least twice hnsw_m ({m}), as "
                                f"pgvector requires")
    return replace(settings, options=options)


# A tier server's event log holds eight full windows (~4 MB), not the router's ~60 MB (decision 124):
# behind a router nobody polls it (callers read the router's log), yet every owner's writes land in it.
TIER_EVENTS_BOUND = 8 * 1024


def build(engine: str, settings: TierSettings, *, embedder: Embedder | None = None,
          limits: Mapping[str, int] | None = None) -> TierServer:
    settings = check(engine, settings)
    module = importlib.import_module(ENGINES.get(engine, engine))
    store = module.make_store(settings)
    events = EventLog(bound=TIER_EVENTS_BOUND)  # the server's log, which its extensions' writes are told on too
    extensions = module.extensions(store, events) if hasattr(module, "extensions") else None
    return TierServer(
        store, name=settings.name, kind=settings.options.get("kind", module.KIND),
        capabilities=frozenset(module.CAPABILITIES), limits=limits, embedder=embedder, extensions=extensions,
        extension_docs=getattr(module, "EXTENSION_DOCS", None), events=events,
        read_only=getattr(module, "READ_ONLY", False),
    )


def http_app(server: Any, settings: HTTPSettings | None = None) -> HTTPApp:
    """An ASGI app for any service with startup()/shutdown() (a tier server or the router)."""
    return HTTPApp(Dispatcher(server), settings, lifespan=server)
