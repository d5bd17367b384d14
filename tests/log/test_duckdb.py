"""What only the DuckDB file has: reopening, locks, unreadable files, raw SQL, old rows, confinement.

Behaviour every log shares is in test_conformance.py; `/query` is in test_query.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

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


# -- group commit: durability per caller --------------------------------------------------------

APPENDER = """
import sys, threading
from workbench.log import DuckDBLog
log = DuckDBLog(sys.argv[1])
for k in range(20):
    log.create_session(f"s{k}", title=None, model="m", payload={})
out = threading.Lock()
def run(k):
    i = 0
    while True:
        e = log.append(f"s{k}", "user_message", {"text": "x" * (i % 300), "i": i})
        with out:  # printed only after append returned: the event is durable by then
            sys.stdout.write(f"{e.session_id} {e.seq} {i}\\n")
            sys.stdout.flush()
        i += 1
for k in range(20):
    threading.Thread(target=run, args=(k,), daemon=True).start()
threading.Event().wait()
"""


def test_every_append_that_returned_survives_a_sigkill(db_path):
    """20 threads append at once (so their writes are grouped); the process is SIGKILLed mid-stream;
    every append that had returned is in the file, with its payload, and the summary agrees."""
    proc = subprocess.Popen([sys.executable, "-c", APPENDER, str(db_path)], stdout=subprocess.PIPE, text=True)
    returned = []
    try:
        deadline = time.monotonic() + 120
        while len(returned) < 600 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            returned.append(line.split())
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
        proc.stdout.close()
    assert len(returned) >= 600, f"the appender printed only {len(returned)} lines"
    with DuckDBLog(db_path) as log:
        stored = {(e.session_id, e.seq): e.payload["i"] for r in log.sessions() for e in log.events(r["id"]) if e.seq > 1}
        for sid, seq, i in returned:
            assert stored.get((sid, int(seq))) == int(i), f"{sid} {seq} returned but is not in the file"
        for r in log.sessions():
            assert r["events"] == r["last_seq"] == len(log.events(r["id"]))


# -- the sessions summary ----------------------------------------------------------------------------


def summary_from_events(path) -> list[tuple]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(
            "SELECT s.id, count(e.seq), coalesce(max(e.seq), 0), arg_max(e.type, e.seq) "
            "FROM sessions s LEFT JOIN events e ON e.session_id = s.id GROUP BY s.id ORDER BY s.id").fetchall()
    finally:
        con.close()


def test_rows_written_with_raw_sql_reach_the_summary(db_path):
    with DuckDBLog(db_path) as log:
        new(log)
        new(log, "s2")
        log.write(lambda tx: tx.execute(
            "INSERT INTO events VALUES ('s1', 2, now()::TIMESTAMP, 'user_message', '{}'), "
            "('s2', 2, now()::TIMESTAMP, 'turn_ended', '{}')")).result()
        assert [(r["id"], r["events"], r["last_type"], r["state"]) for r in log.sessions()] == [
            ("s1", 2, "user_message", "unfinished"), ("s2", 2, "turn_ended", "ended")]
        log.write(lambda tx: tx.execute("CREATE TABLE other (x INTEGER)")).result()  # names no events: nothing to check
        assert log.append("s1", "turn_ended", {}).seq == 3
        rows = [(r["id"], r["events"], r["last_seq"], r["last_type"]) for r in log.sessions()]
    assert rows == summary_from_events(db_path)


def _old_database(path) -> None:
    """A database as the workbench wrote it before the summary: no session_summary table, no summary_version."""
    with DuckDBLog(path) as log:
        new(log, "a")
        new(log, "b")
        log.append("a", "user_message", {"text": "q"})
        log.append("b", "user_message", {"text": "q"})
        log.append("b", "turn_ended", {"stop_reason": "end_turn"})
        expected = log.sessions()
    con = duckdb.connect(str(path))
    con.execute("DROP TABLE session_summary")
    con.execute("DELETE FROM meta WHERE key = 'summary_version'")
    con.close()
    return expected


def test_an_old_database_gets_its_summary_built_from_the_events(db_path):
    expected = _old_database(db_path)
    with DuckDBLog(db_path, read_only=True) as ro:  # read-only: listed from the events, nothing written
        assert ro.sessions() == expected
        assert [r["id"] for r in ro.sessions_page(limit=1, state="ended")["sessions"]] == ["b"]
    with DuckDBLog(db_path) as log:
        assert log.sessions() == expected
        assert log.append("a", "turn_ended", {"stop_reason": "end_turn"}).seq == 3
        assert log.session("a")["state"] == "ended"
    rows = summary_from_events(db_path)
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        assert con.execute("SELECT session_id, events, last_seq, last_type FROM session_summary ORDER BY 1").fetchall() == rows
        assert con.execute("SELECT value FROM meta WHERE key = 'summary_version'").fetchall() == [("1",)]
    finally:
        con.close()


def _copies(path, text: str) -> int:
    """How many times text is in the bytes of the database file and its write-ahead log."""
    return sum(p.read_bytes().count(text.encode()) for p in (path, path.with_name(path.name + ".wal")) if p.exists())


def test_after_a_scrub_and_compact_no_byte_of_the_text_is_left_in_the_file(db_path):
    secret = "ghp_C0mpactMe5ecretT0ken0123456789abcdef"
    log = DuckDBLog(db_path)
    os.chmod(db_path, 0o600)
    for i in range(40):  # enough rows that the old ones sit in blocks of their own
        log.create_session(f"s{i}", title="t", model="m", payload={"system": f"prompt {i} with {secret}" + " pad" * i})
    log._writer.submit(lambda: log._con.execute("CHECKPOINT")).result()
    assert _copies(db_path, secret) > 0  # the test can fail: the text is in the file's bytes before

    assert len(log.write(lambda tx: tx.scrub([secret], "[redacted]")).result()) == 40
    log._writer.submit(lambda: log._con.execute("CHECKPOINT")).result()
    # a CHECKPOINT alone leaves the old bytes in free blocks of the file
    assert _copies(db_path, secret) > 0

    reads: list[int] = []
    stop = threading.Event()

    def reader():  # reads go on while the file is replaced: they wait, they do not fail
        while not stop.is_set():
            reads.append(len(log.sessions()) + len(log.events("s3")))

    t = threading.Thread(target=reader)
    t.start()
    try:
        log.compact()
    finally:
        stop.set()
        t.join()
    assert _copies(db_path, secret) == 0 and reads and set(reads) == {41}
    assert oct(os.stat(db_path).st_mode & 0o777) == oct(0o600)
    assert log.events("s39")[0].payload["system"].endswith("[redacted]" + " pad" * 39)
    assert log.append("s1", "user_message", {"text": "after"}).seq == 2
    log.close()
    assert _copies(db_path, secret) == 0
    with DuckDBLog(db_path, read_only=True) as again:
        assert len(again.sessions()) == 40 and again.events("s1")[-1].payload == {"text": "after"}


def test_a_read_whose_connection_compact_replaced_reads_again_and_any_other_error_is_raised(log):
    """compact() closes the connection a reader's cursor came from: DuckDB raises ConnectionException or, when the
    query had begun, InvalidInputException ("No open result set"; a CI run's reader thread died of it). Either is
    read again, once, on the new connection; the same error without a compact is the caller's."""
    calls = []

    def swapped_under(cur):
        calls.append(cur)
        if len(calls) == 1:
            log._generation += 1  # compact() replaced the connection while this query ran
            raise duckdb.InvalidInputException("Invalid Input Error: No open result set")
        return cur.execute("SELECT count(*) FROM sessions").fetchall()

    assert log._reading(swapped_under) == [(0,)] and len(calls) == 2

    def broken(cur):
        raise duckdb.InvalidInputException("Invalid Input Error: something else")

    with pytest.raises(duckdb.InvalidInputException, match="something else"):
        log._reading(broken)


def test_scrub_reaches_rows_an_older_version_wrote_with_ascii_escapes(log):
    new(log, "old")
    text = "geheimnis-ünï-0042"
    log.write(lambda tx: tx.execute("INSERT INTO events VALUES ('old', 2, now(), 'user_message', ?)",
                                    [json.dumps({"text": f"the {text} here"})])).result()
    assert "\\u00fc" in log.query("SELECT payload::VARCHAR FROM events WHERE seq = 2").rows[0][0]
    assert log.write(lambda tx: tx.scrub([text], "[redacted]")).result() == {"old": [2]}
    assert log.events("old")[1].payload == {"text": "the [redacted] here"}


def test_compact_beside_another_log_of_the_process_says_what_to_do_and_keeps_working(db_path):
    with DuckDBLog(db_path) as log:
        new(log)
        with DuckDBLog(db_path) as other:  # DuckDB shares the database within a process
            with pytest.raises(DatabaseLocked, match="could not be rewritten"):
                log.compact()
            assert other.session("s1")["last_seq"] == 1
        assert log.append("s1", "user_message", {"text": "after"}).seq == 2
        log.compact()  # alone again: it works
        assert [e.seq for e in log.events("s1")] == [1, 2]


# -- the summary, kept in memory and written lazily ---------------------------------------------------------


def _file_summary(path_or_log, sid: str) -> tuple:
    """(events, last_seq, last_type) of a session as the file's session_summary table holds it."""
    if isinstance(path_or_log, DuckDBLog):
        return path_or_log.cursor().execute(
            "SELECT events, last_seq, last_type FROM session_summary WHERE session_id = ?", [sid]).fetchone()
    con = duckdb.connect(str(path_or_log), read_only=True)
    try:
        return con.execute("SELECT events, last_seq, last_type FROM session_summary WHERE session_id = ?", [sid]).fetchone()
    finally:
        con.close()


def test_a_commit_does_not_write_the_summary_yet_every_reader_sees_it(db_path):
    """No summary UPDATE per transaction: the writer keeps the change in memory, readers add it, a read that
    filters or sorts by it has it written first, and close writes the rest and marks the file clean."""
    with DuckDBLog(db_path) as log:
        new(log)
        for i in range(3):
            log.append("s1", "user_message", {"text": f"m{i}"})
        assert _file_summary(log, "s1") == (0, 0, None)  # the file's row as created
        row = log.session("s1")
        assert (row["events"], row["last_seq"], row["last_type"], row["state"]) == (4, 4, "user_message", "unfinished")
        assert log.sessions() == [row]
        assert [r["id"] for r in log.sessions_page(limit=5, state="unfinished")["sessions"]] == ["s1"]  # written first
        assert _file_summary(log, "s1") == (4, 4, "user_message")
        log.append("s1", "turn_ended", {"stop_reason": "end_turn"})
        assert log.session("s1")["state"] == "ended" and log.session("s1")["events"] == 5
    assert _file_summary(db_path, "s1") == (5, 5, "turn_ended")
    con = duckdb.connect(str(db_path), read_only=True)
    assert con.execute("SELECT value FROM meta WHERE key = 'summary_clean'").fetchall() == [("1",)]
    con.close()


def test_a_row_read_after_a_commit_is_visible_counts_it_even_while_the_writer_is_still_keeping_it(db_path, monkeypatch):
    """The window between a commit and the writer keeping its change in memory: a reader that already read the
    committed events (a stream's backlog) and then the session's row must not get a row from before them (a
    CI run under load read `unfinished` after streaming turn_ended). Such a read waits for the writer."""
    with DuckDBLog(db_path) as log:
        new(log)
        inside, go_on = threading.Event(), threading.Event()
        keep = log._keep

        def slow_keep(deltas, removed):  # the writer thread, descheduled between the commit and keeping it
            inside.set()
            go_on.wait(30)
            keep(deltas, removed)

        monkeypatch.setattr(log, "_keep", slow_keep)
        writing = threading.Thread(target=log.append, args=("s1", "turn_ended", {"stop_reason": "end_turn"}))
        writing.start()
        assert inside.wait(30)
        assert [e.type for e in log.events("s1")][-1] == "turn_ended"  # committed: a stream's backlog has it
        rows: list[dict] = []
        reading = threading.Thread(target=lambda: rows.append(log.session("s1")))
        reading.start()
        reading.join(0.5)  # a read that does not wait answers at once, from before the commit
        go_on.set()
        reading.join(30)
        writing.join(30)
        assert (rows[0]["events"], rows[0]["last_type"], rows[0]["state"]) == (2, "turn_ended", "ended")


def test_a_writer_that_dies_leaves_a_summary_the_next_open_rebuilds(db_path):
    script = (
        "import os, sys\n"
        "from workbench.log import DuckDBLog\n"
        "log = DuckDBLog(sys.argv[1])\n"
        "for s in ('a', 'b'):\n"
        "    log.create_session(s, title=None, model='m', payload={})\n"
        "for i in range(4):\n"
        "    log.append('a', 'user_message', {'text': str(i)})\n"
        "log.append('b', 'turn_ended', {'stop_reason': 'end_turn'})\n"
        "os._exit(0)  # no close: what was kept in memory is lost\n")
    subprocess.run([sys.executable, "-c", script, str(db_path)], check=True, timeout=120)
    con = duckdb.connect(str(db_path))
    assert con.execute("SELECT value FROM meta WHERE key = 'summary_clean'").fetchall() == [("0",)]
    con.close()
    with DuckDBLog(db_path, read_only=True) as ro:  # a reader cannot rebuild it: it lists from the events
        assert [(r["id"], r["events"], r["state"]) for r in ro.sessions()] == [("a", 5, "unfinished"), ("b", 2, "ended")]
    with DuckDBLog(db_path) as log:
        assert [(r["id"], r["events"], r["last_type"], r["state"]) for r in log.sessions()] == [
            ("a", 5, "user_message", "unfinished"), ("b", 2, "turn_ended", "ended")]
        assert _file_summary(log, "a") == (5, 5, "user_message")
    assert summary_from_events(db_path) == [("a", 5, 5, "user_message"), ("b", 2, 2, "turn_ended")]


# The schema as the workbench wrote it before the parent column (and before the summary was written lazily)
PREVIOUS_SCHEMA = """
CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL);
CREATE TABLE sessions (id VARCHAR PRIMARY KEY, created_at TIMESTAMP NOT NULL, title VARCHAR, model VARCHAR,
                       kind VARCHAR NOT NULL, archived BOOLEAN NOT NULL DEFAULT false);
CREATE TABLE session_summary (session_id VARCHAR PRIMARY KEY, events BIGINT NOT NULL, last_seq BIGINT NOT NULL,
                              last_type VARCHAR, updated_at TIMESTAMP NOT NULL, turn_mark VARCHAR);
CREATE TABLE events (session_id VARCHAR NOT NULL, seq BIGINT NOT NULL, ts TIMESTAMP NOT NULL, type VARCHAR NOT NULL,
                     payload JSON NOT NULL, PRIMARY KEY (session_id, seq));
INSERT INTO meta VALUES ('schema_version', '1'), ('summary_version', '1');
INSERT INTO sessions VALUES ('p', TIMESTAMP '2026-01-01 10:00:00', 'parent', 'm', 'chat', false),
                            ('c', TIMESTAMP '2026-01-01 10:00:05', NULL, 'm', 'chat', false),
                            ('odd', TIMESTAMP '2026-01-01 10:00:09', NULL, 'm', 'chat', false);
INSERT INTO events VALUES
  ('p', 1, TIMESTAMP '2026-01-01 10:00:00', 'session_created', '{"model": "m"}'),
  ('p', 2, TIMESTAMP '2026-01-01 10:00:01', 'user_message', '{"text": "go"}'),
  ('c', 1, TIMESTAMP '2026-01-01 10:00:05', 'session_created', '{"model": "m", "parent_id": "p"}'),
  ('odd', 1, TIMESTAMP '2026-01-01 10:00:09', 'session_created', '{"model": "m", "parent_id": 7}');
INSERT INTO session_summary VALUES ('p', 2, 2, 'user_message', TIMESTAMP '2026-01-01 10:00:01', 'user_message'),
                                   ('c', 1, 1, 'session_created', TIMESTAMP '2026-01-01 10:00:05', NULL),
                                   ('odd', 1, 1, 'session_created', TIMESTAMP '2026-01-01 10:00:09', NULL);
"""


def test_a_file_of_the_previous_version_gets_its_parent_column_filled(db_path):
    con = duckdb.connect(str(db_path))
    con.execute(PREVIOUS_SCHEMA)
    con.close()
    with DuckDBLog(db_path, read_only=True) as ro:  # read-only: the parents come from the events, nothing is written
        assert {r["id"]: r["parent_id"] for r in ro.sessions()} == {"p": None, "c": "p", "odd": None}
    with DuckDBLog(db_path) as log:
        assert {r["id"]: r["parent_id"] for r in log.sessions()} == {"p": None, "c": "p", "odd": None}
        assert log.session("c")["parent_id"] == "p" and log.session("p")["state"] == "unfinished"
        log.create_session("c2", title=None, model="m", payload={"parent_id": "p"})
        assert log.sessions_page(limit=1, order="-created")["sessions"][0]["parent_id"] == "p"
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        assert con.execute("SELECT id, parent_id FROM sessions ORDER BY id").fetchall() == [
            ("c", "p"), ("c2", "p"), ("odd", None), ("p", None)]
    finally:
        con.close()
