"""What a server adds to the one service: the requests' lifetime and a live feed per session.

The handlers parse a request and run its operation on `Runtime.service` (workbench/service/local.py,
the same in-process service the CLI uses over a host of its own); this module adds what only a
server needs: starting the host on the server's loop, counting the requests being served so that
a stop waits for them, the fan-out of committed events and live deltas to websockets, and closing
in order. DuckDB work happens on the log's writer thread or in worker threads, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..config import from_env
from ..errors import ServerStopping
from ..hands.files import FilesSettings
from ..host import Host
from ..service.local import Local
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
