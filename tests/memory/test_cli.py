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
