"""Secrets and forgetting (issue 15): a dream cannot propose a secret, and a redacted memory is gone,
from the memory, from the prompts of sessions old and running, from the dream's own events, and from
the bytes of the database file. Real DuckDB files, the scripted models, no hands (no code runs)."""

from __future__ import annotations

import asyncio
import re
import base64

import pytest
from wbforget import SYSTEMS, TOKEN, VAULT_VALUE, chat, checkpoint, copies, dream, make_host

from workbench.brain.tools import ToolContext
from workbench.errors import ConfigError
from workbench.memory import tools

# -- a dream cannot propose a secret ---------------------------------------------------


@pytest.mark.parametrize("said", [f"Always deploy with the token {TOKEN} to staging.",
                                  f"Always send the header X-Key {VAULT_VALUE} to the API.",
                                  f"Always send {base64.b64encode(VAULT_VALUE.encode()).decode()} as the key."])
def test_a_dream_proposing_a_secret_is_refused_and_nothing_is_stored(db_path, said):
    host = make_host(db_path)
    try:
        sid = chat(host, "capture", said)
        dream_id, result = dream(host, [sid])
        store = host.plugin("memory").store
        assert result["stop_reason"] == "end_turn" and result["proposed"] == [] and store.list() == []
        refusals = [e.payload for e in host.log.events(dream_id, types=["tool_result"])
                    if e.payload["name"] == "propose_memory"]
        assert refusals and all(r["is_error"] for r in refusals)
        said_back = refusals[0]["content"][0]["text"]
        assert ("vault credential deploy" in said_back or "looks like a secret (GitHub Token" in said_back), said_back
        assert TOKEN not in said_back and VAULT_VALUE not in said_back  # the reason never repeats the value
        assert "propose it without the value" in said_back
    finally:
        asyncio.run(host.close())


@pytest.fixture
def dream_ctx(db_path):
    host = make_host(db_path)
    store = host.plugin("memory").store
    host.log.create_session("d1", title="a dream", model="scripted", kind="dream", payload={"config": {}})
    a = store.create(title="Deploys", text="Deploys go to staging first.", actor="person:ann", provenance=[], status="accepted")
    b = store.create(title="Staging", text="Staging is at staging.example.com.", actor="person:ann", provenance=[], status="accepted")
    yield store, ToolContext("d1", None, host.log), a, b
    asyncio.run(host.close())


@pytest.mark.parametrize(("tool", "inp"), [
    (tools.propose_edit, lambda a, b: {"memory_id": a, "title": "Deploys", "text": f"Use {TOKEN}.", "provenance": []}),
    (tools.propose_edit, lambda a, b: {"memory_id": a, "title": f"key {VAULT_VALUE[::-1]}", "text": "Deploy.", "provenance": []}),
    (tools.propose_merge, lambda a, b: {"memory_ids": [a, b], "title": "Deploys", "text": f"token {TOKEN}", "reason": "overlap"}),
    (tools.propose_merge, lambda a, b: {"memory_ids": [a, b], "title": "Deploys", "text": "One fact.", "reason": f"the key is {TOKEN}"}),
    (tools.propose_retire, lambda a, b: {"memory_id": a, "reason": f"replaced by {VAULT_VALUE.encode().hex()}"}),
])
def test_every_kind_of_proposal_with_a_secret_is_refused(dream_ctx, tool, inp):
    store, ctx, a, b = dream_ctx
    out = tool(store, inp(a, b), ctx)
    assert out.is_error and ("secret" in out.content[0]["text"] or "vault credential" in out.content[0]["text"])
    assert "proposal" not in out.details and TOKEN not in out.content[0]["text"]


# -- a person's secret gets a clear error, and an override --------------------------------


def test_a_person_editing_in_a_secret_is_refused_unless_they_confirm(dream_ctx):
    store, _, a, _ = dream_ctx
    before = store.get(a)
    with pytest.raises(ConfigError, match=r"not saved: text holds what looks like a secret .*allow_secret"):
        store.review(a, "edit", "person:ann", text=f"Deploy with {TOKEN}.")
    with pytest.raises(ConfigError, match="vault credential deploy"):
        store.review(a, "edit", "person:ann", title=f"Key {VAULT_VALUE}")
    assert store.get(a) == before  # nothing written
    m = store.review(a, "edit", "person:ann", text=f"Deploy with {TOKEN}.", allow_secret=True)
    assert TOKEN in m["text"]


# -- forgetting ------------------------------------------------------------------------


def test_redaction_removes_every_copy_from_the_memory_the_log_and_the_file(db_path):
    host = make_host(db_path)
    store = host.plugin("memory").store
    title = f"Deploy token {TOKEN[:30]}"  # the title held the token's first 30 characters
    text = f"Deploy to staging with the token {TOKEN}; it never expires."
    try:
        source = chat(host, "capture", f"Remember: deploy with {TOKEN}. Always use staging first.")
        m = store.create(title=title, text=text, actor="person:ann", status="accepted",
                         provenance=[{"session_id": source, "seq": 2, "quote": f"deploy with {TOKEN}"}])
        store.review(m, "edit", "person:ann", text=text + " Ask ops.", allow_secret=True)
        later = [chat(host, "echo", "deploy please") for _ in range(2)]  # the memory is in their prompts
        assert all(TOKEN in host.log.events(s)[0].payload["system"] for s in later)
        assert all(host.log.events(s)[1].type == "memories_injected" for s in later)
        dream_id, _ = dream(host, [source, *later])  # its reads and tool results carry the token too
        checkpoint(host)
        assert copies(db_path, TOKEN) > 0 and copies(db_path, TOKEN[:30]) > 0  # the test can fail

        red = store.review(m, "redact", "person:bob", reason="a leaked deploy token")

        assert red["status"] == "redacted" and red["title"] == "[redacted]"
        assert all(TOKEN[:20] not in repr(v) for v in red["history"])
        assert store.prompt_memories() == ("", [])  # no longer injected, at once
        assert TOKEN not in repr([e.payload for s in host.log.sessions() for e in host.log.events(s["id"])])
        tombstones = {s["id"]: host.log.events(s["id"], types=["redacted"]) for s in host.log.sessions()}
        for sid in (source, *later, dream_id):
            (t,) = tombstones[sid]
            assert t.payload["actor"] == "person:bob" and t.payload["reason"] == "a leaked deploy token"
            assert t.payload["memory_id"] == m and t.payload["seqs"] and t.ts is not None
        assert red["redactions"][0]["actor"] == "person:bob"
        fresh = chat(host, "capture", "hello")
        assert TOKEN not in host.log.events(fresh)[0].payload["system"]
        checkpoint(host)
        assert copies(db_path, TOKEN) == 0 and copies(db_path, TOKEN[:30]) == 0 and copies(db_path, "it never expires") == 0
    finally:
        asyncio.run(host.close())
    assert copies(db_path, TOKEN) == 0 and copies(db_path, TOKEN[:30]) == 0


def test_a_running_session_sees_the_redaction_at_its_next_step(db_path):
    host = make_host(db_path)
    store = host.plugin("memory").store
    try:
        m = store.create(title="Deploy token", text=f"Deploy with {TOKEN}.", actor="person:ann", provenance=[], status="accepted")
        SYSTEMS.clear()
        sid = host.brain.create_session(title="ongoing", model="capture")["id"]
        assert asyncio.run(host.brain.run_turn(sid, "first")) == "end_turn"
        assert TOKEN in SYSTEMS[-1]  # the brain now keeps this session's request in memory
        store.review(m, "redact", "person:bob", reason="leaked")
        assert asyncio.run(host.brain.run_turn(sid, "second")) == "end_turn"
        # the session's prompt was frozen at its start (the memory's heading carries its date and sources);
        # its next request is rebuilt from the scrubbed log
        assert TOKEN not in SYSTEMS[-1] and re.search(rf"## \[redacted\] \({m}, [^\n]*\)\n\[redacted\]", SYSTEMS[-1])
    finally:
        asyncio.run(host.close())


def test_a_redacted_memory_cannot_come_back(db_path):
    host = make_host(db_path)
    store = host.plugin("memory").store
    try:
        m = store.create(title="Personal", text="Ann's phone number is 555-0100.", actor="person:ann", provenance=[], status="accepted")
        store.review(m, "redact", "person:ann", reason="personal data", title="A phone number (removed)")
        assert store.get(m)["title"] == "A phone number (removed)"
        for action, kw in (("accept", {}), ("edit", {"text": "again"}), ("retire", {"reason": "x"})):
            with pytest.raises(Exception, match="redacted"):
                store.review(m, action, "person:ann", **kw)
        again = store.review(m, "redact", "person:bob", reason="compact again")  # the retry of a failed rewrite
        assert again["status"] == "redacted" and [r["actor"] for r in again["redactions"]] == ["person:ann", "person:bob"]
    finally:
        asyncio.run(host.close())


SOURCE = "The quarterly payroll export lands in the finance bucket every Friday at noon."


@pytest.mark.parametrize("quote", [SOURCE, "payroll export lands in finance bucket on Fridays"],
                         ids=["quoted word for word", "quote reworded too"])
def test_redacting_a_reworded_memory_removes_its_source_sentence_from_the_log_and_the_file(db_path, quote):
    host = make_host(db_path)
    store = host.plugin("memory").store
    try:
        source = chat(host, "capture", f"Remember: {SOURCE} Thanks, that is all.")
        seq = next(e.seq for e in host.log.events(source) if SOURCE in repr(e.payload))
        m = store.create(title="Salary extract", text="Friday midday: the salary extract goes to accounting storage.",
                         actor="person:ann", status="accepted",
                         provenance=[{"session_id": source, "seq": seq, "quote": quote},
                                     {"session_id": "nosuchsession", "seq": 1, "quote": SOURCE},  # hostile citations
                                     {"session_id": source, "seq": 10**9, "quote": SOURCE},
                                     {"session_id": source, "seq": True, "quote": SOURCE}])
        dream_id, _ = dream(host, [source])  # its chunk copies the source sentence into the dream's events
        checkpoint(host)
        assert copies(db_path, SOURCE) > 0  # the test can fail

        store.review(m, "redact", "person:bob", reason="payroll details")

        checkpoint(host)
        assert copies(db_path, SOURCE) == 0 and copies(db_path, "quarterly payroll export") == 0
        everything = repr([e.payload for s in host.log.sessions() for e in host.log.events(s["id"])])
        assert "payroll export" not in everything and "Thanks, that is all." in everything  # only the sentence went
        (tomb,) = host.log.events(source, types=["redacted"])
        assert tomb.payload["memory_id"] == m and seq in tomb.payload["seqs"]
        assert host.log.events(dream_id)  # the log still reads
    finally:
        asyncio.run(host.close())
    assert copies(db_path, SOURCE) == 0
