"""REST and websocket handlers of the workbench API (docs/api.md).

Every verb is behind Jupyter's authentication (and XSRF rules for cookie
auth). Errors are `{"error": "..."}` with a 4xx status; a request is checked
completely before anything is written.
"""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any, Awaitable, Callable

from jupyter_server.auth.decorator import ws_authenticated
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web
from tornado.websocket import WebSocketClosedError, WebSocketHandler

from ..errors import DatabaseLocked, WorkbenchError
from . import bodies
from .runtime import Runtime


def status_of(exc: WorkbenchError) -> int:
    """The HTTP status of an error of ours (each error class says which: workbench/errors.py)."""
    return exc.http_status


def api(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[None]]:
    """Turn workbench errors into a 4xx with a JSON error body."""

    @functools.wraps(fn)
    async def wrapper(self: "WorkbenchHandler", *args: Any, **kwargs: Any) -> None:
        try:
            await self.runtime.ready()
            await fn(self, *args, **kwargs)
        except WorkbenchError as e:
            self.set_status(status_of(e))
            self.finish({"error": str(e)})

    return wrapper


def runtime_of(handler: web.RequestHandler) -> Runtime:
    """The server's Runtime; DatabaseLocked (503) when the extension could not open the log."""
    runtime = handler.settings.get("workbench_runtime")
    if runtime is None:
        raise DatabaseLocked(handler.settings.get("workbench_error") or "the workbench extension did not start (see the server log)")
    return runtime


class WorkbenchHandler(ExtensionHandlerMixin, APIHandler):
    """Base of the REST handlers: JSON in, JSON out, errors as {"error": ...}."""

    @property
    def runtime(self) -> Runtime:
        return runtime_of(self)

    def body(self) -> Any:
        return bodies.decode(self.request.body)

    def reply(self, obj: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj, default=str))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Tornado's own errors (403, 404, 405, ...) in the same JSON shape as ours."""
        self.set_header("Content-Type", "application/json")
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = self._reason
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        elif status_code >= 500:
            message = "internal error in the workbench server (see the server log)"
        self.finish(json.dumps({"error": message}))


class SessionsHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def get(self) -> None:
        self.reply({"sessions": await self.runtime.sessions()})

    @web.authenticated
    @api
    async def post(self) -> None:
        runtime = self.runtime
        # off the loop: checking a model name may import and set up the Anthropic SDK (seconds)
        kw = await asyncio.to_thread(bodies.session_body, self.body(), runtime.host)
        self.reply(await runtime.create_session(**kw), 201)


class SessionHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def get(self, id: str) -> None:
        self.reply(await self.runtime.session(id))


class MessagesHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def post(self, id: str) -> None:
        text = bodies.message_body(self.body())
        seq = await self.runtime.send(id, text)
        self.reply({"session_id": id, "seq": seq}, 202)


class EventsHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def get(self, id: str) -> None:
        after = bodies.int_arg(self.get_query_argument("after", None), "after")
        limit = bodies.int_arg(self.get_query_argument("limit", None), "limit", minimum=1, maximum=100_000)
        events = await self.runtime.events(id, after, limit=limit)  # 404 for an unknown session
        last = events[-1].seq if events else (after or 0)
        self.reply({"events": [e.to_json() for e in events], "last_seq": last})


class InterruptHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def post(self, id: str) -> None:
        self.reply({"interrupted": await self.runtime.interrupt(id)})


class ResumeHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def post(self, id: str) -> None:
        self.reply({"resumed": await self.runtime.resume(id)}, 202)


class HandsHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def get(self, id: str) -> None:
        self.reply(await self.runtime.hands_status(id))


class HandsRestartHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def post(self, id: str) -> None:
        self.reply(await self.runtime.restart_hands(id))


class QueryHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def post(self) -> None:
        sql, params = bodies.query_body(self.body())
        res = await self.runtime.query(sql, params)
        self.reply({"columns": res.columns, "rows": [list(r) for r in res.rows], "truncated": res.truncated})


class StatusHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def get(self) -> None:
        runtime_of(self)  # 503 with the reason when the extension could not open the log
        self.reply(self.extensionapp.status())


class StreamHandler(WebSocketMixin, WebSocketHandler, JupyterHandler):
    """Every committed event after `after`, then each as it is committed, plus live deltas.

    No gap and no duplicate between the stored backlog and the live feed: the
    watcher is registered first and buffers; then the backlog is read and
    sent; then the buffer is drained, skipping seqs already sent.
    """

    def set_default_headers(self) -> None:
        """JupyterHandler's headers make no sense for a websocket."""

    @ws_authenticated
    async def get(self, id: str) -> None:
        try:
            runtime = runtime_of(self)
            await runtime.ready()
            self.after = bodies.int_arg(self.get_query_argument("after", None), "after") or 0
            await runtime.session(id)
        except WorkbenchError as e:
            self.set_status(status_of(e))
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"error": str(e)}))
            return
        await super().get(id)

    async def open(self, id: str) -> None:  # type: ignore[override]
        super().open()  # the ping loop of WebSocketMixin
        runtime = runtime_of(self)
        self.session_id, self._last, self._live = id, self.after, False
        self._buffer: list[tuple[str, Any]] = []
        self._unwatch = runtime.watch(id, self._on_live)
        try:
            backlog = await runtime.events(id, self.after)
        except Exception:
            self.close(1011, "cannot read the session log")
            raise
        for e in backlog:
            self._send("event", e)
        buffered, self._buffer = self._buffer, []
        for kind, obj in buffered:
            self._send(kind, obj)
        self._live = True

    def _on_live(self, kind: str, obj: Any) -> None:
        if self._live:
            self._send(kind, obj)
        else:
            self._buffer.append((kind, obj))

    def _send(self, kind: str, obj: Any) -> None:
        if kind == "event":
            if obj.seq <= self._last:
                return
            self._last = obj.seq
            msg = {"kind": "event", "event": obj.to_json()}
        else:
            msg = {"kind": "delta", "session_id": self.session_id, "event": obj}
        try:
            self.write_message(json.dumps(msg, default=str))
        except WebSocketClosedError:
            self._stop()

    def on_message(self, message: Any) -> None:
        """Clients do not need to send anything; messages are ignored."""

    def _stop(self) -> None:
        unwatch = getattr(self, "_unwatch", None)
        if unwatch is not None:
            unwatch()
            self._unwatch = None

    def on_close(self) -> None:
        self._stop()
