"""Which turn runs in which session, and whether a session is at work: the one place that knows.

Every turn (a user message, a resume, a dream) runs as an asyncio task owned
here, one per session at a time. Starting, interrupting and waiting are
ordered per session by a lock, so an interrupt that races a message sees the
turn the message started (and closes it properly) instead of slipping in
between its first write and its task.

A session is also at work while a plugin goes on with it between its turns (a
dream between two chunks, an eval attempt being graded): plugins say so through
their `driving` hook, which the host hands in as `drivers`. Everything that asks
"is this session running?" (listings, delete, a server's wake, a new turn's
check) asks here; tests/test_structure.py holds the rest of the code to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import traceback
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from ..errors import TurnBusy, WorkbenchError

log = logging.getLogger("workbench.brain")

Driver = Callable[[str], bool]  # a plugin's `driving` hook: whether it goes on with the session now


class Turns:
    """The running turn of each session, as a task; and whether a session is at work (a turn, or a driver)."""

    def __init__(self, drivers: Sequence[Driver] = ()) -> None:
        self._tasks: dict[str, asyncio.Task] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._drivers = tuple(drivers)
        self._closed = False

    def lock(self, session_id: str) -> asyncio.Lock:
        """The lock that orders starting and interrupting this session's turns."""
        return self._locks.setdefault(session_id, asyncio.Lock())

    def task(self, session_id: str) -> asyncio.Task | None:
        """The session's turn task, if one is running."""
        task = self._tasks.get(session_id)
        return task if task is not None and not task.done() else None

    def running(self, session_id: str) -> bool:
        """Whether a turn of the session runs here now."""
        return self.task(session_id) is not None

    def driven(self, session_id: str) -> bool:
        """Whether a plugin goes on with the session while none of its turns runs (between two of them)."""
        return not self.running(session_id) and any(drives(session_id) for drives in self._drivers)

    def at_work(self, session_id: str) -> bool:
        """Whether the session is at work here: a turn runs, or a plugin goes on with it between turns (its
        `running` flag; it may not be deleted, and a server's wake leaves it to whoever works on it)."""
        return self.running(session_id) or self.driven(session_id)

    def sessions(self) -> list[str]:
        """Sessions with a turn running now."""
        return [sid for sid, t in list(self._tasks.items()) if not t.done()]

    def spawn(self, session_id: str, make: Callable[[], Coroutine[Any, Any, Any]]) -> asyncio.Task:
        """Run `make()` as this session's turn (the caller holds the session's lock and checked none runs)."""
        if self._closed:
            raise TurnBusy("the workbench is shutting down; no new turns start")
        if self.running(session_id):
            raise TurnBusy(f"a turn is already running in session {session_id}; wait for it or interrupt it")
        task = asyncio.get_running_loop().create_task(make(), name=f"workbench-turn-{session_id}")
        self._tasks[session_id] = task
        task.add_done_callback(lambda t: self._done(session_id, t))
        return task

    def _done(self, session_id: str, task: asyncio.Task) -> None:
        if self._tasks.get(session_id) is task:
            del self._tasks[session_id]
        if task.cancelled():
            # an interrupt: the turn recorded it and closed itself (Loop._close, run to its end), or it was
            # cancelled before its first step and wrote nothing (its starter hears so: Brain._spawn); a close
            # that fails ends the task with that failure instead, logged below
            return
        exc = task.exception()
        if isinstance(exc, WorkbenchError):
            log.warning("workbench: turn in session %s stopped: %s", session_id, printable(str(exc)))
        elif exc is not None:
            # the traceback as text with a lone surrogate or NUL escaped: a log file in UTF-8 (or a test runner
            # sending its report to another process) cannot carry the exception's own message when it has one
            trace = "".join(traceback.format_exception(exc))
            log.error("workbench: turn in session %s failed\n%s", session_id, printable(trace.rstrip()))

    async def settle(self, session_id: str, timeout: float = 10.0) -> bool:
        """Wait (up to `timeout`) for a turn that is finishing up; True when none runs any more."""
        task = self.task(session_id)
        if task is not None:
            await asyncio.wait({task}, timeout=timeout)
        return not self.running(session_id)

    async def cancel(self, session_id: str) -> bool:
        """Cancel the session's turn and wait for it to record how it ended; True if one was running."""
        task = self.task(session_id)
        if task is None:
            return False
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            # a turn that fails while closing has its error logged by _done; only the cancel is ours
            await asyncio.wait({task})
        return True

    async def close(self, timeout: float = 30.0) -> None:
        """Cancel every running turn (each records itself as interrupted) and wait for them."""
        self._closed = True
        tasks = [t for t in self._tasks.values() if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)


def printable(text: str) -> str:
    """`text` with a lone surrogate and NUL escaped (`\\ud800`, `\\x00`), whole."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
