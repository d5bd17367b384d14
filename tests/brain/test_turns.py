"""The brain owns its turns (fast: the in-memory log twin, scripted models, no kernel).

A turn starts with a committed user_message and always ends with exactly one turn_ended, whatever
stops it: the model, an interrupt racing the message, an interrupt after the end, or a failure of
the harness itself.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from workbench.brain import Brain, BrainSettings, turn_state
from workbench.brain.models import Reply, ScriptedModel
from workbench.errors import ConfigError, KeyReused, TurnBusy, UnknownSession
from workbench.log import DuckDBLog, MemoryLog


def make_brain(log, script, *, delay: float = 0.0, tools=None) -> Brain:
    kw = {} if tools is None else {"tools": tools}
    return Brain(log, hands_factory=None, settings=BrainSettings(retry_base=0.01),
                 model_factory=lambda name: ScriptedModel(script, delay=delay, name=name), **kw)


def consistent(log, sid) -> list[str]:
    """The session's event types, after checking every turn has exactly one end and no call is unanswered."""
    events = log.events(sid)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    kinds = [e.type for e in events]
    open_turn = False
    for k in kinds:
        if k == "user_message":
            assert not open_turn, f"a turn started inside another: {kinds}"
            open_turn = True
        elif k == "turn_ended":
            assert open_turn, f"turn_ended outside a turn: {kinds}"
            open_turn = False
    assert not open_turn, f"a turn was left open: {kinds}"
    uses = [b["id"] for e in events if e.type == "assistant_turn" for b in e.payload["message"]["content"] if b["type"] == "tool_use"]
    answered = [e.payload["tool_use_id"] for e in events if e.type == "tool_result"]
    assert sorted(uses) == sorted(answered), "every tool call is answered exactly once"
    return kinds


@pytest.mark.asyncio
async def test_starting_a_turn_returns_its_committed_user_message():
    log = MemoryLog()
    brain = make_brain(log, [Reply(text="hi there")], delay=0.01)
    sid = brain.create_session(model="scripted")["id"]
    event = await brain.start_turn(sid, "hello")
    assert (event.type, event.seq, event.payload) == ("user_message", 2, {"text": "hello"})
    assert log.events(sid)[1] == event and brain.running(sid)
    with pytest.raises(TurnBusy):
        await brain.start_turn(sid, "again")
    while brain.running(sid):
        await asyncio.sleep(0.01)
    assert consistent(log, sid)[-1] == "turn_ended" and log.session(sid)["state"] == "ended"
    await brain.close()


@pytest.mark.asyncio
async def test_bad_starts_write_nothing():
    log = MemoryLog()
    brain = make_brain(log, [Reply(text="x")])
    sid = brain.create_session(model="scripted")["id"]
    for text in ("", "   ", None, 42):
        with pytest.raises(ConfigError):
            await brain.start_turn(sid, text)
    with pytest.raises(UnknownSession):
        await brain.start_turn("nope", "hi")
    with pytest.raises(UnknownSession):
        await brain.interrupt("nope")
    assert [e.type for e in log.events(sid)] == ["session_created"]
    await brain.close()


@pytest.mark.asyncio
async def test_interrupts_racing_messages_always_leave_one_end_per_turn():
    """Message and interrupt 0-80 ms apart, many times: no error but TurnBusy, every turn closed once."""
    log = MemoryLog()
    brain = make_brain(log, lambda req: Reply(text="a long answer " * 20), delay=0.002)
    sid = brain.create_session(model="scripted")["id"]
    rng = random.Random(7)
    for i in range(40):
        async def send() -> None:
            try:
                await brain.start_turn(sid, f"message {i}")
            except TurnBusy:
                pass  # the previous turn is still closing: a refusal, nothing written

        async def interrupt() -> None:
            await asyncio.sleep(rng.uniform(0, 0.08))
            await brain.interrupt(sid)

        await asyncio.gather(send(), interrupt())
        while brain.running(sid):
            await asyncio.sleep(0.005)
    kinds = consistent(log, sid)
    assert kinds.count("user_message") == kinds.count("turn_ended") >= 20
    assert "interrupted" in kinds and log.session(sid)["state"] == "ended"
    await brain.close()


@pytest.mark.asyncio
async def test_a_second_cancel_during_the_close_does_not_leave_the_turn_open():
    """Two cancels close together (two interrupts, an interrupt and a hands close, a shutdown): the second
    lands while the turn is writing how it ended; the close still finishes (found by the API fuzzer: a
    turn left with only its user_message and nothing running it)."""
    log = MemoryLog()
    brain = make_brain(log, lambda req: Reply(text="slow " * 5), delay=0.5)
    rng = random.Random(11)
    sessions = []
    for _ in range(30):
        sid = brain.create_session(model="scripted")["id"]
        sessions.append(sid)
        await brain.start_turn(sid, "go")
        task = brain.turns.task(sid)
        for _ in range(rng.randrange(0, 3)):
            await asyncio.sleep(0)  # let the turn get to its model call, or not
        task.cancel()
        for _ in range(rng.randrange(1, 6)):  # the first cancel is being handled: the close has begun
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.wait({task})
    for sid in sessions:
        kinds = consistent(log, sid)
        assert kinds[-2:] == ["interrupted", "turn_ended"] and not brain.running(sid), kinds
    await brain.close()


@pytest.mark.asyncio
async def test_an_interrupt_after_the_end_adds_nothing():
    log = MemoryLog()
    brain = make_brain(log, [Reply(text="done")])
    sid = brain.create_session(model="scripted")["id"]
    assert await brain.run_turn(sid, "go") == "end_turn"
    before = log.events(sid)
    assert await brain.interrupt(sid) is False
    assert log.events(sid) == before


@pytest.mark.asyncio
async def test_a_cancel_landing_on_the_final_write_does_not_end_the_turn_twice():
    """The turn is cancelled while its turn_ended is being committed: the write finishes, nothing follows it."""
    log = MemoryLog()
    brain = make_brain(log, [Reply(text="done")])
    sid = brain.create_session(model="scripted")["id"]
    loop = asyncio.get_running_loop()
    cancelled = []

    def on_commit(e):  # on the writer thread, after the commit and before the appender hears back
        if e.type == "turn_ended" and not cancelled:
            cancelled.append(e.seq)
            loop.call_soon_threadsafe(brain.turns.task(sid).cancel)

    log.subscribe(on_commit)
    with pytest.raises(asyncio.CancelledError):
        await brain.run_turn(sid, "go")
    kinds = consistent(log, sid)
    assert cancelled and kinds.count("turn_ended") == 1 and "interrupted" not in kinds


class Boom(Exception):
    pass


@pytest.mark.asyncio
async def test_any_failure_of_the_harness_closes_the_turn_and_the_session_goes_on():
    log = MemoryLog()
    calls = {"n": 0}

    def script(request):
        calls["n"] += 1
        if calls["n"] == 1:
            raise Boom("the model adapter broke")
        return Reply(text="fine again")

    brain = make_brain(log, script)
    sid = brain.create_session(model="scripted")["id"]
    with pytest.raises(Boom):
        await brain.run_turn(sid, "first")
    kinds = consistent(log, sid)
    assert kinds[-2:] == ["turn_failed", "turn_ended"] and log.events(sid)[-1].payload["stop_reason"] == "error"
    assert "Boom: the model adapter broke" in log.events(sid, types=["turn_failed"])[0].payload["error"]
    assert await brain.run_turn(sid, "second") == "end_turn"
    consistent(log, sid)


@pytest.mark.asyncio
async def test_a_response_the_log_refuses_fails_the_turn_cleanly():
    """A model answer that is not storable (a lone surrogate) is refused by the log; the turn still ends."""
    log = MemoryLog()
    brain = make_brain(log, [Reply(text="broken \ud800 text"), Reply(text="ok")])
    sid = brain.create_session(model="scripted")["id"]
    with pytest.raises(Exception):
        await brain.run_turn(sid, "go")
    kinds = consistent(log, sid)
    assert "assistant_turn" not in kinds and kinds[-2:] == ["turn_failed", "turn_ended"]


@pytest.mark.asyncio
async def test_a_tool_that_raises_gets_its_call_answered_and_the_turn_closed():
    from workbench.brain import BUILTIN_TOOLS, Tool

    async def broken(inp, ctx):
        raise Boom("tool bug")

    tools = {**BUILTIN_TOOLS, "broken": Tool("broken", "a tool with a bug", {"type": "object"}, broken)}
    log = MemoryLog()
    brain = make_brain(log, [Reply(tool_calls=[("broken", {}), ("broken", {})]), Reply(text="after")], tools=tools)
    sid = brain.create_session(model="scripted", tools=["broken"])["id"]
    with pytest.raises(Boom):
        await brain.run_turn(sid, "use it")
    consistent(log, sid)
    results = [e.payload for e in log.events(sid, types=["tool_result"])]
    assert len(results) == 2 and all(r["is_error"] for r in results)
    assert "not run" in results[1]["content"][0]["text"]


@pytest.mark.asyncio
async def test_resume_answers_a_cut_off_call_and_finishes_the_turn():
    log = MemoryLog()
    brain = make_brain(log, [Reply(text="recovered")])
    sid = brain.create_session(model="scripted")["id"]
    # a process died in the middle of a tool call: its start is logged, its result is not
    log.append(sid, "user_message", {"text": "go"})
    call = {"type": "tool_use", "id": "toolu_1", "name": "python", "input": {"code": "print(1)"}}
    log.append(sid, "assistant_turn", {"message": {"role": "assistant", "content": [call], "stop_reason": "tool_use"}})
    log.append(sid, "tool_started", {"tool_use_id": "toolu_1", "name": "python", "input": call["input"]})
    assert turn_state(log.events(sid)).open
    assert await brain.resume(sid) == "end_turn"
    kinds = consistent(log, sid)
    assert kinds.count("resumed") == 1 and "tool_started" in kinds
    result = log.events(sid, types=["tool_result"])[0].payload
    assert result["is_error"] and "interrupted; state unknown" in result["content"][0]["text"]
    assert await brain.resume(sid) is None  # nothing left to resume


@pytest.mark.asyncio
async def test_closing_the_brain_interrupts_running_turns_as_shutdown():
    log = MemoryLog()
    brain = make_brain(log, lambda req: Reply(text="slow " * 200), delay=0.01)
    sids = [brain.create_session(model="scripted")["id"] for _ in range(3)]
    for sid in sids:
        await brain.start_turn(sid, "go")
    await brain.close()
    for sid in sids:
        consistent(log, sid)
        assert log.events(sid, types=["interrupted"])[0].payload["by"] == "shutdown"
    with pytest.raises(TurnBusy):
        await brain.start_turn(sids[0], "after close")


# -- a message sent again with its idempotency key is recorded once ------------------------------------------
# A client whose POST got no answer cannot know whether the message was recorded; sending it again with the same
# key is safe: the brain finds the key in the session's messages (its fold of the log, so also after a restart)
# and answers with the first one's event, starting nothing. The same key with another message is KeyReused.


async def idle(brain, sid) -> None:
    while brain.running(sid):
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_a_message_sent_again_with_its_key_is_recorded_once():
    log = MemoryLog()
    brain = make_brain(log, lambda req: Reply(text="an answer"), delay=0.05)
    sid = brain.create_session(model="scripted")["id"]
    first = await brain.start_turn(sid, "hello", key="k-1")
    assert first.payload == {"text": "hello", "idempotency_key": "k-1"}
    again = await brain.start_turn(sid, "hello", key="k-1")  # while its turn runs: not TurnBusy, the same answer
    assert again == first
    await idle(brain, sid)
    assert await brain.start_turn(sid, "hello", key="k-1") == first  # after it ended: still nothing new
    before = log.events(sid)
    with pytest.raises(KeyReused, match="k-1"):
        await brain.start_turn(sid, "another message", key="k-1")
    assert log.events(sid) == before  # refused: nothing written
    # sent concurrently, a message is recorded once, and every sender gets its event
    events = await asyncio.gather(*(brain.start_turn(sid, "twice?", key="k-2") for _ in range(8)))
    assert len({e.seq for e in events}) == 1
    await idle(brain, sid)
    kinds = consistent(log, sid)
    assert kinds.count("user_message") == 2 and [e.payload["text"] for e in log.events(sid, types=["user_message"])] == \
        ["hello", "twice?"]
    # a message without a key is a new message each time
    await brain.start_turn(sid, "hello")
    await idle(brain, sid)
    assert consistent(log, sid).count("user_message") == 3
    await brain.close()


@pytest.mark.asyncio
async def test_the_key_is_found_after_a_restart(tmp_path):
    path = tmp_path / "wb.duckdb"
    log = DuckDBLog(path)
    brain = make_brain(log, lambda req: Reply(text="an answer"))
    sid = brain.create_session(model="scripted")["id"]
    first = await brain.start_turn(sid, "hello", key="0f8e2a7c-4b1d-4c9e-9a51-7d3b2e6f0a11")
    await idle(brain, sid)
    await brain.close()
    log.close()

    log = DuckDBLog(path)  # a new process: the brain knows the session only from its log (a cold read)
    try:
        brain = make_brain(log, lambda req: Reply(text="an answer"))
        before = log.events(sid)
        again = await brain.start_turn(sid, "hello", key="0f8e2a7c-4b1d-4c9e-9a51-7d3b2e6f0a11")
        assert (again.seq, again.payload) == (first.seq, first.payload)
        with pytest.raises(KeyReused):
            await brain.start_turn(sid, "hello?", key="0f8e2a7c-4b1d-4c9e-9a51-7d3b2e6f0a11")
        assert log.events(sid) == before and not brain.running(sid)
        await brain.close()
    finally:
        log.close()


# -- a turn can always be closed -----------------------------------------------------------------------------
# `_close` writes turn_failed (or interrupted) with the error's text, the results owed to pending calls, and
# turn_ended. The log refuses a payload with a lone surrogate, and a write may fail: the fuzzer found a chat
# turn left open with nothing running. A closing event refused as it is is written again, minimal; refused
# even so, the turn's task fails loudly instead of leaving the turn open quietly.


@pytest.mark.asyncio
async def test_a_lone_surrogate_or_nul_in_the_error_text_still_closes_the_turn(caplog):
    from workbench.brain import BUILTIN_TOOLS, Tool

    async def broken(inp, ctx):
        raise Boom("the tool broke on \ud800 and \x00")

    tools = {**BUILTIN_TOOLS, "broken": Tool("broken", "a tool with a bug", {"type": "object"}, broken)}
    log = MemoryLog()
    brain = make_brain(log, [Reply(tool_calls=[("broken", {}), ("broken", {})]), Reply(text="after")], tools=tools)
    sid = brain.create_session(model="scripted", tools=["broken"])["id"]
    with pytest.raises(Boom):
        await brain.run_turn(sid, "use it")
    kinds = consistent(log, sid)  # closed: one turn_ended, every call answered
    assert kinds[-4:] == ["turn_failed", "tool_result", "tool_result", "turn_ended"]
    error = log.events(sid, types=["turn_failed"])[0].payload["error"]
    assert error == "Boom: the tool broke on \\ud800 and \\x00"  # escaped, not dropped
    results = [e.payload for e in log.events(sid, types=["tool_result"])]
    assert all(r["is_error"] for r in results) and "\\ud800" in results[0]["content"][0]["text"]
    assert await brain.run_turn(sid, "again") == "end_turn"  # the session goes on
    await brain.close()
    # what the brain logged can be written to a UTF-8 file (or sent by a test runner to its parent)
    for record in caplog.records:
        caplog.handler.format(record).encode("utf-8")


@pytest.mark.asyncio
async def test_an_oversized_error_is_cut_and_the_turn_closed():
    log = MemoryLog()

    def script(request):
        raise Boom("x" * 5_000_000)

    brain = make_brain(log, script)
    sid = brain.create_session(model="scripted")["id"]
    with pytest.raises(Boom):
        await brain.run_turn(sid, "go")
    assert consistent(log, sid)[-2:] == ["turn_failed", "turn_ended"]
    assert len(log.events(sid, types=["turn_failed"])[0].payload["error"]) <= 2000
    await brain.close()


class RefusingLog(DuckDBLog):
    """A real DuckDB log whose commit fails (as a full disk would) for transactions that write `refuse` events,
    `times` times."""

    def __init__(self, path, refuse: str, times: int):
        super().__init__(path)
        self.refuse, self.times, self.refused = refuse, times, 0

    def _commit(self, tx):
        if self.refused < self.times and any(e.type == self.refuse for e in tx.appended):
            self.refused += 1
            raise OSError(28, "No space left on device")
        super()._commit(tx)


@pytest.mark.asyncio
@pytest.mark.parametrize("refuse", ["turn_failed", "tool_result", "turn_ended", "interrupted"])
async def test_a_closing_write_the_log_refuses_once_is_written_again_and_the_turn_closed(tmp_path, refuse):
    from workbench.brain import BUILTIN_TOOLS, Tool

    async def slow(inp, ctx):
        await asyncio.sleep(60)

    async def broken(inp, ctx):
        raise Boom("tool bug")

    tools = {**BUILTIN_TOOLS, "slow": Tool("slow", "slow", {"type": "object"}, slow),
             "broken": Tool("broken", "broken", {"type": "object"}, broken)}
    log = RefusingLog(tmp_path / "wb.duckdb", refuse, times=0)
    try:
        # an interrupt closes with interrupted; a harness failure with turn_failed: both answer a pending call
        name = "slow" if refuse == "interrupted" else "broken"
        brain = make_brain(log, [Reply(tool_calls=[(name, {}), (name, {})]), Reply(text="after")], tools=tools)
        sid = brain.create_session(model="scripted", tools=[name])["id"]
        log.times = 1
        if refuse == "interrupted":
            await brain.start_turn(sid, "go")
            while not log.events(sid, types=["tool_started"]):
                await asyncio.sleep(0.01)
            assert await brain.interrupt(sid)
        else:
            with pytest.raises(Boom):
                await brain.run_turn(sid, "go")
        assert log.refused == 1
        kinds = consistent(log, sid)
        assert kinds.count(refuse) >= 1 and kinds[-1] == "turn_ended" and not brain.running(sid)
        await brain.close()
    finally:
        log.close()


@pytest.mark.asyncio
async def test_a_turn_the_log_will_not_close_fails_loudly(tmp_path, caplog):
    log = RefusingLog(tmp_path / "wb.duckdb", "turn_failed", times=0)
    try:
        brain = make_brain(log, lambda req: (_ for _ in ()).throw(Boom("model adapter bug")))
        sid = brain.create_session(model="scripted")["id"]
        log.times = 2  # the closing and its minimal second try
        with pytest.raises(RuntimeError, match=f"the turn of session {sid} cannot be closed") as e:
            await brain.run_turn(sid, "go")
        assert isinstance(e.value.__cause__, OSError)  # the first refusal; the second is in the message
        assert log.session(sid)["state"] == "unfinished"  # open: the next resume closes it
        log.times = 0
        with pytest.raises(Boom):  # the model fails again, and this time its closing is written
            await brain.resume(sid)
        assert consistent(log, sid)[-2:] == ["turn_failed", "turn_ended"]
        # started in the background, the failure is logged as an error with its traceback, never silent
        log.times, log.refused = 2, 0
        caplog.clear()
        await brain.start_turn(sid, "again")
        while brain.running(sid):
            await asyncio.sleep(0.01)
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert any("Traceback" in m and "cannot be closed" in m for m in errors), errors
        await brain.close()
    finally:
        log.close()


@pytest.mark.asyncio
async def test_a_turn_cancelled_before_its_first_step_tells_its_starter():
    """A shutdown's cancel landing between a turn's spawn and its first step: the turn wrote nothing, and the
    request that started it is answered (it waited for ever for the turn's first event)."""
    log = MemoryLog()
    brain = make_brain(log, [Reply(text="never")])
    sid = brain.create_session(model="scripted")["id"]
    await brain.conversation(sid)  # kept, and its model made: starting the turn waits for nothing before the spawn
    brain.model("scripted")
    started, closed = await asyncio.wait_for(asyncio.gather(brain.start_turn(sid, "hello"), brain.close(),
                                                            return_exceptions=True), 30)
    assert isinstance(started, TurnBusy) and "nothing was written" in str(started), started
    assert closed is None and [e.type for e in log.events(sid)] == ["session_created"]


@pytest.mark.asyncio
async def test_a_turn_cancelled_while_its_first_event_is_written_is_closed():
    """A cancel landing while a turn's user_message is being committed (a delegating parent interrupted while its
    child's turn starts: the child's starter is cancelled, then the child's turn): the message is committed, so the
    turn is open and must be closed (interrupted), never left unfinished with nothing running it. A fuzz run of the
    server found a child session so: user_message, model_request, and nothing more."""
    gate = asyncio.Event()

    class Slow(MemoryLog):
        def write_soon(self, fn):
            done = super().write_soon(fn)  # committed now; heard by its waiter once the gate opens
            later = asyncio.get_running_loop().create_future()

            async def hand_over():
                result = await done
                await gate.wait()
                later.set_result(result)

            asyncio.get_running_loop().create_task(hand_over())
            return later

    log = Slow()
    brain = make_brain(log, [Reply(text="never")])
    sid = brain.create_session(model="scripted")["id"]
    await brain.conversation(sid)
    brain.model("scripted")
    starter = asyncio.ensure_future(brain.start_turn(sid, "hello"))
    while brain.turn_task(sid) is None:
        await asyncio.sleep(0)
    for _ in range(10):  # the first write is in flight
        await asyncio.sleep(0)
    starter.cancel()  # its starter gives up (the lock is let go) ...
    interrupt = asyncio.ensure_future(brain.interrupt(sid, by="parent interrupted"))  # ... and the turn is interrupted
    for _ in range(10):
        await asyncio.sleep(0)
    gate.set()
    assert await asyncio.wait_for(interrupt, 30) is True
    with pytest.raises(asyncio.CancelledError):
        await starter
    assert consistent(log, sid)[1:] == ["user_message", "model_request", "interrupted", "turn_ended"]
    assert log.events(sid)[-2].payload["by"] == "parent interrupted"
    await brain.close()
