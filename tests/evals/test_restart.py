"""A host started on a log holding an eval attempt cut off mid-turn (its process died while its model call ran):
the server's wake never resumes that turn (a try cut off is an error, so going on with it would only spend a
model call), and the run that goes on with it closes the turn without calling the model, then tries it again."""

from __future__ import annotations

import pytest

from workbench.evals import Task, TaskLimits, Verifier, attempt_id
from workbench.evals.attempt import Attempt, Spec
from workbench.service.local import Local

from evalsupport import open_host

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]

TASK = Task("answer", "Answer 42.", Verifier.graded('The answer says "42".', model="scripted:grader"),
            limits=TaskLimits(turns=1), scripted=({"answer": "42"},))


async def cut_off_attempt(tmp_path) -> str:
    """An attempt of run `r` whose turn a dead process left open, with its model call asked for and never answered."""
    spec = Spec("r", TASK, "scripted:eval", 1)
    async with open_host(tmp_path, backend="local") as host:
        attempt = Attempt(host, spec, tmp_path / "wb.duckdb.evals")
        attempt._create()
        host.log.write(lambda tx: (tx.append(spec.id, "user_message", {"text": TASK.prompt}),
                                   tx.append(spec.id, "model_request", {"attempt": 1, "model": "scripted:eval",
                                                                        "messages": 1}))).result()
    return spec.id


async def test_a_wake_leaves_a_cut_off_attempt_to_its_run_which_closes_it_without_a_model_call(tmp_path):
    sid = await cut_off_attempt(tmp_path)
    async with open_host(tmp_path, backend="local") as host:
        service = Local(host)
        woken = await service.wake()
        assert sid in woken  # taken by the evals plugin: the brain did not resume it
        types = [e.type for e in host.log.events(sid)]
        assert types == ["session_created", "eval_started", "user_message", "model_request"], types
        assert host.log.sessions([sid])[0]["state"] == "unfinished"

        df = await host.plugin("evals").make_run([TASK], ["scripted:eval"], run_id="r").run()
        assert df.outcome.tolist() == ["pass"] and df.tries.tolist() == [2]
        first = host.log.events(sid)
        types = [e.type for e in first]
        assert types[4:] == ["resumed", "interrupted", "turn_ended", "eval_finished"], types
        assert first[5].payload["by"] == "eval" and first[-1].payload["outcome"] == "error"
        assert "died mid-turn" in first[-1].payload["reason"]
        retry = [e.type for e in host.log.events(attempt_id("r", TASK.id, "scripted:eval", 1, 2))]
        assert retry.count("model_request") == 1 and retry.count("eval_finished") == 1
