"""The memory tool (Anthropic's `memory_20250818`) over the memory stores: through the fake Messages API and the
official SDK, through the scripted model, with hostile input, concurrent writers and the review panel."""

from __future__ import annotations

# memcommands (the SDK's memory tool: the whole Anthropic SDK, about 2 s of CPU) is imported by the tests that call it,
# not when a worker collects this file

import asyncio
import itertools

import pytest

from workbench.brain.models import Reply, ScriptedModel
from workbench.brain.tools import ToolContext
from workbench.memory.events import check_citations
from workbench.memory.memtool import memory_tool
from workbench.testing import FakeMessagesAPI
from wbmemory import build_host

MOUNTS = {"memory": {"stores": ["default", {"name": "team", "access": "read_only"}]}}
TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"  # the shape of a GitHub token: the secret guard knows it


def mem(command: str, **kw) -> tuple[str, dict]:
    return ("memory", {"command": command, **kw})


def accepted(store, title, text, *, store_name="default", actor="dream:d1"):
    mid = store.create(title=title, text=text, actor=actor, store=store_name,
                       provenance=[{"session_id": "sess-1", "seq": 4, "quote": "a quote of eight"}])
    return store.review(mid, "accept", "person:ann")


def versions(store) -> int:
    cur = store.log.cursor()
    try:
        return cur.execute("SELECT count(*) FROM memory_versions").fetchone()[0]
    finally:
        cur.close()


SCRIPTS = itertools.count()  # a brain keeps the models it made by name: each script gets a name of its own


def scripted_turn(host, calls, *, config=MOUNTS, title="notes") -> tuple[str, list[dict]]:
    """A session whose scripted model makes each call in its own step, then ends: its id and tool results."""
    replies = [Reply(text="working", tool_calls=[c]) for c in calls] + [Reply(text="done")]
    host.brain.model_factory = lambda name: ScriptedModel(replies, name=name)
    model = f"rememberer{next(SCRIPTS)}"
    sid = host.brain.create_session(title=title, model=model, tools=["memory"], config=config)["id"]
    assert asyncio.run(host.brain.run_turn(sid, "keep notes")) == "end_turn"
    return sid, [e.payload for e in host.log.events(sid, types=["tool_result"])]


def text_of(result: dict) -> str:
    return result["content"][0]["text"]


def test_a_session_through_the_fake_api_views_creates_edits_and_deletes_memories(fresh, monkeypatch):
    host = fresh()
    store = host.plugin("memory").store
    pandas = accepted(store, "Prefer pandas", "Prefer pandas for data frames.")
    accepted(store, "team.md", "The team reviews on Fridays.", store_name="team")
    old_file = f"/memories/default/prefer-pandas-{pandas['id']}.md"
    steps = [mem("view", path="/memories"),
             mem("create", path="/memories/default/notes.md", file_text="Use polars for data frames.\nTests: -m 'not slow'."),
             mem("str_replace", path="/memories/default/notes.md", old_str="polars", new_str="duckdb"),
             mem("view", path="/memories/default/notes.md"),
             mem("delete", path=old_file),
             mem("view", path="/memories/default"),
             mem("create", path="/memories/default/token.md", file_text=f"The deploy token is {TOKEN}"),
             mem("create", path="/memories/team/mine.md", file_text="Mine now."),
             mem("str_replace", path="/memories/team/team.md", old_str="Fridays", new_str="Mondays")]
    replies = [Reply(text="", tool_calls=[s]) for s in steps] + [Reply(text="noted")]
    with FakeMessagesAPI(replies) as api:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-a-real-key")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        sid = host.brain.create_session(title="notes", model="anthropic:claude-test", tools=["memory"], config=MOUNTS)["id"]

        async def turn() -> str:  # the SDK's client is closed on the loop it was made on
            try:
                return await host.brain.run_turn(sid, "remember how we test")
            finally:
                await host.brain.close()

        assert asyncio.run(turn()) == "end_turn"
    # the SDK sent the memory tool as the API defines it, with its beta header; the fake API refused nothing
    assert api.rejections == [] and len(api.requests) == len(steps) + 1
    assert all(r["tools"] == [{"type": "memory_20250818", "name": "memory"}] for r in api.requests)
    from workbench.memory.memcommands import SessionMemory

    assert memory_tool(store).spec() == SessionMemory(store).to_dict()  # the declaration is the SDK's
    results = [e.payload for e in host.log.events(sid, types=["tool_result"])]
    started = {e.payload["tool_use_id"]: e.seq for e in host.log.events(sid, types=["tool_started"])}
    root, made, edited, shown, deleted, listing, secret, read_only, read_only_edit = results

    assert not root["is_error"]
    assert "/memories/default\n" in text_of(root) and "/memories/team/team.md" in text_of(root)
    assert f"prefer-pandas-{pandas['id']}.md" in text_of(root) and "team is mounted read-only" in text_of(root)
    # create: a proposal of the session's own, cited to its call, version 1 by agent:<session>
    note = made["memory_writes"][0]
    assert not made["is_error"] and text_of(made).startswith("File created successfully at: /memories/default/notes.md")
    m = store.get(note["id"])
    assert (m["status"], m["store"], m["created_by"], m["title"]) == ("proposed", "default", f"agent:{sid}", "notes.md")
    assert [(v["version"], v["actor"], v["action"]) for v in m["history"]] == [(1, f"agent:{sid}", "propose"),
                                                                               (2, f"agent:{sid}", "edit")]
    assert m["text"] == "Use duckdb for data frames.\nTests: -m 'not slow'."
    assert m["history"][0]["provenance"] == [{"session_id": sid, "seq": started[made["tool_use_id"]],
                                              "quote": "/memories/default/notes.md"}]
    assert m["provenance"][-1]["seq"] == started[edited["tool_use_id"]]  # each write cites its own call
    assert "Use duckdb for data frames." in text_of(edited)
    assert text_of(shown) == ("Here's the content of /memories/default/notes.md with line numbers:\n"
                              "     1\tUse duckdb for data frames.\n     2\tTests: -m 'not slow'.")
    # deleting an accepted memory of a store whose writes are proposals: a retire proposal, the memory stays accepted
    retire = store.get(deleted["memory_writes"][0]["id"])
    assert (retire["proposal"], retire["targets"], retire["status"]) == ("retire", [pandas["id"]], "proposed")
    assert store.get(pandas["id"])["status"] == "accepted"
    assert "prefer-pandas" not in text_of(listing) and "/memories/default/notes.md" in text_of(listing)
    assert "waiting for a person's review" in text_of(listing)
    # refused, nothing written: a secret, a read-only mount
    assert secret["is_error"] and "GitHub Token" in text_of(secret) and TOKEN not in text_of(secret)
    assert read_only["is_error"] and "mounted read-only" in text_of(read_only)
    assert read_only_edit["is_error"] and "mounted read-only" in text_of(read_only_edit)
    assert {x["title"] for x in store.list()} == {"Prefer pandas", "team.md", "notes.md"}
    # what the memory tool read or wrote is memory, not evidence a dream may cite
    problems = check_citations(host.log, [{"session_id": sid, "seq": started[made["tool_use_id"]],
                                           "quote": "/memories/default/notes.md"}], scope=None, required=True)
    assert len(problems) == 1 and "not evidence" in problems[0]


def test_a_store_that_accepts_tool_writes_tells_the_next_session(fresh):
    host = fresh(tool_accept_stores="default")
    store = host.plugin("memory").store
    sid, (made, edited, inserted, renamed) = scripted_turn(host, [
        mem("create", path="/memories/default/project/testing.md", file_text="Run the fast tier first."),
        mem("str_replace", path="/memories/default/project/testing.md", old_str="fast", new_str="quick"),
        mem("insert", path="/memories/default/project/testing.md", insert_line=1, insert_text="Then the slow tier."),
        mem("rename", old_path="/memories/default/project/testing.md", new_path="/memories/default/project/tests.md")])
    assert not any(r["is_error"] for r in (made, edited, inserted, renamed)), [text_of(r) for r in (made, edited, inserted, renamed)]
    m = store.get(made["memory_writes"][0]["id"])
    assert (m["status"], m["title"], m["text"]) == ("accepted", "project/tests.md", "Run the quick tier first.\nThen the slow tier.")
    assert [(v["action"], v["status"], v["actor"]) for v in m["history"]] == [("create", "accepted", f"agent:{sid}")] + \
        [("edit", "accepted", f"agent:{sid}")] * 3
    assert "(accepted: in effect for the sessions that mount default)" in text_of(renamed)
    other = host.brain.create_session(title="later", model="capture", message="how do we run the tests?")["id"]
    assert "Run the quick tier first." in host.log.events(other, until=1)[0].payload["system"]
    # a second session deletes it: accepted at once here, so retired
    _, (deleted,) = scripted_turn(host, [mem("delete", path="/memories/default/project/tests.md")])
    assert not deleted["is_error"] and store.get(m["id"])["status"] == "retired"


def test_own_proposals_stand_in_for_the_memories_they_change(fresh):
    host = fresh()
    store = host.plugin("memory").store
    base = accepted(store, "style.md", "Four spaces.", actor="person:ann")
    sid, results = scripted_turn(host, [
        mem("str_replace", path="/memories/default/style.md", old_str="Four", new_str="Two"),
        mem("view", path="/memories/default/style.md"),
        mem("str_replace", path="/memories/default/style.md", old_str="Two", new_str="Eight"),
        mem("delete", path="/memories/default/style.md"),
        mem("view", path="/memories/default/style.md"),
        mem("create", path="/memories/default/style.md", file_text="Tabs.")])
    first, view, second, deleted, gone, again = results
    edit = store.get(first["memory_writes"][0]["id"])
    assert (edit["proposal"], edit["targets"], edit["title"]) == ("edit", [base["id"]], "style.md")
    assert "Two spaces." in text_of(view)
    assert second["memory_writes"][0]["id"] == edit["id"]  # its own proposal gets a new version, not another proposal
    assert store.get(edit["id"])["status"] == "retired"  # withdrawn by the delete
    retire = [w for w in deleted["memory_writes"] if w["proposal"] == "retire"]
    assert len(retire) == 1 and store.get(retire[0]["id"])["targets"] == [base["id"]]
    assert gone["is_error"] and "does not exist" in text_of(gone)
    assert not again["is_error"], text_of(again)
    # people still see the accepted memory until they accept a proposal; another session sees it unchanged
    assert store.get(base["id"])["text"] == "Four spaces." and store.get(base["id"])["status"] == "accepted"
    _, (other,) = scripted_turn(host, [mem("view", path="/memories/default/style.md")])
    assert "Four spaces." in text_of(other)
    # accepted by a person, the edit chain is the usual one: the proposal supersedes its target
    store.review(retire[0]["id"], "reject", "person:ann")
    newest = store.get(again["memory_writes"][0]["id"])
    store.review(newest["id"], "accept", "person:ann")
    assert store.get(newest["id"])["status"] == "accepted"


HOSTILE = [
    mem("view", path="/etc/passwd"),
    mem("view", path="memories/default"),
    mem("view", path="/memoriesx/default"),
    mem("create", path="/memories/default/../team/x.md", file_text="escape"),
    mem("create", path="/memories/../../etc/passwd", file_text="escape"),
    mem("create", path="/memories/default/./x.md", file_text="dot"),
    mem("create", path="/memories/default/.hidden", file_text="hidden"),
    mem("create", path="/memories/default/a//b.md", file_text="empty segment"),
    mem("create", path="/memories/default/" + "/".join(["d"] * 7) + "/f.md", file_text="deep"),
    mem("create", path="/memories/default/" + "n" * 90 + "/" + "n" * 90 + "/" + "n" * 30 + ".md", file_text="long"),
    mem("create", path="/memories/default/a\x00b.md", file_text="nul in path"),
    mem("create", path="/memories/default/nul.md", file_text="a\x00b"),
    mem("create", path="/memories/default/big.md", file_text="x" * 10_001),
    mem("create", path="/memories/default/huge.md", file_text="y" * 200_000),
    mem("create", path="/memories/default/blank.md", file_text="   \n"),
    mem("create", path="/memories/default/spaced name.md", file_text="spaces"),
    mem("create", path="/memories", file_text="the root"),
    mem("create", path="/memories/default", file_text="a store"),
    mem("create", path="/memories/nowhere/x.md", file_text="unmounted"),
    mem("create", path=7, file_text="not a string"),
    mem("create", path="/memories/default/x.md"),
    mem("explode", path="/memories"),
    ("memory", {"path": "/memories"}),
    ("memory", "not an object"),
    mem("insert", path="/memories/default/seed.md", insert_line=True, insert_text="flag"),
    mem("insert", path="/memories/default/seed.md", insert_line=99, insert_text="far"),
    mem("view", path="/memories/default/seed.md", view_range=[5, 1]),
    mem("str_replace", path="/memories/default/seed.md", old_str="", new_str="x"),
    mem("str_replace", path="/memories/default/seed.md", old_str="line", new_str="x"),
    mem("str_replace", path="/memories/default/seed.md", old_str="seed", new_str="y" * 10_001),
    mem("rename", old_path="/memories/default/seed.md", new_path="/memories/team/seed.md"),
    mem("rename", old_path="/memories/default/seed.md", new_path="/memories/default/dir/other.md"),
    mem("create", path="/memories/default/seed.md/under.md", file_text="a file is no directory"),
    mem("delete", path="/memories/default/dir"),
    mem("delete", path="/memories"),
]


def test_hostile_paths_and_inputs_are_tool_errors_that_write_nothing(fresh):
    host = fresh(tool_accept_stores="*")
    store = host.plugin("memory").store
    accepted(store, "seed.md", "seed line one\nseed line two")
    accepted(store, "dir/other.md", "another file")
    before = versions(store)
    sid, results = scripted_turn(host, HOSTILE)
    assert len(results) == len(HOSTILE)
    for (_, inp), r in zip(HOSTILE, results, strict=True):
        assert r["is_error"], (inp, text_of(r))
        assert "\n" not in text_of(r) and len(text_of(r)) < 600, (inp, text_of(r))  # one line to act on
    said = [text_of(r) for r in results]
    assert "outside /memories" in said[0] and "holds '..'" in said[3] and "holds '.'" in said[5]
    assert "at most 6" in said[8] and "at most 200" in said[9] and "NUL" in said[10] and "NUL" in said[11]
    assert "at most 10,000" in said[12] and "at most 10,000" in said[13] and "empty" in said[14]
    assert "there is no /memories/nowhere" in said[18] and "command must be one of" in said[21]
    assert "Multiple occurrences" in said[28] and "different stores" in said[30] and "already exists" in said[31]
    assert "directory of 1 files" in said[33]
    assert versions(store) == before  # nothing of any of it was written
    # a lone surrogate cannot come from a model (the log keeps only UTF-8); called directly it is refused all the same
    from workbench.memory.memcommands import call

    call_id = host.log.events(sid, types=["tool_started"])[0].payload["tool_use_id"]
    ctx = ToolContext(sid, hands=None, log=host.log, tool_use_id=call_id)  # type: ignore[arg-type]
    out = call(store, {"command": "create", "path": "/memories/default/s.md", "file_text": "half \ud800 a pair"}, ctx)
    assert out.is_error and "lone surrogate" in out.content[0]["text"]
    out = call(store, {"command": "create", "path": "/memories/default/\udfff.md", "file_text": "text"}, ctx)
    assert out.is_error and "surrogate" in out.content[0]["text"]
    assert versions(store) == before


def test_concurrent_writers_to_one_memory_lose_no_edit(fresh):
    host = fresh(tool_accept_stores="default")
    store = host.plugin("memory").store
    lines = [f"line {i}: todo" for i in range(6)]
    shared = accepted(store, "shared.md", "\n".join(lines))

    def writer(i: int):
        return ScriptedModel([Reply(text="", tool_calls=[mem("str_replace", path="/memories/default/shared.md",
                                                             old_str=f"line {i}: todo", new_str=f"line {i}: done by {i}")]),
                              Reply(text="done")], name=f"w{i}")

    host.brain.model_factory = lambda name: writer(int(name[1:]))
    ids = [host.brain.create_session(title=f"w{i}", model=f"w{i}", tools=["memory"])["id"] for i in range(6)]

    async def all_at_once() -> list[str]:
        return await asyncio.gather(*(host.brain.run_turn(sid, "mark yours done") for sid in ids))

    assert asyncio.run(all_at_once()) == ["end_turn"] * 6
    said = [text_of(e.payload) for sid in ids for e in host.log.events(sid, types=["tool_result"]) if e.payload["is_error"]]
    assert said == []  # none gave up (each retry reads the writes that made it retry)
    m = store.get(shared["id"])
    assert m["text"] == "\n".join(f"line {i}: done by {i}" for i in range(6))
    history = m["history"][2:]  # after the dream's proposal and the person's accept
    assert [v["version"] for v in history] == list(range(3, 9))
    assert sorted(v["actor"] for v in history) == sorted(f"agent:{sid}" for sid in ids)
    # two sessions creating one path under review: each its own proposal, neither lost
    host.plugin("memory").settings.tool_accept_stores = ""
    a = host.brain.create_session(title="a", model="c0", tools=["memory"])["id"]
    b = host.brain.create_session(title="b", model="c1", tools=["memory"])["id"]
    create = Reply(text="", tool_calls=[mem("create", path="/memories/default/same.md", file_text="first come")])
    host.brain.model_factory = lambda name: ScriptedModel([create, Reply(text="done")], name=name)

    async def both() -> list[str]:
        return await asyncio.gather(host.brain.run_turn(a, "note"), host.brain.run_turn(b, "note"))

    assert asyncio.run(both()) == ["end_turn"] * 2
    made = [x for x in store.list(status="proposed") if x["title"] == "same.md"]
    assert sorted(x["created_by"] for x in made) == sorted([f"agent:{a}", f"agent:{b}"])


def test_the_review_panel_shows_the_tool_proposals_with_their_call(fresh):
    from workbench.memory.panels.review import ReviewApp

    host = fresh()
    store = host.plugin("memory").store
    sid, (made,) = scripted_turn(host, [mem("create", path="/memories/default/deploys.md", file_text="Deploy on Tuesdays.")])
    mid = made["memory_writes"][0]["id"]
    app = ReviewApp(store, actor="person:ann")
    assert mid in app.memories.options.values()
    app.memories.value = mid
    assert "deploys.md" in app.detail.object and f"agent:{sid}" in app.detail.object
    app.provenance.objects[0][0].clicks += 1
    seq = store.get(mid)["provenance"][0]["seq"]
    assert f"around #{seq}" in app.source_pane.object and '<mark class="wb-quote">' in app.source_pane.object
    app.accept_button.clicks += 1
    assert store.get(mid)["status"] == "accepted" and store.get(mid)["history"][-1]["actor"] == "person:ann"


def test_the_fake_api_checks_the_memory_tool_declaration():
    api = FakeMessagesAPI([Reply(text="hi")])
    req = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}],
           "tools": [{"type": "memory_20250818", "name": "memory"}]}
    assert api.check(req, ("context-management-2025-06-27",)) is None
    assert "requires the beta header context-management-2025-06-27" in api.check(req, ())
    assert "Extra inputs" in api.check({**req, "tools": [{"type": "memory_20250818", "name": "memory", "input_schema": {}}]},
                                       ("context-management-2025-06-27",))
    assert "Input should be 'memory'" in api.check({**req, "tools": [{"type": "memory_20250818", "name": "notes"}]}, None)
    assert "input_schema: Field required" in api.check({**req, "tools": [{"name": "python"}]}, None)


def load_example():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "cassettes" / "memory_tool.py"
    spec = importlib.util.spec_from_file_location("memory_tool_example", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_memory_tool_cassette_replays_offline_and_is_current(tmp_path, monkeypatch):
    from workbench.hands.factory import HandsSettings
    from workbench.host import Host, HostSettings

    example = load_example()
    hands = HandsSettings(pool_size=0, registry_dir=str(tmp_path / "kernels"))

    async def replay() -> tuple[str, list[dict], list]:
        async with Host.open(tmp_path / "rep.duckdb", hands=hands, settings=HostSettings(cassette=str(example.CASSETTE))) as host:
            sid = await example.run(host)
            return sid, host.plugin("memory").store.list(), host.models.cassette.unplayed()

    sid, memories, unplayed = asyncio.run(replay())  # no key, no fake API: the cassette answers, the tool runs for real
    assert unplayed == []
    assert [(m["title"], m["status"], m["created_by"], m["text"]) for m in memories] == [
        ("testing.md", "proposed", f"agent:{sid}", "Run the fast tier first (about a minute and a half): pytest -m 'not slow'.")]
    assert [c["quote"] for c in memories[0]["provenance"]] == [example.NOTE, example.NOTE]

    with FakeMessagesAPI(example.script, key=example.SIGNING_KEY) as api:  # recorded again: the same bytes
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-a-real-key")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        fresh = tmp_path / "fresh.jsonl"

        async def record() -> None:
            async with Host.open(tmp_path / "rec.duckdb", hands=hands,
                                 settings=HostSettings(cassette=str(fresh), cassette_mode="record")) as host:
                await example.run(host)

        asyncio.run(record())
    assert fresh.read_bytes() == example.CASSETTE.read_bytes(), \
        "examples/cassettes/memory_tool.jsonl is stale: run python examples/cassettes/memory_tool.py --record"


def test_a_bad_store_name_in_tool_accept_stores_stops_the_host(tmp_path):
    from workbench.errors import ConfigError
    from workbench.memory.plugin import MemoryPlugin
    from workbench.memory.store import MemorySettings

    with pytest.raises(ConfigError, match="WORKBENCH_MEMORY_TOOL_ACCEPT_STORES: store name 'Team Data' is not valid"):
        build_host(tmp_path / "bad.duckdb", tmp_path, plugins=[MemoryPlugin(settings=MemorySettings(tool_accept_stores="default, Team Data"))])
    assert MemorySettings(tool_accept_stores=" team , *").accepts_tool_writes("anything")
    assert not MemorySettings(tool_accept_stores="team").accepts_tool_writes("default")


def test_an_edit_is_refused_for_a_secret_it_adds_not_for_one_a_person_kept(fresh):
    host = fresh(tool_accept_stores="default")
    store = host.plugin("memory").store
    kept = accepted(store, "keys.md", f"Old note.\nThe rotated token was {TOKEN}")  # a person's decision to keep it
    other = "ghp_" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2"
    _, (cut, added) = scripted_turn(host, [
        mem("str_replace", path="/memories/default/keys.md", old_str="Old note.\n", new_str=""),
        mem("str_replace", path="/memories/default/keys.md", old_str="The rotated", new_str=f"Use {other}; the rotated")])
    assert not cut["is_error"], text_of(cut)
    assert added["is_error"] and "GitHub Token" in text_of(added) and other not in text_of(added)
    assert store.get(kept["id"])["text"] == f"The rotated token was {TOKEN}"
