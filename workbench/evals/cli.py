"""`workbench eval TASKS` (run or resume a run), `workbench evals` (list runs, show one's results) and
`workbench eval-export RUN` (a run as Inspect AI eval logs)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import TYPE_CHECKING, Any, cast

from ..plugins import Command, CommandContext
from ..plugins.errors import ConfigError
from ..plugins.settings import argument
from ..plugins.text import table
from .report import summary
from .results import results, runs
from .stats import comparisons
from .tasks import load_tasks, select

if TYPE_CHECKING:
    from .plugin import EvalPlugin

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130
REATTACH_S = 600.0  # how long a remote `workbench eval` waits for a server that went away to hold the database again
WAKE_S = 120.0  # then how long for that server's start to go on with the run (a run it cannot make stays stopped)


def _progress(total_hint: str) -> Any:
    """A progress callback: a tqdm bar on stderr when tqdm is installed, else a line per finished attempt."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    bar: Any = None

    def update(done: int, total: int, row: dict[str, Any] | None) -> None:
        nonlocal bar
        if tqdm is not None:
            if bar is None:
                bar = tqdm(total=total, initial=done, desc=total_hint, unit="attempt", file=sys.stderr)
            else:
                bar.update(done - bar.n)
                if row is not None:
                    bar.set_postfix_str(f"{row['task']} {row['model']} {row['outcome']}")
        elif row is not None:
            mark = {"pass": "pass", "fail": "FAIL", "error": "ERROR"}.get(row["outcome"], "?")
            tries = f", try {row['tries']}" if row["tries"] > 1 else ""
            print(f"[{done}/{total}] {mark} {row['task']} · {row['model']} · epoch {row['epoch']}{tries} ({row['reason']})",
                  file=sys.stderr)

    update.close = lambda: bar.close() if bar is not None else None  # type: ignore[attr-defined]
    return update


def print_summary(df: Any) -> None:
    rows = summary(df)
    print(table([(r["model"], f"{r['passed']}/{r['n']}", "-" if math.isnan(r["rate"]) else f"{r['rate']:.0%}",
                  f"{r['low']:.0%}–{r['high']:.0%}", r["errors"], r["retried"], f"${r['cost']:.4f}",
                  "-" if math.isnan(r["mean_wall_s"]) else f"{r['mean_wall_s']:.1f}s") for r in rows],
                ("model", "passed", "rate", "95% CI", "errors", "retried", "cost", "mean time"), (30, 8, 6, 12, 6, 7, 10, 9)))
    for c in comparisons(df):
        print(c if isinstance(c, str) else
              f"{c.b} − {c.a}: {c.estimate:+.0%} (95% CI {c.low:+.0%} to {c.high:+.0%}, {c.n} task(s): {c.wins} won, "
              f"{c.losses} lost): {c.verdict}")


def cmd_eval(args: argparse.Namespace, ctx: CommandContext) -> int:
    tasks = select(load_tasks(args.tasks), args.task)
    host = ctx.build_host(args)
    plugin = cast("EvalPlugin", host.plugin("evals"))
    progress = _progress("eval")
    run_id = args.run_id

    async def go() -> Any:
        nonlocal run_id
        try:
            models = args.model or [host.models.default_name()]
            run = plugin.make_run(tasks, models, epochs=args.epochs, parallel=args.parallel, run_id=args.run_id,
                                  progress=progress)
            run_id = run.run_id
            print(f"eval run {run.run_id}: {len(tasks)} task(s) × {len(run.models)} model(s) × {args.epochs} epoch(s), "
                  f"{run.parallel} at a time", file=sys.stderr)
            await host.start()
            return await run.run()
        finally:
            await host.close()

    try:
        df = ctx.run(go)
    except KeyboardInterrupt:
        _interrupted(args, run_id)
        return EXIT_INTERRUPTED
    finally:
        progress.close()
    _print_run(args, df, run_id)
    return EXIT_OK


def _interrupted(args: argparse.Namespace, run_id: str | None) -> None:
    print(f"\nworkbench: eval run {run_id} interrupted; finished attempts are kept. Go on with "
          f"`workbench eval {args.tasks} --run {run_id}` and the same models and epochs", file=sys.stderr)


def _print_run(args: argparse.Namespace, df: Any, run_id: str) -> None:
    if args.json:
        _print_rows(df)
    else:
        print_summary(df)
        print(f"run {run_id}: results in SQL with SELECT * FROM eval_results WHERE run = '{run_id}'", file=sys.stderr)


def _print_rows(df: Any) -> None:
    for row in df.to_dict("records"):
        print(json.dumps(row, default=str))


def _print_results(args: argparse.Namespace, df: Any) -> int:
    if df.empty:
        print(f"no eval run {args.run_id!r} in this log", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        _print_rows(df)
    else:
        print_summary(df)
    return EXIT_OK


def _print_runs(rows: list[dict[str, Any]]) -> int:
    if not rows:
        print("no eval runs yet: start one with `workbench eval TASKS.jsonl --model scripted:eval`", file=sys.stderr)
        return EXIT_OK
    print(table([(r["run"], r["started_at"][:19], ", ".join(r["models"]), r["tasks"], f"{r['finished']}/{r['attempts']}",
                  r["retried"]) for r in rows],
                ("run", "started (UTC)", "models", "tasks", "finished", "retried"), (14, 19, 40, 6, 9, 7)))
    return EXIT_OK


def cmd_evals(args: argparse.Namespace, ctx: CommandContext) -> int:
    host = ctx.build_host(args, read_only=True, hands=False)
    try:
        if args.run_id:
            return _print_results(args, results(host.log, args.run_id))
        rows = runs(host.log)
    finally:
        ctx.run(host.close)
    return _print_runs(rows)


# -- through the server that holds the database (workbench/cli/remote.py) --------------------------

def _remote_rows(r: Any, run_id: str) -> list[dict[str, Any]]:
    """A run's result rows from the server; none when it has no such run."""
    from ..plugins.errors import RequestRefused
    from .client import run_path

    try:
        return list(r.client.call("GET", run_path(run_id))["results"])
    except RequestRefused as e:
        if e.status != 404:
            raise
        return []


def remote_evals(args: argparse.Namespace, r: Any) -> int:
    from .results import frame

    if args.run_id:
        return _print_results(args, frame(_remote_rows(r, args.run_id)))
    with r.answers():
        return _print_runs(r.client.eval_runs())


def remote_eval(args: argparse.Namespace, r: Any) -> int:
    """The run runs in the server (its model keys, hands and settings); the task set, with the contents of its
    files, is read here and sent in the body; progress comes from polling the run's results; Ctrl-C (or SIGTERM)
    interrupts it there, and the same command with `--run ID` goes on with it, as locally."""
    import signal

    from ..plugins.errors import WorkbenchError
    from .client import start_run
    from .results import frame
    from .routes import MAX_EVAL_BODY_BYTES
    from .tasks import task_to_json

    tasks = select(load_tasks(args.tasks), args.task)
    models = list(dict.fromkeys(args.model or [r.client.status()["default_model"]]))
    body: dict[str, Any] = {"tasks": [task_to_json(t) for t in tasks], "models": models, "epochs": args.epochs}
    body.update({k: v for k, v in {"parallel": args.parallel, "run": args.run_id}.items() if v is not None})
    size = len(json.dumps(body))
    if size > MAX_EVAL_BODY_BYTES:
        raise ConfigError(f"the task set with its files is {size:,} bytes as JSON; a server takes at most "
                          f"{MAX_EVAL_BODY_BYTES:,}: split it (--task ID runs only some tasks), or stop the server "
                          "and run it on the file")
    order = {(t.id, m, e): i for i, (t, m, e) in
             enumerate((t, m, e) for t in tasks for m in models for e in range(1, args.epochs + 1))}
    run_id: str | None = args.run_id
    progress = _progress("eval")

    def stop(signum: int, frame_: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with r.answers():
            started = start_run(r.client, body)
        run_id = str(started["run"])
        print(f"eval run {run_id}: {len(tasks)} task(s) × {len(started['models'])} model(s) × {args.epochs} epoch(s), "
              f"{started['parallel']} at a time", file=sys.stderr)
        seen: set[tuple[Any, ...]] | None = None  # attempts (task, model, epoch) counted: a retry is not one more

        def advance(st: dict[str, Any]) -> None:
            nonlocal seen
            done = [row for row in st["results"]
                    if row["outcome"] is not None and (row["task"], row["model"], row["epoch"]) in order]
            if seen is None:  # what was finished before (and in the moment since the start) counts as done
                seen = {(row["task"], row["model"], row["epoch"]) for row in done}
                progress(len(seen), len(order), None)
            for row in done:
                if (row["task"], row["model"], row["epoch"]) not in seen:
                    seen.add((row["task"], row["model"], row["epoch"]))
                    progress(len(seen), len(order), row)

        st = _follow(r, run_id, advance)  # Ctrl-C interrupts the run in the server
    except KeyboardInterrupt:
        if run_id is None:  # cut off before the server answered: it may have started a run of a new id
            print("\nworkbench: eval interrupted before the server answered; see `workbench evals` for a run it "
                  "may have started, and interrupt it from the notebook if it runs", file=sys.stderr)
            return EXIT_INTERRUPTED
        _interrupted(args, run_id)
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
        progress.close()
    if st["state"] == "failed":
        raise WorkbenchError(f"eval run {run_id} failed in the server: {st['error']}")
    if st["state"] == "interrupted":  # by someone else (the notebook, another `workbench eval`)
        _interrupted(args, run_id)
        return EXIT_INTERRUPTED
    if st["state"] != "done":  # "stopped": the server answering now does not run it (it could not go on with it)
        print(f"workbench: eval run {run_id} no longer runs in the server (see its log for why); finished attempts are "
              f"kept. Go on with `workbench eval {args.tasks} --run {run_id}` and the same models and epochs",
              file=sys.stderr)
        return EXIT_FAILED
    rows = sorted((row for row in st["results"] if (row["task"], row["model"], row["epoch"]) in order),
                  key=lambda row: order[(row["task"], row["model"], row["epoch"])])
    _print_run(args, frame(rows), run_id)
    return EXIT_OK


def _follow(r: Any, run_id: str, advance: Any) -> dict[str, Any]:
    """Follow the run to its end (its last status). When the server goes away (killed, restarted), wait for the
    server that holds the database next, whose start goes on with the run, and follow the run there."""
    import time

    from ..plugins.errors import RequestRefused, ServerUnavailable
    from .client import POLL_S, follow_run

    back: float | None = None  # when a server answered again after one went away
    while True:
        try:
            with r.answers():
                st = follow_run(r.client, run_id, advance)
        except (ServerUnavailable, RequestRefused) as e:
            if isinstance(e, RequestRefused) and e.status != 503:  # 503: the server is stopping
                raise
            print(f"workbench: the server went away; following eval run {run_id} again once a server holds the "
                  "database (Ctrl-C to stop waiting)", file=sys.stderr)
            r.reattach(REATTACH_S)
            back = time.monotonic()
            continue
        if st["state"] == "stopped" and back is not None and time.monotonic() - back < WAKE_S:
            time.sleep(POLL_S)  # the new server's start is about to go on with it
            continue
        return st


def _exported(paths: list[Any]) -> int:
    for p in paths:
        print(p)
    print(f"open with `inspect view --log-dir {paths[0].parent}`", file=sys.stderr)
    return EXIT_OK


def cmd_eval_export(args: argparse.Namespace, ctx: CommandContext) -> int:
    from pathlib import Path

    from .inspect_log import write_logs
    from .runs import spec_of

    host = ctx.build_host(args, read_only=True, hands=False)
    try:
        rows = results(host.log, args.run_id).to_dict("records")
        if not rows:
            print(f"no eval run {args.run_id!r} in this log", file=sys.stderr)
            return EXIT_FAILED
        sql = host.log.sql()
        paths = write_logs(rows, host.log.events, Path(args.output), spec_of(sql, args.run_id) if sql is not None else None)
    finally:
        ctx.run(host.close)
    return _exported(paths)


def remote_eval_export(args: argparse.Namespace, r: Any) -> int:
    """The rows and each attempt's events come from the server's API; the logs are written here (the run's kept
    spec is not served, so the samples' targets are empty)."""
    from pathlib import Path

    from .inspect_log import write_logs

    rows = _remote_rows(r, args.run_id)
    if not rows:
        print(f"no eval run {args.run_id!r} in this log", file=sys.stderr)
        return EXIT_FAILED
    with r.answers():
        return _exported(write_logs(rows, r.events, Path(args.output)))


def _configure_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument("tasks", help="a task set: a .jsonl or .yaml file (docs/evals.md)")
    p.add_argument("--model", action="append", help="a model to evaluate (repeat for several; default: the host's)")
    p.add_argument("--epochs", type=argument(int), default=1, help="attempts per task and model (default 1)")
    p.add_argument("--parallel", type=argument(int), default=None, help="attempts at a time (default: the eval parallel setting)")
    p.add_argument("--run", dest="run_id", help="the run's id: give an existing one to go on with it (finished attempts are not re-run)")
    p.add_argument("--task", action="append", help="only this task id (repeatable)")
    p.add_argument("--json", action="store_true", help="print each attempt's row as JSON")


def _configure_evals(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_id", nargs="?", metavar="RUN", help="a run's id: show its results")
    p.add_argument("--json", action="store_true", help="print each attempt's row as JSON")


def _configure_eval_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_id", metavar="RUN", help="the run's id (`workbench evals` lists them)")
    p.add_argument("-o", "--output", required=True,
                   help="an .eval or .json file (a run of one model), or a directory: an .eval log per model in it")
    p.add_argument("--format", choices=("inspect",), default="inspect",
                   help="the log format: inspect (Inspect AI's eval log; needs the inspect extra)")


COMMANDS = (
    Command("eval", "run every task × model × epoch of a task set as eval attempts (or go on with a run)",
            _configure_eval, cmd_eval, remote=remote_eval),
    Command("evals", "list eval runs, or show one run's results", _configure_evals, cmd_evals, remote=remote_evals),
    Command("eval-export", "write an eval run as Inspect AI eval logs (inspect view, inspect_ai's reader)",
            _configure_eval_export, cmd_eval_export, remote=remote_eval_export),
)
