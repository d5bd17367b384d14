"""The request kept incrementally equals the request built from scratch from the log, for every event kind.

`reference_request` is the from-scratch builder as it was before the brain kept its
request incrementally (plus the compaction rule), written out here as the spec. The
brain's fold is checked against it after every event, through the brain's own view
(fed by the log's subscription) and through a cold read of the DuckDB file.
"""

from __future__ import annotations

import base64
import copy
import io
import json

import pytest
from PIL import Image

from workbench.brain import Brain, BrainSettings, build_request, turn_state
from workbench.brain.coldread import read_conversation
from workbench.brain.request import CLEARED, Conversation
from workbench.hands import Observation
from workbench.log import DuckDBLog, MemoryLog

IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo" + "A" * 64}}


def reference_request(events):
    created = events[0]
    frozen = created.payload
    messages, results, order = [], {}, []
    opened, start = 0, 0

    def flush():
        if order:
            messages.append({"role": "user", "content": [results[i] for i in order if i in results]})
            order.clear()
            results.clear()

    for e in events[1:]:
        if e.type == "user_message":
            block = {"type": "text", "text": e.payload["text"]}
            if order:
                flush()
                messages[-1]["content"].append(block)
            else:
                opened = len(messages)
                messages.append({"role": "user", "content": [block]})
        elif e.type == "assistant_turn":
            msg = e.payload["message"]
            if msg.get("stop_reason") == "refusal":
                continue
            flush()
            messages.append({"role": "assistant", "content": msg["content"]})
            if any(b["type"] == "compaction" for b in msg["content"]):
                start = opened
            order.extend(b["id"] for b in msg["content"] if b["type"] == "tool_use")
        elif e.type == "tool_result":
            p = e.payload
            # a python call's result holds its observation alone: the model reads the blocks rendered from it
            content = p["content"] if "content" in p else Observation.from_json(p["observation"]).content_blocks()
            block = {"type": "tool_result", "tool_use_id": p["tool_use_id"], "content": content}
            if p.get("is_error"):
                block["is_error"] = True
            results[p["tool_use_id"]] = block
    flush()
    request = {"model": frozen["model"], "max_tokens": frozen["max_tokens"], "system": frozen["system"],
               "tools": frozen["tools"], "messages": messages[start:]}
    for key in ("thinking", "output_config", "metadata", "temperature"):
        if frozen.get(key) is not None:
            request[key] = frozen[key]
    if (frozen.get("context") or {}).get("mode") == "compact":
        request["context_management"] = {"edits": [{"type": "compact_20260112",
                                                    "trigger": {"type": "input_tokens", "value": frozen["context"]["trigger"]}}]}
        request["betas"] = ["compact-2026-01-12"]
    return request


def msg(n, content, stop):
    return {"message": {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": "m", "content": content,
                        "stop_reason": stop, "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 5}},
            "usage": {"input_tokens": 10, "output_tokens": 5}, "attempt": 1, "latency_ms": 1.0, "ttft_ms": 0.5}


def call(i, code="print(1)"):
    return {"type": "tool_use", "id": f"toolu_{i}", "name": "python", "input": {"code": code}}


def result(i, content, is_error=False, **extra):
    return {"tool_use_id": f"toolu_{i}", "name": "python", "content": content, "is_error": is_error,
            "observation": {"stdout": "x" * 50, "displays": []}, **extra}


THINK = {"type": "thinking", "thinking": "let me see", "signature": "sig_abc"}
EMPTY_THINK = {"type": "thinking", "thinking": "", "signature": "sig_empty"}
REDACTED = {"type": "redacted_thinking", "data": "opaque-redacted"}
COMPACTION = {"type": "compaction", "content": "Summary: the user asked for sums; all were computed."}


def every_kind() -> list[tuple[str, dict]]:
    """A session's events after session_created: every kind of event and turn ending, in a plausible order."""
    t = "text"
    return [
        ("memories_injected", {"ids": []}),
        # a tool loop with thinking, a redacted block, parallel calls, an image result and an error result
        ("user_message", {"text": "first"}),
        ("model_request", {"attempt": 1, "model": "m", "messages": 1}),
        ("model_retry", {"attempt": 1, "error": "overloaded", "status": 529, "delay_s": 0.01}),
        ("model_request", {"attempt": 2, "model": "m", "messages": 1}),
        ("assistant_turn", msg(1, [THINK, REDACTED, {"type": t, "text": "two calls"}, call(1), call(2)], "tool_use")),
        ("tool_started", {"tool_use_id": "toolu_1", "name": "python", "input": {"code": "print(1)"}}),
        ("hands_started", {"generation": 1}),
        ("tool_result", result(1, [{"type": t, "text": "1"}, IMAGE])),
        ("tool_started", {"tool_use_id": "toolu_2", "name": "python", "input": {"code": "print(1)"}}),
        ("tool_result", result(2, [{"type": t, "text": "Traceback"}], is_error=True)),
        ("assistant_turn", msg(2, [EMPTY_THINK, {"type": t, "text": "done"}], "end_turn")),
        ("turn_ended", {"stop_reason": "end_turn"}),
        # a refusal: recorded, never sent back
        ("user_message", {"text": "something refused"}),
        ("assistant_turn", msg(3, [], "refusal")),
        ("turn_ended", {"stop_reason": "refusal"}),
        # max_tokens with a cut-off call that is answered "not run"
        ("user_message", {"text": "long answer"}),
        ("assistant_turn", msg(4, [{"type": t, "text": "partial"}, call(3)], "max_tokens")),
        ("tool_result", result(3, [{"type": t, "text": "not run: the response stopped before tool use"}], is_error=True)),
        ("turn_ended", {"stop_reason": "max_tokens"}),
        # pause_turn, sent again, then an interrupt during a call
        ("user_message", {"text": "search"}),
        ("assistant_turn", msg(5, [{"type": t, "text": "pausing"}], "pause_turn")),
        ("assistant_turn", msg(6, [THINK, call(4), call(5)], "tool_use")),
        ("tool_started", {"tool_use_id": "toolu_4", "name": "python", "input": {"code": "print(1)"}}),
        ("interrupted", {"by": "user"}),
        ("tool_result", result(4, [{"type": t, "text": "interrupted by the user"}], is_error=True, interrupted=True)),
        ("tool_result", result(5, [{"type": t, "text": "not run: interrupted"}], is_error=True, interrupted=True)),
        ("turn_ended", {"stop_reason": "interrupted"}),
        # a model error, then a harness failure
        ("user_message", {"text": "again"}),
        ("model_error", {"error": "400 invalid", "status": 400, "attempts": 1}),
        ("turn_ended", {"stop_reason": "error"}),
        ("user_message", {"text": "once more"}),
        ("assistant_turn", msg(7, [call(6)], "tool_use")),
        ("turn_failed", {"error": "RuntimeError: boom"}),
        ("tool_result", result(6, [{"type": t, "text": "not finished: the turn failed"}], is_error=True)),
        ("turn_ended", {"stop_reason": "error"}),
        # a turn cut off after a result (the process stopped), resumed, then a user message joining results
        ("user_message", {"text": "cut off"}),
        ("assistant_turn", msg(8, [call(7)], "tool_use")),
        ("tool_started", {"tool_use_id": "toolu_7", "name": "python", "input": {"code": "print(1)"}}),
        ("tool_result", result(7, [{"type": t, "text": "7"}])),
        ("resumed", {}),
        ("assistant_turn", msg(9, [call(8)], "tool_use")),
        ("tool_started", {"tool_use_id": "toolu_8", "name": "python", "input": {"code": "print(1)"}}),
        ("tool_result", result(8, [{"type": t, "text": "8"}])),
        ("interrupted", {"by": "user"}),
        ("turn_ended", {"stop_reason": "interrupted"}),
        ("user_message", {"text": "after the results"}),
        # a compaction, first in the response that continues the turn, with a call after it
        ("assistant_turn", msg(10, [COMPACTION, THINK, call(9)], "tool_use")),
        ("tool_started", {"tool_use_id": "toolu_9", "name": "python", "input": {"code": "print(1)"}}),
        ("tool_result", result(9, [{"type": t, "text": "9"}])),
        ("assistant_turn", msg(11, [{"type": t, "text": "after the compaction"}], "end_turn")),
        ("turn_ended", {"stop_reason": "end_turn"}),
        # a pause after compacting, then the continued answer; and a turn left open
        ("user_message", {"text": "later"}),
        ("assistant_turn", msg(12, [COMPACTION], "compaction")),
        ("assistant_turn", msg(13, [REDACTED, {"type": t, "text": "continued"}, call(10)], "tool_use")),
        ("tool_started", {"tool_use_id": "toolu_10", "name": "python", "input": {"code": "print(1)"}}),
    ]


def make_session(log, context=None):
    payload = {"title": None, "model": "m", "system": "sys", "tools": [{"name": "python", "input_schema": {}}],
               "max_tokens": 100, "thinking": {"type": "adaptive"}, "output_config": None, "config": {}, "context": context}
    log.create_session("s", title=None, model="m", payload=payload)
    return "s"


def canon(x):
    return json.dumps(x, sort_keys=True)


@pytest.mark.parametrize("context", [None, {"mode": "compact", "trigger": 50_000}])
def test_the_fold_equals_the_reference_after_every_event(context):
    log = MemoryLog()
    sid = make_session(log, context)
    conv = Conversation().feed_all(log.events(sid))
    handed: list[tuple[dict, str]] = []
    for type_, payload in every_kind():
        conv.feed(log.append(sid, type_, payload))
        events = log.events(sid)
        got = conv.request()
        assert canon(got) == canon(reference_request(events)), f"after {type_}"
        handed.append((got, canon(got)))
        ref = reference_turn_state(events)
        assert (conv.state.open, conv.state.last_message, conv.state.answered, conv.state.started, conv.state.pauses) == ref
    # no request handed out earlier was changed by what came later
    assert all(canon(r) == c for r, c in handed)
    # the compaction is sent verbatim, and requests start at the user message that opened its turn
    last = handed[-1][0]["messages"]
    assert last[0] == {"role": "user", "content": [{"type": "text", "text": "later"}]}
    assert last[1]["content"] == [COMPACTION]
    log.close()


def reference_turn_state(events):
    open_, last, answered, started, pauses = False, None, set(), set(), 0
    for e in events:
        if e.type in ("user_message", "turn_ended"):
            open_, last, answered, started, pauses = e.type == "user_message", None, set(), set(), 0
        elif e.type == "assistant_turn" and open_:
            last, answered, started = e.payload["message"], set(), set()
            pauses += e.payload["message"]["stop_reason"] in ("pause_turn", "compaction")
        elif e.type == "tool_started" and open_:
            started.add(e.payload["tool_use_id"])
        elif e.type == "tool_result" and open_:
            answered.add(e.payload["tool_use_id"])
    return open_, last, answered, started, pauses


def test_a_cold_read_of_the_duckdb_file_equals_the_fold_of_its_events(tmp_path):
    log = DuckDBLog(tmp_path / "log.duckdb")
    sid = make_session(log, {"mode": "compact", "trigger": 50_000})
    for type_, payload in every_kind():
        log.append(sid, type_, payload)
    # hostile payload values the projection must carry as they are
    log.append(sid, "tool_result", result(10, [{"type": "text", "text": "ünï \u2028 \"quoted\" \\ 0.1 1e300"}],
                                          number=0.1, big=2**62, nested={"a": [1.5, -0.0, None, True]}))
    cold = read_conversation(log, sid)
    warm = Conversation().feed_all(log.events(sid))
    assert canon(cold.request()) == canon(warm.request()) == canon(build_request(log.events(sid)))
    assert cold.state == warm.state == turn_state(log.events(sid))
    log.close()


@pytest.mark.asyncio
async def test_the_brain_keeps_its_request_up_to_date_with_what_others_append(tmp_path):
    """Events appended by the brain, by others (the server, the hands) and before the brain first looked."""
    log = DuckDBLog(tmp_path / "log.duckdb")
    sid = make_session(log)
    kinds = every_kind()
    for type_, payload in kinds[:10]:  # before the brain has a view
        log.append(sid, type_, payload)
    brain = Brain(log, hands_factory=None)
    try:
        for type_, payload in kinds[10:]:
            await log.aappend(sid, type_, payload)
            conv = await brain.conversation(sid)
            assert canon(conv.request()) == canon(reference_request(log.events(sid)))
        # a second brain on the same file reads it cold, through the projection
        other = Brain(log, hands_factory=None)
        assert canon((await other.conversation(sid)).request()) == canon(reference_request(log.events(sid)))
        await other.close()
    finally:
        await brain.close()
        log.close()


@pytest.mark.asyncio
async def test_the_session_cache_is_bounded_and_an_evicted_session_is_read_again(tmp_path):
    log = DuckDBLog(tmp_path / "log.duckdb")
    brain = Brain(log, hands_factory=None, settings=BrainSettings(session_cache=3))
    try:
        ids = [brain.create_session(model="scripted")["id"] for _ in range(8)]
        for sid in ids:
            log.append(sid, "user_message", {"text": f"hi {sid}"})
            await brain.conversation(sid)
        assert len(brain.views._kept) == 3
        assert set(brain.views._kept) == set(ids[-3:])  # the least recently used went first
        await brain.conversation(ids[-3])  # used again: now the most recent
        await brain.conversation(ids[0])  # read again from the log
        assert set(brain.views._kept) == {ids[-3], ids[-1], ids[0]}
        log.append(ids[0], "assistant_turn", msg(1, [{"type": "text", "text": "hello"}], "end_turn"))
        got = (await brain.conversation(ids[0])).request()
        assert got == reference_request(log.events(ids[0]))
        assert [m["role"] for m in got["messages"]] == ["user", "assistant"]
    finally:
        await brain.close()
        log.close()


@pytest.mark.asyncio
async def test_a_turn_runs_on_the_kept_request_and_every_request_equals_a_fresh_build(tmp_path):
    """A real loop (scripted model, a tool of its own): each request the model gets equals the log's fold."""
    from workbench.brain import Tool, ToolOutput
    from workbench.brain.models import Reply, ScriptedModel

    log = DuckDBLog(tmp_path / "log.duckdb")
    seen: list[tuple[dict, str, dict]] = []
    steps = [Reply(thinking="a", tool_calls=[("echo", {"n": 1}), ("echo", {"n": 2})]),
             Reply(redacted=True, tool_calls=[("echo", {"n": 3})]), Reply(text="done")]

    class Recording(ScriptedModel):
        async def stream(self, request):
            seen.append((request, canon(request), build_request(log.events(sid))))
            async for ev in super().stream(request):
                yield ev

    async def echo(inp, ctx):
        return ToolOutput([{"type": "text", "text": f"echo {inp['n']}"}, IMAGE])

    tools = {"echo": Tool("echo", "echo", {"type": "object"}, echo)}
    brain = Brain(log, hands_factory=None, model_factory=lambda name: Recording(steps), tools=tools)
    try:
        sid = brain.create_session(model="rec", tools=["echo"])["id"]
        assert await brain.run_turn(sid, "go") == "end_turn"
        assert await brain.run_turn(sid, "again") == "end_turn"
    finally:
        await brain.close()
        log.close()
    assert len(seen) == 4
    for request, text, fresh in seen:
        assert text == canon(fresh) == canon(request)  # equal to the fresh build, and never changed afterwards


def test_clearing_old_tool_results_keeps_assistant_turns_and_recent_messages():
    log = MemoryLog()
    sid = make_session(log, {"mode": "clear", "trigger": 5_000})
    conv = Conversation().feed_all(log.events(sid))
    big = "y" * 8_000  # about 2,000 tokens a result
    for i in range(30):
        for type_, payload in [("user_message", {"text": f"turn {i}"}),
                               ("assistant_turn", msg(i, [THINK, call(i)], "tool_use")),
                               ("tool_result", result(i, [{"type": "text", "text": big}])),
                               ("assistant_turn", msg(100 + i, [{"type": "text", "text": "ok"}], "end_turn")),
                               ("turn_ended", {"stop_reason": "end_turn"})]:
            conv.feed(log.append(sid, type_, payload))
        # the trigger, plus the results of the last 6 messages (kept), plus what is never cleared (about 60 a turn)
        assert conv.tokens() <= 5_000 + 2 * 2_100 + 60 * i
    messages = conv.request()["messages"]
    results = [b for m in messages if m["role"] == "user" for b in m["content"] if b["type"] == "tool_result"]
    assert results[0]["content"] == CLEARED and results[-1]["content"][0]["text"] == big
    # every assistant turn, thinking blocks included, exactly as stored; every call still has its result
    stored = [e.payload["message"]["content"] for e in log.events(sid, types=["assistant_turn"])]
    assert [m["content"] for m in messages if m["role"] == "assistant"] == stored
    assert [b["tool_use_id"] for b in results] == [f"toolu_{i}" for i in range(30)]
    # the same from scratch: clearing is a function of the events, not of when requests were built
    assert canon(build_request(log.events(sid))) == canon(conv.request())
    log.close()


def test_requests_handed_out_are_copies_of_the_message_list():
    log = MemoryLog()
    sid = make_session(log)
    conv = Conversation().feed_all(log.events(sid))
    conv.feed(log.append(sid, "user_message", {"text": "a"}))
    first = conv.request()
    snapshot = copy.deepcopy(first)
    conv.feed(log.append(sid, "assistant_turn", msg(1, [call(1)], "tool_use")))
    conv.feed(log.append(sid, "tool_result", result(1, [{"type": "text", "text": "r"}])))
    second = conv.request()
    conv.feed(log.append(sid, "user_message", {"text": "b"}))
    assert first == snapshot and len(second["messages"]) == 3 and len(conv.request()["messages"]) == 3
    log.close()


@pytest.mark.asyncio
async def test_an_assistant_turn_is_committed_with_what_follows_it_in_order():
    """Four transactions for a turn with one call (not eight): the user message with the first model_request, the
    assistant turn with its tool_started, the result with the next model_request, the last assistant turn with
    turn_ended; each model_request says how many messages the model was sent. A pause_turn is written before the
    next request."""
    from workbench.brain import Tool, ToolOutput
    from workbench.brain.models import Reply, ScriptedModel

    class Counting(MemoryLog):
        writes = 0

        def write(self, fn):
            Counting.writes += 1
            return super().write(fn)

        def write_soon(self, fn):
            Counting.writes += 1
            return super().write_soon(fn)

    async def echo(inp, ctx):
        return ToolOutput([{"type": "text", "text": "echoed"}])

    log = Counting()
    sent: list[int] = []

    def seen(reply):
        return lambda request: (sent.append(len(request["messages"])), reply)[1]

    steps = [seen(Reply(thinking="t", tool_calls=[("echo", {})])), seen(Reply(text="done")),
             seen(Reply(text="wait", stop_reason="pause_turn")), seen(Reply(text="went on"))]
    tools = {"echo": Tool("echo", "echo", {"type": "object"}, echo)}
    brain = Brain(log, hands_factory=None, model_factory=lambda name: ScriptedModel(steps), tools=tools)
    try:
        sid = brain.create_session(model="s", tools=["echo"])["id"]
        before = Counting.writes
        assert await brain.run_turn(sid, "go") == "end_turn"
        assert Counting.writes - before == 4
        assert [e.type for e in log.events(sid)][1:] == [
            "user_message", "model_request", "assistant_turn", "tool_started", "tool_result", "model_request",
            "assistant_turn", "turn_ended"]
        assert await brain.run_turn(sid, "more") == "end_turn"
        assert [e.type for e in log.events(sid)][-6:] == [
            "user_message", "model_request", "assistant_turn", "model_request", "assistant_turn", "turn_ended"]
        assert [e.payload["message"]["stop_reason"] for e in log.events(sid, types=["assistant_turn"])][-2:] == ["pause_turn", "end_turn"]
        assert [e.payload["messages"] for e in log.events(sid, types=["model_request"])] == sent == [1, 3, 5, 6]
        assert canon((await brain.conversation(sid)).request()) == canon(reference_request(log.events(sid)))
    finally:
        await brain.close()
        log.close()


def test_context_mode_turn_sends_only_the_turns_own_messages(tmp_path):
    """A dream's chunks: each turn starts afresh, so its requests never hold an earlier turn (nor results owed to one)."""
    log = DuckDBLog(tmp_path / "log.duckdb")
    sid = make_session(log, {"mode": "turn", "trigger": 150_000})
    call = {"type": "tool_use", "id": "toolu_1", "name": "python", "input": {"code": "1"}}
    for type_, payload in [
        ("user_message", {"text": "chunk one " + "x" * 5000}),
        ("assistant_turn", {"message": {"role": "assistant", "content": [call], "stop_reason": "tool_use"}}),
        ("tool_started", {"tool_use_id": "toolu_1", "name": "python", "input": {"code": "1"}}),
        ("tool_result", {"tool_use_id": "toolu_1", "name": "python", "content": [{"type": "text", "text": "y" * 5000}],
                         "is_error": False}),
        ("turn_ended", {"stop_reason": "interrupted"}),  # cut off: its result is owed to no later turn
        ("user_message", {"text": "chunk two"}),
        ("assistant_turn", {"message": {"role": "assistant", "content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"}}),
        ("user_message", {"text": "chunk three"}),
    ]:
        log.append(sid, type_, payload)
    warm = Conversation().feed_all(log.events(sid))
    assert warm.request()["messages"] == [{"role": "user", "content": [{"type": "text", "text": "chunk three"}]}]
    assert canon(read_conversation(log, sid).request()) == canon(warm.request()) == canon(build_request(log.events(sid)))
    log.close()


@pytest.mark.asyncio
async def test_a_cold_read_starts_at_the_latest_compaction_the_brain_recorded(tmp_path):
    """After a compaction the brain records (with its next write) where requests start; a cold read reads from
    there: an event before it is never read again (here one no fold could take), and the request and turn
    state equal the full fold's. The kept message list holds only what is sent."""
    from workbench.brain.models import Reply, ScriptedModel

    path = tmp_path / "log.duckdb"
    log = DuckDBLog(path)
    sid = make_session(log, {"mode": "compact", "trigger": 50_000})
    for type_, payload in every_kind():
        log.append(sid, type_, payload)
    for type_, payload in [("tool_result", result(10, [{"type": "text", "text": "10"}])),
                           ("assistant_turn", msg(14, [{"type": "text", "text": "all done"}], "end_turn")),
                           ("turn_ended", {"stop_reason": "end_turn"})]:
        log.append(sid, type_, payload)
    later = next(e.seq for e in log.events(sid, types=["user_message"]) if e.payload["text"] == "later")
    brain = Brain(log, hands_factory=None, model_factory=lambda name: ScriptedModel([Reply(text="ok")]))
    try:
        assert await brain.run_turn(sid, "next") == "end_turn"
    finally:
        await brain.close()
    assert log.cursor().execute("SELECT request_from FROM sessions WHERE id = ?", [sid]).fetchone() == (later,)
    full = Conversation().feed_all(log.events(sid))
    # an early assistant turn no fold can take: read again, it would fail the cold read
    early = log.events(sid, types=["assistant_turn"])[0].seq
    log.write(lambda tx: tx.execute("UPDATE events SET payload = '{}' WHERE session_id = ? AND seq = ?", [sid, early])).result()
    with pytest.raises(KeyError):
        Conversation().feed_all(log.events(sid))
    log.close()
    with DuckDBLog(path) as again:
        cold = read_conversation(again, sid)
    assert canon(cold.request()) == canon(full.request()) and cold.state == full.state and cold.seq == full.seq
    assert len(cold.messages) == len(cold.request()["messages"]) == len(full.messages) < len(every_kind()) // 4


@pytest.mark.asyncio
async def test_a_cold_read_from_the_latest_compaction_still_knows_the_keys_of_the_messages_before_it(tmp_path):
    """A message retried with its idempotency key after a restart starts nothing, even when the message is
    older than the latest compaction (which a cold read starts from); the same key with another text is refused."""
    from workbench.brain.models import Reply, ScriptedModel
    from workbench.errors import KeyReused

    path = tmp_path / "log.duckdb"
    log = DuckDBLog(path)
    sid = make_session(log, {"mode": "compact", "trigger": 50_000})
    for type_, payload in every_kind():
        if payload.get("text") == "first":
            payload = {**payload, "idempotency_key": "k-first"}
        log.append(sid, type_, payload)
    for type_, payload in [("tool_result", result(10, [{"type": "text", "text": "10"}])),
                           ("assistant_turn", msg(14, [{"type": "text", "text": "all done"}], "end_turn")),
                           ("turn_ended", {"stop_reason": "end_turn"})]:
        log.append(sid, type_, payload)
    first = next(e for e in log.events(sid, types=["user_message"]) if e.payload["text"] == "first")
    brain = Brain(log, hands_factory=None, model_factory=lambda name: ScriptedModel([Reply(text="ok")]))
    try:
        assert await brain.run_turn(sid, "next") == "end_turn"
    finally:
        await brain.close()
    (start,) = log.cursor().execute("SELECT request_from FROM sessions WHERE id = ?", [sid]).fetchone()
    assert start > first.seq  # the cold read below does not read the message itself
    last = log.events(sid)[-1].seq
    log.close()
    with DuckDBLog(path) as again:
        brain = Brain(again, hands_factory=None, model_factory=lambda name: ScriptedModel([Reply(text="ok")]))
        try:
            event = await brain.start_turn(sid, "first", key="k-first")
            assert (event.seq, event.payload) == (first.seq, first.payload)
            with pytest.raises(KeyReused):
                await brain.start_turn(sid, "another text", key="k-first")
        finally:
            await brain.close()
        assert again.events(sid)[-1].seq == last  # nothing was recorded, no turn started


# -- a python call's result, stored once -------------------------------------------------------------------------

def png() -> str:
    out = io.BytesIO()
    Image.new("RGB", (4, 2), "red").save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode()


PNG = png()


async def collected() -> list[Observation]:
    """Observations as the hands collect them: long text, HTML, more images than the model is shown, an error;
    a death that kept what the call printed; a kernel that could not start."""
    from workbench.hands.observing import Budget, Collector, death_note, failure

    col = Collector(Budget(output_limit=3_000, max_images=3), 1)
    await col.feed("stream", {"name": "stdout", "text": "".join(f"row {i}\n" for i in range(2_000))})
    await col.feed("display_data", {"data": {"text/plain": "<IPython.core.display.HTML object>",
                                             "text/html": "<table><tr><th>a</th></tr><tr><td>ünï \u2028</td></tr></table>"}})
    for i in range(5):
        await col.feed("display_data", {"data": {"text/plain": f"<Figure {i}>", "image/png": PNG}})
    await col.feed("stream", {"name": "stderr", "text": "\x1b[31mwarned\x1b[0m\r\n"})
    await col.feed("error", {"ename": "ValueError", "evalue": "bad", "traceback": ["\x1b[31mValueError\x1b[0m: bad"]})
    first = col.done()
    col = Collector(Budget(), 2)
    await col.feed("stream", {"name": "stdout", "text": "before the kill\n"})
    partial = col.done()
    died = failure(death_note("signal SIGKILL"), ename="KernelDied", generation=2, stdout=partial.stdout,
                   outputs=partial.outputs, text_limit=partial.text_limit, max_images=partial.max_images)
    unstarted = failure("the kernel could not start: no", ename="KernelStartError", notes=["[replayed 1 call]"])
    return [first, died, unstarted]


@pytest.mark.asyncio
async def test_a_python_result_is_stored_once_and_the_model_reads_what_it_read_before(tmp_path, caplog):
    from workbench.brain import Tool
    from workbench.brain.models import Reply, ScriptedModel
    from workbench.brain.tools import PYTHON, observation_output

    observations = await collected()
    before = [o.content_blocks() for o in observations]  # what results held beside the observation until now
    queue = list(observations)

    async def run(inp, ctx):
        return observation_output(queue.pop(0))

    sent = []

    def script(request):
        sent.append(request)
        return Reply(code=["1"]) if len(sent) <= len(observations) else Reply(text="done")

    log = DuckDBLog(tmp_path / "log.duckdb")
    brain = Brain(log, hands_factory=None, model_factory=lambda name: ScriptedModel(script, name=name),
                  tools={"python": Tool("python", PYTHON.description, PYTHON.input_schema, run)})
    try:
        sid = brain.create_session(model="scripted")["id"]
        assert await brain.run_turn(sid, "go") == "end_turn"
    finally:
        await brain.close()
    results = [e.payload for e in log.events(sid, types=["tool_result"])]
    # the outputs once: no content beside them, no stdout, stderr or result repeating their text, an image once
    assert all("content" not in r and not {"stdout", "stderr", "result"} & set(r["observation"]) for r in results)
    assert json.dumps(results[0]).count(PNG) == 5  # five figures, of which the model reads three
    assert len(json.dumps(results[0])) < len(json.dumps({"content": before[0], **results[0]})) - 3 * 64
    # the model read, in every request, the blocks it read of the live observation
    assert [b["content"] for m in sent[-1]["messages"] for b in m["content"] if b.get("type") == "tool_result"] == before
    # and a fold of the events, a build from scratch and a cold read of the file give that request, by the projection
    events = log.events(sid)
    cold = read_conversation(log, sid)
    assert canon(cold.request()) == canon(Conversation().feed_all(events).request()) == canon(build_request(events))
    assert canon(cold.request()["messages"]) == canon(reference_request(events)["messages"])
    assert not [r for r in caplog.records if "projected read" in r.getMessage()]
    assert [Observation.from_json(r["observation"]).stdout for r in results] == [o.stdout for o in observations]
    log.close()


def test_a_result_stored_before_reads_its_stored_content(tmp_path):
    """A result that held content beside its observation (all of them before): the model reads that content, even
    where the observation would render otherwise (it held no budget then)."""
    log = DuckDBLog(tmp_path / "log.duckdb")
    sid = make_session(log)
    said = [{"type": "text", "text": "as it was sent"}]
    for type_, payload in [
        ("user_message", {"text": "go"}),
        ("assistant_turn", msg(1, [call(1)], "tool_use")),
        ("tool_started", {"tool_use_id": "toolu_1", "name": "python", "input": {"code": "1"}}),
        ("tool_result", {"tool_use_id": "toolu_1", "name": "python", "content": said, "is_error": False,
                         "observation": {"outputs": [{"output_type": "stream", "name": "stdout", "text": "x" * 99_000}],
                                         "stdout": "x" * 99_000, "stderr": "", "result": None, "error": None,
                                         "truncated": [], "generation": 1, "duration_ms": 1.0, "notes": []}}),
    ]:
        log.append(sid, type_, payload)
    events = log.events(sid)
    for conv in (read_conversation(log, sid), Conversation().feed_all(events)):
        assert conv.request()["messages"][-1]["content"] == [{"type": "tool_result", "tool_use_id": "toolu_1", "content": said}]
    assert canon(build_request(events)) == canon(reference_request(events))
    log.close()
