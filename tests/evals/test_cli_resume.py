"""`workbench eval` as a subprocess through the fake Messages API: 24 attempts, 8 at a time, SIGKILLed
halfway (once 12 have run their code: some finished, up to 8 cut off in flight, the rest not started) and run
again with its run id: no attempt runs twice, none is lost, and none fails because of the kill (what it cut off
is an error, tried again). With local hands, and with every kernel (agents' and verifiers')
on a Jupyter Enterprise Gateway: the same test, the hands a parameter."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from workbench.evals import attempt_id, load_tasks
from workbench.evals.script import solver
from workbench.log import DuckDBLog

from egsupport import EnterpriseGateway, Unavailable, skip_or_fail
from wbsupport import WORKBENCH, cli_env

pytestmark = pytest.mark.slow

# each attempt boots two kernels (the agent's and its verifier's): attempts beyond those finished, in flight and not
# started at the kill add kernels, not cases (40 were 160 CPU-s of a CI run, both hands)
TASKS, EPOCHS = 6, 4


def task_set(tmp_path: Path, markers: Path) -> Path:
    lines = []
    for i in range(TASKS):
        # which kernel ran it: on a gateway its KERNEL_ID (hands_started names the session's); locally its working
        # directory, the attempt's own workspace (.../<run>/<session id>/work)
        code = (f"import os, time\nopen({str(markers)!r}, 'a').write((os.environ.get('KERNEL_ID') or os.getcwd()) + '\\n')\n"
                f"time.sleep(0.5)\nprint({i} * {i})")
        lines.append({"id": f"square-{i}", "prompt": f"What is {i} squared? Answer with the number.",
                      "verifier": {"kind": "python", "code": f"assert answer.strip() == '{i * i}', 'wrong square'"},
                      "scripted": [{"code": [code], "answer": "{output}"}],
                      # one turn: a failed verdict is not sent back, so each attempt's code is run by one call only
                      "limits": {"turns": 1}})
    path = tmp_path / "squares.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture(params=["local", "enterprise-gateway"])
def hands_env(request, tmp_path_factory):
    """The hands' settings of the run: local kernels, or every kernel on a Jupyter Enterprise Gateway."""
    if request.param == "local":
        yield {"WORKBENCH_HANDS_BACKEND": "local"}, None
        return
    try:
        gw = EnterpriseGateway(tmp_path_factory.mktemp("eg")).__enter__()
    except Unavailable as e:
        skip_or_fail(pytest, str(e))
    try:
        yield {"WORKBENCH_HANDS_BACKEND": "gateway", "WORKBENCH_HANDS_GATEWAY_URL": gw.url,
               "WORKBENCH_HANDS_GATEWAY_TOKEN": gw.token}, gw
    finally:
        gw.__exit__()


def test_a_run_killed_halfway_goes_on_without_running_anything_twice(tmp_path, fake_api, hands_env):
    hands_env, gateway = hands_env
    markers, db = tmp_path / "markers.txt", tmp_path / "wb.duckdb"
    tasks_path = task_set(tmp_path, markers)
    tasks = {t.prompt.strip(): t for t in load_tasks(tasks_path)}
    fake_api.use(solver(lambda: tasks))
    # local hands or a gateway's on this machine: the kernels write markers into this test's directory, which a
    # sandbox does not mount
    env = cli_env(ANTHROPIC_API_KEY="sk-test", ANTHROPIC_BASE_URL=fake_api.url, WORKBENCH_HANDS_POOL_SIZE="0", **hands_env)
    cmd = [*WORKBENCH, "eval", str(tasks_path), "--model", "anthropic:evalbot", "--epochs", str(EPOCHS),
           "--parallel", "8", "--run", "killed", "--db", str(db)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if markers.exists() and len(markers.read_text().splitlines()) >= TASKS * EPOCHS // 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.communicate()[1].decode()[-2000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    orphans = set(gateway.kernels()) if gateway is not None else set()
    before = Counter(markers.read_text().splitlines())
    assert 0 < len(before) < TASKS * EPOCHS

    again = subprocess.run(cmd + ["--json"], env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    rows = [json.loads(line) for line in again.stdout.splitlines()]
    assert len(rows) == TASKS * EPOCHS and all(r["outcome"] is not None for r in rows)
    assert len({(r["task"], r["model"], r["epoch"]) for r in rows}) == TASKS * EPOCHS  # none lost

    ran = Counter(markers.read_text().splitlines())
    assert max(ran.values()) == 1, [k for k, n in ran.items() if n > 1]  # no attempt's code ran twice
    # every try of every attempt: an attempt whose try the kill cut off was tried again, as a session of its own
    tries = {attempt_id("killed", r["task"], r["model"], r["epoch"], n): (r, n) for r in rows for n in range(1, r["tries"] + 1)}
    with DuckDBLog(db, read_only=True) as log:
        kernels = {e.payload["kernel_id"]: sid for sid in tries for e in log.events(sid)
                   if e.type == "hands_started" and e.payload.get("kernel_id")}
        ran = Counter(kernels.get(k) or Path(k).parent.name for k in ran.elements())  # by the session that ran it
        assert max(ran.values()) == 1 and set(ran) <= set(tries), ran
        cut, errors, unstarted = [], [], []
        for sid, (row, n) in tries.items():
            evs = log.events(sid)
            assert sum(e.type == "eval_started" for e in evs) == 1 and sum(e.type == "eval_finished" for e in evs) == 1
            calls = [e.payload["tool_use_id"] for e in evs if e.type == "tool_started"]
            assert len(calls) == len(set(calls))
            (finished,) = [e.payload for e in evs if e.type == "eval_finished"]
            if n < row["tries"]:  # a try that did not finish: an error, tried again, never a failure
                assert finished["outcome"] == "error" and finished["passed"] is None, finished
                if finished["reason"].startswith("error: the process running the turn died mid-turn"):
                    cut.append(sid)  # the kill cut it off: never graded on the interruption
                    assert not any(e.type == "eval_verdict" for e in evs)
                elif finished["reason"].startswith("error: the agent's kernel could not start"):
                    # outside the model too: on a loaded machine, the agent's kernel that did not answer within its
                    # startup timeout (a CI run at load 12 saw one on the gateway): its code never ran
                    unstarted.append(sid)
                    assert not any(e.type == "eval_verdict" for e in evs) and sid not in ran, finished
                else:  # something else outside the model cut it off: on a loaded machine, a verifier's kernel that
                    # the gateway did not connect within its startup timeout
                    assert finished["reason"].startswith("error: the verifier could not run"), finished
                    errors.append(sid)
            else:
                assert finished["outcome"] == "pass", (row, finished)
                (verdict,) = [e.payload for e in evs if e.type == "eval_verdict"]
                # on a gateway the verifier's hands cannot reach the agent's files: it checked the answer alone
                assert ("answer alone" in " ".join(verdict["details"]["copy_notes"])) == (gateway is not None), verdict
        # a try whose code did not write its marker is one the kill cut off before its code ran, or whose kernel
        # did not start
        assert {sid for sid in tries if sid not in ran} <= {*cut, *unstarted}
        if gateway is not None:
            # a host killed by SIGKILL cannot delete its kernels on the gateway (agents' and verifiers', at most 8
            # each); the run that went on deleted them at its start (the kernel registry names them), and every
            # kernel it started itself
            assert len(orphans) <= 16 and gateway.kernels() == [], (orphans, gateway.kernels())
    assert fake_api.rejections == []
    # what the kill cut off is tried again and passes: no attempt fails because of the crash
    assert [r["outcome"] for r in rows] == ["pass"] * (TASKS * EPOCHS)
    assert len(cut) <= 8 and sum(r["tries"] - 1 for r in rows) == len(cut) + len(errors) + len(unstarted)  # at most 8 ran
