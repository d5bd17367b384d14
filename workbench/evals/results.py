"""Results of eval runs: rows from the log (as a pandas DataFrame), the `eval_results` SQL view, costs.

The same numbers two ways: `results(log, run)` reads each attempt's events in Python, and
the view `eval_results` (created in the log's DuckDB file by the evals plugin) computes them
in SQL; `POST /workbench/api/query` and the notebook's SQL see the view. docs/evals.md
documents its columns; a test checks that both agree. An attempt is a row: the latest of its
tries (an attempt that ended as an error is tried again, as a session of its own).
"""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..plugins.log import SessionLog

COLUMNS = ("run", "task", "model", "epoch", "outcome", "passed", "score", "turns", "tool_calls", "input_tokens",
           "output_tokens", "cost", "wall_s", "session_id", "reason", "tries")
OUTCOMES = ("pass", "fail", "error")
OUTCOME_COUNTS = MappingProxyType({"pass": "passed", "fail": "failed", "error": "errors"})  # an outcome's count in `runs`

# one row per (run, task, model, epoch): its latest try (an error is tried again as a new session)
VIEW = """
CREATE OR REPLACE VIEW eval_results AS
WITH started AS (
    SELECT session_id, ts AS started_at,
           json_extract_string(payload, '$.run') AS run,
           json_extract_string(payload, '$.task') AS task,
           json_extract_string(payload, '$.model') AS model,
           CAST(json_extract(payload, '$.epoch') AS INTEGER) AS epoch,
           coalesce(CAST(json_extract(payload, '$.try') AS INTEGER), 1) AS tries
    FROM events WHERE type = 'eval_started'
    QUALIFY row_number() OVER (PARTITION BY run, task, model, epoch ORDER BY tries DESC) = 1
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
       CASE WHEN f.payload IS NOT NULL THEN coalesce(json_extract_string(f.payload, '$.outcome'),
           CASE WHEN CAST(json_extract(f.payload, '$.passed') AS BOOLEAN) THEN 'pass' ELSE 'fail' END) END AS outcome,
       CAST(json_extract(f.payload, '$.passed') AS BOOLEAN) AS passed,
       CAST(json_extract(f.payload, '$.score') AS DOUBLE) AS score,
       c.turns, c.tool_calls, c.input_tokens, c.output_tokens,
       CAST(json_extract(f.payload, '$.cost') AS DOUBLE) AS cost,
       epoch(f.finished_at - s.started_at) AS wall_s,
       s.session_id,
       json_extract_string(f.payload, '$.reason') AS reason,
       s.tries
FROM started s JOIN counts c USING (session_id) LEFT JOIN finished f USING (session_id)
"""


def outcome_of(finished: dict[str, Any]) -> str:
    """An `eval_finished` payload's outcome (one written before outcomes were recorded: pass or fail by `passed`)."""
    return str(finished.get("outcome") or ("pass" if finished.get("passed") else "fail"))


def _graded(value: Any, kind: type) -> Any:
    return None if value is None else kind(value)


def attempt_row(events: Iterable[Any]) -> dict[str, Any] | None:
    """One try's row from its events (None when it is not an eval attempt)."""
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(turns=0, tool_calls=0, input_tokens=0, output_tokens=0)
    started = finished = None
    for e in events:
        if e.type == "eval_started":
            started = e
            row.update(run=e.payload["run"], task=e.payload["task"], model=e.payload["model"], epoch=int(e.payload["epoch"]),
                       session_id=e.session_id, tries=int(e.payload.get("try", 1)))
        elif e.type == "eval_finished":
            finished = e
            row.update(outcome=outcome_of(e.payload), passed=_graded(e.payload["passed"], bool),
                       score=_graded(e.payload["score"], float), cost=float(e.payload["cost"]), reason=e.payload["reason"])
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


def latest_tries(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of the rows of each (run, task, model, epoch), the latest try's, ordered by run, task, model and epoch."""
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        key = (row["run"], row["task"], row["model"], row["epoch"])
        if key not in latest or row["tries"] > latest[key]["tries"]:
            latest[key] = row
    return [latest[k] for k in sorted(latest)]


def result_rows(log: SessionLog, run: str | None = None) -> list[dict[str, Any]]:
    """The rows of every attempt (of `run`, when given), each its latest try's, ordered by task, model and epoch."""
    rows = []
    for s in log.sessions(kind="eval"):
        if run is not None and not _of_run(log, s["id"], run):
            continue  # read whole only the attempts of this run: a run's status is asked for often, while it runs
        row = attempt_row(log.events(s["id"]))
        if row is not None and (run is None or row["run"] == run):
            rows.append(row)
    return latest_tries(rows)


def _of_run(log: SessionLog, session_id: str, run: str) -> bool:
    started = log.events(session_id, types=["eval_started"], limit=1)
    return bool(started) and started[0].payload.get("run") == run


def frame(rows: list[dict[str, Any]]) -> Any:
    """Rows as a pandas DataFrame with the documented columns."""
    import pandas as pd

    return pd.DataFrame(rows, columns=list(COLUMNS))


def results(log: SessionLog, run: str | None = None) -> Any:
    """A DataFrame of the attempts of `run` (every run when None)."""
    return frame(result_rows(log, run))


def runs(log: SessionLog) -> list[dict[str, Any]]:
    """Each run: its id, models, tasks, attempts, finished attempts (by their latest try) and of those how many
    passed, failed and ended as an error, errors retried and when it started, oldest first."""
    by: dict[str, dict[str, Any]] = {}
    tries: dict[tuple[Any, ...], tuple[int, str | None]] = {}  # (run, task, model, epoch) -> its latest try, outcome
    for s in log.sessions(kind="eval"):
        evs = log.events(s["id"], types=["eval_started", "eval_finished"])
        if not evs or evs[0].type != "eval_started":
            continue
        p = evs[0].payload
        r = by.setdefault(p["run"], {"run": p["run"], "started_at": evs[0].ts.isoformat(), "models": set(), "tasks": set(),
                                     "attempts": 0, "finished": 0, "passed": 0, "failed": 0, "errors": 0, "retried": 0})
        r["models"].add(p["model"])
        r["tasks"].add(p["task"])
        r["started_at"] = min(r["started_at"], evs[0].ts.isoformat())
        key, n = (p["run"], p["task"], p["model"], p["epoch"]), int(p.get("try", 1))
        if key not in tries or n > tries[key][0]:
            tries[key] = (n, next((outcome_of(e.payload) for e in evs if e.type == "eval_finished"), None))
    for (run, *_), (n, outcome) in tries.items():
        by[run]["attempts"] += 1
        by[run]["finished"] += outcome is not None
        if outcome is not None and outcome in OUTCOME_COUNTS:
            by[run][OUTCOME_COUNTS[outcome]] += 1
        by[run]["retried"] += n - 1
    out = sorted(by.values(), key=lambda r: r["started_at"])
    for r in out:
        r["models"], r["tasks"] = sorted(r["models"]), len(r["tasks"])
    return out
