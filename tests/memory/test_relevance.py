"""Current and relevant memory: supersession, ranked injection with dates and provenance, the recall tool, contradictions."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError

from workbench.brain.models import Reply, ScriptedModel
from workbench.errors import ConfigError, MemoryConflict, UnknownMemory
from workbench.memory.dream import create_dream, run_dream
from wbmemory import SYSTEMS, build_host, model_factory

WORKBENCH = str(Path(sys.executable).parent / "workbench")


def wb(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([WORKBENCH, *args], capture_output=True, text=True, timeout=120)


EVIDENCE = [{"session_id": "sess-pandas-1", "seq": 4, "quote": "we use pandas here"}]
CORRECTION = [{"session_id": "sess-polars-2", "seq": 7, "quote": "pandas is banned now"},
              {"session_id": "sess-polars-3", "seq": 2, "quote": "switch to polars"}]


def accepted(store, title, text, provenance=(), tags=None):
    mid = store.create(title=title, text=text, actor="dream:d1", provenance=list(provenance), tags=tags)
    return store.review(mid, "accept", "person:ann")


def count(store, table):
    cur = store.log.cursor()
    try:
        return cur.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        cur.close()


def prompt_of(host, title=None, message=None):
    """Create a session as `workbench run` does (title and first message), run one turn; its system prompt and injected event."""
    SYSTEMS.clear()
    sid = host.brain.create_session(title=title, model="capture", message=message)["id"]
    assert asyncio.run(host.brain.run_turn(sid, message or "hello")) == "end_turn"
    injected = host.log.events(sid, types=["memories_injected"])
    return SYSTEMS[0], (injected[0].payload if injected else None)


def test_a_superseding_correction_is_the_only_one_in_a_new_sessions_prompt_with_its_date_and_sources(fresh):
    host = fresh()
    store = host.plugin("memory").store
    old = accepted(store, "Prefer pandas", "Prefer pandas for data frames.", EVIDENCE)
    new = accepted(store, "Never use pandas", "Never use pandas: the project moved to polars.", CORRECTION)
    after = store.review(old["id"], "supersede", "person:bob", by=new["id"], note="the project moved")

    assert after["status"] == "superseded" and after["history"][-1]["action"] == "supersede"
    assert after["superseded_by"][0]["id"] == new["id"] and after["superseded_by"][0]["actor"] == "person:bob"
    assert after["current"] == new["id"]
    assert store.get(new["id"])["supersedes"][0]["id"] == old["id"]  # the reviewer sees the chain both ways

    system, injected = prompt_of(host, title="load a csv", message="Load the sales csv with pandas and plot it")
    assert "Never use pandas" in system and "Prefer pandas" not in system
    new = store.get(new["id"])
    # when it was accepted, by whom, and the sessions it came from, next to its id
    assert f"({new['id']}, accepted {new['updated_at'][:10]} by person:ann; from sessions sess-polars-2, sess-polars-3)" in system
    assert [m["id"] for m in injected["memories"]] == [new["id"]]
    only = injected["memories"][0]
    assert only["why"] == "relevant" and only["score"] > 0 and only["sessions"] == ["sess-polars-2", "sess-polars-3"]
    assert injected["ranked_by"] == "message" and injected["left_out"] == 0


def test_an_unresolved_contradiction_tells_a_new_session_only_the_newer_memory(fresh):
    """Two accepted memories that contradict each other and that no review resolved: a new session is told
    the newer one only (the later decision), and its log says which was held back, by which and why.
    Accepting a change of the older one makes it the newer; superseding resolves the pair."""
    host = fresh()
    store = host.plugin("memory").store
    old = accepted(store, "Prefer pandas", "Prefer pandas for data frames.", EVIDENCE)
    new = accepted(store, "Never use pandas", "Never use pandas: the project moved to polars.", CORRECTION)
    other = accepted(store, "Plots", "Label both axes of every plot.")

    system, injected = prompt_of(host, message="Load the sales csv with pandas")
    assert "Never use pandas" in system and "Prefer pandas" not in system and "Label both axes" in system
    assert sorted(m["id"] for m in injected["memories"]) == sorted([new["id"], other["id"]])
    [held] = injected["held_back"]
    assert (held["id"], held["by"], held["title"]) == (old["id"], new["id"], "Prefer pandas") and "never" in held["why"]

    # the older one edited and accepted again: now it is the later decision
    edited = store.create(title="Prefer pandas", text="Prefer pandas for data frames, again.", actor="dream:d2",
                          provenance=list(EVIDENCE), proposal="edit", targets=[old["id"]])
    store.review(edited, "accept", "person:ann")
    system, injected = prompt_of(host, message="Load the sales csv with pandas")
    assert "Prefer pandas" in system and "Never use pandas" not in system, system
    assert [h["id"] for h in injected["held_back"]] == [new["id"]]

    # a person resolves it: nothing is held back, the superseded one is never told
    live = [m for m in store.list(status="accepted") if m["title"] == "Prefer pandas"][0]
    store.review(live["id"], "supersede", "person:bob", by=new["id"])
    system, injected = prompt_of(host, message="Load the sales csv with pandas")
    assert "Never use pandas" in system and "Prefer pandas" not in system and injected["held_back"] == []


def test_supersede_refuses_what_cannot_be_a_chain_and_writes_nothing(fresh):
    store = fresh().plugin("memory").store
    a = accepted(store, "Use tabs", "Indent with tabs.")
    b = accepted(store, "Never use tabs", "Never indent with tabs; use four spaces.")
    proposed = store.create(title="Use three spaces", text="Indent with three spaces.", actor="dream:d1", provenance=[])
    before = count(store, "memory_versions"), count(store, "memory_links")
    with pytest.raises(ConfigError, match="needs \"by\""):
        store.review(a["id"], "supersede", "person:ann")
    with pytest.raises(ConfigError, match="needs \"by\""):
        store.review(a["id"], "supersede", "person:ann", by=a["id"])
    with pytest.raises(UnknownMemory):
        store.review(a["id"], "supersede", "person:ann", by="m-nope")
    with pytest.raises(MemoryConflict, match="only an accepted memory can supersede"):
        store.review(a["id"], "supersede", "person:ann", by=proposed)
    store.review(a["id"], "supersede", "person:ann", by=b["id"])
    with pytest.raises(MemoryConflict, match="superseded already"):
        store.review(a["id"], "supersede", "person:ann", by=b["id"])
    with pytest.raises(MemoryConflict):  # b cannot be superseded by what it replaced (no cycles)
        store.review(b["id"], "supersede", "person:ann", by=a["id"])
    assert (count(store, "memory_versions"), count(store, "memory_links")) == (before[0] + 1, before[1] + 1)


def test_under_a_tight_budget_the_newest_relevant_memory_is_kept(fresh):
    host = fresh(inject_chars=900)
    store = host.plugin("memory").store
    filler = [accepted(store, f"Old note {i}", f"Old note number {i} about kernels and cores. " * 4) for i in range(4)]
    newest = accepted(store, "Never use pandas", "Never use pandas: the project moved to polars. " * 5, CORRECTION)

    system, injected = prompt_of(host, message="read the parquet file with pandas")
    assert "Never use pandas" in system  # oldest first, the old notes filled the budget and this was dropped
    assert injected["memories"][0]["id"] == newest["id"] and injected["left_out"] > 0
    assert len("# Memories" + system.split("# Memories", 1)[1]) <= 900

    # nothing relevant (no message, no title): the newest go first
    system, injected = prompt_of(host)
    assert injected["ranked_by"] == "recency" and injected["memories"][0]["id"] == newest["id"]
    assert [m["why"] for m in injected["memories"]] == ["recent"] * len(injected["memories"])
    assert filler[0]["title"] not in system


def test_ranking_puts_the_relevant_memory_first_for_a_matching_first_message(fresh):
    host = fresh()
    store = host.plugin("memory").store
    plots = accepted(store, "Plots use matplotlib", "Draw figures with matplotlib and label both axes.", EVIDENCE)
    accepted(store, "Division guard", "Guard divisions by zero with max(n, 1).")
    accepted(store, "JSON quotes", "JSON needs double quotes, not single quotes.")

    system, injected = prompt_of(host, title="figures", message="Plot revenue per month with matplotlib")
    assert [m["why"] for m in injected["memories"]] == ["relevant", "recent", "recent"]
    assert injected["memories"][0]["id"] == plots["id"]
    assert system.index("Plots use matplotlib") < system.index("Division guard")
    # a session created without its message is ranked by its title
    _, injected = prompt_of(host, title="matplotlib figure")
    assert injected["ranked_by"] == "title" and injected["memories"][0]["id"] == plots["id"]


def test_rank_and_contradiction_edges():
    from workbench.memory.relevance import contradiction, rank

    assert rank([], "anything") == []
    mems = [{"id": "a", "title": "the", "text": "a an", "tags": [], "updated_at": "2026-01-01"},
            {"id": "b", "title": "of", "text": "to", "tags": [], "updated_at": "2026-01-02"}]
    assert [(m["id"], s) for m, s in rank(mems, "the")] == [("b", 0.0), ("a", 0.0)]  # stop words only: by recency
    assert [s for _, s in rank(mems, "\ud800\udfff" + "x" * 100_000)] == [0.0, 0.0]
    prefer = {"id": "p", "title": "Prefer pandas", "text": "Prefer pandas for data frames."}
    never = {"id": "n", "title": "Never use pandas", "text": "Never use pandas: use polars."}
    other = {"id": "o", "title": "Guard zero", "text": "Never divide by zero."}
    assert "pandas" in contradiction(prefer, never) and "'never'" in contradiction(prefer, never)
    assert contradiction(prefer, other) is None and contradiction(never, never | {"id": "n2"}) is None


def test_contradictions_are_listed_side_by_side(fresh):
    store = fresh().plugin("memory").store
    old = accepted(store, "Prefer pandas", "Prefer pandas for data frames.", EVIDENCE)
    new = store.create(title="Never use pandas", text="Never use pandas: the project moved to polars.",
                       actor="dream:d2", provenance=CORRECTION)
    rows = {m["id"]: m for m in store.list()}
    assert [c["id"] for c in rows[new]["conflicts"]] == [old["id"]]
    assert rows[new]["conflicts"][0]["text"] == "Prefer pandas for data frames." and "never" in rows[new]["conflicts"][0]["why"]
    assert [c["id"] for c in rows[old["id"]]["conflicts"]] == [new]
    assert store.get(new)["conflicts"][0]["id"] == old["id"]
    # resolved: the proposal accepted and the old one superseded, nothing is in conflict any more
    store.review(new, "accept", "person:ann")
    store.review(old["id"], "supersede", "person:ann", by=new)
    assert all(not m["conflicts"] for m in store.list())


def recall_turn(host, inputs):
    """A scripted model that calls `recall` with each input, then ends; the tool results."""
    replies = [Reply(text="looking", tool_calls=[("recall", inp)]) for inp in inputs] + [Reply(text="done")]
    host.brain.model_factory = lambda name: ScriptedModel(replies, name=name)
    sid = host.brain.create_session(title="recall", model="recaller", tools=["python", "recall"])["id"]
    assert asyncio.run(host.brain.run_turn(sid, "what do we know?")) == "end_turn"
    return [e.payload for e in host.log.events(sid, types=["tool_result"])]


def found_session(host):
    return next(s["id"] for s in host.log.sessions() if s["title"] == "recall")


def test_the_recall_tool_in_a_scripted_turn_and_its_hostile_input(fresh):
    from workbench.memory.tools import recall

    host = fresh()
    store = host.plugin("memory").store
    old = accepted(store, "Prefer pandas", "Prefer pandas for data frames.")
    new = accepted(store, "Never use pandas", "Never use pandas: <script>alert(1)</script> use polars." + " x" * 2000, CORRECTION)
    store.review(old["id"], "supersede", "person:ann", by=new["id"])
    accepted(store, "Division guard", "Guard divisions by zero.")

    results = recall_turn(host, [{"query": "pandas data frames"}, {"query": "q" * 5000}, {"query": "\u202e\x00 naïve \U0001f600"},
                                 {"query": 7}, {"query": "pandas", "limit": True}, {"query": "pandas", "limit": 99},
                                 {"query": "nothing matches zebra"}])
    found, huge, lone, number, flag, many, none = results
    text = found["content"][0]["text"]
    assert not found["is_error"] and [r["id"] for r in found["recalled"]] == [new["id"]]  # superseded: never recalled
    assert text.startswith(f"[{new['id']}] Never use pandas (accepted {store.get(new['id'])['updated_at'][:10]} by person:ann; "
                           "from sessions sess-polars-2, sess-polars-3; score ")
    assert "<script>alert(1)</script>" in text and "more characters]" in text and len(text) < 2000  # bounded, text as text
    assert huge["is_error"] and "at most 2,000" in huge["content"][0]["text"]
    assert not lone["is_error"] and lone["recalled"] == []
    assert number["is_error"] and flag["is_error"] and many["is_error"]
    assert not none["is_error"] and "no accepted memory matches" in none["content"][0]["text"]
    # what recall returned is recalled memory, not evidence: a dream cannot cite it
    from workbench.memory.events import check_citations, render_event

    event = next(e for e in host.log.events(found_session(host), types=["tool_result"]) if e.payload.get("recalled"))
    problems = check_citations(host.log, [{"session_id": event.session_id, "seq": event.seq, "quote": "Never use pandas"}],
                               scope=None, required=True)
    assert len(problems) == 1 and "not evidence" in problems[0]
    assert render_event(event).endswith(f"(recalled memories, not evidence: {new['id']})")
    # a lone surrogate never reaches the tool from a model (the log refuses such a turn); called directly, its other words still find
    out = recall(store, {"query": "\ud800 pandas\udfff"}, None)
    assert not out.is_error and [r["id"] for r in out.details["recalled"]] == [new["id"]]


def dreamer(calls):
    def factory(name):
        if name == "dreamer":
            return ScriptedModel([Reply(tool_calls=[c]) for c in calls] + [Reply(text="done")], name=name)
        return model_factory(name)
    return factory


def test_a_dream_proposes_a_correction_that_supersedes_a_contradicted_memory(recorded, db_path, tmp_path):
    """The duckdb session says the user prefers duckdb over pandas: a dream proposes the correction of the
    accepted "Use pandas for queries" with `supersedes`, and is told when another proposal contradicts it."""
    host = build_host(db_path, tmp_path)
    try:
        store = host.plugin("memory").store
        old = accepted(store, "Use pandas for queries", "Use pandas for SQL-like queries.")
        sid = next(s for s in recorded if "duckdb" in host.log.session(s)["title"])
        seq = host.log.events(sid, types=["user_message"])[0].seq
        cite = [{"session_id": sid, "seq": seq, "quote": "I prefer duckdb over pandas for queries"}]
        host.brain.model_factory = dreamer([
            ("propose_memory", {"title": "Query with duckdb", "text": "Run SQL-like queries with duckdb, not pandas.",
                                "provenance": cite, "supersedes": [old["id"]]}),
            # not "The user said so.": that says nothing the first proposal does not, and is refused as staged already
            ("propose_memory", {"title": "Never use pandas for queries", "text": "Memory errors on the 2 GB sales tables.",
                                "provenance": cite}),
            ("propose_memory", {"title": "Use duckdb", "text": "Prefer duckdb.", "provenance": cite, "supersedes": [old["id"], 5]}),
            ("propose_memory", {"title": "Use duckdb", "text": "Prefer duckdb.", "provenance": cite, "supersedes": "<b>nope</b>"}),
        ])
        dream_id = create_dream(host.brain, store, sessions=recorded, model="dreamer")
        result = asyncio.run(run_dream(host.brain, store, dream_id))
        said = [e.payload for e in host.log.events(dream_id, types=["tool_result"])]
        assert not said[0]["is_error"] and f"superseding {old['id']}" in said[0]["content"][0]["text"]
        assert not said[1]["is_error"] and f"it contradicts memory {old['id']}" in said[1]["content"][0]["text"]
        assert said[2]["is_error"] and "no memory 5" in said[2]["content"][0]["text"]
        assert said[3]["is_error"] and "supersedes must be a list" in said[3]["content"][0]["text"]
        correction, contradicting = result["proposed"]
        assert store.get(correction)["targets"] == [old["id"]]
        assert [c["id"] for c in store.get(contradicting)["conflicts"]] == [old["id"]]  # the reviewer sees the pair

        store.review(correction, "accept", "person:ann")
        gone = store.get(old["id"])
        assert gone["status"] == "superseded" and gone["current"] == correction
        assert [(x["id"], x["kind"], x["actor"]) for x in gone["superseded_by"]] == [(correction, "create", "person:ann")]
        system, _ = prompt_of_host(host, "run a query over the sales table")
        assert "Run SQL-like queries with duckdb" in system and "Use pandas for SQL-like queries." not in system
    finally:
        asyncio.run(host.close())


def prompt_of_host(host, message):
    host.brain.model_factory = model_factory
    return prompt_of(host, message=message)


async def rest(jp_fetch, method, *path, body=None, params=None):
    """Send exactly `body` (bytes or JSON-able); the status and the JSON reply."""
    kw = {"method": method, "params": params}
    if body is not None:
        kw["body"] = body if isinstance(body, bytes) else json.dumps(body)
    try:
        r = await jp_fetch("workbench", "api", *path, **kw)
        return r.code, json.loads(r.body)
    except HTTPClientError as e:
        return e.code, json.loads(e.response.body)


async def test_contradictions_supersede_and_recall_over_rest_with_hostile_input(jp_serverapp, jp_fetch):
    store = jp_serverapp.web_app.settings["workbench_runtime"].host.plugin("memory").store
    old = accepted(store, "Prefer pandas", "Prefer pandas for data frames.", EVIDENCE)
    new = store.create(title="Never use pandas", text="Never use pandas: use polars. <script>alert(1)</script>",
                       actor="dream:d2", provenance=CORRECTION)

    code, listed = await rest(jp_fetch, "GET", "memories")
    rows = {m["id"]: m for m in listed["memories"]}
    assert code == 200 and [c["id"] for c in rows[new]["conflicts"]] == [old["id"]]
    assert rows[old["id"]]["conflicts"][0]["text"].endswith("<script>alert(1)</script>")  # JSON carries text as is

    def versions():
        return count(store, "memory_versions"), count(store, "memory_links")

    before = versions()
    hostile = [
        (b'{"action": "supersede", "by": "\\ud800"}', 400, "surrogate"),
        (b'{"action": "supersede", "by": "\xff"}', 400, "UTF-8"),
        ({"action": "supersede", "by": "m" * 100_000}, 400, "longer than"),
        ({"action": "supersede"}, 400, "by"),
        ({"action": "supersede", "by": ["x"]}, 400, "by"),
        ({"action": "supersede", "by": old["id"]}, 400, "newer, accepted memory"),
        ({"action": "supersede", "by": "<script>"}, 404, "no memory"),
        ({"action": "supersede", "by": new}, 409, "only an accepted memory can supersede"),
        ({"action": "supersede", "by": new, "with": [new]}, 400, "with"),
    ]
    for body, status, says in hostile:
        code, err = await rest(jp_fetch, "PATCH", "memories", old["id"], body=body)
        assert (code, says in err["error"]) == (status, True), (body, err)
    assert versions() == before  # nothing written by a refused request

    await rest(jp_fetch, "PATCH", "memories", new, body={"action": "accept"})
    code, m = await rest(jp_fetch, "PATCH", "memories", old["id"], body={"action": "supersede", "by": new, "note": "moved"})
    assert code == 200 and m["status"] == "superseded" and m["superseded_by"][0]["id"] == new and m["current"] == new
    code, listed = await rest(jp_fetch, "GET", "memories")
    assert all(not x["conflicts"] for x in listed["memories"])

    code, found = await rest(jp_fetch, "GET", "recall", params={"q": "pandas frames"})
    assert code == 200 and [x["id"] for x in found["memories"]] == [new] and found["memories"][0]["score"] > 0
    code, found = await rest(jp_fetch, "GET", "recall", params={"q": "<script>alert(1)</script>", "limit": "20"})
    assert code == 200 and [x["id"] for x in found["memories"]] == [new]
    for params, says in (({"q": "x" * 2001}, "longer than 2,000"), ({"q": ""}, "q"), ({"q": "   "}, "q"), ({}, "q"),
                         ({"q": "pandas", "limit": "0"}, "between 1 and 20"), ({"q": "pandas", "limit": "abc"}, "limit"),
                         ({"q": "pandas", "limit": "1e9"}, "limit"), ({"q": "pandas", "x": "1"}, "unknown query argument")):
        code, err = await rest(jp_fetch, "GET", "recall", params=params)
        assert (code, says in err["error"]) == (400, True), (params, err)
    code, err = await rest(jp_fetch, "GET", "recall", params={"q": b"\xff\xfe"})
    assert code == 400 and "not valid UTF-8" in err["error"]
    code, err = await rest(jp_fetch, "GET", "recall", params={"q": b"\xed\xa0\x80"})  # a lone surrogate, encoded as UTF-8 would
    assert code == 400 and "not valid UTF-8" in err["error"]


def test_contradictions_and_supersede_from_the_command_line(tmp_path, fresh):
    db = tmp_path / "fresh0.duckdb"
    host = fresh()
    store = host.plugin("memory").store
    old = accepted(store, "Prefer pandas", "Prefer pandas for data frames.", EVIDENCE)
    new = accepted(store, "Never use pandas", "Never use pandas: use polars.", CORRECTION)
    asyncio.run(host.close())

    r = wb("memories", "--db", str(db))
    assert r.returncode == 0, r.stderr
    side = r.stdout.split("contradictions", 1)[1]
    assert f"{old['id']} (accepted" in side and f"vs {new['id']} (accepted" in side and "'never'" in side
    r = wb("memory", old["id"], "--action", "supersede", "--db", str(db))
    assert r.returncode == 2 and "needs --by NEW" in r.stderr  # the CLI names its own option
    r = wb("memory", old["id"], "--action", "supersede", "--by", new["id"], "--db", str(db))
    assert r.returncode == 0, r.stderr
    from workbench.memory.store import os_user  # the CLI reviews as the OS user, never as a claimed actor

    assert f"replaced by {new['id']} (accepted) 'Never use pandas': supersede by {os_user()}" in r.stdout
    assert f"in effect now: {new['id']}" in r.stdout
    r = wb("memories", "--db", str(db))
    assert "contradictions" not in r.stdout


async def test_post_sessions_ranks_memories_by_the_first_message_it_is_given(jp_serverapp, jp_fetch):
    """`first_message` in `POST /sessions` ranks the injected memories (it is not sent); without it the
    title does; a bad one is a 400 that creates no session."""
    runtime = jp_serverapp.web_app.settings["workbench_runtime"]
    store = runtime.host.plugin("memory").store
    plots = accepted(store, "Plots", "Plot with a white background and label both axes.")
    accepted(store, "Units", "Report temperatures in Celsius.")  # the newer one: first by recency alone

    async def injected_of(body):
        code, s = await rest(jp_fetch, "POST", "sessions", body=body)
        assert code == 201, s
        events = store.log.events(s["id"])
        assert [e.type for e in events] == ["session_created", "memories_injected"]  # nothing sent
        return events[1].payload

    first = await injected_of({"title": "Chat 4:11:18 PM", "first_message": "make a plot of the sales by week"})
    assert first["ranked_by"] == "message" and first["memories"][0]["id"] == plots["id"], first
    plain = await injected_of({"title": "Chat 4:11:18 PM"})
    assert plain["ranked_by"] == "title" and plain["memories"][0]["id"] != plots["id"], plain
    blank = await injected_of({"first_message": "   "})  # says nothing: as if not given
    assert blank["ranked_by"] == "recency"

    sessions = store.log.sessions()
    for body, says in (({"first_message": 7}, "first_message"), ({"first_message": "x" * 1_000_001}, "first_message"),
                       (b'{"first_message": "\\ud800"}', "surrogate"), ({"first_message": ["a"]}, "first_message")):
        code, err = await rest(jp_fetch, "POST", "sessions", body=body)
        assert code in (400, 413) and (code == 413 or says in err["error"]), (body, code, err)
    assert store.log.sessions() == sessions


def test_the_stop_words_are_bm25s_english_ones():
    """relevance reads them from bm25s's word-list module alone (tests/core/test_start.py: a listing of memories
    imports neither numpy nor scipy); they are the words bm25s itself uses."""
    from bm25s.stopwords import STOPWORDS_EN

    from workbench.memory.relevance import _stop

    assert _stop() == frozenset(STOPWORDS_EN) and "the" in _stop()
