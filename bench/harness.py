"""6. Harness CPU: what the Jupyter server process itself spends on a turn with one tool call.

A real `jupyter server` subprocess with the workbench extension and the scripted model (its
```python block becomes one `python` call that prints 1), driven over the REST API and the session
websockets, at 1, 5, 20 and 50 sessions running turns at the same time (a fresh server and database
each). The server's own CPU time (user + system, its threads included, its kernels not: they are
child processes) is read before and after the timed turns; divided by the turns, it is what one turn
costs the harness: the brain, the log, the websocket fan-out, the kernel client, the scripted model.
A profile of the server during an extra round at the fewest and the most sessions (py-spy, when installed) says where it goes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from .common import Context, Section, profile, rounds, served, server_turn, shares

TEXT = "Run this:\n```python\nprint(1)\n```"


def _cpu(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


async def _level(ctx: Context, n: int, turns: int, profiled: bool) -> dict[str, Any]:
    prof: dict[str, Any] = {}
    async with served(ctx.tmp / f"harness-{n}") as srv:
        sessions = await srv.sessions(n, f"harness {n}/")

        def turn(sid: str, ws: Any) -> Any:
            return _turn(srv.http, ws, sid)

        await rounds(sessions, 1, turn)  # warm-up: kernels start
        await srv.settle()
        pid = srv.server.proc.pid
        await _quiet(pid)  # the server's start-up work (plugins, the pool, spares) is not a turn's
        c0, t0 = _cpu(pid), time.perf_counter()
        per = await rounds(sessions, turns, turn)
        wall, cpu = time.perf_counter() - t0, _cpu(pid) - c0
        if profiled:
            await _quiet(pid)
            prof = await profile(pid, lambda: rounds(sessions, turns, turn))
    samples = [t for p in per for t in p]
    return {"samples": samples, "cpu_s": cpu, "wall_s": wall, "turns": len(samples), "profile": prof}


async def _turn(http: httpx.AsyncClient, ws: Any, sid: str) -> dict[str, Any]:
    """One turn, and its part outside the kernel: the turn minus the call's execute time."""
    turn, seen, _ = await server_turn(http, ws, sid, TEXT)
    result = next((e["payload"] for e in reversed(seen) if e["type"] == "tool_result"), None)
    if result is None or result.get("is_error"):
        raise RuntimeError(f"the turn in session {sid} made no successful tool call: {result}")
    return {"turn": turn, "overhead": turn - result["observation"]["duration_ms"]}


async def _quiet(pid: int, within: float = 60.0) -> None:
    """Wait until the server's start-up work is done: under 2 % of a core for a second (or `within` s passed)."""
    deadline, calm = time.monotonic() + within, 0
    last = _cpu(pid)
    while time.monotonic() < deadline and calm < 4:
        await asyncio.sleep(0.25)
        now = _cpu(pid)
        calm = calm + 1 if now - last < 0.005 else 0
        last = now


def _scripted_cost(turns: int) -> float:
    """CPU ms of the scripted model's two calls of a turn, late in a session of `turns` turns (this process)."""
    from workbench.brain import Brain
    from workbench.log import MemoryLog

    log = MemoryLog()
    brain = Brain(log, hands_factory=None)
    sid = brain.create_session(model="scripted")["id"]
    call = {"type": "tool_use", "id": "toolu_x", "name": "python", "input": {"code": "print(1)"}}
    for i in range(turns):
        log.append(sid, "user_message", {"text": TEXT})
        log.append(sid, "assistant_turn", {"message": {"role": "assistant", "content": [call | {"id": f"toolu_{i}"}],
                                                       "stop_reason": "tool_use"}})
        log.append(sid, "tool_result", {"tool_use_id": f"toolu_{i}", "name": "python",
                                        "content": [{"type": "text", "text": "1\n"}], "is_error": False})
        log.append(sid, "assistant_turn", {"message": {"role": "assistant", "content": [{"type": "text", "text": "1"}],
                                                       "stop_reason": "end_turn"}})
        log.append(sid, "turn_ended", {"stop_reason": "end_turn"})
    log.append(sid, "user_message", {"text": TEXT})
    first = build_request_of(log, sid)
    model = brain.model("scripted")

    async def calls(n: int) -> None:
        for _ in range(n):
            async for _ev in model.stream(first):
                pass

    import asyncio as aio

    aio.run(calls(10))
    c0 = time.process_time()
    aio.run(calls(200))
    log.close()
    return (time.process_time() - c0) * 1000 / 200 * 2


def build_request_of(log: Any, sid: str) -> dict[str, Any]:
    from workbench.brain import build_request

    return build_request(log.events(sid))


async def run(ctx: Context) -> Section:
    sec = Section("harness", "Harness CPU: the server's own CPU time per turn with one tool call, against its floor")
    import importlib.util

    if importlib.util.find_spec("workbench.server") is None:
        return sec.skip("the server extension (workbench.server) is not available")
    from . import floors

    # the floor, in this run: a raw jupyter_client execute of print(1), and raw batched appends of the turn's 8 events
    raw = await floors.raw_execute(ctx.trials(3, 200))
    per_event_us = await asyncio.to_thread(floors.raw_appends, ctx.tmp / "harness-raw.duckdb", ctx.trials(2000, 20_000))
    floor = raw["cpu_ms"] + 8 * per_event_us / 1000
    sec.row("floor: raw jupyter_client execute of print(1), client CPU", [raw["cpu_ms"]], wall_p50_ms=round(raw["wall_ms"], 2))
    sec.row("floor: raw batched DuckDB appends (1,000 a transaction), CPU per event", [per_event_us / 1000])
    commits = await asyncio.to_thread(floors.raw_turn_commits, ctx.tmp / "harness-commits.duckdb", ctx.trials(20, 200))
    sec.row("raw DuckDB: a turn's 8 events in its 4 lone commits, CPU per turn", [commits])
    scripted = await asyncio.to_thread(_scripted_cost, 30)
    sec.row("of a turn: the scripted model's two calls late in a 30-turn session (CPU, measured in this process)", [scripted])

    levels = [1, 2] if ctx.quick else [1, 5, 20, 50]  # two levels at least: the flatness goal is a row in quick mode too
    turns = {1: 30, 5: 10, 20: 5, 50: 3}
    cpu_ms: dict[int, float] = {}
    profiles: dict[int, dict[str, Any]] = {}
    # quick mode profiles the first level only (CI checks the profile works; each profile repeats the level's turns)
    profiled = {levels[0]} if ctx.quick else {levels[0], levels[-1]}
    for n in levels:
        got = await _level(ctx, n, ctx.trials(2, turns.get(n, 3)), profiled=n in profiled)
        s = got["samples"]
        cpu_ms[n] = 1000 * got["cpu_s"] / got["turns"]
        sec.row(f"{n} session(s): harness overhead per call (turn minus the kernel's execute time)",
                [x["overhead"] for x in s], server_cpu_ms_per_turn=round(cpu_ms[n], 2),
                turns=got["turns"], turns_per_s_wall=round(got["turns"] / got["wall_s"], 1))
        if got["profile"]:
            profiles[n] = got["profile"]
    for n in levels:
        v = cpu_ms[n]
        prof = profiles.get(n) or profiles.get(levels[0])
        why = (f"a turn's 4 lone commits cost {commits:.1f} ms raw in this run ({100 * commits / v:.0f}% of this); "
               + (shares(prof) if prof else "no profile"))
        sec.goal(f"server CPU per tool-call turn, {n} session(s)", v, "ms", "<= 5 ms and <= 2x the floor",
                 v <= 5 and v <= 2 * floor, floor=floor, floor_what="raw execute + raw batched append of its 8 events",
                 profile=prof, why=why)
    first, last = levels[0], levels[-1]
    if last != first:
        r = cpu_ms[last] / cpu_ms[first]
        sec.goal(f"server CPU per turn flat from {first} to {last} sessions ({last} vs {first})", cpu_ms[last], "ms",
                 "<= 1.5x", r <= 1.5, floor=cpu_ms[first], floor_what=f"the same at {first} session(s)",
                 profile=profiles.get(last))
    worst = min(1000 / v for v in cpu_ms.values())
    sec.goal("turns one core serves (1000 / CPU ms per turn, worst level)", worst, "turns/s", ">= 150", worst >= 150,
             floor=1000 / floor, floor_what="1000 / the floor",
             profile=profiles.get(max(cpu_ms, key=cpu_ms.get)) or profiles.get(levels[0]))
    for n, prof in profiles.items():
        if prof.get("samples"):
            sec.notes.append(f"Profile at {n} session(s) (py-spy, {prof['samples']} samples of the server's busy threads, "
                             "a round of turns after the timed one), CPU by part: "
                             + "; ".join(f"{name} {share}%" for name, share in prof["parts"]))
            sec.notes.append(f"  own time (the frame that was running), {n} session(s): "
                             + "; ".join(f"{f} {p}%" for f, p in prof["own"][:12]))
        elif prof.get("skipped"):
            sec.notes.append(f"No profile at {n} session(s): {prof['skipped']}")
    sec.notes.append(f"A turn commits 4 times (each event is committed before anyone is told of it): on a plain "
                     f"connection those 4 lone DuckDB commits of its 8 events cost {commits:.2f} ms of CPU in this run, "
                     f"{commits / (8 * per_event_us / 1000):.0f}x the same events batched, and "
                     f"{100 * commits / cpu_ms[levels[0]]:.0f}% of a turn at {levels[0]} session(s): sessions that share "
                     "a group commit share those commits; one session alone cannot.")
    sec.notes.append(f"Turn: the scripted model asks for one python call (print(1)), then answers. CPU: the server "
                     "process only (user + system, every thread), read from /proc before and after the timed turns, "
                     "after its start-up work is done (under 2 % of a core for a second); kernels are other processes. "
                     f"The floor ({floor:.2f} ms) is what the same work costs without the workbench: a raw execute "
                     f"({raw['cpu_ms']:.2f} ms of client CPU) and 8 raw batched appends ({per_event_us:.0f} µs each). "
                     f"The scripted model's share ({scripted:.2f} ms a turn) is in the server's figure: its cost does not "
                     "grow with the session.")
    return sec
