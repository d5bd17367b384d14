"""The session log as the brain and the server see it: a small protocol, two implementations.

`DuckDBLog` keeps the log in a DuckDB file; `MemoryLog` is its in-memory twin
for fast tests. Both pass one conformance suite (tests/log/test_conformance.py):

- seqs are 1, 2, 3, ... per session; `(session_id, seq)` is never reused;
- `write(fn)` runs fn in a transaction on the log's one writer thread; if fn
  raises, nothing it wrote is kept; writes that arrive while another commits are
  committed together in the next transaction (a group commit), and each caller's
  Future is set only once its own write is committed; a write that fails fails
  alone (the rest of its group is committed without it);
- a subscriber hears of an event only after its commit, never of a rolled-back
  one; a subscriber that raises is logged, not passed on to the writer;
- `tx.scrub(targets, replacement)` is the one change to committed events: it
  replaces texts in payloads and titles in place, and `compact()` then leaves
  no old copy in storage (log/scrub.py; docs/events.md, "Redaction");
- payloads are strict JSON within the limits of `LogSettings`; what is read back
  is a fresh copy, never the stored object.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from .events import Event

T = TypeVar("T")
Subscriber = Callable[[Event], None]
CommitSubscriber = Callable[[list[Event]], None]


@runtime_checkable
class Tx(Protocol):
    """A write transaction, handed to `write(fn)` on the writer thread."""

    def append(self, session_id: str, type: str, payload: dict[str, Any]) -> Event:
        """Append an event; it is committed with the rest of the transaction, or not at all."""
        ...

    def events(
        self,
        session_id: str,
        after: int | None = None,
        *,
        until: int | None = None,
        types: list[str] | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """Like `SessionLog.events`, including what this transaction appended so far."""
        ...

    def scrub(self, targets: Sequence[str], replacement: str) -> dict[str, list[int]]:
        """Replace every copy of the targets in stored payloads and session titles, in place; the seqs changed
        by session (the one exception to append-only: the caller appends a `redacted` tombstone to each)."""
        ...


@runtime_checkable
class SessionLog(Protocol):
    """Sessions and their append-only events."""

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
        ...

    def append(self, session_id: str, type: str, payload: dict[str, Any]) -> Event:
        """Append one event and wait until it is committed."""
        ...

    async def aappend(self, session_id: str, type: str, payload: dict[str, Any]) -> Event:
        """`append` without blocking the event loop."""
        ...

    def write(self, fn: Callable[[Tx], T]) -> Future[T]:
        """Run fn(tx) in one transaction on the writer thread; a Future of its result."""
        ...

    def write_soon(self, fn: Callable[[Tx], T]) -> asyncio.Future[T]:
        """`write` from an event loop: a future of that loop, set once committed (one wake-up per group commit)."""
        ...

    async def awrite(self, fn: Callable[[Tx], T]) -> T:
        """`write` awaited without blocking the event loop."""
        ...

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call fn(event) on the writer thread after each commit; returns an unsubscribe."""
        ...

    def subscribe_commits(self, fn: CommitSubscriber, loop: asyncio.AbstractEventLoop | None = None) -> Callable[[], None]:
        """Call fn(events) once per commit (its events in order), on the writer thread or on `loop`; an unsubscribe."""
        ...

    def has_session(self, session_id: str) -> bool:
        """Whether a session with that id exists."""
        ...

    def session(self, session_id: str) -> dict[str, Any]:
        """One row of `sessions()`; raises UnknownSession."""
        ...

    def session_kind(self, session_id: str) -> str:
        """A session's kind, read once and then known (a kind never changes); raises UnknownSession."""
        ...

    def sessions(self, ids: list[str] | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        """Sessions oldest first: id, created_at, updated_at, title, model, kind, events, last_seq, last_type, state."""
        ...

    def sessions_page(self, *, limit: int = 50, cursor: str | None = None, order: str = "created",
                      **filters: Any) -> dict[str, Any]:
        """One page of sessions: {"sessions": [...], "next": a cursor for the page after, or None}."""
        ...

    def events(
        self,
        session_id: str,
        after: int | None = None,
        *,
        until: int | None = None,
        types: list[str] | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """Events of a session with after < seq <= until, of the given types, in seq order."""
        ...

    async def ahas_session(self, session_id: str) -> bool:
        """`has_session` without blocking the event loop."""
        ...

    async def asession(self, session_id: str) -> dict[str, Any]:
        """`session` without blocking the event loop."""
        ...

    async def asessions(self, ids: list[str] | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        """`sessions` without blocking the event loop."""
        ...

    async def aevents(self, session_id: str, after: int | None = None, **kw: Any) -> list[Event]:
        """`events` without blocking the event loop."""
        ...

    def sql(self) -> SqlLog | None:
        """The SQL capability (a plugin's own tables beside the events), when this log offers one."""
        ...

    def compact(self) -> None:
        """After a scrub, leave no copy of what it replaced in the log's storage (a file's free blocks)."""
        ...

    def close(self) -> None:
        """Finish pending writes and release the log; safe to call twice."""
        ...


class ManagedLog(SessionLog, Protocol):
    """Session administration (the service's rename, archive, delete, fork and search): what a host's log offers
    beyond what the brain and the plugins use (`SessionLog`)."""

    def rename_session(self, session_id: str, title: str, *, auto: bool = False,
                       only_untitled: bool = False) -> Event | None:
        """Set a session's title, recorded as `session_renamed`; only_untitled: only if it has none (None if it had)."""
        ...

    def archive_session(self, session_id: str, archived: bool = True) -> Event:
        """Archive (or, archived=False, unarchive) a session, recorded as `session_archived`."""
        ...

    def delete_session(self, session_id: str, *, busy: Callable[[str], bool] | None = None) -> int:
        """Remove a session's events, summary and row in one transaction; the number of events removed."""
        ...

    def fork_session(self, session_id: str, at: int | None = None, *, new_id: str, title: str | None = None) -> Event:
        """A new session `new_id` whose log starts with a copy of session_id's up to seq `at`; its session_created."""
        ...

    def search(self, text: str, *, limit: int = 20, cursor: str | None = None, kind: str | None = None,
               archived: bool | None = None) -> dict[str, Any]:
        """Sessions whose title or messages hold text (any case): {"hits": [...], "next": cursor or None}."""
        ...


class SqlTx(Tx, Protocol):
    """A write transaction of a log that keeps SQL tables beside its events (`SqlLog`)."""

    def execute(self, sql: str, params: Iterable[Any] = ()) -> Any:
        """Run SQL in this transaction; committed with its events, or not at all."""
        ...


class SqlLog(SessionLog, Protocol):
    """The SQL capability a log may offer (`log.sql()`): a plugin keeps tables of its own beside the events, written
    in the log's transactions (`write(fn)` gives `fn` a `SqlTx`) and read through a cursor of its own."""

    read_only: bool
    path: Path  # the database file

    def write(self, fn: Callable[[Any], T]) -> Future[T]:
        """Run `fn(tx)` in a transaction on the writer thread (`tx` is a `SqlTx`); its result once committed."""
        ...

    def cursor(self) -> Any:
        """A DB-API connection of its own for reading from the calling thread."""
        ...

    def query(self, sql: str, params: Iterable[Any] = ()) -> Any:
        """Read-only SQL over the log (a `QueryResult`: columns, rows, truncated), within the query limits."""
        ...
