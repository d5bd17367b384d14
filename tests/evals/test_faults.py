"""A run with injected faults against the same run without them, both through `workbench eval` as a subprocess and
the fake Messages API: a model that answers 529 three times (the first call and both of the brain's retries), a
kernel SIGKILLed from outside, and the CLI itself SIGKILLed mid-call and run again. Each attempt they cut off ends
as an error and is tried again; the run's passes and failures, and so its pass rate, are the fault-free run's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from workbench.evals import attempt_id, load_tasks, summary
from workbench.evals.results import frame
from workbench.evals.script import solver
from workbench.log import DuckDBLog

from wbsupport import WORKBENCH, cli_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = "anthropic:evalbot"
CUT = {"overloaded": "error: the model call failed (529) after 3 attempt(s)",
       "kernel-killed": "error: the kernel was killed from outside (signal SIGKILL",
       "server-killed": "error: the process running the turn died mid-turn"}


def task_set(home: Path) -> Path:
    """Six tasks, two of them failures of the model's own (a wrong answer, a kernel it ends itself); the two that
    wait write their kernel's pid to `home/marks` and go on once `home/go-<task>` exists."""
    def waits(name: str) -> str:
        return (f"import os, time\nopen({str(home / 'marks')!r}, 'a').write(f'{name} {{os.getpid()}}\\n')\n"
                f"while not os.path.exists({str(home / ('go-' + name))!r}):\n    time.sleep(0.05)\nprint(6 * 7)")

    check = {"kind": "python", "code": "assert answer.strip() == '42', 'the answer is not 42'"}
    lines = [("overloaded", {"answer": "42"}), ("kernel-killed", {"code": [waits("kernel-killed")], "answer": "{output}"}),
             ("server-killed", {"code": [waits("server-killed")], "answer": "{output}"}),
             ("plain", {"code": ["print(6 * 7)"], "answer": "{output}"}), ("wrong", {"answer": "41"}),
             ("exits", {"code": ["import os\nos._exit(3)"], "answer": "{output}"})]
    path = home / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": name, "prompt": f"Task {name} of {home.name}: answer 42.", "verifier": check,
                                        "scripted": [turn], "limits": {"turns": 1}}) + "\n" for name, turn in lines))
    return path


def pid_of(marks: Path, name: str, proc: subprocess.Popen) -> int:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended before {name} ran: {proc.communicate()[1].decode()[-3000:]}"
        for line in (marks.read_text().splitlines() if marks.exists() else []):
            if line.startswith(name + " "):
                return int(line.split()[1])
        time.sleep(0.05)
    raise AssertionError(f"{name} did not start within 300 s")


def run_eval(cmd: list[str], env: dict[str, str]) -> list[dict]:
    done = subprocess.run(cmd + ["--json"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_a_run_with_injected_faults_retries_what_they_cut_off_and_passes_as_the_fault_free_run(tmp_path, fake_api):
    clean, faulty = tmp_path / "clean", tmp_path / "faulty"
    for home in (clean, faulty):
        home.mkdir()
    tasks = {t.prompt.strip(): t for home in (clean, faulty) for t in load_tasks(task_set(home))}
    fake_api.use(solver(lambda: tasks))
    # local hands: the kernels write to this test's directory and their pids are this machine's
    env = cli_env(ANTHROPIC_API_KEY="sk-test", ANTHROPIC_BASE_URL=fake_api.url, WORKBENCH_HANDS_BACKEND="local",
                  WORKBENCH_HANDS_POOL_SIZE="0", WORKBENCH_MAX_RETRIES="2", WORKBENCH_RETRY_BASE="0.01")

    def command(home: Path) -> list[str]:  # one at a time: the 529s go to one call, and the faults land in order
        return [*WORKBENCH, "eval", str(home / "tasks.jsonl"), "--model", MODEL, "--parallel", "1", "--run", "faults",
                "--db", str(home / "wb.duckdb")]

    for name in ("kernel-killed", "server-killed"):
        (clean / f"go-{name}").touch()
    expected = run_eval(command(clean), env)

    fake_api.fail_next(529, times=3)  # the run's first model call: `overloaded`'s
    proc = subprocess.Popen(command(faulty), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        os.kill(pid_of(faulty / "marks", "kernel-killed", proc), signal.SIGKILL)  # from outside, mid-call
        (faulty / "go-kernel-killed").touch()
        pid_of(faulty / "marks", "server-killed", proc)
        proc.send_signal(signal.SIGKILL)  # the process running the run, mid-call
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    (faulty / "go-server-killed").touch()
    rows = run_eval(command(faulty), env)

    by_task = {r["task"]: r for r in rows}
    assert {r["task"]: (r["outcome"], r["reason"]) for r in rows} == {r["task"]: (r["outcome"], r["reason"]) for r in expected}
    assert {t: r["outcome"] for t, r in by_task.items()} == {
        "overloaded": "pass", "kernel-killed": "pass", "server-killed": "pass", "plain": "pass", "wrong": "fail",
        "exits": "fail"}
    (with_faults,), (without,) = summary(frame(rows)), summary(frame(expected))
    assert (with_faults["n"], with_faults["passed"], with_faults["rate"]) == (without["n"], without["passed"], without["rate"])
    assert (with_faults["errors"], with_faults["retried"], without["retried"]) == (0, 3, 0)
    assert {t: r["tries"] for t, r in by_task.items()} == {t: 2 if t in CUT else 1 for t in by_task}
    with DuckDBLog(faulty / "wb.duckdb", read_only=True) as log:
        for task, reason in CUT.items():  # each first try: recorded as the error it was, never graded
            evs = log.events(attempt_id("faults", task, MODEL, 1))
            (finished,) = [e.payload for e in evs if e.type == "eval_finished"]
            assert finished["outcome"] == "error" and finished["reason"].startswith(reason), finished
            assert not any(e.type == "eval_verdict" for e in evs)
        cut_call = [e.payload for e in log.events(attempt_id("faults", "server-killed", MODEL, 1)) if e.type == "tool_result"]
        assert len(cut_call) == 1 and cut_call[0]["is_error"] and cut_call[0]["interrupted"]  # answered, never re-run
    # the kernels' code ran once per try: the first tries' and the retries' (in workspaces of their own)
    marks = [line.split()[0] for line in (faulty / "marks").read_text().splitlines()]
    assert sorted(marks) == ["kernel-killed", "kernel-killed", "server-killed", "server-killed"]
    # the CLI's table counts them apart from passes and failures
    table = subprocess.run([*WORKBENCH, "evals", "faults", "--db", str(faulty / "wb.duckdb")], env=env,
                           capture_output=True, text=True, timeout=300)
    assert table.returncode == 0, table.stderr[-2000:]
    head, line = (x.split() for x in table.stdout.splitlines()[:2])
    assert head[:6] == ["model", "passed", "rate", "95%", "CI", "errors"] and "retried" in head
    assert line[:3] == [MODEL, "4/6", "67%"] and line[4:6] == ["0", "3"], table.stdout
    assert fake_api.rejections == []
