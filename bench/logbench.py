"""4. The session log: durable appends, rebuilding a request, resuming, and how each grows.

Sessions of 1k / 10k / 100k events are written in one transaction with INSERT ... SELECT from
a template turn of 8 events with realistic payloads (a signed thinking block, text, a tool call,
a tool result with an observation), so building them takes seconds, not the minutes that
one append per event would.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import duckdb

from . import floors
from .common import Context, Section, ms, percentile

THINK = "Let me look at the data before deciding. " * 8
CODE = "import statistics\nvals = [x * 1.5 for x in range(200)]\nprint(statistics.mean(vals), statistics.stdev(vals))\n" * 2
OUT = "mean 149.25 stdev 86.74\n" * 16


def template() -> list[tuple[str, dict[str, Any]]]:
    """One turn of 8 events; @TURN@ becomes the turn number, so every tool call id is unique."""
    usage = {"input_tokens": 1843, "output_tokens": 212, "cache_read_input_tokens": 1500}
    call = {"type": "tool_use", "id": "toolu_bench@TURN@", "name": "python", "input": {"code": CODE}}
    first = {"id": "msg_a@TURN@", "type": "message", "role": "assistant", "model": "bench",
             "content": [{"type": "thinking", "thinking": THINK, "signature": "sig_" + "ab" * 32},
                         {"type": "text", "text": "I'll compute the summary statistics first."}, call],
             "stop_reason": "tool_use", "stop_sequence": None, "usage": usage}
    last = {"id": "msg_b@TURN@", "type": "message", "role": "assistant", "model": "bench",
            "content": [{"type": "text", "text": "The mean is 149.25 and the standard deviation 86.74. " * 3}],
            "stop_reason": "end_turn", "stop_sequence": None, "usage": usage}
    obs = {"stdout": OUT, "stderr": "", "result": None, "displays": [], "error": None, "truncated": [],
           "generation": 1, "duration_ms": 14.2, "notes": []}
    return [
        ("user_message", {"text": "Summarise the measurements in vals and tell me what stands out (turn @TURN@)."}),
        ("model_request", {"attempt": 1, "model": "bench", "messages": 3}),
        ("assistant_turn", {"message": first, "usage": usage, "attempt": 1, "latency_ms": 2310.5, "ttft_ms": 640.2}),
        ("tool_started", {"tool_use_id": "toolu_bench@TURN@", "name": "python", "input": {"code": CODE}}),
        ("tool_result", {"tool_use_id": "toolu_bench@TURN@", "name": "python", "content": [{"type": "text", "text": OUT}],
                         "is_error": False, "observation": obs}),
        ("model_request", {"attempt": 1, "model": "bench", "messages": 5}),
        ("assistant_turn", {"message": last, "usage": usage, "attempt": 1, "latency_ms": 1290.1, "ttft_ms": 580.7}),
        ("turn_ended", {"stop_reason": "end_turn"}),
    ]


COMPACT_EVERY = 150  # turns: a turn of the template is ~2 KB of request, so the API's 150k-token trigger
COMPACTION = {"type": "compaction", "content": "Summary of the conversation so far: the user measured vals, "
              "asked for summary statistics each turn; all were computed in the kernel. " * 4}


def fill(log: Any, session_id: str, events: int, compact_every: int = COMPACT_EVERY) -> int:
    """Append whole template turns after session_created until about `events` events; returns the count.

    As a long session of a compact-mode model would: every `compact_every`-th turn's first response
    opens with a compaction block (0: none)."""
    tmpl = template()
    rows = ((events - 1) // len(tmpl)) * len(tmpl)
    compacted = json.loads(json.dumps(tmpl[2][1]))
    compacted["message"]["content"].insert(0, COMPACTION)

    def _fill(tx: Any) -> None:
        tx.execute("CREATE TEMP TABLE IF NOT EXISTS bench_tmpl (idx INTEGER, type VARCHAR, payload VARCHAR)")
        tx.execute("DELETE FROM bench_tmpl")
        for i, (t, p) in enumerate([*tmpl, ("assistant_turn", compacted)]):
            tx.execute("INSERT INTO bench_tmpl VALUES (?, ?, ?)", [i, t, json.dumps(p)])
        # the template's third event (its first response), or the compacted one in every compact_every-th turn
        tx.execute(
            "INSERT INTO events SELECT ?, 1 + g.i, now()::TIMESTAMP, t.type, "
            "replace(t.payload, '@TURN@', CAST((g.i - 1) // ? AS VARCHAR))::JSON "
            "FROM range(1, ? + 1) g(i) JOIN bench_tmpl t ON t.idx = CASE WHEN (g.i - 1) % ? = 2 AND ? > 0 "
            "AND ((g.i - 1) // ?) % greatest(?, 1) = ? - 1 THEN ? ELSE (g.i - 1) % ? END",
            [session_id, len(tmpl), rows, len(tmpl), compact_every, len(tmpl), compact_every, compact_every,
             len(tmpl), len(tmpl)])

    log.write(_fill).result()
    return rows + 1


def timed_appends(log: Any, session_id: str, n: int) -> tuple[list[float], float]:
    """n appends of the template's events, one commit each, to a new session: each one's milliseconds, and the
    appends a second over them all."""
    log.create_session(session_id, title=None, model="bench", payload={"model": "bench"})
    tmpl = template()
    samples = []
    t_all = time.perf_counter()
    for i in range(n):
        t, p = tmpl[i % len(tmpl)]
        t0 = time.perf_counter()
        log.append(session_id, t, p)
        samples.append(ms(t0))
    return samples, n / (time.perf_counter() - t_all)


def _append_latency(ctx: Context, sec: Section) -> float:
    from workbench.log import DuckDBLog

    log = DuckDBLog(ctx.tmp / "append.duckdb")
    try:
        samples, rate = timed_appends(log, "append", ctx.trials(100, 2000))
    finally:
        log.close()
    tmpl = template()
    avg = sum(len(json.dumps(p)) for _, p in tmpl) / len(tmpl)
    sec.row("durable append (DuckDBLog.append, one commit each)", samples, p99=True,
            throughput_per_s=round(rate), avg_payload_bytes=round(avg))
    return percentile(samples, 50)


def run_sync(ctx: Context) -> Section:
    sec = Section("log", "Log: durable appends, request rebuilds, resume")
    from workbench.brain import Brain, build_request, turn_state
    from workbench.brain.coldread import read_conversation
    from workbench.log import DuckDBLog

    append50 = _append_latency(ctx, sec)
    sec.compare("durable append p50", append50, None, target="< 2 ms", met=append50 < 2, kind="absolute")

    sizes = [1_000, 10_000] + ([] if ctx.quick else [100_000])
    path = ctx.tmp / "rebuild.duckdb"
    log = DuckDBLog(path)
    ids: dict[int, tuple[str, int]] = {}
    try:
        brain = Brain(log, hands_factory=None)  # no code runs here
        for size in sizes:
            sid = brain.create_session(model="scripted", title=f"{size} events", config={"context": "compact"})["id"]
            t0 = time.perf_counter()
            count = fill(log, sid, size)
            sec.notes.append(f"built the {count:,}-event session in {ms(t0) / 1000:.1f} s")
            ids[size] = (sid, count)
        rebuild50: dict[int, float] = {}
        for size in sizes:
            sid, count = ids[size]
            tot, ev, st, br, nbytes = [], [], [], [], 0
            for _ in range(ctx.trials(3, 10 if size < 100_000 else 3)):
                t0 = time.perf_counter()
                events = log.events(sid)
                t1 = time.perf_counter()
                request = build_request(events)
                t2 = time.perf_counter()
                turn_state(events)
                t3 = time.perf_counter()
                tot.append(ms(t0, t2))
                ev.append(ms(t0, t1))
                br.append(ms(t1, t2))
                st.append(ms(t2, t3))
                nbytes = len(json.dumps(request))
            tail = []
            for _ in range(ctx.trials(3, 10)):
                t0 = time.perf_counter()
                log.events(sid, after=count - 8)  # one turn's worth: what a step adds
                tail.append(ms(t0))
            rebuild50[size] = sec.row(f"rebuild request, {count:,} events (events() + build_request)", tot,
                                      events_p50_ms=round(percentile(ev, 50), 1), build_p50_ms=round(percentile(br, 50), 1),
                                      turn_state_p50_ms=round(percentile(st, 50), 1),
                                      request_mib=round(nbytes / 2**20, 2))["p50_ms"]
            sec.row(f"  read only the last turn's 8 events of {count:,} (events(after=...))", tail)
    finally:
        log.close()
    sec.notes.append(f"database file: {path.stat().st_size / 2**20:.1f} MiB after checkpoint")

    # What the brain pays per step: it keeps each session's request (brain/request.py: Conversation),
    # folds in what is new (heard from the log after each commit), and hands out the request. A
    # reopened log, because fill() wrote with plain SQL behind the writer's seq counters.
    step50: dict[int, float] = {}
    log = DuckDBLog(path)

    async def steps(size: int) -> list[float]:
        sid, count = ids[size]
        brain = Brain(log, hands_factory=None)  # no code runs here
        try:
            # a turn, as the brain runs one after the session's compactions: it records where requests start
            await brain.run_turn(sid, "What stands out so far?")
            samples = []
            for _ in range(ctx.trials(3, 10 if size < 100_000 else 5)):
                await log.aappend(sid, "user_message", {"text": "one more step"})
                t0 = time.perf_counter()
                (await brain.conversation(sid)).request()
                samples.append(ms(t0))
            return samples
        finally:
            await brain.close()

    try:
        for size in sizes:
            step50[size] = sec.row(f"brain step, {ids[size][1]:,} events (fold in what is new + the request)",
                                   asyncio.run(steps(size)))["p50_ms"]
    finally:
        log.close()

    resume50: dict[int, float] = {}
    floor50: dict[int, float] = {}
    for size in sizes:
        sid, count = ids[size]
        with DuckDBLog(path, read_only=True) as ro:
            try:
                start = ro.cursor().execute("SELECT coalesce(request_from, 1) FROM sessions WHERE id = ?", [sid]).fetchone()[0]
            except duckdb.Error:  # the code before issue 24 (--before) reads every event: so does its floor
                start = 1
        floor50[size] = floors.raw_read(path, sid, start, ctx.trials(3, 10 if size < 100_000 else 3))
        sec.row(f"  floor: open the file and fetch the same rows (from seq {start:,}), plain SQL, no parsing",
                [floor50[size]])
        samples = []
        for _ in range(ctx.trials(3, 10 if size < 100_000 else 3)):
            t0 = time.perf_counter()
            lg = DuckDBLog(path)
            conv = read_conversation(lg, sid)  # what a brain does when it first meets a session
            conv.request()
            samples.append(ms(t0))
            lg.close()
        resume50[size] = sec.row(f"resume, {count:,} events (open DB + read what a request needs + the request)",
                                 samples)["p50_ms"]

    v = rebuild50[10_000]
    sec.compare("request rebuilt from a 10k-event session, cold (p50)", v, None, target="< 100 ms", met=v < 100, kind="absolute")
    v = step50[10_000]
    sec.compare("request rebuilt for a step of a 10k-event session (p50)", v, None, target="< 100 ms", met=v < 100, kind="absolute")
    for small, big in zip(sizes, sizes[1:], strict=False):
        sec.compare(f"rebuild growth {big // 1000}k vs {small // 1000}k events", rebuild50[big], rebuild50[small])
        sec.compare(f"resume growth {big // 1000}k vs {small // 1000}k events", resume50[big], resume50[small])
    if 100_000 in step50:
        v = step50[100_000]
        sec.compare("brain step of a 100k-event session (p50)", v, None, target="<= 5 ms", met=v <= 5, kind="absolute")
    big = sizes[-1]
    v = resume50[big]
    sec.goal(f"cold resume of a {big // 1000}k-event session (p50)", v, "ms", "<= 300 ms", v <= 300, floor=floor50[big],
             floor_what="plain SQL fetch of the same rows",
             why=f"opening the file and fetching the rows a resume reads, in plain SQL, takes {floor50[big]:,.0f} ms "
                 f"({100 * floor50[big] / v:.0f}% of it); the rest is parsing them and folding the request")
    sec.notes.append("The brain keeps each session's request and folds in only what is new before a step (the log is "
                     "append-only, so the fold is exact): a step pays the 'brain step' row. A cold read (six event types, "
                     "tool results without their observation, parsed with the collector paused) is paid once per session "
                     "per process, e.g. on resume: the 'resume' row, from the user message the latest compaction's "
                     f"requests start at (every {COMPACT_EVERY}th turn of these sessions compacts, as a long session of a "
                     "compact-mode model does). The 'rebuild' rows read and parse every event.")
    return sec


async def run(ctx: Context) -> Section:
    import asyncio

    return await asyncio.to_thread(run_sync, ctx)
