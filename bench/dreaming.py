"""6. Dreaming: a dream over 10 and 100 recorded sessions, with the scripted models.

The sessions are recorded first by the real loop (one shared kernel runs their code), in three
patterns that give the dream something to find: an error and its fix, a stated preference,
an imported library. Each trial dreams over a fresh copy of that database, so every dream
finds the sessions unread; a second dream over the same sessions (nothing new) is timed too.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from typing import Any

from .common import Context, Section, ms


def patterns(i: int) -> tuple[str, str, list[Any]]:
    """(title, user message, model steps) of the i-th recorded session."""
    from workbench.brain.models import Reply

    kind = i % 3
    if kind == 0:
        return (f"ratio {i}", f"Compute the ratio of hits to trials for batch {i}. Always print results with two decimals.",
                [Reply(text="Dividing.", code=[f"trials_{i} = 0\nratio = {i + 7} / trials_{i}"]),
                 Reply(text="Guarding against zero trials.", code=[f"ratio = {i + 7} / max(trials_{i}, 1)\nprint(f'{{ratio:.2f}}')"]),
                 Reply(text="Done.")])
    if kind == 1:
        return (f"query {i}", f"Count the rows of table t{i} with SQL. I prefer duckdb over pandas for queries.",
                [Reply(text="Using duckdb.", code=[f"import duckdb\nprint(duckdb.sql('select {i} as n').fetchall())"]),
                 Reply(text="Done.")])
    return (f"config {i}", f"Parse config number {i} and show its keys.",
            [Reply(text="Parsing.", code=[f"import json\ncfg = json.loads(\"{{'k{i}': 1}}\")"]),
             Reply(text="Single quotes are not JSON; fixing.", code=[f"cfg = json.loads('{{\"k{i}\": 1}}')\nprint(sorted(cfg))"]),
             Reply(text="Done.")])


async def record(path: Any, n: int) -> list[str]:
    """Record n sessions with the real loop and one shared kernel; returns their ids."""
    from workbench.brain import Brain
    from workbench.brain.models import ScriptedModel
    from workbench.hands import HandsConfig, KernelHands
    from workbench.log import DuckDBLog

    log = DuckDBLog(path)
    hands = KernelHands(HandsConfig())
    scripts = {f"rec{i}": patterns(i) for i in range(n)}
    brain = Brain(log, model_factory=lambda name: ScriptedModel(scripts[name][2], name=name),
                  hands_factory=lambda sid, config, sink, replay=None: hands)
    ids = []
    try:
        for name, (title, text, _) in scripts.items():
            sid = brain.create_session(title=title, model=name)["id"]
            stop = await brain.run_turn(sid, text)
            if stop != "end_turn":
                raise RuntimeError(f"recording session {title!r} ended with {stop!r}")
            ids.append(sid)
    finally:
        await brain.close()
        await hands.shutdown()
        await asyncio.to_thread(log.close)
    return ids


async def dream_once(path: Any, ids: list[str]) -> tuple[float, float, dict[str, Any]]:
    """A dream and then a second one over the same sessions; their times (ms) and the first's summary."""
    from workbench.host import Host
    from workbench.memory import MemorySettings
    from workbench.memory.plugin import MemoryPlugin

    plugin = MemoryPlugin(settings=MemorySettings(dream_max_sessions=max(len(ids), 20)))
    async with Host.open(path, hands=False, plugins=[plugin]) as host:  # dreams run no code
        t0 = time.perf_counter()
        first = await plugin.run_dream(await plugin.create_dream(ids, "scripted:dream"))
        t1 = time.perf_counter()
        second = await plugin.run_dream(await plugin.create_dream(ids, "scripted:dream"))
        t2 = time.perf_counter()
        if first["stop_reason"] != "end_turn" or second["proposed"]:
            raise RuntimeError(f"unexpected dream outcome: {first['stop_reason']}, second proposed {len(second['proposed'])}")
        evs = host.log.events(first["dream_id"])
    started = {e.payload["tool_use_id"]: e for e in evs if e.type == "tool_started"}
    by_tool: dict[str, float] = {}
    for e in evs:
        if e.type == "tool_result" and e.payload["tool_use_id"] in started:
            s = started[e.payload["tool_use_id"]]
            by_tool[s.payload["name"]] = by_tool.get(s.payload["name"], 0) + (e.ts - s.ts).total_seconds() * 1000
    info = {"proposed": len(first["proposed"]), "steps": sum(e.type == "model_request" for e in evs),
            "dream_events": len(evs), "tool_ms": "; ".join(f"{k} {v:.0f}" for k, v in sorted(by_tool.items()))}
    return ms(t0, t1), ms(t1, t2), info


async def run(ctx: Context) -> Section:
    sec = Section("dreaming", "Dreaming: a dream over recorded sessions (scripted model)")
    sizes = [10] if ctx.quick else [10, 100]
    base = ctx.tmp / "dream-base.duckdb"
    t0 = time.perf_counter()
    ids = await record(base, max(sizes))
    sec.notes.append(f"recorded {len(ids)} sessions in {ms(t0) / 1000:.1f} s (not timed below)")
    p50 = {}
    for size in sizes:
        firsts, seconds, info = [], [], {}
        for t in range(ctx.trials(1, 3 if size <= 10 else 2)):
            path = ctx.tmp / f"dream-{size}-{t}.duckdb"
            shutil.copy(base, path)
            a, b, info = await dream_once(path, ids[:size])
            firsts.append(a)
            seconds.append(b)
            path.unlink()
        p50[size] = sec.row(f"dream over {size} sessions (run_dream: read, propose, commit)", firsts, **info)["p50_ms"]
        sec.row(f"second dream over the same {size} sessions (nothing new)", seconds)
    if len(sizes) > 1:
        sec.compare("dream growth, 100 vs 10 sessions (p50)", p50[100], p50[10])
    sec.notes.append("The dream reads its sessions in chunks that fit a context (dream_chunk_chars, "
                     "dream_chunk_sessions; each chunk one turn with a fresh context), reads each session's unread "
                     "events (one tool call per session), proposes cited memories and commits each chunk's proposals "
                     "with its read positions in one transaction; the time is the harness's, tools' and log's, not a "
                     "model's.")
    return sec
