"""The evals plugin's part of the notebook client (`wb.eval(...)`, `wb.eval_runs()`, ...) and the one way a run
in a server is started and followed, which `workbench eval` through a server uses too."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..plugins.errors import RequestRefused, WorkbenchError
from .results import frame
from .tasks import load_tasks, task_to_json

if TYPE_CHECKING:
    from ..plugins.client import WorkbenchClient

POLL_S = 0.5  # how often a run's status is read for its progress


def run_path(run_id: str) -> str:
    return f"/evals/{quote(run_id, safe='')}"


def start_run(client: WorkbenchClient, body: dict[str, Any]) -> dict[str, Any]:
    """Start a run in the server (`POST /evals`): its id, models, parallelism and total."""
    return client.call("POST", "/evals", body)


def follow_run(client: WorkbenchClient, run_id: str, on_status: Callable[[dict[str, Any]], None] = lambda st: None,
               poll: float = POLL_S) -> dict[str, Any]:
    """Read the run's status until it no longer runs (each one to `on_status`); its last status. Ctrl-C (or a kernel
    interrupt) interrupts the run in the server, then goes on as a KeyboardInterrupt."""
    try:
        while True:
            st = client.call("GET", run_path(run_id))
            on_status(st)
            if st["state"] != "running":
                return st
            time.sleep(poll)
    except KeyboardInterrupt:
        try:
            client.call("POST", f"{run_path(run_id)}/interrupt", {})
        except WorkbenchError:
            pass  # the server is gone or the run ended: nothing left to interrupt
        raise


def eval(client: WorkbenchClient, tasks: Any, models: str | list[str], *, epochs: int = 1,
         parallel: int | None = None, run: str | None = None, progress: bool = True, poll: float = POLL_S) -> Any:
    """Run every task × model × epoch in the server and wait; a DataFrame of the attempts (docs/evals.md).

    `tasks`: a task set file (read here, its files sent along) or Tasks / their JSON objects.
    A progress bar shows while it runs (tqdm, when installed); interrupting the kernel
    interrupts the run (finished attempts stay finished: `run=` the same id goes on with it).
    """
    body: dict[str, Any] = {"tasks": [task_to_json(t) for t in load_tasks(tasks)],
                            "models": [models] if isinstance(models, str) else list(models), "epochs": epochs}
    body.update({k: v for k, v in dict(parallel=parallel, run=run).items() if v is not None})
    started = start_run(client, body)
    run_id, bar = started["run"], None
    if progress:
        try:
            from tqdm.auto import tqdm

            bar = tqdm(total=started["total"], desc=run_id, unit="attempt")
        except ImportError:
            bar = None

    def advance(st: dict[str, Any]) -> None:
        if bar is not None:
            bar.update(st["finished"] - bar.n)

    try:
        st = follow_run(client, run_id, advance, poll)
    finally:
        if bar is not None:
            bar.close()
    if st["state"] == "failed":
        raise RequestRefused(500, f"eval run {run_id} failed: {st['error']}")
    df = frame(st["results"])
    df.attrs["run"] = run_id
    return df


def eval_runs(client: WorkbenchClient) -> list[dict[str, Any]]:
    """Every eval run in the server's log."""
    return client.call("GET", "/evals")["runs"]


def eval_results(client: WorkbenchClient, run: str) -> Any:
    """A DataFrame of one run's attempts."""
    df = frame(client.call("GET", run_path(run))["results"])
    df.attrs["run"] = run
    return df


def eval_report(client: WorkbenchClient, df: Any, other: Any = None) -> Any:
    """A Panel view of a run's DataFrame (and a second one beside it), each attempt's transcript one click away."""
    from .report import report_panel

    return report_panel(df, lambda sid: client.events(sid), other)


def eval_export(client: WorkbenchClient, run: str, path: Any) -> list[Any]:
    """Write a run as Inspect AI eval logs (an .eval or .json file for a run of one model, else a directory: a log per
    model); the paths written (docs/evals.md, "Inspect AI")."""
    from pathlib import Path

    from .inspect_log import write_logs

    rows = client.call("GET", run_path(run))["results"]
    return write_logs(rows, lambda sid: client.events(sid), Path(path))


METHODS: Mapping[str, Callable[..., Any]] = MappingProxyType(
    {f.__name__: f for f in (eval, eval_runs, eval_results, eval_report, eval_export)})
