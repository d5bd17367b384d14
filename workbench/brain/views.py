"""What the brain keeps of each session, and how it writes to it.

A session's view is its `Conversation` (brain/request.py): the request and the turn's state as
a fold of the committed events, kept per session (at most `session_cache` of them, the least
recently used of idle sessions dropped) and extended with what is new: the events the brain
appends itself and those others append, heard from the log's subscription after their commit,
so a step reads nothing from the database. A session met first (or again after eviction) is
read once, only the event types a request depends on (brain/coldread.py).

Every write of the brain goes through `append`. An event may be held back (`hold`) to be
committed with the brain's next write for its session, which always follows at once (an
assistant turn waits for its first tool_started, or its turn_ended; a step's last tool result
for the model_request that sends it): a turn with one tool call is 4 commits.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import UnknownSession
from ..log import Event, SessionLog
from .coldread import read_conversation
from .request import Conversation, TurnState
from .turns import Turns, printable

log = logging.getLogger("workbench.brain")

MINIMAL_CHARS = 200  # each string of a closing event written minimal: room for any max_payload_bytes but a tiny one
INBOX_LIMIT = 10_000  # events queued for a kept session nobody steps: then it is forgotten instead


class Views:
    """The kept fold of each session, and the brain's writes to the log (held events, closings)."""

    def __init__(self, log: SessionLog, turns: Turns, cache: int):
        self.log = log
        self.turns = turns  # a session whose turn runs is never evicted
        self.cache = max(1, cache)
        self._kept: dict[str, _View] = {}
        self._clock = 0
        self._held: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        self._unsubscribe = log.subscribe(self._heard)

    async def conversation(self, session_id: str) -> Conversation:
        """The session's Conversation, up to date with the log: events held for the next write are written first."""
        if session_id in self._held:
            t, p = self._held[session_id].pop()
            if not self._held[session_id]:
                del self._held[session_id]
            await self.append(session_id, t, p)
        return await self.folded(session_id)

    async def folded(self, session_id: str) -> Conversation:
        """The session's Conversation with every committed event folded in (events held back are not)."""
        self._clock += 1
        view = self._kept.get(session_id)
        if view is None:
            view = self._kept[session_id] = _View()  # before the read: what commits from now on is heard
            view.used = self._clock
            self._evict()
        view.used = self._clock
        async with view.lock:  # two readers must not both fold in the same events
            if view.conv.frozen is None:
                view.conv = await asyncio.to_thread(read_conversation, self.log, session_id)
            while view.inbox:
                e = view.inbox.popleft()
                if e.seq <= view.conv.seq:
                    continue
                if e.seq != view.conv.seq + 1:  # events committed but not heard (before the view existed)
                    view.conv.feed_all(await self.log.aevents(session_id, view.conv.seq, until=e.seq - 1))
                view.conv.feed(e)
            if view.conv.frozen is None:
                self._kept.pop(session_id, None)
                raise UnknownSession(f"no session {session_id!r}")
            return view.conv

    async def turn_state(self, session_id: str) -> TurnState:
        """Where the session's latest turn stands (a copy)."""
        return (await self.conversation(session_id)).state.copy()

    def _heard(self, event: Event) -> None:
        """A committed event (on the log's writer thread): queued for the session's view, if one is kept."""
        view = self._kept.get(event.session_id)
        if view is not None and event.type == "redacted":
            # events before this one were scrubbed in place: the kept request holds what was removed,
            # so it is dropped and the next step reads the session again from the log
            self._kept.pop(event.session_id, None)
        elif view is not None:
            view.inbox.append(event)  # deque.append is atomic; the view folds it in on the event loop
            if len(view.inbox) > INBOX_LIMIT:
                self._kept.pop(event.session_id, None)

    def _evict(self) -> None:
        """Keep at most `cache` views: drop the least recently used of sessions with no running turn."""
        while len(self._kept) > self.cache:
            idle = [(v.used, sid) for sid, v in list(self._kept.items()) if not self.turns.running(sid)]
            if not idle:
                return
            self._kept.pop(min(idle)[1], None)

    def forget(self, session_id: str) -> None:
        """Drop the session's view (it is read again when it is next used)."""
        self._kept.pop(session_id, None)

    def close(self) -> None:
        """Stop hearing the log and drop every view."""
        self._unsubscribe()
        self._kept.clear()

    # -- writing -------------------------------------------------------------------

    def hold(self, session_id: str, type: str, payload: dict[str, Any]) -> None:
        """Hold an event back: it is committed with the next write for the session, which follows at once."""
        self._held.setdefault(session_id, []).append((type, payload))

    def held(self, session_id: str) -> list[str]:
        """The types of the events held back for the session's next write."""
        return [t for t, _ in self._held.get(session_id, ())]

    async def append(self, session_id: str, type: str, payload: dict[str, Any],
                     before: Callable[[Any], None] | None = None,
                     then: Sequence[tuple[str, dict[str, Any]]] = ()) -> Event:
        """Append (after the events held back) and wait for the commit (`before(tx)` first, `then` after, in the
        same transaction). A cancel arriving meanwhile waits for the write to finish, so whoever handles the cancel
        reads a log that already holds it (never a second turn_ended)."""
        held = self._held.pop(session_id, None)  # popped and submitted with no await between: order is kept
        view = self._kept.get(session_id)
        # where a cold read may start, once a compaction moved it: recorded with the next write, never ahead of it
        mark = view.conv.start_seq if view is not None and view.conv.start_seq > view.marked else None

        def write(tx: Any) -> Event:
            for t, p in held or ():
                tx.append(session_id, t, p)
            if before is not None:
                before(tx)
            event = tx.append(session_id, type, payload)
            for t, p in then:
                tx.append(session_id, t, p)
            if mark is not None:
                tx.set_session(session_id, request_from=mark)
            return event

        done = self.log.write_soon(write)
        try:
            event = await asyncio.shield(done)
        except asyncio.CancelledError:
            if not done.done():
                await asyncio.wait({done})
            raise
        if mark is not None and view is not None:
            view.marked = max(view.marked, mark)
        return event

    async def closing(self, session_id: str, event_type: str, payload: dict[str, Any]) -> Event:
        """Append an event that closes a turn. One the log refuses as it is (a lone surrogate in an error's
        text, one too big for its max_payload_bytes, a write that failed) is written once more, minimal: every
        string made storable (`storable`). One refused even so raises: a turn must never stay open quietly."""
        try:
            return await self.append(session_id, event_type, payload)
        except Exception as refused:
            log.warning("workbench: the log refused %s of session %s as it was (%s); writing it minimal", event_type,
                        session_id, storable(str(refused)))
            try:
                return await self.append(session_id, event_type, map_strings(payload, storable))
            except Exception as e:
                raise RuntimeError(f"the turn of session {session_id} cannot be closed: the log refused its {event_type} "
                                   f"twice, the second time a minimal one ({type(e).__name__}: {storable(str(e))}); "
                                   "it stays open until it is resumed") from refused


class _View:
    """What the brain keeps of one session: its fold, the committed events not yet folded in, and who last used it."""

    def __init__(self) -> None:
        self.conv = Conversation()
        self.inbox: deque[Event] = deque()
        self.lock = asyncio.Lock()
        self.used = 0
        self.marked = 1  # the request_from this process recorded (1: none; after a cold read, recorded once again)


def map_strings(value: Any, fn: Callable[[str], str], skip: tuple[str, ...] = ()) -> Any:
    """A copy of a JSON value with fn applied to every string (not to a string under a key in `skip`, e.g. image data)."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        return [map_strings(v, fn, skip) for v in value]
    if isinstance(value, dict):
        return {k: (v if k in skip and isinstance(v, str) else map_strings(v, fn, skip)) for k, v in value.items()}
    return value


def storable(text: str) -> str:
    """Text every log stores and every terminal shows: a lone surrogate and NUL escaped (`\\ud800`, `\\x00`),
    at most MINIMAL_CHARS characters."""
    safe = printable(text)
    return safe if len(safe) <= MINIMAL_CHARS else safe[:MINIMAL_CHARS - 3] + "..."
