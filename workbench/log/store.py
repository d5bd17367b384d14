"""The session log: an append-only event log in one DuckDB file.

One thread (the writer) owns the write connection; every write, from any
thread or event loop, is handed to it. Readers use their own cursors. An
event is committed before any subscriber hears of it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

import duckdb
import orjson

from ..errors import (
    ConfigError,
    DatabaseLocked,
    DatabaseMissing,
    DatabaseUnreadable,
    SessionExists,
    UnknownEventType,
    UnknownSession,
)
from .events import EVENT_TYPES, Event

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

Subscriber = Callable[[Event], None]


def default_db_path() -> Path:
    """The database file: $WORKBENCH_DB, else workbench.duckdb in the Jupyter data dir."""
    env = os.environ.get("WORKBENCH_DB")
    if env:
        return Path(env).expanduser()
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / "workbench" / "workbench.duckdb"


def _utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _open(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    if read_only and not path.exists():
        raise DatabaseMissing(f"no workbench database at {path} (give --db PATH or set WORKBENCH_DB)")
    if path.is_dir():
        raise DatabaseUnreadable(f"{path} is a directory, not a DuckDB database file")
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return duckdb.connect(str(path), read_only=read_only)
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


class Tx:
    """A write transaction, used only on the writer thread."""

    def __init__(self, log: "SessionLog", con: duckdb.DuckDBPyConnection):
        self._log = log
        self.con = con
        self.appended: list[Event] = []

    def execute(self, sql: str, params: Iterable[Any] = ()) -> duckdb.DuckDBPyConnection:
        return self.con.execute(sql, list(params))

    def append(self, session_id: str, type: str, payload: dict[str, Any]) -> Event:
        if type not in EVENT_TYPES:
            raise UnknownEventType(f"event type {type!r} is not documented in docs/events.md")
        seq = self._log._next_seq(self.con, session_id, self.appended)
        ts = _utcnow()
        self.con.execute(
            "INSERT INTO events (session_id, seq, ts, type, payload) VALUES (?, ?, ?, ?, ?)",
            [session_id, seq, ts, type, json.dumps(payload, ensure_ascii=False)],
        )
        event = Event(session_id, seq, ts.replace(tzinfo=timezone.utc), type, payload)
        self.appended.append(event)
        return event


class SessionLog:
    """Append-only sessions and events in one DuckDB file, with one writer thread."""

    def __init__(self, path: str | os.PathLike | None = None, *, read_only: bool = False):
        self.path = Path(path) if path is not None else default_db_path()
        self.read_only = read_only
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="workbench-log-writer")
        self._subscribers: list[Subscriber] = []
        self._seqs: dict[str, int] = {}
        self._cursor_lock = threading.Lock()
        self._closed = False
        try:
            self._con = self._writer.submit(self._connect).result()
        except BaseException:
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

    def close(self) -> None:
        """Checkpoint and close the database; safe to call twice."""
        if self._closed:
            return
        self._closed = True

        def _close() -> None:
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

        try:
            self._writer.submit(_close).result()
        finally:
            self._writer.shutdown(wait=True)

    def __enter__(self) -> "SessionLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -----------------------------------------------------------

    def _next_seq(self, con: duckdb.DuckDBPyConnection, session_id: str, pending: list[Event]) -> int:
        if session_id not in self._seqs:
            row = con.execute(
                "SELECT (SELECT count(*) FROM sessions WHERE id = ?), coalesce(max(seq), 0) "
                "FROM events WHERE session_id = ?",
                [session_id, session_id],
            ).fetchone()
            if not row[0]:
                raise UnknownSession(f"no session {session_id!r}")
            self._seqs[session_id] = row[1]
        last = max([e.seq for e in pending if e.session_id == session_id], default=self._seqs[session_id])
        return last + 1

    def _run_tx(self, fn: Callable[[Tx], Any]) -> Any:
        if self.read_only:
            raise DatabaseLocked(f"{self.path} was opened read-only")
        tx = Tx(self, self._con)
        self._con.execute("BEGIN TRANSACTION")
        try:
            result = fn(tx)
            self._con.execute("COMMIT")
        except BaseException:
            self._con.execute("ROLLBACK")
            # the cached counters may have been advanced by a failed insert
            for e in tx.appended:
                self._seqs.pop(e.session_id, None)
            raise
        for e in tx.appended:
            self._seqs[e.session_id] = max(self._seqs.get(e.session_id, 0), e.seq)
        for e in tx.appended:
            for sub in list(self._subscribers):
                sub(e)
        return result

    def write(self, fn: Callable[[Tx], Any]) -> Future:
        """Run fn(tx) in one transaction on the writer thread; a Future of its result."""
        return self._writer.submit(self._run_tx, fn)

    def append(self, session_id: str, type: str, payload: dict[str, Any]) -> Event:
        """Append one event and wait until it is committed."""
        return self.write(lambda tx: tx.append(session_id, type, payload)).result()

    async def aappend(self, session_id: str, type: str, payload: dict[str, Any]) -> Event:
        """Append one event from async code without blocking the event loop."""
        return await asyncio.wrap_future(self.write(lambda tx: tx.append(session_id, type, payload)))

    def create_session(
        self,
        session_id: str,
        *,
        title: str | None,
        model: str,
        kind: str = "chat",
        payload: dict[str, Any],
        then: list[tuple[str, dict[str, Any]]] = (),
    ) -> Event:
        """Create a session, its `session_created` event and any `then` events in one transaction."""

        def _create(tx: Tx) -> Event:
            exists = tx.execute("SELECT count(*) FROM sessions WHERE id = ?", [session_id]).fetchone()[0]
            if exists:
                raise SessionExists(f"session {session_id!r} already exists")
            tx.execute(
                "INSERT INTO sessions (id, created_at, title, model, kind) VALUES (?, ?, ?, ?, ?)",
                [session_id, _utcnow(), title, model, kind],
            )
            self._seqs[session_id] = 0
            created = tx.append(session_id, "session_created", payload)
            for type_, extra in then:
                tx.append(session_id, type_, extra)
            return created

        return self.write(_create).result()

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call fn(event) on the writer thread after each commit; returns an unsubscribe."""
        self._subscribers.append(fn)
        return lambda: self._subscribers.remove(fn) if fn in self._subscribers else None

    # -- reading -----------------------------------------------------------

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection of its own for reading from the calling thread."""
        with self._cursor_lock:
            return self._con.cursor()

    def has_session(self, session_id: str) -> bool:
        cur = self.cursor()
        try:
            return bool(cur.execute("SELECT count(*) FROM sessions WHERE id = ?", [session_id]).fetchone()[0])
        finally:
            cur.close()

    def session(self, session_id: str) -> dict[str, Any]:
        """One session's row plus its last seq; raises UnknownSession."""
        rows = self.sessions(ids=[session_id])
        if not rows:
            raise UnknownSession(f"no session {session_id!r}")
        return rows[0]

    def sessions(self, ids: list[str] | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        """Every session, oldest first, with its event count and last event type."""
        where, params = [], []
        if ids is not None:
            where.append("s.id IN (SELECT unnest(?))")
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
        cur = self.cursor()
        try:
            rows = cur.execute(sql, params).fetchall()
        finally:
            cur.close()
        out = []
        states = {None: "new", "turn_ended": "ended", "user_message": "unfinished"}
        for sid, created, title, model, kind_, n, last_seq, last_type, updated, turn_mark in rows:
            out.append(
                {
                    "id": sid,
                    "created_at": created.replace(tzinfo=timezone.utc).isoformat(),
                    "updated_at": (updated or created).replace(tzinfo=timezone.utc).isoformat(),
                    "title": title,
                    "model": model,
                    "kind": kind_,
                    "events": n,
                    "last_seq": last_seq or 0,
                    "last_type": last_type,
                    "state": states[turn_mark],  # new, ended, or unfinished (a turn started and has not ended)
                }
            )
        return out

    def events(
        self,
        session_id: str,
        after: int | None = None,
        *,
        until: int | None = None,
        types: list[str] | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """Events of a session with seq > after (and <= until), in seq order."""
        sql = "SELECT session_id, seq, ts, type, payload FROM events WHERE session_id = ?"
        params: list[Any] = [session_id]
        if after is not None:
            sql += " AND seq > ?"
            params.append(after)
        if until is not None:
            sql += " AND seq <= ?"
            params.append(until)
        if types:
            sql += " AND type IN (SELECT unnest(?))"
            params.append(types)
        sql += " ORDER BY seq"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        cur = self.cursor()
        try:
            rows = cur.execute(sql, params).fetchall()
        finally:
            cur.close()
        # orjson: parsing payloads is most of the cost of reading a long session (4x faster than json)
        return [Event(r[0], r[1], r[2].replace(tzinfo=timezone.utc), r[3], orjson.loads(r[4])) for r in rows]

    async def aevents(self, session_id: str, after: int | None = None, **kw: Any) -> list[Event]:
        """`events` off the event loop."""
        return await asyncio.to_thread(self.events, session_id, after, **kw)

    def query(self, sql: str, params: Iterable[Any] = ()) -> tuple[list[str], list[tuple]]:
        """Run one read-only SQL statement (SELECT, WITH, ...); returns (columns, rows).

        The statement runs in a transaction that is always rolled back, so even
        a statement that slips past the keyword check cannot change the log.
        """
        head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
        if head not in {"SELECT", "WITH", "FROM", "DESCRIBE", "SHOW", "SUMMARIZE", "EXPLAIN", "VALUES", "PIVOT", "UNPIVOT"}:
            raise ConfigError("only read-only SQL is allowed (SELECT, WITH, FROM, DESCRIBE, SHOW, ...)")
        cur = self.cursor()
        try:
            cur.execute("BEGIN TRANSACTION")
            try:
                res = cur.execute(sql, list(params))
                cols = [d[0] for d in res.description] if res.description else []
                return cols, res.fetchall()
            except duckdb.Error as e:
                raise ConfigError(f"SQL error: {str(e).splitlines()[0]}") from None
            finally:
                cur.execute("ROLLBACK")
        finally:
            cur.close()
