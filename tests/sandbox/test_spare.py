"""The hot spare of sandboxed hands, and idle closing: a dead kernel's replacement is ready at once, in the
same workspace and nothing else's; idle hands stop (their processes go) and come back at the next call."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import psutil
import pytest
import pytest_asyncio

from workbench.hands.factory import HandsFactory, HandsSettings
from workbench.hands.isolating import WorkspaceSettings

from .conftest import needs_sandbox, run

pytestmark = [needs_sandbox, pytest.mark.asyncio]


async def until(check, within: float = 60.0, every: float = 0.05) -> None:
    """Wait (generously: a loaded machine boots kernels slowly) until `check()` is true."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(every)


async def kill(hands) -> None:
    """SIGKILL the session's kernel and wait until the hands can see it died (the next call then says so)."""
    kernel = hands.kernel
    os.kill(hands.status()["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while await kernel.death() is None:
        assert time.monotonic() < deadline, "the killed kernel did not die"
        await asyncio.sleep(0.05)


def alive(pid: int | None) -> bool:
    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest_asyncio.fixture
async def make_factory(tmp_path):
    """make(**settings) -> a started sandbox HandsFactory (workspaces under tmp_path), closed at the end."""
    made: list[HandsFactory] = []

    async def make(**kw) -> HandsFactory:
        s = HandsSettings(backend="sandbox", registry_dir=str(tmp_path / "registry"), **{"pool_size": 0, **kw})
        f = HandsFactory(s, workspaces=WorkspaceSettings(workspace_mb=32, workspace_root=str(tmp_path / "ws")))
        await f.start()
        made.append(f)
        return f

    yield make
    for f in made:
        await f.close()


def recorder():
    events: list[tuple[str, dict]] = []

    async def sink(type: str, payload: dict) -> None:
        events.append((type, payload))

    return events, sink


async def test_a_killed_kernel_is_replaced_by_the_spare_in_the_same_workspace(make_factory):
    factory = await make_factory(pool_size=1)  # the first kernel is a pooled one, adopted: its workspace is the session's
    events, sink = recorder()
    hands = factory("spare-a", {}, sink)
    await run(hands, "open('before.txt', 'w').write('written before the kill'); x = 1")
    await until(lambda: hands.status()["spare"] == "ready")
    spare_pid = hands.spare.ident["pid"]
    assert alive(spare_pid) and spare_pid != hands.status()["pid"]
    await kill(hands)
    obs = await hands.execute("open('before.txt').read()", timeout=30)
    assert obs.ok and obs.result == "'written before the kill'", obs.text()
    assert "fresh kernel" in obs.text()  # the model is told its variables are gone
    assert hands.status()["pid"] == spare_pid and hands.status()["generation"] == 2
    started = [p for t, p in events if t == "hands_started"]
    assert [(p["pooled"], p["spare"]) for p in started] == [(True, False), (False, True)]
    assert started[1]["reason"] == "replace a dead kernel"
    assert started[1]["limits"]["workspace"] == started[0]["limits"]["workspace"]
    # a new spare comes for the next death
    await until(lambda: hands.status()["spare"] == "ready")
    assert hands.spare.ident["pid"] not in (spare_pid, None)


async def test_a_session_that_turns_its_spare_off_runs_one_kernel_and_a_death_is_replaced_cold(make_factory):
    """`config.hands.spare = false` (eval attempts and verifiers set it): no second kernel boots beside the session's
    after its calls, and a dead kernel's replacement is started then, in the same workspace."""
    factory = await make_factory(pool_size=0)
    events, sink = recorder()
    hands = factory("no-spare", {"hands": {"spare": False}}, sink)
    await run(hands, "open('kept.txt', 'w').write('kept'); x = 1")
    await run(hands, "x + 1")
    await asyncio.sleep(1.0)  # a spare would be booting by now
    assert hands.spare is None and hands.status()["spare"] is None
    await kill(hands)
    obs = await hands.execute("open('kept.txt').read()", timeout=60)
    assert obs.ok and obs.result == "'kept'", obs.text()
    started = [p for t, p in events if t == "hands_started"]
    assert [(p["spare"], p["reason"]) for p in started][1:] == [(False, "replace a dead kernel")]
    await asyncio.sleep(1.0)
    assert hands.spare is None and hands.status()["spare"] is None


async def test_the_spare_boots_once_the_kernel_has_been_idle_and_never_for_hands_closed_at_once(make_factory):
    """`spare_after`: calls that keep coming put the spare off; it boots once the kernel has been idle that long;
    hands closed right after their call never boot one."""
    factory = await make_factory(pool_size=0, spare_after=2.0)
    hands = factory("spare-later", {}, None)
    for _ in range(4):  # a call every half second: never idle for two
        await run(hands, "x = 1")
        await asyncio.sleep(0.5)
        assert hands.status()["spare"] is None and hands.spare is None
    await until(lambda: hands.status()["spare"] == "ready")
    brief = factory("closed-at-once", {}, None)
    await run(brief, "y = 2")
    await brief.close()
    await asyncio.sleep(3.0)
    assert brief.spare is None and brief.status()["spare"] is None and brief._spare_task is None


async def test_after_a_death_the_next_spare_boots_at_once_not_after_the_next_call(make_factory):
    """Deaths in quick succession are each served by a spare: the spare that replaced a dead kernel has one
    booting behind it while the first call in it still runs."""
    factory = await make_factory(pool_size=0)
    hands = factory("spare-again", {}, None)
    await run(hands, "x = 1")
    await until(lambda: hands.status()["spare"] == "ready")
    await kill(hands)
    call = asyncio.ensure_future(hands.execute("import time; time.sleep(300)", timeout=600))
    try:
        await until(lambda: hands.status()["state"] == "busy")
        assert hands.status()["generation"] == 2
        await until(lambda: hands.status()["spare"] in ("starting", "ready"), within=30)
    finally:
        await hands.interrupt()
        obs = await asyncio.wait_for(call, 120)
    assert not obs.ok  # interrupted, in the kernel that was the spare
    await until(lambda: hands.status()["spare"] == "ready")


async def test_the_spare_of_one_session_never_sees_another_sessions_workspace(make_factory):
    factory = await make_factory(pool_size=0)
    a = factory("iso-a", {}, None)
    b = factory("iso-b", {}, None)
    await run(b, "open('b-secret.txt', 'w').write('b')")
    await run(a, "open('a-own.txt', 'w').write('a')")
    where_a, where_b = str(await a.workspace()), str(await b.workspace())  # on the host
    assert where_a != where_b
    await until(lambda: a.status()["spare"] == "ready")
    await kill(a)
    out = json.loads((await run(a, f"""
import os, json
print(json.dumps({{"cwd": os.getcwd(), "files": sorted(os.listdir('.')), "b": os.path.exists({where_b!r}),
                  "root": os.path.exists(os.path.dirname({where_b!r})), "a": os.path.exists({where_a!r})}}))""")).splitlines()[-1])
    assert out["cwd"] == "/workspace" and out["files"] == ["a-own.txt"]
    # no host path of any workspace is there, its own included: the directory that holds them (under the host
    # user's data dir) is not even named inside
    assert out["b"] is False and out["root"] is False and out["a"] is False, out
    assert a.status()["generation"] == 2


async def test_idle_hands_stop_their_processes_and_come_back_on_the_next_call(make_factory):
    factory = await make_factory(pool_size=0, idle_timeout=3.0, spare_after=0.5)  # a spare boots before the closing
    events, sink = recorder()
    hands = factory("idle-a", {}, sink)
    await run(hands, "open('kept.txt', 'w').write('still here')")
    await until(lambda: hands.status()["spare"] == "ready")
    pids = [hands.status()["pid"], hands.spare.ident["pid"]]
    procs = [psutil.Process(p) for p in pids]
    procs += [c for p in procs for c in p.children(recursive=True)]
    assert all(alive(p) for p in pids)
    await until(lambda: hands.status()["state"] == "closed", within=60)
    _, left = await asyncio.to_thread(psutil.wait_procs, procs, 30)
    assert not left, f"processes of idle hands outlived their closing: {left}"
    assert hands.status()["pid"] is None and hands.status()["spare"] is None
    assert ("hands_stopped", {"generation": 1, "reason": "idle"}) in events
    assert factory.idle_closed >= 1
    obs = await hands.execute("open('kept.txt').read()", timeout=30)
    assert obs.ok and obs.result == "'still here'", obs.text()  # the workspace stayed
    started = [p for t, p in events if t == "hands_started"]
    assert started[-1]["reason"] == "reopen after close" and started[-1]["generation"] == 2


async def test_closing_during_a_call_answers_the_call(make_factory):
    factory = await make_factory(pool_size=0)
    events, sink = recorder()
    hands = factory("close-busy", {"hands": {"interrupt_grace": 5}}, sink)
    await run(hands, "import time")
    call = asyncio.ensure_future(hands.execute("print('started', flush=True); time.sleep(120)", timeout=300))
    await until(lambda: hands.status()["call"] == "running")
    assert await hands.close("api") is True
    obs = await asyncio.wait_for(call, 60)
    assert "started" in obs.stdout and obs.error is not None  # answered: interrupted, with what it printed
    assert hands.status()["state"] == "closed" and hands.status()["pid"] is None
    assert await hands.close("api") is False  # nothing left to close
    assert (await hands.execute("1+1", timeout=30)).result == "2"
