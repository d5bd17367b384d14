"""`workbench dream`, `memories` and `memory` as a person runs them: real subprocesses on a real database."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

WORKBENCH = str(Path(sys.executable).parent / "workbench")


def wb(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([WORKBENCH, *args], capture_output=True, text=True, timeout=120)


def test_dream_then_review_from_the_command_line(recorded, db_path):
    db = ["--db", str(db_path)]
    r = wb("dream", "--model", "scripted:dream", "--sessions", *recorded, *db)
    assert r.returncode == 0, r.stderr
    assert "proposal(s)" in r.stdout and "workbench review" in r.stdout
    memories = [json.loads(line) for line in wb("memories", "--json", *db).stdout.splitlines()]
    assert len(memories) >= 4 and {m["status"] for m in memories} == {"proposed"}
    target = memories[0]["id"]

    r = wb("memory", target, "--action", "accept", "--actor", "person:cli-test", "--note", "checked", *db)
    assert r.returncode == 0, r.stderr
    assert "person:cli-test" in r.stdout and "accept" in r.stdout and "provenance:" in r.stdout
    assert "(user_message)" in r.stdout or "(tool_result)" in r.stdout  # each citation names its event's type
    r = wb("memories", "--status", "accepted", *db)
    assert target in r.stdout and memories[1]["id"] not in r.stdout

    r = wb("memory", target, "--action", "redact", *db)
    assert r.returncode == 2 and "reason must be a non-empty string" in r.stderr

    again = wb("dream", "--model", "scripted:dream", "--sessions", *recorded, *db)
    assert again.returncode == 0 and "0 proposal(s)" in again.stdout
    r = wb("memory", "nope", *db)
    assert r.returncode == 2 and "no memory 'nope'" in r.stderr


def test_a_dream_killed_mid_way_is_resumed_from_the_command_line_and_committed_once(recorded, db_path):
    """`workbench resume` works on a dream: its model and tools come from the memory plugin, and the
    dream commits its proposals and read positions exactly once when the resumed turn ends."""
    import os
    import signal
    import threading

    import psutil

    from workbench.memory.dream_script import dream_script
    from workbench.testing import FakeMessagesAPI

    held, release = threading.Event(), threading.Event()

    def script(request):
        if sum(m["role"] == "assistant" for m in request["messages"]) >= 2 and not held.is_set():
            held.set()
            release.wait(120)  # the dream is stuck in its third model call when its process is killed
        return dream_script(request)

    db = ["--db", str(db_path)]
    with FakeMessagesAPI(script) as api:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "WORKBENCH_"))}
        env.update(ANTHROPIC_API_KEY="test-key", ANTHROPIC_BASE_URL=api.url)
        proc = subprocess.Popen([WORKBENCH, "dream", "--model", "anthropic:dreamer", "--sessions", *recorded, *db],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = proc.stderr.readline()
        assert first.startswith("dream "), first
        dream_id = first.split()[1]
        assert held.wait(120), "the dream never reached its third model call"
        kids = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        psutil.wait_procs(kids, timeout=10)
        release.set()
        r = subprocess.run([WORKBENCH, "resume", dream_id, *db], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    memories = [json.loads(line) for line in wb("memories", "--json", "--dream", dream_id, *db).stdout.splitlines()]
    assert len(memories) >= 4 and len({m["title"] for m in memories}) == len(memories)
    export = [json.loads(line) for line in wb("export", dream_id, *db).stdout.splitlines()]
    kinds = [e["type"] for e in export]
    assert kinds.count("resumed") == 1 and kinds.count("dream_read") == 1 and kinds[-1] == "dream_read"
    # a second dream over the same sessions finds nothing new: the resumed dream's reading was recorded
    again = wb("dream", "--model", "scripted:dream", "--sessions", *recorded, *db)
    assert again.returncode == 0 and "0 proposal(s)" in again.stdout
