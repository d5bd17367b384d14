"""What each run is, kept in the log's DuckDB file, so that a server start goes on with the runs a dead process left.

A run's attempts are sessions, but the run itself (its tasks with their files, its models, epochs and
parallelism) was known only to the process running it: after a crash nothing said what was still to
run. The table `eval_runs` keeps it, one row a run, written when a run starts or goes on and again when
it ends:

    running      it runs, or the process running it died (a server or CLI killed): a server start goes on with it
    done         every attempt finished
    interrupted  someone stopped it (Ctrl-C, SIGTERM of a CLI, the API's interrupt): it goes on only when asked to
    failed       the harness failed: it goes on only when asked to

A server that stops (SIGTERM, its shutdown) leaves its runs `running`: its next start goes on with them.
"""

from __future__ import annotations

import json
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS eval_runs (
    run VARCHAR PRIMARY KEY,
    spec VARCHAR NOT NULL,
    state VARCHAR NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
)
"""
STATES = ("running", "done", "interrupted", "failed")


def record(sql: Any, run: str, spec: dict[str, Any]) -> None:
    """Keep the run's spec (its tasks as JSON, models, epochs, ...) as `running`."""
    sql.write(lambda tx: tx.execute(
        "INSERT INTO eval_runs VALUES (?, ?, 'running', now()) "
        "ON CONFLICT (run) DO UPDATE SET spec = excluded.spec, state = 'running', updated_at = now()",
        [run, json.dumps(spec)])).result()


def mark(sql: Any, run: str, state: str) -> None:
    """Record how the run ended (one of STATES)."""
    assert state in STATES, state
    sql.write(lambda tx: tx.execute("UPDATE eval_runs SET state = ?, updated_at = now() WHERE run = ?",
                                    [state, run])).result()


def unfinished(sql: Any) -> list[tuple[str, dict[str, Any]]]:
    """(run id, spec) of every run still `running`: cut off by a process that died, when no process runs it."""
    cur = sql.cursor()
    try:
        if not cur.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'eval_runs'").fetchone()[0]:
            return []  # a log written before runs were kept
        rows = cur.execute("SELECT run, spec FROM eval_runs WHERE state = 'running' ORDER BY updated_at").fetchall()
    finally:
        cur.close()
    return [(run, json.loads(spec)) for run, spec in rows]


def spec_of(sql: Any, run: str) -> dict[str, Any] | None:
    """The run's kept spec (its tasks, models, ...), None when it is not kept (a log from before runs were kept)."""
    cur = sql.cursor()
    try:
        if not cur.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'eval_runs'").fetchone()[0]:
            return None
        row = cur.execute("SELECT spec FROM eval_runs WHERE run = ?", [run]).fetchone()
    finally:
        cur.close()
    return json.loads(row[0]) if row else None
