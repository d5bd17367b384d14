"""Evals as a plugin: task sets, verifiers, outcome mode, runs and their report.

It contributes the `eval_*` event types, the `eval_results` SQL view (in the log's DuckDB
file), the `scripted:eval` and `scripted:grader` scripts, the `workbench eval` and
`workbench evals` commands, the eval routes of the API (the notebook's `wb.eval(...)`)
and the eval settings; a server start goes on with every run a dead process left unfinished
(`wake`, runs.py). docs/evals.md says how to use it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..plugins import Command, Plugin
from ..plugins.errors import ConfigError, TurnBusy, WorkbenchError
from ..plugins.settings import Prices, from_env
from .results import VIEW
from .runner import EvalRun
from .runs import SCHEMA, unfinished
from .script import grader, solver
from .tasks import Task, load_tasks

log_ = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ..plugins import PluginHost as Host

EVENT_TYPES: Mapping[str, str] = MappingProxyType({
    "eval_started": "an eval attempt began: its run, task, model, epoch, try, the task's digest, verifier kind and limits",
    "eval_verdict": "a verifier graded the attempt after a turn: passed, score, explanation, and how it was graded",
    "eval_finished": "an eval attempt ended: its outcome (pass, fail or error), passed, score, why it ended, its cost",
})


@dataclass
class EvalSettings:
    """How eval runs behave (env: WORKBENCH_EVAL_<FIELD>); documented in docs/settings.md."""

    parallel: int = 4  # attempts at a time, when a run does not say
    retries: int = 2  # further tries of an attempt that ended as an error (cut off by what the model did not cause)
    grader_model: str = ""  # the model of rubric verifiers that name none; empty: the attempt's own model
    prices: str = ""  # NAME=IN/OUT dollars per million input/output tokens, comma-separated; NAME may end in *
    workspace_root: str = ""  # where attempts' workspaces go; empty: next to the log file (<db>.evals/)


@dataclass
class EvalPlugin(Plugin):
    """Eval runs over task sets."""

    name: str = "evals"
    settings: EvalSettings = field(default_factory=lambda: from_env(EvalSettings, prefix="WORKBENCH_EVAL_"))
    by_prompt: dict[str, Task] = field(default_factory=dict, repr=False)  # what `scripted:eval` can solve
    running: dict[str, tuple[EvalRun, asyncio.Task]] = field(default_factory=dict, repr=False)

    def settings_classes(self) -> Sequence[type]:
        return (EvalSettings,)

    def event_types(self) -> Mapping[str, str]:
        return EVENT_TYPES

    def commands(self) -> Sequence[Command]:
        from .cli import COMMANDS

        return COMMANDS

    def client(self) -> Mapping[str, Any]:
        from .client import METHODS

        return METHODS

    def routes(self) -> Sequence[tuple[str, type]]:
        from .routes import ROUTES

        return ROUTES

    def attach(self, host: Host) -> None:
        super().attach(host)
        sql = host.log.sql()
        if sql is not None and not sql.read_only:  # a log without SQL (the in-memory twin of fast tests) has no view
            sql.write(lambda tx: (tx.execute(VIEW), tx.execute(SCHEMA))).result()

    def scripts(self) -> Mapping[str, Any]:
        return {"eval": solver(lambda: self.by_prompt), "grader": grader}

    async def wake(self) -> list[str]:
        """A server start goes on, in the background, with every run a dead process left unfinished (runs.py). Its
        attempts' cut-off turns are the runs' to close (a try cut off is an error, tried again): never resumed by the
        brain, which would spend a model call on a try that no longer counts; their session ids."""
        assert self.host is not None, "attached"
        sql = self.host.log.sql()
        kept = await asyncio.to_thread(unfinished, sql) if sql is not None and not sql.read_only else []
        for run_id, spec in kept:
            try:
                tasks = await asyncio.to_thread(load_tasks, spec["tasks"])
                self.start(self.make_run(tasks, spec["models"], epochs=spec["epochs"], parallel=spec["parallel"],
                                         run_id=run_id, retries=spec["retries"], grader_model=spec["grader_model"],
                                         workspace_root=Path(spec["workspace_root"])))
            except WorkbenchError as e:  # e.g. its model cannot be made here (no key): `workbench eval --run` goes on
                log_.warning("workbench: eval run %s cannot go on in this server: %s", run_id, e)
        rows = await asyncio.to_thread(self.host.log.sessions, None, "eval")
        return [s["id"] for s in rows if s["state"] == "unfinished"]

    async def shutdown(self) -> None:
        for run, task in list(self.running.values()):
            run.stopping = True  # a server that stops goes on with its runs at its next start
            task.cancel()
        await asyncio.gather(*(t for _, t in self.running.values()), return_exceptions=True)

    # -- runs ------------------------------------------------------------------------

    def make_run(self, tasks: Sequence[Task], models: Sequence[str], *, epochs: int = 1, parallel: int | None = None,
                 run_id: str | None = None, progress: Any = None, **kept: Any) -> EvalRun:
        """An EvalRun on this plugin's host with the eval settings (prices, grader, workspaces, retries); `kept`: the
        retries, grader_model and workspace_root a run was started with, when it goes on (runs.py)."""
        assert self.host is not None, "the host attaches its plugins before anything runs"
        s = self.settings
        kw: dict[str, Any] = {"run_id": run_id} if run_id else {}
        if s.workspace_root:
            kw["workspace_root"] = Path(s.workspace_root).expanduser()
        kw = {"retries": s.retries, "grader_model": s.grader_model, **kw, **kept}
        run = EvalRun(self.host, list(tasks), list(models), epochs=epochs, parallel=parallel or s.parallel,
                      prices=self.prices(), progress=progress, **kw)
        for t in tasks:
            self.by_prompt.setdefault(t.prompt.strip(), t)
        return run

    def prices(self) -> Prices:
        """The price table attempts are priced by: the eval setting `prices`, else the host's."""
        assert self.host is not None, "attached"
        return Prices.parse(self.settings.prices) if self.settings.prices else self.host.prices

    def start(self, run: EvalRun) -> None:
        """Run in the background of the host (the API's runs); TurnBusy when this run is running already."""
        assert self.host is not None, "attached"
        if run.run_id in self.running and not self.running[run.run_id][1].done():
            raise TurnBusy(f"eval run {run.run_id} is already running; wait for it or interrupt it")
        self.running[run.run_id] = (run, self.host.background(run.run()))

    def driving(self, session_id: str) -> bool:
        """Whether a run of this host goes on with the attempt now (between its turns too: grading, feedback)."""
        return any(session_id in run.active for run, task in self.running.values() if not task.done())

    def require_running(self, run_id: str) -> tuple[EvalRun, asyncio.Task]:
        if run_id not in self.running:
            raise ConfigError(f"eval run {run_id!r} is not running in this server")
        return self.running[run_id]
