"""Limits: a memory hog and a fork bomb are contained; a gigabyte print is cut short."""

from __future__ import annotations

import json

import pytest

from workbench.brain import Brain
from workbench.brain.models import ScriptedModel
from workbench.brain.models.scripted import Reply
from workbench.hands import Observation
from workbench.hands.factory import HandsFactory
from workbench.render import result_blocks


@pytest.mark.asyncio
async def test_memory_hog_is_contained_and_others_keep_working(settings, recorder):
    settings.memory_mb, settings.pool_size = 512, 2
    factory = HandsFactory(settings)
    await factory.start()
    try:
        events, sink = recorder
        hog, bystander = factory("hog", {}, sink), factory("bystander", {}, None)
        await bystander.execute("kept = 'yes'")
        obs = await hog.execute("big = b'x' * (2 * 1024 ** 3)\nlen(big)")
        how = events[0][1]["limits"]["memory"]
        # a memory cgroup OOM-kills the kernel; RLIMIT_AS makes the allocation fail instead
        if how.startswith("cgroup"):
            assert obs.error["ename"] == "KernelDied" and "out of memory" in obs.error["evalue"], obs.to_json()
        else:
            assert obs.error["ename"] == "MemoryError", obs.to_json()
        assert (await hog.execute("'after'")).result == "'after'"
        assert (await bystander.execute("kept")).result == "'yes'"
    finally:
        await factory.close()


@pytest.mark.asyncio
async def test_fork_bomb_is_contained(settings, recorder):
    settings.max_processes = 40
    factory = HandsFactory(settings)
    try:
        events, sink = recorder
        hands = factory("bomb", {"hands": {"timeout": 30}}, sink)
        await hands.execute("1")
        how = events[0][1]["limits"]["processes"]
        if how.startswith("not enforced") or "every process of this uid" in how:
            # local hands under RLIMIT_NPROC share the count of the user's own processes: no bystander is safe
            pytest.skip(f"no process limit of a kernel's own on this host: {how}")
        bomb = (
            "import os, time\nforked = 0\n"
            "for _ in range(1000):\n"
            "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
            "    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n"
            "    forked += 1\nforked"
        )
        obs = await hands.execute(bomb)
        assert obs.ok and 0 < int(obs.result) < 40, obs.to_json()
        other = factory("other", {}, None)
        assert (await other.execute("import subprocess; subprocess.run(['true']).returncode")).result == "0"
    finally:
        await factory.close()


@pytest.mark.asyncio
async def test_gigabyte_print_is_truncated_and_the_log_stays_small(log, db_path, settings):
    factory = HandsFactory(settings)
    steps = [
        Reply(code=["print('x' * 10**9)"]),
        Reply(code=["import sys\nfor _ in range(10**5): sys.stderr.write('y' * 10**4)"]),
        Reply(text="done"),
    ]
    brain = Brain(log, model_factory=lambda name: ScriptedModel(steps), hands_factory=factory)
    sid = brain.create_session(model="scripted", config={"hands": {"output_limit": 5000}})["id"]
    try:
        assert await brain.run_turn(sid, "flood") == "end_turn"
    finally:
        await brain.close()
        await factory.close()
    results = [e.payload for e in log.events(sid) if e.type == "tool_result"]
    out, err = (Observation.from_json(r["observation"]) for r in results[:2])
    # the first and the last 2,500 characters of each stream, and what was cut between them
    cut = f"{10**9 + 1 - 5000:,}"
    assert out.stdout == "x" * 2500 + f"\n[... {cut} characters of stdout cut here ...]\n" + "x" * 2499 + "\n"
    assert "stdout truncated" in out.truncated[0] and f"cut {cut} in between" in out.truncated[0]
    cut = f"{10**9 - 5000:,}"
    assert err.stderr == "y" * 2500 + f"\n[... {cut} characters of stderr cut here ...]\n" + "y" * 2500
    assert f"cut {cut} in between" in err.truncated[0]
    assert "truncated" in result_blocks(results[0])[0]["text"]
    assert all(len(json.dumps(r)) < 50_000 for r in results)
    log.close()
    assert db_path.stat().st_size < 20 * 1024 * 1024


@pytest.mark.asyncio
async def test_cpu_time_limit_ends_a_spinning_kernel(settings):
    settings.cpu_seconds, settings.pool_size = 4, 0  # booting takes about a second of CPU
    factory = HandsFactory(settings)
    try:
        hands = factory("spin", {"hands": {"timeout": 60}}, None)
        obs = await hands.execute("while True: pass")
        assert obs.error["ename"] == "KernelDied" and "SIGXCPU" in obs.error["evalue"], obs.to_json()
        assert (await hands.execute("'again'")).result == "'again'"
    finally:
        await factory.close()
