"""Lifetimes: the warm pool, the factory's settings, and no orphans (close, exit, crash, Ctrl-C)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from workbench.errors import ConfigError
from workbench.hands.isolating import quota
from workbench.hands.factory import HandsFactory, HandsSettings
from workbench.hands.launching import KernelRegistry, LocalLauncher, reap_orphans
from workbench.log import DuckDBLog

from .conftest import GATEWAYS

WORKBENCH = [sys.executable, "-m", "workbench.cli"]


def cli_env(**extra: str) -> dict[str, str]:
    """A subprocess environment without the developer's key or workbench settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "WORKBENCH_"))}
    return {**env, **extra}


HOST = """
import asyncio, sys
from workbench.hands.factory import HandsFactory, HandsSettings

async def main():
    # local hands: the test checks host pids, and a sandboxed child's pid is one of its own namespace
    f = HandsFactory(HandsSettings(backend="local", registry_dir=sys.argv[1], pool_size=1))
    await f.start()
    h = f("s", {}, None)
    child = await h.execute("import subprocess; subprocess.Popen(['sleep', '600']).pid")
    while f.pool.status()["ready"] < 1:  # the refilled pool kernel is registered too
        await asyncio.sleep(0.05)
    print(h.status()["pid"], child.result, flush=True)
    if sys.argv[2] == "hang":
        await asyncio.sleep(3600)

asyncio.run(main())
"""


def host(registry: Path, mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOST, str(registry), mode], stdout=subprocess.PIPE, text=True,
                            env=cli_env())


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root`."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [p for p in (line.split()[4] for line in lines) if p == str(root) or p.startswith(f"{root}/")]


def registered_pids(registry: Path) -> list[int]:
    return [e["pid"] for e in KernelRegistry(registry).entries().values()]


@pytest.mark.asyncio
async def test_pool_serves_first_call_and_replacements(factory, recorder):
    events, sink = recorder
    hands = factory("s", {}, sink)
    await hands.execute("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert (await hands.execute("1")).result == "1"
    started = [p for t, p in events if t == "hands_started"]
    assert [s["pooled"] for s in started] == [True, True]
    assert all(s["boot_ms"] > 0 and s["start_ms"] >= 0 for s in started)
    pool_pids = [lk.pid for lk in factory.pool._ready]
    await factory.close()
    assert not any(psutil.pid_exists(p) for p in pool_pids + [s["pid"] for s in started])
    assert registered_pids(factory.registry.dir) == []


@pytest.mark.asyncio
async def test_session_workdir_and_env_reach_a_pooled_kernel(factory, tmp_path):
    hands = factory("s", {"hands": {"workdir": str(tmp_path / "w"), "env": {"ANSWER": "42"}}}, None)
    obs = await hands.execute("import os; print(os.getcwd(), os.environ['ANSWER'])")
    assert obs.stdout == f"{tmp_path / 'w'} 42\n"
    assert "ANTHROPIC_API_KEY" not in (await hands.execute("import os; sorted(os.environ)")).result


def test_factory_refuses_bad_settings(tmp_path):
    with pytest.raises(ConfigError, match="unknown hands backend"):
        HandsFactory(HandsSettings(backend="cloud"))
    with pytest.raises(ConfigError, match="GATEWAY_URL"):
        HandsFactory(HandsSettings(backend="gateway"))
    f = HandsFactory(HandsSettings(pool_size=0, registry_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match="unknown hands settings: colour"):
        f("s", {"hands": {"colour": "red"}}, None)


def test_orphans_of_a_killed_host_are_reaped(tmp_path, gone):
    registry = tmp_path / "registry"
    proc = host(registry, "hang")
    try:
        kernel, child = map(int, proc.stdout.readline().split())
        pids = registered_pids(registry)
        assert kernel in pids and len(pids) == 2  # the session's kernel and the pool's
        proc.kill()
        proc.wait()
        # ipykernel may notice its parent is gone and exit by itself; what it started does not
        reaped = reap_orphans(registry)
        assert sorted(e["pid"] for e in reaped) == sorted(pids)
        assert gone(pids + [child])
        assert registered_pids(registry) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reap_orphans(registry)


def test_reaper_leaves_live_hosts_and_strangers_alone(tmp_path):
    registry = KernelRegistry(tmp_path)
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        registry.add("ours", os.getpid())  # our own host is alive: not an orphan
        (tmp_path / "stranger.json").write_text(json.dumps(
            {"pid": stranger.pid, "started": 1.0, "host_pid": 2**22 + 7, "host_started": 1.0}))
        reaped = reap_orphans(tmp_path)
        assert [e["id"] for e in reaped] == ["stranger"] and "killed" not in reaped[0]
        assert stranger.poll() is None  # a pid whose start time does not match is never killed
        assert list(registry.entries()) == ["ours"]
    finally:
        stranger.kill()
        stranger.wait()
        registry.remove("ours")


def test_host_that_exits_without_closing_stops_its_kernels(tmp_path, gone):
    registry = tmp_path / "registry"
    proc = host(registry, "exit")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert gone([int(p) for p in out.split()])
    assert registered_pids(registry) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_in_workbench_run_records_the_interrupt_and_stops_the_kernel(tmp_path, gone, sig):
    registry, db = tmp_path / "registry", tmp_path / "log.duckdb"
    env = cli_env(WORKBENCH_HANDS_REGISTRY_DIR=str(registry), WORKBENCH_HANDS_POOL_SIZE="0")
    prompt = "```python\nimport time\nprint('sleeping', flush=True)\ntime.sleep(120)\n```"
    proc = subprocess.Popen(WORKBENCH + ["run", prompt, "--db", str(db), "--model", "scripted"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not registered_pids(registry):  # the kernel exists once it is registered
            assert proc.poll() is None and time.monotonic() < deadline, "the kernel never started"
            time.sleep(0.05)
        kernel = registered_pids(registry)[0]
        proc.send_signal(sig)
        assert proc.wait(60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert gone([kernel]) and registered_pids(registry) == []
    with DuckDBLog(db, read_only=True) as log:
        sid = log.sessions()[0]["id"]
        events = log.events(sid)
    types = [e.type for e in events]
    assert "interrupted" in types and events[-1].type == "turn_ended"
    assert events[-1].payload["stop_reason"] == "interrupted"
    result = next(e.payload for e in events if e.type == "tool_result")
    assert result["is_error"] and result.get("interrupted")


BOOTING = """
import asyncio, sys
from workbench.hands.factory import HandsFactory, HandsSettings

async def main():
    backend, registry, count, gap = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    pooled = HandsFactory(HandsSettings(backend=backend, registry_dir=registry, pool_size=1))
    await pooled.start()  # a warm pool boots one kernel, as the CLI's does
    f = HandsFactory(HandsSettings(backend=backend, registry_dir=registry, pool_size=0))
    calls = []
    for i in range(count):  # and sessions one each, staggered: each is at another point of its boot
        calls.append(asyncio.ensure_future(f(f"s{i}", {}, None).execute("1")))
        await asyncio.sleep(gap)
    print("launched", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def _mentioning(root: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and any(root in a for a in p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize("backend", ["local", "sandbox"])
def test_a_host_killed_while_kernels_boot_leaves_no_process(hands_tmp, backend):
    """SIGKILL a host at many points of many kernel boots: nothing of any of them may live on."""
    if backend == "sandbox":
        from workbench.hands.isolating import preflight

        check = preflight()
        if not check.ok:
            pytest.skip(f"no working bubblewrap here: {check.reason}")
    count, gap = 10, 0.04
    left = []
    for attempt in range(3):
        # short: a unix socket's path (a kernel's ZMQ and egress sockets live under it) has ~107 bytes
        root = Path(tempfile.mkdtemp(prefix="h", dir=hands_tmp))
        env = cli_env(TMPDIR=str(root), JUPYTER_RUNTIME_DIR=str(root / "runtime"), WORKBENCH_WORKSPACE_ROOT=str(root / "ws"))
        proc = subprocess.Popen([sys.executable, "-c", BOOTING, backend, str(root / "registry"), str(count), str(gap)],
                                stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert proc.stdout.readline() == "launched\n"
            time.sleep(attempt * gap / 3)  # shift every kernel's kill point a little further along its boot
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()
        # the wait is for a loaded machine; nothing here needs more than the kernel's own exit
        _, alive = psutil.wait_procs(_mentioning(str(root)), timeout=15)
        for p in alive:
            try:
                left.append(f"{p.pid} (parent {p.ppid()}): {' '.join(p.cmdline())[:120]}")
                p.kill()
            except psutil.NoSuchProcess:
                pass
        quota.reap(root / "ws")  # what the next host does at its start: the killed host's workspaces go
        assert mounts_under(root) == []
    assert not left, "processes of a killed host's kernels live on:\n" + "\n".join(left)


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["local", "sandbox"])
async def test_kernels_stopped_while_they_boot_leave_no_process(hands_tmp, backend):
    """Closing a factory at many points of its pool's boots stops every kernel, half-booted ones included."""
    if backend == "sandbox":
        from workbench.hands.isolating import preflight

        check = preflight()
        if not check.ok:
            pytest.skip(f"no working bubblewrap here: {check.reason}")
    left = []
    for attempt in range(4):
        root = Path(tempfile.mkdtemp(prefix="s", dir=hands_tmp))
        tempfile.tempdir = str(root)  # this factory's kernels mention root on their command lines
        try:
            factory = HandsFactory(HandsSettings(backend=backend, registry_dir=str(root / "registry"), pool_size=4))
            await factory.start()
            await asyncio.sleep(attempt * 0.15)  # the four boots are each somewhere else by now
            await factory.close()
        finally:
            tempfile.tempdir = str(hands_tmp)
        _, alive = await asyncio.to_thread(psutil.wait_procs, _mentioning(str(root)), 15)
        left += [f"{p.pid}: {' '.join(p.cmdline())[:120]}" for p in alive if p.is_running()]
        for p in alive:
            p.kill()
    assert not left, "processes of stopped kernels live on:\n" + "\n".join(left)
    # and the pool kernels' workspaces went with them, also those being made when the close came (those go
    # once they are done: wait for that, on a loaded machine)
    root = quota.default_root()
    deadline = time.monotonic() + 60
    while (mounts_under(root) or list(root.glob("*.img"))) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert mounts_under(root) == [] and not list(root.glob("*.img"))


@pytest.mark.asyncio
async def test_a_start_cancelled_while_its_process_is_spawned_leaves_no_process(monkeypatch, gone):
    """The kernel's spawn runs in a thread (off the event loop); a start cancelled meanwhile still learns the
    process it spawned, so the start's own cleanup stops it instead of leaving it behind unknown."""
    from workbench.hands.launching import process as proc_mod

    entered, spawned, real = threading.Event(), [], proc_mod.launch_kernel

    def slow_spawn(argv, **kw):
        entered.set()
        time.sleep(0.5)  # the cancel comes while the thread is here
        p = real(argv, **kw)
        spawned.append(p.pid)
        return p

    monkeypatch.setattr(proc_mod, "launch_kernel", slow_spawn)
    start = asyncio.get_running_loop().create_task(LocalLauncher().start(None))
    while not entered.is_set():
        await asyncio.sleep(0.01)
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    assert len(spawned) == 1  # the spawn finished, and the start waited for it before it gave up
    assert gone(spawned, timeout=30), "the kernel spawned under a cancelled start lives on"


@pytest.mark.asyncio
async def test_a_kill_cut_short_still_closes_the_kernels_zmq_contexts(gone):
    """A kill cancelled halfway (as an event loop that closes cancels a kill nobody awaits any more) closes both ZMQ
    contexts all the same: one left open is terminated by garbage collection later, in whatever code runs then,
    and that blocks for good while a socket of it is open (a pytest worker hung so)."""
    kernel = await LocalLauncher().start(None)
    km, kc, pid = kernel.km, kernel.kc, kernel.pid
    assert kc is not None and pid is not None
    waiting = asyncio.Event()

    async def shutdown_still_waiting(*args, **kwargs):  # jupyter_client's, at its wait for the process to end
        await km._async_kill_kernel()  # SIGKILL sent (its context is destroyed later, in cleanup_resources)
        waiting.set()
        await asyncio.sleep(3600)  # not returned yet: on a loaded machine that wait may take seconds

    km.shutdown_kernel = shutdown_still_waiting
    kill = asyncio.get_running_loop().create_task(kernel.kill())
    await asyncio.wait_for(waiting.wait(), 60)
    # the kill is inside jupyter_client's shutdown: cancelled there (a kill of no more than one step, as this test
    # once assumed, can be over before a cancel on a quiet machine and on a loaded one alike)
    kill.cancel()
    with pytest.raises(asyncio.CancelledError):
        await kill
    assert km.context.closed and kc.context.closed
    assert gone([pid], timeout=30)
    kernel.output.close()
    kernel._cleanup()


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["local", "gateway", "enterprise-gateway", "sandbox"])
async def test_every_launcher_fills_the_pool_and_says_which_sessions_a_pooled_kernel_fits(backend, request, tmp_path):
    settings = HandsSettings(backend="gateway" if backend in GATEWAYS else backend, pool_size=1,
                             registry_dir=str(tmp_path / "registry"))
    if backend in GATEWAYS:
        gw = request.getfixturevalue(GATEWAYS[backend])
        settings.gateway_url, settings.gateway_token = gw.url, gw.token
    if backend == "sandbox":
        from workbench.hands.isolating import preflight

        check = preflight()
        if not check.ok:
            pytest.skip(f"no working bubblewrap here: {check.reason}")
    events: list = []

    async def sink(type: str, payload: dict) -> None:
        events.append((type, payload))

    async def ready() -> None:
        while factory.pool.status()["ready"] < 1:
            assert factory.pool.status()["failures"] == 0, factory.pool.status()
            await asyncio.sleep(0.05)

    async with HandsFactory(settings) as factory:
        await ready()
        plain = factory("plain", {}, sink)
        assert (await plain.execute("6 * 7")).result == "42"
        await ready()
        # KERNEL_ so that a gateway passes it on to the kernel it starts
        with_env = factory("env", {"hands": {"env": {"KERNEL_WB_ANSWER": "42"}}}, sink)
        obs = await with_env.execute("import os; os.environ['KERNEL_WB_ANSWER']")
        assert obs.result == "'42'", obs.to_json()
        pooled = [p["pooled"] for t, p in events if t == "hands_started"]
        # a local kernel takes its variables by code; a sandbox or a gateway kernel gets them when it starts
        assert pooled == [True, backend == "local"]
        if backend != "local":
            assert factory.pool.status()["ready"] == 1  # the pool's kernel was left for a session it fits


@pytest.mark.asyncio
async def test_a_pool_without_refill_is_filled_once_and_its_kernel_serves_the_first_session(tmp_path):
    """The CLI's run and resume end with their turn: their pool starts one kernel and none in its place."""
    events: list = []

    async def sink(type: str, payload: dict) -> None:
        events.append((type, payload))

    settings = HandsSettings(backend="local", pool_size=1, pool_refill=False, registry_dir=str(tmp_path / "registry"))
    async with HandsFactory(settings) as factory:
        pool = factory.pool
        assert pool.status()["starting"] == 1 and pool.status()["refill"] is False
        assert (await factory("first", {}, sink).execute("6 * 7")).result == "42"
        await asyncio.sleep(0.5)  # a refill would be starting by now
        assert pool.status()["ready"] + pool.status()["starting"] == 0, pool.status()
        assert (await factory("second", {}, sink).execute("6 * 8")).result == "48"
        assert pool.status()["ready"] + pool.status()["starting"] == 0, pool.status()
    assert [p["pooled"] for t, p in events if t == "hands_started"] == [True, False]


@pytest.mark.asyncio
async def test_sessions_taking_from_the_pool_at_once_never_make_it_hold_more_than_its_size(tmp_path):
    settings = HandsSettings(backend="local", pool_size=2, registry_dir=str(tmp_path / "registry"))
    peak = 0
    async with HandsFactory(settings) as factory:
        pool = factory.pool

        async def watch() -> None:
            nonlocal peak
            while True:
                status = pool.status()
                peak = max(peak, status["ready"] + status["starting"])
                await asyncio.sleep(0)

        watcher = asyncio.ensure_future(watch())
        try:
            hands = [factory(f"s{i}", {}, None) for i in range(5)]
            results = await asyncio.gather(*(h.execute(f"{i} * 2") for i, h in enumerate(hands)))
            assert [r.result for r in results] == [str(i * 2) for i in range(5)]
            while pool.status()["ready"] < 2:  # refilled to its size, no further
                await asyncio.sleep(0.05)
        finally:
            watcher.cancel()
        assert peak <= 2 and pool.status()["ready"] + pool.status()["starting"] == 2, (peak, pool.status())
