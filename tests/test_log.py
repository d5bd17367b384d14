"""The session log: append-only, one writer, durable, readable, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import duckdb
import pytest

from workbench.errors import (
    ConfigError,
    DatabaseLocked,
    DatabaseMissing,
    DatabaseUnreadable,
    SessionExists,
    UnknownEventType,
    UnknownSession,
)
from workbench.log import DuckDBLog

VERBATIM = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-opus-5-5",
    "content": [
        {"type": "thinking", "thinking": "", "signature": "EqQBCkYIBxgCKkAs=="},
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"},
        {"type": "thinking", "thinking": "Let me check ünïcode and \"quotes\"\n", "signature": "sig2"},
        {"type": "text", "text": "Running it.", "citations": None},
        {"type": "tool_use", "id": "toolu_1", "name": "python", "input": {"code": "print(1)\n", "n": 1.5}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 20, "cache_read_input_tokens": 0},
}


def new(log: DuckDBLog, sid: str = "s1") -> None:
    log.create_session(sid, title="t", model="scripted", payload={"system": "x"})


def test_append_assigns_contiguous_seqs_and_survives_reopen(db_path):
    with DuckDBLog(db_path) as log:
        new(log)
        seqs = [log.append("s1", "user_message", {"text": f"m{i}"}).seq for i in range(5)]
        assert seqs == [2, 3, 4, 5, 6]
    with DuckDBLog(db_path) as log:
        assert log.append("s1", "user_message", {"text": "after reopen"}).seq == 7
        assert [e.seq for e in log.events("s1")] == list(range(1, 8))
        assert [e.seq for e in log.events("s1", after=5)] == [6, 7]
        assert log.events("s1")[0].type == "session_created"


def test_assistant_turn_is_stored_verbatim(log):
    new(log)
    log.append("s1", "assistant_turn", {"message": VERBATIM})
    stored = log.events("s1", types=["assistant_turn"])[0].payload["message"]
    assert json.dumps(stored) == json.dumps(VERBATIM)  # same keys, same order, same values
    # and readable with plain SQL
    cols, rows = log.query(
        "SELECT payload->>'$.message.content[0].signature' FROM events WHERE type = 'assistant_turn'"
    )
    assert rows == [("EqQBCkYIBxgCKkAs==",)]


def test_duplicate_seq_fails_loudly(log):
    new(log)
    with pytest.raises(duckdb.ConstraintException):
        log.write(
            lambda tx: tx.execute(
                "INSERT INTO events VALUES ('s1', 1, now()::TIMESTAMP, 'user_message', '{}')"
            )
        ).result()
    assert len(log.events("s1")) == 1
    # the writer still works after the failed transaction
    assert log.append("s1", "user_message", {"text": "ok"}).seq == 2


def test_subscribers_hear_only_committed_events(log):
    new(log)
    seen = []

    def on_event(ev):
        reader = log.cursor()
        (n,) = reader.execute("SELECT count(*) FROM events WHERE session_id = ? AND seq = ?", [ev.session_id, ev.seq]).fetchone()
        seen.append((ev.seq, n, threading.current_thread().name))
        reader.close()

    log.subscribe(on_event)
    log.append("s1", "user_message", {"text": "hi"})
    with pytest.raises(RuntimeError):
        log.write(lambda tx: (tx.append("s1", "user_message", {"text": "rolled back"}), (_ for _ in ()).throw(RuntimeError("boom")))).result()
    log.append("s1", "user_message", {"text": "again"})
    assert [(s, n) for s, n, _ in seen] == [(2, 1), (3, 1)]  # the rolled-back event was never announced
    assert all(name.startswith("workbench-log-writer") for *_, name in seen)


def test_unknown_type_and_session_are_refused(log):
    new(log)
    with pytest.raises(UnknownEventType):
        log.append("s1", "not_a_type", {})
    with pytest.raises(UnknownSession):
        log.append("nope", "user_message", {"text": "x"})
    with pytest.raises(SessionExists):
        new(log)
    assert len(log.events("s1")) == 1


def test_sessions_listing(log):
    new(log, "a")
    new(log, "b")
    log.append("b", "user_message", {"text": "x"})
    rows = {r["id"]: r for r in log.sessions()}
    assert rows["a"]["events"] == 1 and rows["b"]["last_seq"] == 2 and rows["b"]["last_type"] == "user_message"


def test_query_is_read_only(log):
    new(log)
    with pytest.raises(ConfigError):
        log.query("DELETE FROM events")
    with pytest.raises(ConfigError):
        log.query("SELECT * FROM no_such_table")
    assert log.query("SELECT count(*) AS n FROM events") == (["n"], [(1,)])


def test_open_errors_are_clear(tmp_path):
    bad = tmp_path / "garbage.duckdb"
    bad.write_text("this is not a database\n" * 100)
    with pytest.raises(DatabaseUnreadable, match="cannot open"):
        DuckDBLog(bad)
    assert bad.read_text().startswith("this is not a database")  # untouched
    with pytest.raises(DatabaseUnreadable, match="directory"):
        DuckDBLog(tmp_path)
    with pytest.raises(DatabaseMissing, match="no workbench database"):
        DuckDBLog(tmp_path / "missing.duckdb", read_only=True)
    assert not (tmp_path / "missing.duckdb").exists()


def test_a_second_process_gets_database_locked(db_path):
    with DuckDBLog(db_path) as log:
        new(log)
        code = (
            "import sys\nfrom workbench.log import DuckDBLog\nfrom workbench.errors import DatabaseLocked\n"
            f"try:\n    DuckDBLog({str(db_path)!r}, read_only=True)\nexcept DatabaseLocked as e:\n    print(e); sys.exit(3)\n"
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 3, proc.stderr
        assert "in use by another process" in proc.stdout and "pid" in proc.stdout
    with pytest.raises(DatabaseLocked):
        # read-only handles cannot write
        with DuckDBLog(db_path, read_only=True) as ro:
            ro.append("s1", "user_message", {"text": "x"})
