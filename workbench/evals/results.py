"""Results of eval runs: rows from the log (as a pandas DataFrame), the `eval_results` SQL view, costs.

The same numbers two ways: `results(log, run)` reads each attempt's events in Python, and
the view `eval_results` (created in the log's DuckDB file by the evals plugin) computes them
in SQL; `POST /workbench/api/query` and the notebook's SQL see the view. docs/evals.md
documents its columns; a test checks that both agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

COLUMNS = ("run", "task", "model", "epoch", "passed", "score", "turns", "tool_calls", "input_tokens", "output_tokens",
           "cost", "wall_s", "session_id", "reason")

VIEW = """
CREATE OR REPLACE VIEW eval_results AS
WITH started AS (
    SELECT session_id, ts AS started_at,
           json_extract_string(payload, '$.run') AS run,
           json_extract_string(payload, '$.task') AS task,
           json_extract_string(payload, '$.model') AS model,
           CAST(json_extract(payload, '$.epoch') AS INTEGER) AS epoch
    FROM events WHERE type = 'eval_started'
), finished AS (
    SELECT session_id, ts AS finished_at, payload FROM events WHERE type = 'eval_finished'
), counts AS (
    SELECT session_id,
           count(*) FILTER (WHERE type = 'user_message') AS turns,
           count(*) FILTER (WHERE type = 'tool_started') AS tool_calls,
           coalesce(sum(CAST(json_extract(payload, '$.usage.input_tokens') AS BIGINT))
                    FILTER (WHERE type = 'assistant_turn'), 0) AS input_tokens,
           coalesce(sum(CAST(json_extract(payload, '$.usage.output_tokens') AS BIGINT))
                    FILTER (WHERE type = 'assistant_turn'), 0) AS output_tokens
    FROM events WHERE session_id IN (SELECT session_id FROM started) GROUP BY session_id
)
SELECT s.run, s.task, s.model, s.epoch,
       CAST(json_extract(f.payload, '$.passed') AS BOOLEAN) AS passed,
       CAST(json_extract(f.payload, '$.score') AS DOUBLE) AS score,
       c.turns, c.tool_calls, c.input_tokens, c.output_tokens,
       CAST(json_extract(f.payload, '$.cost') AS DOUBLE) AS cost,
       epoch(f.finished_at - s.started_at) AS wall_s,
       s.session_id,
       json_extract_string(f.payload, '$.reason') AS reason
FROM started s JOIN counts c USING (session_id) LEFT JOIN finished f USING (session_id)
"""


def attempt_row(events: Iterable[Any]) -> dict[str, Any] | None:
    """One attempt's row from its events (None when it is not an eval attempt)."""
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(turns=0, tool_calls=0, input_tokens=0, output_tokens=0)
    started = finished = None
    for e in events:
        if e.type == "eval_started":
            started = e
            row.update(run=e.payload["run"], task=e.payload["task"], model=e.payload["model"], epoch=int(e.payload["epoch"]),
                       session_id=e.session_id)
        elif e.type == "eval_finished":
            finished = e
            row.update(passed=bool(e.payload["passed"]), score=float(e.payload["score"]), cost=float(e.payload["cost"]),
                       reason=e.payload["reason"])
        elif e.type == "user_message":
            row["turns"] += 1
        elif e.type == "tool_started":
            row["tool_calls"] += 1
        elif e.type == "assistant_turn":
            u = e.payload.get("usage") or {}
            row["input_tokens"] += int(u.get("input_tokens") or 0)
            row["output_tokens"] += int(u.get("output_tokens") or 0)
    if started is None:
        return None
    if finished is not None:
        row["wall_s"] = (finished.ts - started.ts).total_seconds()
    return row


def result_rows(log: Any, run: str | None = None) -> list[dict[str, Any]]:
    """The rows of every attempt (of `run`, when given), ordered by task, model and epoch."""
    rows = []
    for s in log.sessions(kind="eval"):
        if run is not None and not _of_run(log, s["id"], run):
            continue  # read whole only the attempts of this run: a run's status is asked for often, while it runs
        row = attempt_row(log.events(s["id"]))
        if row is not None and (run is None or row["run"] == run):
            rows.append(row)
    return sorted(rows, key=lambda r: (r["run"], r["task"], r["model"], r["epoch"]))


def _of_run(log: Any, session_id: str, run: str) -> bool:
    started = log.events(session_id, types=["eval_started"], limit=1)
    return bool(started) and started[0].payload.get("run") == run


def frame(rows: list[dict[str, Any]]) -> Any:
    """Rows as a pandas DataFrame with the documented columns."""
    import pandas as pd

    return pd.DataFrame(rows, columns=list(COLUMNS))


def results(log: Any, run: str | None = None) -> Any:
    """A DataFrame of the attempts of `run` (every run when None)."""
    return frame(result_rows(log, run))


def runs(log: Any) -> list[dict[str, Any]]:
    """Each run: its id, models, tasks, attempts, finished attempts and when it started, oldest first."""
    by: dict[str, dict[str, Any]] = {}
    for s in log.sessions(kind="eval"):
        evs = log.events(s["id"], types=["eval_started", "eval_finished"])
        if not evs or evs[0].type != "eval_started":
            continue
        p = evs[0].payload
        r = by.setdefault(p["run"], {"run": p["run"], "started_at": evs[0].ts.isoformat(), "models": set(), "tasks": set(),
                                     "attempts": 0, "finished": 0})
        r["models"].add(p["model"])
        r["tasks"].add(p["task"])
        r["attempts"] += 1
        r["finished"] += any(e.type == "eval_finished" for e in evs)
        r["started_at"] = min(r["started_at"], evs[0].ts.isoformat())
    out = sorted(by.values(), key=lambda r: r["started_at"])
    for r in out:
        r["models"], r["tasks"] = sorted(r["models"]), len(r["tasks"])
    return out
