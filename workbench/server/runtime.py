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
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..config import from_env
from ..errors import ConfigError, ServerStopping, TurnBusy
from ..hands.files import FilesSettings
from ..host import Host
from ..log import Event
from ..service.local import Local
from ..usage import session_usage
from .fanout import Fanout, Watcher

STOPPING = "the workbench server is shutting down; try again when it is back"


class Runtime:
    """One per server: the host, and every session's watchers."""

    def __init__(self, host: Host, *, logger: logging.Logger | None = None, files: FilesSettings | None = None):
        self.host = host
        self.files_settings = files or from_env(FilesSettings, prefix="WORKBENCH_FILES_")
        self.log = host.log
        self.brain = host.brain
        self.logger = logger or logging.getLogger("workbench.server")
        self.fanout = Fanout(self.logger)  # every session's websockets (server/fanout.py)
        # the operations written once, on the service: the server adds its requests' lifetime and the live feed
        self.service = Local(host, files=self.files_settings, logger=self.logger)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started: asyncio.Future | None = None
        self.stopping = False
        self._serving = 0  # requests being served now
        self._idle: asyncio.Event | None = None
        self._unsubscribe: Callable[[], None] = lambda: None  # hearing the log's commits, from `ready` on
        self._unlisten = self.brain.listen(self._on_delta)
        self._unlisten_output = self.brain.listen_output(self._on_output)

    # -- live feed -------------------------------------------------------------

    async def ready(self) -> None:
        """Start the host once, on the server's event loop: by the extension's start hook, else by the first request.

        (A server started without its start hooks, as pytest-jupyter does, still gets a started host.)
        """
        if self.stopping:
            raise ServerStopping(STOPPING)
        if self._started is None:
            self._loop = asyncio.get_running_loop()
            # on the loop, in the callback that also answers the brain's writes: no wake-up of its own
            self._unsubscribe = self.log.subscribe_commits(self.fanout.events, loop=self._loop)
            self._started = asyncio.ensure_future(self.service.ready())
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

    def _on_delta(self, session_id: str, ev: dict[str, Any]) -> None:
        self.fanout.delta(session_id, ev)

    def _on_output(self, session_id: str, message: dict[str, Any]) -> None:
        self.fanout.output(session_id, message)

    def live_output(self, session_id: str) -> list[dict[str, Any]]:
        """The output so far of the session's running calls (one snapshot message each; not stored)."""
        return self.brain.live.snapshots(session_id)

    def watch(self, session_id: str, fn: Watcher) -> Callable[[], None]:
        """Hear a session's committed events, live deltas and output (on the loop: server/fanout.py); an unwatch."""
        self._loop = self._loop or asyncio.get_running_loop()
        return self.fanout.watch(session_id, fn)

    # -- sessions --------------------------------------------------------------

    async def session(self, session_id: str) -> dict[str, Any]:
        """The session with `running`; raises UnknownSession."""
        s = await asyncio.to_thread(self.log.session, session_id)
        return {**s, "running": self.host.running(session_id)}

    async def sessions(self) -> list[dict[str, Any]]:
        rows = await asyncio.to_thread(self.log.sessions)
        return [{**s, "running": self.host.running(s["id"])} for s in rows]

    async def sessions_page(self, limit: int | None, **filters: Any) -> dict[str, Any]:
        """{"sessions": [...], "next": cursor or None}: a page (or, without limit, every match) of the summary;
        ConfigError (400) for a filter the log refuses."""
        def read() -> dict[str, Any]:
            try:
                if limit is None:
                    return {"sessions": self.log.sessions(**filters), "next": None}
                return self.log.sessions_page(limit=limit, **filters)
            except ValueError as e:
                raise ConfigError(str(e)) from None

        page = await asyncio.to_thread(read)
        page["sessions"] = [{**s, "running": self.host.running(s["id"])} for s in page["sessions"]]
        return page

    async def events(self, session_id: str, after: int | None = None, limit: int | None = None) -> list[Event]:
        """A page of a session's events; UnknownSession."""
        def read() -> list[Event]:
            self.log.session(session_id)
            return self.log.events(session_id, after, limit=limit)

        return await asyncio.to_thread(read)

    async def query(self, sql: str, params: list[Any]) -> Any:
        """One read-only SQL statement over the log: a QueryResult (columns, rows, truncated)."""
        return await asyncio.to_thread(self.log.query, sql, params)

    # -- managing sessions (docs/api.md, "Managing sessions") -------------------

    async def change_session(self, session_id: str, title: str | None, archived: bool | None) -> dict[str, Any]:
        """Rename and/or archive a session (each an event); its row after."""
        if title is not None:
            await asyncio.to_thread(self.log.rename_session, session_id, title)
        if archived is not None:
            await asyncio.to_thread(self.log.archive_session, session_id, archived)
        return await self.session(session_id)

    async def delete_session(self, session_id: str) -> dict[str, Any]:
        """Remove a session's events and rows and stop its hands; TurnBusy (409) while a turn runs."""
        await self.session(session_id)  # 404 first
        if self.host.running(session_id):
            raise TurnBusy(f"a turn is running in session {session_id}; interrupt it before deleting the session")
        # its hands first: stopping them records hands_stopped, which must not land after the delete
        await self.brain.close_session(session_id)
        # in the writer's transaction again: a turn that started since is seen there (its user_message is committed)
        n = await asyncio.to_thread(self.log.delete_session, session_id, busy=self.host.running)
        await self.brain.close_session(session_id)  # whatever a request made of it meanwhile
        return {"deleted": session_id, "events": n}

    async def fork_session(self, session_id: str, seq: int | None, new_id: str | None, title: str | None) -> dict[str, Any]:
        """A new session starting with a copy of this one's log up to seq (cut back to a turn boundary)."""
        new_id = new_id or uuid.uuid4().hex[:12]

        def fork() -> dict[str, Any]:
            try:
                self.log.fork_session(session_id, seq, new_id=new_id, title=title)
            except ValueError as e:
                raise ConfigError(str(e)) from None
            return self.log.session(new_id)

        return {**await asyncio.to_thread(fork), "running": False}

    async def search(self, text: str, **kw: Any) -> dict[str, Any]:
        """Sessions whose title or messages hold text: {"hits", "next"}; ConfigError for a bad argument."""
        def read() -> dict[str, Any]:
            try:
                return self.log.search(text, **kw)
            except ValueError as e:
                raise ConfigError(str(e)) from None

        page = await asyncio.to_thread(read)
        page["hits"] = [{**h, "running": self.host.running(h["id"])} for h in page["hits"]]
        return page

    async def usage(self, session_id: str) -> dict[str, Any]:
        """Tokens and estimated cost per turn and in total, from the session's assistant turns."""
        def read() -> dict[str, Any]:
            row = self.log.session(session_id)
            events = self.log.events(session_id, types=["session_created", "user_message", "assistant_turn"])
            return {"session_id": session_id, **session_usage(events, self.host.prices, row["model"])}

        return await asyncio.to_thread(read)

    # -- turns -----------------------------------------------------------------

    async def send(self, session_id: str, text: str, key: str | None = None) -> int:
        """Start a turn with the user's text; returns the seq of its committed user_message (the first one's,
        for the same message sent again with the same idempotency `key`: nothing starts)."""
        return await self.service.send(session_id, text, key=key)

    async def resume(self, session_id: str) -> bool:
        """Resume a cut-off turn in the background; False if there is none. A session of a kind a
        plugin resumes itself (a dream) is resumed by it, in the background, as a whole."""
        return await self.service.resume(session_id)

    async def interrupt(self, session_id: str) -> bool:
        """Interrupt the running turn (and its tool call); True if one was running."""
        return await self.service.interrupt(session_id)

    async def wake(self) -> list[str]:
        """Resume, in the background, every session whose turn was cut off (a dead server)."""
        return await self.service.wake()

    async def hands_status(self, session_id: str) -> dict[str, Any]:
        return await self.service.hands(session_id)

    async def restart_hands(self, session_id: str) -> dict[str, Any]:
        """Replace the session's kernel with a fresh one; returns the new status."""
        return await self.service.restart_hands(session_id)

    async def close_hands(self, session_id: str) -> dict[str, Any]:
        """Stop the session's kernel and its spare (its workspace stays; the next call starts a kernel again).

        A running call is interrupted and answered first (see KernelHands.close); returns the status
        with `closed`: whether a kernel was running.
        """
        return await self.service.close_hands(session_id)

    # -- files in the session's workspace -----------------------------------------

    async def put_file(self, session_id: str, path: str, source: Any, *, name: str, kind: str) -> dict[str, Any]:
        """Write `source` to `path` in the session's workspace (made if it has none yet) and record a
        `file_attached` event; returns the event's payload with its seq."""
        return await self.service.put_file(session_id, path, source, name=name, kind=kind)

    async def list_files(self, session_id: str) -> dict[str, Any]:
        """{"files": [...], "truncated": bool, "workspace": whether there is one yet}."""
        return await self.service.files(session_id)

    async def file_root(self, session_id: str, path: str) -> Any:
        """The workspace directory holding `path` (checked); NoSuchFile when the session has none yet."""
        return await self.service.file_root(session_id, path)

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
        self.fanout.close()
        self._unsubscribe()
        self._unlisten()
        self._unlisten_output()


__all__ = ["STOPPING", "Runtime", "ServerStopping", "Watcher"]
