"""An eval of two Claude models on five tasks of examples/evals/basic.jsonl, in the cassette next to this file.

    python examples/cassettes/eval_two_models.py              # replay eval_two_models.jsonl: no key, no network
    python examples/cassettes/eval_two_models.py --record     # record it again against the fake Messages API
    ANTHROPIC_API_KEY=... python examples/cassettes/eval_two_models.py --record --real --cassette my.jsonl

notebooks/eval.ipynb replays the shipped cassette (and `tests/evals/test_cassette_eval.py`
checks that it is current and that its replay gives the recorded results). The two
models go through the official SDK, as any `claude-...` model does; what answered
them when the cassette was recorded is the fake Messages API of `workbench.testing`,
one script per model (`scripts()`): `claude-opus-5-5` plays each task's shipped
`scripted` solution, and `claude-haiku-5-5` plays `HASTY` instead, so it guesses
before it computes on two tasks and repeats its mistake on two others. The fake API
signs thinking blocks with a fixed key here, so recording again gives the same file
byte for byte while nothing the requests contain has changed (the default system
prompt, the tools, the tasks, what the kernels print).

With `--real`, the same run records the real models' answers instead (your key, your
cost; any `--model` names): replay that cassette in the notebook by pointing `CASSETTE`
at it. A rerun of a real recording replays only while every kernel prints what it
printed then.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench.evals import Task, load_tasks
from workbench.evals.script import solver
from workbench.host import Host, HostSettings
from workbench.testing import FakeMessagesAPI

HERE = Path(__file__).resolve().parent
CASSETTE = HERE / "eval_two_models.jsonl"
TASK_SET = HERE.parent / "evals" / "basic.jsonl"
TASK_IDS = ("sales-top-region", "fix-mean", "num-fib-30", "retry-sorted-output", "rubric-explain-median")
MODELS = ("claude-opus-5-5", "claude-haiku-5-5")
RUN = "two-models"
SIGNING_KEY = b"workbench-example-eval-cassette"  # the fake API's key: only makes re-recording repeatable

# What the second model does instead of the task's own `scripted` solution (turn n plays entry n, the last
# one again when there are fewer): guess first, then compute; or repeat a mistake until the budget is spent.
HASTY: dict[str, list[dict[str, Any]]] = {
    "sales-top-region": [{"answer": "north"},
                         {"code": ["import pandas as pd\nprint(pd.read_csv('sales.csv').groupby('region').units.sum().idxmax())"],
                          "answer": "{output}"}],
    "num-fib-30": [{"code": ["a, b = 1, 1\nfor _ in range(27):\n    a, b = b, a + b\nprint(b)"], "answer": "F(30) = {output}"},
                   {"code": ["a, b = 1, 1\nfor _ in range(28):\n    a, b = b, a + b\nprint(b)"], "answer": "F(30) = {output}"}],
    "retry-sorted-output": [{"code": ["nums = open('numbers.txt').read().split()\n"
                                      "open('sorted.txt', 'w').write('\\n'.join(sorted(nums)))\nprint(len(nums))"],
                             "answer": "Sorted {output} numbers."}],
    "rubric-explain-median": [{"answer": "Because the median is a more stable statistic than the mean."}],
}


def tasks() -> list[Task]:
    """The five tasks of the eval, in the task set's order."""
    return [t for t in load_tasks(TASK_SET) if t.id in TASK_IDS]


def scripts(chosen: Sequence[Task] | None = None) -> dict[str, Any]:
    """The fake Messages API's script per model: the tasks' own solutions, and HASTY's."""
    chosen = list(chosen or tasks())
    careful = {t.prompt.strip(): t for t in chosen}
    hasty = {t.prompt.strip(): dataclasses.replace(t, scripted=tuple(HASTY.get(t.id, t.scripted))) for t in chosen}
    return {MODELS[0]: solver(lambda: careful), MODELS[1]: solver(lambda: hasty)}


async def run(host: Host, models: Sequence[str] = MODELS, *, run_id: str = RUN, parallel: int = 1) -> Any:
    """The eval on a started host; a DataFrame, one row per attempt (parallel=1 records in a repeatable order)."""
    return await host.plugin("evals").make_run(tasks(), list(models), parallel=parallel, run_id=run_id).run()  # type: ignore[attr-defined]


async def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--record", action="store_true", help="record the cassette (default: replay it)")
    p.add_argument("--real", action="store_true", help="with --record: the real API (ANTHROPIC_API_KEY), not the fake one")
    p.add_argument("--model", action="append", help=f"a model to evaluate (repeatable; default: {' and '.join(MODELS)})")
    p.add_argument("--cassette", default=str(CASSETTE), help="the cassette file (default: eval_two_models.jsonl here)")
    args = p.parse_args(argv)
    models = args.model or list(MODELS)
    if args.real and not args.record:
        p.error("--real records: add --record")
    if args.real and not os.environ.get("ANTHROPIC_API_KEY"):
        p.error("--real needs ANTHROPIC_API_KEY")
    api = None
    if args.record and not args.real:
        if sorted(models) != sorted(MODELS):
            p.error(f"the fake API answers only {' and '.join(MODELS)}; use --real for other models")
        api = FakeMessagesAPI(scripts(), key=SIGNING_KEY).start()
        os.environ.update(ANTHROPIC_API_KEY="sk-fake-not-a-real-key", ANTHROPIC_BASE_URL=api.url)
    settings = HostSettings(cassette=args.cassette, cassette_mode="record" if args.record else "replay")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            async with Host.open(Path(tmp) / "eval.duckdb", settings=settings) as host:
                df = await run(host, models)
    finally:
        if api is not None:
            api.stop()
    print(df[["task", "model", "outcome", "score", "turns", "tool_calls", "reason"]].to_string(index=False))
    return 0 if df.outcome.isin(["pass", "fail"]).all() and not df.reason.str.startswith("stopped").any() else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
