"""The floors the goals are measured against, in the same run: what the work costs without the workbench.

- a raw `jupyter_client` execute of `print(1)` on a ready local ipykernel (execute, iopub until idle, the
  reply): this process's CPU per call, and its wall time;
- raw DuckDB appends of the events a turn writes, batched 1,000 to a transaction on a plain connection
  (the same payloads as the log benchmark's turn): CPU per event; and the same 8 events in the 4 lone
  commits a turn makes (what one session alone cannot batch): CPU per turn;
- a raw DuckDB read of a session's rows, and a top-N of a sessions table, on a plain connection;
- the client's CPU to start a kernel, run one cell in it and shut it down (what an eval attempt does twice:
  its agent's kernel and its verifier's).
CPU is `time.process_time()` of this process: every thread of it, no other process.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import duckdb

from .common import percentile


async def _client(km: Any) -> Any:
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    return kc


async def _run(kc: Any, code: str) -> None:
    msg_id = kc.execute(code)
    while True:
        msg = await kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" \
                and msg["content"]["execution_state"] == "idle":
            break
    while True:
        reply = await kc.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            return


async def raw_execute(trials: int) -> dict[str, float]:
    """CPU ms (p50 of batches) and wall ms (p50) of a raw jupyter_client execute of print(1) on a ready kernel."""
    from jupyter_client.manager import AsyncKernelManager

    km = AsyncKernelManager(kernel_name="python3")
    await km.start_kernel()
    kc = await _client(km)
    try:
        for _ in range(5):
            await _run(kc, "print(1)")
        walls, cpus = [], []
        for _ in range(trials):
            c0, t0 = time.process_time(), time.perf_counter()
            await _run(kc, "print(1)")
            walls.append((time.perf_counter() - t0) * 1000)
            cpus.append((time.process_time() - c0) * 1000)
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
    return {"cpu_ms": percentile(cpus, 50), "wall_ms": percentile(walls, 50), "n": trials}


async def raw_kernel_cell(trials: int) -> float:
    """CPU ms (p50) of starting a local kernel, running one cell and shutting it down, from the client's side."""
    from jupyter_client.manager import AsyncKernelManager

    cpus = []
    for _ in range(trials):
        c0 = time.process_time()
        km = AsyncKernelManager(kernel_name="python3")
        await km.start_kernel()
        kc = await _client(km)
        try:
            await _run(kc, "print(int('7') ** 2)")
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)
        cpus.append((time.process_time() - c0) * 1000)
    return percentile(cpus, 50)


SCHEMA = ("CREATE TABLE events (session_id VARCHAR NOT NULL, seq BIGINT NOT NULL, ts TIMESTAMP NOT NULL, "
          "type VARCHAR NOT NULL, payload JSON NOT NULL, PRIMARY KEY (session_id, seq))")


def raw_appends(path: Path, events: int, batch: int = 1000) -> float:
    """CPU µs per event of raw batched DuckDB appends (`batch` a transaction) of the log benchmark's turn events."""
    from .logbench import template

    rows = [(t, json.dumps(p)) for t, p in template()]
    con = duckdb.connect(str(path))
    try:
        con.execute(SCHEMA)
        seq = 0
        c0 = time.process_time()
        for lo in range(0, events, batch):
            n = min(batch, events - lo)
            cols: list[list[Any]] = [[], [], [], []]
            for _ in range(n):
                seq += 1
                t, p = rows[seq % len(rows)]
                cols[0].append("raw")
                cols[1].append(seq)
                cols[2].append(t)
                cols[3].append(p)
            con.execute("BEGIN TRANSACTION")
            con.execute("INSERT INTO events SELECT unnest(?::VARCHAR[]), unnest(?::BIGINT[]), now()::TIMESTAMP, "
                        "unnest(?::VARCHAR[]), unnest(?::VARCHAR[])::JSON", cols)
            con.execute("COMMIT")
        return (time.process_time() - c0) * 1e6 / events
    finally:
        con.close()


def raw_turn_commits(path: Path, turns: int) -> float:
    """CPU ms per turn of raw DuckDB writes of a turn's 8 events in the 4 transactions the crash contract needs
    (an event is committed before anyone is told of it): the message and its model_request, the response and
    its tool_started, the result and the next model_request, the answer and turn_ended; each a lone commit."""
    from .logbench import template

    rows = [(t, json.dumps(p)) for t, p in template()]
    con = duckdb.connect(str(path))
    try:
        con.execute(SCHEMA)
        seq = 0
        c0 = time.process_time()
        for _ in range(turns):
            for pair in (rows[0:2], rows[2:4], rows[4:6], rows[6:8]):
                cols: list[list[Any]] = [[], [], []]
                for t, p in pair:
                    seq += 1
                    cols[0].append(seq)
                    cols[1].append(t)
                    cols[2].append(p)
                con.execute("INSERT INTO events SELECT 'raw', unnest(?::BIGINT[]), now()::TIMESTAMP, unnest(?::VARCHAR[]), "
                            "unnest(?::VARCHAR[])::JSON", cols)
        return (time.process_time() - c0) * 1000 / turns
    finally:
        con.close()


def raw_read(path: Path, session_id: str, start: int, trials: int) -> float:
    """Wall ms (p50) of opening the file and fetching a session's payloads from seq `start` on: no parsing."""
    samples = []
    for _ in range(trials):
        t0 = time.perf_counter()
        con = duckdb.connect(str(path), read_only=True)
        try:
            con.execute("SELECT seq, type, payload::VARCHAR FROM events WHERE session_id = ? AND (seq = 1 OR seq >= ?) "
                        "ORDER BY seq", [session_id, start]).fetchall()
        finally:
            con.close()
        samples.append((time.perf_counter() - t0) * 1000)
    return percentile(samples, 50)


def raw_top(path: Path, limit: int, trials: int) -> float:
    """Wall ms (p50) of the newest `limit` rows of the sessions table, on an open plain connection."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        samples = []
        for _ in range(trials):
            t0 = time.perf_counter()
            con.execute(f"SELECT * FROM sessions ORDER BY created_at DESC, id DESC LIMIT {int(limit)}").fetchall()
            samples.append((time.perf_counter() - t0) * 1000)
        return percentile(samples, 50)
    finally:
        con.close()
