"""The eval routes of the API (docs/api.md, "Evals"): start a run, follow it, interrupt it, list runs.

A run started here runs in the server's host, in the background; the notebook client
(`wb.eval(...)`) starts one and polls it for its progress and results. Tasks come in their
JSON form (files as text or base64) and are checked as strictly as a task set file.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from tornado import web

from ..plugins.errors import ConfigError, UnknownSession
from ..plugins.web import API, MAX_MODEL_CHARS, Body, Handler, Int, Items, Text, api, check_model, parse
from .results import result_rows, runs
from .runner import MAX_EPOCHS, MAX_MODELS, MAX_PARALLEL
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
        self.reply({"runs": await asyncio.to_thread(runs, self.host.log)})

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


def run_status(plugin: Any, log: SessionLog, run_id: str) -> dict[str, Any]:
    rows = result_rows(log, run_id)
    entry = plugin.running.get(run_id)
    if entry is None:
        if not rows:
            raise UnknownSession(f"no eval run {run_id!r}")
        state, total, error = "stopped", len(rows), None
    else:
        run, task = entry
        total, error = len(run.specs()), None
        if not task.done():
            state = "running"
        elif task.cancelled():
            state = "interrupted"
        elif task.exception() is not None:
            state, error = "failed", f"{type(task.exception()).__name__}: {task.exception()}"
        else:
            state = "done"
    finished = sum(1 for r in rows if r["outcome"] is not None)
    return {"run": run_id, "state": state, "total": total, "finished": finished, "error": error, "results": rows}


class EvalHandler(EvalHandlerBase):
    @web.authenticated
    @api
    async def get(self, id: str) -> None:
        self.reply(await asyncio.to_thread(run_status, self.plugin, self.host.log, id))


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
    (f"{API}/evals/{{id}}/interrupt", EvalInterruptHandler),
)
