"""The session log in one DuckDB file.

One thread (the writer) owns the write connection; every write, from any
thread or event loop, is handed to it. Readers use their own cursors. An
event is committed before any subscriber hears of it. The database is opened
with no access to any other file (no `read_csv`, `COPY`, `ATTACH`, ...), and the
configuration locked, so SQL run through the log stays inside it.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import duckdb

from ..errors import DatabaseLocked, DatabaseMissing, DatabaseUnreadable, LogClosed, UnknownSession
from .events import EVENT_TYPES, Event
from .payload import decode_payload
from .protocol import SqlLog
from .query import QueryResult, run_query
from .scrub import needles, scrub_payload, scrub_text
from .settings import LogSettings
from .writer import STATES, Listing, WriterLog, WriterTx, session_row

SCHEMA_VERSION = "1"
logger = logging.getLogger("workbench.log")
T = TypeVar("T")

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
    kind       VARCHAR NOT NULL,     -- 'chat', 'dream' or 'eval'
    archived   BOOLEAN NOT NULL DEFAULT false,  -- set by session_archived events
    parent_id  VARCHAR,              -- the session that started this one (its session_created's parent_id)
    request_from BIGINT              -- the seq a cold read of its request starts at (after a compaction), or NULL
);
CREATE TABLE IF NOT EXISTS session_summary (   -- kept in memory by the writer, written lazily (see DuckDBLog)
    session_id VARCHAR PRIMARY KEY,
    events     BIGINT NOT NULL,      -- how many events the session has
    last_seq   BIGINT NOT NULL,      -- 0 before its first event
    last_type  VARCHAR,
    updated_at TIMESTAMP NOT NULL,   -- UTC, the last event's ts (created_at before any)
    turn_mark  VARCHAR               -- the type of the last user_message or turn_ended: the session's state
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

# The summary of every session, computed from the events: what a commit keeps in session_summary,
# what a database from before the summary is migrated with, and what a read-only log of such a
# database lists from. Only sessions of `stale` (when given) are computed.
SUMMARY_FROM_EVENTS = """
    SELECT s.id AS session_id, count(e.seq) AS events, coalesce(max(e.seq), 0) AS last_seq,
           arg_max(e.type, e.seq) AS last_type, coalesce(max(e.ts), s.created_at) AS updated_at,
           arg_max(e.type, e.seq) FILTER (WHERE e.type IN ('user_message', 'turn_ended')) AS turn_mark
    FROM sessions s LEFT JOIN events e ON e.session_id = s.id
    {where}
    GROUP BY s.id, s.created_at
"""
# sessions whose summary is missing or behind their events (written by SQL of a caller, or before the summary)
STALE = """
    SELECT s.id FROM sessions s
    LEFT JOIN (SELECT session_id, count(*) AS n, max(seq) AS m FROM events GROUP BY session_id) e ON e.session_id = s.id
    LEFT JOIN session_summary m ON m.session_id = s.id
    WHERE m.session_id IS NULL OR m.events <> coalesce(e.n, 0) OR m.last_seq <> coalesce(e.m, 0)
"""
RESUMMARIZE = ("INSERT OR REPLACE INTO session_summary "
               + SUMMARY_FROM_EVENTS.format(where=f"WHERE s.id IN ({STALE})"))
SUMMARY_VERSION = "1"
# a session's parent, from its session_created: what a database from before the parent column is filled with
PARENT_FROM_EVENT = ("CASE WHEN json_type(first.payload, '$.parent_id') = 'VARCHAR' "
                     "THEN json_extract_string(first.payload, '$.parent_id') END")
FILL_PARENTS = (f"UPDATE sessions SET parent_id = {PARENT_FROM_EVENT} FROM events first "
                "WHERE first.session_id = sessions.id AND first.seq = 1 AND sessions.parent_id IS NULL")
PARENTS_VERSION = "1"
# SQL that may write events behind the summary: any statement that names the table
NAMES_EVENTS = re.compile(r"\bevents\b", re.IGNORECASE)

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
            locked = DatabaseLocked(
                f"{path} is in use by another process{who}; DuckDB allows one writer. "
                "If a Jupyter server with workbench holds it, use its API or stop it first."
            )
            locked.holder_pid = int(holder.group(1)) if holder else None
            raise locked from None
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


def _quoted(text: str) -> str:
    """text inside a single-quoted SQL string."""
    return text.replace("'", "''")


def one_row(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> tuple[Any, ...]:
    """The row of a query that always returns exactly one (an aggregate, a setting)."""
    row = con.execute(sql, params).fetchone()
    assert row is not None, f"no row from {sql!r}"
    return row


def _overlay(row: tuple, mark: list[Any] | None) -> tuple:
    """A listing row with what commits since the summary was written changed: [added, last seq, type, ts, turn mark]."""
    if mark is None:
        return row
    return (*row[:5], row[5] + mark[0], mark[1], mark[2], mark[3], mark[4] or row[9], *row[10:])


def _want_summary(tx: Tx) -> None:
    tx.want_summary = True


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
    """A DuckDB write transaction; `execute` runs SQL of its own (the memory store's tables).

    It begins lazily: a transaction that only appends events ends as one INSERT in DuckDB's
    autocommit mode (atomic on its own), the commonest write paying one statement, not three.
    """

    _log: DuckDBLog

    def __init__(self, log: DuckDBLog, con: duckdb.DuckDBPyConnection):
        super().__init__(log)
        self.con = con
        self.begun = False
        self.raw = False  # whether SQL of the caller ran: it may have written events behind the seq cache
        self.raw_events = False  # whether that SQL named the events table: the summary is checked at commit
        self.want_summary = False  # write the summary kept in memory in this transaction (a reader needs it)
        self.clean = False  # and mark the file's summary as complete (at close)
        self.pending: list[tuple[str, int, datetime, str, str]] = []  # appended rows not yet inserted
        self.new_sessions: dict[str, list[Any]] = {}  # created rows not yet inserted (id, created, title, model, kind, parent)

    def begin(self) -> None:
        """Begin the DuckDB transaction, once: before anything reads or writes other than the final INSERT."""
        if not self.begun:
            self.con.execute("BEGIN TRANSACTION")
            self.begun = True

    def execute(self, sql: str, params: Iterable[Any] = ()) -> duckdb.DuckDBPyConnection:
        """Run SQL in this transaction."""
        self.flush()
        self.raw = True
        if isinstance(sql, str) and NAMES_EVENTS.search(sql):
            self.raw_events = True
        return self.con.execute(sql, list(params))

    def flush(self) -> None:
        """Begin, and insert the sessions and rows appended so far, before anything reads or writes."""
        self.begin()
        self._insert_pending()

    def commit(self) -> None:
        """Insert what is pending and commit; a lone INSERT of events runs on its own, in autocommit mode."""
        if self.begun or self.new_sessions:
            self.flush()
            self.con.execute("COMMIT")
        else:
            self._insert_pending()

    def _insert_pending(self) -> None:
        if self.new_sessions:
            made, self.new_sessions = list(self.new_sessions.values()), {}
            for row in made:
                self.con.execute("INSERT INTO sessions (id, created_at, title, model, kind, parent_id) VALUES (?, ?, ?, ?, ?, ?)",
                                 row)
                self.con.execute("INSERT INTO session_summary VALUES (?, 0, 0, NULL, ?, NULL)", [row[0], row[1]])
        if not self.pending:
            return
        rows, self.pending = self.pending, []
        if len(rows) == 1:
            self.con.execute("INSERT INTO events (session_id, seq, ts, type, payload) VALUES (?, ?, ?, ?, ?)", list(rows[0]))
            return
        self.con.execute(
            "INSERT INTO events (session_id, seq, ts, type, payload) SELECT unnest(?::VARCHAR[]), unnest(?::BIGINT[]), "
            "unnest(?::TIMESTAMP[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[])::JSON",
            [list(col) for col in zip(*rows, strict=True)],
        )

    def deltas(self) -> dict[str, list[Any]]:
        """What this transaction's events change in each session's summary: [added, last seq, type, ts, turn mark]."""
        out: dict[str, list[Any]] = {}
        for e in self.appended:
            s = out.setdefault(e.session_id, [0, 0, None, None, None])
            s[0] += 1
            s[1], s[2], s[3] = e.seq, e.type, e.ts.replace(tzinfo=None)
            if e.type in ("user_message", "turn_ended"):
                s[4] = e.type
        return out

    def write_summary(self, marks: dict[str, list[Any]]) -> None:
        """Bring session_summary up to date with the changes kept in memory (one statement for all sessions)."""
        self.flush()
        if marks:
            cols = list(zip(*((sid, *v) for sid, v in marks.items()), strict=True))
            self.con.execute(
                "UPDATE session_summary AS m SET events = m.events + v.n, last_seq = v.last_seq, last_type = v.last_type, "
                "updated_at = v.ts, turn_mark = coalesce(v.mark, m.turn_mark) "
                "FROM (SELECT unnest(?::VARCHAR[]) AS sid, unnest(?::BIGINT[]) AS n, unnest(?::BIGINT[]) AS last_seq, "
                "unnest(?::VARCHAR[]) AS last_type, unnest(?::TIMESTAMP[]) AS ts, unnest(?::VARCHAR[]) AS mark) AS v "
                "WHERE m.session_id = v.sid",
                [list(c) for c in cols],
            )
        if self.raw_events:  # SQL of the caller named the events table: recompute what it may have put behind
            self.con.execute(RESUMMARIZE)

    def _created(self, session_id: str, payload: dict[str, Any]) -> None:
        parent = payload.get("parent_id")
        if not isinstance(parent, str):
            return
        row = self.new_sessions.get(session_id)
        if row is not None:
            row[5] = parent
        else:  # its row is written already (SQL of the caller read in between)
            self.flush()
            self.con.execute("UPDATE sessions SET parent_id = ? WHERE id = ?", [parent, session_id])

    def _committed_seq(self, session_id: str) -> int:
        cached = None if self.raw else self._log._seqs.get(session_id)
        if cached is not None:
            return cached
        self.flush()
        row = one_row(
            self.con,
            "SELECT (SELECT count(*) FROM sessions WHERE id = ?), coalesce(max(seq), 0) FROM events WHERE session_id = ?",
            [session_id, session_id],
        )
        if not row[0]:
            raise UnknownSession(f"no session {session_id!r:.80}")
        return row[1]

    def _insert(self, session_id: str, seq: int, ts: datetime, type: str, data: bytes) -> None:
        self.pending.append((session_id, seq, ts, type, data.decode("utf-8")))

    def _events(self, session_id: str, after: int | None, until: int | None, types: list[str] | None,
                limit: int | None) -> list[Event]:
        self.flush()
        return select_events(self.con, session_id, after, until, types, limit)

    def _exists(self, session_id: str) -> bool:
        self.flush()
        return bool(one_row(self.con, "SELECT count(*) FROM sessions WHERE id = ?", [session_id])[0])

    def _insert_session(self, session_id: str, created: datetime, title: str | None, model: str | None, kind: str) -> None:
        self.new_sessions[session_id] = [session_id, created, title, model, kind, None]

    def _scrub(self, targets: list[str], replacement: str) -> dict[str, list[int]]:
        self.flush()
        found = needles(targets)
        where = " OR ".join(["contains(payload::VARCHAR, ?)"] * len(found))
        touched: dict[str, list[int]] = {}
        rows = self.con.execute(f"SELECT session_id, seq, payload FROM events WHERE {where} ORDER BY session_id, seq",
                                found).fetchall()
        changed: list[tuple[str, int, str]] = []
        for sid, seq, raw in rows:
            new = scrub_payload(raw, targets, replacement)
            if new is not None:
                changed.append((sid, seq, new.decode("utf-8")))
                touched.setdefault(sid, []).append(seq)
        if changed:  # one statement for all of them
            self.con.execute(
                "UPDATE events SET payload = v.payload::JSON FROM (SELECT unnest(?::VARCHAR[]) AS sid, unnest(?::BIGINT[]) AS seq, "
                "unnest(?::VARCHAR[]) AS payload) AS v WHERE events.session_id = v.sid AND events.seq = v.seq",
                [list(col) for col in zip(*changed, strict=True)])
        where = " OR ".join(["contains(title, ?)"] * len(targets))
        for sid, title in self.con.execute(f"SELECT id, title FROM sessions WHERE {where}", targets).fetchall():
            self.con.execute("UPDATE sessions SET title = ? WHERE id = ?", [scrub_text(title, targets, replacement), sid])
        return touched

    def _session_fields(self, session_id: str) -> dict[str, Any] | None:
        self.flush()
        row = self.con.execute("SELECT title, model, kind, archived FROM sessions WHERE id = ?", [session_id]).fetchone()
        return None if row is None else {"title": row[0], "model": row[1], "kind": row[2], "archived": bool(row[3])}

    def _set_session(self, session_id: str, fields: dict[str, Any]) -> None:
        self.flush()
        for name, value in fields.items():  # names from set_session's fixed set, never from a caller
            self.con.execute(f"UPDATE sessions SET {name} = ? WHERE id = ?", [value, session_id])

    def _remove_session(self, session_id: str) -> int:
        self.flush()
        self._log._seqs.pop(session_id, None)  # its seqs must not be reused for appends after it is gone
        n = one_row(self.con, "SELECT count(*) FROM events WHERE session_id = ?", [session_id])[0]
        for table, column in (("events", "session_id"), ("session_summary", "session_id"), ("sessions", "id")):
            self.con.execute(f"DELETE FROM {table} WHERE {column} = ?", [session_id])
        return int(n)


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
        self._summary = True  # whether the database has session_summary (a read-only old one may not)
        self._archived = True  # whether sessions has the archived column (a read-only old one may not)
        self._parents = True  # whether sessions has the parent_id column (a read-only old one may not)
        # The summary is kept in memory and written lazily: `_marks` holds, per session, what commits
        # changed since it was last written ([events added, last seq, last type, its ts, the last turn
        # mark or None]); readers add it to what they read. It is written when a reader filters or sorts
        # by it, and at close; a process that dies before leaves the file marked unclean, and the next
        # one recomputes the summary from the events. `_writes` is odd while a write of it may land (readers
        # wait, and read again if one landed meanwhile); `_keeping` is true from a commit that did not write
        # it until its change is kept (readers wait: it is in neither the file's summary nor the marks).
        self._marks: dict[str, list[Any]] = {}
        self._marks_lock = threading.Condition()
        self._writes = 0
        self._keeping = False
        self._unclean = False  # whether the file says its summary may be behind (set by the first commit)
        self._cursor_lock = threading.Condition()
        self._swapping = False  # whether compact() is replacing the file: cursors wait
        self._generation = 0  # how many times compact() replaced the connection
        try:
            self._con = self._writer.submit(self._connect).result()
        except BaseException:
            self._closed = True
            self._writer.shutdown(wait=False)
            raise

    # -- lifecycle ---------------------------------------------------------

    def _connect(self) -> duckdb.DuckDBPyConnection:
        self._writer_ident = threading.get_ident()
        con = _open(self.path, self.read_only)
        try:
            if self.read_only:
                con.execute("SELECT count(*) FROM events").fetchone()
                try:  # a database from before the summary, or whose writer died with it unwritten, lists from its events
                    meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
                except duckdb.CatalogException:
                    meta = {}
                self._summary = "summary_version" in meta and meta.get("summary_clean") != "0"
                columns = {r[0] for r in con.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = 'sessions'").fetchall()}
                self._archived, self._parents = "archived" in columns, "parent_id" in columns
                return con
            con.execute(SCHEMA)
            # a database from before archiving: the column, false for every session
            con.execute("ALTER TABLE sessions ADD COLUMN IF NOT EXISTS archived BOOLEAN DEFAULT false")
            con.execute("ALTER TABLE sessions ADD COLUMN IF NOT EXISTS parent_id VARCHAR")
            con.execute("ALTER TABLE sessions ADD COLUMN IF NOT EXISTS request_from BIGINT")
            meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
            if "schema_version" not in meta:  # a write (and its fsync) only for a new file, not at every open
                con.execute("INSERT INTO meta VALUES ('schema_version', ?) ON CONFLICT DO NOTHING", [SCHEMA_VERSION])
            if "summary_version" not in meta or meta.get("summary_clean") == "0" or "parents_version" not in meta:
                # a database from before the summary (or the parent column), or whose last writer died before
                # writing the summary it kept in memory: built from the events, once
                con.execute("BEGIN TRANSACTION")
                con.execute(RESUMMARIZE)
                if "parents_version" not in meta:
                    con.execute(FILL_PARENTS)
                for key, value in (("summary_version", SUMMARY_VERSION), ("summary_clean", "1"),
                                   ("parents_version", PARENTS_VERSION)):
                    con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, value])
                con.execute("COMMIT")
        except duckdb.CatalogException:
            con.close()
            raise DatabaseUnreadable(f"{self.path} is a DuckDB file but not a workbench log") from None
        except duckdb.Error as e:
            con.close()
            raise DatabaseUnreadable(f"cannot use {self.path}: {str(e).splitlines()[0]}") from None
        return con

    def _release(self) -> None:
        if not self.read_only and self._unclean:
            tx = self._begin()
            tx.clean = True
            try:  # the summary kept in memory, written; the file is clean again
                self._commit(tx)
            except duckdb.Error:  # the next open recomputes it from the events
                self._rollback(tx)
                logger.warning("could not write the sessions summary of %s at close", self.path, exc_info=True)
        self._close_connection(checkpoint=not self.read_only)

    def __enter__(self) -> DuckDBLog:
        return self

    def sql(self) -> SqlLog:
        """This log keeps SQL tables beside its events: a plugin's tables are written in the log's transactions."""
        return self

    def compact(self) -> None:
        """Rewrite the database file, so that no free block of it keeps what a scrub replaced.

        DuckDB leaves changed rows' old bytes in free blocks of the file after a CHECKPOINT, so
        the file is copied, table by table, into a fresh one that replaces it (atomically, with
        its mode). Runs on the writer thread, between transactions; readers wait for it.
        """
        if self.read_only:
            raise DatabaseLocked(f"{self.path} was opened read-only")
        self._writer.submit(self._compact).result()

    def _compact(self) -> None:
        fresh = self.path.with_name(self.path.name + ".compact")
        for stale in (fresh, fresh.with_name(fresh.name + ".wal")):
            stale.unlink(missing_ok=True)
        with self._cursor_lock:
            self._swapping = True
            self._generation += 1  # a reader whose cursor is of the connection closed below reads again
        try:
            self._close_connection(checkpoint=True)
            try:
                # a connection of its own: the log's may not reach another file (enable_external_access)
                try:
                    con = duckdb.connect(str(self.path))
                except duckdb.Error as e:  # another connection of this process holds the file with its own settings
                    raise DatabaseLocked(f"{self.path} could not be rewritten ({str(e).splitlines()[0]}): close the other "
                                         "logs of this process on it and compact again; until then free blocks may keep "
                                         "what was scrubbed") from None
                try:
                    con.execute("CHECKPOINT")  # nothing of the old file is left in a write-ahead log to replay
                    name = one_row(con, "SELECT current_database()")[0]
                    con.execute(f"ATTACH '{_quoted(str(fresh))}' AS workbench_compact")
                    con.execute(f'COPY FROM DATABASE "{name.replace(chr(34), chr(34) * 2)}" TO workbench_compact')
                    con.execute("DETACH workbench_compact")
                finally:
                    con.close()
                os.chmod(fresh, stat.S_IMODE(self.path.stat().st_mode))
                os.replace(fresh, self.path)
            finally:
                self._con = _open(self.path, False)
        finally:
            fresh.unlink(missing_ok=True)
            with self._cursor_lock:
                self._swapping = False
                self._cursor_lock.notify_all()

    def _close_connection(self, *, checkpoint: bool) -> None:
        # a reader's query may still run on a cursor of this connection ("connection is
        # busy"): give it a few seconds to finish rather than fail to close
        for attempt in range(100):
            try:
                if checkpoint:
                    self._con.execute("CHECKPOINT")
                    checkpoint = False
                self._con.close()
                return
            except duckdb.ConnectionException as e:
                if "closed" in str(e):  # a close that raised had closed it all the same
                    return
                if attempt == 99:
                    raise
                time.sleep(0.05)
            except duckdb.Error:
                if attempt == 99:
                    raise
                time.sleep(0.05)

    # -- writing -----------------------------------------------------------

    def _begin(self) -> Tx:
        if self.read_only:
            raise DatabaseLocked(f"{self.path} was opened read-only")
        return Tx(self, self._con)

    def _commit(self, tx: Tx) -> None:
        deltas = tx.deltas()
        write = tx.want_summary or tx.raw_events or tx.clean
        # the first change kept only in memory: the file says so in the same commit
        marking = bool(deltas) and not self._unclean and not write
        if not write:
            if marking:
                tx.flush()
                tx.con.execute("INSERT OR REPLACE INTO meta VALUES ('summary_clean', '0')")
            # from its commit until it is kept, what a commit changed is in neither the file's summary nor the
            # marks: a reader of the rows waits (one that read the committed events first must see them counted)
            with self._marks_lock:
                self._keeping = True
            try:
                tx.commit()
                self._keep(deltas, tx.removed)
            finally:
                with self._marks_lock:
                    self._keeping = False
                    self._marks_lock.notify_all()
        else:
            with self._marks_lock:
                self._writes += 1
            try:
                tx.write_summary(self._merged(deltas, tx.removed))
                if tx.clean:
                    tx.con.execute("INSERT OR REPLACE INTO meta VALUES ('summary_clean', '1')")
                tx.commit()
                with self._marks_lock:
                    self._marks.clear()
            finally:
                with self._marks_lock:
                    self._writes += 1
                    self._marks_lock.notify_all()
        self._unclean = (self._unclean or marking) and not tx.clean
        if tx.raw:
            self._seqs.clear()
        self._seqs.update(tx.last)

    def _rollback(self, tx: Tx) -> None:
        # the counters may have been advanced, or rows written behind them, by what failed
        self._seqs.clear()
        if tx.begun:
            try:
                self._con.execute("ROLLBACK")
            except duckdb.Error:
                pass  # a failed COMMIT has already ended the transaction

    def _keep(self, deltas: dict[str, list[Any]], removed: set[str]) -> None:
        """After a commit that did not write the summary: what it changed, kept in memory for readers."""
        if not deltas and not removed:
            return
        with self._marks_lock:
            for sid in removed:
                self._marks.pop(sid, None)
            for sid, d in deltas.items():
                m = self._marks.get(sid)
                if m is None:
                    self._marks[sid] = d
                else:
                    m[0] += d[0]
                    m[1], m[2], m[3] = d[1], d[2], d[3]
                    m[4] = d[4] or m[4]

    def _merged(self, deltas: dict[str, list[Any]], removed: set[str]) -> dict[str, list[Any]]:
        """What is kept in memory with this transaction's changes added (a copy: the transaction may fail)."""
        with self._marks_lock:
            out = {sid: list(m) for sid, m in self._marks.items() if sid not in removed}
        for sid, d in deltas.items():
            m = out.get(sid)
            out[sid] = list(d) if m is None else [m[0] + d[0], d[1], d[2], d[3], d[4] or m[4]]
        return out

    def _write_summary_now(self) -> None:
        """Write the summary kept in memory, for a read that filters or sorts by it (one transaction, if any change)."""
        if self._marks and not self.read_only and threading.get_ident() != self._writer_ident:
            self.write(_want_summary).result()

    # -- reading -----------------------------------------------------------

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection of its own for reading from the calling thread."""
        return self._cursor()[0]

    def _cursor(self) -> tuple[duckdb.DuckDBPyConnection, int]:
        """A reader's cursor, once compact() is not replacing the connection, and which connection it is of."""
        with self._cursor_lock:
            self._cursor_lock.wait_for(lambda: not self._swapping)
            if self._closed:
                raise self._closed_error()
            return self._con.cursor(), self._generation

    def _closed_error(self) -> LogClosed:
        return LogClosed(f"the session log {self.path} is closed; open it again to read or write")

    def _read(self, sql: str, params: list[Any]) -> list[tuple]:
        return self._reading(lambda cur: cur.execute(sql, params).fetchall())

    def _reading(self, fn: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        """fn(a reader's cursor), read again (once) if compact() replaced the connection under it: DuckDB then
        raises ConnectionException or, when the query had begun, InvalidInputException ("No open result set")."""
        for attempt in range(2):
            cur, generation = self._cursor()
            try:
                return fn(cur)
            except duckdb.Error:
                if self._closed:  # closed while this read waited or ran: say so as the log does, not as DuckDB
                    raise self._closed_error() from None
                if attempt or generation == self._generation:
                    raise
            finally:
                cur.close()
        raise AssertionError("unreachable")

    def _has_session(self, session_id: str) -> bool:
        return bool(self._read("SELECT count(*) FROM sessions WHERE id = ?", [session_id])[0][0])

    def _columns(self) -> tuple[str, str, str]:
        """(the summary's table, the select list of a row, the join its parent needs): a read-only file from
        before the summary or the parent column computes them from the events."""
        summary = "session_summary" if self._summary else f"({SUMMARY_FROM_EVENTS.format(where='')})"
        parent, join = ("s.parent_id", "") if self._parents else (
            PARENT_FROM_EVENT, "LEFT JOIN events first ON first.session_id = s.id AND first.seq = 1")
        select = ("s.id, s.created_at, s.title, s.model, s.kind, m.events, m.last_seq, m.last_type, m.updated_at, "
                  f"m.turn_mark, {parent}, {'s.archived' if self._archived else 'false'}")
        return summary, select, join

    def _session(self, session_id: str) -> dict[str, Any] | None:
        summary, select, join = self._columns()
        rows = self._overlaid(f"SELECT {select} FROM sessions s JOIN {summary} m ON m.session_id = s.id {join} "
                              "WHERE s.id = ? AND m.session_id = ?", [session_id, session_id])
        return session_row(*rows[0]) if rows else None

    def _sessions(self, q: Listing) -> list[dict[str, Any]]:
        own: list[str] = []  # conditions on the sessions table
        params: list[Any] = []
        if q.ids is not None:
            own.append("s.id IN (SELECT unnest(?::VARCHAR[]))")
            params.append(q.ids)
        if q.kind is not None:
            own.append("s.kind = ?")
            params.append(q.kind)
        if q.text is not None:
            own.append("contains(lower(s.title), lower(?))")
            params.append(q.text)
        if q.archived is not None:
            own.append("s.archived = ?" if self._archived else "? = false")
            params.append(q.archived)
        summed: list[str] = []  # conditions on the summary
        if q.state is not None:
            mark = {v: k for k, v in STATES.items()}[q.state]
            summed.append("m.turn_mark IS NULL" if mark is None else "m.turn_mark = ?")
            params += [] if mark is None else [mark]
        if q.updated_after is not None:
            summed.append("m.updated_at > ?")
            params.append(q.updated_after)
        if q.updated_before is not None:
            summed.append("m.updated_at < ?")
            params.append(q.updated_before)
        key = {"created_at": "s.created_at", "updated_at": "m.updated_at"}[q.key]
        sign, way = ("<", "DESC") if q.descending else (">", "ASC")
        if q.after is not None:
            (summed if q.key == "updated_at" else own).append(f"({key} {sign} ? OR ({key} = ? AND s.id {sign} ?))")
            params += [q.after[0], q.after[0], q.after[1]]
        summary, select, join = self._columns()
        order = f"ORDER BY {key} {way}, s.id {way}" + ("" if q.limit is None else f" LIMIT {int(q.limit)}")
        where = own + summed
        if summed or q.key == "updated_at":
            # filtered or sorted by the summary: the one kept in memory is written first, and the read is of the file
            self._write_summary_now()
            return [session_row(*row) for row in self._read(
                f"SELECT {select} FROM sessions s JOIN {summary} m ON m.session_id = s.id {join} "
                f"{'WHERE ' + ' AND '.join(where) if where else ''} {order}", params)]
        # the page is chosen from the sessions table alone (top-N), and only its rows are joined
        source = f"(SELECT * FROM sessions s {'WHERE ' + ' AND '.join(own) if own else ''} {order})"
        return [session_row(*row) for row in self._overlaid(
            f"SELECT {select} FROM {source} s JOIN {summary} m ON m.session_id = s.id {join} {order}", params)]

    def _overlaid(self, sql: str, params: list[Any]) -> list[tuple]:
        """Rows of the sessions listing, with what the writer keeps in memory added to the file's summary.

        A write of the summary landing between the read and the overlay would count its changes twice:
        such a read is done again."""
        while True:
            with self._marks_lock:
                self._marks_lock.wait_for(lambda: self._writes % 2 == 0 and not self._keeping)
                seen = self._writes
            rows = self._read(sql, params)
            with self._marks_lock:
                if self._writes != seen:
                    continue
                if not self._marks:
                    return rows
                return [_overlay(r, self._marks.get(r[0])) for r in rows]

    def _search(self, text: str, kind: str | None, archived: bool | None, limit: int,
                offset: int) -> list[tuple[dict[str, Any], int, str | None, str]]:
        # The words of each event (manage.searchable_text, in SQL), matched in any case; a session's first hit.
        words = """CASE e.type
            WHEN 'user_message' THEN coalesce(json_extract_string(e.payload, '$.text'), '')
            WHEN 'assistant_turn' THEN coalesce(array_to_string(list_filter(
                json_extract_string(e.payload, '$.message.content[*].text'), lambda x: x IS NOT NULL), chr(10)), '')
            ELSE coalesce(array_to_string(list_filter(CASE WHEN json_exists(e.payload, '$.content')
                THEN json_extract_string(e.payload, '$.content[*].text')
                ELSE list_concat(list_concat(json_extract_string(e.payload, '$.observation.outputs[*].text'),
                    json_extract_string(e.payload, '$.observation.outputs[*].data."text/plain"')),
                    json_extract_string(e.payload, ['$.observation.error.ename', '$.observation.error.evalue'])) END,
                lambda x: x IS NOT NULL), chr(10)), '') END"""
        where: list[str] = ["true"]
        params: list[Any] = []
        if kind is not None:
            where.append("s.kind = ?")
            params.append(kind)
        if archived is not None:
            where.append("s.archived = ?" if self._archived else "? = false")
            params.append(archived)
        sql = f"""
            WITH picked AS (SELECT s.id FROM sessions s WHERE {" AND ".join(where)}),
            titled AS (SELECT s.id AS sid, 0 AS seq, NULL AS type, s.title AS words
                       FROM sessions s JOIN picked p ON p.id = s.id WHERE contains(lower(s.title), lower(?))),
            said AS (SELECT e.session_id AS sid, min(e.seq) AS seq FROM events e JOIN picked p ON p.id = e.session_id
                     WHERE e.type IN ('user_message', 'assistant_turn', 'tool_result')
                       AND e.session_id NOT IN (SELECT sid FROM titled)
                       AND contains(lower({words}), lower(?))
                     GROUP BY e.session_id),
            hits AS (SELECT sid, seq, type, words FROM titled
                     UNION ALL
                     SELECT d.sid, d.seq, e.type, {words} FROM said d JOIN events e ON e.session_id = d.sid AND e.seq = d.seq)
            SELECT h.sid, h.seq, h.type, h.words FROM hits h
            JOIN {"session_summary" if self._summary else f"({SUMMARY_FROM_EVENTS.format(where='')})"} m
              ON m.session_id = h.sid
            ORDER BY m.updated_at DESC, h.sid DESC LIMIT {int(limit)} OFFSET {int(offset)}
        """
        self._write_summary_now()  # hits are sorted by the summary's updated_at
        found = self._read(sql, [*params, text, text])
        by_id = {r["id"]: r for r in self._sessions(Listing(ids=[f[0] for f in found]))}
        return [(by_id[sid], seq, type_, words or "") for sid, seq, type_, words in found if sid in by_id]

    def _events(self, session_id: str, after: int | None, until: int | None, types: list[str] | None,
                limit: int | None) -> list[Event]:
        return self._reading(lambda cur: select_events(cur, session_id, after, until, types, limit))

    def query(self, sql: str, params: Iterable[Any] = ()) -> QueryResult:
        """Run one SELECT, read-only, within the query limits of LogSettings (see docs/api.md, /query)."""
        self._write_summary_now()  # SQL may read session_summary: it holds what the writer kept in memory
        return run_query(self.cursor(), sql, params, self.settings)
