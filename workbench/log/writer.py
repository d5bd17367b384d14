"""What every session log shares: one writer thread, transactions, subscribers, checks.

A log subclass says how to begin, commit and roll back a transaction, how its
transaction stores a row, and how it reads; everything the conformance suite
checks beyond that (seqs, event types, strict payloads, who hears what and
when, the async faces) is written once, here.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import functools
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, TypeVar

import orjson

from ..errors import InvalidPayload, LogClosed, SessionExists, UnknownEventType, UnknownSession
from . import manage
from .events import EVENT_TYPES, Event
from .payload import check_field, encodable, encode_payload
from .protocol import CommitSubscriber, SqlLog, Subscriber
from .scrub import ordered
from .settings import LogSettings

T = TypeVar("T")
logger = logging.getLogger("workbench.log")

STATES = MappingProxyType({None: "new", "turn_ended": "ended", "user_message": "unfinished"})


def utcnow() -> datetime:
    """Now in UTC, naive, as the log stores it."""
    return datetime.now(UTC).replace(tzinfo=None)


def session_row(sid: str, created: datetime, title: str | None, model: str | None, kind: str, n: int,
                last_seq: int | None, last_type: str | None, updated: datetime | None, turn_mark: str | None,
                parent_id: str | None = None, archived: bool = False) -> dict[str, Any]:
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
        "parent_id": parent_id,  # the session that started this one (a delegated child), from its session_created
        "archived": bool(archived),  # set by session_archived events; archived sessions are hidden by default
    }


ORDERS = MappingProxyType({  # a listing's order: the row field it sorts by, and whether newest first
    "created": ("created_at", False), "-created": ("created_at", True),
    "updated": ("updated_at", False), "-updated": ("updated_at", True),
})
MAX_PAGE = 1000  # sessions in one page at most


@dataclass(frozen=True)
class Listing:
    """What `sessions` and `sessions_page` ask for, checked: filters, order, and where a page starts."""

    ids: list[str] | None = None
    kind: str | None = None
    state: str | None = None  # new, ended or unfinished
    text: str | None = None  # a substring of the title, in any case
    archived: bool | None = None  # only archived sessions (True), only the others (False), or both (None)
    updated_after: datetime | None = None  # naive UTC, exclusive
    updated_before: datetime | None = None  # naive UTC, exclusive
    order: str = "created"
    after: tuple[datetime, str] | None = None  # the (order key, id) of the last row of the page before
    limit: int | None = None

    @property
    def key(self) -> str:
        return ORDERS[self.order][0]

    @property
    def descending(self) -> bool:
        return ORDERS[self.order][1]


def _instant(name: str, value: Any) -> datetime:
    """A time filter as naive UTC: a datetime (naive means UTC) or an ISO 8601 string."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ValueError(f"{name} must be an ISO 8601 time such as 2026-01-31T12:00:00Z, not {_show(value)}") from None
    if not isinstance(value, datetime):
        raise ValueError(f"{name} must be an ISO 8601 time or a datetime, not {_show(value)}")
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value


def encode_cursor(order: str, row: dict[str, Any]) -> str:
    """The cursor of the page after `row` (opaque to callers: the order, its key and the id, in base64)."""
    raw = orjson.dumps([order, row[ORDERS[order][0]], row["id"]])
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(order: str, cursor: Any) -> tuple[datetime, str]:
    """(key, id) of a cursor `encode_cursor` gave for the same order; ValueError otherwise."""
    bad = ValueError("cursor is not one a listing of this log gave (pass back `next` as it came, with the same order)")
    if not isinstance(cursor, str) or len(cursor) > 8192:
        raise bad
    try:
        got_order, key, sid = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        instant = _instant("cursor", key)
    except (ValueError, TypeError, binascii.Error):
        raise bad from None
    if got_order != order or not valid_id(sid):
        raise bad
    return instant, sid


def listing(ids: Any = None, kind: Any = None, *, state: Any = None, text: Any = None, updated_after: Any = None,
            updated_before: Any = None, order: Any = "created", cursor: Any = None, limit: Any = None,
            archived: Any = None) -> Listing:
    """The checked Listing of `sessions`' arguments; ValueError says which one is wrong and how."""
    if ids is not None:
        if isinstance(ids, str) or not isinstance(ids, (list, tuple)):
            raise ValueError(f"ids must be a list of session ids, not {_show(ids)}")
        ids = [i for i in ids if valid_id(i)]  # an id nothing can have matches nothing
    if state is not None and state not in STATES.values():
        raise ValueError(f"state must be one of {', '.join(STATES.values())}, not {_show(state)}")
    if text is not None and not isinstance(text, str):
        raise ValueError(f"text must be a string, not {_show(text)}")
    if archived is not None and not isinstance(archived, bool):
        raise ValueError(f"archived must be true, false or None, not {_show(archived)}")
    if not isinstance(order, str) or order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, not {_show(order)}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE):
        raise ValueError(f"limit must be an integer from 1 to {MAX_PAGE}, not {_show(limit)}")
    return Listing(
        ids=ids, kind=kind, state=state, text=text or None, archived=archived,
        updated_after=None if updated_after is None else _instant("updated_after", updated_after),
        updated_before=None if updated_before is None else _instant("updated_before", updated_before),
        order=order, after=None if cursor is None else decode_cursor(order, cursor), limit=limit,
    )


def matches_nothing(q: Listing) -> bool:
    """Whether no stored session can match (a kind or text no stored string can hold)."""
    return (q.kind is not None and not valid_id(q.kind)) or (q.text is not None and not encodable(q.text)) or q.ids == []


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


class _Job:
    """A write waiting for its group commit: the function to run in the transaction, and where its outcome goes:
    a thread's Future, or, for a caller on an event loop, that loop's future (set in one callback per group, with
    no Future of its own: a Future's lock costs more than the rest of an append's hand-off)."""

    __slots__ = ("fn", "future", "waiter", "cancelled", "result", "error")

    def __init__(self, fn: Callable[[Any], Any], future: Future | None, waiter: asyncio.Future | None) -> None:
        self.fn, self.future, self.waiter = fn, future, waiter
        self.cancelled = False  # a loop caller withdrew it before it ran (under the log's submit lock)
        self.result: Any = None
        self.error: BaseException | None = None

    def start(self) -> bool:
        """Whether the write is still wanted; from now on it cannot be withdrawn."""
        return self.future.set_running_or_notify_cancel() if self.future is not None else not self.cancelled

    def set_result(self, result: Any) -> None:
        if self.future is not None:
            self.future.set_result(result)
        self.result = result

    def set_exception(self, error: BaseException) -> None:
        if self.future is not None:
            self.future.set_exception(error)
        self.error = error


def _settle(heard: list[tuple[CommitSubscriber, list[Event]]], jobs: list[_Job]) -> None:
    """On a loop: its subscribers hear the group's commits, then each waiting future gets its write's outcome
    (unless it was cancelled meanwhile)."""
    for fn, events in heard:
        try:
            fn(events)
        except Exception:
            logger.exception("a subscriber of the session log failed on a commit of %d events; they are committed",
                             len(events))
    for job in jobs:
        waiter = job.waiter
        if waiter is None or waiter.done():
            continue
        if job.error is not None:
            waiter.set_exception(job.error)
        else:
            waiter.set_result(job.result)


class WriterTx:
    """The part of a transaction every log shares; used only on the writer thread."""

    def __init__(self, log: WriterLog):
        self._log = log
        self.appended: list[Event] = []
        self.last: dict[str, int] = {}  # the last seq this transaction gave each session
        # what the log learns once this transaction commits (and forgets if it does not): kinds of new
        # sessions, sessions seen with a title, sessions removed
        self.kinds: dict[str, str] = {}
        self.titled: set[str] = set()
        self.removed: set[str] = set()

    def append(self, session_id: str, type: str, payload: dict[str, Any]) -> Event:
        """Append an event; it is committed with the rest of the transaction, or not at all."""
        return self.append_prepared(session_id, type, *self._log.prepare(type, payload))

    def append_prepared(self, session_id: str, type: str, data: bytes, copy: dict[str, Any]) -> Event:
        """Append an event `prepare` checked and encoded (data) and decoded afresh (copy)."""
        if not valid_id(session_id):
            raise UnknownSession(f"no session {_show(session_id)}")
        seq = self.last.get(session_id)
        if seq is None:
            seq = self._committed_seq(session_id)
        seq += 1
        ts = utcnow()
        self._insert(session_id, seq, ts, type, data)
        if type == "session_created":
            self._created(session_id, copy)
        self.last[session_id] = seq
        event = Event(session_id, seq, ts.replace(tzinfo=UTC), type, copy)
        self.appended.append(event)
        return event

    def events(self, session_id: str, after: int | None = None, *, until: int | None = None,
               types: list[str] | None = None, limit: int | None = None) -> list[Event]:
        """Like `events` of the log, including what this transaction appended so far."""
        possible, types = read_filter(session_id, after, until, types, limit)
        return self._events(session_id, after, until, types, limit) if possible else []

    def scrub(self, targets: Sequence[str], replacement: str) -> dict[str, list[int]]:
        """Replace every copy of each target in committed and appended payloads and in session titles, in place
        (the one exception to append-only, log/scrub.py); the seqs changed, by session. The caller appends
        the `redacted` tombstones."""
        targets = ordered(targets)
        return self._scrub(targets, replacement) if targets else {}

    def create(self, session_id: str, title: str | None, model: str | None, kind: str) -> None:
        """Insert a session row; its first event is appended next."""
        if self._exists(session_id):
            raise SessionExists(f"session {_show(session_id)} already exists")
        self._insert_session(session_id, utcnow(), title, model, kind)
        self.last[session_id] = 0
        self.kinds[session_id] = kind
        if title:
            self.titled.add(session_id)

    def session_fields(self, session_id: str) -> dict[str, Any]:
        """{title, model, kind, archived} of a session as this transaction sees it; UnknownSession."""
        row = self._session_fields(session_id) if valid_id(session_id) else None
        if row is None:
            raise UnknownSession(f"no session {_show(session_id)}")
        if row["title"]:
            self.titled.add(session_id)
        return row

    def has_title(self, session_id: str) -> bool:
        """Whether the session is known to have a title, without a read (a title, once set, is never removed)."""
        return session_id in self.titled or session_id in self._log._titled

    def set_session(self, session_id: str, **fields: Any) -> None:
        """Change a session's row: its `title` and/or `archived` (the caller appends the event that says so), or
        `request_from` (the seq a cold read of its request may start at: the brain's, after a compaction)."""
        assert set(fields) <= {"title", "archived", "request_from"}, fields
        self._set_session(session_id, fields)
        if fields.get("title"):
            self.titled.add(session_id)

    def remove_session(self, session_id: str) -> int:
        """Remove a session's rows (events, summary, session) in this transaction; returns how many events it had."""
        n = self._remove_session(session_id)
        self.last.pop(session_id, None)
        self.removed.add(session_id)
        self.kinds.pop(session_id, None)
        self.titled.discard(session_id)
        # what this transaction appended to it is gone with it: nobody is told of it
        self.appended = [e for e in self.appended if e.session_id != session_id]
        return n

    # -- what each log's transaction provides --------------------------------

    def _created(self, session_id: str, payload: dict[str, Any]) -> None:
        """A session's `session_created` was appended (a log that keeps its parent_id in the row learns it here)."""

    def _session_fields(self, session_id: str) -> dict[str, Any] | None:
        raise NotImplementedError

    def _set_session(self, session_id: str, fields: dict[str, Any]) -> None:
        raise NotImplementedError

    def _remove_session(self, session_id: str) -> int:
        raise NotImplementedError

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

    def _scrub(self, targets: list[str], replacement: str) -> dict[str, list[int]]:
        raise NotImplementedError


class WriterLog:
    """The part of a session log every implementation shares."""

    def __init__(self, *, event_types: Mapping[str, str] = EVENT_TYPES, settings: LogSettings | None = None):
        # a copy: a caller changing its dict later cannot let undocumented types in
        self.event_types: Mapping[str, str] = MappingProxyType(dict(event_types))
        self.settings = settings or LogSettings()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="workbench-log-writer")
        self._subscribers: list[Subscriber] = []
        self._commit_subscribers: list[CommitSubscriber] = []
        self._loop_subscribers: list[tuple[asyncio.AbstractEventLoop, CommitSubscriber]] = []
        self._heard: list[tuple[asyncio.AbstractEventLoop, CommitSubscriber, list[Event]]] = []  # for the next _wake
        self._submit_lock = threading.Lock()
        self._arrived = threading.Condition(self._submit_lock)  # notified when a write is queued
        self._closed = False
        self._queue: deque[_Job] = deque()  # writes waiting for the next group commit (under _submit_lock)
        self._draining = False  # whether a drain of the queue is submitted to the writer and not yet done
        # What commits taught: a session's kind never changes and a title once set is never removed, so
        # neither needs a read again (changed on the writer thread only, after a commit; read anywhere)
        self._kinds: dict[str, str] = {}
        self._titled: set[str] = set()
        self._removals = 0  # sessions removed so far: a kind read before a removal is not kept after it
        self._learned = threading.Lock()

    # -- what each log provides ----------------------------------------------

    def _begin(self) -> WriterTx:
        raise NotImplementedError

    def _commit(self, tx: Any) -> None:
        raise NotImplementedError

    def _rollback(self, tx: Any) -> None:
        raise NotImplementedError

    def _release(self) -> None:
        """Free what the log holds; runs on the writer thread after every pending write."""

    def sql(self) -> SqlLog | None:
        """The SQL capability (tables of a plugin's own beside the events), when this log offers one."""
        return None

    def compact(self) -> None:
        """After a scrub: leave no copy of what it replaced anywhere the log keeps data (a file's free
        blocks, its write-ahead log). Nothing to do for a log that keeps no file."""

    def _has_session(self, session_id: str) -> bool:
        raise NotImplementedError

    def _sessions(self, q: Listing) -> list[dict[str, Any]]:
        """The rows q asks for, in its order, at most q.limit of them."""
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

    def _drain(self) -> None:
        """On the writer thread: commit what is queued, a group at a time, until the queue is empty.

        Writes that arrive while a group commits wait in the queue and go together into the next one,
        so a commit (and its fsync) is paid once per group, not once per write.
        """
        last = 0  # the size of the group before
        while True:
            with self._arrived:
                if not self._queue:
                    self._draining = False
                    return
                if 1 < len(self._queue) < last:
                    # Many writers, and not all of them back yet (each resubmits once its write is answered):
                    # wait a moment for them, so that groups stay large instead of alternating halves.
                    # A lone writer (groups of one) never waits.
                    self._arrived.wait_for(functools.partial(self._queued, last), self.settings.group_wait)
                n = min(len(self._queue), self.settings.max_group)
                # started under the lock a withdrawal takes: a job is run, or withdrawn, never both
                jobs = [j for j in (self._queue.popleft() for _ in range(n)) if j.start()]
            last = n
            if jobs:
                self._commit_group(jobs)
                self._wake([j for j in jobs if j.waiter is not None])

    def _queued(self, n: int) -> bool:
        return len(self._queue) >= n

    def _wake(self, jobs: list[_Job]) -> None:
        """Hand a group's commits and outcomes to the loops that hear or wait for them: one callback per loop."""
        heard, self._heard = self._heard, []
        by_loop: dict[asyncio.AbstractEventLoop, tuple[list[Any], list[_Job]]] = {}
        for loop, fn, events in heard:
            by_loop.setdefault(loop, ([], []))[0].append((fn, events))
        for job in jobs:
            assert job.waiter is not None
            by_loop.setdefault(job.waiter.get_loop(), ([], []))[1].append(job)
        for loop, (calls, some) in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits there any more
                loop.call_soon_threadsafe(_settle, calls, some)

    def _commit_group(self, jobs: list[_Job]) -> None:
        """Run every job's fn in one transaction and commit it; then announce the events, then answer the callers.

        - A job whose fn raises: its caller gets that exception and nothing of it is kept; the
          transaction is rolled back (announcing nothing) and the other jobs are committed again
          without it, in a fresh transaction of their own, before its caller hears the exception (a
          write that refused because of an earlier write of its group reads that write on its retry).
        - A commit that fails: nothing is announced, and each job runs again alone, in its own
          transaction, so each caller gets the outcome its write has by itself.
        So a fn may be called more than once; only the call whose transaction commits counts.
        """
        try:
            tx = self._begin()
        except BaseException as e:  # a read-only log, a connection gone: every caller hears why
            for job in jobs:
                job.set_exception(e)
            return
        results: list[Any] = []
        failed: tuple[int, BaseException] | None = None
        for i, job in enumerate(jobs):
            try:
                results.append(job.fn(tx))
            except BaseException as e:
                failed = (i, e)
                break
        if failed is None:
            try:
                self._commit(tx)
            except BaseException as exc:
                self._rollback(tx)
                if len(jobs) == 1:
                    jobs[0].set_exception(exc)
                    return
                logger.warning("a group commit of %d writes failed (%s); committing each alone", len(jobs), exc)
                for job in jobs:
                    self._commit_group([job])
                return
        else:
            self._rollback(tx)
            i, error = failed
            rest = jobs[:i] + jobs[i + 1:]
            if rest:
                self._commit_group(rest)
            jobs[i].set_exception(error)  # after the others: a caller that plans again on hearing it reads their writes
            return
        self._learn(tx)
        self._announce(tx.appended)
        for job, result in zip(jobs, results, strict=True):
            job.set_result(result)

    def _learn(self, tx: WriterTx) -> None:
        """After a commit: what it says of sessions' kinds and titles, and which sessions are gone."""
        with self._learned:
            if tx.removed:
                self._removals += 1
                for sid in tx.removed:
                    self._kinds.pop(sid, None)
                    self._titled.discard(sid)
            self._kinds.update(tx.kinds)
            self._titled.update(tx.titled)

    def session_kind(self, session_id: str) -> str:
        """A session's kind (chat, dream, eval, ...): read once, then known (a kind never changes); UnknownSession."""
        kind = self._kinds.get(session_id)
        if kind is None:
            removals = self._removals
            kind = self.session(session_id)["kind"]
            with self._learned:
                if removals == self._removals:  # no session was removed meanwhile (it may have been this one)
                    self._kinds[session_id] = kind
        return kind

    def _announce(self, events: list[Event]) -> None:
        # the events are committed: a failing subscriber must not make its writer think otherwise,
        # nor keep the other subscribers from hearing of them
        if not events:
            return
        for loop, fn in list(self._loop_subscribers):
            self._heard.append((loop, fn, events))
        for fn in list(self._commit_subscribers):
            try:
                fn(events)
            except Exception:
                logger.exception("a subscriber of the session log failed on a commit of %d events; they are committed",
                                 len(events))
        subscribers = list(self._subscribers)
        for event in events:
            for one in subscribers:
                try:
                    one(event)
                except Exception:
                    logger.exception("a subscriber of the session log failed on event %s %d (%s); the event is committed",
                                     event.session_id, event.seq, event.type)

    def write(self, fn: Callable[[Any], T]) -> Future[T]:
        """Run fn(tx) in a transaction on the writer thread; a Future of its result, set once it is committed.

        Writes that arrive while another commits are committed together (a group commit);
        see `_commit_group` for what happens when one of them fails.
        """
        future: Future[T] = Future()
        self._enqueue(_Job(fn, future, None))
        return future

    def _enqueue(self, job: _Job) -> None:
        with self._submit_lock:
            self._check_open()
            self._queue.append(job)
            self._arrived.notify()
            if not self._draining:
                self._draining = True
                self._writer.submit(self._drain)

    def _withdraw(self, job: _Job) -> None:
        """A loop caller no longer wants its write: it is not run unless it has started."""
        with self._submit_lock:
            job.cancelled = True

    def write_soon(self, fn: Callable[[Any], T]) -> asyncio.Future[T]:
        """`write` for a caller on an event loop: a future of the running loop, set once the write is committed.

        The outcomes of a group's writes reach each loop in one callback (one wake-up per group, not one per
        write). Cancelling the future does not stop the write."""
        waiter: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._enqueue(_Job(fn, None, waiter))
        return waiter

    async def awrite(self, fn: Callable[[Any], T]) -> T:
        """`write` awaited without blocking the event loop (cancelled before it runs, it is not run)."""
        waiter: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        job = _Job(fn, None, waiter)
        self._enqueue(job)
        try:
            return await waiter
        except asyncio.CancelledError:
            self._withdraw(job)
            raise

    def prepare(self, type: str, payload: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
        """An event's checked type and payload as (the JSON bytes to store, a fresh copy decoded from them).

        Done by the appending thread, not the writer: the writer's time is what every
        appender shares, so it only assigns seqs, stores and commits.
        """
        if not isinstance(type, str) or type not in self.event_types:
            raise UnknownEventType(f"event type {_show(type)} is not documented in docs/events.md")
        data = encode_payload(payload, self.settings, type)
        # what a reader will get back: canonical JSON, and never the caller's own objects
        return data, orjson.loads(data)

    def append(self, session_id: str, type: str, payload: dict[str, Any]) -> Event:
        """Append one event and wait until it is committed."""
        data, copy = self.prepare(type, payload)
        return self.write(lambda tx: tx.append_prepared(session_id, type, data, copy)).result()

    async def aappend(self, session_id: str, type: str, payload: dict[str, Any]) -> Event:
        """`append` without blocking the event loop."""
        data, copy = self.prepare(type, payload)
        return await self.awrite(lambda tx: tx.append_prepared(session_id, type, data, copy))

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

    # -- managing sessions (log/manage.py) ----------------------------------

    def rename_session(self, session_id: str, title: str, *, auto: bool = False, only_untitled: bool = False) -> Event | None:
        """Set a session's title, recorded as `session_renamed`; only_untitled: only if it has none (None if it had)."""
        check_field("title", title, self.settings, optional=False)
        if not title.strip():
            raise InvalidPayload("the session's title must not be blank")
        return self.write(lambda tx: manage.rename(tx, session_id, title, auto=auto, only_untitled=only_untitled)).result()

    def archive_session(self, session_id: str, archived: bool = True) -> Event:
        """Archive (or, archived=False, unarchive) a session, recorded as `session_archived`."""
        if not isinstance(archived, bool):
            raise ValueError(f"archived must be true or false, not {_show(archived)}")
        return self.write(lambda tx: manage.archive(tx, session_id, archived)).result()

    def delete_session(self, session_id: str, *, busy: Callable[[str], bool] | None = None) -> int:
        """Remove a session's events, summary and row in one transaction; the number of events removed.

        TurnBusy if its log shows an open turn and busy(session_id) is true (default: any open turn).
        """
        return self.write(lambda tx: manage.delete(tx, session_id, busy)).result()

    def fork_session(self, session_id: str, at: int | None = None, *, new_id: str, title: str | None = None) -> Event:
        """A new session `new_id` whose log starts with a copy of session_id's up to seq `at` (cut back to a
        turn boundary: see manage.turn_boundary); returns its session_created (with `forked_from`)."""
        if at is not None and (isinstance(at, bool) or not isinstance(at, int) or at < 1):
            raise ValueError(f"at must be a seq (an integer from 1), not {_show(at)}")
        check_field("id", new_id, self.settings, optional=False)
        check_field("title", title, self.settings, optional=True)
        return self.write(lambda tx: manage.fork(tx, session_id, at, new_id, title)).result()

    def search(self, text: str, *, limit: int = 20, cursor: str | None = None, kind: str | None = None,
               archived: bool | None = None) -> dict[str, Any]:
        """Sessions whose title or messages hold text (any case): {"hits": [...], "next": cursor or None}.

        A hit is the session's row plus `seq` (its first matching event, 0 for the title), `type` and
        `snippet`; newest activity first. Reads user messages, the model's text and tool results' text.
        """
        self._check_open()
        text, limit, offset = manage.check_search(text, limit, cursor)
        if archived is not None and not isinstance(archived, bool):
            raise ValueError(f"archived must be true, false or None, not {_show(archived)}")
        if not encodable(text) or (kind is not None and not valid_id(kind)):
            return {"hits": [], "next": None}
        rows = self._search(text, kind, archived, limit + 1, offset)
        more = len(rows) > limit
        hits = []
        for row, seq, type_, found in rows[:limit]:
            hits.append({**row, "seq": seq, "type": type_, "snippet": manage.snippet(found, text)})
        return {"hits": hits, "next": str(offset + limit) if more else None}

    async def asearch(self, text: str, **kw: Any) -> dict[str, Any]:
        """`search` without blocking the event loop."""
        return await self._off_loop(self.search, text, **kw)

    def _search(self, text: str, kind: str | None, archived: bool | None, limit: int,
                offset: int) -> list[tuple[dict[str, Any], int, str | None, str]]:
        """(row, seq, type, matched text) of matching sessions, newest activity first, offset and limit applied."""
        raise NotImplementedError

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call fn(event) on the writer thread after each commit; returns an unsubscribe."""
        self._subscribers.append(fn)
        return lambda: self._subscribers.remove(fn) if fn in self._subscribers else None

    def subscribe_commits(self, fn: CommitSubscriber, loop: asyncio.AbstractEventLoop | None = None) -> Callable[[], None]:
        """Call fn(events) once per commit, with its events in order; returns an unsubscribe.

        On the writer thread; or, given a `loop`, on that loop, in the one callback per group commit that
        also answers the writes its tasks wait for (no wake-up of its own).
        """
        if loop is not None:
            entry = (loop, fn)
            self._loop_subscribers.append(entry)
            return lambda: self._loop_subscribers.remove(entry) if entry in self._loop_subscribers else None
        self._commit_subscribers.append(fn)
        return lambda: self._commit_subscribers.remove(fn) if fn in self._commit_subscribers else None

    # -- reading -------------------------------------------------------------

    def session(self, session_id: str) -> dict[str, Any]:
        """One session's row (see `sessions`); raises UnknownSession."""
        self._check_open()
        row = self._session(session_id) if valid_id(session_id) else None
        if row is None:
            raise UnknownSession(f"no session {_show(session_id)}")
        return row

    def _session(self, session_id: str) -> dict[str, Any] | None:
        """One session's row, or None."""
        rows = self._sessions(Listing(ids=[session_id]))
        return rows[0] if rows else None

    def sessions(self, ids: list[str] | None = None, kind: str | None = None, **filters: Any) -> list[dict[str, Any]]:
        """Every session (or those of `ids`, of `kind`, ...), oldest first, with its event count, last event and state.

        Read from the sessions summary, which each commit keeps up to date. `filters` are those of
        `sessions_page` (state, text, updated_after, updated_before, order, cursor, limit).
        """
        self._check_open()
        q = listing(ids, kind, **filters)
        return [] if matches_nothing(q) else self._sessions(q)

    def sessions_page(self, *, limit: int = 50, cursor: str | None = None, order: str = "created", **filters: Any) -> dict[str, Any]:
        """One page of sessions: {"sessions": [...], "next": a cursor for the page after, or None}.

        filters: ids, kind, state (new, ended, unfinished), text (in the title, any case),
        updated_after and updated_before (exclusive; datetimes or ISO 8601 strings).
        order: created (oldest first), -created, updated, -updated. ValueError for a bad argument.
        """
        self._check_open()
        q = listing(order=order, cursor=cursor, limit=limit, **filters)
        if matches_nothing(q):
            return {"sessions": [], "next": None}
        rows = self._sessions(dataclasses.replace(q, limit=limit + 1))
        more = len(rows) > limit
        rows = rows[:limit]
        return {"sessions": rows, "next": encode_cursor(order, rows[-1]) if more else None}

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

    async def asessions(self, ids: list[str] | None = None, kind: str | None = None, **filters: Any) -> list[dict[str, Any]]:
        """`sessions` without blocking the event loop."""
        return await self._off_loop(self.sessions, ids, kind, **filters)

    async def asessions_page(self, **kw: Any) -> dict[str, Any]:
        """`sessions_page` without blocking the event loop."""
        return await self._off_loop(self.sessions_page, **kw)

    async def aevents(self, session_id: str, after: int | None = None, **kw: Any) -> list[Event]:
        """`events` without blocking the event loop."""
        return await self._off_loop(self.events, session_id, after, **kw)
