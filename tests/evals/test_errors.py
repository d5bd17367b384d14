"""Errors are not failures: an attempt cut off by something its model did not cause (a kernel killed from outside,
the model API failing after the brain's retries, a verifier that could not reach a verdict) ends as `error`, is
tried again as a new attempt of the same (task, model, epoch), and stays out of the pass rate; a death the model's
own code caused is a failure. Real hosts, kernels and DuckDB files; the scripted model and the fake Messages API."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from workbench.brain import BrainSettings
from workbench.evals import Task, TaskLimits, Verifier, attempt_id, report_html, results, summary
from workbench.evals.script import solver

from evalsupport import assert_frame_matches_sql, open_host, sql_rows

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]

ANSWER = Verifier.python("assert answer.strip() == '42', 'the answer is not 42'")


def waiting_task(marks: Path, go: Path) -> Task:
    """A task whose call writes its kernel's pid to `marks`, then waits for `go` before it answers 42."""
    code = (f"import os, time\nopen({str(marks)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
            f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\nprint(6 * 7)")
    return Task("wait", "Wait for the go, then say 42.", ANSWER, limits=TaskLimits(turns=1),
                scripted=({"code": [code], "answer": "{output}"},))


async def first_line(path: Path, timeout: float = 300) -> str:
    for _ in range(int(timeout / 0.05)):
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text().splitlines()[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"nothing in {path} after {timeout} s")


def first_try(host, run: str, task: str, model: str = "scripted:eval", epoch: int = 1) -> list:
    return host.log.events(attempt_id(run, task, model, epoch))


async def test_a_kernel_killed_from_outside_is_an_error_tried_again_and_one_that_ends_itself_is_a_failure(tmp_path):
    marks, go = tmp_path / "marks", tmp_path / "go"
    exits = Task("exits", "Say 42.", ANSWER, limits=TaskLimits(turns=1),
                 scripted=({"code": ["import os\nos._exit(3)"], "answer": "{output}"},))
    async with open_host(tmp_path, backend="local") as host:  # local kernels: the test sees their pids and files
        run = host.plugin("evals").make_run([waiting_task(marks, go), exits], ["scripted:eval"], parallel=2)
        job = asyncio.ensure_future(run.run())
        pid = int(await first_line(marks))
        os.kill(pid, signal.SIGKILL)  # from outside, while the call waits
        go.touch()
        df = await job
        rows = {r["task"]: r for r in df.to_dict("records")}
        assert rows["wait"]["outcome"] == "pass" and rows["wait"]["passed"] and rows["wait"]["tries"] == 2, rows["wait"]
        killed = first_try(host, run.run_id, "wait")
        (died,) = [e.payload for e in killed if e.type == "hands_died"]
        assert died["signal"] == signal.SIGKILL
        (finished,) = [e.payload for e in killed if e.type == "eval_finished"]
        assert finished["outcome"] == "error" and finished["passed"] is None and finished["score"] is None
        assert finished["reason"].startswith("error: the kernel was killed from outside (signal SIGKILL"), finished
        assert not any(e.type == "eval_verdict" for e in killed), "an error is never graded on the cut"
        # its own os._exit is the model's doing: graded, a failure, not tried again
        assert rows["exits"]["outcome"] == "fail" and rows["exits"]["passed"] is False and rows["exits"]["tries"] == 1
        assert rows["exits"]["reason"] == "turns"
        (died,) = [e.payload for e in host.log.events(rows["exits"]["session_id"]) if e.type == "hands_died"]
        assert died["exit_code"] == 3
        assert_frame_matches_sql(results(host.log, run.run_id), sql_rows(host, run.run_id))
        (s,) = summary(df)
        assert (s["n"], s["passed"], s["rate"], s["errors"], s["retried"]) == (2, 1, 0.5, 0, 1)
        # a second start of the run runs nothing again
        again = await host.plugin("evals").make_run(run.tasks, ["scripted:eval"], run_id=run.run_id).run()
        assert again.drop(columns=["wall_s"]).equals(df.drop(columns=["wall_s"]))
        assert len(host.log.sessions()) == 3


async def test_a_model_api_error_after_the_retries_is_an_error_and_its_retry_passes(tmp_path, api):
    task = Task("say", "Say 42.", ANSWER, limits=TaskLimits(turns=1), scripted=({"answer": "42"},))
    api.use(solver(lambda: {task.prompt: task}))
    api.fail_next(529, times=3)  # the first call, and both of the brain's retries of it
    async with open_host(tmp_path, brain_settings=BrainSettings(max_retries=2, retry_base=0.01)) as host:
        run = host.plugin("evals").make_run([task], ["anthropic:evalbot"])
        df = await run.run()
        (row,) = df.to_dict("records")
        assert row["outcome"] == "pass" and row["tries"] == 2, row
        cut = first_try(host, run.run_id, "say", "anthropic:evalbot")
        assert [e.payload["status"] for e in cut if e.type == "model_retry"] == [529, 529]
        (finished,) = [e.payload for e in cut if e.type == "eval_finished"]
        assert finished["outcome"] == "error"
        assert finished["reason"].startswith("error: the model call failed (529) after 3 attempt(s)"), finished
        assert_frame_matches_sql(df, sql_rows(host, run.run_id))


async def test_a_verifier_that_cannot_reach_a_verdict_is_an_error_after_its_retries_and_out_of_the_rate(tmp_path):
    hangs = Task("hangs", "Say 42.", Verifier.python("import time\ntime.sleep(600)", timeout=2),
                 limits=TaskLimits(turns=1), scripted=({"answer": "42"},))
    fine = Task("fine", "Say 42 again.", ANSWER, limits=TaskLimits(turns=1), scripted=({"answer": "42"},))
    async with open_host(tmp_path) as host:
        plugin = host.plugin("evals")
        plugin.settings.retries = 1
        run = plugin.make_run([hangs, fine], ["scripted:eval"], parallel=2)
        df = await run.run()
        rows = {r["task"]: r for r in df.to_dict("records")}
        assert rows["fine"]["outcome"] == "pass"
        assert rows["hangs"]["outcome"] == "error" and rows["hangs"]["tries"] == 2, rows["hangs"]
        assert rows["hangs"]["passed"] is None and rows["hangs"]["score"] != rows["hangs"]["score"]  # None; NaN in a float column
        assert rows["hangs"]["reason"] == "error: the verifier could not run: the check ran past its timeout and was interrupted"
        for n in (1, 2):
            evs = host.log.events(attempt_id(run.run_id, "hangs", "scripted:eval", 1, n))
            (verdict,) = [e.payload for e in evs if e.type == "eval_verdict"]  # recorded as it came: no verdict
            assert verdict["passed"] is False and "timeout" in verdict["details"]["error"]
        assert_frame_matches_sql(df, sql_rows(host, run.run_id))
        (s,) = summary(df)
        assert (s["n"], s["passed"], s["rate"], s["errors"], s["retried"]) == (1, 1, 1.0, 1, 1)
        q = host.log.query("SELECT avg(CAST(passed AS INTEGER)), count(*) FILTER (WHERE outcome = 'error') "
                           "FROM eval_results WHERE run = ?", [run.run_id])
        assert tuple(q.rows[0]) == (1.0, 1)  # the documented pass-rate query leaves the error out too
        html = report_html(df)
        assert "⚠" in html and "<th title=" in html and ">errors</th>" in html


async def test_a_turn_the_next_host_grades_is_checked_in_its_kept_workspace(tmp_path):
    """A host killed after a turn ended and before its verdict: the next one grades the turn in the workspace the turn
    left (kept beside the log), not "not checked: no workspace", which would be an error the model did not cause."""
    from workbench.evals.attempt import Attempt, Spec

    task = Task("write", "Write 42 into out.txt.", Verifier.python("assert open('out.txt').read() == '42', 'no 42'"),
                limits=TaskLimits(turns=1), scripted=({"code": ["open('out.txt', 'w').write('42')"], "answer": "done"},))
    async with open_host(tmp_path) as host:  # the turn, and no verdict: as a host killed between the two leaves it
        run = host.plugin("evals").make_run([task], ["scripted:eval"], run_id="graded-later")
        assert run.workspace_root is not None
        attempt = Attempt(host, Spec(run.run_id, task, "scripted:eval", 1), run.workspace_root)
        attempt._create()
        await attempt._place_files()
        assert await host.brain.run_turn(attempt.spec.id, task.prompt) == "end_turn"
        await host.brain.close_session(attempt.spec.id)
    async with open_host(tmp_path) as host:
        df = await host.plugin("evals").make_run([task], ["scripted:eval"], run_id="graded-later").run()
        (row,) = df.to_dict("records")
        (verdict,) = [e.payload for e in host.log.events(row["session_id"]) if e.type == "eval_verdict"]
    assert verdict["passed"] is True and "error" not in verdict["details"], verdict
    assert row["outcome"] == "pass" and row["tries"] == 1 and row["session_id"] == attempt.spec.id


async def test_a_memory_blow_up_is_the_models_doing_a_failure_not_an_error(tmp_path):
    """Over its memory limit a kernel is OOM-killed (a cgroup: SIGKILL, "out of memory") or its allocation fails
    (RLIMIT_AS: MemoryError): either way its own code did it, so the attempt is graded and fails, and is not retried."""
    hog = Task("hog", "Say 42.", ANSWER, limits=TaskLimits(turns=1),
               scripted=({"code": ["x = b'x' * (2 << 30)\nprint(len(x))"], "answer": "{output}"},))
    async with open_host(tmp_path, memory_mb=256) as host:
        df = await host.plugin("evals").make_run([hog], ["scripted:eval"]).run()
        (row,) = df.to_dict("records")
        died = [e.payload for e in host.log.events(row["session_id"]) if e.type == "hands_died"]
    assert row["outcome"] == "fail" and row["tries"] == 1 and row["reason"] == "turns", row
    assert all("out of memory" in d["how"] for d in died), died
