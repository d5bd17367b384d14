"""Opt-in rehydration: after a death, replayable calls are re-run, and the model is told."""

from __future__ import annotations

import pytest

from workbench.brain import Brain
from workbench.brain.models import ScriptedModel
from workbench.brain.models.scripted import Reply
from workbench.hands import Observation
from workbench.hands.factory import HandsFactory
from workbench.render import result_blocks

KILL = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


def steps():
    return [
        Reply(tool_calls=[("python", {"code": "import math\nbase = 10", "replayable": True})]),
        Reply(tool_calls=[("python", {"code": "side = 1"})]),  # not marked: never re-run
        Reply(tool_calls=[("python", {"code": "1/0", "replayable": True})]),  # failed: never re-run
        Reply(code=[KILL]),
        Reply(code=["print(base, math.pi > 3, 'side' in dir())"]),
        Reply(text="done"),
    ]


async def run(log, settings, replay: bool):
    factory = HandsFactory(settings)
    brain = Brain(log, model_factory=lambda name: ScriptedModel(steps()), hands_factory=factory)
    sid = brain.create_session(model="scripted", config={"hands": {"replay": replay}})["id"]
    try:
        assert await brain.run_turn(sid, "go") == "end_turn"
    finally:
        await brain.close()
        await factory.close()
    return log.events(sid)


@pytest.mark.asyncio
async def test_replay_reruns_marked_calls_and_says_so(log, settings):
    events = await run(log, settings, replay=True)
    results = [e.payload for e in events if e.type == "tool_result"]
    assert results[0]["replayable"] is True
    last = results[-1]
    assert Observation.from_json(last["observation"]).stdout == "10 True False\n"
    text = result_blocks(last)[0]["text"]
    assert "1 earlier call(s) marked replayable were re-run" in text and "import math" in text
    replayed = [e.payload for e in events if e.type == "hands_replayed"]
    first_id = next(e.payload["tool_use_id"] for e in events if e.type == "tool_started")
    assert replayed == [{"generation": 2, "calls": [first_id], "ok": True, "failed": None}]


@pytest.mark.asyncio
async def test_no_replay_unless_asked(log, settings):
    events = await run(log, settings, replay=False)
    last = [e.payload for e in events if e.type == "tool_result"][-1]
    assert last["observation"]["error"]["ename"] == "NameError"
    assert not any(e.type == "hands_replayed" for e in events)
