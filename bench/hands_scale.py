"""Hands at scale: sandboxed recovery from the hot spare vs a cold restart, what a spare costs, the other
route (a pooled sandbox that gets the session's workspace mounted after it started), and the memory of
many idle sessions before and after idle closing.

- recovery: SIGKILL of the session's sandboxed kernel → the next `1+1` answered, with `spare` on (the
  spare is ready before each trial) and off (a replacement boots around the workspace), same run;
- the spare's cost: PSS of one spare's process tree (bwrap, its init, the kernel, socat);
- route B (not built): a sandbox started with an empty slot bound in, and the session's workspace
  bind-mounted under the slot on the host afterwards (bwrap's mounts are slaves of the host's, so the
  mount appears inside): how long from the host's mount to the file being visible inside;
- memory: N sessions (200 in full mode; WORKBENCH_BENCH_IDLE_SESSIONS overrides) that each ran one call,
  then idle: this host process's RSS and the kernels' PSS, before and after the idle reaper closed them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from .common import Context, Section, ms, percentile, summarise


async def _recovery(hands: Any, trials: int, spare: bool) -> list[float]:
    """Kill to answer, each kill with the spare ready (`spare`) or without one."""
    from .recovery import _hands_recovery

    async def ready() -> None:
        await _until(lambda: hands.status()["spare"] == "ready", 120, "the spare was not ready")

    return await _hands_recovery(hands, trials, ready if spare else None)


async def _back_to_back(hands: Any, deaths: int, gap: float = 1.0) -> tuple[list[float], list[str]]:
    """Deaths `gap` seconds apart (each SIGKILL `gap` s after the one before, spare or no spare ready): kill to
    answer, and the spare's state at each kill (`ready`, `starting`, ...)."""
    from .recovery import _hands_recovery

    spares: list[str] = []
    killed: list[float] = []

    async def next_death() -> None:
        if killed:
            await asyncio.sleep(max(0.0, gap - (time.perf_counter() - killed[-1])))
        else:  # the first death finds the spare ready, as in a session whose last call ended spare_after and a boot ago
            await _until(lambda: hands.status()["spare"] == "ready", 120, "the first spare was not ready")
        spares.append(str(hands.status()["spare"]))
        killed.append(time.perf_counter())

    return await _hands_recovery(hands, deaths, next_death), spares


async def _until(check: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(what)
        await asyncio.sleep(0.02)


def _tree_pss(pid: int | None) -> tuple[int, float]:
    """(processes, PSS in MiB) of a process and everything under it."""
    if pid is None:
        return 0, 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0.0
    total = 0
    for p in procs:
        try:
            total += p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return len(procs), total / 2**20


def _route_b(tmp: Path, trials: int) -> dict[str, Any]:
    """Host bind mount under a slot a running bwrap sandbox binds → the workspace's file visible inside."""
    from workbench.hands.isolating.bubblewrap import base_args

    if os.geteuid() != 0:
        return {"error": "needs root (mount)"}
    bwrap, mount, umount = shutil.which("bwrap"), shutil.which("mount"), shutil.which("umount")
    if not (bwrap and mount and umount):
        return {"error": "bwrap or mount missing"}
    slot, ws = tmp / "routeb-slot", tmp / "routeb-ws"
    (slot / "w").mkdir(parents=True)
    ws.mkdir()
    (ws / "marker").write_text("the session's workspace")
    subprocess.run([mount, "--bind", str(slot), str(slot)], check=True)
    subprocess.run([mount, "--make-shared", str(slot)], check=True)
    watcher = ("import os, sys, time\n"
               "p = sys.argv[1]\n"
               "while True:\n"
               "    while not os.path.exists(p): time.sleep(0.0002)\n"
               "    print('seen', flush=True)\n"
               "    while os.path.exists(p): time.sleep(0.0002)\n"
               "    print('gone', flush=True)\n")
    argv = [bwrap, *base_args(None), "--bind", str(slot), str(slot), "--", "/usr/bin/python3", "-c", watcher,
            str(slot / "w" / "marker")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    mount_ms, visible_ms = [], []
    try:
        time.sleep(0.5)  # the sandbox is up and watching
        for _ in range(trials):
            t0 = time.perf_counter()
            subprocess.run([mount, "--bind", str(ws), str(slot / "w")], check=True)
            mount_ms.append(ms(t0))
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "seen":
                return {"error": "the sandbox did not see the mount"}
            visible_ms.append(ms(t0))
            subprocess.run([umount, str(slot / "w")], check=True)
            if proc.stdout.readline().strip() != "gone":
                return {"error": "the sandbox did not see the unmount"}
    finally:
        proc.kill()
        proc.wait()
        subprocess.run([umount, "--lazy", str(slot)], check=False)
    return {"mount_ms": mount_ms, "visible_ms": visible_ms}


async def _idle_memory(ctx: Context, sessions: int, sec: Section) -> None:
    from workbench.hands.factory import HandsFactory, HandsSettings

    settings = HandsSettings(backend="sandbox", pool_size=0, spare=False, idle_timeout=3600,
                             registry_dir=str(ctx.tmp / "registry-idle"))
    me = psutil.Process()
    async with HandsFactory(settings) as factory:
        if factory.mode != "sandbox":
            sec.notes.append("idle memory: skipped: no working sandbox on this machine")
            return
        base_rss = me.memory_info().rss / 2**20
        hands = [factory(f"idle-{i}", {}, None) for i in range(sessions)]
        gate = asyncio.Semaphore(6)

        async def first_call(h: Any) -> None:
            async with gate:
                obs = await h.execute("x = list(range(1000))")
                if not obs.ok:
                    raise RuntimeError(f"a session's call failed: {obs.text()}")

        t0 = time.perf_counter()
        await asyncio.gather(*(first_call(h) for h in hands))
        start_s = time.perf_counter() - t0
        await asyncio.sleep(2)
        before_rss = me.memory_info().rss / 2**20
        trees = [_tree_pss(h.status()["pid"]) for h in hands]
        before_pss = sum(m for _, m in trees)
        before_procs = sum(n for n, _ in trees)
        pids = [h.status()["pid"] for h in hands]
        factory.settings.idle_timeout = 2.0  # the reaper reads it at each round (every 30 s at most)
        t1 = time.perf_counter()
        await _until(lambda: all(h.status()["pid"] is None for h in hands), 600, "the idle reaper did not close them")
        reap_s = time.perf_counter() - t1
        await asyncio.to_thread(psutil.wait_procs, [psutil.Process(p) for p in pids if psutil.pid_exists(p)], 30)
        left = sum(1 for p in pids if psutil.pid_exists(p))
        after_rss = me.memory_info().rss / 2**20
        sec.notes.append(f"{sessions} idle sessions (each ran one call; all started in {start_s:.1f} s, 6 at a time): "
                         f"host RSS {before_rss:.1f} MiB, kernels' PSS {before_pss:.1f} MiB in {before_procs} processes. "
                         f"After idle closing ({reap_s:.1f} s after idle_timeout was set to 2 s): host RSS "
                         f"{after_rss:.1f} MiB, {left} of those processes left.")
        sec.compare(f"host RSS + kernels' PSS with {sessions} idle sessions: after vs before idle closing", after_rss,
                    before_rss + before_pss, unit="MiB")
        sec.compare(f"host RSS alone with {sessions} idle sessions: after vs before idle closing", after_rss, before_rss,
                    unit="MiB")
        sec.notes.append(f"The host process (this benchmark, standing in for the server: the same HandsFactory) had "
                         f"{base_rss:.0f} MiB RSS before any session. Spares are off in this part (with them, add the "
                         "spare's PSS above per session until idle closing stops both).")


async def run(ctx: Context) -> Section:
    sec = Section("hands_scale", "Hands at scale: sandboxed recovery from the spare, idle closing, memory")
    from workbench.hands.factory import HandsFactory, HandsSettings

    trials = ctx.trials(1, 10)
    p50: dict[str, float] = {}
    spare_pss: float | None = None
    for spare in (False, True):
        settings = HandsSettings(backend="sandbox", pool_size=1, spare=spare, idle_timeout=0,
                                 registry_dir=str(ctx.tmp / f"registry-spare-{spare}"))
        async with HandsFactory(settings) as factory:
            if factory.mode != "sandbox":
                return sec.skip("no working sandbox on this machine")
            hands = factory(f"bench-spare-{spare}", {}, None)
            case = "sandboxed, hot spare (spare=true, the default)" if spare else "sandboxed, cold (spare=false), pool_size=1"
            row = sec.row(case, await _recovery(hands, trials, spare))
            p50[case] = row["p50_ms"]
            if spare:
                await _until(lambda h=hands: h.status()["spare"] == "ready", 120, "the spare was not ready")
                n, spare_pss = _tree_pss(hands.spare.ident["pid"] if hands.spare else None)
                sec.notes.append(f"One spare costs {spare_pss:.1f} MiB PSS ({n} processes: the launch wrapper, bwrap, "
                                 "its init, socat and the kernel), as much as the session's kernel: one more idle "
                                 "kernel per session that has run code, until idle closing stops both. After a death "
                                 "the next spare boots at once (not after the next call), so deaths in quick "
                                 "succession are served by spares too, at that same cost: one spare per session.")
    cold, hot = p50["sandboxed, cold (spare=false), pool_size=1"], p50["sandboxed, hot spare (spare=true, the default)"]
    sec.compare("sandboxed recovery: spare vs cold (p50)", hot, cold)

    from . import floors

    deaths = ctx.trials(2, 10)  # quick: two, so the second finds the spare the first death started
    settings = HandsSettings(backend="sandbox", pool_size=0, spare=True, idle_timeout=0,
                             registry_dir=str(ctx.tmp / "registry-back-to-back"))
    async with HandsFactory(settings) as factory:
        samples, spares = await _back_to_back(factory("bench-back-to-back", {}, None), deaths)
    row = sec.row(f"sandboxed, hot spare: {deaths} deaths one second apart (kill to answer)", samples,
                  spare_ready_at_kill=spares.count("ready"))
    raw = await floors.raw_execute(ctx.trials(3, 50))
    sec.row("floor: a raw jupyter_client execute on a ready local kernel (wall)", [raw["wall_ms"]])
    # the time is a wait for other processes (a spare's boot), not this process's CPU: the spare's state says why
    waited = [t for t, state in zip(samples, spares, strict=True) if state != "ready"]
    ready = [t for t, state in zip(samples, spares, strict=True) if state == "ready"]
    reason = (f"{len(waited)} of {deaths} deaths found the spare (booted after the death before) still starting and "
              "waited for it" + (f", {percentile(waited, 50):,.0f} ms p50" if waited else "")
              + f" (a sandboxed boot is a cold start: {cold:,.0f} ms p50 above)"
              + (f"; with the spare ready at the kill, {percentile(ready, 50):,.0f} ms p50" if ready else ""))
    sec.goal(f"sandboxed recovery, {deaths} deaths one second apart (p50)", row["p50_ms"], "ms", "<= 100 ms p50",
             row["p50_ms"] <= 100, floor=raw["wall_ms"], floor_what="a raw execute on a ready kernel (wall)", why=reason)

    rb = await asyncio.to_thread(_route_b, ctx.tmp, ctx.trials(1, 20))
    if "error" in rb:
        sec.notes.append(f"Route B (a pooled sandbox that gets the workspace mounted after start): not measured: {rb['error']}")
    else:
        sec.rows.append({"case": "route B: host `mount --bind` of a workspace under a bound slot", **summarise(rb["mount_ms"])})
        sec.rows.append({"case": "route B: ... to the file visible inside the running sandbox", **summarise(rb["visible_ms"])})
        sec.notes.append(
            "Route B was measured, not built: the propagation works here (the slot is made a shared mount on the "
            "host; bwrap's copy is its slave), and costs one `mount` (above) on top of taking a pooled kernel, which "
            "must then also chdir into the mount (its cwd is the empty directory under it) and take the session's "
            "variables and egress policy, like the local pool's adopt. Its memory is the pool's (pool_size kernels per "
            "host) instead of one spare per session. Route A (the spare) was built: no mount namespace games, the "
            "spare starts exactly as a cold replacement would (same argv, the same isolation tests pass unchanged), "
            "and it works unprivileged too, where a host cannot mount; idle closing bounds its memory.")

    sessions = int(os.environ.get("WORKBENCH_BENCH_IDLE_SESSIONS") or (2 if ctx.quick else 200))
    await _idle_memory(ctx, sessions, sec)
    sec.notes.append("Recovery is timed from just after os.kill(pid, SIGKILL) to the answer of `1+1` (the hands notice "
                     "the death on the next execute); with the spare, it is ready before each trial, as it is in a "
                     f"session whose last call ended more than `spare_after` (5 s) and a boot ago. Python {sys.version.split()[0]}.")
    return sec
