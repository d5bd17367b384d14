"""The session log in one DuckDB file.

One thread (the writer) owns the write connection; every write, from any
thread or event loop, is handed to it. Readers use their own cursors. An
event is committed before any subscriber hears of it. The database is opened
with no access to any other file (no `read_csv`, `COPY`, `ATTACH`, ...), and the
configuration locked, so SQL run through the log stays inside it.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

import duckdb

from ..errors import DatabaseLocked, DatabaseMissing, DatabaseUnreadable, LogClosed, UnknownSession
from .events import EVENT_TYPES, Event
from .payload import decode_payload
from .query import QueryResult, run_query
from .settings import LogSettings
from .writer import WriterLog, WriterTx, session_row

SCHEMA_VERSION = "1"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   VARCHAR PRIMARY KEY,
    value VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    id         VARCHAR PRIMARY KEY,
    created_at TIMESTAMP NOT NULL,   -- UTC
    title      VARCHAR,
    model      VARCHAR,
    kind       VARCHAR NOT NULL      -- 'chat' or 'dream'
);
CREATE TABLE IF NOT EXISTS events (
    session_id VARCHAR NOT NULL,
    seq        BIGINT NOT NULL,      -- 1, 2, 3, ... within a session
    ts         TIMESTAMP NOT NULL,   -- UTC, when the event was committed
    type       VARCHAR NOT NULL,     -- one of docs/events.md
    payload    JSON NOT NULL,
    PRIMARY KEY (session_id, seq)
);
"""

# SQL through the log reaches nothing but the database itself, draws no progress bar on the
# server's terminal, and cannot change either: the configuration is locked before first use
CONFIG = MappingProxyType({"enable_external_access": False})
LOCK = "SET enable_progress_bar = false; SET lock_configuration = true"


def default_db_path() -> Path:
    """The database file: $WORKBENCH_DB, else workbench.duckdb in the Jupyter data dir."""
    env = os.environ.get("WORKBENCH_DB")
    if env:
        return Path(env).expanduser()
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / "workbench" / "workbench.duckdb"


def _open(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    if read_only and not path.exists():
        raise DatabaseMissing(f"no workbench database at {path} (give --db PATH or set WORKBENCH_DB)")
    if path.is_dir():
        raise DatabaseUnreadable(f"{path} is a directory, not a DuckDB database file")
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        con = duckdb.connect(str(path), read_only=read_only, config=dict(CONFIG))
    except duckdb.IOException as e:
        text = str(e)
        if "lock" in text.lower():
            holder = re.search(r"\(PID (\d+)\)", text)
            who = f" (pid {holder.group(1)})" if holder else ""
            raise DatabaseLocked(
                f"{path} is in use by another process{who}; DuckDB allows one writer. "
                "If a Jupyter server with workbench holds it, use its API or stop it first."
            ) from None
        raise DatabaseUnreadable(f"cannot open {path}: {text.splitlines()[0]}") from None
    except (duckdb.Error, OSError) as e:
        raise DatabaseUnreadable(f"cannot open {path}: {str(e).splitlines()[0]}") from None
    try:
        # another log of this process may hold the same database, already locked
        if not one_row(con, "SELECT current_setting('lock_configuration')")[0]:
            con.execute(LOCK)
    except duckdb.Error as e:
        con.close()
        raise DatabaseUnreadable(f"cannot configure {path}: {str(e).splitlines()[0]}") from None
    return con


def one_row(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> tuple[Any, ...]:
    """The row of a query that always returns exactly one (an aggregate, a setting)."""
    row = con.execute(sql, params).fetchone()
    assert row is not None, f"no row from {sql!r}"
    return row


def event_from_row(row: tuple) -> Event:
    """An `events` row (session_id, seq, ts, type, payload) as an Event: the one place rows are decoded."""
    return Event(row[0], row[1], row[2].replace(tzinfo=UTC), row[3], decode_payload(row[4]))


def select_events(con: duckdb.DuckDBPyConnection, session_id: str, after: int | None, until: int | None,
                  types: list[str] | None, limit: int | None) -> list[Event]:
    """Events of a session, read through con (a reader's cursor, or the writer inside its transaction)."""
    sql = "SELECT session_id, seq, ts, type, payload FROM events WHERE session_id = ?"
    params: list[Any] = [session_id]
    if after is not None:
        sql += " AND seq > ?"
        params.append(after)
    if until is not None:
        sql += " AND seq <= ?"
        params.append(until)
    if types is not None:
        sql += " AND type IN (SELECT unnest(?))"
        params.append(types)
    sql += " ORDER BY seq"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return [event_from_row(r) for r in con.execute(sql, params).fetchall()]


class Tx(WriterTx):
    """A DuckDB write transaction; `execute` runs SQL of its own (the memory store's tables)."""

    _log: DuckDBLog

    def __init__(self, log: DuckDBLog, con: duckdb.DuckDBPyConnection):
        super().__init__(log)
        self.con = con
        self.raw = False  # whether SQL of the caller ran: it may have written events behind the seq cache

    def execute(self, sql: str, params: Iterable[Any] = ()) -> duckdb.DuckDBPyConnection:
        """Run SQL in this transaction."""
        self.raw = True
        return self.con.execute(sql, list(params))

    def _committed_seq(self, session_id: str) -> int:
        cached = None if self.raw else self._log._seqs.get(session_id)
        if cached is not None:
            return cached
        row = one_row(
            self.con,
            "SELECT (SELECT count(*) FROM sessions WHERE id = ?), coalesce(max(seq), 0) FROM events WHERE session_id = ?",
            [session_id, session_id],
        )
        if not row[0]:
            raise UnknownSession(f"no session {session_id!r:.80}")
        return row[1]

    def _insert(self, session_id: str, seq: int, ts: datetime, type: str, data: bytes) -> None:
        self.con.execute(
            "INSERT INTO events (session_id, seq, ts, type, payload) VALUES (?, ?, ?, ?, ?)",
            [session_id, seq, ts, type, data.decode("utf-8")],
        )

    def _events(self, session_id: str, after: int | None, until: int | None, types: list[str] | None,
                limit: int | None) -> list[Event]:
        return select_events(self.con, session_id, after, until, types, limit)

    def _exists(self, session_id: str) -> bool:
        return bool(one_row(self.con, "SELECT count(*) FROM sessions WHERE id = ?", [session_id])[0])

    def _insert_session(self, session_id: str, created: datetime, title: str | None, model: str | None, kind: str) -> None:
        self.con.execute(
            "INSERT INTO sessions (id, created_at, title, model, kind) VALUES (?, ?, ?, ?, ?)",
            [session_id, created, title, model, kind],
        )


class DuckDBLog(WriterLog):
    """Append-only sessions and events in one DuckDB file, with one writer thread."""

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        *,
        read_only: bool = False,
        event_types: Mapping[str, str] = EVENT_TYPES,
        settings: LogSettings | None = None,
    ):
        super().__init__(event_types=event_types, settings=settings)
        self.path = Path(path) if path is not None else default_db_path()
        self.read_only = read_only
        self._seqs: dict[str, int] = {}  # last committed seq per session, known to the writer
        self._cursor_lock = threading.Lock()
        try:
            self._con = self._writer.submit(self._connect).result()
        except BaseException:
            self._closed = True
            self._writer.shutdown(wait=False)
            raise

    # -- lifecycle ---------------------------------------------------------

    def _connect(self) -> duckdb.DuckDBPyConnection:
        con = _open(self.path, self.read_only)
        try:
            if self.read_only:
                con.execute("SELECT count(*) FROM events").fetchone()
                return con
            con.execute(SCHEMA)
            con.execute(
                "INSERT INTO meta VALUES ('schema_version', ?) ON CONFLICT DO NOTHING", [SCHEMA_VERSION]
            )
        except duckdb.CatalogException:
            con.close()
            raise DatabaseUnreadable(f"{self.path} is a DuckDB file but not a workbench log") from None
        except duckdb.Error as e:
            con.close()
            raise DatabaseUnreadable(f"cannot use {self.path}: {str(e).splitlines()[0]}") from None
        return con

    def _release(self) -> None:
        # a reader's query may still run on a cursor of this connection ("connection is
        # busy"): give it a few seconds to finish rather than fail to close
        for attempt in range(100):
            try:
                if not self.read_only:
                    self._con.execute("CHECKPOINT")
                self._con.close()
                return
            except duckdb.Error:
                if attempt == 99:
                    raise
                time.sleep(0.05)

    def __enter__(self) -> DuckDBLog:
        return self

    # -- writing -----------------------------------------------------------

    def _begin(self) -> Tx:
        if self.read_only:
            raise DatabaseLocked(f"{self.path} was opened read-only")
        self._con.execute("BEGIN TRANSACTION")
        return Tx(self, self._con)

    def _commit(self, tx: Tx) -> None:
        self._con.execute("COMMIT")
        if tx.raw:
            self._seqs.clear()
        self._seqs.update(tx.last)

    def _rollback(self, tx: Tx) -> None:
        # the counters may have been advanced, or rows written behind them, by what failed
        self._seqs.clear()
        try:
            self._con.execute("ROLLBACK")
        except duckdb.Error:
            pass  # a failed COMMIT has already ended the transaction

    # -- reading -----------------------------------------------------------

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection of its own for reading from the calling thread."""
        with self._cursor_lock:
            if self._closed:
                raise LogClosed(f"the session log {self.path} is closed; open it again to read or write")
            return self._con.cursor()

    def _read(self, sql: str, params: list[Any]) -> list[tuple]:
        cur = self.cursor()
        try:
            return cur.execute(sql, params).fetchall()
        except duckdb.ConnectionException:
            if self._closed:  # closed while this read waited or ran: say so as the log does, not as DuckDB
                raise LogClosed(f"the session log {self.path} is closed; open it again to read or write") from None
            raise
        finally:
            cur.close()

    def _has_session(self, session_id: str) -> bool:
        return bool(self._read("SELECT count(*) FROM sessions WHERE id = ?", [session_id])[0][0])

    def _sessions(self, ids: list[str] | None, kind: str | None) -> list[dict[str, Any]]:
        where: list[str] = []
        params: list[Any] = []
        if ids is not None:
            where.append("s.id IN (SELECT unnest(?::VARCHAR[]))")
            params.append(ids)
        if kind is not None:
            where.append("s.kind = ?")
            params.append(kind)
        sql = f"""
            SELECT s.id, s.created_at, s.title, s.model, s.kind,
                   count(e.seq) AS events, max(e.seq) AS last_seq,
                   arg_max(e.type, e.seq) AS last_type, max(e.ts) AS updated_at,
                   arg_max(e.type, e.seq) FILTER (WHERE e.type IN ('user_message', 'turn_ended')) AS turn_mark
            FROM sessions s LEFT JOIN events e ON e.session_id = s.id
            {"WHERE " + " AND ".join(where) if where else ""}
            GROUP BY ALL ORDER BY s.created_at, s.id
        """
        return [session_row(*row) for row in self._read(sql, params)]

    def _events(self, session_id: str, after: int | None, until: int | None, types: list[str] | None,
                limit: int | None) -> list[Event]:
        cur = self.cursor()
        try:
            return select_events(cur, session_id, after, until, types, limit)
        finally:
            cur.close()

    def query(self, sql: str, params: Iterable[Any] = ()) -> QueryResult:
        """Run one SELECT, read-only, within the query limits of LogSettings (see docs/api.md, /query)."""
        return run_query(self.cursor(), sql, params, self.settings)
