"""`workbench run` with a parent delegating to three children, SIGKILLed mid-call, then `workbench resume`:
the parent re-attaches, no child's cut-off call runs again, every child is answered once."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import psutil
import pytest
from wbsupport import WORKBENCH, cli_env

from workbench.log import DuckDBLog

pytestmark = pytest.mark.slow


def test_a_killed_cli_run_resumes_and_reattaches_to_its_children(tmp_path):
    db = tmp_path / "log.duckdb"
    markers = [tmp_path / f"started-{i}" for i in range(3)]
    tasks = [{"prompt": f"```python\nopen({str(m)!r}, 'a').write('x')\nimport time\ntime.sleep(120)\n```",
              "model": "scripted:worker"} for m in markers]
    text = "```json\n" + json.dumps({"tasks": tasks}) + "\n```"
    # local hands: the kernels write markers into this test's directory, which a sandbox does not mount
    env = cli_env(WORKBENCH_HANDS_BACKEND="local")
    proc = subprocess.Popen([*WORKBENCH, "run", text, "--session", "p1", "--model", "scripted:delegate",
                             "--tool", "python", "--tool", "delegate", "--db", str(db)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not all(m.exists() for m in markers) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert all(m.exists() for m in markers), proc.stderr.read().decode() if proc.poll() is not None else "children never ran"
    kids = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    _, alive = psutil.wait_procs(kids, timeout=20)  # a killed CLI's kernels exit on their own (they poll their parent)
    for p in alive:
        p.kill()

    p = subprocess.run([*WORKBENCH, "resume", "p1", "--db", str(db)], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    assert "The children reported" in p.stdout
    assert [m.read_text() for m in markers] == ["x"] * 3  # no cut-off call ran again

    with DuckDBLog(db, read_only=True) as log:
        rows = log.sessions()
        children = [s["id"] for s in rows if s["parent_id"] == "p1"]
        parent = log.events("p1")
        (result,) = [e.payload for e in parent if e.type == "tool_result"]
        assert sorted(c["session_id"] for c in result["children"]) == sorted(children) and len(children) == 3
        assert [e.type for e in parent].count("resumed") == 1 and parent[-1].type == "turn_ended"
        for c in result["children"]:
            events = log.events(c["session_id"])
            (cut,) = [e.payload for e in events if e.type == "tool_result"]
            assert "state unknown" in cut["content"][0]["text"]
            assert [e.type for e in events].count("resumed") == 1 and [e.type for e in events].count("turn_ended") == 1
            assert c["status"] == "done"
