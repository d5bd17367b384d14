"""The whole example task set, with the scripted model and through the fake Messages API, in one run of two models."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.evals import load_tasks, results
from workbench.evals.script import solver
from workbench.hands.factory import HandsSettings
from workbench.host import Host

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "evals" / "basic.jsonl"


async def test_every_example_task_passes_with_both_stand_ins(tmp_path, fake_api, monkeypatch):
    tasks = load_tasks(EXAMPLE)
    fake_api.use(solver(lambda: {t.prompt.strip(): t for t in tasks}))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_api.url)
    models = ["scripted:eval", "anthropic:evalbot"]
    async with Host.open(tmp_path / "wb.duckdb", hands=HandsSettings(pool_size=0, registry_dir=str(tmp_path / "k"))) as host:
        run = host.plugin("evals").make_run(tasks, models, parallel=4)
        df = await run.run()
        failed = df[~df.passed.astype(bool)]
        assert failed.empty, failed[["task", "model", "reason"]].to_string()
        assert len(df) == 2 * len(tasks) and set(df.model) == set(models)
        assert (df[df.task == "retry-sorted-output"].turns == 2).all()
        q = host.log.query("SELECT model, count(*), sum(CAST(passed AS INTEGER)), sum(tool_calls) FROM eval_results "
                           "WHERE run = ? GROUP BY model ORDER BY model", [run.run_id])
        py = results(host.log, run.run_id).groupby("model").agg(n=("task", "size"), passed=("passed", "sum"),
                                                                 calls=("tool_calls", "sum")).sort_index()
        assert [tuple(r) for r in q.rows] == [(m, int(r.n), int(r.passed), int(r.calls)) for m, r in py.iterrows()]
    assert fake_api.rejections == []
    assert len(fake_api.requests) >= len(tasks)
