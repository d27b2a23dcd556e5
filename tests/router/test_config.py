"""Router config: the defaults are the design's stack; bad layouts are refused with clear messages."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from router.config import ConfigError, load, parse, unenforced


def tiers(*extra: dict) -> dict:
    base = [
        {"name": "working", "kind": "working", "url": "http://127.0.0.1:1/", "capacity": 8, "spill_to": "episodic"},
        {"name": "episodic", "kind": "episodic", "url": "http://127.0.0.1:2/"},
        {"name": "semantic", "kind": "semantic", "url": "http://127.0.0.1:3/"},
        {"name": "procedural", "kind": "procedural", "url": "http://127.0.0.1:4/"},
    ]
    by_name = {t["name"]: t for t in base}
    for change in extra:
        by_name.setdefault(change["name"], {}).update(change)
    return {"tiers": list(by_name.values())}


def test_defaults_are_the_four_tier_stack() -> None:
    config = parse({}, env={})
    assert config.names == ["working", "episodic", "semantic", "procedural"]
    working, episodic = config.tier("working"), config.tier("episodic")
    assert (working.capacity, working.per_session, working.spill_to) == (32, True, "episodic")
    assert (episodic.capacity, episodic.spill_to, episodic.promote_to, episodic.promote_after) == \
        (None, "semantic", "semantic", 3)
    assert [t.url for t in config.tiers] == [f"http://127.0.0.1:{p}/" for p in range(8701, 8705)]
    assert config.default_tier == "working" and config.fusion.strategy == "rrf"
    assert config.service_token is None


SECRET = "c" * 32


def test_cursor_secret_from_the_file_or_the_environment() -> None:
    assert parse({"auth": {"cursor_secret": SECRET}}).cursor_secret == SECRET
    assert parse({}, env={"A2M_CURSOR_SECRET": SECRET}).cursor_secret == SECRET
    assert parse({"auth": {"cursor_secret": SECRET}}, env={"A2M_CURSOR_SECRET": "d" * 32}).cursor_secret == SECRET
    assert parse({}).cursor_secret is None
    # compose.yaml passes `${A2M_CURSOR_SECRET:-}`: set and empty where the operator gave none
    assert parse({}, env={"A2M_CURSOR_SECRET": ""}).cursor_secret is None


@pytest.mark.parametrize("data, env, message", [
    ({"auth": {"cursor_secret": "short"}}, {}, r"cursor_secret must be a string of at least 32"),
    ({"auth": {"cursor_secret": 12345}}, {}, r"cursor_secret must be a string"),
    ({}, {"A2M_CURSOR_SECRET": "short"}, r"\$A2M_CURSOR_SECRET must be a string of at least 32"),
    ({"auth": {"tokens": {SECRET: "alice"}, "cursor_secret": SECRET}}, {}, r"cursor_secret is a bearer token"),
    ({"auth": {"cursor_secret": SECRET}}, {"A2M_SERVICE_TOKEN": SECRET}, r"cursor_secret is a bearer token"),
])
def test_a_cursor_secret_is_long_and_no_token(data: dict, env: dict, message: str) -> None:
    """A secret a caller holds (its own token) would let it open its cursors and count other owners'
    writes between two of them: refused at start, as a short one is."""
    with pytest.raises(ConfigError, match=message):
        parse(data, env=env)


def test_a_cursor_secret_from_the_environment_that_is_not_utf8_is_refused_at_start() -> None:
    """Python reads an environment value that is not UTF-8 with lone surrogates: it passed the
    checks here and the router then died at start with a traceback (UnicodeEncodeError) where the
    key is derived. Other non-ASCII text is a secret like any (its UTF-8 bytes are the key's input)."""
    from router.cursors import CursorSeal

    with pytest.raises(ConfigError, match=r"\$A2M_CURSOR_SECRET must be UTF-8 text"):
        parse({}, env={"A2M_CURSOR_SECRET": os.fsdecode(b"\xff" * 40)})
    secret = parse({}, env={"A2M_CURSOR_SECRET": "sécret clé 秘密 " * 3}).cursor_secret
    assert secret is not None and CursorSeal.of({"t" * 16: "alice"}, None, secret) is not None


def test_service_token_from_env() -> None:
    assert parse({}, env={"A2M_SERVICE_TOKEN": "s3cret"}).service_token == "s3cret"
    # checked as one written in router.toml: a bearer header could never carry this one as written
    with pytest.raises(ConfigError, match=r"\$A2M_SERVICE_TOKEN must be printable ASCII"):
        parse({}, env={"A2M_SERVICE_TOKEN": " s3cret\n"})


@pytest.mark.parametrize("change, message", [
    ({"name": "working", "spill_to": "episodc"}, "spills into 'episodc', which is not a configured tier"),
    ({"name": "episodic", "spill_to": "working"}, "cycle: working -> episodic -> working"),
    ({"name": "episodic", "promote_to": "episodic"}, "tier 'episodic' promotes into itself"),
    ({"name": "working", "spill_to": "working"}, "tier 'working' spills into itself"),
    ({"name": "working", "spill_to": "procedural"}, "a procedural tier"),
    ({"name": "semantic", "read_only": True, "url": "http://127.0.0.1:3/"}, None),
    ({"name": "working", "kind": "scratch"}, "kind must be one of"),
    # one letter off: said which are allowed, not which was meant
    ({"name": "working", "kind": "workng"}, "kind must be one of ['working', 'episodic', 'semantic', 'procedural'], "
                                            "got 'workng' (did you mean 'working'?)"),
    ({"name": "working", "kind": 3}, "kind must be one of ['working', 'episodic', 'semantic', 'procedural'], got 3"),
    ({"name": "semantic", "capacity": 5, "retention": "dorp"}, "retention must be one of ['keep', 'drop'], got 'dorp' "
                                                               "(did you mean 'drop'?)"),
    ({"name": "working", "capacity": 0}, "capacity must be a positive integer"),
    ({"name": "working", "url": "redis://x"}, "url is required and must be an http(s) URL"),
    ({"name": "working", "colour": "red"}, "unknown keys ['colour']"),
])
def test_layout_validation(change: dict, message: str | None) -> None:
    if message is None:
        parse(tiers(change), env={})  # a read-only tier nothing spills into is fine
        return
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(tiers(change), env={})


def test_spill_into_read_only_is_refused() -> None:
    with pytest.raises(ConfigError, match="'corpus', which is read-only"):
        parse(tiers({"name": "corpus", "url": "http://127.0.0.1:9/", "read_only": True},
                    {"name": "episodic", "spill_to": "corpus"}), env={})


def test_read_only_tier_cannot_spill() -> None:
    with pytest.raises(ConfigError, match="read-only and cannot spill"):
        parse(tiers({"name": "corpus", "url": "http://127.0.0.1:9/", "read_only": True, "spill_to": "semantic"}),
              env={})


def test_duplicate_names_and_unknown_default() -> None:
    data = tiers()
    data["tiers"].append(dict(data["tiers"][0]))
    with pytest.raises(ConfigError, match="unique"):
        parse(data, env={})
    with pytest.raises(ConfigError, match="default_tier 'nowhere'"):
        parse({**tiers(), "default_tier": "nowhere"}, env={})


@pytest.mark.parametrize("episodic_url", ["http://127.0.0.1:1/", "http://127.0.0.1:1"])
def test_two_tiers_at_one_url_are_refused(episodic_url: str) -> None:
    """Two tiers on one server lose what spills between them: the write to the destination finds the id
    already there, the read-back finds it, and the delete from the source deletes the only copy."""
    with pytest.raises(ConfigError, match=re.escape("tiers 'working' and 'episodic' have one url")):
        parse(tiers({"name": "episodic", "url": episodic_url}), env={})
    parse(tiers({"name": "episodic", "url": "http://127.0.0.1:1/episodic"}), env={})  # another path: another server


def test_fusion_auth_and_limits() -> None:
    config = parse({**tiers(), "fusion": {"strategy": "rerank", "pool": 80, "weights": {"text": 1.0}},
                    "auth": {"tokens": {"tok-a": "alice"}, "service_token": "svc"},
                    "limits": {"max_recall_limit": 200}}, env={})
    assert config.fusion.strategy == "rerank" and config.fusion.pool == 80 and config.fusion.weights["text"] == 1.0
    assert config.tokens == {"tok-a": "alice"} and config.service_token == "svc"
    assert config.limits["max_recall_limit"] == 200
    with pytest.raises(ConfigError, match="fusion strategy"):
        parse({**tiers(), "fusion": "borda"}, env={})
    with pytest.raises(ConfigError, match="limits.nope"):
        parse({**tiers(), "limits": {"nope": 1}}, env={})


def test_load_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "router.toml"
    bad.write_text("[[tiers]]\nname = 'w'\nkind = 'working'\nurl = 'http://127.0.0.1:1/'\nspill_to = 'gone'\n")
    with pytest.raises(ConfigError, match=r"router.toml: tier 'w' spills into 'gone'"):
        load(bad)
    bad.write_text("this is = = not toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "missing.toml")
    assert load(None).names[0] == "working"


@pytest.mark.parametrize("data, message", [
    ({"fusoin": "rerank"}, "unknown keys ['fusoin']"),
    ({"router": {"time_out": 3}}, "unknown keys ['time_out']"),
    ({"auth": {"token": {"t": "alice"}}}, "[auth] has unknown keys ['token']"),
    ({"fusion": {"strategy": "rerank", "pol": 20}}, "[fusion] has unknown keys ['pol']"),
    ({"fusion": {"pool": 0}}, "fusion.pool must be a positive integer"),
    ({"embedder": {"url": "http://e/", "api_key": "k"}}, "A2M_EMBEDDER_KEY"),
    ({"embedder": "bogus"}, "embedder must be none, local or an OpenAI-compatible"),
    ({"timeout": "abc"}, "timeout must be a positive number"),
    ({"background_promotion": "false"}, "background_promotion must be true or false"),
    ({"events_capacity": 0}, "events_capacity must be a positive integer"),
    ({"limits": {"max_recall_limit": 0}}, "limits.max_recall_limit must be a positive integer"),
    ({"limits": {"max_records_per_call": -5}}, "limits.max_records_per_call must be a positive integer"),
])
def test_a_misspelt_or_mistyped_setting_is_refused_not_ignored(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(data, env={})


def test_a_top_level_timeout_applies_to_the_built_in_layout_too() -> None:
    assert {t.timeout for t in parse({"timeout": 9}, env={}).tiers} == {9.0}
    assert parse({}, env={}).tier("working").timeout == 2.0
    declared = parse({"timeout": 7, **tiers({"name": "semantic", "timeout": 1.5})}, env={})
    assert declared.tier("episodic").timeout == 7.0 and declared.tier("semantic").timeout == 1.5


def test_the_unknown_key_message_lists_each_known_key_once_sorted() -> None:
    # `fusion` and `embedder` are both [router] keys and sections: they used to be listed twice.
    with pytest.raises(ConfigError) as caught:
        parse({"fusoin": "rerank"}, env={})
    known = str(caught.value).split("known: ", 1)[1]
    names = [name.strip(" '[]") for name in known.split(",")]
    assert names == sorted(set(names)), known
    assert {"fusion", "embedder", "tiers", "timeout"} <= set(names)


# ---- every written setting is honoured or refused, never dropped or a traceback -------------------

def one_tier(**fields: object) -> dict:
    return {"tiers": [{"name": "w", "kind": "working", "url": "http://127.0.0.1:1/", **fields}]}


@pytest.mark.parametrize("data, message", [
    # TOML writes nan and inf; each used to pass `value <= 0` and reach the policy or the scorer.
    ({"timeout": float("nan")}, "timeout must be a positive number (a finite one), got nan"),
    ({"timeout": float("inf")}, "timeout must be a positive number (a finite one), got inf"),
    (one_tier(timeout=float("nan")), "tier 'w': timeout must be a positive number (a finite one), got nan"),
    ({"fusion": {"half_life_days": float("nan")}}, "fusion.half_life_days must be a positive number (a finite"),
    ({"fusion": {"weights": {"text": float("inf")}}}, "fusion.weights.text must be a number of at least 0 (a finite"),
    ({"fusion": {"weights": {"text": -1}}}, "fusion.weights.text must be a number of at least 0, got -1"),
    ({"fusion": {"weights": {k: 0 for k in ("text", "vector", "rank", "recency", "salience")}}},
     "fusion.weights are all 0"),
    # A string or an array for the weights table used to raise a bare ValueError/TypeError from dict().
    ({"fusion": {"weights": "text=1"}}, "fusion.weights must be a table of"),
    ({"fusion": {"weights": [1, 2]}}, "fusion.weights must be a table of"),
    ({"fusion": {"weights": {"txt": 1}}}, "fusion.weights.txt is unknown (did you mean 'text'?)"),
])
def test_numbers_are_finite_and_weights_a_table_of_them(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(data, env={})


@pytest.mark.parametrize("data, message", [
    # One of the two used to win without a word ([router] over the top level, [auth] over both).
    ({"timeout": 4, "router": {"timeout": 3}}, "timeout is set both at the top level and under [router]"),
    ({"fusion": {"rrf_k": 5}, "router": {"fusion": "rerank"}}, "fusion is set both at the top level and under [router]"),
    ({"embedder": "none", "router": {"embedder": "local"}}, "embedder is set both at the top level and under [router]"),
    ({"service_token": "a", "auth": {"service_token": "b"}}, "service_token is set both in [auth] and at the top level"),
    ({"router": {"allowed_origins": ["https://a.example"]}, "auth": {"allowed_origins": ["https://b.example"]}},
     "allowed_origins is set both in [auth] and under [router]"),
])
def test_a_setting_written_in_two_places_is_refused(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(data, env={})


@pytest.mark.parametrize("data, message", [
    ({"tiers": [{"name": "w", "kind": "working", "url": "http://127.0.0.1:1/", "spil_to": "e"}]},
     "tiers[0] (tier 'w') has unknown keys ['spil_to'] (did you mean 'spil_to' -> 'spill_to'?)"),
    ({"defualt_tier": "working"}, "router.toml has unknown keys ['defualt_tier'] (did you mean 'defualt_tier' -> "
                                  "'default_tier'?)"),
    ({"auth": {"token": {"t": "alice"}}}, "[auth] has unknown keys ['token'] (did you mean 'token' -> 'tokens'?)"),
    ({"limits": {"max_recal_limit": 5}}, "limits.max_recal_limit is unknown (did you mean 'max_recall_limit'?)"),
])
def test_a_misspelt_key_gets_a_suggestion(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(data, env={})


@pytest.mark.parametrize("data, message", [
    # Each of these was accepted and then never did anything.
    (one_tier(retention="drop"), "tier 'w': retention = \"drop\" deletes what is over capacity, and this tier has no"),
    ({"tiers": [{"name": "w", "kind": "working", "url": "http://127.0.0.1:1/", "capacity": 2, "spill_to": "e",
                 "retention": "drop"}, {"name": "e", "kind": "episodic", "url": "http://127.0.0.1:2/"}]},
     "tier 'w': retention = \"drop\" and spill_to are both set"),
    ({"tiers": [{"name": "w", "kind": "working", "url": "http://127.0.0.1:1/"},
                {"name": "c", "url": "http://127.0.0.1:9/", "read_only": True, "capacity": 10}]},
     "tier 'c' is read-only: a capacity would never apply"),
    # The default tier is where a remember without `tier` goes: a read-only one refuses every such write.
    ({"default_tier": "c", "tiers": [{"name": "w", "kind": "working", "url": "http://127.0.0.1:1/"},
                                     {"name": "c", "url": "http://127.0.0.1:9/", "read_only": True}]},
     "default_tier 'c' is read-only"),
    # URLs the tier client could never open.
    (one_tier(url="http://"), "tier 'w': url is required and must be an http(s) URL with a host"),
    (one_tier(url="http://127.0.0.1:99999/"), "tier 'w': url is required and must be an http(s) URL with a host"),
    (one_tier(url="http://host name/"), "tier 'w': url is required and must be an http(s) URL with a host"),
    # Port 0 is no server's port: the message promised 1-65535 and the file started anyway.
    (one_tier(url="http://127.0.0.1:0/"), "tier 'w': url is required and must be an http(s) URL with a host"),
    (one_tier(kind="episodic", per_session=True), "tier 'w': per_session = true counts capacity per session"),
    ({"name": ""}, "name must be a non-empty string"),
    ({"tiers": [{"name": " ", "kind": "working", "url": "http://127.0.0.1:1/"}]}, "tiers[0].name is required"),
])
def test_a_tier_setting_that_would_do_nothing_is_refused(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(data, env={})


def test_a_read_only_default_tier_is_fine_when_every_tier_is_read_only() -> None:
    config = parse({"default_tier": "c", "tiers": [{"name": "c", "url": "http://127.0.0.1:9/", "read_only": True}]},
                   env={})
    assert config.default_tier == "c"


@pytest.mark.parametrize("data, env, message", [
    # A user's token equal to the service token hands that user the tiers' trust to name any owner.
    ({"auth": {"tokens": {"svc": "alice"}, "service_token": "svc"}}, {},
     "the token of principal 'alice' is the service token"),
    ({"auth": {"tokens": {"svc": "alice"}}}, {"A2M_SERVICE_TOKEN": "svc"},
     "the token of principal 'alice' is the service token"),
    ({"auth": {"tokens": {"": "alice"}}}, {}, "auth.tokens: the token of principal 'alice' must be a non-empty"),
    # The binding strips the header's token: one written with spaces around it could never match.
    ({"auth": {"tokens": {" tok ": "alice"}}}, {}, "must be printable ASCII without spaces around it"),
    ({"auth": {"tokens": {"t\u00f6k": "alice"}}}, {}, "must be printable ASCII without spaces around it"),
    ({"auth": {"tokens": {"tok": " "}}}, {}, "auth.tokens: a principal must be a non-empty string"),
    # A falsy service token used to fall back to $A2M_SERVICE_TOKEN without a word.
    ({"auth": {"service_token": ""}}, {"A2M_SERVICE_TOKEN": "env"}, "service_token must be a non-empty string"),
    ({"service_token": 0}, {"A2M_SERVICE_TOKEN": "env"}, "service_token must be a non-empty string"),
    # The binding compares Origin as a string: these could never match a browser's header.
    ({"allowed_origins": ["https://app.example.com/"]}, {}, "write 'https://app.example.com'"),
    ({"allowed_origins": ["https://App.Example.com:443"]}, {}, "write 'https://app.example.com'"),
    ({"allowed_origins": ["app.example.com"]}, {}, "'app.example.com' is not an origin"),
    ({"allowed_origins": ["*"]}, {}, "\"*\" is not supported"),
    ({"allowed_origins": [1]}, {}, "allowed_origins must be an array of origins (strings), got 1"),
])
def test_auth_settings_that_could_never_work_are_refused(data: dict, env: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(data, env=env)


def test_auth_settings_as_browsers_and_clients_send_them_are_kept() -> None:
    config = parse({"auth": {"tokens": {"tok-a": "alice", "tok b": "bob"}, "service_token": "svc",
                             "allowed_origins": ["https://app.example.com", "http://localhost:5173",
                                                 "chrome-extension://abcdef", "http://[::1]:8080"]}}, env={})
    assert config.tokens == {"tok-a": "alice", "tok b": "bob"}
    assert config.allowed_origins == {"https://app.example.com", "http://localhost:5173", "chrome-extension://abcdef",
                                      "http://[::1]:8080"}


@pytest.mark.parametrize("data, message", [
    # The model was dropped without a word when there was no HTTP embedder to use it.
    ({"embedder": {"model": "text-embedding-3-large"}}, "embedder.model names the model of an http(s) embedder"),
    ({"embedder": {"spec": "none", "model": "m"}}, "embedder.model names the model of an http(s) embedder"),
    ({"embedder": {"spec": "http://a.example/v1", "url": "http://b.example/v1"}}, "sets both spec and url"),
    ({"embedder": "http://"}, "embedder must be none, local or an OpenAI-compatible http(s) URL"),
])
def test_embedder_settings_that_would_be_dropped_are_refused(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(data, env={})


@pytest.mark.parametrize("env, message", [
    ({"A2M_EMBEDDER_TIMEOUT": "soon"}, "A2M_EMBEDDER_TIMEOUT must be a number of seconds above 0, got 'soon'"),
    ({"A2M_EMBEDDER_TIMEOUT": "0"}, "A2M_EMBEDDER_TIMEOUT must be a number of seconds above 0"),
    ({"A2M_EMBEDDER_KEY": "sk-one\ntwo"}, "a character an HTTP header cannot carry"),
])
def test_the_http_embedders_settings_from_the_environment_are_checked_at_start(env: dict, message: str) -> None:
    """Found by make_embedder inside the router's constructor they stopped `a2m serve router` with a
    traceback, and `a2m up --config` started every tier first."""
    with pytest.raises(ConfigError, match=re.escape(message)) as refused:
        parse({"embedder": "http://127.0.0.1:9/v1"}, env=env)
    assert "sk-one" not in str(refused.value)
    assert parse({"embedder": "none"}, env=env).embedder is None  # read only for an HTTP embedder


def test_a_local_embedder_without_its_extra_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without the `embed` extra every embed failed at run time, logged, and records went without vectors.
    monkeypatch.setattr("a2m.embedder.LOCAL_MODULES", ("a2m_no_such_module",))
    with pytest.raises(ConfigError, match=re.escape("embedder = \"local\" needs the `embed` extra")):
        parse({"embedder": "local"}, env={})
    monkeypatch.setattr("a2m.embedder.LOCAL_MODULES", ("tomllib",))
    assert parse({"embedder": "local"}, env={}).embedder == "local"


def test_an_unreadable_config_file_is_a_config_error(tmp_path: Path) -> None:
    # A directory or a file that is not UTF-8 used to end `a2m serve router` in a traceback.
    with pytest.raises(ConfigError, match="cannot be read"):
        load(tmp_path)
    binary = tmp_path / "router.toml"
    binary.write_bytes(b"name = 'a'\n\xff\xfe = 1\n")
    with pytest.raises(ConfigError, match=re.escape("is not UTF-8 text (line 2)")):
        load(binary)
    binary.write_text("name = 'a'\ntimeout = \n")
    with pytest.raises(ConfigError, match=re.escape("not valid TOML: Invalid value (at line 2, column 11)")):
        load(binary)
    binary.write_text("")
    assert load(binary).names == ["working", "episodic", "semantic", "procedural"]


def test_a_capacity_nothing_enforces_is_named_at_start() -> None:
    """Capacity with no spill_to and retention "keep" (the default) moves and drops nothing; accepted
    (`a2m up --tiers working` writes it), and named so the router logs it at start."""
    assert unenforced(parse({}).tiers) == []  # the design's stack: every capacity spills
    tier = {"name": "working", "kind": "working", "url": "http://127.0.0.1:1/", "capacity": 8}
    [line] = unenforced(parse({"tiers": [tier]}).tiers)
    assert "tier working has capacity 8" in line and "retention" in line
    assert unenforced(parse({"tiers": [{**tier, "retention": "drop"}]}).tiers) == []


def test_a_misspelt_fusion_strategy_names_the_one_meant() -> None:
    with pytest.raises(ConfigError, match=re.escape("fusion strategy must be one of ['rrf', 'rerank'], got 'rerang' "
                                                    "(did you mean 'rerank'?)")):
        parse({"fusion": "rerang"}, env={})
