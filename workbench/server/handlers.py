"""REST and websocket handlers of the workbench API (docs/api.md).

Every verb is behind Jupyter's authentication (and XSRF rules for cookie
auth). A request is checked completely before anything is written
(bodies.py); every error, ours or tornado's, is `{"error": "<one line>"}` with
its status, which the error itself carries (`status_of`). While the server
stops, every request gets a 503, never a 500.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any

from jupyter_server.auth.decorator import ws_authenticated
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web
from tornado.websocket import WebSocketClosedError, WebSocketHandler

from ..errors import BodyTooLarge, DatabaseLocked, UnknownSession, WorkbenchError
from ..service.local import Local
from . import bodies
from .fanout import wire
from .runtime import STOPPING, Runtime, ServerStopping

MAX_ERROR_CHARS = 2000


def status_of(exc: WorkbenchError) -> int:
    """The HTTP status of an error of ours (each error class says which: workbench/errors.py)."""
    return exc.http_status


def runtime_of(handler: web.RequestHandler) -> Runtime:
    """The server's Runtime; DatabaseLocked (503) when the extension could not open the log."""
    runtime = handler.settings.get("workbench_runtime")
    if runtime is None:
        raise DatabaseLocked(handler.settings.get("workbench_error") or "the workbench extension did not start (see the server log)")
    return runtime


def send_error(handler: web.RequestHandler, status: int, message: str) -> None:
    """Finish the request with `{"error": message}` (one line) and `status`, unless it is finished already."""
    if handler._finished:
        return
    handler.set_status(status)
    handler.set_header("Content-Type", "application/json")
    handler.finish(json.dumps({"error": " ".join(message.split())[:MAX_ERROR_CHARS] or f"HTTP {status}"}))


def tornado_error(handler: web.RequestHandler, status_code: int, kwargs: dict[str, Any]) -> None:
    """Tornado's own errors (403, 404, 405, a 500 from a bug) in the same JSON shape as ours."""
    exc = kwargs.get("exc_info", (None, None, None))[1]
    message = handler._reason
    if isinstance(exc, web.HTTPError) and exc.log_message:
        message = exc.log_message % exc.args if exc.args else exc.log_message
    elif status_code >= 500:
        message = "internal error in the workbench server (see the server log)"
    send_error(handler, status_code, message)


def api(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[None]]:
    """Check the path id and query arguments, run the handler, and answer errors as JSON with their status.

    An unexpected exception is a bug and a 500 (tornado logs it), except while the server stops:
    then whatever a request was doing may fail under it, and it gets a 503.
    """

    @functools.wraps(fn)
    async def wrapper(self: WorkbenchHandler, *args: Any, **kwargs: Any) -> None:
        runtime = None
        try:
            if "id" in kwargs:
                bodies.path_id(kwargs["id"], self.unknown, self.what)
            self.query = bodies.query_args(self.args, self.request.query_arguments)
            runtime = self.runtime
            async with runtime.serving():
                await runtime.ready()
                await fn(self, *args, **kwargs)
        except WorkbenchError as e:
            send_error(self, status_of(e), str(e))
        except Exception:
            if runtime is None or not runtime.stopping:
                raise
            self.log.info("workbench: a request failed while the server stopped", exc_info=True)
            send_error(self, ServerStopping.http_status, STOPPING)

    return wrapper


@web.stream_request_body
class WorkbenchHandler(ExtensionHandlerMixin, APIHandler):
    """Base of the REST handlers: JSON in, JSON out, errors as {"error": ...}.

    Bodies are streamed: at most `max_body` bytes are kept, the rest of a bigger one
    is read and dropped, and the request gets a 413 (a connection cut mid-upload
    would leave the client without an answer). Nothing is answered before the body
    is read, but a verb tornado does not know (and that answer says Connection: close).
    """

    max_body = bodies.MAX_BODY_BYTES
    args: type[bodies.Body] = bodies.NoArgs  # the query arguments this route takes
    unknown: type[WorkbenchError] = UnknownSession  # the 404 of an id in the path
    what = "session"
    query: Any = None

    _bad_path: web.HTTPError | None = None
    _prepared = False
    _body_next = False  # prepare let the request through: tornado reads its body, then calls the verb

    def decode_argument(self, value: bytes, name: str | None = None) -> str:
        # An id in the path that is not UTF-8: tornado refuses it before prepare, so before the body is read,
        # and a client still sending a big body would get a reset, not the answer. Refused in prepare instead.
        try:
            return super().decode_argument(value, name)
        except web.HTTPError as e:
            if self._prepared:  # a query argument, decoded by the handler: refused as it is
                raise
            self._bad_path = e
            return value.decode("utf-8", "replace")

    async def prepare(self) -> None:  # type: ignore[override]
        self._prepared = True
        self._chunks: list[bytes] | None = []
        self._size = 0
        try:
            if self._bad_path is not None:
                raise self._bad_path
            await super().prepare()
        except web.HTTPError as e:
            # Refused before the body is read (a path id or token that is not UTF-8, XSRF, no auth): answered now,
            # tornado would close the connection after the answer without saying so, and a keep-alive client's next
            # request would meet a closed socket (a client still sending a big body, a reset). Read the body (an
            # empty one too), keep none of it, then refuse.
            self._chunks, self.max_body = None, 0
            refusal = e  # `e` is unbound when the except block ends

            async def refuse(*args: Any, **kwargs: Any) -> None:
                raise refusal

            setattr(self, (self.request.method or "").lower(), refuse)  # what tornado calls once the body is in
        self._body_next = not self._finished

    def finish(self, *args: Any, **kwargs: Any) -> Any:
        if not self._body_next and not self._headers_written:
            # finished before the body was read (a verb tornado does not know is refused before prepare): tornado
            # closes the connection after this answer, so the answer says so, and a keep-alive client reconnects
            self.set_header("Connection", "close")
        return super().finish(*args, **kwargs)

    def data_received(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._chunks is not None:
            if self._size > self.max_body:
                self._chunks = None  # over the limit: keep nothing, read the rest and drop it
            else:
                self._chunks.append(chunk)

    @property
    def runtime(self) -> Runtime:
        return runtime_of(self)

    @property
    def service(self) -> Local:
        """The one service (workbench/service) the handlers run every operation on, as the CLI does in process."""
        return runtime_of(self).service

    def body(self) -> Any:
        """The decoded JSON body (strictly; an empty body is {}); BodyTooLarge over `max_body`."""
        if self._chunks is None:
            raise BodyTooLarge(f"the body is {self._size:,} bytes; this route takes at most {self.max_body:,}")
        return bodies.decode(b"".join(self._chunks))

    def reply(self, obj: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj, default=str))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        tornado_error(self, status_code, kwargs)


class NotFoundHandler(WorkbenchHandler):
    """Any other path under the API: a JSON 404 (served last, after every route)."""

    @web.authenticated
    async def get(self, *args: Any) -> None:
        raise web.HTTPError(404, "no such route in the workbench API (see docs/api.md)")

    post = put = patch = delete = get


class SessionsHandler(WorkbenchHandler):
    args = bodies.SessionsArgs

    @web.authenticated
    @api
    async def get(self) -> None:
        q = self.query
        filters = {"kind": q.kind, "state": q.state, "text": q.q, "updated_after": q.updated_after,
                   "updated_before": q.updated_before, "order": q.order or "created", "cursor": q.cursor,
                   "archived": bodies.flag(q.archived)}
        self.reply(await self.service.sessions(limit=q.limit, **filters))

    @web.authenticated
    @api
    async def post(self) -> None:
        b = bodies.parse(bodies.SessionBody, self.body())
        self.reply(await self.service.create_session(
            id=b.id, title=b.title, model=b.model, system=b.system, config=b.config, tools=b.tools,
            first_message=b.first_message), 201)


class MessagesHandler(WorkbenchHandler):
    max_body = bodies.MAX_MESSAGE_BODY_BYTES

    @web.authenticated
    @api
    async def post(self, id: str) -> None:
        text, key, attachments = bodies.message_body(self.body())
        seq = await self.service.send(id, text, key=key, attachments=attachments)
        self.reply({"session_id": id, "seq": seq}, 202)


class EventsHandler(WorkbenchHandler):
    args = bodies.EventsArgs

    @web.authenticated
    @api
    async def get(self, id: str) -> None:
        after, limit = self.query.after, self.query.limit
        events = await self.service.events(id, after, limit=limit)  # 404 for an unknown session
        last = events[-1].seq if events else (after or 0)
        self.reply({"events": [e.to_json() for e in events], "last_seq": last})


class NotebookHandler(WorkbenchHandler):
    """The session's code and outputs as a notebook (workbench/export.py); 404 for an unknown session."""

    @web.authenticated
    @api
    async def get(self, id: str) -> None:
        self.reply(await self.service.notebook(id))


class InterruptHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def post(self, id: str) -> None:
        bodies.empty_body(self.body())
        self.reply({"interrupted": await self.service.interrupt(id)})


class ResumeHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def post(self, id: str) -> None:
        bodies.empty_body(self.body())
        self.reply({"resumed": await self.service.resume(id)}, 202)


class HandsHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def get(self, id: str) -> None:
        self.reply(await self.service.hands(id))


class HandsRestartHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def post(self, id: str) -> None:
        bodies.empty_body(self.body())
        self.reply(await self.service.restart_hands(id))


class HandsCloseHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def post(self, id: str) -> None:
        bodies.empty_body(self.body())
        self.reply(await self.service.close_hands(id))


class QueryHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def post(self) -> None:
        sql, params = bodies.query_body(self.body())
        self.reply(await self.service.query(sql, params))


class StatusHandler(WorkbenchHandler):
    @web.authenticated
    @api
    async def get(self) -> None:
        self.reply({**self.runtime.status(), "resume_on_start": getattr(self.extensionapp, "resume_on_start", None)})


class StreamHandler(WebSocketMixin, WebSocketHandler, JupyterHandler):
    """Every committed event after `after`, then each as it is committed, plus live deltas and live output.

    Everything is checked before the upgrade (auth, `after`, the upgrade headers, the
    origin, the session), and a refusal is JSON like every other route's. No gap and
    no duplicate between the stored backlog and the live feed: the watcher is
    registered first and buffers; then the backlog is read and sent; then the buffer
    is drained, skipping seqs already sent; then each running call's output so far
    (a snapshot), and later output of that call only after it.
    """

    def set_default_headers(self) -> None:
        """JupyterHandler's headers make no sense for a websocket."""

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        tornado_error(self, status_code, kwargs)

    @ws_authenticated
    async def get(self, id: str) -> None:
        runtime = None
        try:
            bodies.path_id(id, UnknownSession, "session")
            self.after = int(bodies.query_args(bodies.StreamArgs, self.request.query_arguments).after or 0)
            refused = self._refuse_upgrade()
            if refused:
                if refused[0] == 426:
                    self.set_header("Sec-WebSocket-Version", "13")
                send_error(self, *refused)
                return
            runtime = runtime_of(self)
            async with runtime.serving():
                await runtime.ready()
                await runtime.service.session(id)
        except WorkbenchError as e:
            send_error(self, status_of(e), str(e))
            return
        except Exception:
            if runtime is None or not runtime.stopping:
                raise
            send_error(self, ServerStopping.http_status, STOPPING)
            return
        await super().get(id)

    def _refuse_upgrade(self) -> tuple[int, str] | None:
        """What tornado would refuse with a text body, as (status, message); None for a good upgrade."""
        headers = self.request.headers
        if headers.get("Upgrade", "").lower() != "websocket":
            return 400, "this route is a websocket: connect with Upgrade: websocket (docs/api.md)"
        if "upgrade" not in [s.strip().lower() for s in headers.get("Connection", "").split(",")]:
            return 400, 'a websocket upgrade needs "Connection: Upgrade"'
        check = getattr(self, "_check_cross_origin", None)  # tornado's own algorithm (6.5)
        origin = headers.get("Origin")
        if (check(self.check_origin) if check is not None else (origin is not None and not self.check_origin(origin))):
            return 403, f"cross-origin websockets are not allowed (origin {str(origin)[:100]!r})"
        if headers.get("Sec-WebSocket-Version") != "13":
            return 426, "this server speaks websocket version 13 (Sec-WebSocket-Version: 13)"
        if not headers.get("Sec-WebSocket-Key") or not headers.get("Host"):
            return 400, "a websocket upgrade needs the Sec-WebSocket-Key and Host headers"
        return None

    async def open(self, id: str) -> None:
        super().open()  # the ping loop of WebSocketMixin
        runtime = runtime_of(self)
        self.session_id, self._last, self._live = id, self.after, False
        self._output_upto: dict[str, int] = {}
        self._buffer: list[tuple[str, Any, str | None]] = []
        self._unwatch = runtime.watch(id, self._on_live)
        try:
            backlog = await runtime.service.events(id, self.after)
        except Exception:
            if runtime.stopping:
                self.close(1001, STOPPING)
                return
            self.close(1011, "cannot read the session log")
            raise
        for e in backlog:
            self._send("event", e)
        snapshots = runtime.live_output(id)
        self._output_upto = {m["tool_use_id"]: m["n"] for m in snapshots}
        buffered, self._buffer = self._buffer, []
        for kind, obj, text in buffered:
            self._send(kind, obj, text)
        for m in snapshots:
            self._send("output", m, snapshot=True)
        self._live = True

    def _on_live(self, kind: str, obj: Any, text: str | None) -> None:
        if kind == "closed":  # the server stops
            self._stop()
            self.close(1001, STOPPING)
        elif self._live:
            self._send(kind, obj, text)
        else:
            self._buffer.append((kind, obj, text))

    def _send(self, kind: str, obj: Any, text: str | None = None, snapshot: bool = False) -> None:
        """Send an item of the feed (`text`: its message, encoded once for every socket; else encoded here)."""
        if kind == "event":
            if obj.seq <= self._last:
                return
            self._last = obj.seq
        elif kind == "output":
            if not snapshot and obj["n"] <= self._output_upto.get(obj["tool_use_id"], 0):
                return  # in the snapshot this socket was sent already
        try:
            written = self.write_message(text if text is not None else wire(kind, obj, self.session_id))
        except WebSocketClosedError:
            self._stop()
            return
        # a client that goes away mid-write fails the write later, on its own: hear it, or asyncio logs it as unretrieved
        written.add_done_callback(self._written)

    def _written(self, written: asyncio.Future) -> None:
        if not written.cancelled() and written.exception() is not None:
            self._stop()

    def on_message(self, message: Any) -> None:
        """Clients do not need to send anything; messages are ignored."""

    def _stop(self) -> None:
        unwatch: Callable[[], None] | None = getattr(self, "_unwatch", None)
        if unwatch is not None:
            unwatch()
            self._unwatch = lambda: None

    def on_close(self) -> None:
        self._stop()


class FilesHandler(WorkbenchHandler):
    """GET: the session's workspace listing. POST: a file (the raw body) into it, streamed to a spool file
    as it arrives: at most `max_upload_mb` is kept, the rest of a bigger body is read and dropped (413,
    nothing written); a body is checked whole before anything is written into the workspace."""

    async def prepare(self) -> None:  # type: ignore[override]
        await super().prepare()
        self._spool: Any = None
        if self.request.method == "POST" and self._chunks is not None:  # None: refused already (see above)
            self.args = bodies.UploadArgs
            if not self.current_user:  # refused (403) by @web.authenticated: keep none of its body, spool nothing
                self.max_body = 0
                return
            import tempfile

            self.max_body = self.runtime_limit()
            self._spool = tempfile.SpooledTemporaryFile(max_size=1 << 20)

    def runtime_limit(self) -> int:
        runtime = self.settings.get("workbench_runtime")
        mb = runtime.files_settings.max_upload_mb if runtime is not None else 0
        return int(mb) << 20

    def data_received(self, chunk: bytes) -> None:
        if self._spool is None:
            return super().data_received(chunk)
        self._size += len(chunk)
        if self._chunks is not None:
            if self._size > self.max_body:
                self._chunks = None  # over the limit: drop what was spooled, read the rest and drop it too
                self._spool.close()
            else:
                self._spool.write(chunk)

    def on_finish(self) -> None:
        if getattr(self, "_spool", None) is not None:
            self._spool.close()

    @web.authenticated
    @api
    async def get(self, id: str) -> None:
        self.reply(await self.service.files(id))

    @web.authenticated
    @api
    async def post(self, id: str) -> None:
        if self._chunks is None:
            raise BodyTooLarge(f"the file is {self._size:,} bytes; an upload may be at most {self.max_body:,} "
                               "(the setting max_upload_mb, docs/settings.md); nothing was written")
        q = self.query
        written = await self.service.put_file(id, q.path, self._spool, name=q.name or "", kind=q.kind or "file")
        self.reply(written, 201)


class FileContentHandler(WorkbenchHandler):
    """A file of the session's workspace, as bytes (always a download: never rendered by the browser)."""

    args = bodies.FileArgs

    @web.authenticated
    @api
    async def get(self, id: str) -> None:
        from urllib.parse import quote

        from ..hands import files as wsfiles

        runtime = self.runtime
        root = await runtime.service.file_root(id, self.query.path)
        limit = runtime.files_settings.max_download_mb << 20
        path = wsfiles.check_path(self.query.path)
        opened = wsfiles.open_file(root, path, limit)
        fh, size = await asyncio.to_thread(opened.__enter__)
        try:
            self.set_header("Content-Type", "application/octet-stream")
            self.set_header("X-Workbench-Bytes", str(size))  # no Content-Length: a file may shrink while it is sent
            self.set_header("Content-Disposition", f"attachment; filename*=UTF-8''{quote(path.rsplit('/', 1)[-1])}")
            self.set_header("X-Content-Type-Options", "nosniff")
            self.set_header("Content-Security-Policy", "sandbox; default-src 'none'")
            sent = 0
            while sent < size:
                chunk = await asyncio.to_thread(fh.read, min(1 << 20, size - sent))
                if not chunk:
                    break  # the file shrank meanwhile: the client sees a short body
                self.write(chunk)
                sent += len(chunk)
                await self.flush()
            # an API handler's finish says JSON unless told: an empty file has sent no header yet
            self.finish(set_content_type="application/octet-stream")
        finally:
            await asyncio.to_thread(opened.__exit__, None, None, None)
