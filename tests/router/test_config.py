"""Router config: the defaults are the design's stack; bad layouts are refused with clear messages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from router.config import ConfigError, load, parse


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


def test_service_token_from_env() -> None:
    assert parse({}, env={"A2M_SERVICE_TOKEN": "s3cret"}).service_token == "s3cret"


@pytest.mark.parametrize("change, message", [
    ({"name": "working", "spill_to": "episodc"}, "spills into 'episodc', which is not a configured tier"),
    ({"name": "episodic", "spill_to": "working"}, "cycle: working -> episodic -> working"),
    ({"name": "episodic", "promote_to": "episodic"}, "cycle: episodic -> episodic"),
    ({"name": "working", "spill_to": "procedural"}, "a procedural tier"),
    ({"name": "semantic", "read_only": True, "url": "http://127.0.0.1:3/"}, None),
    ({"name": "working", "kind": "scratch"}, "kind must be one of"),
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
