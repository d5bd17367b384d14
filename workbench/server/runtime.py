"""What the server's handlers call: the host's sessions, turns and hands, and a live feed per session.

Handlers stay thin: they parse a request and call one public method here.
Turns are the brain's (it owns them); this adds what only a server needs:
the `running` flag on session rows, the fan-out of committed events and live
deltas to websockets, and waking cut-off turns at start. DuckDB work happens
on the log's writer thread or in worker threads, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..brain import turn_state
from ..errors import ServerStopping, WorkbenchError
from ..host import Host
from ..log import Event

# A watcher hears ("event", Event) for each committed event of its session,
# ("delta", stream_event) for each live model stream event, and ("closed", None)
# once when the server stops; on the event loop.
Watcher = Callable[[str, Any], None]

STOPPING = "the workbench server is shutting down; try again when it is back"


class Runtime:
    """One per server: the host, and every session's watchers."""

    def __init__(self, host: Host, *, logger: logging.Logger | None = None):
        self.host = host
        self.log = host.log
        self.brain = host.brain
        self.logger = logger or logging.getLogger("workbench.server")
        self._watchers: dict[str, list[Watcher]] = defaultdict(list)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started: asyncio.Future | None = None
        self.stopping = False
        self._serving = 0  # requests being served now
        self._idle: asyncio.Event | None = None
        self._unsubscribe = self.log.subscribe(self._on_commit)
        self._unlisten = self.brain.listen(self._on_delta)

    # -- live feed -------------------------------------------------------------

    async def ready(self) -> None:
        """Start the host once, on the server's event loop: by the extension's start hook, else by the first request.

        (A server started without its start hooks, as pytest-jupyter does, still gets a started host.)
        """
        if self.stopping:
            raise ServerStopping(STOPPING)
        if self._started is None:
            self._loop = asyncio.get_running_loop()
            self._started = asyncio.ensure_future(self.host.start())
        await asyncio.shield(self._started)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Count a request being served, so that `close` lets it finish; ServerStopping once the server stops."""
        if self.stopping:
            raise ServerStopping(STOPPING)
        self._serving += 1
        try:
            yield
        finally:
            self._serving -= 1
            if not self._serving and self._idle is not None:
                self._idle.set()

    def _on_commit(self, event: Event) -> None:
        # Called on the log's writer thread after the commit: hop to the loop.
        # call_soon_threadsafe keeps commit order, so watchers see seqs in order.
        loop = self._loop
        if loop is not None and not loop.is_closed() and self._watchers.get(event.session_id):
            with contextlib.suppress(RuntimeError):  # the loop closed in between
                loop.call_soon_threadsafe(self._dispatch, event.session_id, "event", event)

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

    async def session(self, session_id: str) -> dict[str, Any]:
        """The session with `running`; raises UnknownSession."""
        s = await asyncio.to_thread(self.log.session, session_id)
        return {**s, "running": self.brain.running(session_id)}

    async def sessions(self) -> list[dict[str, Any]]:
        rows = await asyncio.to_thread(self.log.sessions)
        return [{**s, "running": self.brain.running(s["id"])} for s in rows]

    async def events(self, session_id: str, after: int | None = None, limit: int | None = None) -> list[Event]:
        """A page of a session's events; UnknownSession."""
        def read() -> list[Event]:
            self.log.session(session_id)
            return self.log.events(session_id, after, limit=limit)

        return await asyncio.to_thread(read)

    async def create_session(self, **kw: Any) -> dict[str, Any]:
        """Create a session (the body was validated before: nothing half-written)."""
        kw["model"] = kw.get("model") or self.host.models.default_name()
        s = await asyncio.to_thread(lambda: self.brain.create_session(**kw))
        return {**s, "running": False}

    async def query(self, sql: str, params: list[Any]) -> Any:
        """One read-only SQL statement over the log: a QueryResult (columns, rows, truncated)."""
        return await asyncio.to_thread(self.log.query, sql, params)

    # -- turns -----------------------------------------------------------------

    async def send(self, session_id: str, text: str) -> int:
        """Start a turn with the user's text; returns the seq of its committed user_message."""
        return (await self.brain.start_turn(session_id, text)).seq

    async def resume(self, session_id: str) -> bool:
        """Resume a cut-off turn in the background; False if there is none."""
        return await self.brain.start_resume(session_id)

    async def interrupt(self, session_id: str) -> bool:
        """Interrupt the running turn (and its tool call); True if one was running."""
        return await self.brain.interrupt(session_id)

    async def wake(self) -> list[str]:
        """Resume, in the background, every session whose turn was cut off (a dead server)."""
        rows = await asyncio.to_thread(self.log.sessions)
        resumed = []
        for s in rows:
            if s["state"] != "unfinished" or self.brain.running(s["id"]):
                continue
            try:
                await asyncio.to_thread(self.host.models.check, s["model"])
                if await self.brain.start_resume(s["id"]):
                    resumed.append(s["id"])
            except WorkbenchError as e:  # e.g. the key is gone: leave the turn for a later resume
                self.logger.warning("workbench: cannot resume session %s: %s", s["id"], e)
        return resumed

    # -- hands -----------------------------------------------------------------

    async def hands_status(self, session_id: str) -> dict[str, Any]:
        hands = await self.brain.hands(session_id)
        return {**hands.status(), "session_id": session_id, "running": self.brain.running(session_id)}

    async def restart_hands(self, session_id: str) -> dict[str, Any]:
        """Replace the session's kernel with a fresh one; returns the new status."""
        hands = await self.brain.hands(session_id)
        if await self._call_in_flight(session_id):
            # A call is running (or its kernel is starting for it): kill the kernel once it has one, so the
            # call ends the way a kernel death does (an error result for the model) and the next call starts fresh.
            status = await self._kernel_of_call(session_id, hands)
            if status.get("pid"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(status["pid"]), signal.SIGKILL)
                generation = (status.get("generation") or 0) + 1
                await self.log.aappend(session_id, "hands_restarted", {"generation": generation, "by": "api", "killed_busy": True})
                return await self.hands_status(session_id)
        await hands.restart()
        await self.log.aappend(session_id, "hands_restarted", {"generation": hands.status().get("generation"), "by": "api"})
        return await self.hands_status(session_id)

    async def _call_in_flight(self, session_id: str) -> bool:
        if not self.brain.running(session_id):
            return False
        st = turn_state(await self.brain.events(session_id))
        return bool(st.started - st.answered)

    async def _kernel_of_call(self, session_id: str, hands: Any, wait: float = 60.0) -> dict[str, Any]:
        """The hands' status once the running call's kernel runs it (busy, with a pid); {} if the call ended first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while loop.time() < deadline and await self._call_in_flight(session_id):
            status = hands.status()
            if status.get("state") == "busy" and status.get("pid"):
                return status
            await asyncio.sleep(0.05)
        return {}

    # -- lifetime --------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return self.host.status()

    async def close(self, grace: float = 5.0) -> None:
        """Refuse new requests (503), give those being served `grace` seconds, close the streams,
        stop hearing the log and the brain (the host closes everything else, after this)."""
        self.stopping = True
        if self._serving:
            self._idle = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace)
        for sid in list(self._watchers):
            self._dispatch(sid, "closed", None)
        self._unsubscribe()
        self._unlisten()


__all__ = ["STOPPING", "Runtime", "ServerStopping", "Watcher"]
