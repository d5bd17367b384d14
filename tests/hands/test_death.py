"""Kernel deaths in a real brain session: each is data for the model, never the end of the turn."""

from __future__ import annotations

import asyncio

import psutil
import pytest

from workbench.brain import Brain
from workbench.brain.models import ScriptedModel
from workbench.brain.models.scripted import Reply
from workbench.hands import Observation
from workbench.hands.factory import HandsFactory
from workbench.render import result_blocks

KILLS = 20


def brain_with(log, factory, steps) -> Brain:
    return Brain(log, model_factory=lambda name: ScriptedModel(steps), hands_factory=factory)


@pytest.mark.asyncio
async def test_twenty_sigkills_in_one_session(log, settings):
    settings.pool_size = 3
    factory = HandsFactory(settings)
    await factory.start()
    steps = [Reply(code=["x = 1\nimport os, signal; os.kill(os.getpid(), signal.SIGKILL)"]) for _ in range(KILLS)]
    steps += [Reply(code=["print('alive', 'x' in dir())"]), Reply(text="done")]
    brain = brain_with(log, factory, steps)
    sid = brain.create_session(model="scripted")["id"]
    try:
        assert await brain.run_turn(sid, "die twenty times") == "end_turn"
    finally:
        await brain.close()
        await factory.close()
    events = log.events(sid)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # nothing lost, nothing doubled
    results = [e.payload for e in events if e.type == "tool_result"]
    assert len(results) == KILLS + 1
    died = [r for r in results[:KILLS] if r["is_error"] and r["observation"]["error"]["ename"] == "KernelDied"]
    assert len(died) == KILLS
    assert "signal SIGKILL" in result_blocks(died[0])[0]["text"]
    assert Observation.from_json(results[-1]["observation"]).stdout == "alive False\n"
    started = [e.payload for e in events if e.type == "hands_started"]
    assert [s["generation"] for s in started] == list(range(1, KILLS + 2))
    assert len({s["pid"] for s in started}) == KILLS + 1  # 21 distinct kernels
    deaths = [e.payload for e in events if e.type == "hands_died"]
    assert [d["generation"] for d in deaths] == list(range(1, KILLS + 1))
    assert all(d["signal"] == 9 and d["during"] == "call" for d in deaths)
    assert [r["observation"]["generation"] for r in results[:KILLS]] == list(range(1, KILLS + 1))
    assert not any(psutil.pid_exists(s["pid"]) for s in started)


@pytest.mark.asyncio
async def test_killed_from_outside_while_sleeping(factory):
    events = []

    async def sink(t, p):
        events.append((t, p))

    hands = factory("s", {"hands": {"timeout": 60}}, sink)
    await hands.execute("a = 1")
    pid = hands.status()["pid"]
    call = asyncio.ensure_future(hands.execute("import time; time.sleep(60)"))
    while hands.status()["state"] != "busy":
        await asyncio.sleep(0.01)
    psutil.Process(pid).kill()
    obs = await call
    assert obs.error["ename"] == "KernelDied" and "SIGKILL" in obs.error["evalue"]
    nxt = await hands.execute("'a' in dir()")
    assert nxt.result == "False" and nxt.generation == 2
    assert [t for t, _ in events].count("hands_died") == 1


@pytest.mark.asyncio
async def test_death_between_calls_is_noticed_and_told(factory):
    events = []

    async def sink(t, p):
        events.append((t, p))

    hands = factory("s", {}, sink)
    await hands.execute("b = 2")
    proc = psutil.Process(hands.status()["pid"])
    proc.kill()
    proc.wait(5)
    obs = await hands.execute("'b' in dir()")
    assert obs.result == "False" and obs.generation == 2
    assert "died between calls" in obs.text()
    died = [p for t, p in events if t == "hands_died"]
    assert died[0]["during"] == "idle" and died[0]["generation"] == 1


@pytest.mark.asyncio
async def test_interrupt_ignored_means_replaced(factory):
    events = []

    async def sink(t, p):
        events.append((t, p))

    hands = factory("s", {"hands": {"interrupt_grace": 0.5}}, sink)
    await hands.execute("c = 3")
    obs = await hands.execute("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass", timeout=0.5)
    assert obs.error["ename"] == "KernelTimeout" and "ignored the interrupt" in obs.error["evalue"]
    assert [p["action"] for t, p in events if t == "hands_timeout"] == ["interrupt", "replaced"]
    nxt = await hands.execute("'c' in dir()")
    assert nxt.result == "False" and nxt.generation == 2


@pytest.mark.asyncio
async def test_first_model_request_does_not_wait_for_hands(log, settings):
    settings.pool_size = 0  # an empty pool: the kernel must start lazily, after the model call
    factory = HandsFactory(settings)
    brain = brain_with(log, factory, [Reply(code=["1 + 1"]), Reply(text="two")])
    sid = brain.create_session(model="scripted")["id"]
    try:
        assert await brain.run_turn(sid, "add") == "end_turn"
    finally:
        await brain.close()
        await factory.close()
    types = [e.type for e in log.events(sid)]
    assert types.index("model_request") < types.index("assistant_turn") < types.index("hands_started")
    started = [e.payload for e in log.events(sid) if e.type == "hands_started"]
    assert started[0]["pooled"] is False and started[0]["start_ms"] > 0

