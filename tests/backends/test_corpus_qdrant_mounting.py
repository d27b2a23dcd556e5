"""Mounting an existing Qdrant collection as its owner would, in qdrant-client's local mode (the real
engine code): options that name payload fields no point holds are refused at start by name, rather
than a server that answers empty records (a wrong text_field) or drops a field silently.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.corpora import make_points

from .test_corpus_mounting import records, serve

pytestmark = pytest.mark.timeout(300)


# ---- a Qdrant collection whose payload the options do not name -----------------------------------------------

POINTS = {1: {"page_content": "Refunds take 14 days", "src": "policy", "at": "2026-01-01T00:00:00Z"},
          2: {"page_content": "Shipping to Italy", "src": "ship"}}


@pytest.mark.parametrize("options, says", [
    # Each started, and answered empty records (or dropped the field) for as long as it ran.
    ([], "text_field='text': no point of collection 'kb' has this payload field (its points hold: at, "
         "page_content, src)"),
    (["text_field=src", "text_json_key=text"], "text_json_key='text': no 'src' of collection 'kb' holds a JSON"),
    (["text_field=page_content", "metadata_fields=src,lang"], "metadata_fields names 'lang', which no point"),
    (["text_field=page_content", "created_field=when"], "created_field='when': no point of collection 'kb' has"),
    (["text_field=page_content", "created_field=src"], "created_field='src': this payload field of collection "
                                                       "'kb' holds no time Qdrant reads (e.g. 'policy')"),
    (["text_field=page_content", "metadata_field=metadata"], "metadata_field='metadata': no point of collection"),
])
def test_a_collection_the_options_do_not_describe_is_refused_at_start(tmp_path: Path, options: list[str],
                                                                      says: str) -> None:
    make_points(tmp_path / "kb", POINTS)
    _, done = serve(str(tmp_path / "kb"), tmp_path / "data", "collection=kb", *options)
    assert done.returncode == 1 and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_collection_the_options_describe_mounts(tmp_path: Path) -> None:
    make_points(tmp_path / "kb", POINTS)
    answers, done = serve(str(tmp_path / "kb"), tmp_path / "data", "collection=kb", "text_field=page_content",
                          "created_field=at", "metadata_fields=src", calls=[("memory/timeline", {})])
    assert done.returncode == 0, done.stderr
    assert [(r["id"], r["content"]) for r in records(answers[0])] == [("2", "Shipping to Italy"),
                                                                     ("1", "Refunds take 14 days")]
    make_points(tmp_path / "empty", {})  # nothing to check yet: mounts as it is
    _, done = serve(str(tmp_path / "empty"), tmp_path / "data", "collection=kb")
    assert done.returncode == 0, done.stderr


def test_every_write_method_answers_as_a_read_only_server(tmp_path: Path) -> None:
    from tests.support.corpora import tree_digest

    from .test_corpus_mounting import WRITES, answered_as_read_only

    make_points(tmp_path / "kb", POINTS)
    before = tree_digest(tmp_path / "kb")
    answers, done = serve(str(tmp_path / "kb"), tmp_path / "data", "collection=kb", "text_field=page_content",
                          calls=[(method, params) for method, params, _ in WRITES])
    assert done.returncode == 0, done.stderr
    assert not answered_as_read_only(answers)
    assert tree_digest(tmp_path / "kb") == before


def test_a_qdrant_server_that_does_not_answer_is_refused_at_start(tmp_path: Path) -> None:
    from tests.support.procs import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there: was a StoreUnavailable traceback
    _, done = serve(url, tmp_path, "collection=kb")
    assert done.returncode == 1 and f"corpus: collection 'kb' at {url}: qdrant unreachable" in done.stderr, \
        done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.anyio
async def test_a_langchain_collection_served_alone_and_mounted_beside_a_real_working_tier(tmp_path: Path) -> None:
    """`a2m serve corpus` as its own process on a collection LangChain wrote (text under
    `page_content`, metadata one object under `metadata`): conformant as a read-only server over HTTP,
    then mounted under the router beside the real (Redis) working tier: recall fuses both, `where`
    reaches inside the metadata object through the router, and no write reaches the collection."""
    from a2m.client import HTTPClient
    from a2m.errors import A2MError
    from tests.conformance.test_conformance import failures, run_http
    from tests.support.corpora import DOCS, langchain_points, tree_digest

    from .test_corpus_mounting import mounted

    path = tmp_path / "lc"
    make_points(path, langchain_points())
    before = tree_digest(path)
    layout = ["--option", "collection=kb", "--option", "text_field=page_content", "--option", "metadata_field=metadata",
              "--option", "created_field=written"]
    corpus = {"name": "kb", "kind": "semantic", "read_only": True, "engine": "corpus", "serve": "real",
              "args": ["--url", str(path), *layout]}
    working = {"name": "working", "kind": "working", "capacity": 8, "serve": "real"}
    with mounted(tmp_path, [working, corpus]) as stack:
        results = await run_http(stack.tiers["kb"].url)
        assert not failures(results), "\n".join(failures(results))
        assert any(r.group == "read-only" and r.outcome == "pass" for r in results)
        async with HTTPClient(stack.url) as router:
            layout_ = {t["name"]: t for t in (await router.call("memory/describe", {}))["tiers"]}
            assert layout_["kb"]["read_only"] is True and layout_["kb"]["count"] == len(DOCS)
            said = (await router.call("memory/remember", {"owner": "ann", "records": [
                {"content": "the customer asked how refunds work", "session": "s1"}]}))["ids"]
            hits = (await router.call("memory/recall", {"owner": "ann", "query": "refunds", "limit": 10}))["records"]
            assert {h["tier"] for h in hits} == {"working", "kb"} and said[0] in {h["id"] for h in hits}
            assert any(h["content"] == DOCS[0][0] and h["metadata"]["source"] == "policy.md" for h in hits)
            policy = (await router.call("memory/timeline", {"owner": "ann", "tier": "kb",
                                                            "where": {"source": "policy.md"}}))["records"]
            assert [r["metadata"]["page"] for r in policy] == [1, 2]
            for method, params in (("memory/remember", {"records": [{"content": "x", "tier": "kb"}]}),
                                   ("memory/forget", {"tier": "kb", "query": "refunds"})):
                with pytest.raises(A2MError) as err:
                    await router.call(method, {"owner": "ann", **params})
                assert err.value.code == -32004
            await router.call("memory/forget", {"owner": "ann", "query": "refunds"})  # writable tiers only
            left = (await router.call("memory/recall", {"owner": "ann", "query": "refunds", "limit": 10}))["records"]
            assert left and {h["tier"] for h in left} == {"kb"}
    assert tree_digest(path) == before


def test_a_directory_that_is_not_local_mode_storage_is_refused_untouched(tmp_path: Path) -> None:
    """`--url` naming a folder local mode never made (the store's parent, one collection's own folder, a
    typo that exists): refused at start by name, and nothing written there. Local mode had written an
    empty `meta.json` and a `.lock` into it, then said only that it had no collection."""
    from tests.support.corpora import make_collection

    make_collection(tmp_path / "rag" / "store")
    for wrong in (tmp_path / "rag", tmp_path / "rag" / "store" / "collection" / "kb"):
        before = sorted(p.name for p in wrong.iterdir())
        _, done = serve(str(wrong), tmp_path / "data", "collection=kb", "text_field=body")
        assert done.returncode == 1 and f"corpus: {wrong} is not a qdrant-client local-mode directory" in done.stderr, \
            done.stderr
        assert sorted(p.name for p in wrong.iterdir()) == before


def test_a_vector_name_on_a_collection_whose_vector_is_unnamed_says_to_leave_it_out(tmp_path: Path) -> None:
    """The refusal named the unnamed vector as `['None']`, which reads as a vector called "None" to pass
    as `--option vector_name=None` (refused the same way)."""
    make_points(tmp_path / "kb", POINTS)
    _, done = serve(str(tmp_path / "kb"), tmp_path / "data", "collection=kb", "text_field=page_content",
                    "vector_name=dense")
    assert done.returncode == 1, done.stderr
    assert ("collection 'kb' has no vector named 'dense'; it has only its unnamed vector: leave --option "
            "vector_name out") in done.stderr, done.stderr
    assert "None" not in done.stderr and "Traceback" not in done.stderr


def test_a_local_collection_path_that_is_no_directory_is_named_as_such(tmp_path: Path) -> None:
    """A typo in a local-mode folder was answered "needs --url: postgresql://..., http://..." as if no
    `--url` had been given a path at all."""
    (tmp_path / "file").write_text("")
    for wrong, says in ((tmp_path / "missing", "no such directory"), (tmp_path / "file", "a file, not a directory")):
        _, done = serve(str(wrong), tmp_path / "data", "collection=kb")
        assert done.returncode == 1 and f"--url '{wrong}': {says}" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and not (tmp_path / "missing").exists()
