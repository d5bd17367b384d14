"""The `workbench` command: runs, crashes, resumes, and bad input, all as real subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from workbench.log import DuckDBLog
from workbench.testing import Reply

from wbsupport import WORKBENCH, cli_env


def wb(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*WORKBENCH, *args], capture_output=True, text=True, timeout=timeout, env=env or cli_env())


def snapshot(db_path) -> list:
    with DuckDBLog(db_path, read_only=True) as log:
        return [(s["id"], [(e.seq, e.type, e.payload) for e in log.events(s["id"])]) for s in log.sessions()]


def test_run_streams_text_and_continues_a_session(db_path):
    p = wb("run", "```python\nprint(2 + 3)\n```", "--session", "s1", "--db", str(db_path))
    assert p.returncode == 0, p.stderr
    assert "I'll run that in my kernel." in p.stdout and "Here is what it printed:\n\n```\n5\n```" in p.stdout
    assert "print(2 + 3)" in p.stderr  # tool calls go to stderr, the assistant's text to stdout
    p = wb("run", "hello again", "--session", "s1", "--db", str(db_path))
    assert p.returncode == 0 and "You said: hello again" in p.stdout
    listing = wb("sessions", "--db", str(db_path))
    assert listing.returncode == 0 and "s1" in listing.stdout and "ended" in listing.stdout
    lines = [json.loads(x) for x in wb("export", "s1", "--db", str(db_path)).stdout.splitlines()]
    assert [x["seq"] for x in lines] == list(range(1, len(lines) + 1))
    assert {"seq", "ts", "type", "payload"} <= set(lines[0]) and lines[0]["type"] == "session_created"
    assert sum(x["type"] == "user_message" for x in lines) == 2
    show = wb("show", "s1", "--db", str(db_path))
    assert show.returncode == 0 and "── you" in show.stdout and "▸ python" in show.stdout and '{"' not in show.stdout
    events = wb("show", "s1", "--events", "--db", str(db_path))
    assert events.returncode == 0 and "user_message" in events.stdout and "→ python" in events.stdout


@pytest.mark.parametrize("sandbox", [True, False])
def test_demo_runs_offline(tmp_path, sandbox):
    env = cli_env() if sandbox else cli_env(WORKBENCH_BWRAP=str(tmp_path / "no-bwrap-here"))
    p = wb("demo", "--db", str(tmp_path / "demo.duckdb"), env=env)
    assert p.returncode == 0, p.stderr
    assert "week 4 was the warmest" in p.stdout and "weekly means" in p.stdout
    assert "The turn ended (end_turn)" in p.stdout
    if sandbox:
        assert "[hands: sandbox kernel" in p.stdout
    else:  # the demo's own fixed code may run unsandboxed, and it says so
        assert "no sandbox on this machine" in p.stdout and "[hands: local kernel" in p.stdout


@pytest.fixture(scope="module")
def first_turn(tmp_path_factory) -> Path:
    """A database whose session s1 ran one turn, written once by `workbench run` for the bad-input cases."""
    path = tmp_path_factory.mktemp("first-turn") / "log.duckdb"
    p = wb("run", "first", "--session", "s1", "--db", str(path))
    assert p.returncode == 0, p.stderr
    return path


@pytest.mark.parametrize(
    "args, message",
    [
        (["resume", "nope"], "no session 'nope'"),
        (["show", "nope"], "no session 'nope'"),
        (["export", "nope"], "no session 'nope'"),
        (["run", "hi", "--model", "gpt-17"], "unknown model 'gpt-17'"),
        (["run", "hi", "--model", "scripted:nope"], "no scripted model script 'nope'"),
        (["run", "hi", "--model", "claude-opus-5-5"], "needs ANTHROPIC_API_KEY"),
        (["run", "   "], "the prompt is empty"),
        (["run", "hi", "--session", "s1", "--model", "scripted:demo"], "cannot change"),
    ],
)
def test_bad_input_gets_one_clear_line_and_writes_nothing(db_path, first_turn, args, message):
    shutil.copy(first_turn, db_path)  # each case on its own copy
    before = snapshot(db_path)
    p = wb(*args, "--db", str(db_path))
    assert p.returncode == 2
    assert p.stderr.startswith("workbench: error: ") and message in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert snapshot(db_path) == before


def test_with_a_key_run_refuses_a_model_that_does_not_exist_naming_those_that_do(db_path, fake_api):
    """`workbench run --model` checks the name against the key's Models API before anything is written, and
    `workbench models` offers what the key can use (issue 25, item 7)."""
    fake_api.use({"claude-opus-5-5": [Reply(text="opus here")], "claude-haiku-5-5": "default"})
    env = cli_env(ANTHROPIC_API_KEY="sk-test", ANTHROPIC_BASE_URL=fake_api.url)
    p = wb("run", "hi", "--model", "claude-opus-5", "--db", str(db_path), env=env)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert p.stderr.strip() == ("workbench: error: model 'claude-opus-5' does not exist for this key; it can use: "
                                "claude-haiku-5-5, claude-opus-5-5"), p.stderr
    assert not db_path.exists() or snapshot(db_path) == []
    assert fake_api.requests == [], "no model call for a name that does not exist"
    p = wb("run", "hi", "--db", str(db_path), env=env)  # the default, claude-opus-5-5, exists
    assert p.returncode == 0 and "opus here" in p.stdout, p.stderr
    p = wb("models", "--db", str(db_path), env=env)
    assert p.returncode == 0 and "claude-haiku-5-5" in p.stdout, p.stdout


def test_unreadable_missing_and_locked_databases(tmp_path, db_path):
    garbage = tmp_path / "garbage.duckdb"
    garbage.write_bytes(b"\x00not duckdb" * 1000)
    for args in (["sessions"], ["run", "hi"]):
        p = wb(*args, "--db", str(garbage))
        assert p.returncode == 2 and "cannot open" in p.stderr and len(p.stderr.splitlines()) == 1
    assert garbage.read_bytes() == b"\x00not duckdb" * 1000
    p = wb("sessions", "--db", str(tmp_path / "missing.duckdb"))
    assert p.returncode == 2 and "no workbench database" in p.stderr
    assert not (tmp_path / "missing.duckdb").exists()

    assert wb("run", "first", "--session", "s1", "--db", str(db_path)).returncode == 0
    before = snapshot(db_path)
    with DuckDBLog(db_path):  # this process now holds the file, like a Jupyter server would
        for args in (["sessions"], ["run", "more", "--session", "s1"], ["resume", "s1"], ["review"]):
            p = wb(*args, "--db", str(db_path))
            assert p.returncode == 2 and "in use by another process" in p.stderr, p.stderr
        # the review panel's command says so before it imports Panel (1.7 s of CPU on a 2-core machine)
        code = ("import sys\nfrom workbench.cli.main import main\n"
                f"assert main(['review', '--db', {str(db_path)!r}]) == 2\n"
                "assert 'panel' not in sys.modules, 'Panel was imported'\n")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=cli_env())
        assert p.returncode == 0 and "in use by another process" in p.stderr, p.stderr
    assert snapshot(db_path) == before


def _kill_tree(proc: subprocess.Popen) -> list[psutil.Process]:
    kids = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    return kids


def _reap(kids: list[psutil.Process]) -> None:
    """The kernel of a killed CLI exits on its own (it polls its parent); make sure."""
    gone, alive = psutil.wait_procs(kids, timeout=10)
    for p in alive:
        p.kill()
    assert not alive, f"kernels outlived their host: {alive}"


def _check_no_loss(db_path, sid: str) -> list:
    with DuckDBLog(db_path, read_only=True) as log:
        events = log.events(sid)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert sum(e.type == "user_message" for e in events) == 1
    uses = [b["id"] for e in events if e.type == "assistant_turn" for b in e.payload["message"]["content"] if b["type"] == "tool_use"]
    answered = [e.payload["tool_use_id"] for e in events if e.type == "tool_result"]
    assert sorted(uses) == sorted(answered)  # every call answered exactly once
    ends = [e for e in events if e.type == "turn_ended"]
    assert len(ends) == 1 and ends[0].payload["stop_reason"] == "end_turn"
    assert all(e.type.startswith("hands_") for e in events[events.index(ends[0]) + 1 :])
    return events


def test_sigkill_while_waiting_for_the_model_then_resume(db_path, fake_api):
    fake_api.use([Reply(thinking="", code=["print('tool ran')"]), Reply(thinking="", text="all done")])
    env = cli_env(ANTHROPIC_API_KEY="sk-test", ANTHROPIC_BASE_URL=fake_api.url)
    fake_api.delay = 60
    proc = subprocess.Popen(
        [*WORKBENCH, "run", "do it", "--session", "k1", "--model", "claude-opus-5-5", "--db", str(db_path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not fake_api.requests and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fake_api.requests, "the CLI never called the model"
    _reap(_kill_tree(proc))
    fake_api.delay = 0
    p = wb("resume", "k1", "--db", str(db_path), env=env)
    assert p.returncode == 0, p.stderr
    assert "all done" in p.stdout
    events = _check_no_loss(db_path, "k1")
    kinds = [e.type for e in events]
    assert kinds.count("model_request") == 3  # the one cut off, then two after resume
    assert kinds.count("assistant_turn") == 2 and kinds.count("resumed") == 1
    assert fake_api.rejections == []
    assert wb("resume", "k1", "--db", str(db_path), env=env).stderr.startswith("nothing to resume")


def test_sigkill_during_a_tool_call_is_never_rerun(db_path, tmp_path, fake_api):
    marker = tmp_path / "started"
    code = f"open({str(marker)!r}, 'a').write('x')\nimport time\ntime.sleep(120)"
    fake_api.use([Reply(code=[code]), Reply(text="I see the call was interrupted.")])
    # local hands: the kernel writes a marker into this test's directory, which a sandbox does not mount
    env = cli_env(ANTHROPIC_API_KEY="sk-test", ANTHROPIC_BASE_URL=fake_api.url, WORKBENCH_HANDS_BACKEND="local")
    proc = subprocess.Popen(
        [*WORKBENCH, "run", "long job", "--session", "k2", "--model", "claude-opus-5-5", "--db", str(db_path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the tool call never started"
    _reap(_kill_tree(proc))
    p = wb("resume", "k2", "--db", str(db_path), env=env)
    assert p.returncode == 0, p.stderr
    assert marker.read_text() == "x"  # not re-run
    events = _check_no_loss(db_path, "k2")
    result = next(e.payload for e in events if e.type == "tool_result")
    assert result["is_error"] and "interrupted; state unknown" in result["content"][0]["text"]
    # the model saw that result, and accepted the history
    assert "interrupted; state unknown" in json.dumps(fake_api.requests[-1]["messages"][-1])
    assert fake_api.rejections == []


def test_help_lists_every_command():
    p = wb("--help")
    for cmd in ("run", "resume", "sessions", "show", "export", "demo"):
        assert cmd in p.stdout
    assert os.path.basename(WORKBENCH[-1]) == "workbench.cli"


@pytest.mark.parametrize("env", [{}, {"WORKBENCH_HANDS_POOL_REFILL": "true"}])
def test_run_and_resume_fill_their_warm_pool_once(tmp_path, monkeypatch, env):
    """A `run` ends with its turn: the kernel its pool would start in the place of the one taken was stopped unused
    (a whole sandboxed start). Its pool fills once unless WORKBENCH_HANDS_POOL_REFILL says otherwise."""
    import argparse

    from workbench.cli.commands import _one_turn_host
    from workbench.cli.console import Console
    from workbench.host import load_plugins

    monkeypatch.delenv("WORKBENCH_HANDS_POOL_REFILL", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    host = _one_turn_host(argparse.Namespace(db=str(tmp_path / "wb.duckdb")), Console(load_plugins()))
    try:
        assert host.hands is not None and host.hands.pool is not None
        assert host.hands.pool.refill is bool(env) and host.hands.pool.size == 1
    finally:
        host.log.close()


@pytest.mark.parametrize("value", ["maybe", "", "nan", "1e999", "\udcff", "true" * 10_000])
def test_a_nonsense_pool_refill_is_one_clear_error(tmp_path, monkeypatch, value):
    import argparse

    from workbench.cli.commands import _one_turn_host
    from workbench.cli.console import Console
    from workbench.errors import ConfigError
    from workbench.host import load_plugins

    monkeypatch.setenv("WORKBENCH_HANDS_POOL_REFILL", value)
    with pytest.raises(ConfigError, match="WORKBENCH_HANDS_POOL_REFILL"):
        _one_turn_host(argparse.Namespace(db=str(tmp_path / "wb.duckdb")), Console(load_plugins()))
    assert not (tmp_path / "wb.duckdb").exists()  # refused before the file was made
