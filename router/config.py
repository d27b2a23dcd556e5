"""The router's configuration: TOML in, a validated `RouterConfig` out.

Validation happens once, at start, and refuses a layout the policy could not
honour (a spill into a tier that does not exist, a cycle, a spill into
procedural or into a read-only tier) with a message that names the tier and the
fix, because a wrong spill chain otherwise shows up weeks later as lost or
ping-ponging records.

Without a file (or without `[[tiers]]`) the four-tier stack of the design is
used: working (capacity 32 per session) -> episodic -> semantic, promotion
episodic -> semantic after 3 recalls, procedural on its own, on
http://127.0.0.1:8701..8704.
"""

from __future__ import annotations

import difflib
import math
import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping
from urllib.parse import urlsplit

from a2m.capabilities import TIER_KINDS
from a2m.embedder import LOCAL_MISSING, clean_api_key, local_available, timeout_setting
from a2m.http import origin_problem, token_problem
from a2m.http1 import MAX_RESPONSE
from a2m.params import DEFAULT_LIMITS

from .rate import MIN_PER_SECOND, RateLimit

INTENTS = "a2m:intents"  # the reserved owner of batches' intents (router/intents.py); no caller may be it
FUSIONS = ("rrf", "rerank")
RETENTIONS = ("keep", "drop")


class ConfigError(ValueError):
    """A configuration the router refuses to start with; the message says what to change."""


@dataclass(frozen=True)
class TierConfig:
    name: str
    url: str
    kind: str | None = None
    capacity: int | None = None
    per_session: bool = False
    spill_to: str | None = None
    promote_to: str | None = None
    promote_after: int = 3
    read_only: bool = False
    timeout: float = 5.0
    retention: str = "keep"  # "drop": over capacity with no spill_to, the weakest records are deleted
    max_response: int = MAX_RESPONSE  # bytes of one reply body; past it the call fails as the tier's

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "capacity": self.capacity,
                               "per_session": self.per_session, "spill_to": self.spill_to,
                               "promote_to": self.promote_to, "read_only": self.read_only}
        if self.promote_to:
            out["promote_after"] = self.promote_after
        return out


@dataclass(frozen=True)
class FusionConfig:
    strategy: str = "rrf"
    rrf_k: int = 60
    pool: int = 30  # rerank: candidates asked of each tier (at least the caller's limit; decision 35)
    half_life_days: float = 30.0  # rerank: recency decay
    weights: Mapping[str, float] = field(default_factory=lambda: {
        "text": 0.25, "vector": 0.2, "rank": 0.45, "recency": 0.06, "salience": 0.04})


@dataclass(frozen=True)
class RouterConfig:
    name: str = "a2m-router"
    tiers: tuple[TierConfig, ...] = ()
    default_tier: str = "working"
    fusion: FusionConfig = field(default_factory=FusionConfig)
    embedder: str | None = None
    embedder_model: str | None = None
    tokens: Mapping[str, str] = field(default_factory=dict)  # bearer token -> principal (owner)
    service_token: str | None = None  # how the router authenticates to its tiers
    cursor_secret: str | None = None  # seals timeline cursors; None: a key drawn from the tokens (router/cursors.py)
    allowed_origins: frozenset[str] = frozenset()
    limits: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_LIMITS))
    events_capacity: int = 1024
    background_promotion: bool = True
    rate_limit: RateLimit | None = None  # each caller's calls a second (router/rate.py); None: no limit
    lock_url: str | None = None  # a Redis holding the owner locks every replica sees (router/locks.py)
    intent_grace: float = 60.0  # seconds before a batch's intent is resolved (router/intents.py)

    def tier(self, name: str) -> TierConfig:
        for tier in self.tiers:
            if tier.name == name:
                return tier
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tiers]


def default_tiers(base_port: int = 8701, host: str = "127.0.0.1") -> tuple[TierConfig, ...]:
    url = lambda n: f"http://{host}:{base_port + n}/"  # noqa: E731
    return (
        TierConfig("working", url(0), kind="working", capacity=32, per_session=True, spill_to="episodic",
                   timeout=2.0),
        TierConfig("episodic", url(1), kind="episodic", spill_to="semantic", promote_to="semantic",
                   promote_after=3),
        TierConfig("semantic", url(2), kind="semantic"),
        TierConfig("procedural", url(3), kind="procedural"),
    )


def _type(value: Any, kind: type | tuple[type, ...], where: str, what: str) -> Any:
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ConfigError(f"{where} must be {what}, got {value!r}")
    if not isinstance(value, kind):
        raise ConfigError(f"{where} must be {what}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):  # TOML has nan and inf
        raise ConfigError(f"{where} must be {what} (a finite one), got {value!r}")
    return value


def _one_of(value: Any, choices: Iterable[str], where: str) -> None:
    """Refuse a value outside `choices`, with the one it is closest to: `kind = "workng"` said only
    which were allowed, not that it was one letter off."""
    choices = list(choices)
    if value in choices:
        return
    guess = difflib.get_close_matches(value, choices, n=1, cutoff=0.6) if isinstance(value, str) else []
    raise ConfigError(f"{where} must be one of {choices}, got {value!r}"
                      + (f" (did you mean {guess[0]!r}?)" if guess else ""))


def _http_url(value: Any) -> bool:
    """An http(s) URL a client can open: a host, a port in range if any, no spaces."""
    if not isinstance(value, str) or not value.startswith(("http://", "https://")) or any(c.isspace() for c in value):
        return False
    try:
        parts = urlsplit(value)
        port = parts.port  # raises ValueError on a port out of range or not a number
    except ValueError:
        return False
    return bool(parts.hostname) and port != 0


def _server(url: str) -> tuple[str, str, int, str]:
    """What tells two tier URLs apart: a trailing `/` or a default port written out is the same server."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, (parts.hostname or "").lower(), port, parts.path.rstrip("/") + "?" + parts.query


def _tier(raw: Any, index: int, default_timeout: float) -> TierConfig:
    where = f"tiers[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a table ([[tiers]])")
    name = raw.get("name")
    _known(raw, TIER_KEYS, where + (f" (tier {name!r})" if isinstance(name, str) and name else ""))
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}.name is required (a non-empty string)")
    where = f"tier {name!r}"
    kind = raw.get("kind")
    if kind is not None:
        _one_of(kind, TIER_KINDS, f"{where}: kind")
    url = raw.get("url")
    if not _http_url(url):
        raise ConfigError(f"{where}: url is required and must be an http(s) URL with a host (and a port in "
                          f"1-65535 if it names one), got {url!r}")
    capacity = raw.get("capacity")
    if capacity is not None:
        _type(capacity, int, f"{where}: capacity", "a positive integer")
        if capacity < 1:
            raise ConfigError(f"{where}: capacity must be a positive integer, got {capacity}")
    per_session = _type(raw.get("per_session", kind == "working"), bool, f"{where}: per_session", "true or false")
    if raw.get("per_session") is True and capacity is None and raw.get("spill_to") is None:
        raise ConfigError(f"{where}: per_session = true counts capacity per session and spills a closed session "
                          f"into spill_to, and this tier has neither: set one, or leave per_session out")
    promote_after = _type(raw.get("promote_after", 3), int, f"{where}: promote_after", "a positive integer")
    if promote_after < 1:
        raise ConfigError(f"{where}: promote_after must be a positive integer, got {promote_after}")
    if "promote_after" in raw and raw.get("promote_to") is None:
        raise ConfigError(f"{where}: promote_after = {promote_after} counts recalls towards a promotion into "
                          f"promote_to, and this tier has none: set promote_to, or leave promote_after out "
                          f"(a router.toml copied from `a2m up` before it stopped writing it on every tier "
                          f"carries it where it does nothing)")
    timeout = _positive(raw.get("timeout", default_timeout), f"{where}: timeout", (int, float))
    max_response = _positive(raw.get("max_response", MAX_RESPONSE), f"{where}: max_response")
    retention = raw.get("retention", "keep")
    _one_of(retention, RETENTIONS, f"{where}: retention")
    if retention == "drop" and capacity is None:
        raise ConfigError(f"{where}: retention = \"drop\" deletes what is over capacity, and this tier has no "
                          f"capacity: set one, or leave retention out")
    if retention == "drop" and raw.get("spill_to") is not None:
        raise ConfigError(f"{where}: retention = \"drop\" and spill_to are both set; what is over capacity "
                          f"spills and is never dropped: keep one")
    for link in ("spill_to", "promote_to"):
        if raw.get(link) is not None and not isinstance(raw[link], str):
            raise ConfigError(f"{where}: {link} must be a tier name")
    return TierConfig(
        name=name, url=url, kind=kind, capacity=capacity, per_session=per_session,
        spill_to=raw.get("spill_to"), promote_to=raw.get("promote_to"), promote_after=promote_after,
        read_only=_type(raw.get("read_only", False), bool, f"{where}: read_only", "true or false"),
        timeout=float(timeout), retention=retention, max_response=max_response,
    )


def validate(tiers: tuple[TierConfig, ...]) -> None:
    """Refuse layouts the policy cannot honour. Raises ConfigError naming the tier."""
    if not tiers:
        raise ConfigError("at least one tier is required")
    names = [t.name for t in tiers]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"tier names must be unique; repeated: {duplicates}")
    servers: dict[tuple[str, str, int, str], str] = {}
    for tier in tiers:
        # One server as two tiers loses records: a move's write finds the id there, its read-back finds
        # it, and its delete from the source deletes the only copy.
        other = servers.setdefault(_server(tier.url), tier.name)
        if other != tier.name:
            raise ConfigError(f"tiers {other!r} and {tier.name!r} have one url ({tier.url}): each tier is a "
                              f"server of its own; give {tier.name!r} its own server's URL")
    by_name = {t.name: t for t in tiers}
    for tier in tiers:
        for link in ("spill_to", "promote_to"):
            target_name = getattr(tier, link)
            if target_name is None:
                continue
            verb = "spills" if link == "spill_to" else "promotes"
            target = by_name.get(target_name)
            if target_name == tier.name:
                raise ConfigError(f"tier {tier.name!r} {verb} into itself: {link} names another tier")
            if target is None:
                raise ConfigError(f"tier {tier.name!r} {verb} into {target_name!r}, which is not a configured tier "
                                  f"(tiers: {', '.join(names)})")
            if target.read_only:
                raise ConfigError(f"tier {tier.name!r} {verb} into {target_name!r}, which is read-only: "
                                  f"the router never writes into a mounted read-only tier")
            if target.kind == "procedural":
                raise ConfigError(f"tier {tier.name!r} {verb} into {target_name!r}, a procedural tier: nothing "
                                  f"spills or is promoted into procedural memory (write it there explicitly)")
            if tier.read_only:
                raise ConfigError(f"tier {tier.name!r} is read-only and cannot {verb[:-1]} anywhere: moving a "
                                  f"record deletes it from its source")
        if tier.read_only and tier.capacity is not None:
            raise ConfigError(f"tier {tier.name!r} is read-only: a capacity would never apply (nothing is moved "
                              f"out of or deleted from a mounted tier); leave it out")
    # A cycle over spill and promote links would move the same records round for ever.
    for start in tiers:
        path = [start.name]
        frontier = [(start.name, path)]
        while frontier:
            current, trail = frontier.pop()
            tier = by_name[current]
            for target in (tier.spill_to, tier.promote_to):
                if target is None:
                    continue
                if target == start.name:
                    raise ConfigError("spill/promote links form a cycle: " + " -> ".join(trail + [target]))
                if target not in trail:
                    frontier.append((target, trail + [target]))


SECTIONS = ("router", "tiers", "auth", "limits", "fusion", "embedder", "rate_limit")
ROUTER_KEYS = ("name", "timeout", "default_tier", "fusion", "embedder", "service_token", "allowed_origins",
               "events_capacity", "background_promotion", "lock_url", "intent_grace")
TIER_KEYS = ("name", "kind", "url", "capacity", "per_session", "spill_to", "promote_to", "promote_after",
             "read_only", "timeout", "retention", "max_response")
AUTH_KEYS = ("tokens", "service_token", "allowed_origins", "cursor_secret")
FUSION_KEYS = ("strategy", "rrf_k", "pool", "half_life_days", "weights")
EMBEDDER_KEYS = ("spec", "url", "model")
RATE_LIMIT_KEYS = ("per_second", "burst")


def unenforced(tiers: Iterable[TierConfig]) -> list[str]:
    """A line for each tier whose capacity nothing enforces: no `spill_to`, and retention "keep" (the
    default: nothing is dropped unless asked). Started with, and logged: `a2m up --tiers working` has one."""
    return [f"tier {t.name} has capacity {t.capacity} but neither spill_to nor retention = \"drop\": it keeps "
            f"every record past its capacity" for t in tiers
            if t.capacity is not None and t.spill_to is None and t.retention == "keep"]


def _known(table: Mapping[str, Any], known: Iterable[str], where: str, hint: str = "") -> None:
    """A misspelt key is refused, not ignored: a silently dropped setting is a wrong deployment."""
    known = sorted(set(known))
    unknown = sorted(set(table) - set(known), key=str)
    if unknown:
        guesses = [f"{key!r} -> {match[0]!r}" for key in unknown
                   if (match := difflib.get_close_matches(str(key), known, n=1, cutoff=0.6))]
        guess = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
        raise ConfigError(f"{where} has unknown keys {unknown}{guess}; known: {known}{hint}")


def _positive(value: Any, where: str, kind: type | tuple[type, ...] = int) -> Any:
    what = "a positive integer" if kind is int else "a positive number"
    _type(value, kind, where, what)
    if value <= 0:
        raise ConfigError(f"{where} must be {what}, got {value!r}")
    return value


def _bearer(token: Any, where: str) -> None:
    if not isinstance(token, str) or not token:
        raise ConfigError(f"{where} must be a non-empty string")
    problem = token_problem(token)
    if problem:
        raise ConfigError(f"{where} {problem}")


MIN_CURSOR_SECRET = 32  # characters: a key, not a password


def _cursor_secret(written: Any, from_env: str | None, tokens: Mapping[str, Any],
                   service_token: str | None) -> str | None:
    """`[auth] cursor_secret`, else `$A2M_CURSOR_SECRET`. Known to no caller: one who held it could
    open its own cursors and read how many records other owners wrote between two of them."""
    where = "cursor_secret" if written is not None else "$A2M_CURSOR_SECRET"
    secret = written if written is not None else (from_env or None)
    if secret is None:
        return None
    if not isinstance(secret, str) or len(secret) < MIN_CURSOR_SECRET:
        raise ConfigError(f"{where} must be a string of at least {MIN_CURSOR_SECRET} characters "
                          f"(e.g. `openssl rand -hex 32`)")
    try:
        secret.encode()
    except UnicodeEncodeError:  # an environment value that is not UTF-8 (read with lone surrogates)
        raise ConfigError(f"{where} must be UTF-8 text (e.g. `openssl rand -hex 32`)") from None
    if secret in tokens or secret == service_token:
        raise ConfigError(f"{where} is a bearer token: a caller holding it could open the cursors it is "
                          f"handed; give it a value of its own")
    return secret


def _origin(origin: Any) -> str:
    if not isinstance(origin, str):
        raise ConfigError(f"allowed_origins must be an array of origins (strings), got {origin!r}")
    problem = origin_problem(origin)
    if problem:
        raise ConfigError(f"allowed_origins: {problem}")
    return origin


def _weights(raw: Any, defaults: Mapping[str, float]) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise ConfigError(f"fusion.weights must be a table of {sorted(defaults)} to numbers, got {raw!r}")
    weights = dict(defaults)
    for name, value in raw.items():
        if name not in weights:
            guess = difflib.get_close_matches(name, sorted(weights), n=1)
            raise ConfigError(f"fusion.weights.{name} is unknown{f' (did you mean {guess[0]!r}?)' if guess else ''}"
                              f"; known: {sorted(weights)}")
        value = float(_type(value, (int, float), f"fusion.weights.{name}", "a number of at least 0"))
        if value < 0:
            raise ConfigError(f"fusion.weights.{name} must be a number of at least 0, got {value!r}")
        weights[name] = value
    if not any(weights.values()):
        raise ConfigError("fusion.weights are all 0: rerank would score every candidate 0; give one a weight")
    return weights


def parse(data: Mapping[str, Any], env: Mapping[str, str] | None = None) -> RouterConfig:
    """Build a RouterConfig from decoded TOML (a mapping); env supplies A2M_SERVICE_TOKEN."""
    env = os.environ if env is None else env
    router_table = data.get("router", {})
    if not isinstance(router_table, dict):
        raise ConfigError("router must be a table ([router])")
    section = dict(router_table)  # keys may sit at top level or under [router]
    _known(section, ROUTER_KEYS, "[router]")
    for key, value in data.items():
        if key in router_table:  # one of the two would be dropped without a word
            raise ConfigError(f"{key} is set both at the top level and under [router]; keep one")
        if key not in SECTIONS:
            section[key] = value
    _known(section, ROUTER_KEYS + SECTIONS, "router.toml")
    name = _type(section.get("name", "a2m-router"), str, "name", "a non-empty string")
    if not name.strip():
        raise ConfigError("name must be a non-empty string")
    default_timeout = float(_positive(section.get("timeout", 5.0), "timeout", (int, float)))
    raw_tiers = data.get("tiers")
    if raw_tiers is None:
        tiers = default_tiers()
        if "timeout" in section:  # the built-in layout's own timeouts (working 2 s) yield to an explicit one
            tiers = tuple(replace(t, timeout=default_timeout) for t in tiers)
    else:
        if not isinstance(raw_tiers, list):
            raise ConfigError("tiers must be an array of tables ([[tiers]])")
        tiers = tuple(_tier(raw, i, default_timeout) for i, raw in enumerate(raw_tiers))
    validate(tiers)

    names = [t.name for t in tiers]
    default_tier = section.get("default_tier")
    writable = [t for t in tiers if not t.read_only]
    if default_tier is None:
        working = [t for t in writable if t.kind == "working"]
        if not writable:
            default_tier = tiers[0].name
        else:
            default_tier = (working or writable)[0].name
    elif default_tier not in names:
        raise ConfigError(f"default_tier {default_tier!r} is not a configured tier (tiers: {', '.join(names)})")
    elif writable and next(t for t in tiers if t.name == default_tier).read_only:
        raise ConfigError(f"default_tier {default_tier!r} is read-only: every memory/remember without a tier "
                          f"would be refused; name a writable tier ({', '.join(t.name for t in writable)})")

    fusion_raw = data.get("fusion", section.get("fusion", "rrf"))
    if isinstance(fusion_raw, str):
        fusion_raw = {"strategy": fusion_raw}
    if not isinstance(fusion_raw, dict):
        raise ConfigError("fusion must be \"rrf\", \"rerank\" or a table")
    _known(fusion_raw, FUSION_KEYS, "[fusion]")
    defaults = FusionConfig()
    strategy = fusion_raw.get("strategy", defaults.strategy)
    _one_of(strategy, FUSIONS, "fusion strategy")
    weights = _weights(fusion_raw.get("weights", {}), defaults.weights)
    fusion = FusionConfig(strategy=strategy, rrf_k=_positive(fusion_raw.get("rrf_k", defaults.rrf_k), "fusion.rrf_k"),
                          pool=_positive(fusion_raw.get("pool", defaults.pool), "fusion.pool"),
                          half_life_days=float(_positive(fusion_raw.get("half_life_days", defaults.half_life_days),
                                                         "fusion.half_life_days", (int, float))),
                          weights=weights)

    embedder_raw = data.get("embedder", section.get("embedder"))
    embedder_model = None
    if isinstance(embedder_raw, dict):
        _known(embedder_raw, EMBEDDER_KEYS, "[embedder]", " (an API key comes from A2M_EMBEDDER_KEY, never the file)")
        if "spec" in embedder_raw and "url" in embedder_raw:
            raise ConfigError("[embedder] sets both spec and url (url stands for spec); keep one")
        embedder_model = embedder_raw.get("model")
        if embedder_model is not None and (not isinstance(embedder_model, str) or not embedder_model.strip()):
            raise ConfigError(f"embedder.model must be a non-empty string, got {embedder_model!r}")
        embedder_raw = embedder_raw.get("spec", embedder_raw.get("url"))
        if embedder_model is not None and (embedder_raw in (None, "", "none") or embedder_raw == "local"):
            raise ConfigError(f"embedder.model names the model of an http(s) embedder; this embedder is "
                              f"{embedder_raw or 'none'!r} (local is always all-MiniLM-L6-v2): set spec to the "
                              f"service's URL, or leave model out")
    if embedder_raw in ("", "none"):
        embedder_raw = None
    embedder_model = embedder_model or env.get("A2M_EMBEDDER_MODEL") or None
    if embedder_raw is not None and embedder_raw != "local" and not _http_url(embedder_raw):
        raise ConfigError(f"embedder must be none, local or an OpenAI-compatible http(s) URL, got {embedder_raw!r}")
    if embedder_raw == "local" and not local_available():
        raise ConfigError(f"embedder = \"local\" {LOCAL_MISSING}")
    if embedder_raw is not None and embedder_raw != "local":
        try:  # the HTTP embedder's settings from the environment, refused here as the file's are
            timeout_setting(env.get("A2M_EMBEDDER_TIMEOUT"))
            clean_api_key(env.get("A2M_EMBEDDER_KEY"))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    auth = data.get("auth", {})
    if not isinstance(auth, dict):
        raise ConfigError("auth must be a table ([auth])")
    _known(auth, AUTH_KEYS, "[auth]")
    for key in ("service_token", "allowed_origins"):
        if key in auth and key in section:
            raise ConfigError(f"{key} is set both in [auth] and {'under [router]' if key in router_table else 'at the top level'}"
                              f"; keep one")
    written = auth.get("service_token", section.get("service_token"))
    if written is not None:
        _bearer(written, "service_token")
    service_token = written or env.get("A2M_SERVICE_TOKEN") or None
    if written is None and service_token is not None:  # the environment's, checked as a written one is
        _bearer(service_token, "$A2M_SERVICE_TOKEN")
    tokens = auth.get("tokens", {})
    if not isinstance(tokens, dict):
        raise ConfigError("auth.tokens must be a table mapping bearer tokens to principals")
    for token, principal in tokens.items():
        if not isinstance(principal, str) or not principal.strip():
            raise ConfigError(f"auth.tokens: a principal must be a non-empty string (the owner the token "
                              f"grants), got {principal!r}")
        if principal == INTENTS:
            raise ConfigError(f"auth.tokens: the principal {INTENTS!r} is reserved by the router (the owner its "
                              f"batches' intents are written under): name the token's owner otherwise")
        _bearer(token, f"auth.tokens: the token of principal {principal!r}")
        if token == service_token:
            raise ConfigError(f"auth.tokens: the token of principal {principal!r} is the service token, which "
                              f"the tiers trust to name any owner: give {principal!r} a token of its own")
    cursor_secret = _cursor_secret(auth.get("cursor_secret"), env.get("A2M_CURSOR_SECRET"), tokens, service_token)
    origins = auth.get("allowed_origins", section.get("allowed_origins", []))
    if not isinstance(origins, list):
        raise ConfigError("allowed_origins must be an array of origins")
    origins = [_origin(o) for o in origins]

    limits = dict(DEFAULT_LIMITS)
    if not isinstance(data.get("limits", {}), dict):
        raise ConfigError("limits must be a table ([limits])")
    for key, value in data.get("limits", {}).items():
        if key not in DEFAULT_LIMITS:
            guess = difflib.get_close_matches(key, sorted(DEFAULT_LIMITS), n=1)
            raise ConfigError(f"limits.{key} is unknown{f' (did you mean {guess[0]!r}?)' if guess else ''}; "
                              f"known: {sorted(DEFAULT_LIMITS)}")
        limits[key] = _positive(value, f"limits.{key}")

    return RouterConfig(
        name=name, tiers=tiers,
        default_tier=default_tier, fusion=fusion, embedder=embedder_raw, embedder_model=embedder_model,
        tokens=dict(tokens), service_token=service_token, cursor_secret=cursor_secret,
        allowed_origins=frozenset(origins), limits=limits,
        events_capacity=_positive(section.get("events_capacity", 1024), "events_capacity"),
        background_promotion=_type(section.get("background_promotion", True), bool, "background_promotion",
                                   "true or false"),
        rate_limit=_rate_limit(data.get("rate_limit")),
        lock_url=_lock_url(section.get("lock_url"), env.get("A2M_LOCK_URL")),
        intent_grace=float(_positive(section.get("intent_grace", 60.0), "intent_grace", (int, float))),
    )


def _lock_url(written: Any, from_env: str | None) -> str | None:
    """`lock_url`, else `$A2M_LOCK_URL` (where a password in it stays out of the file): a Redis URL."""
    url = written if written is not None else (from_env or None)
    where = "lock_url" if written is not None else "$A2M_LOCK_URL"
    if url is None:
        return None
    if not isinstance(url, str) or urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        scheme = urlsplit(url).scheme if isinstance(url, str) else type(url).__name__
        raise ConfigError(f"{where} must be a Redis URL (redis://host:6379/0, rediss://... or unix:///path), "
                          f"not {scheme or 'one without a scheme'}")  # the URL itself may hold a password
    return url


def _rate_limit(table: Any) -> RateLimit | None:
    """`[rate_limit]`: `per_second` (required there; a fraction allowed: 0.5 is a call every 2 s) and
    `burst` (calls at once after a quiet spell; default one second's worth, at least 1)."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError("rate_limit must be a table ([rate_limit])")
    _known(table, RATE_LIMIT_KEYS, "[rate_limit]")
    if "per_second" not in table:
        raise ConfigError("[rate_limit] needs per_second (each caller's calls a second); leave the table out "
                          "for no limit")
    per_second = float(_positive(table["per_second"], "rate_limit.per_second", (int, float)))
    if per_second < MIN_PER_SECOND:
        raise ConfigError(f"rate_limit.per_second must be at least one call a day ({MIN_PER_SECOND:.3g}), "
                          f"got {per_second!r}")
    burst = _positive(table.get("burst", max(1, math.ceil(per_second))), "rate_limit.burst")
    return RateLimit(per_second=per_second, burst=burst)


def load(path: str | Path | None, env: Mapping[str, str] | None = None) -> RouterConfig:
    """Read router.toml (None: the defaults). Raises ConfigError with the file name on a bad file."""
    if path is None:
        return parse({}, env)
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise ConfigError(f"router config {path} does not exist") from None
    except OSError as exc:  # a directory, no permission
        raise ConfigError(f"router config {path} cannot be read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ConfigError(f"router config {path} is not UTF-8 text (line {line}), as TOML must be") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"router config {path} is not valid TOML: {exc}") from None
    try:
        return parse(data, env)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
