"""Review actions are versioned with their actors, nothing is deleted, accepted memories reach new sessions only."""

from __future__ import annotations

import asyncio

import pytest

from workbench.errors import ConfigError, MemoryConflict, UnknownMemory
from wbmemory import dream as run_a_dream


def counts(store) -> dict[str, int]:
    cur = store.log.cursor()
    try:
        return {t: cur.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("memory_items", "memory_versions", "memory_redactions", "events")}
    finally:
        cur.close()


def grew(before: dict[str, int], after: dict[str, int]) -> bool:
    return all(after[t] >= before[t] for t in before)


def test_accepted_memories_enter_new_sessions_only(brain, store, recorded, systems):
    running = brain.create_session(title="already running", model="capture")["id"]
    assert asyncio.run(brain.run_turn(running, "hello")) == "end_turn"
    result = run_a_dream(brain, store, sessions=recorded, model="scripted:dream")
    chosen = store.get(result["proposed"][0])
    store.review(chosen["id"], "accept", "person:ann")
    rejected = store.review(result["proposed"][1], "reject", "person:ann", note="too specific")

    systems.clear()
    fresh = brain.create_session(title="after review", model="capture")["id"]
    assert asyncio.run(brain.run_turn(fresh, "hello")) == "end_turn"
    assert asyncio.run(brain.run_turn(running, "hello again")) == "end_turn"
    fresh_system, running_system = systems
    created = store.log.events(fresh, until=2)
    assert created[0].type == "session_created" and created[0].payload["system"] == fresh_system
    assert chosen["text"] in fresh_system and rejected["text"] not in fresh_system
    injected = created[1]
    assert injected.type == "memories_injected"
    accepted = store.get(chosen["id"])
    (m,) = injected.payload["memories"]
    assert {k: v for k, v in m.items() if k not in ("score", "why")} == {
        "id": chosen["id"], "version": 2, "title": chosen["title"], "updated_at": accepted["updated_at"],
        "sessions": list(dict.fromkeys(c["session_id"] for c in chosen["provenance"]))[:3]}
    # ranked against the session's title: relevant when a word of it is in the memory, else by date
    assert m["why"] == ("relevant" if m["score"] > 0 else "recent")
    assert injected.payload["ranked_by"] == "title" and injected.payload["left_out"] == 0
    assert injected.payload["text"] in fresh_system
    # the session that was running keeps its frozen prefix
    assert chosen["text"] not in running_system
    assert not store.log.events(running, types=["memories_injected"])
    # a dream never gets memories in its prompt (it reads them through its tools)
    dream = store.log.events(result["dream_id"], until=1)[0].payload["system"]
    assert chosen["text"] not in dream


def test_review_actions_are_versioned_and_nothing_is_deleted(store):
    ev = [{"session_id": "s1", "seq": 3, "quote": "evidence one"}]
    a = store.create(title="Use float division", text="Divide with / not //.", actor="dream:d1", provenance=ev, tags=["python"])
    b = store.create(title="Guard zero", text="Guard divisions by zero with max(n, 1).", actor="dream:d1",
                     provenance=[{"session_id": "s2", "seq": 5, "quote": "evidence two"}])
    c = store.create(title="Bad idea", text="Always retry forever.", actor="dream:d1", provenance=ev)
    history = [counts(store)]

    # edit, then accept (edit-then-accept is two versions by the same person)
    m = store.review(a, "accept", "person:ann", text="Divide with /, never //, for ratios.")
    assert [(v["action"], v["actor"], v["status"]) for v in m["history"]] == [
        ("propose", "dream:d1", "proposed"), ("edit", "person:ann", "proposed"), ("accept", "person:ann", "accepted")]
    assert m["history"][0]["text"] == "Divide with / not //." and m["text"] == "Divide with /, never //, for ratios."
    history.append(counts(store))

    r = store.review(c, "reject", "person:bob", note="harmful")
    assert (r["status"], r["history"][-1]["actor"], r["history"][-1]["note"]) == ("rejected", "person:bob", "harmful")
    with pytest.raises(MemoryConflict):
        store.review(c, "reject", "person:bob")
    history.append(counts(store))

    merged = store.review(a, "merge", "api", **{"with": [b]}, title="Division rules")
    assert merged["status"] == "accepted" and merged["proposal"] == "merge" and merged["targets"] == [a, b]
    assert merged["provenance"] == store.get(a)["provenance"] + store.get(b)["provenance"]
    for old in (a, b):
        o = store.get(old)
        assert o["status"] == "superseded" and o["history"][-1] == dict(o["history"][-1], action="merge", actor="api", note=f"merged into {merged['id']}")
    history.append(counts(store))

    retired = store.review(merged["id"], "retire", "person:ann", note="obsolete")
    assert retired["status"] == "retired" and [v["status"] for v in retired["history"]] == ["accepted", "retired"]
    history.append(counts(store))

    secret = "sk-live-1234567890"
    s = store.create(title="Key", text=f"The API key is {secret}.", actor="dream:d2",
                     provenance=[{"session_id": "s1", "seq": 4, "quote": f"key={secret}"}])
    store.review(s, "edit", "person:ann", text=f"Key {secret} works for the staging API.")
    red = store.review(s, "redact", "person:ann", reason="leaked secret")
    assert all(secret not in v["text"] for v in red["history"])
    assert [v["action"] for v in red["history"]] == ["propose", "edit", "redact"]
    assert red["redactions"] == [dict(red["redactions"][0], actor="person:ann", reason="leaked secret", versions=[1, 2])]
    cur = store.log.cursor()
    assert cur.execute("SELECT count(*) FROM memory_versions WHERE text LIKE ? OR provenance::VARCHAR LIKE ?",
                       [f"%{secret}%"] * 2).fetchone()[0] == 0
    cur.close()
    history.append(counts(store))

    assert all(grew(x, y) for x, y in zip(history, history[1:]))
    assert history[-1]["memory_items"] == 5  # a, b, c, the merge, the secret: nothing was deleted
    assert history[-1]["memory_redactions"] == 1


def test_a_dreams_edit_proposal_supersedes_the_old_memory_when_accepted(store):
    old = store.create(title="Ratios", text="Print ratios plainly.", actor="api", provenance=[], status="accepted")
    edit = store.create(title="Ratios", text="Print ratios with two decimals.", actor="dream:d9", provenance=[],
                        proposal="edit", targets=[old])
    store.review(edit, "accept", "person:ann")
    assert store.get(old)["status"] == "superseded" and store.get(edit)["status"] == "accepted"
    retire = store.create(title="Ratios", text="No longer true.", actor="dream:d9", provenance=[], proposal="retire", targets=[edit])
    store.review(retire, "accept", "person:ann")
    assert store.get(edit)["status"] == "retired" and store.get(retire)["status"] == "retired"
    assert store.prompt_memories() == ("", [])


def test_bad_review_requests_say_what_to_do(store):
    m = store.create(title="T", text="x" * 20, actor="api", provenance=[])
    with pytest.raises(UnknownMemory):
        store.review("nope", "accept", "api")
    with pytest.raises(ConfigError, match="unknown review action"):
        store.review(m, "delete", "api")
    with pytest.raises(ConfigError, match="actor"):
        store.review(m, "accept", "someone")
    with pytest.raises(ConfigError, match="reason"):
        store.review(m, "redact", "api")
    with pytest.raises(ConfigError, match="merge needs"):
        store.review(m, "merge", "api")
