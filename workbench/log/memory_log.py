"""The session log's in-memory twin: the same semantics as DuckDBLog, nothing on disk.

For tests of the brain and anything else that needs a log but not a file. It
keeps each payload as the JSON bytes DuckDBLog would store and decodes a fresh
copy on every read, so what a caller gets back, and may change, is never what
is stored. Writes go through the same one writer thread; reads see only
committed events, under a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from ..errors import UnknownSession
from .events import EVENT_TYPES, Event
from .payload import decode_payload
from .settings import LogSettings
from .writer import WriterLog, WriterTx, session_row

T = TypeVar("T")

Row = tuple[int, datetime, str, bytes]  # seq, ts, type, payload as stored


@dataclass
class _Session:
    created_at: datetime
    title: str | None
    model: str | None
    kind: str
    rows: list[Row]
    turn_mark: str | None = None  # the type of the last user_message or turn_ended


def select(session_id: str, rows: list[Row], until: int | None, types: list[str] | None,
           limit: int | None) -> list[Event]:
    """The events of rows (those after `after`, in seq order) that `events` asks for, each decoded afresh."""
    out: list[Event] = []
    if limit == 0:
        return out
    for seq, ts, type_, data in rows:
        if until is not None and seq > until:
            break
        if types is not None and type_ not in types:
            continue
        out.append(Event(session_id, seq, ts.replace(tzinfo=UTC), type_, decode_payload(data)))
        if limit is not None and len(out) >= limit:
            break
    return out


def _start(after: int | None) -> int:
    return max(after or 0, 0)  # seqs are 1, 2, 3, ...: seq n is rows[n - 1]


class MemoryTx(WriterTx):
    """A transaction that stages sessions and rows until commit."""

    _log: MemoryLog

    def __init__(self, log: MemoryLog):
        super().__init__(log)
        self.sessions: dict[str, _Session] = {}
        self.rows: dict[str, list[Row]] = {}

    def _committed_seq(self, session_id: str) -> int:
        with self._log._lock:
            s = self._log._store.get(session_id)
            if s is None:
                raise UnknownSession(f"no session {session_id!r:.80}")
            return len(s.rows)

    def _insert(self, session_id: str, seq: int, ts: datetime, type: str, data: bytes) -> None:
        self.rows.setdefault(session_id, []).append((seq, ts, type, data))

    def _events(self, session_id: str, after: int | None, until: int | None, types: list[str] | None,
                limit: int | None) -> list[Event]:
        start = _start(after)
        with self._log._lock:
            s = self._log._store.get(session_id)
            done = len(s.rows) if s else 0
            committed = s.rows[start:] if s else []
        staged = self.rows.get(session_id, [])[max(start - done, 0):]
        return select(session_id, committed + staged, until, types, limit)

    def _exists(self, session_id: str) -> bool:
        with self._log._lock:
            return session_id in self._log._store or session_id in self.sessions

    def _insert_session(self, session_id: str, created: datetime, title: str | None, model: str | None, kind: str) -> None:
        self.sessions[session_id] = _Session(created, title, model, kind, [])


class MemoryLog(WriterLog):
    """Sessions and events in memory, with DuckDBLog's semantics; for tests."""

    def __init__(self, *, event_types: Mapping[str, str] = EVENT_TYPES, settings: LogSettings | None = None):
        super().__init__(event_types=event_types, settings=settings)
        self._lock = threading.Lock()
        self._store: dict[str, _Session] = {}

    def __enter__(self) -> MemoryLog:
        return self

    # -- writing -------------------------------------------------------------

    def _begin(self) -> MemoryTx:
        return MemoryTx(self)

    def _commit(self, tx: MemoryTx) -> None:
        with self._lock:
            self._store.update(tx.sessions)
            for session_id, rows in tx.rows.items():
                s = self._store[session_id]
                s.rows.extend(rows)
                for _, _, type_, _ in rows:
                    if type_ in ("user_message", "turn_ended"):
                        s.turn_mark = type_

    def _rollback(self, tx: MemoryTx) -> None:
        """Nothing was stored before commit: the staged rows are dropped with the transaction."""

    # -- reading -------------------------------------------------------------

    async def _off_loop(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        return fn(*args, **kw)  # reads take a lock for microseconds: no thread needed

    def _has_session(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._store

    def _sessions(self, ids: list[str] | None, kind: str | None) -> list[dict[str, Any]]:
        wanted = set(ids) if ids is not None else None
        with self._lock:
            rows = []
            for sid, s in self._store.items():
                if (wanted is not None and sid not in wanted) or (kind is not None and s.kind != kind):
                    continue
                seq, ts, type_, _ = s.rows[-1] if s.rows else (None, None, None, None)
                rows.append((s.created_at, sid, (s.title, s.model, s.kind, len(s.rows), seq, type_, ts, s.turn_mark)))
        return [session_row(sid, created, *rest) for created, sid, rest in sorted(rows, key=lambda r: r[:2])]

    def _events(self, session_id: str, after: int | None, until: int | None, types: list[str] | None,
                limit: int | None) -> list[Event]:
        with self._lock:
            s = self._store.get(session_id)
            rows = s.rows[_start(after):] if s else []
        return select(session_id, rows, until, types, limit)
