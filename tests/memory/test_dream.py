"""A dream over recorded sessions: cited proposals, nothing new the second time, refusals the model can act on."""

from __future__ import annotations

import asyncio

import pytest

from wbmemory import build_host, dream, model_factory, pause_between_chunks

from workbench.brain import BUILTIN_TOOLS, Brain
from workbench.brain.models import Reply, ScriptedModel
from workbench.errors import ConfigError
from workbench.memory.dream import commit_dream, commit_finished_dreams, create_dream, run_dream, uncommitted_dreams
from workbench.memory.dream_script import dream_script
from workbench.memory.events import event_text
from workbench.memory.plugin import MemoryPlugin
from workbench.memory.store import MemorySettings
from workbench.memory.tools import dream_tools


def dream_brain(store, model_factory) -> Brain:
    """A brain over the store's log with the dream tools and no hands (dreams run no code)."""
    return Brain(store.log, hands_factory=None, model_factory=model_factory,
                 tools={**BUILTIN_TOOLS, **{t.name: t for t in dream_tools(store)}})


def cited_event(log, citation):
    found = log.events(citation["session_id"], after=citation["seq"] - 1, until=citation["seq"])
    assert found, f"cited event {citation} does not exist"
    return found[0]


def test_dream_proposes_memories_whose_citations_hold(brain, store, recorded):
    result = dream(brain, store, sessions=recorded, model="scripted:dream")
    assert result["stop_reason"] == "end_turn"
    memories = store.list()
    assert len(memories) >= 4 and {m["id"] for m in memories} == set(result["proposed"])
    for m in memories:
        assert m["status"] == "proposed" and m["dream_id"] == result["dream_id"]
        assert m["created_by"] == f"dream:{result['dream_id']}"
        assert m["provenance"], m
        for c in m["provenance"]:
            assert c["session_id"] in recorded
            e = cited_event(store.log, c)
            assert c["quote"] in event_text(e), (c, e.payload)  # what the citation check reads of the event
    by_title = {m["title"]: m for m in memories}
    fix = by_title["Fix for ZeroDivisionError: division by zero"]
    err = cited_event(store.log, fix["provenance"][0])
    assert err.type == "tool_result" and err.payload["is_error"]
    assert cited_event(store.log, fix["provenance"][1]).type == "tool_started"
    pref = next(m for m in memories if "prefer duckdb" in m["text"])
    assert cited_event(store.log, pref["provenance"][0]).type == "user_message"
    # the dream's own log records its proposals and what it read, and the bookmarks match
    dream_events = store.log.events(result["dream_id"])
    assert sorted(e.payload["memory_id"] for e in dream_events if e.type == "memory_proposed") == sorted(result["proposed"])
    read = [e for e in dream_events if e.type == "dream_read"]
    assert len(read) == 1 and set(read[0].payload["sessions"]) == set(recorded)
    assert store.bookmarks() == {sid: store.log.session(sid)["last_seq"] for sid in recorded}


def test_a_second_dream_over_the_same_sessions_proposes_nothing(brain, store, recorded):
    first = dream(brain, store, sessions=recorded, model="scripted:dream")
    before = store.list()
    second = dream(brain, store, sessions=recorded, model="scripted:dream")
    assert first["proposed"] and second["proposed"] == []
    assert store.list() == before
    assert commit_dream(store, second["dream_id"])["committed_before"]  # committing twice changes nothing
    assert store.list() == before


def _dream_turn(store, calls: list[tuple[str, dict]], sessions=None):
    """Run one dream turn whose model makes exactly these tool calls; returns the tool results."""
    brain = dream_brain(store, lambda name: ScriptedModel([Reply(tool_calls=calls), Reply(text="ok")], name=name))
    dream_id = create_dream(brain, store, sessions=sessions, model="probe")
    try:
        assert asyncio.run(brain.run_turn(dream_id, "propose")) == "end_turn"
    finally:
        asyncio.run(brain.close())
    return dream_id, [e.payload for e in store.log.events(dream_id, types=["tool_result"])]


def test_bad_provenance_is_refused_with_an_error_the_model_can_act_on(brain, store, recorded):
    sid = recorded[0]
    good = {"session_id": sid, "seq": 2, "quote": "Always print results with two decimals"}
    dream_id, results = _dream_turn(store, [
        ("propose_memory", {"title": "No evidence", "text": "Something."}),
        ("propose_memory", {"title": "Missing event", "text": "Something.", "provenance": [dict(good, seq=999)]}),
        ("propose_memory", {"title": "Missing session", "text": "Something.", "provenance": [dict(good, session_id="nope")]}),
        ("propose_memory", {"title": "Wrong quote", "text": "Something.", "provenance": [dict(good, quote="never use two decimals")]}),
        ("propose_memory", {"title": "Recalled", "text": "Something.", "provenance": [dict(good, seq=1, quote="ratio of two numbers")]}),
        ("propose_memory", {"title": "Two decimals", "text": "Print results with two decimals.", "provenance": [good]}),
    ])
    errors = [r for r in results if r["is_error"]]
    text = ["\n".join(b["text"] for b in r["content"]) for r in results]
    assert len(errors) == 5 and not results[5]["is_error"]
    assert "provenance is required" in text[0]
    assert f"session {sid} has no event 999" in text[1] and "read_events" in text[1]
    assert "there is no session 'nope'" in text[2]
    assert "does not appear in event" in text[3]
    assert "session_created event, which is not evidence" in text[4]
    assert all(t.startswith("not proposed:") for t in text[:5])
    # only the valid proposal reaches the store, when the dream is committed
    assert [m["title"] for m in store.list()] == []
    assert [m["title"] for m in store.list(dream=commit_dream(store, dream_id)["dream_id"])] == ["Two decimals"]


def test_recalled_memories_are_never_proposed_again(brain, store, recorded):
    dream(brain, store, sessions=recorded, model="scripted:dream")
    existing = store.list()[0]
    store.review(existing["id"], "accept", "person:ann")
    # a later dream tries to propose the same memory again, citing the same (already dreamed) event
    _, results = _dream_turn(store, [
        ("propose_memory", {"title": existing["title"] + " again", "text": existing["text"], "provenance": existing["provenance"]}),
        ("propose_memory", {"title": "Fresh wording", "text": "A different claim entirely about ratios.", "provenance": existing["provenance"]}),
    ])
    assert results[0]["is_error"] and f"memory {existing['id']} (accepted) already says this" in results[0]["content"][0]["text"]
    assert results[1]["is_error"] and "read by an earlier dream" in results[1]["content"][0]["text"]


@pytest.mark.asyncio
async def test_a_background_dream_starts_after_every_n_finished_sessions(db_path, tmp_path):
    def models(name):
        return model_factory(name) if name.startswith("scripted") else ScriptedModel([Reply(text="ok")], name=name)

    plugin = MemoryPlugin(settings=MemorySettings(dream_every=2, dream_model="scripted:dream"))
    host = build_host(db_path, tmp_path, plugins=[plugin], model_factory=models)
    await host.start()
    try:
        brain, store = host.brain, plugin.store
        first = brain.create_session(title="one", model="echo")["id"]
        await brain.run_turn(first, "Always write files as UTF-8, please.")
        await host.jobs_done()
        assert store.log.sessions(kind="dream") == []  # one finished session is not enough
        second = brain.create_session(title="two", model="echo")["id"]
        await brain.run_turn(second, "Hello there, nothing to remember here.")
        for _ in range(600):  # the dream starts in the background, runs as a turn, and is committed when it ends
            await host.jobs_done()
            dreams = store.log.sessions(kind="dream")
            if dreams and not brain.running(dreams[0]["id"]) and store.log.events(dreams[0]["id"], types=["dream_read"]):
                break
            await asyncio.sleep(0.05)
        [d] = store.log.sessions(kind="dream")
    finally:
        await host.close()
    assert d["title"].startswith("dream over")
    read = build_host(db_path, tmp_path, read_only=True, hands=False)
    try:
        log, st = read.log, read.plugin("memory").store
        assert log.events(d["id"], until=1)[0].payload["config"]["dream"]["sessions"] == sorted([first, second])
        assert [m["title"] for m in st.list(dream=d["id"])] == ["Preference: Always write files as UTF-8, please."]
    finally:
        await read.close()


@pytest.mark.asyncio
async def test_scheduled_dreams_go_on_when_more_sessions_finish_than_a_dream_may_read(db_path, tmp_path):
    """dream_every above dream_max_sessions: dreams of at most that many start, the first to finish first
    (the whole batch was refused by the cap each time, and no scheduled dream ever started again)."""
    def models(name):
        return model_factory(name) if name.startswith("scripted") else ScriptedModel([Reply(text="ok")], name=name)

    plugin = MemoryPlugin(settings=MemorySettings(dream_every=3, dream_max_sessions=2, dream_model="scripted:dream"))
    host = build_host(db_path, tmp_path, plugins=[plugin], model_factory=models)
    await host.start()
    try:
        brain, store = host.brain, plugin.store
        chats = []
        for i in range(4):
            chats.append(brain.create_session(title=f"chat {i}", model="echo")["id"])
            await brain.run_turn(chats[-1], f"Remember number {i}, please.")
            for _ in range(600):  # a dream that started runs to its end before the next chat
                await host.jobs_done()
                if not any(brain.running(d["id"]) for d in store.log.sessions(kind="dream")):
                    break
                await asyncio.sleep(0.05)
        dreams = store.log.sessions(kind="dream")
        read = [store.log.events(d["id"], until=1)[0].payload["config"]["dream"]["sessions"] for d in dreams]
    finally:
        await host.close()
    assert read == [sorted(chats[:2]), sorted(chats[2:])], read


@pytest.mark.asyncio
async def test_a_dream_between_two_chunks_counts_as_running(recorded, db_path, tmp_path, monkeypatch):
    """Between two chunks no turn runs, yet the dream's driver goes on with it: the session is running
    (GET /sessions and a server's wake read this; a listing said "not running" and a check took the next
    chunk's fresh turn for one nobody ran)."""
    plugin = MemoryPlugin(settings=MemorySettings(dream_chunk_sessions=1))
    host = build_host(db_path, tmp_path, plugins=[plugin], model_factory=model_factory, hands=False)
    await host.start()
    between, go_on = pause_between_chunks(monkeypatch)
    try:
        did = await plugin.create_dream(recorded, "scripted:dream")
        task = asyncio.ensure_future(plugin.run_dream(did))
        assert await asyncio.to_thread(between.wait, 120)
        at_work = (host.brain.running(did), host.brain.turns.at_work(did))
        go_on.set()
        summary = await task
        after = host.brain.turns.at_work(did)
    finally:
        go_on.set()
        await host.close()
    assert at_work == (False, True) and summary["chunks"] == len(recorded) and after is False


def test_a_dream_through_the_messages_api_uses_the_same_tools(store, recorded, fake_api, monkeypatch):
    """The dream's tool specs and turns go through the real SDK to an HTTP Messages API (the fake one)."""
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_api.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    fake_api.use(dream_script)
    brain = dream_brain(store, model_factory)

    async def go():
        try:
            return await run_dream(brain, store, create_dream(brain, store, sessions=recorded, model="anthropic:fake-dreamer"))
        finally:
            await brain.close()  # the SDK's client belongs to this event loop

    result = asyncio.run(go())
    assert result["stop_reason"] == "end_turn" and len(result["proposed"]) >= 4
    sent = fake_api.requests[-1]
    assert {t["name"] for t in sent["tools"]} == {"list_sessions", "read_events", "read_memories", "propose_memory",
                                                  "propose_edit", "propose_merge", "propose_retire"}
    assert sent["system"].startswith("You are dreaming")


def test_a_dream_cut_short_records_nothing_and_a_finished_one_is_committed_later(store, recorded):
    good = {"session_id": recorded[0], "seq": 2, "quote": "Always print results with two decimals"}
    steps = [Reply(tool_calls=[("read_events", {"session_id": recorded[0]}),
                               ("propose_memory", {"title": "Two decimals", "text": "Print results with two decimals.", "provenance": [good]})])]
    brain = dream_brain(store, lambda name: ScriptedModel(
        steps + [Reply(text="out of room", stop_reason="max_tokens" if name == "short" else None)], name=name))
    try:
        short = dream(brain, store, sessions=recorded, model="short")
        assert short["stop_reason"] == "max_tokens" and short["proposed"] == []
        assert store.list() == [] and store.bookmarks() == {}
        # a dream whose turn ended but was never committed (the process stopped in between)
        whole = create_dream(brain, store, sessions=recorded, model="whole")
        assert asyncio.run(brain.run_turn(whole, "dream")) == "end_turn"
    finally:
        asyncio.run(brain.close())
    assert uncommitted_dreams(store) == [whole]
    committed = commit_finished_dreams(store)
    assert [c["dream_id"] for c in committed] == [whole] and len(committed[0]["proposed"]) == 1
    assert uncommitted_dreams(store) == [] and store.bookmarks() == {recorded[0]: store.log.session(recorded[0])["last_seq"]}


def test_dreams_started_at_once_start_one_and_refuse_the_others(db_path, tmp_path):
    from workbench.errors import TurnBusy

    host = build_host(db_path, tmp_path, hands=False)

    async def go() -> None:
        await host.start()
        try:
            plugin = host.plugin("memory")
            got = await asyncio.gather(*(plugin.start_dream(model="scripted:dream") for _ in range(4)),
                                       return_exceptions=True)
            started = [g for g in got if isinstance(g, str)]
            refused = [g for g in got if isinstance(g, TurnBusy)]
            assert len(started) == 1 and len(refused) == 3, got
            assert all(f"dream {started[0]} is still running" in str(e) for e in refused)
            assert [s["id"] for s in host.log.sessions() if s["kind"] == "dream"] == started
            await plugin.drive(started[0])
            assert await plugin.running_dream() is None  # its place is free again
        finally:
            await host.close()

    asyncio.run(go())


@pytest.mark.asyncio
async def test_offline_a_dream_given_no_model_uses_the_offline_dreamer_and_the_plain_scripted_model_is_refused(
        recorded, db_path, tmp_path):
    """`workbench dream` as the README writes it works on a fresh machine with no key (issue 25, a papercut): the
    host's default model is then the plain scripted one, which cannot read sessions, so a dream gets scripted:dream."""
    plugin = MemoryPlugin()
    host = build_host(db_path, tmp_path, plugins=[plugin])
    await host.start()
    try:
        assert host.models.default_name() == "scripted"
        did = await plugin.create_dream(recorded)
        assert host.log.session(did)["model"] == "scripted:dream"
        with pytest.raises(ConfigError, match="scripted:dream is the offline demo dreamer"):
            await plugin.create_dream(recorded, "scripted")
    finally:
        await host.close()
