"""6. Harness CPU: what the Jupyter server process itself spends on a turn with one tool call.

A real `jupyter server` subprocess with the workbench extension and the scripted model (its
```python block becomes one `python` call that prints 1), driven over the REST API and the session
websockets, at 1, 5, 20 and 50 sessions running turns at the same time (a fresh server and database
each). The server's own CPU time (user + system, its threads included, its kernels not: they are
child processes) is read before and after the timed turns; divided by the turns, it is what one turn
costs the harness: the brain, the log, the websocket fan-out, the kernel client, the scripted model.
A profile of the server during an extra round at 20 sessions (py-spy, when installed) says where it goes.
"""

from __future__ import annotations

import asyncio
import collections
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from .common import Context, Section

TEXT = "Run this:\n```python\nprint(1)\n```"


def _cpu(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


async def _level(ctx: Context, n: int, turns: int, profile: bool) -> dict[str, Any]:
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    from . import scale
    from .jserver import JupyterServer

    home = ctx.tmp / f"harness-{n}"
    server = JupyterServer(home, workbench=True, env={"WORKBENCH_DB": str(home / "wb.duckdb"), "WORKBENCH_MODEL": "scripted"})
    await asyncio.to_thread(server.start)
    wss: list[Any] = []
    prof: dict[str, Any] = {}
    try:
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=120) as http:
            await scale._settle(http)
            ids = []
            for i in range(n):
                r = await http.post("/workbench/api/sessions", json={"model": "scripted", "title": f"harness {n}/{i}"})
                r.raise_for_status()
                ids.append(r.json()["id"])
            ws_base = server.url.replace("http", "ws", 1)
            for sid in ids:
                wss.append(await websocket_connect(HTTPRequest(f"{ws_base}/workbench/api/sessions/{sid}/stream?after=0",
                                                               headers=server.headers)))

            def one(sid: str, ws: Any) -> Any:
                return _turn(http, ws, sid)

            async def timed(sid: str, ws: Any, k: int) -> list[dict[str, Any]]:
                return [await one(sid, ws) for _ in range(k)]

            await asyncio.gather(*(one(sid, ws) for sid, ws in zip(ids, wss, strict=False)))  # warm-up: kernels start
            await scale._settle(http)
            await asyncio.sleep(0.5)
            pid = server.proc.pid
            c0, t0 = _cpu(pid), time.perf_counter()
            per = await asyncio.gather(*(timed(sid, ws, turns) for sid, ws in zip(ids, wss, strict=False)))
            wall, cpu = time.perf_counter() - t0, _cpu(pid) - c0
            if profile:
                prof = await _profile(pid, lambda: asyncio.gather(*(timed(sid, ws, turns) for sid, ws in zip(ids, wss, strict=False))))
    finally:
        for ws in wss:
            ws.close()
        await asyncio.to_thread(server.stop)
    samples = [t for p in per for t in p]
    return {"samples": samples, "cpu_s": cpu, "wall_s": wall, "turns": len(samples), "profile": prof}


async def _turn(http: httpx.AsyncClient, ws: Any, sid: str) -> dict[str, Any]:
    """One turn: POST the message (again after a 409 while the last turn finishes), read the stream to turn_ended."""
    import json

    for _ in range(200):
        t0 = time.perf_counter()
        r = await http.post(f"/workbench/api/sessions/{sid}/messages", json={"text": TEXT})
        if r.status_code != 409:
            break
        await asyncio.sleep(0.005)
    r.raise_for_status()
    result = None
    while True:
        raw = await asyncio.wait_for(ws.read_message(), 120)
        if raw is None:
            raise RuntimeError(f"the stream of session {sid} closed during a turn")
        msg = json.loads(raw)
        if msg["kind"] != "event":
            continue
        e = msg["event"]
        if e["type"] == "tool_result":
            result = e["payload"]
        elif e["type"] == "turn_ended":
            break
    turn = (time.perf_counter() - t0) * 1000
    if result is None or result.get("is_error"):
        raise RuntimeError(f"the turn in session {sid} made no successful tool call: {result}")
    return {"turn": turn, "overhead": turn - result["observation"]["duration_ms"]}


async def _profile(pid: int, work: Any) -> dict[str, Any]:
    """py-spy's samples of the server while `work` runs: the top frames, inclusive and own."""
    beside = Path(sys.executable).parent / "py-spy"  # installed in this environment, maybe not on PATH
    spy = str(beside) if beside.exists() else shutil.which("py-spy")
    if spy is None:
        return {"skipped": "py-spy is not installed (pip install py-spy)"}
    out = f"/tmp/workbench-bench-pyspy-{pid}.txt"
    proc = subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "200", "--format", "raw", "--output", out,
                             "--nonblocking", "--threads"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    await asyncio.sleep(1.0)
    try:
        await work()
    finally:
        proc.send_signal(2)
        err = await asyncio.to_thread(proc.communicate, timeout=60)
    try:
        lines = open(out).read().splitlines()
    except OSError:
        return {"skipped": f"py-spy recorded nothing ({(err[1] or b'').decode()[-200:].strip()})"}
    return summarise_stacks(lines)


def summarise_stacks(lines: list[str], top: int = 15) -> dict[str, Any]:
    """Collapsed stacks ("frame;frame;... count") as shares of the samples: by frame (inclusive) and by leaf."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        frames = [f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1] + ")" if " (" in f else f
                  for f in stack.split(";")]
        idle = frames[-1].startswith(("select ", "poll ", "epoll", "wait ", "_worker", "_wait_for_tstate_lock", "sleep"))
        if idle or any(f.startswith(("select (selectors", "_run_once (base_events")) and f == frames[-1] for f in frames):
            continue
        total += c
        for f in set(frames):
            inclusive[f] += c
        own[frames[-1]] += c
    share = (lambda c: round(100 * c / total, 1)) if total else (lambda c: 0.0)
    return {"samples": total, "inclusive": [(f, share(c)) for f, c in inclusive.most_common(top * 3)],
            "own": [(f, share(c)) for f, c in own.most_common(top)]}


async def run(ctx: Context) -> Section:
    sec = Section("harness", "Harness CPU: the server's own CPU time per turn with one tool call")
    import importlib.util

    if importlib.util.find_spec("workbench.server") is None:
        return sec.skip("the server extension (workbench.server) is not available")
    levels = [2] if ctx.quick else [1, 5, 20, 50]
    turns = {1: 30, 5: 10, 20: 5, 50: 3}
    cpu_ms: dict[int, float] = {}
    overhead: dict[int, float] = {}
    profile: dict[str, Any] = {}
    for n in levels:
        got = await _level(ctx, n, ctx.trials(2, turns.get(n, 3)), profile=(n == 20 or ctx.quick))
        s = got["samples"]
        cpu_ms[n] = 1000 * got["cpu_s"] / got["turns"]
        overhead[n] = sec.row(f"{n} session(s): harness overhead per call (turn minus the kernel's execute time)",
                              [x["overhead"] for x in s], server_cpu_ms_per_turn=round(cpu_ms[n], 2),
                              turns=got["turns"], turns_per_s_wall=round(got["turns"] / got["wall_s"], 1))["p50_ms"]
        profile = got["profile"] or profile
    for n in levels:
        sec.compare(f"server CPU per turn, {n} session(s)", cpu_ms[n], None, target="<= 5 ms", met=cpu_ms[n] <= 5, kind="absolute")
    first, last = levels[0], levels[-1]
    if last != first:
        r = cpu_ms[last] / cpu_ms[first]
        sec.compare(f"server CPU per turn, {last} vs {first} session(s)", cpu_ms[last], cpu_ms[first], target="<= 1.5x", met=r <= 1.5)
    best = max(1000 / v for v in cpu_ms.values())
    worst = min(1000 / v for v in cpu_ms.values())
    sec.compare("turns per second one core serves (1000 / CPU ms per turn, worst level)", worst, None, unit="turns/s",
                target=">= 150", met=worst >= 150, kind="absolute")
    if 1 in overhead:
        sec.compare("harness overhead per call, 1 session (p50)", overhead[1], None, target="<= 10 ms", met=overhead[1] <= 10,
                    kind="absolute")
    if 20 in overhead and 1 in overhead:
        sec.compare("harness overhead per call, 20 vs 1 session(s) (p50)", overhead[20], overhead[1], target="<= 2x",
                    met=overhead[20] <= 2 * overhead[1])
    if profile.get("samples"):
        sec.notes.append(f"Profile (py-spy, {profile['samples']} samples of the server's busy threads, an extra round at "
                         f"20 sessions), share of samples by frame, inclusive: "
                         + "; ".join(f"{f} {p}%" for f, p in profile["inclusive"] if "(" in f)[:3000])
        sec.notes.append("Profile, own time (the frame that was running): " + "; ".join(f"{f} {p}%" for f, p in profile["own"]))
    elif profile.get("skipped"):
        sec.notes.append(f"No profile: {profile['skipped']}")
    sec.notes.append(f"Turn: the scripted model asks for one python call (print(1)), then answers. One core at the best "
                     f"level serves {best:.0f} such turns/s of harness CPU. CPU: the server process only (user + system, "
                     "every thread), read from /proc before and after the timed turns; kernels are other processes.")
    return sec
