"""Semantic dedupe and stemmed recall, offline: a dream's proposal that says part of, more than or the same
as a live memory in other words becomes a new version of it (an edit, or a merge of several), with the
provenance of both; facts about different things stay apart."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from wbmemory import model_factory

from workbench.brain.models import Reply, ScriptedModel
from workbench.memory.dream import commit_dream, create_dream
from workbench.memory.semantic import Embeddings, Statement, embed, relation, statement_text
from workbench.memory.tools import recall

PLAN: list[list[tuple[str, dict]]] = []  # the tool calls of the next `probe` dream turn


def probe(request):
    """Make the planned calls, then end the turn once their results are in (a model may be made once per host)."""
    last = request["messages"][-1]["content"]
    answered = isinstance(last, list) and any(b.get("type") == "tool_result" for b in last)
    return Reply(text="ok") if answered else Reply(tool_calls=PLAN.pop(0))


def models(name):
    return ScriptedModel(probe, name=name) if name == "probe" else model_factory(name)


def said(host, title, *messages):
    """A chat session where the user said these; (its id, the seq of each user message)."""
    sid = host.brain.create_session(title=title, model="capture")["id"]
    for m in messages:
        assert asyncio.run(host.brain.run_turn(sid, m)) == "end_turn"
    return sid, [e.seq for e in host.log.events(sid, types=["user_message"])]


def cite(sid, seq, quote):
    return {"session_id": sid, "seq": seq, "quote": quote}


def accepted(store, title, text, provenance):
    mid = store.create(title=title, text=text, actor="dream:d1", provenance=provenance)
    return store.review(mid, "accept", "person:ann")


def propose(host, sessions, *calls):
    """One dream turn over `sessions` that makes these calls, committed; the tool results' texts."""
    PLAN.append(list(calls))
    store = host.plugin("memory").store
    dream_id = create_dream(host.brain, store, sessions=sessions, model="probe")
    assert asyncio.run(host.brain.run_turn(dream_id, "propose")) == "end_turn"
    commit_dream(store, dream_id)
    return [("\n".join(b["text"] for b in r["content"]), r["is_error"])
            for r in (e.payload for e in host.log.events(dream_id, types=["tool_result"]))]


def live(store):
    return [m for m in store.list(annotate=False) if m["status"] in ("accepted", "proposed")]


def test_loading_the_embedding_model_never_reaches_for_the_network(tmp_path):
    """WordLlama's wheel ships its weights and tokenizer; loaded with an empty home (no cache) and every
    socket refused, it still embeds (its default load would download the tokenizer)."""
    code = ("import socket\n"
            "def refuse(*a, **k): raise OSError('the network was touched')\n"
            "socket.socket.connect = refuse\nsocket.getaddrinfo = refuse\nsocket.create_connection = refuse\n"
            "from workbench.memory.semantic import embed\n"
            "v = embed(['Store credentials in the vault.', 'Secrets belong in the vault.'])\n"
            "print(v.shape, round(float(v[0] @ v[1]), 2))\n"
            "import logging\n"  # wordllama sets up logging when imported; the host's stays as it was
            "assert not logging.getLogger().handlers and logging.getLogger().level == logging.WARNING\n")
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("(2, 256) ")
    assert not any(tmp_path.iterdir())  # nothing cached, nothing downloaded


def test_a_subset_of_a_library_list_becomes_an_edit_with_the_evidence_of_both(fresh):
    """The outside check's case: after "Libraries used: numpy, polars, yaml" was accepted, a later dream's
    "Libraries used: yaml" is a new version of it (its text kept, both sessions' evidence), not a second
    memory; the other way round, the longer list replaces the shorter."""
    host = fresh(models)
    store = host.plugin("memory").store
    s1, [q1] = said(host, "prices", "Load the prices with numpy, polars and yaml.")
    old = accepted(store, "Libraries used: numpy, polars, yaml",
                   "Third-party libraries past sessions used:\n- numpy\n- polars\n- yaml",
                   [cite(s1, q1, "numpy, polars and yaml")])
    s2, [q2] = said(host, "settings", "Read the settings file with yaml.")
    [(text, error)] = propose(host, [s2], ("propose_memory", {
        "title": "Libraries used: yaml", "text": "Third-party libraries past sessions used:\n- yaml",
        "provenance": [cite(s2, q2, "settings file with yaml")]}))
    assert not error and f"edit of {old['id']}" in text and "says part of memory" in text
    [edit] = [m for m in live(store) if m["status"] == "proposed"]
    assert edit["proposal"] == "edit" and edit["targets"] == [old["id"]]
    assert edit["title"] == old["title"] and edit["text"] == old["text"]
    assert [c["session_id"] for c in edit["provenance"]] == [s1, s2]
    assert "merged, not a new memory" in store.get(edit["id"])["history"][0]["note"]
    store.review(edit["id"], "accept", "person:ann")
    assert [m["title"] for m in live(store)] == ["Libraries used: numpy, polars, yaml"]

    s3, [q3] = said(host, "more", "This one needs numpy, polars, yaml and also requests.")
    [(text, error)] = propose(host, [s3], ("propose_memory", {
        "title": "Libraries used: numpy, polars, requests, yaml",
        "text": "Third-party libraries past sessions used:\n- numpy\n- polars\n- requests\n- yaml",
        "provenance": [cite(s3, q3, "numpy, polars, yaml and also requests")]}))
    assert not error and "says all of, and more than" in text, text
    [edit] = [m for m in live(store) if m["status"] == "proposed"]
    assert edit["proposal"] == "edit" and edit["title"] == "Libraries used: numpy, polars, requests, yaml"
    assert [c["session_id"] for c in edit["provenance"]] == [s1, s2, s3]


@pytest.mark.parametrize(("first", "again"), [
    ("Store credentials in the vault, never in notebooks.", "Secrets belong in the vault, not in notebook cells."),
    ("Large files should be converted to parquet before analysis.",
     "Before analysing big files, turn them into parquet first."),
])
def test_a_paraphrase_in_other_words_is_merged_into_the_memory_it_repeats(fresh, first, again):
    host = fresh(models)
    store = host.plugin("memory").store
    s1, [q1] = said(host, "one", first)
    old = accepted(store, "Note: " + first, first, [cite(s1, q1, first)])
    s2, [q2] = said(host, "two", again)
    [(text, error)] = propose(host, [s2], ("propose_memory", {
        "title": "Note: " + again, "text": again, "provenance": [cite(s2, q2, again)]}))
    assert not error and f"edit of {old['id']}" in text and "says in other words" in text
    [edit] = [m for m in live(store) if m["status"] == "proposed"]
    assert edit["targets"] == [old["id"]] and first in edit["text"] and again in edit["text"]
    assert [c["session_id"] for c in edit["provenance"]] == [s1, s2]


def test_one_proposal_that_covers_two_memories_merges_them(fresh):
    host = fresh(models)
    store = host.plugin("memory").store
    s1, [q1, q2] = said(host, "libs", "We read files with yaml.", "We plot with matplotlib.")
    a = accepted(store, "Libraries used: yaml", "Third-party libraries past sessions used:\n- yaml", [cite(s1, q1, "with yaml")])
    b = accepted(store, "Libraries used: matplotlib", "Third-party libraries past sessions used:\n- matplotlib",
                 [cite(s1, q2, "with matplotlib")])
    s2, [q3] = said(host, "both", "Both yaml and matplotlib again, plus numpy.")
    [(text, error)] = propose(host, [s2], ("propose_memory", {
        "title": "Libraries used: matplotlib, numpy, yaml",
        "text": "Third-party libraries past sessions used:\n- matplotlib\n- numpy\n- yaml",
        "provenance": [cite(s2, q3, "yaml and matplotlib again, plus numpy")]}))
    assert not error and "merge of" in text
    [merge] = [m for m in live(store) if m["status"] == "proposed"]
    assert merge["proposal"] == "merge" and sorted(merge["targets"]) == sorted([a["id"], b["id"]])
    assert merge["text"] == "Third-party libraries past sessions used:\n- matplotlib\n- numpy\n- yaml"
    store.review(merge["id"], "accept", "person:ann")
    assert [m["title"] for m in live(store)] == ["Libraries used: matplotlib, numpy, yaml"]


@pytest.mark.parametrize(("first", "other"), [
    ("Libraries used: numpy", "Libraries used: yaml"),
    ("Always use polars for dataframes.", "Always use pandas for dataframes."),
    ("pandas: call read_parquet for large files.", "polars: call scan_parquet for large files."),
    ("The API rate limit is 100 requests per minute.", "The API timeout is 30 seconds."),
    ("Use black for formatting Python code.", "Use ruff for linting Python code."),
    ("Never print secrets in notebooks.", "Print the secrets' names in notebooks."),
    # the same planted markup quoted in a preference and in an error (tests/ui/hostile.py): its tag is not a fact
    ("""Always keep <img src=x onerror="top.wbXss='pref'"> as text.""",
     """Fix for ValueError: "'></pre><img src=x onerror="top.wbXss='error'">"""),
])
def test_facts_about_different_things_stay_apart(fresh, first, other):
    host = fresh(models)
    store = host.plugin("memory").store
    s1, [q1] = said(host, "one", first)
    accepted(store, first, first, [cite(s1, q1, first)])
    s2, [q2] = said(host, "two", other)
    [(text, error)] = propose(host, [s2], ("propose_memory", {"title": other, "text": other,
                                                              "provenance": [cite(s2, q2, other)]}))
    assert not error and "(new memory)" in text
    assert sorted(m["title"] for m in live(store)) == sorted([first, other])


def test_a_repeat_with_nothing_new_is_refused_and_staged_overlaps_are_not_proposed_twice(fresh):
    host = fresh(models)
    store = host.plugin("memory").store
    s1, [q1, q2] = said(host, "one", "Store credentials in the vault, never in notebooks.",
                        "Large files should be converted to parquet before analysis.")
    old = accepted(store, "Vault", "Store credentials in the vault, never in notebooks.",
                   [cite(s1, q1, "credentials in the vault")])
    results = propose(host, [s1],
                      ("propose_memory", {"title": "Credentials", "text": "Credentials: in the vault, never in notebooks.",
                                          "provenance": [cite(s1, q1, "credentials in the vault")]}),
                      ("propose_memory", {"title": "Parquet", "text": "Large files should be converted to parquet before analysis.",
                                          "provenance": [cite(s1, q2, "converted to parquet")]}),
                      ("propose_memory", {"title": "Big files", "text": "Before analysing big files, turn them into parquet first.",
                                          "provenance": [cite(s1, q2, "converted to parquet")]}))
    assert results[0][1] and f"memory {old['id']} (accepted) already says this" in results[0][0]
    assert not results[1][1] and "(new memory)" in results[1][0]
    assert results[2][1] and "(staged in this dream) already says this" in results[2][0]


def test_stemmed_recall_finds_the_dataframe_library_by_its_plural(fresh):
    """"dataframe library" matches "Dataframes ... libraries" only once words are stemmed; unstemmed, the
    pandas memory came first on "use" alone."""
    host = fresh()
    store = host.plugin("memory").store
    polars = accepted(store, "Dataframes", "Dataframes: the libraries we standardise on are polars.", [])
    pandas = accepted(store, "Plots", "We use pandas for quick plots.", [])
    out = recall(store, {"query": "Which dataframe library should I use?"}, None)
    assert [r["id"] for r in out.details["recalled"]] == [polars["id"], pandas["id"]]


def test_embeddings_are_computed_once_per_memory_version(fresh):
    host = fresh()
    store = host.plugin("memory").store
    m = accepted(store, "Vault", "Store credentials in the vault.", [])
    cache = Embeddings()
    cache.of([m])
    first = cache._items[m["id"]]
    cache.of([m])
    assert cache._items[m["id"]] is first  # the same version: nothing computed again
    edited = store.review(m["id"], "edit", "person:ann", text="Store every credential in the vault.")
    cache.of([edited])
    assert cache._items[m["id"]] is not first and len(cache) == 1


def test_a_statement_is_the_title_without_its_label_and_the_first_line():
    assert statement_text({"title": "Note: the vault", "text": "Keys go there.\n(the user)"}) == "the vault\nKeys go there."
    a, b = Statement.of("Never use pandas for plots"), Statement.of("Use pandas for plots")
    v = embed(["Never use pandas for plots", "Use pandas for plots"])
    assert relation(a, b, float(v[0] @ v[1])) is None  # the other way round: a contradiction, not a duplicate
