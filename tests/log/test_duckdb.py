"""What only the DuckDB file has: reopening, locks, unreadable files, raw SQL, old rows, confinement.

Behaviour every log shares is in test_conformance.py; `/query` is in test_query.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import duckdb
import pytest

from workbench.errors import DatabaseLocked, DatabaseMissing, DatabaseUnreadable
from workbench.log import DuckDBLog


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
    with DuckDBLog(db_path, read_only=True) as ro:
        assert ro.session("s1")["last_seq"] == 7


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


def test_rows_written_with_raw_sql_do_not_break_the_next_append(log):
    new(log)
    log.append("s1", "user_message", {"text": "cached"})
    log.write(lambda tx: tx.execute(
        "INSERT INTO events VALUES ('s1', 3, now()::TIMESTAMP, 'turn_ended', '{\"stop_reason\": \"end_turn\"}')")).result()
    assert log.append("s1", "user_message", {"text": "next"}).seq == 4


def test_raw_rows_earlier_in_the_same_transaction_count_too(log):
    new(log)
    log.append("s1", "user_message", {"text": "cached"})

    def fn(tx):
        tx.execute("INSERT INTO events VALUES ('s1', 3, now()::TIMESTAMP, 'turn_ended', '{}')")
        return tx.append("s1", "user_message", {"text": "after raw"}).seq

    assert log.write(fn).result() == 4


def test_tx_events_sees_raw_rows_of_its_own_transaction(log):
    new(log)

    def fn(tx):
        tx.execute("INSERT INTO events VALUES ('s1', 2, now()::TIMESTAMP, 'user_message', '{\"text\": \"raw\"}')")
        return [e.payload for e in tx.events("s1", after=1)]

    assert log.write(fn).result() == [{"text": "raw"}]


OLD_ROWS = {
    # what json.dumps wrote before payloads were checked: 1e309 in a session config became Infinity
    "infinity": (json.dumps({"config": {"budget": float("1e309")}}), {"config": {"budget": None}}),
    "nan": ('{"x": NaN, "y": [-Infinity, 1.5]}', {"x": None, "y": [None, 1.5]}),
    "overflowing literal": ('{"x": 1e309, "y": -1e400}', {"x": None, "y": None}),
    "not an object": ("[1, 2]", {"unreadable": "[1, 2]"}),
    "a string": ('"text"', {"unreadable": '"text"'}),
    "deeper than any parser": ('{"a": ' * 5000 + "1" + "}" * 5000, {"unreadable": '{"a": ' * 5000 + "1" + "}" * 5000}),
}


@pytest.mark.parametrize("name", list(OLD_ROWS))
def test_old_rows_are_read_leniently(db_path, name):
    raw, expected = OLD_ROWS[name]
    with DuckDBLog(db_path) as log:
        new(log)
        log.write(lambda tx: tx.execute(
            "INSERT INTO events VALUES ('s1', 2, now()::TIMESTAMP, 'user_message', ?)", [raw])).result()
        assert log.events("s1")[1].payload == expected
        assert log.write(lambda tx: tx.events("s1")[1].payload).result() == expected
        assert log.session("s1")["last_seq"] == 2
        assert log.append("s1", "user_message", {"text": "and on"}).seq == 3
    with DuckDBLog(db_path, read_only=True) as ro:
        assert ro.events("s1", types=["user_message"])[0].payload == expected


def test_the_database_reaches_no_other_file(log, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("password=hunter2\n")
    new(log)
    cur = log.cursor()
    try:
        for sql in ("SELECT content FROM read_text(?)", "SELECT * FROM read_csv(?)", "SELECT * FROM glob(?)"):
            with pytest.raises(duckdb.PermissionException):
                cur.execute(sql, [str(secret)]).fetchall()
        with pytest.raises(duckdb.Error, match="locked"):
            cur.execute("SET enable_external_access = true")
        with pytest.raises(duckdb.Error, match="locked"):
            cur.execute("SET lock_configuration = false")
        assert cur.execute("SELECT current_setting('enable_progress_bar')").fetchone() == (False,)
    finally:
        cur.close()
    with pytest.raises(duckdb.PermissionException):
        log.write(lambda tx: tx.execute(f"COPY events TO '{tmp_path / 'out.csv'}'")).result()
    with pytest.raises(duckdb.PermissionException):
        log.write(lambda tx: tx.execute(f"ATTACH '{tmp_path / 'other.duckdb'}' AS other")).result()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("log.duckdb")) == ["secret.txt"]
    # while the log itself still does all it needs: JSON columns, its own tables, checkpoints
    log.append("s1", "assistant_turn", {"message": {"content": [{"type": "text", "text": "hi"}]}})
    log.write(lambda tx: tx.execute("CREATE TABLE IF NOT EXISTS extra (id VARCHAR, doc JSON)")).result()
    log.write(lambda tx: tx.execute("CHECKPOINT")).result()
    cur = log.cursor()
    try:
        assert cur.execute("SELECT payload->>'$.message.content[0].text' FROM events WHERE seq = 2").fetchall() == [("hi",)]
    finally:
        cur.close()


def test_a_second_log_of_this_process_is_confined_too(db_path):
    with DuckDBLog(db_path) as log:
        new(log)
        with DuckDBLog(db_path) as again:  # DuckDB shares the database within a process
            assert again.session("s1")["last_seq"] == 1
            cur = again.cursor()
            try:
                with pytest.raises(duckdb.PermissionException):
                    cur.execute("SELECT * FROM glob('*')").fetchall()
            finally:
                cur.close()


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
    other = tmp_path / "other.duckdb"
    duckdb.connect(str(other)).close()
    with pytest.raises(DatabaseUnreadable, match="not a workbench log"):
        DuckDBLog(other, read_only=True)


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
