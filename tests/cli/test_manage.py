"""The `workbench` commands that manage sessions, and the CLI's manners, as real subprocesses on a file."""

from __future__ import annotations

import json
import subprocess

import pytest

from workbench.log import DuckDBLog

from wbsupport import WORKBENCH, cli_env


def wb(*args: str, env: dict | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*WORKBENCH, *args], capture_output=True, text=True, timeout=180, env=env or cli_env(),
                          input=stdin)


@pytest.fixture
def db(tmp_path):
    """A log with three finished chats, one of them with a hostile title."""
    path = tmp_path / "wb.duckdb"
    with DuckDBLog(path) as log:
        for sid, title, text in (("s1", None, "Plot the sine wave"), ("s2", "line one\nline two\x1b[31mRED\r" + "長" * 80, "hello"),
                                 ("s3", "third", "about parquet files")):
            log.create_session(sid, title=title, model="scripted", payload={"model": "scripted", "system": ""})
            log.append(sid, "user_message", {"text": text})
            log.append(sid, "assistant_turn", {"message": {"model": "scripted", "content": [
                {"type": "text", "text": f"You said: {text}"},
                {"type": "tool_use", "id": "t1", "name": "python", "input": {"code": "print('hi')\n"}}]},
                "usage": {"input_tokens": 1000, "output_tokens": 50}})
            log.append(sid, "tool_result", {"tool_use_id": "t1", "name": "python", "content": [{"type": "text", "text": "hi"}]})
            log.append(sid, "turn_ended", {"stop_reason": "end_turn"})
    return str(path)


def test_bare_workbench_lists_the_commands():
    r = wb()
    assert r.returncode == 0, r.stderr
    for name in ("run", "sessions", "show", "rename", "archive", "delete", "fork", "search", "usage", "models", "dream"):
        assert f"\n    {name} " in r.stdout or f"\n    {name}\n" in r.stdout, name
    assert "error" not in r.stderr


def test_show_is_a_readable_transcript(db):
    r = wb("show", "s1", "--db", db)
    assert r.returncode == 0, r.stderr
    assert "── you" in r.stdout and "Plot the sine wave" in r.stdout and "── agent" in r.stdout
    assert "▸ python" in r.stdout and "print('hi')" in r.stdout and "◂ output" in r.stdout
    assert "turn ended (end_turn)" in r.stdout and "usage: 1,000 tokens in, 50 out" in r.stdout
    assert '{"' not in r.stdout and "payload" not in r.stdout  # no raw JSON
    r = wb("show", "s2", "--db", db)
    assert "\x1b" not in r.stdout and "\r" not in r.stdout  # a title cannot drive the terminal


def test_sessions_table_survives_multiline_long_unicode_titles(db):
    r = wb("sessions", "--db", db)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 4, r.stdout  # a header and one line per session, whatever the titles hold
    s2 = next(line for line in lines if line.startswith("s2"))
    assert "line one line two" in s2 and "\x1b" not in s2 and "\r" not in s2 and s2.endswith("…")
    assert sum(2 if "\u4e00" <= c <= "\u9fff" else 1 for c in s2) < 250  # cut to the terminal's columns


def test_rename_archive_search_fork_delete(db):
    r = wb("rename", "s1", "Sine", "waves", "--db", db)
    assert r.returncode == 0 and "renamed session s1: Sine waves" in r.stdout, r.stderr
    assert wb("rename", "s1", "  ", "--db", db).returncode == 2
    assert wb("rename", "nope", "x", "--db", db).stderr.strip() == "workbench: error: no session 'nope'"

    assert wb("archive", "s1", "--db", db).returncode == 0
    assert "s1" not in wb("sessions", "--db", db).stdout
    assert [json.loads(x)["id"] for x in wb("sessions", "--archived", "--json", "--db", db).stdout.splitlines()] == ["s1"]
    assert len(wb("sessions", "--all", "--json", "--db", db).stdout.splitlines()) == 3
    assert wb("search", "sine", "--db", db).stderr.startswith("no session mentions")  # archived: not searched
    r = wb("search", "sine", "--archived", "--db", db)
    assert r.returncode == 0 and "s1" in r.stdout and "Sine waves" in r.stdout, r.stderr
    assert wb("unarchive", "s1", "--db", db).returncode == 0
    r = wb("search", "PARQUET", "--json", "--db", db)
    assert [json.loads(x)["id"] for x in r.stdout.splitlines()] == ["s3"]
    assert wb("search", "", "--db", db).returncode == 2
    assert wb("search", "x", "--limit", "0", "--db", db).returncode == 2

    r = wb("fork", "s1", "--seq", "3", "--new-id", "f1", "--title", "edit", "--db", db)
    assert r.returncode == 0 and "forked session s1 into f1" in r.stdout, r.stderr
    with DuckDBLog(db, read_only=True) as log:
        assert log.events("f1")[0].payload["forked_from"] == {"session_id": "s1", "seq": 1}  # cut to the boundary
    assert wb("fork", "s1", "--seq", "99", "--db", db).returncode == 2

    r = wb("delete", "s1", "--db", db, stdin="")
    assert r.returncode == 2 and "--yes" in r.stderr  # not a terminal: never a silent yes
    assert wb("show", "s1", "--db", db).returncode == 0
    r = wb("delete", "s1", "--yes", "--db", db)
    assert r.returncode == 0 and "deleted session s1 (" in r.stdout, r.stderr
    assert wb("show", "s1", "--db", db).returncode == 2
    assert wb("delete", "s1", "--yes", "--db", db).returncode == 2


def test_sessions_with_usage(db):
    r = wb("sessions", "--usage", "--db", db, env=cli_env(WORKBENCH_PRICES="scripted=3/15"))
    assert r.returncode == 0 and "tokens in/out" in r.stdout and "1,000/50" in r.stdout and "$0.0037" in r.stdout, r.stdout
    rows = [json.loads(x) for x in wb("sessions", "--usage", "--json", "--db", db).stdout.splitlines()]
    assert {x["usage"]["total"]["output_tokens"] for x in rows} == {50} and not rows[0]["usage"]["priced"]


def test_usage_and_models_and_prices(db):
    r = wb("usage", "s1", "--db", db)
    assert r.returncode == 0 and "total: 1,000 tokens in, 50 out, 1 model calls, cost unknown" in r.stdout, r.stderr
    r = wb("usage", "s1", "--json", "--db", db, env=cli_env(WORKBENCH_PRICES="scripted=3/15"))
    assert json.loads(r.stdout)["total"]["cost"] == pytest.approx(0.00375)
    r = wb("usage", "s1", "--db", db, env=cli_env(WORKBENCH_PRICES="scripted=abc"))
    assert r.returncode == 2 and "NAME=INPUT/OUTPUT" in r.stderr
    r = wb("models", "--json", "--db", db, env=cli_env(WORKBENCH_MODELS="claude-opus-5-5, scripted:demo"))
    models = [json.loads(x) for x in r.stdout.splitlines()]
    assert models[0]["default"] and [m["name"] for m in models][1:] == ["claude-opus-5-5", "scripted:demo"]
    assert "adaptive" in models[1]["thinking"] and models[2]["efforts"] == []


def test_dream_without_a_model_runs_the_offline_dreamer_and_the_plain_scripted_model_says_what_to_pass(db):
    """Offline, `workbench dream` as the README writes it dreams with scripted:dream (issue 25, a papercut: it
    stopped with an error before); asking for the plain scripted model by name says what to pass instead."""
    r = wb("dream", "--db", db, env=cli_env(ANTHROPIC_API_KEY="", WORKBENCH_MODEL=""))
    assert r.returncode == 0 and "(model scripted:dream)" in r.stdout + r.stderr, (r.stdout, r.stderr)
    r = wb("dream", "--model", "scripted", "--db", db, env=cli_env(ANTHROPIC_API_KEY="", WORKBENCH_MODEL=""))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "--model" in r.stderr and "scripted:dream" in r.stderr and "read nothing new" not in r.stdout
