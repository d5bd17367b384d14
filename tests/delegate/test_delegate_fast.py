"""Delegation and concurrent tool calls on the in-memory log, no kernels: children that need no code.

The loop runs concurrent-safe calls at once and answers each exactly once, in order, whatever
stops them; a delegate call cut off by a dead process re-attaches to its children on resume.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from datetime import UTC, datetime

import pytest

from workbench.brain import Brain
from workbench.brain.models.scripted import Reply, ScriptedModel
from workbench.brain.tools import Tool, ToolOutput
from workbench.delegate import DelegatePlugin, DelegateSettings
from workbench.delegate.run import child_id
from workbench.delegate.spec import BadInput, parse
from workbench.host import Host
from workbench.log import MemoryLog
from workbench.memory.plugin import MemoryPlugin


def answered_once(log, sid) -> None:
    """Every tool_use of the session has exactly one tool_result, and the turn ended once per message."""
    events = log.events(sid)
    uses = [b["id"] for e in events if e.type == "assistant_turn" for b in e.payload["message"]["content"] if b["type"] == "tool_use"]
    results = [e.payload["tool_use_id"] for e in events if e.type == "tool_result"]
    assert sorted(uses) == sorted(results) and len(set(results)) == len(results)
    types = [e.type for e in events]
    assert types.count("user_message") == types.count("turn_ended")


# -- concurrent tool calls in the loop ---------------------------------------------------------------


def slow_tool(windows: list, concurrent: bool = True, fail_on: str | None = None) -> Tool:
    async def run(inp, ctx):
        t0 = time.monotonic()
        if inp.get("tag") == fail_on:
            await asyncio.sleep(0.05)
            raise RuntimeError("a harness bug in the tool")
        await asyncio.sleep(inp.get("s", 0.5))
        windows.append((inp.get("tag"), t0, time.monotonic()))
        return ToolOutput([{"type": "text", "text": f"done {inp.get('tag')}"}])

    return Tool("slow", "sleeps", {"type": "object"}, run, concurrent=concurrent)


def brain_with(tool: Tool, replies: list) -> tuple[Brain, MemoryLog]:
    log = MemoryLog()
    brain = Brain(log, hands_factory=None, tools={tool.name: tool}, model_factory=lambda name: ScriptedModel(list(replies)))
    return brain, log


@pytest.mark.asyncio
async def test_concurrent_calls_of_one_response_overlap_and_are_answered_in_order():
    windows: list = []
    calls = [("slow", {"tag": t, "s": s}) for t, s in (("a", 0.6), ("b", 0.1), ("c", 0.3))]
    brain, log = brain_with(slow_tool(windows), [Reply(tool_calls=calls), Reply(text="ok")])
    sid = brain.create_session(model="scripted", tools=["slow"])["id"]
    assert await brain.run_turn(sid, "go") == "end_turn"
    starts, ends = [w[1] for w in windows], [w[2] for w in windows]
    assert max(starts) < min(ends)  # all three ran at the same time
    results = [e.payload for e in log.events(sid, types=["tool_result"])]
    assert [r["content"][0]["text"] for r in results] == ["done a", "done b", "done c"]  # the model's order
    answered_once(log, sid)
    await brain.close()


@pytest.mark.asyncio
async def test_a_call_that_is_not_concurrent_runs_alone():
    windows: list = []
    calls = [("slow", {"tag": t, "s": 0.2}) for t in "ab"]
    brain, log = brain_with(slow_tool(windows, concurrent=False), [Reply(tool_calls=calls), Reply(text="ok")])
    sid = brain.create_session(model="scripted", tools=["slow"])["id"]
    await brain.run_turn(sid, "go")
    (_, _, end_a), (_, start_b, _) = windows
    assert start_b >= end_a
    answered_once(log, sid)
    await brain.close()


@pytest.mark.asyncio
async def test_a_harness_failure_in_one_concurrent_call_answers_every_call_once():
    windows: list = []
    calls = [("slow", {"tag": "a", "s": 30}), ("slow", {"tag": "boom"}), ("slow", {"tag": "c", "s": 30})]
    brain, log = brain_with(slow_tool(windows, fail_on="boom"), [Reply(tool_calls=calls), Reply(text="ok")])
    sid = brain.create_session(model="scripted", tools=["slow"])["id"]
    with pytest.raises(RuntimeError):
        await asyncio.wait_for(brain.run_turn(sid, "go"), 20)
    types = [e.type for e in log.events(sid)]
    assert "turn_failed" in types and types[-1] == "turn_ended"
    answered_once(log, sid)
    assert windows == []  # the slow siblings were cancelled, not left running
    await brain.close()


@pytest.mark.asyncio
async def test_interrupting_a_turn_mid_batch_answers_every_call_once():
    windows: list = []
    calls = [("slow", {"tag": t, "s": 0.05 if t == "a" else 30}) for t in "abc"]
    brain, log = brain_with(slow_tool(windows), [Reply(tool_calls=calls), Reply(text="ok")])
    sid = brain.create_session(model="scripted", tools=["slow"])["id"]
    await brain.start_turn(sid, "go")
    for _ in range(200):
        if log.events(sid, types=["tool_result"]):
            break
        await asyncio.sleep(0.05)
    assert await brain.interrupt(sid)
    events = log.events(sid)
    results = [e.payload for e in events if e.type == "tool_result"]
    assert [r["is_error"] for r in results] == [False, True, True]  # a finished; b and c interrupted
    assert events[-1].type == "turn_ended" and events[-1].payload["stop_reason"] == "interrupted"
    answered_once(log, sid)
    await brain.close()


# -- delegation without kernels -------------------------------------------------------------------


def host(**settings) -> Host:
    plugin = DelegatePlugin(settings=DelegateSettings(**settings))
    return Host.build(log=MemoryLog(), hands=False, plugins=[MemoryPlugin(), plugin])


def ask(*calls: dict) -> str:
    return "\n".join("```json\n" + json.dumps(c) + "\n```" for c in calls)


def worker(prompt: str, **kw) -> dict:
    return {"prompt": prompt, "model": "scripted:worker", **kw}


@pytest.mark.asyncio
async def test_children_answer_and_the_tree_is_in_the_listing():
    h = host()
    await h.start()
    try:
        sid = h.brain.create_session(model="scripted:delegate", tools=["delegate"])["id"]
        text = ask({"tasks": [worker("say one"), worker("say two")]}, {"tasks": [worker("say three")]})
        assert await h.brain.run_turn(sid, text) == "end_turn"
        results = [e.payload for e in h.log.events(sid, types=["tool_result"])]
        assert len(results) == 2 and not any(r["is_error"] for r in results)
        kids = [c for r in results for c in r["children"]]
        assert [c["status"] for c in kids] == ["done"] * 3
        assert [c["answer"] for c in kids] == [f"Final answer: I was asked: say {w}" for w in ("one", "two", "three")]
        rows = {s["id"]: s for s in h.log.sessions()}
        assert rows[sid]["parent_id"] is None
        assert {c["session_id"] for c in kids} == {i for i, s in rows.items() if s["parent_id"] == sid}
        for c in kids:
            created = h.log.events(c["session_id"])[0].payload
            assert rows[c["session_id"]]["kind"] == "delegate" and created["parent_id"] == sid
            assert created["origin"]["depth"] == 1 and created["origin"]["limits"]["max_turns"] == 20
        answered_once(h.log, sid)
    finally:
        await h.close()


@pytest.mark.asyncio
async def test_a_child_whose_model_fails_is_an_observation_for_the_parent():
    h = host()
    await h.start()
    try:
        sid = h.brain.create_session(model="scripted:delegate", tools=["delegate"])["id"]
        text = ask({"tasks": [worker("MODEL_ERROR please"), worker("fine")]})
        assert await h.brain.run_turn(sid, text) == "end_turn"
        (result,) = [e.payload for e in h.log.events(sid, types=["tool_result"])]
        bad, good = result["children"]
        assert bad["status"] == "failed" and "fails on purpose" in bad["error"] and good["status"] == "done"
        assert "failed" in result["content"][0]["text"]
    finally:
        await h.close()


@pytest.mark.parametrize("inp, says", [
    ({}, "non-empty list"),
    ({"tasks": "do it"}, "non-empty list"),
    ({"tasks": []}, "non-empty list"),
    ({"tasks": [{"prompt": f"t{i}"} for i in range(1000)]}, "at most 16 children"),
    ({"tasks": [{}]}, "needs a prompt"),
    ({"tasks": [{"prompt": "   "}]}, "needs a prompt"),
    ({"tasks": [{"prompt": "x" * 200_001}]}, "at most 100000"),
    ({"tasks": [{"prompt": "x", "max_turns": 10**12}]}, "at most 200"),
    ({"tasks": [{"prompt": "x", "max_turns": -1}]}, "positive whole number"),
    ({"tasks": [{"prompt": "x", "max_turns": 2.5}]}, "whole number"),
    ({"tasks": [{"prompt": "x", "max_tokens": True}]}, "positive whole number"),
    ({"tasks": [{"prompt": "x", "timeout": 1e308}]}, "at most 7200"),
    ({"tasks": [{"prompt": "x", "timeout": math.inf}]}, "positive number"),
    ({"tasks": [{"prompt": "x", "timeout": math.nan}]}, "positive number"),
    ({"tasks": [{"prompt": "x", "timeout": "soon"}]}, "positive number"),
    ({"tasks": [{"prompt": "x", "tools": ["rm -rf"]}]}, "unknown tools"),
    ({"tasks": [{"prompt": "x", "tools": "python"}]}, "list of tool names"),
    ({"tasks": [{"prompt": "x", "files": ["/etc/passwd"]}]}, "not inside the workspace"),
    ({"tasks": [{"prompt": "x", "files": ["a/../../b"]}]}, "not inside the workspace"),
    ({"tasks": [{"prompt": "x", "files": ["a\0b"]}]}, "contains a NUL character"),
    ({"tasks": [{"prompt": "x", "files": ["bell\x07.csv"]}]}, "contains control characters"),
    ({"tasks": [{"prompt": "x", "files": [{"deep": [[[]]]}]}]}, "give a path relative to"),
    ({"tasks": [{"prompt": "x", "model": 7}]}, "model must be"),
    ({"tasks": [{"prompt": "x", "surprise": 1}]}, "unknown fields"),
    ({"tasks": [{"prompt": "x"}], "extra": 1}, "unknown fields"),
    ({"tasks": [["nested", ["list"]]]}, "must be an object"),
    ({"tasks": [{"prompt": "x", "check": 42}]}, "check must be Python source"),
    ({"tasks": [{"prompt": "x", "check": " "}]}, "check must be Python source"),
    ({"tasks": [{"prompt": "x", "check": "x" * 100_001}]}, "check must be Python source"),
    ({"tasks": [{"prompt": "x", "check": {}}]}, "check must be Python source"),
    ({"tasks": [{"prompt": "x", "check": {"rubric": ""}}]}, "check must be Python source"),
    ({"tasks": [{"prompt": "x", "check": {"rubric": "r" * 100_001}}]}, "check must be Python source"),
    ({"tasks": [{"prompt": "x", "check": {"rubric": ["nested", {"list": 1}]}}]}, "check must be Python source"),
    ({"tasks": [{"prompt": "x", "check": {"rubric": "r", "python": "1"}}]}, "check must be Python source"),
    ({"tasks": [{"prompt": "x", "check": {"rubric": "r", "grader": "m"}}]}, "check must be Python source"),
    ({"tasks": [{"prompt": "x", "check": {"rubric": "r", "model": 7}}]}, "the check's model must be a model name"),
    ({"tasks": [{"prompt": "x", "check": {"python": "1", "model": "m"}}]}, "a python check runs no model"),
    ({"tasks": [{"prompt": "x", "rounds": 2}]}, "rounds needs a check"),
    ({"tasks": [{"prompt": "x", "check": "1", "rounds": 11}]}, "at most 10"),
    ({"tasks": [{"prompt": "x", "check": "1", "rounds": 0}]}, "positive whole number"),
    ({"tasks": [{"prompt": "x", "check": "1", "rounds": math.nan}]}, "positive whole number"),
    ({"tasks": [{"prompt": "x", "check": "1", "rounds": True}]}, "positive whole number"),
])
def test_bad_input_is_refused_with_a_reason(inp, says):
    with pytest.raises(BadInput, match=says):
        parse(inp, parent_model="scripted", settings=DelegateSettings(), known_tools={"python", "delegate"})


@pytest.mark.asyncio
async def test_bad_calls_are_tool_errors_and_the_turn_goes_on():
    h = host(max_depth=1, max_running=3)
    await h.start()
    try:
        sid = h.brain.create_session(model="scripted:delegate", tools=["delegate"])["id"]
        bad = [{"tasks": [{"prompt": f"t{i}"} for i in range(1000)]}, {"tasks": [worker("x", model="no-such-model")]},
               {"tasks": [worker(f"x{i}") for i in range(4)]}, {"nonsense": [1, [2, [3]]]}]
        text = ask(*bad) + "\n```json\n{not json\n```"
        assert await h.brain.run_turn(sid, text) == "end_turn"
        results = [e.payload for e in h.log.events(sid, types=["tool_result"])]
        assert len(results) == 5 and all(r["is_error"] for r in results)
        said = [r["content"][0]["text"] for r in results]
        assert "at most 16 children" in said[0] and "cannot delegate" in said[1] and "at most 3 may" in said[2]
        assert "non-empty list" in said[3] and "non-empty list" in said[4]
        assert [s["id"] for s in h.log.sessions()] == [sid]  # nothing was started
        answered_once(h.log, sid)
    finally:
        await h.close()


@pytest.mark.asyncio
async def test_concurrent_calls_at_the_running_cap_start_no_more_children_than_it_allows():
    h = host(max_running=2)
    await h.start()
    try:
        sid = h.brain.create_session(model="scripted:delegate", tools=["delegate"])["id"]
        assert await h.brain.run_turn(sid, ask(*({"tasks": [worker(f"say {i}")]} for i in range(3)))) == "end_turn"
        results = [e.payload for e in h.log.events(sid, types=["tool_result"])]
        assert [r["is_error"] for r in results].count(True) == 1
        assert len([s for s in h.log.sessions() if s["parent_id"] == sid]) == 2
        assert h.plugin("delegate").running == set()
        # the reservations were given back: the next call may use the whole cap again
        assert await h.brain.run_turn(sid, ask({"tasks": [worker("a"), worker("b")]})) == "end_turn"
        assert not h.log.events(sid, types=["tool_result"])[-1].payload["is_error"]
    finally:
        await h.close()


@pytest.mark.asyncio
async def test_nesting_is_capped():
    h = host(max_depth=2)
    await h.start()
    try:
        innermost = {"tasks": [worker("leaf")]}
        middle = {"tasks": [{"prompt": ask(innermost), "model": "scripted:delegate", "tools": ["delegate"]}]}
        top = {"tasks": [{"prompt": ask(middle), "model": "scripted:delegate", "tools": ["delegate"]}]}
        sid = h.brain.create_session(model="scripted:delegate", tools=["delegate"])["id"]
        assert await h.brain.run_turn(sid, ask(top)) == "end_turn"
        rows = h.log.sessions()
        depth = {s["id"]: (0 if s["parent_id"] is None else None) for s in rows}
        for _ in rows:
            for s in rows:
                if s["parent_id"] is not None and depth.get(s["parent_id"]) is not None:
                    depth[s["id"]] = depth[s["parent_id"]] + 1
        assert sorted(depth.values()) == [0, 1, 2]  # parent, child, grandchild: no great-grandchild
        grandchild = next(i for i, d in depth.items() if d == 2)
        (refused,) = [e.payload for e in h.log.events(grandchild, types=["tool_result"])]
        assert refused["is_error"] and "nested 2 deep" in refused["content"][0]["text"]
        for s in rows:
            answered_once(h.log, s["id"])
    finally:
        await h.close()


def cut_off_call(brain, log, tasks: list[dict]) -> tuple[str, list[str], dict]:
    """A parent whose delegate call of `tasks` started and was cut off, as the loop writes it: its session id, its
    children's ids and their origin (without the index)."""
    from workbench.brain.request import build_request
    from workbench.delegate.script import delegate_script

    sid = brain.create_session(model="scripted:delegate", tools=["delegate"])["id"]
    log.append(sid, "user_message", {"text": ask({"tasks": tasks})})
    request = build_request(log.events(sid))
    message = delegate_script(request).message(request)
    (call,) = [b for b in message["content"] if b["type"] == "tool_use"]
    log.append(sid, "assistant_turn", {"message": message, "usage": message["usage"]})
    log.append(sid, "tool_started", {"tool_use_id": call["id"], "name": "delegate", "input": call["input"]})
    return sid, [child_id(sid, call["id"], i) for i in range(len(tasks))], {"tool_use_id": call["id"], "depth": 1}


@pytest.mark.asyncio
async def test_a_cut_off_delegate_call_reattaches_to_its_children_on_resume():
    """The state a dead process leaves: the call started; child 1 finished, child 2 is mid-turn, child 3 never began."""
    h = host()
    await h.start()
    try:
        brain, log = h.brain, h.log
        tasks = [worker("first"), worker("second"), worker("third")]
        sid, ids, origin = cut_off_call(brain, log, tasks)
        for i in (0, 1):
            brain.create_session(ids[i], model="scripted:worker", kind="delegate", parent_id=sid, origin={**origin, "index": i})
        assert await brain.run_turn(ids[0], "first") == "end_turn"
        log.append(ids[1], "user_message", {"text": "second"})  # cut off before its model answered
        before = len(log.events(ids[0]))

        assert await brain.resume(sid) == "end_turn"
        assert len(log.events(ids[0])) == before  # the finished child was not run again
        assert [e.type for e in log.events(ids[1])].count("resumed") == 1
        (result,) = [e.payload for e in log.events(sid, types=["tool_result"])]
        assert [c["session_id"] for c in result["children"]] == ids
        assert [c["answer"] for c in result["children"]] == [f"Final answer: I was asked: {w}" for w in ("first", "second", "third")]
        assert {s["id"] for s in log.sessions() if s["parent_id"] == sid} == set(ids)
        for s in (sid, *ids):
            answered_once(log, s)
            assert log.session(s)["state"] == "ended"
    finally:
        await h.close()


def test_a_watch_counts_the_same_whatever_order_events_arrive_in():
    from workbench.delegate.run import Watch
    from workbench.delegate.spec import ChildSpec
    from workbench.log import Event

    def ev(seq, type_, stop=None, tokens=0):
        payload = {"text": "go"} if type_ == "user_message" else {
            "message": {"stop_reason": stop}, "usage": {"input_tokens": tokens, "output_tokens": 0}}
        return Event("c", seq, datetime.now(UTC), type_, payload)

    events = [ev(2, "user_message"), ev(4, "assistant_turn", "tool_use", 10), ev(7, "assistant_turn", "tool_use", 10)]
    for order in (events, events[::-1], events + events):
        watch = Watch(ChildSpec(prompt="p", model="m", title="t", max_turns=2))
        for e in order:
            watch.feed(e)
        assert watch.reason == "max_turns 2 reached" and watch.over.is_set()
    by_tokens = Watch(ChildSpec(prompt="p", model="m", title="t", max_tokens=15))
    for e in events[:2][::-1]:
        by_tokens.feed(e)
    assert by_tokens.reason is None
    by_tokens.feed(events[2])
    assert by_tokens.reason == "max_tokens 15 reached (20 used)"
    ended = Watch(ChildSpec(prompt="p", model="m", title="t", max_turns=1))
    for e in (events[0], ev(4, "assistant_turn", "end_turn", 10)):
        ended.feed(e)
    assert ended.reason is None  # a response that ends the turn is never cut off


def test_calls_are_batched_only_while_consecutive_calls_are_concurrent():
    from workbench.brain.calls import _batches

    calls = [{"id": i, "c": c} for i, c in enumerate([True, True, False, True, False, False, True, True, True])]
    batches = _batches(calls, lambda call: call["c"])
    assert [[c["id"] for c in b] for b in batches] == [[0, 1], [2], [3], [4], [5], [6, 7, 8]]
    assert _batches([], lambda call: True) == []


# -- checks graded by a model, and outcome mode (no hands needed: a rubric reads the answer and a file listing) ----


def checks_of(log, cid) -> list[dict]:
    return [e.payload for e in log.events(cid, types=["delegate_checked"])]


@pytest.mark.asyncio
async def test_a_rubric_check_is_graded_by_a_model_and_recorded():
    h = host()
    await h.start()
    try:
        sid = h.brain.create_session(model="scripted:delegate", tools=["delegate"])["id"]
        rubric = {"rubric": 'The answer says "42".'}
        text = ask({"tasks": [worker("say 42", check=rubric), worker("say 41", check=rubric),
                              worker("say 42 <script>x</script>", check={"rubric": rubric["rubric"], "model": "scripted:delegate"})]})
        assert await h.brain.run_turn(sid, text) == "end_turn"
        (result,) = [e.payload for e in h.log.events(sid, types=["tool_result"])]
        good, bad, unparsed = result["children"]
        assert good["check"]["passed"] and good["check"]["kind"] == "rubric" and good["check"]["explanation"] == "the answer has 42"
        assert not bad["check"]["passed"] and bad["check"]["explanation"] == "the answer lacks 42"
        # a grader that does not answer with the JSON asked for: no verdict (an error), never a pass
        assert not unparsed["check"]["passed"] and "did not answer with the JSON asked for" in unparsed["check"]["error"]
        grader = good["check"]["grader"]
        assert grader["model"] == "scripted:worker"  # the child's model, as the rubric names none
        asked = grader["request"]["messages"][0]["content"][0]["text"]
        assert "<task>\nsay 42\n</task>" in asked and "<files>\n(no files)\n</files>" in asked
        assert "check: passed: the answer has 42" in result["content"][0]["text"]
        assert "check: FAILED: the answer lacks 42" in result["content"][1]["text"]
        for child in (good, bad, unparsed):
            assert checks_of(h.log, child["session_id"]) == [child["check"]]
        answered_once(h.log, sid)
    finally:
        await h.close()


@pytest.mark.asyncio
async def test_outcome_mode_sends_a_failed_verdict_back_until_the_rounds_are_spent():
    h = host()
    await h.start()
    try:
        sid = h.brain.create_session(model="scripted:delegate", tools=["delegate"])["id"]
        text = ask({"tasks": [worker("say 41", check={"rubric": 'says "42"'}, rounds=3),
                              worker("say 42", check={"rubric": 'says "42"'}, rounds=3),
                              worker("say 7", check={"rubric": 'says "42"', "model": "scripted:delegate"}, rounds=3)]})
        assert await h.brain.run_turn(sid, text) == "end_turn"
        (result,) = [e.payload for e in h.log.events(sid, types=["tool_result"])]
        spent, passed, ungraded = result["children"]
        assert (spent["rounds"], spent["check"]["passed"], spent["status"]) == (3, False, "done")
        assert "check: FAILED: the answer lacks 42 (after 3 turns)" in result["content"][0]["text"]
        events = h.log.events(spent["session_id"])
        told = [e.payload["text"] for e in events if e.type == "user_message"]
        assert told[0] == "say 41" and len(told) == 3
        assert told[1].startswith("A check of your work failed (turn 1 of 3): the answer lacks 42")
        assert told[2].startswith("A check of your work failed (turn 2 of 3)")
        assert [c["passed"] for c in checks_of(h.log, spent["session_id"])] == [False] * 3
        types = [e.type for e in events if e.type in ("user_message", "turn_ended", "delegate_checked")]
        assert types == ["user_message", "turn_ended", "delegate_checked"] * 3  # checked after each turn, told after
        # passed at once: one turn, one check
        assert passed["rounds"] == 1 and passed["check"]["passed"] and len(checks_of(h.log, passed["session_id"])) == 1
        # a grader that could not grade ends the rounds: another turn would not tell more
        assert ungraded["rounds"] == 1 and ungraded["check"]["error"]
        answered_once(h.log, sid)
    finally:
        await h.close()


@pytest.mark.asyncio
async def test_a_rubric_naming_an_unknown_grader_is_refused_before_anything_starts():
    h = host()
    await h.start()
    try:
        sid = h.brain.create_session(model="scripted:delegate", tools=["delegate"])["id"]
        text = ask({"tasks": [worker("x", check={"rubric": 'says "x"', "model": "no-such-model"})]})
        assert await h.brain.run_turn(sid, text) == "end_turn"
        (result,) = [e.payload for e in h.log.events(sid, types=["tool_result"])]
        assert result["is_error"] and "cannot delegate" in result["content"][0]["text"]
        assert [s["id"] for s in h.log.sessions()] == [sid]
    finally:
        await h.close()


@pytest.mark.asyncio
async def test_outcome_mode_goes_on_after_a_crash_from_the_round_each_child_was_in():
    """A dead process left: child 1 checked (failed) but not yet told; child 2 told, cut off before its model
    answered; child 3 answered, not yet checked. The resumed call checks, tells and runs each exactly once more."""
    h = host()
    await h.start()
    try:
        brain, log = h.brain, h.log
        check = {"rubric": 'says "42"'}
        tasks = [worker(f"say {w}", check=check, rounds=3) for w in ("one", "two", "three")]
        from workbench.delegate.run import feedback

        sid, ids, origin = cut_off_call(brain, log, tasks)
        failed = {"passed": False, "score": 0.0, "explanation": "the answer lacks 42", "kind": "rubric"}
        for i, w in enumerate(("one", "two", "three")):
            brain.create_session(ids[i], model="scripted:worker", kind="delegate", parent_id=sid, origin={**origin, "index": i})
            assert await brain.run_turn(ids[i], f"say {w}") == "end_turn"
        log.append(ids[0], "delegate_checked", failed)
        log.append(ids[1], "delegate_checked", failed)
        log.append(ids[1], "user_message", {"text": feedback(failed, 1, 3)})  # told, cut off before its model answered

        assert await brain.resume(sid) == "end_turn"
        (result,) = [e.payload for e in log.events(sid, types=["tool_result"])]
        assert [c["rounds"] for c in result["children"]] == [3, 3, 3]
        for cid in ids:
            events = log.events(cid)
            told = [e.payload["text"] for e in events if e.type == "user_message"]
            assert len(told) == 3 and [t[:40] for t in told[1:]] == [feedback(failed, n, 3)[:40] for n in (1, 2)]
            assert len(checks_of(log, cid)) == 3  # one verdict per turn: none checked twice, none skipped
            answered_once(log, cid)
        answered_once(log, sid)
    finally:
        await h.close()
