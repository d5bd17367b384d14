"""Every `workbench` command while a real `jupyter server` with the extension holds the database.

The command finds the server the way `workbench.connect()` does (the runtime dir's server files),
goes through its REST API and websocket, and prints what it prints when it has the file itself:
the read commands' output is compared with the same commands run on the file once the server stopped.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import inspect_ai.log as inspect_log  # the test extra installs it: `eval-export` is checked through the server too
import pytest
from wbsrv import ServerProcess

from workbench.client import WorkbenchClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # many subprocesses and servers: minutes on a loaded machine

WORKBENCH = [sys.executable, "-m", "workbench.cli"]
START = 240  # seconds a server may take to answer on a loaded machine


def cli_env(server: ServerProcess | None, db) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "WORKBENCH_", "JUPYTER_"))}
    env["WORKBENCH_DB"] = str(db)
    if server is not None:
        env["JUPYTER_RUNTIME_DIR"] = server.env["JUPYTER_RUNTIME_DIR"]
    return env


def wb(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*WORKBENCH, *args], capture_output=True, text=True, timeout=timeout, env=env)


def wb_each(env: dict[str, str], commands: list[tuple[str, ...]]) -> dict[tuple[str, ...], subprocess.CompletedProcess]:
    """Each command at once, four at a time, as several people's commands would run (each mostly starts up)."""
    with ThreadPoolExecutor(4) as pool:
        return dict(zip(commands, pool.map(lambda args: wb(env, *args), commands), strict=True))


READS = [
    ("sessions",),
    ("sessions", "--json"),
    ("sessions", "--state", "ended", "--reverse"),
    ("sessions", "--search", "HELLO", "--json"),
    ("sessions", "--kind", "dream"),
    ("show", "s1"),
    ("export", "s1"),
    ("show", "nope"),
    ("show", "s1", "--events"),
    ("search", "hello"),
    ("search", "nothing like it anywhere"),
    ("usage", "s1"),
    ("sessions", "--usage", "--json"),
    ("models",),
    ("memories",),
    ("memories", "--json", "--status", "accepted"),
    ("memories", "--store", "default"),
    ("memories", "--store", "nobody"),
]


def test_every_command_goes_through_the_server_that_holds_the_database(tmp_path):
    db = tmp_path / "wb.duckdb"
    server = ServerProcess(tmp_path / "home", db, env={"WORKBENCH_MODEL": "scripted", "ANTHROPIC_API_KEY": ""})
    try:
        server.start(START)
        env = cli_env(server, db)
        via = "going through its API"

        r = wb(env, "run", "```python\nprint(6 * 7)\n```", "--session", "s1")
        assert r.returncode == 0, r.stderr
        assert via in r.stderr and "session s1 (model scripted)" in r.stderr
        assert "I'll run that in my kernel." in r.stdout and "42" in r.stdout  # text streamed over the websocket
        assert "print(6 * 7)" in r.stderr  # the tool call, as a local run prints it

        r = wb(env, "run", "hello there. I prefer duckdb over pandas for queries.", "--session", "s1")
        assert r.returncode == 0 and "You said: hello there" in r.stdout, r.stderr
        # each message went with an idempotency key of its own (sent again with it if the connection fails)
        events = WorkbenchClient(server.url, server.token).events("s1")
        keys = [e["payload"].get("idempotency_key") for e in events if e["type"] == "user_message"]
        assert len(keys) == 2 and all(keys) and len(set(keys)) == 2, keys
        r = wb(env, "run", "hello again", "--session", "s1", "--model", "scripted:demo")
        assert r.returncode == 2 and "a session's model cannot change" in r.stderr
        r = wb(env, "run", "   ")
        assert r.returncode == 2 and "the prompt is empty" in r.stderr
        r = wb(env, "run", "x", "--session", "bad/id")
        assert r.returncode == 2 and "id" in r.stderr and "Traceback" not in r.stderr
        r = wb(env, "run", "a second session", "--model", "scripted")
        assert r.returncode == 0, r.stderr

        r = wb(env, "resume", "s1")
        assert r.returncode == 0 and "nothing to resume" in r.stderr, r.stderr
        r = wb(env, "resume", "nope")
        assert r.returncode == 2 and "no session 'nope'" in r.stderr

        r = wb(env, "demo", "--db", str(db))
        assert r.returncode == 0, r.stderr
        assert "» user:" in r.stdout and "The turn ended (end_turn)" in r.stdout and str(db) in r.stdout

        r = wb(env, "dream", "--model", "scripted:dream", "--sessions", "s1")
        assert r.returncode == 0, r.stderr
        assert "proposal(s)" in r.stdout
        memories = [json.loads(line) for line in wb(env, "memories", "--json").stdout.splitlines()]
        assert memories and {m["status"] for m in memories} == {"proposed"}
        target = memories[0]["id"]
        r = wb(env, "memory", target, "--action", "accept", "--note", "checked")
        assert r.returncode == 0, r.stderr
        # the server records the user its identity provider authenticated (with a bare token: an anonymous one)
        assert re.search(r"person:\w+ +accept", r.stdout) and "provenance:" in r.stdout
        r = wb(env, "memory", "nope")
        assert r.returncode == 2 and "no memory 'nope'" in r.stderr
        # a store exported and imported through the server: the same file again adds nothing, another store refuses it
        exported = tmp_path / "default.json"
        r = wb(env, "memories", "export", "--store", "default", "-o", str(exported))
        assert r.returncode == 0 and via in r.stderr and "exported store default" in r.stderr, r.stderr
        assert {m["id"] for m in json.loads(exported.read_text())["memories"]} == {m["id"] for m in memories}
        r = wb(env, "memories", "import", str(exported))
        assert r.returncode == 0 and "imported 0 memories" in r.stdout and r.stdout.count("skipped") == len(memories), r.stderr
        r = wb(env, "memories", "import", str(exported), "--store", "other")
        assert r.returncode == 2 and "exists in store 'default'" in r.stderr and "Traceback" not in r.stderr
        r = wb(env, "memory", target, "--action", "redact")
        assert r.returncode == 2 and "Traceback" not in r.stderr

        r = wb(env, "review")
        assert r.returncode == 2 and "holds the database" in r.stderr and "Memories tab" in r.stderr

        # a page at a time: the cursor of the next page goes to stderr
        r = wb(env, "sessions", "--limit", "1", "--reverse", "--json")
        assert r.returncode == 0 and len(r.stdout.splitlines()) == 1
        cursor = r.stderr.split("--cursor ")[1].split("`")[0]
        r2 = wb(env, "sessions", "--limit", "1", "--reverse", "--json", "--cursor", cursor)
        assert r2.returncode == 0 and json.loads(r2.stdout)["id"] != json.loads(r.stdout)["id"]
        r = wb(env, "sessions", "--cursor", "garbage")
        assert r.returncode == 2 and "cursor" in r.stderr

    finally:
        server.stop()  # stopping the kernels records hands_stopped events
    # a server again, on the same file: it runs no kernel, so the file does not change while it holds it
    server = ServerProcess(tmp_path / "home2", db, env={"WORKBENCH_MODEL": "scripted", "ANTHROPIC_API_KEY": ""})
    try:
        server.start(START)
        env = cli_env(server, db)
        remote = wb_each(env, READS)
        for args, r in remote.items():
            assert via in r.stderr, (args, r.stderr)
        memory_remote = wb(env, "memory", target)
    finally:
        server.stop()

    # the same commands on the file itself print the same (at once too: each opens the file read-only)
    local_env = cli_env(None, db)
    local = wb_each(local_env, READS)
    for args, r in remote.items():
        here = local[args]
        assert via not in here.stderr
        assert (here.returncode, here.stdout) == (r.returncode, r.stdout), args
        assert here.stderr == r.stderr.replace(r.stderr.splitlines()[0] + "\n", "", 1), args
    assert wb(local_env, "memory", target).stdout == memory_remote.stdout
    assert "ended" in remote[("sessions",)].stdout and "── you" in remote[("show", "s1")].stdout


def test_ctrl_c_through_the_server_interrupts_the_turn_there(tmp_path):
    db = tmp_path / "wb.duckdb"
    server = ServerProcess(tmp_path / "home", db, env={"WORKBENCH_MODEL": "scripted", "ANTHROPIC_API_KEY": ""})
    try:
        server.start(START)
        env = cli_env(server, db)
        proc = subprocess.Popen([*WORKBENCH, "run", "```python\nimport time\nprint('sleeping', flush=True)\ntime.sleep(120)\n```",
                                 "--session", "slow"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                bufsize=1)
        lines: list[str] = []

        def read() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            # the running call's output reaches the terminal through the server's websocket while it runs
            deadline = time.monotonic() + 120
            while not any(line.startswith("│ sleeping") for line in list(lines)) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert any(line.startswith("├─ output (live)") for line in list(lines)), "".join(lines)[-2000:]
            assert any(line.startswith("│ sleeping") for line in list(lines)), "".join(lines)[-2000:]
            proc.send_signal(signal.SIGINT)
            proc.wait(120)
            reader.join(30)
        finally:
            if proc.poll() is None:
                proc.kill()
        err = "".join(lines)
        assert proc.returncode == 130, err
        assert "interrupted" in err
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            types = [json.loads(line)["type"] for line in wb(env, "export", "slow").stdout.splitlines()]
            if "turn_ended" in types:
                break
            time.sleep(0.5)
        assert "interrupted" in types and types[-1] == "turn_ended"
    finally:
        server.stop()


def eval_tasks(tmp_path, slow: bool = False):
    """A task set whose file is on the client's side (a `path` next to the set): its content goes in the body."""
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "n.txt").write_text("7\n")
    code = "print(int(open('n.txt').read()) ** 2)"
    lines = [{"id": "square", "prompt": "Square the number in n.txt.", "files": {"n.txt": {"path": "data/n.txt"}},
              "verifier": {"kind": "python", "code": "assert answer.strip() == '49', 'not 49'"},
              "scripted": [{"code": [code], "answer": "{output}"}], "limits": {"turns": 1}}]
    if slow:
        lines.append({"id": "slow", "prompt": "Take your time.", "limits": {"turns": 1},
                      "verifier": {"kind": "python", "code": "assert answer.strip() == 'done', 'not done'"},
                      "scripted": [{"code": ["import time\nprint('sleeping', flush=True)\ntime.sleep(120)\nprint('done')"],
                                    "answer": "{output}"}]})
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


EVAL_READS = [("evals",), ("evals", "r1"), ("evals", "r1", "--json"), ("evals", "nope")]


def test_eval_and_evals_go_through_the_server_and_print_what_they_print_locally(tmp_path):
    db, tasks = tmp_path / "wb.duckdb", eval_tasks(tmp_path)
    run = ["eval", str(tasks), "--model", "scripted:eval", "--epochs", "2", "--run", "r1"]
    via = "going through its API"
    server = ServerProcess(tmp_path / "home", db, env={"WORKBENCH_MODEL": "scripted", "ANTHROPIC_API_KEY": ""})
    try:
        server.start(START)
        env = cli_env(server, db)
        r = wb(env, "evals")
        assert r.returncode == 0 and via in r.stderr and "no eval runs yet" in r.stderr, r.stderr
        r = wb(env, *run, timeout=600)
        assert r.returncode == 0, r.stderr
        assert via in r.stderr and "eval run r1: 1 task(s) × 1 model(s) × 2 epoch(s)" in r.stderr
        assert "scripted:eval" in r.stdout and "2/2" in r.stdout, r.stdout
        assert "2/2 [" in r.stderr and "run r1: results in SQL" in r.stderr  # the progress bar, the closing hint
        remote_eval = {"table": r.stdout, "json": wb(env, *run, "--json", timeout=600)}
        rows = [json.loads(line) for line in remote_eval["json"].stdout.splitlines()]
        assert [(x["task"], x["epoch"], x["passed"]) for x in rows] == [("square", 1, True), ("square", 2, True)]
        # bad input: a 4xx of the server is the local error, exit 2, and nothing is written
        for args, words in [(["--model", "no-such-model"], "no-such-model"), (["--run", "../x"], "run id"),
                            (["--epochs", "0"], "epochs"), (["--parallel", "100000"], "parallel")]:
            r = wb(env, "eval", str(tasks), *args)
            assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        changed = tmp_path / "changed.jsonl"
        changed.write_text(tasks.read_text().replace("Square the number", "Square the integer"))
        r = wb(env, "eval", str(changed), "--model", "scripted:eval", "--run", "r1")
        assert r.returncode == 2 and "different version" in r.stderr, r.stderr
        r = wb(env, "evals")
        assert r.returncode == 0 and [line.split()[0] for line in r.stdout.splitlines()[1:]] == ["r1"], r.stdout
        assert "2/2" in r.stdout  # r1 alone, as it was
        # the Inspect export: the rows and events from the API, the file written here
        r = wb(env, "eval-export", "r1", "-o", str(tmp_path / "remote.eval"))
        assert r.returncode == 0 and via in r.stderr and r.stdout.strip() == str(tmp_path / "remote.eval"), r.stderr
        r = wb(env, "eval-export", "r1", "-o", str(tmp_path / "remote.eval"))
        assert r.returncode == 2 and "exists already" in r.stderr
        assert wb(env, "eval-export", "nope", "-o", str(tmp_path / "nope.eval")).returncode == 1
        WorkbenchClient(server.url, server.token).eval_export("r1", tmp_path / "notebook.json")
    finally:
        server.stop()
    server = ServerProcess(tmp_path / "home2", db, env={"WORKBENCH_MODEL": "scripted", "ANTHROPIC_API_KEY": ""})
    try:
        server.start(START)
        env = cli_env(server, db)
        remote = {args: wb(env, *args) for args in EVAL_READS}
        for args, r in remote.items():
            assert via in r.stderr, (args, r.stderr)
    finally:
        server.stop()
    local_env = cli_env(None, db)
    for args, r in remote.items():
        here = wb(local_env, *args)
        assert via not in here.stderr
        assert (here.returncode, here.stdout) == (r.returncode, r.stdout), args
        assert here.stderr == r.stderr.replace(r.stderr.splitlines()[0] + "\n", "", 1), args
    assert remote[("evals", "nope")].returncode == 1 and "r1" in remote[("evals",)].stdout
    # on the file: the same samples and transcripts (the target is the kept task's)
    assert wb(local_env, "eval-export", "r1", "-o", str(tmp_path / "local.eval")).returncode == 0
    logs = [inspect_log.read_eval_log(str(tmp_path / name)) for name in ("remote.eval", "notebook.json", "local.eval")]
    assert [[(s.id, s.epoch, s.scores["verifier"].value) for s in log.samples] for log in logs] == \
        [[("square", 1, "C"), ("square", 2, "C")]] * 3
    assert [[[m.model_dump(exclude={"id"}) for m in s.messages] for s in log.samples] for log in logs[1:]] == \
        [[[m.model_dump(exclude={"id"}) for m in s.messages] for s in logs[0].samples]] * 2
    assert [s.target for s in logs[0].samples] == [""] * 2 and all(s.target for s in logs[2].samples)
    # the run itself, gone on with on the file (nothing left to run): the same summary and rows
    assert wb(local_env, *run, timeout=600).stdout == remote_eval["table"]
    assert wb(local_env, *run, "--json", timeout=600).stdout == remote_eval["json"].stdout


def test_ctrl_c_of_a_remote_eval_interrupts_the_run_in_the_server_and_the_same_command_goes_on(tmp_path):
    db, tasks = tmp_path / "wb.duckdb", eval_tasks(tmp_path, slow=True)
    cmd = [*WORKBENCH, "eval", str(tasks), "--model", "scripted:eval", "--parallel", "1", "--run", "r2"]
    server = ServerProcess(tmp_path / "home", db, env={"WORKBENCH_MODEL": "scripted", "ANTHROPIC_API_KEY": ""})
    try:
        server.start(START)
        env = cli_env(server, db)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline, slow = time.monotonic() + 300, None
            while time.monotonic() < deadline and slow is None:
                r = wb(env, "evals", "r2", "--json")
                rows = [json.loads(line) for line in r.stdout.splitlines()] if r.returncode == 0 else []
                sid = next((x["session_id"] for x in rows if x["task"] == "slow"), None)
                if sid and '"tool_started"' in wb(env, "export", sid).stdout:
                    slow = sid
                else:
                    time.sleep(0.5)
            assert slow, "the slow attempt's code did not start"
            time.sleep(1)  # the kernel runs the sleep
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 130, err
        assert "eval run r2 interrupted" in err and f"workbench eval {tasks} --run r2" in err
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the run in the server was interrupted: its turn ends there, cut off
            types = [json.loads(line)["type"] for line in wb(env, "export", slow).stdout.splitlines()]
            if "turn_ended" in types:
                break
            time.sleep(0.5)
        assert "interrupted" in types and "eval_finished" not in types, types
        # the same command goes on with the run: the finished attempt is kept, the cut-off one is graded
        r = subprocess.run(cmd + ["--json"], env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        rows = {x["task"]: x for x in map(json.loads, r.stdout.splitlines())}
        assert rows["square"]["passed"] is True and rows["slow"]["passed"] is False
        assert [json.loads(line)["type"] for line in wb(env, "export", slow).stdout.splitlines()].count("tool_started") == 1
    finally:
        server.stop()
