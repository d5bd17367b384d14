"""An eval run in a real `jupyter server`, followed by `workbench eval` through it, when the server is SIGKILLed
mid-call: a new server on the same database goes on with the run at its start, the CLI re-attaches and prints
the results, every attempt ran once (its sessions, its kernels' code and its model calls counted), and the results
are those of the same run without the kill."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.evals import attempt_id, load_tasks
from workbench.evals.script import first_prompt, solver
from workbench.log import DuckDBLog

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

WORKBENCH = [sys.executable, "-m", "workbench.cli"]
MODEL = "anthropic:evalbot"
LOCAL = {"WORKBENCH_HANDS_BACKEND": "local"}  # the kernels write to this test's directory
START = 240  # seconds a server may take to answer on a loaded machine


def task_set(home: Path) -> Path:
    """Four tasks run one at a time: `cut` writes its kernel's pid to `home/marks` and waits for `home/go`."""
    marks, go = str(home / "marks"), str(home / "go")
    cut = (f"import os, time\nopen({marks!r}, 'a').write(f'cut {{os.getpid()}}\\n')\n"
           f"while not os.path.exists({go!r}):\n    time.sleep(0.05)\nprint(6 * 7)")
    check = {"kind": "python", "code": "assert answer.strip() == '42', 'the answer is not 42'"}
    lines = [("before", {"code": [f"open({marks!r}, 'a').write('before\\n')\nprint(6 * 7)"], "answer": "{output}"}),
             ("wrong", {"answer": "41"}), ("cut", {"code": [cut], "answer": "{output}"}),
             ("after", {"code": [f"open({marks!r}, 'a').write('after\\n')\nprint(6 * 7)"], "answer": "{output}"})]
    path = home / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": name, "prompt": f"Task {name} of {home.name}: answer 42.", "verifier": check,
                                        "scripted": [turn], "limits": {"turns": 1}}) + "\n" for name, turn in lines))
    return path


def env_for(**extra: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("WORKBENCH_", "JUPYTER_"))}
    return {**env, **LOCAL, "WORKBENCH_HANDS_POOL_SIZE": "0", **extra}


def until(what, deadline: float = 300.0):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = what()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {deadline:.0f} s")


def calls_by_task(requests: list[dict], home: Path) -> dict[str, int]:
    """The model calls of each task of `home`'s set (by its prompt, the first user message)."""
    out: dict[str, int] = {}
    for r in requests:
        prompt = first_prompt(r)
        if f" of {home.name}:" in prompt:
            task = prompt.split()[1]
            out[task] = out.get(task, 0) + 1
    return out


def test_a_server_killed_mid_run_goes_on_with_it_at_its_next_start_and_the_cli_follows_it_there(tmp_path, fake_api,
                                                                                               server_process):
    clean, faulty = tmp_path / "clean", tmp_path / "faulty"
    for home in (clean, faulty):
        home.mkdir()
    tasks = {t.prompt.strip(): t for home in (clean, faulty) for t in load_tasks(task_set(home))}
    api = fake_api(solver(lambda: tasks))
    run = ["eval", "--model", MODEL, "--parallel", "1", "--run", "r1", "--json"]

    (clean / "go").touch()  # the same run without the kill, run on its own file
    done = subprocess.run([*WORKBENCH, *run[:1], str(clean / "tasks.jsonl"), *run[1:], "--db", str(clean / "wb.duckdb")],
                          env=env_for(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = {r["task"]: r for r in map(json.loads, done.stdout.splitlines())}

    first = server_process(db=faulty / "wb.duckdb", env=LOCAL)
    cli_env = env_for(WORKBENCH_DB=str(faulty / "wb.duckdb"), JUPYTER_RUNTIME_DIR=first.env["JUPYTER_RUNTIME_DIR"])
    proc = subprocess.Popen([*WORKBENCH, *run[:1], str(faulty / "tasks.jsonl"), *run[1:]], env=cli_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        marks = faulty / "marks"
        until(lambda: marks.exists() and "cut " in marks.read_text())  # `cut`'s code runs: the server dies mid-call
        assert proc.poll() is None
        first.kill()
        (faulty / "go").touch()  # its next try goes on at once
        second = server_process(db=faulty / "wb.duckdb", env=LOCAL)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert "going through its API" in err and "the server went away" in err, err[-3000:]
    rows = {r["task"]: r for r in map(json.loads, out.splitlines())}

    # the results are the run's without the kill; the cut-off try was an error, tried again once
    same = ("outcome", "passed", "score", "reason", "turns", "tool_calls")
    assert {t: [r[k] for k in same] for t, r in rows.items()} == {t: [r[k] for k in same] for t, r in expected.items()}
    assert {t: r["outcome"] for t, r in rows.items()} == {"before": "pass", "wrong": "fail", "cut": "pass", "after": "pass"}
    assert {t: r["tries"] for t, r in rows.items()} == {"before": 1, "wrong": 1, "cut": 2, "after": 1}
    # nothing ran twice: each kernel's code once per try, each model call once (the cut-off try's one call,
    # never made again: its turn was closed, not resumed), every attempt one session
    assert sorted(line.split()[0] for line in (faulty / "marks").read_text().splitlines()) == ["after", "before", "cut", "cut"]
    clean_calls = calls_by_task(api.requests, clean)
    assert calls_by_task(api.requests, faulty) == {**clean_calls, "cut": clean_calls["cut"] + 1}
    assert api.rejections == []
    second.stop()
    with DuckDBLog(faulty / "wb.duckdb", read_only=True) as log:
        evals = [s for s in log.sessions() if s["kind"] == "eval"]
        assert sorted(s["id"] for s in evals) == sorted(
            [attempt_id("r1", t, MODEL, 1) for t in ("before", "wrong", "cut", "after")] + [attempt_id("r1", "cut", MODEL, 1, 2)])
        for s in evals:
            types = [e.type for e in log.events(s["id"])]
            assert types.count("user_message") == types.count("turn_ended") == types.count("eval_finished") == 1, types
        cut = log.events(attempt_id("r1", "cut", MODEL, 1))
        types = [e.type for e in cut]
        assert types.count("resumed") == 1 and "model_request" not in types[types.index("resumed"):], types
        (finished,) = [e.payload for e in cut if e.type == "eval_finished"]
        assert finished["outcome"] == "error" and "died mid-turn" in finished["reason"], finished
        (result,) = [e.payload for e in cut if e.type == "tool_result"]
        assert result["is_error"] and "state unknown" in result["content"][0]["text"]
        (state,) = log.sql().cursor().execute("SELECT state FROM eval_runs WHERE run = 'r1'").fetchone()
        assert state == "done"
