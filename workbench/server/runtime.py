"""What the server extension owns at run time: the log, the brain and each session's running turn.

Handlers stay thin: they parse a request and call one method here. Every turn
runs as an asyncio task of the server's event loop; DuckDB work happens on
the log's writer thread or in `asyncio.to_thread`, never on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections import defaultdict
from typing import Any, Callable

from ..brain import Brain
from ..errors import ConfigError, TurnBusy, UnknownSession, WorkbenchError
from ..log import Event, SessionLog

# A watcher hears ("event", Event) for each committed event of its session and
# ("delta", stream_event) for each live model stream event; on the event loop.
Watcher = Callable[[str, Any], None]


class Runtime:
    """One per server: the session log, the brain, and every session's running turn."""

    def __init__(self, log: SessionLog, brain: Brain, *, default_model: str | None = None, logger: logging.Logger | None = None):
        self.log = log
        self.brain = brain
        self.default_model = default_model
        self.logger = logger or logging.getLogger("workbench.server")
        self.tasks: dict[str, asyncio.Task] = {}
        self._jobs: set[asyncio.Task] = set()  # background() side jobs
        self._watchers: dict[str, list[Watcher]] = defaultdict(list)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._unsubscribe = log.subscribe(self._on_commit)
        self._unlisten = brain.listen(self._on_delta)

    # -- live feed -------------------------------------------------------------

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop that watchers and turns live on."""
        self._loop = loop

    def _on_commit(self, event: Event) -> None:
        # Called on the log's writer thread after the commit: hop to the loop.
        # call_soon_threadsafe keeps commit order, so watchers see seqs in order.
        loop = self._loop
        if loop is not None and not loop.is_closed() and self._watchers.get(event.session_id):
            try:
                loop.call_soon_threadsafe(self._dispatch, event.session_id, "event", event)
            except RuntimeError:  # the loop closed in between
                pass

    def _on_delta(self, session_id: str, ev: dict[str, Any]) -> None:
        self._dispatch(session_id, "delta", ev)

    def _dispatch(self, session_id: str, kind: str, obj: Any) -> None:
        for fn in list(self._watchers.get(session_id, ())):
            try:
                fn(kind, obj)
            except Exception:  # one broken watcher must not starve the others
                self.logger.exception("workbench: a stream watcher failed")

    def watch(self, session_id: str, fn: Watcher) -> Callable[[], None]:
        """Hear a session's committed events and live deltas (on the loop); returns an unwatch."""
        self._loop = self._loop or asyncio.get_running_loop()
        self._watchers[session_id].append(fn)

        def unwatch() -> None:
            fns = self._watchers.get(session_id)
            if fns and fn in fns:
                fns.remove(fn)
                if not fns:
                    del self._watchers[session_id]

        return unwatch

    # -- sessions --------------------------------------------------------------

    def running(self, session_id: str) -> bool:
        task = self.tasks.get(session_id)
        return task is not None and not task.done()

    async def session(self, session_id: str) -> dict[str, Any]:
        """The session with `running`; raises UnknownSession."""
        s = await asyncio.to_thread(self.log.session, session_id)
        return {**s, "running": self.running(session_id)}

    async def sessions(self) -> list[dict[str, Any]]:
        rows = await asyncio.to_thread(self.log.sessions)
        return [{**s, "running": self.running(s["id"])} for s in rows]

    async def create_session(self, **kw: Any) -> dict[str, Any]:
        """Create a session (the body was validated before: nothing half-written)."""
        if not kw.get("model"):
            kw["model"] = self.default_model_name()
        s = await asyncio.to_thread(lambda: self.brain.create_session(**kw))
        return {**s, "running": False}

    def default_model_name(self) -> str:
        from ..brain.models import default_model_name

        return self.default_model or default_model_name()

    async def _require(self, session_id: str) -> None:
        if not await asyncio.to_thread(self.log.has_session, session_id):
            raise UnknownSession(f"no session {session_id!r}")

    async def _model_ready(self, session_id: str) -> None:
        """Make the session's model off the loop (an SDK import and client take seconds), failing early."""
        await asyncio.to_thread(self._prepare, session_id)

    def _prepare(self, session_id: str) -> bool:
        """In a worker thread: check the session, make its model; True if its last turn is open.

        One thread hop for all of it: under load each hop costs milliseconds before a turn starts.
        """
        s = self.log.session(session_id)  # UnknownSession
        self.brain.model(s["model"])  # UnknownModel / MissingAPIKey, early
        return s["state"] == "unfinished"  # computed in SQL: no need to read the whole log

    # -- turns -----------------------------------------------------------------

    def _start(self, session_id: str, coro: Any) -> asyncio.Task:
        """Run a turn (or a resume) as a task of its own; the server never waits on it."""
        self._loop = self._loop or asyncio.get_running_loop()
        task = asyncio.get_running_loop().create_task(coro, name=f"workbench-turn-{session_id}")
        self.tasks[session_id] = task

        def done(t: asyncio.Task) -> None:
            if self.tasks.get(session_id) is t:
                del self.tasks[session_id]
            if t.cancelled():
                return
            exc = t.exception()
            if isinstance(exc, WorkbenchError):
                self.logger.warning("workbench: turn in session %s stopped: %s", session_id, exc)
            elif exc is not None:
                self.logger.error("workbench: turn in session %s failed", session_id, exc_info=exc)

        task.add_done_callback(done)
        return task

    async def send(self, session_id: str, text: Any) -> int:
        """Start a turn with the user's text; returns the seq of its user_message."""
        if not isinstance(text, str) or not text.strip():
            raise ConfigError('the body needs "text": a non-empty string')
        busy = f"a turn is already running in session {session_id}; wait for it or interrupt it"
        previous = self.tasks.get(session_id)
        open_turn = await asyncio.to_thread(self._prepare, session_id)  # nothing is written before this
        if previous is not None and not previous.done():
            if open_turn:
                raise TurnBusy(busy)
            # its turn_ended is committed (a client may answer it at once): the task is only
            # finishing up, so wait for it rather than refuse
            await asyncio.wait({previous}, timeout=10)
            if not previous.done():
                raise TurnBusy(busy)
        elif open_turn:
            raise TurnBusy(
                f"session {session_id} has an unfinished turn; resume it (POST .../resume) or interrupt it first"
            )
        if self.running(session_id):  # another request started one while we were reading
            raise TurnBusy(busy)
        got: asyncio.Future = asyncio.get_running_loop().create_future()

        def on(kind: str, obj: Any) -> None:
            if kind == "event" and obj.type == "user_message" and not got.done():
                got.set_result(obj.seq)

        unwatch = self.watch(session_id, on)
        try:
            task = self._start(session_id, self.brain.run_turn(session_id, text))
            # The user_message is dispatched before run_turn goes on past its append,
            # so when the task ends first without it, the turn never started.
            await asyncio.wait({got, task}, return_when=asyncio.FIRST_COMPLETED)
            if got.done():
                return got.result()
            task.result()
            raise TurnBusy(f"the turn in session {session_id} ended before it started")
        finally:
            unwatch()

    async def resume(self, session_id: str) -> bool:
        """Resume a turn that was cut off, in the background; False if there is none."""
        if self.running(session_id):
            raise TurnBusy(f"a turn is already running in session {session_id}")
        if not await asyncio.to_thread(self._prepare, session_id):
            return False
        if self.running(session_id):
            raise TurnBusy(f"a turn is already running in session {session_id}")
        self._start(session_id, self.brain.resume(session_id))
        return True

    async def interrupt(self, session_id: str) -> bool:
        """Interrupt the running turn (and its tool call); True if one was running."""
        await self._require(session_id)
        return await self.brain.interrupt_session(session_id, self.tasks.get(session_id))

    async def wake(self) -> list[str]:
        """Resume, in the background, every session whose turn was cut off (a dead server)."""
        rows = await asyncio.to_thread(self.log.sessions)
        resumed = []
        for s in rows:
            if s["state"] != "unfinished" or self.running(s["id"]):
                continue
            try:
                await self._model_ready(s["id"])
            except WorkbenchError as e:  # e.g. the key is gone: leave the turn for a later resume
                self.logger.warning("workbench: cannot resume session %s: %s", s["id"], e)
                continue
            self._start(s["id"], self.brain.resume(s["id"]))
            resumed.append(s["id"])
        return resumed

    # -- hands -----------------------------------------------------------------

    async def _hands(self, session_id: str) -> Any:
        await self._require(session_id)
        # brain.hands reads the session's frozen config from the log on first use
        return await asyncio.to_thread(self.brain.hands, session_id)

    async def hands_status(self, session_id: str) -> dict[str, Any]:
        hands = await self._hands(session_id)
        return {**hands.status(), "session_id": session_id, "running": self.running(session_id)}

    async def restart_hands(self, session_id: str) -> dict[str, Any]:
        """Replace the session's kernel with a fresh one; returns the new status."""
        hands = await self._hands(session_id)
        status = hands.status()
        if status.get("state") == "busy" and status.get("pid"):
            # A call is running in it: kill the kernel, so the running call ends the way a
            # kernel death does (an error result for the model) and the next call starts fresh.
            try:
                os.kill(int(status["pid"]), signal.SIGKILL)
            except ProcessLookupError:
                pass
            await self.log.aappend(session_id, "hands_restarted", {"generation": (status.get("generation") or 0) + 1, "by": "api", "killed_busy": True})
        else:
            await hands.restart()
            await self.log.aappend(session_id, "hands_restarted", {"generation": hands.status().get("generation"), "by": "api"})
        return await self.hands_status(session_id)

    # -- lifetime --------------------------------------------------------------

    def background(self, coro: Any) -> asyncio.Task:
        """Run a side job (not a turn) that the server waits for before it closes the log."""
        task = asyncio.get_running_loop().create_task(coro)
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)
        return task

    async def close(self, timeout: float = 30.0) -> None:
        """Interrupt running turns (recorded as interrupted), then stop every session's hands."""
        if self._closed:
            return
        self._closed = True
        tasks = [t for t in self.tasks.values() if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        if self._jobs:
            await asyncio.wait(list(self._jobs), timeout=timeout)
        await self.brain.close()
        self._unsubscribe()
        self._unlisten()
