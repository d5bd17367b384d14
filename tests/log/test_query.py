"""`DuckDBLog.query` (behind `POST /query`): exactly one SELECT, read-only, confined, bounded.

Every attack here took effect before: it either wrote to the append-only log,
reached a file outside it, or held a server thread. After each one the log must
be exactly as it was, and still work.
"""

from __future__ import annotations

import threading

import pytest

from workbench.errors import QueryRefused
from workbench.log import DuckDBLog, LogSettings, QueryResult


def new(log: DuckDBLog, sid: str = "s1") -> None:
    log.create_session(sid, title="t", model="scripted", payload={"system": "x"})


def state(log: DuckDBLog) -> tuple:
    """The whole database as a reader sees it: every table and view, every row of the log."""
    cur = log.cursor()
    try:
        tables = cur.execute("SELECT database_name, schema_name, table_name FROM duckdb_tables() ORDER BY ALL").fetchall()
        views = cur.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY ALL").fetchall()
        dbs = cur.execute("SELECT database_name FROM duckdb_databases() ORDER BY ALL").fetchall()
        events = cur.execute("SELECT session_id, seq, type, payload FROM events ORDER BY ALL").fetchall()
        sessions = cur.execute("SELECT * FROM sessions ORDER BY ALL").fetchall()
        macros = cur.execute("SELECT function_name FROM duckdb_functions() WHERE NOT internal ORDER BY ALL").fetchall()
        return tables, views, dbs, events, sessions, macros
    finally:
        cur.close()


@pytest.fixture
def qlog(tmp_path):
    """A log with a session, a secret file beside it, and the state to compare against."""
    log = DuckDBLog(tmp_path / "log.duckdb")
    new(log)
    log.append("s1", "user_message", {"text": "hello"})
    log.write(lambda tx: tx.execute("CREATE SEQUENCE IF NOT EXISTS counter")).result()
    secret = tmp_path / "secret.txt"
    secret.write_text("password,hunter2\n")
    log.before = state(log)
    log.secret = secret
    yield log
    log.close()


def unchanged(log: DuckDBLog, tmp_path) -> None:
    assert state(log) == log.before
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("log.duckdb")) == ["secret.txt"]
    assert log.append("s1", "turn_ended", {"stop_reason": "end_turn"}).seq == 3  # and the log still writes


ATTACKS = {
    "commit then create": "SELECT 1; COMMIT; CREATE TABLE pwned (a INT)",
    "commit then forge an event": "SELECT 1; COMMIT; INSERT INTO events VALUES ('s1', 3, now()::TIMESTAMP, 'user_message', '{\"text\": \"forged\"}')",
    "insert": "INSERT INTO events VALUES ('s1', 3, now()::TIMESTAMP, 'user_message', '{}')",
    "insert after a comment": "/* SELECT */ INSERT INTO events SELECT 's1', 3, now()::TIMESTAMP, 'user_message', '{}'",
    "with insert": "WITH x AS (SELECT 1) INSERT INTO events SELECT 's1', 3, now()::TIMESTAMP, 'user_message', '{}'",
    "delete": "DELETE FROM events",
    "update": "UPDATE events SET payload = '{}'",
    "drop": "DROP TABLE events",
    "copy to a file": "SELECT 1; COMMIT; COPY (SELECT * FROM events) TO '{tmp}/stolen.csv'",
    "copy alone": "COPY events TO '{tmp}/stolen.csv'",
    "export": "EXPORT DATABASE '{tmp}/export'",
    "attach": "SELECT 1; COMMIT; ATTACH '{tmp}/other.duckdb' AS other",
    "attach alone": "ATTACH '{tmp}/other.duckdb' AS other",
    "detach": "DETACH log",
    "set": "SET enable_external_access = true",
    "reset": "RESET lock_configuration",
    "pragma": "PRAGMA enable_profiling",
    "call": "CALL pragma_version()",
    "explain analyze": "EXPLAIN ANALYZE SELECT 1",
    "install": "INSTALL httpfs",
    "load": "LOAD httpfs",
    "checkpoint": "CHECKPOINT",
    "begin": "BEGIN TRANSACTION",
    "create macro": "CREATE MACRO pwned(a) AS a",
    "create view": "CREATE VIEW pwned AS SELECT 1",
    "create temp table": "CREATE TEMP TABLE pwned AS SELECT 1",
    "create secret": "CREATE SECRET s (TYPE s3, KEY_ID 'k', SECRET 'v')",
    "vacuum": "VACUUM",
    "pivot statement": "PIVOT events ON type",
    "two selects": "SELECT 1; SELECT 2",
    "nothing": "   ",
    "only a comment": "-- SELECT 1",
    "not sql": "hello there",
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_anything_but_one_select_is_refused(qlog, tmp_path, name):
    with pytest.raises(QueryRefused):
        qlog.query(ATTACKS[name].replace("{tmp}", str(tmp_path)))
    unchanged(qlog, tmp_path)


FILES = [
    "SELECT * FROM read_text('{secret}')",
    "SELECT * FROM read_csv('{secret}')",
    "FROM read_csv_auto('{secret}')",
    "SELECT * FROM read_blob('{secret}')",
    "SELECT * FROM read_json('{secret}')",
    "SELECT * FROM read_parquet('{secret}')",
    "SELECT * FROM glob('{tmp}/*')",
    "SELECT * FROM '{secret}'",
    "SELECT * FROM sniff_csv('{secret}')",
    "SELECT * FROM query('SELECT * FROM read_text(''{secret}'')')",
    "WITH f AS (SELECT content FROM read_text('{secret}')) SELECT * FROM f",
    "SELECT * FROM duckdb_extensions()",
]


@pytest.mark.parametrize("sql", FILES)
def test_no_file_outside_the_log_can_be_read(qlog, tmp_path, sql):
    with pytest.raises(QueryRefused) as e:
        qlog.query(sql.replace("{secret}", str(qlog.secret)).replace("{tmp}", str(tmp_path)))
    assert "hunter2" not in str(e.value)
    unchanged(qlog, tmp_path)


def test_a_file_name_as_a_parameter_reads_nothing_either(qlog, tmp_path):
    with pytest.raises(QueryRefused, match="disabled"):
        qlog.query("SELECT * FROM read_text(?)", [str(qlog.secret)])
    unchanged(qlog, tmp_path)


def test_a_select_that_would_write_is_stopped_by_the_read_only_transaction(qlog, tmp_path):
    with pytest.raises(QueryRefused, match="read-only"):
        qlog.query("SELECT nextval('counter')")
    unchanged(qlog, tmp_path)


ALLOWED = [
    ("SELECT count(*) AS n FROM events", ["n"], [(2,)]),
    ("FROM sessions SELECT id", ["id"], [("s1",)]),
    ("WITH t AS (SELECT type FROM events WHERE seq = 2) SELECT * FROM t", ["type"], [("user_message",)]),
    ("VALUES (1, 'a')", ["col0", "col1"], [(1, "a")]),
    ("SELECT payload->>'$.text' AS text FROM events WHERE type = 'user_message'", ["text"], [("hello",)]),
    ("SELECT * FROM query('SELECT 42 AS answer')", ["answer"], [(42,)]),
    ("  select 1 as x ;  -- and a comment", ["x"], [(1,)]),
]


@pytest.mark.parametrize("sql,columns,rows", ALLOWED)
def test_one_select_reads_the_log(qlog, tmp_path, sql, columns, rows):
    assert qlog.query(sql) == QueryResult(columns, rows, False)
    unchanged(qlog, tmp_path)


def test_describe_show_and_summarize_are_selects(qlog, tmp_path):
    cols = [r[0] for r in qlog.query("DESCRIBE events").rows]
    assert cols == ["session_id", "seq", "ts", "type", "payload"]
    assert ("events",) in qlog.query("SHOW TABLES").rows
    assert qlog.query("SUMMARIZE SELECT seq FROM events").rows
    unchanged(qlog, tmp_path)


def test_sql_errors_are_one_line(qlog, tmp_path):
    with pytest.raises(QueryRefused, match="SQL error") as e:
        qlog.query("SELECT * FROM no_such_table")
    assert "\n" not in str(e.value)
    with pytest.raises(QueryRefused, match="SQL error"):
        qlog.query("SELECT FROM WHERE (")
    with pytest.raises(QueryRefused, match="SQL error"):
        qlog.query("SELECT ?, ?", [1])  # a parameter missing
    with pytest.raises(QueryRefused, match="SQL error"):
        qlog.query("SELECT " + "(" * 5000 + "1" + ")" * 5000)
    unchanged(qlog, tmp_path)


def test_rows_are_capped_and_the_result_says_so(tmp_path):
    with DuckDBLog(tmp_path / "log.duckdb", settings=LogSettings(query_max_rows=5)) as log:
        assert log.query("SELECT * FROM range(5)") == QueryResult(["range"], [(i,) for i in range(5)], False)
        got = log.query("SELECT * FROM range(1000000000)")
        assert got.rows == [(i,) for i in range(5)] and got.truncated
        assert log.query("SELECT 1 WHERE false") == QueryResult(["1"], [], False)


def test_a_long_query_is_interrupted_and_the_writer_goes_on(tmp_path):
    with DuckDBLog(tmp_path / "log.duckdb", settings=LogSettings(query_timeout=0.5)) as log:
        new(log)
        out: list = []

        def run() -> None:
            try:
                out.append(log.query("SELECT count(*) FROM range(1000000000000) a, range(1000) b"))
            except QueryRefused as e:
                out.append(e)

        t = threading.Thread(target=run)
        t.start()
        appended = [log.append("s1", "user_message", {"text": str(i)}).seq for i in range(5)]  # meanwhile
        t.join(120)
        assert not t.is_alive()
        assert isinstance(out[0], QueryRefused) and "query_timeout" in str(out[0])
        assert appended == [2, 3, 4, 5, 6]
        assert log.query("SELECT count(*) FROM events").rows == [(6,)]  # the next query is not interrupted


def _nested_list(depth: int) -> list:
    node: list = [1]
    for _ in range(depth):
        node = [node]
    return node


BAD_PARAMS = {
    "nested 500 deep": [_nested_list(500)],
    "a list": [[1, 2]],
    "an object": [{"a": 1}],
    "bytes": [b"x"],
    "nan": [float("nan")],
    "infinity": [float("inf")],
    "int beyond 64 bits": [2**63],
    "lone surrogate": ["a\ud800"],
    "too long": ["x" * 100_001],
    "too many": [1] * 101,
    "not a list": "SELECT",
    "a dict": {"a": 1},
}


@pytest.mark.parametrize("name", list(BAD_PARAMS))
def test_params_are_json_scalars_of_bounded_size(qlog, tmp_path, name):
    params = BAD_PARAMS[name]
    sql = "SELECT " + ", ".join("?" for _ in params) if isinstance(params, list) else "SELECT ?"
    with pytest.raises(QueryRefused, match="param") as e:
        qlog.query(sql, params)
    assert len(str(e.value)) < 300
    unchanged(qlog, tmp_path)


def test_good_params(qlog):
    got = qlog.query("SELECT ?::VARCHAR, ?::BIGINT, ?::DOUBLE, ?::BOOLEAN, ?::VARCHAR", ["é\x00<", -(2**63), 1.5, True, None])
    assert got.rows == [("é\x00<", -(2**63), 1.5, True, None)]
    assert qlog.query("SELECT ?", ["x" * 100_000]).rows == [("x" * 100_000,)]
    assert qlog.query("SELECT " + ", ".join("?" for _ in range(100)), list(range(100))).rows == [tuple(range(100))]
    assert qlog.query("SELECT seq FROM events WHERE session_id = ? ORDER BY seq", ("s1",)).rows == [(1,), (2,)]


def test_hostile_sql_text(qlog, tmp_path):
    for sql, match in [("x" * 100_001, "query_max_sql_chars"), ("SELECT '\ud800'", "Unicode"), (None, "SELECT"),
                       (b"SELECT 1", "SELECT"), ("", "SELECT")]:
        with pytest.raises(QueryRefused, match=match):
            qlog.query(sql)
    assert qlog.query("SELECT '" + "x" * 99_000 + "' AS s").rows[0][0] == "x" * 99_000
    unchanged(qlog, tmp_path)
