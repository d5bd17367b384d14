"""What every session log shares: one writer thread, transactions, subscribers, checks.

A log subclass says how to begin, commit and roll back a transaction, how its
transaction stores a row, and how it reads; everything the conformance suite
checks beyond that (seqs, event types, strict payloads, who hears what and
when, the async faces) is written once, here.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, TypeVar

import orjson

from ..errors import LogClosed, SessionExists, UnknownEventType, UnknownSession
from .events import EVENT_TYPES, Event
from .payload import check_field, encodable, encode_payload
from .protocol import Subscriber
from .settings import LogSettings

T = TypeVar("T")
logger = logging.getLogger("workbench.log")

STATES = MappingProxyType({None: "new", "turn_ended": "ended", "user_message": "unfinished"})


def utcnow() -> datetime:
    """Now in UTC, naive, as the log stores it."""
    return datetime.now(UTC).replace(tzinfo=None)


def session_row(sid: str, created: datetime, title: str | None, model: str | None, kind: str, n: int,
                last_seq: int | None, last_type: str | None, updated: datetime | None, turn_mark: str | None) -> dict[str, Any]:
    """One row of `sessions()`, the same from every log."""
    return {
        "id": sid,
        "created_at": created.replace(tzinfo=UTC).isoformat(),
        "updated_at": (updated or created).replace(tzinfo=UTC).isoformat(),
        "title": title,
        "model": model,
        "kind": kind,
        "events": n,
        "last_seq": last_seq or 0,
        "last_type": last_type,
        "state": STATES[turn_mark],  # new, ended, or unfinished (a turn started and has not ended)
    }


def _show(value: Any) -> str:
    return repr(value)[:80]


def read_filter(session_id: Any, after: Any, until: Any, types: Any, limit: Any) -> tuple[bool, list[str] | None]:
    """Checked arguments of `events`: (whether anything can match, the types to keep or None for all)."""
    for name, value in (("after", after), ("until", until), ("limit", limit)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{name} must be an integer or None, not {_show(value)}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, not {limit}")
    if not types:
        return valid_id(session_id), None
    kept = [t for t in types if valid_id(t)]
    return valid_id(session_id) and bool(kept), kept


def valid_id(value: Any) -> bool:
    """Whether value could be the id (or kind, or event type) of something stored."""
    return isinstance(value, str) and encodable(value)


class WriterTx:
    """The part of a transaction every log shares; used only on the writer thread."""

    def __init__(self, log: WriterLog):
        self._log = log
        self.appended: list[Event] = []
        self.last: dict[str, int] = {}  # the last seq this transaction gave each session

    def append(self, session_id: str, type: str, payload: dict[str, Any]) -> Event:
        """Append an event; it is committed with the rest of the transaction, or not at all."""
        log = self._log
        if not isinstance(type, str) or type not in log.event_types:
            raise UnknownEventType(f"event type {_show(type)} is not documented in docs/events.md")
        if not valid_id(session_id):
            raise UnknownSession(f"no session {_show(session_id)}")
        seq = self.last.get(session_id)
        if seq is None:
            seq = self._committed_seq(session_id)
        data = encode_payload(payload, log.settings, type)
        seq += 1
        ts = utcnow()
        self._insert(session_id, seq, ts, type, data)
        self.last[session_id] = seq
        # what a reader will get back: canonical JSON, and never the caller's own objects
        event = Event(session_id, seq, ts.replace(tzinfo=UTC), type, orjson.loads(data))
        self.appended.append(event)
        return event

    def events(self, session_id: str, after: int | None = None, *, until: int | None = None,
               types: list[str] | None = None, limit: int | None = None) -> list[Event]:
        """Like `events` of the log, including what this transaction appended so far."""
        possible, types = read_filter(session_id, after, until, types, limit)
        return self._events(session_id, after, until, types, limit) if possible else []

    def create(self, session_id: str, title: str | None, model: str | None, kind: str) -> None:
        """Insert a session row; its first event is appended next."""
        if self._exists(session_id):
            raise SessionExists(f"session {_show(session_id)} already exists")
        self._insert_session(session_id, utcnow(), title, model, kind)
        self.last[session_id] = 0

    # -- what each log's transaction provides --------------------------------

    def _committed_seq(self, session_id: str) -> int:
        """The last committed seq of a session (0 if none); UnknownSession if it does not exist."""
        raise NotImplementedError

    def _insert(self, session_id: str, seq: int, ts: datetime, type: str, data: bytes) -> None:
        raise NotImplementedError

    def _events(self, session_id: str, after: int | None, until: int | None, types: list[str] | None,
                limit: int | None) -> list[Event]:
        raise NotImplementedError

    def _exists(self, session_id: str) -> bool:
        raise NotImplementedError

    def _insert_session(self, session_id: str, created: datetime, title: str | None, model: str | None, kind: str) -> None:
        raise NotImplementedError


class WriterLog:
    """The part of a session log every implementation shares."""

    def __init__(self, *, event_types: Mapping[str, str] = EVENT_TYPES, settings: LogSettings | None = None):
        # a copy: a caller changing its dict later cannot let undocumented types in
        self.event_types: Mapping[str, str] = MappingProxyType(dict(event_types))
        self.settings = settings or LogSettings()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="workbench-log-writer")
        self._subscribers: list[Subscriber] = []
        self._submit_lock = threading.Lock()
        self._closed = False

    # -- what each log provides ----------------------------------------------

    def _begin(self) -> WriterTx:
        raise NotImplementedError

    def _commit(self, tx: Any) -> None:
        raise NotImplementedError

    def _rollback(self, tx: Any) -> None:
        raise NotImplementedError

    def _release(self) -> None:
        """Free what the log holds; runs on the writer thread after every pending write."""

    def _has_session(self, session_id: str) -> bool:
        raise NotImplementedError

    def _sessions(self, ids: list[str] | None, kind: str | None) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _events(self, session_id: str, after: int | None, until: int | None, types: list[str] | None,
                limit: int | None) -> list[Event]:
        raise NotImplementedError

    # -- lifecycle -----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosed("the session log is closed; open it again to read or write")

    def close(self) -> None:
        """Finish pending writes and release the log; safe to call twice."""
        with self._submit_lock:
            if self._closed:
                return
            self._closed = True
            # queued after every write already submitted, so those still run
            done = self._writer.submit(self._release)
        try:
            done.result()
        finally:
            self._writer.shutdown(wait=True)

    def __enter__(self) -> WriterLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -------------------------------------------------------------

    def _run_tx(self, fn: Callable[[Any], T]) -> T:
        tx = self._begin()
        try:
            result = fn(tx)
            self._commit(tx)
        except BaseException:
            self._rollback(tx)
            raise
        for event in tx.appended:
            self._notify(event)
        return result

    def _notify(self, event: Event) -> None:
        # the event is committed: a failing subscriber must not make its writer think otherwise,
        # nor keep the other subscribers from hearing of it
        for fn in list(self._subscribers):
            try:
                fn(event)
            except Exception:
                logger.exception("a subscriber of the session log failed on event %s %d (%s); the event is committed",
                                 event.session_id, event.seq, event.type)

    def write(self, fn: Callable[[Any], T]) -> Future[T]:
        """Run fn(tx) in one transaction on the writer thread; a Future of its result."""
        with self._submit_lock:
            self._check_open()
            return self._writer.submit(self._run_tx, fn)

    async def awrite(self, fn: Callable[[Any], T]) -> T:
        """`write` awaited without blocking the event loop."""
        return await asyncio.wrap_future(self.write(fn))

    def append(self, session_id: str, type: str, payload: dict[str, Any]) -> Event:
        """Append one event and wait until it is committed."""
        return self.write(lambda tx: tx.append(session_id, type, payload)).result()

    async def aappend(self, session_id: str, type: str, payload: dict[str, Any]) -> Event:
        """`append` without blocking the event loop."""
        return await asyncio.wrap_future(self.write(lambda tx: tx.append(session_id, type, payload)))

    def create_session(
        self,
        session_id: str,
        *,
        title: str | None,
        model: str | None,
        kind: str = "chat",
        payload: dict[str, Any],
        then: Sequence[tuple[str, dict[str, Any]]] = (),
    ) -> Event:
        """Create a session, its `session_created` event and any `then` events in one transaction."""
        for name, value, optional in (("id", session_id, False), ("title", title, True),
                                      ("model", model, True), ("kind", kind, False)):
            check_field(name, value, self.settings, optional=optional)
        then = list(then)

        def _create(tx: WriterTx) -> Event:
            tx.create(session_id, title, model, kind)
            created = tx.append(session_id, "session_created", payload)
            for type_, extra in then:
                tx.append(session_id, type_, extra)
            return created

        return self.write(_create).result()

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call fn(event) on the writer thread after each commit; returns an unsubscribe."""
        self._subscribers.append(fn)
        return lambda: self._subscribers.remove(fn) if fn in self._subscribers else None

    # -- reading -------------------------------------------------------------

    def session(self, session_id: str) -> dict[str, Any]:
        """One session's row (see `sessions`); raises UnknownSession."""
        rows = self.sessions(ids=[session_id])
        if not rows:
            raise UnknownSession(f"no session {_show(session_id)}")
        return rows[0]

    def sessions(self, ids: list[str] | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        """Every session (or those of `ids`, of `kind`), oldest first, with its event count, last event and state."""
        self._check_open()
        if ids is not None:
            ids = [i for i in ids if valid_id(i)]  # an id nothing can have matches nothing
        if kind is not None and not valid_id(kind):
            return []
        return self._sessions(ids, kind)

    def events(self, session_id: str, after: int | None = None, *, until: int | None = None,
               types: list[str] | None = None, limit: int | None = None) -> list[Event]:
        """Events of a session with after < seq <= until, of the given types (all if none), in seq order."""
        self._check_open()
        possible, types = read_filter(session_id, after, until, types, limit)
        return self._events(session_id, after, until, types, limit) if possible else []

    def has_session(self, session_id: str) -> bool:
        """Whether a session with that id exists."""
        self._check_open()
        return valid_id(session_id) and self._has_session(session_id)

    async def _off_loop(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        return await asyncio.to_thread(fn, *args, **kw)

    async def ahas_session(self, session_id: str) -> bool:
        """`has_session` without blocking the event loop."""
        return await self._off_loop(self.has_session, session_id)

    async def asession(self, session_id: str) -> dict[str, Any]:
        """`session` without blocking the event loop."""
        return await self._off_loop(self.session, session_id)

    async def asessions(self, ids: list[str] | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        """`sessions` without blocking the event loop."""
        return await self._off_loop(self.sessions, ids, kind)

    async def aevents(self, session_id: str, after: int | None = None, **kw: Any) -> list[Event]:
        """`events` without blocking the event loop."""
        return await self._off_loop(self.events, session_id, after, **kw)
