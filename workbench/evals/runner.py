"""An eval run: every task × model × epoch as an attempt, at most N at a time, resumable, interruptible.

    async with Host.open(db) as host:
        run = EvalRun(host, load_tasks("tasks.jsonl"), ["scripted:eval"], epochs=3, parallel=8)
        df = await run.run()          # a DataFrame (results.COLUMNS)

A run is named by its id; each attempt's session id is derived from (run, task, model,
epoch, try) (attempt.attempt_id), so starting the same run again skips the finished attempts,
goes on with the cut-off ones, and starts the rest. An attempt that ends as an `error`
(something the model did not cause cut it off: attempt.py, faults.py) is tried again, as a
new attempt of the same (task, model, epoch), up to `retries` times; its results row is its
last try's. Cancelling `run()` (Ctrl-C, SIGTERM, an interrupt from the notebook) interrupts
the running turns, each recorded as interrupted, and stops their kernels; what was finished
stays finished, and a turn it cut off makes its attempt an error, tried again when the run
goes on. What the run is, and whether it ended, is kept in the log's file (runs.py): a server start goes
on with a run that a dead process (or a server's own stop) cut off.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..plugins.errors import ConfigError
from ..plugins.settings import Prices
from .attempt import Attempt, Spec
from .results import attempt_row, frame, outcome_of
from .runs import mark, record
from .tasks import TASK_ID, Task, task_to_json

MAX_EPOCHS = 1000
MAX_PARALLEL = 256
MAX_MODELS = 50
MAX_RETRIES = 10

Progress = Callable[[int, int, "dict[str, Any] | None"], None]  # (finished, total, the row just finished)


def new_run_id() -> str:
    return "run-" + secrets.token_hex(4)


@dataclass
class EvalRun:
    """A run of `tasks` × `models` × `epochs` on a started host (see the module docstring)."""

    host: Any
    tasks: Sequence[Task]
    models: Sequence[str]
    epochs: int = 1
    parallel: int = 4
    retries: int = 2  # further tries of an attempt that ended as an error
    run_id: str = field(default_factory=new_run_id)
    workspace_root: Path | None = None
    grader_model: str = ""
    prices: Prices = field(default_factory=lambda: Prices({}))
    progress: Progress | None = None
    finished: int = 0
    active: set[str] = field(default_factory=set)  # the attempts (session ids) this run goes on with now
    stopping: bool = False  # its host stops: a cancel leaves the run unfinished, for the next server start

    def __post_init__(self) -> None:
        if not isinstance(self.run_id, str) or not TASK_ID.fullmatch(self.run_id):
            raise ConfigError("a run id is 1-100 letters, digits, '_', '.' or '-', starting with a letter or digit")
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or not 1 <= self.epochs <= MAX_EPOCHS:
            raise ConfigError(f"epochs must be a whole number from 1 to {MAX_EPOCHS}")
        if isinstance(self.parallel, bool) or not isinstance(self.parallel, int) or not 1 <= self.parallel <= MAX_PARALLEL:
            raise ConfigError(f"parallel must be a whole number from 1 to {MAX_PARALLEL}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or not 0 <= self.retries <= MAX_RETRIES:
            raise ConfigError(f"retries must be a whole number from 0 to {MAX_RETRIES}")
        models = list(dict.fromkeys(self.models))
        if not models or len(models) > MAX_MODELS or not all(isinstance(m, str) and m.strip() for m in models):
            raise ConfigError(f"give 1 to {MAX_MODELS} model names")
        self.models = models
        for m in models:
            self.host.models.check(m)  # UnknownModel / MissingAPIKey before anything is written
        for t in self.tasks:  # a rubric's grading model too (one that names none uses the attempt's model)
            grader = t.verifier.model or self.grader_model
            if t.verifier.kind == "rubric" and grader:
                self.host.models.check(grader)
        if self.host.hands is None:
            raise ConfigError("an eval runs code: this host was opened without hands")
        if self.workspace_root is None:
            sql = self.host.log.sql()  # a log with a file offers SQL, and names its file
            if sql is None:
                raise ConfigError("give the run a workspace_root: this log has no file to put workspaces next to")
            self.workspace_root = sql.path.with_name(sql.path.name + ".evals")

    def specs(self) -> list[Spec]:
        """Every attempt of the run (its first try), in order: task, then model, then epoch."""
        return [Spec(self.run_id, t, m, e) for t in self.tasks for m in self.models for e in range(1, self.epochs + 1)]

    def latest(self, spec: Spec) -> Spec:
        """The attempt's latest try in the log (its first when it has none yet): tries are made one after another."""
        while self.host.log.has_session(spec.retry().id):
            spec = spec.retry()
        return spec

    def check_resumable(self, specs: list[Spec]) -> list[Spec]:
        """The tries still to run, one per unfinished attempt: its latest try, or the next after an error that may be
        retried; ConfigError when an existing attempt was made from a different task."""
        log, todo = self.host.log, []
        for first in specs:
            s = self.latest(first)
            if not log.has_session(s.id):
                todo.append(s)
                continue
            evs = log.events(s.id, types=["eval_started", "eval_finished"])
            if evs and evs[0].payload.get("digest") != s.task.digest():
                raise ConfigError(f"run {self.run_id} already has an attempt of task {s.task.id!r} made from a different "
                                  "version of it (prompt, files, verifier or limits changed); start a new run")
            finished = next((e.payload for e in evs if e.type == "eval_finished"), None)
            if finished is None:
                todo.append(s)
            elif self.retried(s, finished):
                todo.append(s.retry())
        return todo

    def retried(self, spec: Spec, finished: dict[str, Any]) -> bool:
        """Whether a try that finished so is tried again: an error, with retries left."""
        return outcome_of(finished) == "error" and spec.try_n <= self.retries

    def to_json(self) -> dict[str, Any]:
        """What the run is (kept in `eval_runs`, runs.py): enough to make it again in another process."""
        return {"tasks": [task_to_json(t) for t in self.tasks], "models": list(self.models), "epochs": self.epochs,
                "parallel": self.parallel, "retries": self.retries, "grader_model": self.grader_model,
                "workspace_root": str(self.workspace_root)}

    async def _keep(self, state: str | None) -> None:
        """Record the run as running (None) or how it ended, in a log with SQL tables (not the in-memory twin)."""
        sql = self.host.log.sql()
        if sql is None or sql.read_only:
            return
        if state is None:
            await asyncio.to_thread(record, sql, self.run_id, self.to_json())
        else:  # also when the run was cancelled: the record is written before the cancel goes on
            await asyncio.shield(asyncio.to_thread(mark, sql, self.run_id, state))

    async def run(self) -> Any:
        """Run what is left of the run; a DataFrame of all its attempts."""
        specs = self.specs()
        todo = await asyncio.to_thread(self.check_resumable, specs)
        await self._keep(None)
        total = len(specs)
        self.finished = total - len(todo)
        if self.progress:
            self.progress(self.finished, total, None)
        gate = asyncio.Semaphore(self.parallel)
        assert self.workspace_root is not None, "set in __post_init__"
        root = self.workspace_root

        async def one(spec: Spec) -> None:
            async with gate:
                while True:
                    self.active.add(spec.id)  # also between its turns (grading, feedback): the session is at work
                    try:
                        done = await Attempt(self.host, spec, root, grader_model=self.grader_model, price=self.prices).run()
                    finally:
                        self.active.discard(spec.id)
                    if not self.retried(spec, done):
                        break
                    spec = spec.retry()
            self.finished += 1
            if self.progress:
                row = attempt_row(await self.host.log.aevents(spec.id))
                self.progress(self.finished, total, row)

        jobs = [asyncio.ensure_future(one(s)) for s in todo]
        state = "failed"
        try:
            if jobs:
                await asyncio.gather(*jobs)
            state = "done"
        except asyncio.CancelledError:
            state = "running" if self.stopping else "interrupted"
            raise
        finally:
            for j in jobs:
                j.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
            if state != "running":
                await self._keep(state)
        return frame(await asyncio.to_thread(self.rows))

    def rows(self) -> list[dict[str, Any]]:
        """The rows of this run's attempts that exist (each its latest try's), in `specs()` order."""
        out = []
        for first in self.specs():
            s = self.latest(first)
            if self.host.log.has_session(s.id):
                row = attempt_row(self.host.log.events(s.id))
                if row is not None:
                    out.append(row)
        return out
