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
from . import manage
from .events import EVENT_TYPES, Event
from .payload import decode_payload
from .scrub import scrub_payload, scrub_text
from .settings import LogSettings
from .writer import STATES, Listing, WriterLog, WriterTx, session_row

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
    archived: bool = False
    request_from: int | None = None  # set by the brain after a compaction (a cold read of this log reads it all)


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
        self.rewritten: dict[tuple[str, int], bytes] = {}  # committed payloads a scrub changed, applied at commit
        self.retitled: dict[str, str | None] = {}  # committed sessions' titles a scrub changed
        self.updates: dict[str, dict[str, Any]] = {}  # changed fields of committed sessions
        self.removed: set[str] = set()  # committed sessions this transaction deletes

    def _committed_seq(self, session_id: str) -> int:
        if session_id in self.removed:
            raise UnknownSession(f"no session {session_id!r:.80}")
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
        if session_id in self.removed:
            return session_id in self.sessions
        with self._log._lock:
            return session_id in self._log._store or session_id in self.sessions

    def _session_fields(self, session_id: str) -> dict[str, Any] | None:
        s = self.sessions.get(session_id)
        if s is None and session_id not in self.removed:
            with self._log._lock:
                s = self._log._store.get(session_id)
        if s is None:
            return None
        row = {"title": s.title, "model": s.model, "kind": s.kind, "archived": s.archived}
        return {**row, **{k: v for k, v in self.updates.get(session_id, {}).items() if k in row}}

    def _set_session(self, session_id: str, fields: dict[str, Any]) -> None:
        staged = self.sessions.get(session_id)
        if staged is not None:
            for k, v in fields.items():
                setattr(staged, k, v)
        else:
            self.updates.setdefault(session_id, {}).update(fields)

    def _remove_session(self, session_id: str) -> int:
        n = len(self.rows.pop(session_id, []))
        staged = self.sessions.pop(session_id, None)
        self.updates.pop(session_id, None)
        if staged is None and session_id not in self.removed:
            with self._log._lock:
                s = self._log._store.get(session_id)
                n += len(s.rows) if s else 0
            self.removed.add(session_id)
        return n

    def _insert_session(self, session_id: str, created: datetime, title: str | None, model: str | None, kind: str) -> None:
        self.sessions[session_id] = _Session(created, title, model, kind, [])

    def _scrub(self, targets: list[str], replacement: str) -> dict[str, list[int]]:
        touched: dict[str, list[int]] = {}
        with self._log._lock:
            committed = [(sid, s.title, list(s.rows)) for sid, s in self._log._store.items()]
        for sid, title, rows in committed:
            if title is not None and scrub_text(title, targets, replacement) != title:
                self.retitled[sid] = scrub_text(title, targets, replacement)
            for seq, _, _, data in rows:
                new = scrub_payload(self.rewritten.get((sid, seq), data), targets, replacement)
                if new is not None:
                    self.rewritten[(sid, seq)] = new
                    touched.setdefault(sid, []).append(seq)
        for s in self.sessions.values():  # sessions created in this transaction
            if s.title is not None:
                s.title = scrub_text(s.title, targets, replacement)
        for sid, staged in self.rows.items():  # rows appended in this transaction
            for i, (seq, ts, type_, data) in enumerate(staged):
                new = scrub_payload(data, targets, replacement)
                if new is not None:
                    staged[i] = (seq, ts, type_, new)
                    touched.setdefault(sid, []).append(seq)
        return touched


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
            for (sid, seq), data in tx.rewritten.items():
                if sid in self._store:
                    seq_, ts, type_, _ = self._store[sid].rows[seq - 1]
                    self._store[sid].rows[seq - 1] = (seq_, ts, type_, data)
            for sid, title in tx.retitled.items():
                if sid in self._store:
                    self._store[sid].title = title
            for session_id in tx.removed:
                self._store.pop(session_id, None)
            self._store.update(tx.sessions)
            for session_id, fields in tx.updates.items():
                for k, v in fields.items():
                    setattr(self._store[session_id], k, v)
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

    def _sessions(self, q: Listing) -> list[dict[str, Any]]:
        wanted = set(q.ids) if q.ids is not None else None
        text = q.text.lower() if q.text is not None else None
        with self._lock:
            rows = []
            for sid, s in self._store.items():
                if (wanted is not None and sid not in wanted) or (q.kind is not None and s.kind != q.kind):
                    continue
                if q.state is not None and STATES[s.turn_mark] != q.state:
                    continue
                if text is not None and (s.title is None or text not in s.title.lower()):
                    continue
                if q.archived is not None and s.archived != q.archived:
                    continue
                seq, ts, type_, _ = s.rows[-1] if s.rows else (None, None, None, None)
                updated = ts or s.created_at
                if (q.updated_after is not None and not updated > q.updated_after) or (
                        q.updated_before is not None and not updated < q.updated_before):
                    continue
                key = s.created_at if q.key == "created_at" else updated
                if q.after is not None and not ((key, sid) < q.after if q.descending else (key, sid) > q.after):
                    continue
                parent = decode_payload(s.rows[0][3]).get("parent_id") if s.rows else None
                rows.append((key, sid, (s.created_at, s.title, s.model, s.kind, len(s.rows), seq, type_, ts, s.turn_mark,
                                        parent if isinstance(parent, str) else None, s.archived)))
        rows.sort(key=lambda r: r[:2], reverse=q.descending)
        if q.limit is not None:
            rows = rows[: q.limit]
        return [session_row(sid, *rest) for _, sid, rest in rows]

    def _events(self, session_id: str, after: int | None, until: int | None, types: list[str] | None,
                limit: int | None) -> list[Event]:
        with self._lock:
            s = self._store.get(session_id)
            rows = s.rows[_start(after):] if s else []
        return select(session_id, rows, until, types, limit)

    def _search(self, text: str, kind: str | None, archived: bool | None, limit: int,
                offset: int) -> list[tuple[dict[str, Any], int, str | None, str]]:
        needle = text.lower()
        found: list[tuple[str, int, str | None, str]] = []
        with self._lock:
            items = list(self._store.items())
            snapshot = {sid: (s.title, s.kind, s.archived, list(s.rows)) for sid, s in items}
        for sid, (title, kind_, arch, rows) in snapshot.items():
            if (kind is not None and kind_ != kind) or (archived is not None and arch != archived):
                continue
            if title is not None and needle in title.lower():
                found.append((sid, 0, None, title))
                continue
            for seq, _, type_, data in rows:
                if type_ in manage.SEARCHED_TYPES:
                    words = manage.searchable_text(type_, decode_payload(data))
                    if needle in words.lower():
                        found.append((sid, seq, type_, words))
                        break
        by_id = {r["id"]: r for r in self._sessions(Listing(ids=[f[0] for f in found]))}
        hits = [(by_id[sid], seq, type_, words) for sid, seq, type_, words in found if sid in by_id]
        hits.sort(key=lambda h: (datetime.fromisoformat(h[0]["updated_at"]), h[0]["id"]), reverse=True)
        return hits[offset: offset + limit]
