"""`workbench dream`, `memories` and `memory` as a person runs them: real subprocesses on a real database."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

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

    r = wb("memory", target, "--action", "accept", "--actor", "dream:nonexistent", *db)
    assert r.returncode == 2 and "--actor" in r.stderr  # who reviews is not the caller's to claim
    r = wb("memory", target, "--action", "accept", "--note", "checked", *db)
    assert r.returncode == 0, r.stderr
    assert f"person:{getpass.getuser()}" in r.stdout and "accept" in r.stdout and "provenance:" in r.stdout
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
    assert kinds.count("resumed") == 1 and kinds.count("dream_read") == 1 and kinds[-2:] == ["dream_read", "dream_ended"]
    # a second dream over the same sessions finds nothing new: the resumed dream's reading was recorded
    again = wb("dream", "--model", "scripted:dream", "--sessions", *recorded, *db)
    assert again.returncode == 0 and "0 proposal(s)" in again.stdout


@pytest.mark.timeout(900)  # a dream killed, then a dozen CLI subprocesses: it passed the 300 s default in CI at load 14
def test_dreams_cancel_from_the_command_line(recorded, db_path):
    """`workbench dreams --cancel ID` on a dream killed between its chunks: it says so, the dream shows
    `cancelled`, `workbench resume` reads no further chunk, a second cancel says it was already
    cancelled, and an unknown id or a session that is not a dream is a clear error that writes nothing."""
    import os

    from workbench.testing import FakeMessagesAPI

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "WORKBENCH_"))}
    env.update(ANTHROPIC_API_KEY="test-key", WORKBENCH_MEMORY_DREAM_CHUNK_SESSIONS="1", WORKBENCH_HANDS_POOL_SIZE="0")
    db = ["--db", str(db_path)]
    holder = Holder()
    with FakeMessagesAPI(holder) as api:
        env["ANTHROPIC_BASE_URL"] = api.url
        dream_id = _kill_dream_at(recorded, db, holder, 4, env)  # killed in chunk 2, after chunk 1's commit

        def dreams() -> dict[str, dict]:
            out = subprocess.run([WORKBENCH, "dreams", "--json", *db], env=env, capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            return {json.loads(line)["id"]: json.loads(line) for line in out.stdout.splitlines()}

        before = dreams()[dream_id]
        assert before["state"] == "unfinished" and before["chunks"] == 1, before
        r = subprocess.run([WORKBENCH, "dreams", "--cancel", dream_id, *db], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and f"dream {dream_id} cancelled" in r.stderr, (r.returncode, r.stderr)
        assert dreams()[dream_id]["state"] == "cancelled"
        calls = holder.calls
        r = subprocess.run([WORKBENCH, "resume", dream_id, *db], env=env, capture_output=True, text=True, timeout=180)
        assert r.returncode == 1 and "cancelled" in r.stderr, (r.returncode, r.stderr)  # it says why it did nothing
        assert holder.calls == calls, "a cancelled dream asked the model again"
        after = dreams()[dream_id]
        assert after["state"] == "cancelled" and after["chunks"] == 1, after
        r = subprocess.run([WORKBENCH, "dreams", "--cancel", dream_id, *db], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "had already ended or been cancelled" in r.stderr, r.stderr

        events = wb("export", dream_id, *db).stdout
        for wrong, says in (("d" * 12, "d" * 12), (recorded[0], "not a dream")):
            r = subprocess.run([WORKBENCH, "dreams", "--cancel", wrong, *db], env=env, capture_output=True, text=True, timeout=120)
            assert r.returncode != 0 and says in r.stderr and "Traceback" not in r.stderr, (r.returncode, r.stderr)
        assert wb("export", dream_id, *db).stdout == events
        assert "dream_cancelled" not in wb("export", recorded[0], *db).stdout


class Holder:
    """scripted:dream behind the fake Messages API, holding its model call number `at` until released."""

    def __init__(self) -> None:
        import threading

        from workbench.memory.dream_script import dream_script

        self.script, self.at, self.calls = dream_script, 0, 0
        self.held, self.release = threading.Event(), threading.Event()

    def arm(self, at: int) -> None:
        import threading

        self.at, self.calls, self.held, self.release = at, 0, threading.Event(), threading.Event()

    def __call__(self, request):
        self.calls += 1
        if self.calls == self.at:
            self.held.set()
            self.release.wait(120)
        return self.script(request)


def _kill_dream_at(recorded, db, holder: Holder, at: int, env: dict) -> str:
    """Start `workbench dream` over the recorded sessions and SIGKILL it while it waits for model call `at`; its id."""
    import signal

    import psutil

    holder.arm(at)
    proc = subprocess.Popen([WORKBENCH, "dream", "--model", "anthropic:dreamer", "--sessions", *recorded, *db],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stderr.readline()
    assert first.startswith("dream "), first
    assert holder.held.wait(120), "the dream never reached that model call"
    kids = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    psutil.wait_procs(kids, timeout=10)
    release = holder.release
    holder.arm(0)  # no call is held from now on
    release.set()  # the held call answers a client that is gone
    return first.split()[1]


def _committed_once(dream_id, db, reference: set[str], sessions: list[str]) -> None:
    memories = [json.loads(line) for line in wb("memories", "--json", *db).stdout.splitlines()]
    titles = [m["title"] for m in memories]
    assert sorted(titles) == sorted(reference), titles  # every memory once, whichever dream proposed it
    export = [json.loads(line) for line in wb("export", dream_id, *db).stdout.splitlines()]
    kinds = [e["type"] for e in export]
    assert kinds.count("dream_ended") == 1 and kinds[-1] == "dream_ended"
    reads = [e["payload"] for e in export if e["type"] == "dream_read"]
    chunks = [e["seq"] for e in export if e["type"] == "dream_chunk"]
    assert len({r["chunk"] for r in reads}) == len(reads) and {r["chunk"] for r in reads} <= set(chunks)  # a chunk once
    read = {sid for r in reads for sid in r["sessions"]}
    assert read == set(sessions)
    again = wb("dream", "--model", "scripted:dream", "--sessions", *sessions, *db)
    assert again.returncode == 0 and "0 proposal(s)" in again.stdout


@pytest.mark.slow
@pytest.mark.timeout(1500)  # about 40 subprocesses and two servers: minutes on a loaded machine
def test_a_dream_killed_at_any_point_commits_exactly_once_when_resumed_from_the_command_line_or_a_server_start(
        recorded, db_path, tmp_path):
    """SIGKILL at several model calls (chunk 1, after chunk 1's commit, mid-chunk 2, chunk 3), then `workbench resume`
    or a server start: every memory and read position is committed once, and a dream after it finds nothing new.

    The kill points are independent (a database copy and a fake Messages API each) and run three at a time: each
    mostly waits for its subprocesses to start."""
    import os
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "WORKBENCH_"))}
    env.update(ANTHROPIC_API_KEY="test-key", WORKBENCH_MEMORY_DREAM_CHUNK_SESSIONS="1", WORKBENCH_HANDS_POOL_SIZE="0")
    pristine = tmp_path / "pristine.duckdb"
    shutil.copy(db_path, pristine)
    ref = wb("dream", "--model", "scripted:dream", "--sessions", *recorded, "--db", str(pristine))
    assert ref.returncode == 0, ref.stderr
    reference = {json.loads(line)["title"] for line in wb("memories", "--json", "--db", str(pristine)).stdout.splitlines()}
    assert len(reference) >= 4

    def kill_point(i: int, at: int, how: str) -> None:
        db_file = tmp_path / f"kill{i}.duckdb"
        shutil.copy(db_path, db_file)
        dream_id = _kill_and_resume(recorded, db_file, tmp_path / f"home{i}", at, how, env)
        _committed_once(dream_id, ["--db", str(db_file)], reference, recorded)

    # the server starts first: they take longest
    points = [(2, "server"), (4, "server"), (1, "cli"), (3, "cli"), (5, "cli"), (7, "cli")]
    with ThreadPoolExecutor(3) as pool:
        for done in [pool.submit(kill_point, i, at, how) for i, (at, how) in enumerate(points)]:
            done.result()


def _kill_and_resume(recorded, db_file: Path, home: Path, at: int, how: str, env: dict) -> str:
    """Kill a dream at model call `at`, then resume it with `workbench resume` (`how` "cli") or a server start; its id."""
    import httpx

    from workbench.testing import FakeMessagesAPI
    from workbench.testing.jupyter import JupyterProcess

    db = ["--db", str(db_file)]
    holder = Holder()
    with FakeMessagesAPI(holder) as api:
        env = {**env, "ANTHROPIC_BASE_URL": api.url}
        dream_id = _kill_dream_at(recorded, db, holder, at, env)
        states = {json.loads(line)["id"]: json.loads(line) for line in wb("dreams", "--json", *db).stdout.splitlines()}
        assert states[dream_id]["state"] == "unfinished", states  # killed: nobody runs it, and it says so
        assert at < 4 or states[dream_id]["chunks"] >= 1  # from call 4 on, killed after chunk 1's commit
        if how == "cli":
            r = subprocess.run([WORKBENCH, "resume", dream_id, *db], env=env, capture_output=True, text=True, timeout=180)
            assert r.returncode == 0, r.stderr
            return dream_id
        server = JupyterProcess(home, env={**env, "HOME": str(home), "WORKBENCH_DB": str(db_file)},
                                extensions={"workbench": True, "jupyterlab": False, "jupyter_lsp": False,
                                            "notebook_shim": False, "jupyter_server_terminals": False, "notebook": False,
                                            "panel.io.jupyter_server_extension": False})
        server.start(timeout=120)
        try:
            for _ in range(1200):  # the server goes on with the dream in the background
                state = httpx.get(f"{server.url}/workbench/api/dreams/{dream_id}", headers=server.headers,
                                  timeout=30).json()["state"]
                if state not in ("running", "unfinished"):
                    break
                time.sleep(0.1)
            assert state == "done", server.log_tail()
        finally:
            server.stop()
    return dream_id
