"""The eval routes of the API (docs/api.md, "Evals"): start a run, follow it, read its report, interrupt it, list runs.

A run started here runs in the server's host, in the background; the notebook client
(`wb.eval(...)`) starts one and polls it for its progress and results. Tasks come in their
JSON form (files as text or base64) and are checked as strictly as a task set file.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from tornado import web

from ..plugins.errors import ConfigError, UnknownSession
from ..plugins.web import API, MAX_MODEL_CHARS, Body, Handler, Int, Items, Text, api, check_model, parse
from .report import summary
from .results import frame, result_rows, runs
from .runner import MAX_EPOCHS, MAX_MODELS, MAX_PARALLEL
from .stats import comparisons
from .tasks import MAX_TASKS, load_tasks

if TYPE_CHECKING:
    from ..plugins.log import SessionLog

MAX_EVAL_BODY_BYTES = 64 << 20  # POST /evals: the tasks with their files


class EvalBody(Body):
    """`POST /evals`."""

    tasks: Items(dict, MAX_TASKS)
    models: Items(Text(MAX_MODEL_CHARS, blank=False), MAX_MODELS)
    epochs: Int(1, MAX_EPOCHS) = 1
    parallel: Int(1, MAX_PARALLEL) | None = None
    run: Text(100, blank=False) | None = None


class EvalHandlerBase(Handler):
    unknown, what = UnknownSession, "eval run"

    @property
    def plugin(self) -> Any:
        return self.host.plugin("evals")


class EvalsHandler(EvalHandlerBase):
    max_body = MAX_EVAL_BODY_BYTES

    @web.authenticated
    @api
    async def get(self) -> None:
        self.reply({"runs": await asyncio.to_thread(listing, self.plugin, self.host.log)})

    @web.authenticated
    @api
    async def post(self) -> None:
        b = parse(EvalBody, self.body())
        tasks = await asyncio.to_thread(load_tasks, b.tasks)
        if not b.models:
            raise ConfigError("give at least one model")
        for m in b.models:
            await asyncio.to_thread(check_model, self.host, m)
        run = self.plugin.make_run(tasks, b.models, epochs=b.epochs, parallel=b.parallel, run_id=b.run)
        await asyncio.to_thread(run.check_resumable, run.specs())  # a changed task is a 400 before anything runs
        self.plugin.start(run)
        self.reply({"run": run.run_id, "state": "running", "total": len(run.specs()), "models": list(run.models),
                    "parallel": run.parallel}, 202)


def run_state(plugin: Any, run_id: str, attempts: int, running: bool = False) -> tuple[str, int, str | None]:
    """A run's state, its attempts in all and the error that failed it: `running`, `done`, `interrupted` or `failed`
    for a run this server runs (its total from its specs), else `stopped` (its total the attempts it has);
    `running`: it was running when its rows were read (see `_running`)."""
    entry = plugin.running.get(run_id)
    if entry is None:
        return "stopped", attempts, None
    run, task = entry
    if running or not task.done():
        return "running", len(run.specs()), None
    if task.cancelled():
        return "interrupted", len(run.specs()), None
    if task.exception() is not None:
        return "failed", len(run.specs()), f"{type(task.exception()).__name__}: {task.exception()}"
    return "done", len(run.specs()), None


def _running(plugin: Any) -> set[str]:
    """The runs this server is running now. Read before a run's rows: a run that ends while they are read is still
    said to be running (the next read says how it ended, with all its rows), never `done` beside rows read before
    its last tries were written (a CI run under load read a report so)."""
    return {run_id for run_id, (_, task) in list(plugin.running.items()) if not task.done()}


def run_status(plugin: Any, log: SessionLog, run_id: str) -> dict[str, Any]:
    running = run_id in _running(plugin)
    rows = result_rows(log, run_id)
    if not rows and run_id not in plugin.running:
        raise UnknownSession(f"no eval run {run_id!r}")
    state, total, error = run_state(plugin, run_id, len(rows), running)
    finished = sum(1 for r in rows if r["outcome"] is not None)
    return {"run": run_id, "state": state, "total": total, "finished": finished, "error": error, "results": rows}


def listing(plugin: Any, log: SessionLog) -> list[dict[str, Any]]:
    """Every run in the log (`runs`), each with its state and total as its status says them."""
    out, running = [], _running(plugin)
    for r in runs(log):
        state, total, _ = run_state(plugin, r["run"], r["attempts"], r["run"] in running)
        out.append({**r, "state": state, "total": total})
    return out


def _finite(value: Any) -> Any:
    """A statistic as JSON can hold it: a non-finite float (a rate of no graded attempt, a mean of none) is null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def report(plugin: Any, log: SessionLog, run_id: str) -> dict[str, Any]:
    """What the report shows, in JSON: the run's status and rows, the per-model summary and the paired comparisons,
    computed by the code the HTML report and the DataFrame helpers use (report.summary, stats.comparisons)."""
    st = run_status(plugin, log, run_id)
    df = frame(st["results"])
    prices = plugin.prices()
    rows = [{**{k: _finite(v) for k, v in r.items()}, "priced": prices.priced(r["model"]) or r["cost"] > 0}
            for r in summary(df)]
    pairs = [{"error": c} if isinstance(c, str) else {**{k: _finite(v) for k, v in asdict(c).items()},
                                                       "verdict": c.verdict} for c in comparisons(df)]
    return {**st, "models": sorted(set(df["model"])), "tasks": sorted(set(df["task"])), "summary": rows,
            "comparisons": pairs, "results": [{k: _finite(v) for k, v in r.items()} for r in st["results"]]}


class EvalHandler(EvalHandlerBase):
    @web.authenticated
    @api
    async def get(self, id: str) -> None:
        self.reply(await asyncio.to_thread(run_status, self.plugin, self.host.log, id))


class EvalReportHandler(EvalHandlerBase):
    @web.authenticated
    @api
    async def get(self, id: str) -> None:
        self.reply(await asyncio.to_thread(report, self.plugin, self.host.log, id))


class EvalInterruptHandler(EvalHandlerBase):
    @web.authenticated
    @api
    async def post(self, id: str) -> None:
        entry = self.plugin.running.get(id)
        running = entry is not None and not entry[1].done()
        if running:
            entry[1].cancel()
            await asyncio.gather(entry[1], return_exceptions=True)
        self.reply({"run": id, "interrupted": running})


ROUTES: tuple[tuple[str, type], ...] = (
    (f"{API}/evals", EvalsHandler),
    (f"{API}/evals/{{id}}", EvalHandler),
    (f"{API}/evals/{{id}}/report", EvalReportHandler),
    (f"{API}/evals/{{id}}/interrupt", EvalInterruptHandler),
)
