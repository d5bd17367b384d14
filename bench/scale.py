"""5. Scale: 1, 5 and 20 sessions at once, each running turns with a tool call through the server.

A real `jupyter server` subprocess with the workbench extension, driven over its REST API and
session websockets (docs/api.md), the scripted model (its ```python blocks become `python` calls).
Each level gets a fresh server and database. Every session runs one warm-up turn (its kernel
starts), then K timed turns in a row; the sessions run at the same time.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx

from .common import Context, Section, percentile, rounds, served, server_turn

TEXT = "Please run this:\n```python\nprint(sum(i * i for i in range(20000)))\n```"


async def _turn(http: httpx.AsyncClient, ws: Any, sid: str) -> dict[str, Any]:
    """One turn and where its time went: the turn, its tool call and the gaps between its events (server clock)."""
    turn, seen, busy = await server_turn(http, ws, sid, TEXT)
    started = next((e for e in reversed(seen) if e["type"] == "tool_started"), None)
    result = next((e for e in reversed(seen) if e["type"] == "tool_result"), None)
    if started is None or result is None or result["payload"].get("is_error"):
        raise RuntimeError(f"the turn in session {sid} made no successful tool call: {result and result['payload']}")
    tool = (datetime.fromisoformat(result["ts"]) - datetime.fromisoformat(started["ts"])).total_seconds() * 1000
    kernel = result["payload"]["observation"]["duration_ms"]
    gaps = {}
    for a, b in zip(seen, seen[1:]):  # where the turn's time went, by the server's clock
        key = f"{a['type']}->{b['type']}"
        gaps[key] = gaps.get(key, 0.0) + (datetime.fromisoformat(b["ts"]) - datetime.fromisoformat(a["ts"])).total_seconds() * 1000
    return {"turn": turn, "tool": tool, "overhead": turn - kernel, "gaps": gaps, "busy": busy}


async def _level(ctx: Context, n: int, turns: int) -> dict[str, Any]:
    async with served(ctx.tmp / f"scale-{n}") as srv:
        base_rss, base_procs = srv.server.rss_mib()
        sessions = await srv.sessions(n, f"scale {n}/")

        def turn(sid: str, ws: Any) -> Any:
            return _turn(srv.http, ws, sid)

        await rounds(sessions, 1, turn)  # warm-up: every session's kernel starts; then the pool refills
        await srv.settle()
        per = await rounds(sessions, turns, turn)
        await srv.settle()
        rss, procs = srv.server.rss_mib()
    every = [t for p in per for t in p]
    return {"samples": every, "base_rss": base_rss, "rss": rss, "procs": procs, "base_procs": base_procs}


async def run(ctx: Context) -> Section:
    sec = Section("scale", "Scale: concurrent sessions running tool calls through the server")
    import importlib.util

    if importlib.util.find_spec("workbench.server") is None:
        return sec.skip("the server extension (workbench.server) is not available")
    levels = [2] if ctx.quick else [1, 5, 20]  # quick: one server, still concurrent
    turns = ctx.trials(1, 5)
    overhead50: dict[int, float] = {}
    for n in levels:
        got = await _level(ctx, n, turns)
        s = got["samples"]
        sec.row(f"{n} session(s): turn (POST message to turn_ended on the websocket)", [x["turn"] for x in s])
        sec.row(f"{n} session(s): tool call (tool_started to tool_result, server clock)", [x["tool"] for x in s])
        per_session = (got["rss"] - got["base_rss"]) / n
        gaps: dict[str, list[float]] = {}
        for x in s:
            for k, v in x["gaps"].items():
                gaps.setdefault(k, []).append(v)
        busy = sum(x["busy"] for x in s)
        if busy:
            sec.notes.append(f"{n} session(s): {busy} POST(s) got 409 (turn still running) right after turn_ended "
                             f"was streamed, in {sum(1 for x in s if x['busy'])} of {len(s)} turns; retried every 5 ms")
        sec.notes.append(f"{n} session(s), where a turn's time goes (ms between consecutive events, summed over the turn, p50 over turns; server clock): "
                         + "; ".join(f"{k} {percentile(v, 50):.1f}" for k, v in gaps.items()))
        overhead50[n] = sec.row(f"{n} session(s): harness overhead per call (turn minus the kernel's execute time)",
                                [x["overhead"] for x in s], rss_mib=round(got["rss"]), baseline_rss_mib=round(got["base_rss"]),
                                mib_per_session=round(per_session, 1),
                                processes=f"{got['base_procs']}->{got['procs']}")["p50_ms"]
    for n in levels[1:]:
        sec.compare(f"overhead per call, {n} sessions vs {levels[0]} (p50)", overhead50[n], overhead50[levels[0]])
    sec.notes.append(f"Each turn: the scripted model asks for one python call, then answers; {turns} timed turns per "
                     "session after a warm-up turn. Memory: RSS of the server and every process under it (kernels, "
                     "the warm pool) after the turns, minus the idle server with its warm pool, per session.")
    return sec
