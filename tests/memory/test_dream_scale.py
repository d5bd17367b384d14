"""Dreams at any scale: every session is listed and read, in chunks whose requests stay bounded, and a dream
cut off anywhere goes on (or shows that it must) instead of looking like it still runs."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from wbmemory import build_host

from workbench.brain.models import ScriptedModel
from workbench.memory.dream import create_dream, dream_status, run_dream
from workbench.memory.dream_script import dream_script
from workbench.memory.plugin import MemoryPlugin
from workbench.memory.store import MemorySettings

FILLER = ("We looked at the quarterly numbers again, compared them with the forecast, and wrote the summary "
          "the team asked for. Nothing here needs remembering. ") * 24  # ~3,000 characters: a small real session


def record(host, n: int, facts_every: int, seed: int = 7) -> tuple[list[str], dict[str, str]]:
    """n chat sessions written straight through the log (no agent turns); every facts_every-th states a preference.

    Returns the ids (oldest first) and, for the sessions with a preference, the sentence."""
    rnd = random.Random(seed)
    ids, facts = [], {}
    for i in range(n):
        sid = host.brain.create_session(title=f"report {i}", model="scripted")["id"]
        text = f"Summarise report {i}."
        if i % facts_every == 0:
            facts[sid] = f"Always keep the {rnd.getrandbits(96):024x} column sorted by {rnd.getrandbits(64):016x}."
            text += " " + facts[sid]

        def write(tx, sid=sid, text=text):
            tx.append(sid, "user_message", {"text": text})
            tx.append(sid, "assistant_turn", {"message": {"role": "assistant", "content": [{"type": "text", "text": FILLER}],
                                                          "stop_reason": "end_turn"}})
            tx.append(sid, "turn_ended", {"stop_reason": "end_turn"})

        host.log.write(write).result()
        ids.append(sid)
    return ids, facts


class Measured:
    """scripted:dream, remembering the size (JSON characters) of every request it answers."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __call__(self, request: dict):
        self.sizes.append(len(json.dumps(request)))
        return dream_script(request)

    def factory(self, name: str) -> ScriptedModel:
        return ScriptedModel(self, name=name)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # about 3 minutes alone; it passed the 300 s default while closing at load 9
def test_a_dream_over_500_sessions_works_in_bounded_chunks_and_a_second_proposes_nothing(db_path, tmp_path):
    measured = Measured()
    plugin = MemoryPlugin(settings=MemorySettings(dream_chunk_chars=30_000, dream_chunk_sessions=25))
    host = build_host(db_path, tmp_path, plugins=[plugin], model_factory=measured.factory, hands=False)
    try:
        ids, facts = record(host, 500, facts_every=20)
        store, brain = plugin.store, host.brain
        first = asyncio.run(run_dream(brain, store, create_dream(brain, store, model="dreamer")))
        assert first["stop_reason"] == "end_turn"
        # in chunks, each within the bound: a session reads as at least 2,000 characters (a dream sees 2,000 of an event)
        assert first["chunks"] >= 500 * 2000 // 30_000
        corpus = sum(len(FILLER) for _ in ids)
        # every request holds one chunk (plus the system prompt, tools and what the chunk proposes), never the corpus
        assert max(measured.sizes) < 30_000 * 2 + 20_000 < corpus // 10, max(measured.sizes)
        assert store.bookmarks() == {sid: store.log.session(sid)["last_seq"] for sid in ids}  # every session, newest too
        memories = store.list()
        assert sorted(m["title"] for m in memories) == sorted(f"Preference: {f[:60]}" for f in facts.values())
        assert {c["session_id"] for m in memories for c in m["provenance"]} == set(facts)
        # newest first by default: the first chunk read the newest sessions
        chunks = store.log.events(first["dream_id"], types=["dream_chunk"])
        assert chunks[0].payload["ranges"][0]["session_id"] == ids[-1]

        calls = len(measured.sizes)
        second = asyncio.run(run_dream(brain, store, create_dream(brain, store, model="dreamer")))
        assert second["stop_reason"] == "end_turn" and second["proposed"] == [] and second["chunks"] == 0
        assert len(measured.sizes) == calls and store.list() == memories  # nothing unread: no model call at all
        assert dream_status(store, second["dream_id"])["state"] == "done"
    finally:
        asyncio.run(host.close())


@pytest.mark.slow
def test_list_sessions_pages_over_every_session_newest_or_oldest_first(db_path, tmp_path):
    """110 sessions: the listing used to stop silently at 100, oldest first, so the newest 10 were never read."""
    for order in ("newest", "oldest"):
        path = tmp_path / f"{order}.duckdb"
        plugin = MemoryPlugin(settings=MemorySettings(dream_order=order))
        host = build_host(path, tmp_path, plugins=[plugin], model_factory=lambda name: ScriptedModel(dream_script, name=name),
                          hands=False)
        try:
            ids, _ = record(host, 110, facts_every=1000)
            store, brain = plugin.store, host.brain
            dream_id = create_dream(brain, store, model="lister")
            # one turn without chunks: the model lists (page after page) and reads what is unread
            assert asyncio.run(brain.run_turn(dream_id, "dream")) == "end_turn"
            events = store.log.events(dream_id)
            listed = [line.split()[0] for e in events if e.type == "tool_result" and e.payload["name"] == "list_sessions"
                      for line in e.payload["content"][0]["text"].splitlines() if "created=" in line]
            assert listed == (ids[::-1] if order == "newest" else ids)
            read = {e.payload["input"]["session_id"] for e in events if e.type == "tool_started" and e.payload["name"] == "read_events"}
            assert read == set(ids)
        finally:
            asyncio.run(host.close())


@pytest.mark.slow
def test_a_dream_cut_off_mid_chunk_is_unfinished_not_running_and_goes_on_when_resumed(db_path, tmp_path):
    from workbench.memory.dream import drive_dream

    plugin = MemoryPlugin(settings=MemorySettings(dream_chunk_sessions=2))
    host = build_host(db_path, tmp_path, plugins=[plugin], model_factory=lambda name: ScriptedModel(dream_script, name=name),
                      hands=False)
    try:
        ids, facts = record(host, 5, facts_every=1)
        store, brain = plugin.store, host.brain
        dream_id = create_dream(brain, store, model="dreamer")
        # what a process killed in its first chunk leaves behind: the chunk planned, its turn opened, nothing ended
        whole = {"session_id": ids[-1], "after": 0, "until": store.log.session(ids[-1])["last_seq"]}
        store.log.append(dream_id, "dream_chunk", {"ranges": [whole]})
        store.log.append(dream_id, "user_message", {"text": "Dream.\n- read_events " + json.dumps(whole)})
        status = dream_status(store, dream_id)
        assert status["state"] == "unfinished" and status["proposals"] == []  # nobody runs it: it says so
        done = asyncio.run(drive_dream(brain, store, dream_id))
        assert done["stop_reason"] == "end_turn"
        status = dream_status(store, dream_id)
        assert status["state"] == "done" and status["chunks"] == 3
        titles = [m["title"] for m in store.list()]
        assert sorted(titles) == sorted(f"Preference: {f[:60]}" for f in facts.values())
        kinds = [e.type for e in store.log.events(dream_id)]
        assert kinds.count("resumed") == 1 and kinds.count("dream_read") == 3 and kinds[-1] == "dream_ended"
    finally:
        asyncio.run(host.close())


def _request(results: list) -> dict:
    """A request whose one tool call of each step got these results."""
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Dream."}]}]
    for i, (name, content) in enumerate(results):
        msgs.append({"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": name, "input": {"title": "x"}}]})
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": content, "is_error": True}]})
    return {"messages": msgs}


@pytest.mark.parametrize("content", [
    "interrupted; state unknown", "", None, [], [{"type": "image", "source": {}}], [{"type": "text"}], ["not a block"],
    {"text": "a dict, not a list"}, 42, "x" * 2_000_000, "\ud800 lone surrogate\x00", "not proposed:", "not proposed:\n",
    "== session s \"t\": events #1..#2 of 2 ==\n#1 user_message\n  Always keep this\n#x broken",
])
@pytest.mark.parametrize("tool", ["list_sessions", "read_events", "read_memories", "propose_memory"])
def test_scripted_dream_takes_every_tool_result_shape(tool, content):
    for steps in ([(tool, content)], [("list_sessions", content), (tool, content)],
                  [("read_events", content), ("propose_memory", content)]):
        reply = dream_script(_request(steps))
        assert reply.text  # an answer, never an exception
    # a tool_use without input and a message whose content is not a list
    odd = {"messages": [{"role": "user", "content": "Dream."}, {"role": "assistant", "content": [{"type": "tool_use", "id": "a"}]},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": content}]}]}
    assert dream_script(odd).text


@pytest.mark.slow
def test_a_dream_left_uncommitted_then_resumed_after_another_dream_proposes_nothing_twice(db_path, tmp_path):
    """Dream A's chunk ends but its process dies before the commit; dream B reads the same sessions and commits;
    A is then resumed (or committed by a host's start): nothing B proposed is proposed again."""
    from workbench.memory.dream import commit_finished_dreams, next_chunk, chunk_text

    plugin = MemoryPlugin()
    host = build_host(db_path, tmp_path, plugins=[plugin], model_factory=lambda name: ScriptedModel(dream_script, name=name),
                      hands=False)
    try:
        ids, facts = record(host, 4, facts_every=2)
        store, brain = plugin.store, host.brain
        a = create_dream(brain, store, model="dreamer")
        ranges = next_chunk(store, a)
        store.log.append(a, "dream_chunk", {"ranges": ranges})
        assert asyncio.run(brain.run_turn(a, chunk_text(ranges, None))) == "end_turn"  # staged, never committed
        b = asyncio.run(run_dream(brain, store, create_dream(brain, store, model="dreamer")))
        assert len(b["proposed"]) == len(facts)
        committed = commit_finished_dreams(store)  # what any host's start does
        assert [c["dream_id"] for c in committed] == [a] and committed[0]["proposed"] == []
        done = asyncio.run(run_dream(brain, store, a))
        assert done["stop_reason"] == "end_turn" and done["proposed"] == []
        titles = [m["title"] for m in store.list()]
        assert sorted(titles) == sorted(f"Preference: {f[:60]}" for f in facts.values())
        dropped = store.log.events(a, types=["dream_read"])[0].payload["dropped"]
        assert {d["why"] for d in dropped} == {"already read by another dream"} and len(dropped) == len(facts)
    finally:
        asyncio.run(host.close())


@pytest.mark.slow
def test_a_cancelled_dream_runs_no_chunk_and_nothing_goes_on_with_it(db_path, tmp_path):
    from workbench.memory.dream import cancel_dream, list_dreams, unfinished_dreams

    plugin = MemoryPlugin(settings=MemorySettings(dream_chunk_sessions=1))
    host = build_host(db_path, tmp_path, plugins=[plugin], model_factory=lambda name: ScriptedModel(dream_script, name=name),
                      hands=False)

    async def go():
        await host.start()
        try:
            record(host, 3, facts_every=1)
            first = create_dream(host.brain, plugin.store, model="scripted:dream")
            done = await plugin.run_dream(first)
            second = create_dream(host.brain, plugin.store, model="scripted:dream")
            assert unfinished_dreams(plugin.store) == [second]  # created, never run: a server start would run it
            assert cancel_dream(plugin.store, second, "person:ann") and not cancel_dream(plugin.store, second, "person:ann")
            assert not cancel_dream(plugin.store, first, "person:ann")  # done: nothing to cancel
            assert unfinished_dreams(plugin.store) == [] and await plugin.wake() == []
            stopped = await plugin.drive(second)
            return done, stopped, second
        finally:
            await host.close()

    try:
        done, stopped, second = asyncio.run(go())
        assert done["stop_reason"] == "end_turn" and done["chunks"] == 3
        assert stopped["stop_reason"] == "cancelled" and stopped["chunks"] == 0
    finally:
        asyncio.run(host.close())
    read = build_host(db_path, tmp_path, read_only=True, hands=False)
    try:
        states = {d["id"]: d["state"] for d in list_dreams(read.plugin("memory").store)}
        assert states[second] == "cancelled" and sorted(states.values()) == ["cancelled", "done"]
        assert [e.payload["by"] for e in read.log.events(second, types=["dream_cancelled"])] == ["person:ann"]
        assert read.log.events(second, types=["dream_chunk", "user_message"]) == []
    finally:
        asyncio.run(read.close())


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_scheduled_dream_starts_every_interval_when_something_is_unread(db_path, tmp_path):
    plugin = MemoryPlugin(settings=MemorySettings(dream_interval=0.2, dream_model="scripted:dream"))
    host = build_host(db_path, tmp_path, plugins=[plugin], model_factory=lambda name: ScriptedModel(dream_script, name=name),
                      hands=False)
    await host.start()
    try:
        ids, facts = await asyncio.to_thread(record, host, 3, 1)
        store = plugin.store
        for _ in range(1200):  # the next tick starts a dream over what is unread, and it runs to its end
            dreams = store.log.sessions(kind="dream")
            if dreams and store.log.events(dreams[0]["id"], types=["dream_ended"]):
                break
            await asyncio.sleep(0.05)
        [d] = store.log.sessions(kind="dream")
        assert sorted(m["title"] for m in store.list(dream=d["id"])) == sorted(f"Preference: {f[:60]}" for f in facts.values())
        ticks = 0
        while ticks < 5:  # several ticks with nothing unread start nothing
            await asyncio.sleep(0.2)
            ticks += 1
        assert [s["id"] for s in store.log.sessions(kind="dream")] == [d["id"]]
    finally:
        await host.close()
    assert plugin._timer is not None and plugin._timer.done()  # closing the host stops the schedule
