"""The REST transport: every operation of the service over a workbench server's REST API and session websocket.

The only module of the core that knows the API's paths and speaks HTTP (tests/test_structure.py
holds the faces to it). It never opens the DuckDB file: the server owns it. A refusal of the server
is RequestRefused with its status and words; `as_local()` is the error the in-process transport
raises for the same call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, BinaryIO, TypeVar
from urllib.parse import quote, urlencode

from ..errors import RequestRefused, ServerUnavailable, UnknownSession, WorkbenchError
from ..log.events import Event
from .base import Message, Watch, event_of
from .parts import checked, no_part

T = TypeVar("T")

HOW_TO_FIX = (
    "start JupyterLab with the workbench extension enabled (`jupyter server extension enable workbench`), "
    "or pass workbench.connect(url=..., token=...)"
)
EVENTS_PAGE = 100_000  # the most events one GET .../events returns (the server's MAX_EVENTS_PAGE)
UPLOAD_TIMEOUT = 300.0  # seconds an upload may take at least, whatever the client's timeout
SEND_RETRIES = 2  # a message that got no answer is sent again (with its key) up to this often
MAX_MESSAGE_BYTES = 1 << 30  # a websocket message (one event) this client reads at most


def part(session_id: str) -> str:
    """A session id as one path segment (an id with a slash or a space must not name another route)."""
    return quote(session_id, safe="")


def listing(filters: Mapping[str, Any]) -> dict[str, Any]:
    """The query arguments of GET /sessions for a listing's filters (text is `q`; datetimes in ISO 8601)."""
    out: dict[str, Any] = {}
    for name, value in filters.items():
        if value is None:
            continue
        if isinstance(value, datetime):
            value = value.isoformat()
        if isinstance(value, bool):
            value = "true" if value else "false"
        out["q" if name == "text" else name] = value
    return out


class Rest:
    """The service over the workbench API of one Jupyter server (an async context manager: its connections)."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0, plugins: Sequence[Any] = ()):
        import httpx

        self.url = url.rstrip("/")
        self.api = self.url + "/workbench/api"
        self.token = token or ""
        self.timeout = timeout
        self.headers = {"Authorization": f"token {self.token}"} if self.token else {}
        self.http = httpx.AsyncClient(headers=self.headers, timeout=timeout)
        self.plugins = list(plugins)  # whose REST parts `part` builds
        self.workbench = self  # RestCalls: a plugin's REST part reaches the core operations through it
        self._parts: dict[str, object] = {}

    def __repr__(self) -> str:
        return f"<Rest {self.url}>"

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> Rest:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- HTTP ----------------------------------------------------------------------------------

    async def call(self, method: str, path: str, body: Any = None, *, params: Mapping[str, Any] | None = None,
                   content: bytes | None = None, unknown: type[WorkbenchError] = UnknownSession, retries: int = 0) -> Any:
        """The JSON answer of `method path` (path under the API, its parts quoted); RequestRefused for a refusal.
        `retries`: how often a request that got no answer (a dropped connection, a timeout) is sent again, only
        for a request the server answers the same however often it gets it (a message with its key)."""
        import httpx

        for attempt in range(retries + 1):
            try:
                if content is not None:  # a file sent as it is (an import): the server reads and checks its bytes
                    r = await self.http.request(method, self.api + path, content=content, params=params,
                                                headers={"Content-Type": "application/json"})
                else:
                    r = await self.http.request(method, self.api + path, json=body, params=params)
                break
            except httpx.TransportError:
                if attempt < retries:
                    continue
                raise ServerUnavailable(f"no workbench server answers at {self.url} (no answer after {attempt + 1} "
                                        f"attempt(s)): {HOW_TO_FIX}") from None
            except httpx.HTTPError as e:
                raise ServerUnavailable(f"no workbench server answers at {self.url} ({type(e).__name__}): {HOW_TO_FIX}") from None
        if r.status_code == 404 and path == "/status":
            raise ServerUnavailable(
                f"the Jupyter server at {self.url} does not have the workbench extension enabled: "
                "run `jupyter server extension enable workbench` and restart it"
            )
        if r.status_code == 403:
            refusal = self._refusal(403, r.text, r.reason_phrase, unknown)
            # Jupyter's own refusal of the token is a bare "Forbidden"; the workbench's says why (a shared store)
            if refusal.message.strip().rstrip(".").lower() in ("forbidden", "http 403", r.reason_phrase.lower(), ""):
                raise RequestRefused(403, f"the server at {self.url} refused the token; pass workbench.connect(url=..., "
                                          "token=...)")
            raise refusal
        return self._checked(r, unknown)

    def _checked(self, r: Any, unknown: type[WorkbenchError] = UnknownSession) -> Any:
        """The JSON of a response, or RequestRefused with the server's one-line error."""
        if r.status_code >= 400:
            raise self._refusal(r.status_code, r.text, r.reason_phrase, unknown)
        return r.json()

    @staticmethod
    def _refusal(status: int, text: str, reason: str, unknown: type[WorkbenchError] = UnknownSession) -> RequestRefused:
        try:
            message = json.loads(text).get("error") or text
        except (ValueError, AttributeError):
            message = text[:200] or reason
        return RequestRefused(status, message, unknown)

    # -- the host ------------------------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        return await self.call("GET", "/status")

    async def models(self) -> dict[str, Any]:
        return await self.call("GET", "/models")

    # -- sessions ------------------------------------------------------------------------------

    async def sessions(self, *, limit: int | None = None, cursor: str | None = None, **filters: Any) -> dict[str, Any]:
        return await self.call("GET", "/sessions", params=listing({**filters, "limit": limit, "cursor": cursor}))

    async def session(self, session_id: str) -> dict[str, Any]:
        return await self.call("GET", f"/sessions/{part(session_id)}")

    async def create_session(self, *, id: str | None = None, title: str | None = None, model: str | None = None,
                             system: str | None = None, config: Mapping[str, Any] | None = None,
                             tools: Sequence[str] | None = None, first_message: str | None = None) -> dict[str, Any]:
        given = dict(id=id, title=title, model=model, system=system, config=config,
                     tools=list(tools) if tools is not None else None, first_message=first_message)
        return await self.call("POST", "/sessions", {k: v for k, v in given.items() if v is not None})

    async def events(self, session_id: str, after: int | None = None, limit: int | None = None) -> list[Event]:
        """Page by page (at most EVENTS_PAGE at a time), all of them unless `limit`."""
        out: list[Event] = []
        after = after or 0
        while True:
            want = min(limit - len(out), EVENTS_PAGE) if limit is not None else EVENTS_PAGE
            page = (await self.call("GET", f"/sessions/{part(session_id)}/events",
                                    params={"after": after, "limit": want}))["events"]
            out += [event_of(e) for e in page]
            if len(page) < want or (limit is not None and len(out) >= limit):
                return out
            after = page[-1]["seq"]

    async def notebook(self, session_id: str) -> dict[str, Any]:
        return await self.call("GET", f"/sessions/{part(session_id)}/notebook")

    async def usage(self, session_id: str) -> dict[str, Any]:
        return await self.call("GET", f"/sessions/{part(session_id)}/usage")

    async def rename(self, session_id: str, title: str) -> dict[str, Any]:
        return await self.call("PATCH", f"/sessions/{part(session_id)}", {"title": title})

    async def archive(self, session_id: str, archived: bool = True) -> dict[str, Any]:
        return await self.call("PATCH", f"/sessions/{part(session_id)}", {"archived": archived})

    async def delete(self, session_id: str) -> dict[str, Any]:
        return await self.call("DELETE", f"/sessions/{part(session_id)}", {})

    async def fork(self, session_id: str, seq: int | None = None, *, new_id: str | None = None,
                   title: str | None = None) -> dict[str, Any]:
        body = {k: v for k, v in {"seq": seq, "id": new_id, "title": title}.items() if v is not None}
        return await self.call("POST", f"/sessions/{part(session_id)}/fork", body)

    async def search(self, text: str, *, limit: int = 20, cursor: str | None = None, kind: str | None = None,
                     archived: bool | None = None) -> dict[str, Any]:
        return await self.call("GET", "/search", params=listing({"q": text, "limit": limit, "cursor": cursor,
                                                                 "kind": kind, "archived": archived}))

    async def query(self, sql: str, params: Sequence[Any] = ()) -> dict[str, Any]:
        return await self.call("POST", "/query", {"sql": sql, "params": list(params)})

    # -- turns ---------------------------------------------------------------------------------

    async def send(self, session_id: str, text: str, *, key: str | None = None,
                   attachments: Sequence[Mapping[str, Any]] | None = None) -> int:
        """Sent again with its key when the connection fails: the server records it once (docs/api.md)."""
        body: dict[str, Any] = {"text": text, "idempotency_key": key or uuid.uuid4().hex}
        if attachments is not None:
            body["attachments"] = attachments  # as given: the server checks it
        return (await self.call("POST", f"/sessions/{part(session_id)}/messages", body, retries=SEND_RETRIES))["seq"]

    async def resume(self, session_id: str) -> bool:
        return (await self.call("POST", f"/sessions/{part(session_id)}/resume", {}))["resumed"]

    async def interrupt(self, session_id: str) -> bool:
        return (await self.call("POST", f"/sessions/{part(session_id)}/interrupt", {}))["interrupted"]

    async def run_turn(self, session_id: str, text: str, watch: Watch, *,
                       attachments: Sequence[Mapping[str, Any]] | None = None) -> str:
        stop = await self._follow(session_id, lambda after: self.send(session_id, text, attachments=attachments), watch)
        assert stop is not None, "a sent message starts a turn"
        return stop

    async def resume_turn(self, session_id: str, watch: Watch) -> str | None:
        async def start(after: int) -> int | None:
            return after if await self.resume(session_id) else None

        return await self._follow(session_id, start, watch)

    async def _follow(self, session_id: str, start: Callable[[int], Awaitable[int | None]], watch: Watch) -> str | None:
        """Open the session's stream after its last event, start (the seq after which the turn's turn_ended counts,
        None when nothing started) and hear the turn to its end. Cancelling the caller interrupts the turn there."""
        after = (await self.session(session_id))["last_seq"]
        async with self.stream(session_id, after) as messages:
            try:
                since = await start(after)
                if since is None:
                    return None
                async for m in messages:
                    watch(m)
                    if m.kind == "event" and m.event is not None and m.event.type == "turn_ended" and m.event.seq > since:
                        return str(m.event.payload.get("stop_reason"))
            except asyncio.CancelledError:
                with contextlib.suppress(WorkbenchError):  # the server is gone or the turn ended: nothing to interrupt
                    await self.interrupt(session_id)
                raise
        raise WorkbenchError(f"the server closed the stream of session {session_id} before the turn ended; "
                             f"see `workbench show {session_id}`")

    @contextlib.asynccontextmanager
    async def stream(self, session_id: str, after: int = 0,
                     timeout: float | None = None) -> AsyncIterator[AsyncIterator[Message]]:
        from tornado.httpclient import HTTPClientError, HTTPRequest
        from tornado.websocket import websocket_connect

        url = "ws" + self.api[len("http"):] + f"/sessions/{part(session_id)}/stream?" + urlencode({"after": after})
        try:
            ws = await websocket_connect(HTTPRequest(url, headers=self.headers, connect_timeout=self.timeout,
                                                     request_timeout=self.timeout), max_message_size=MAX_MESSAGE_BYTES)
        except HTTPClientError as e:  # refused before the upgrade: the JSON error every route answers with
            body = e.response.body.decode("utf-8", "replace") if e.response is not None and e.response.body else ""
            raise self._refusal(e.code, body, str(e)) from None
        except (TimeoutError, OSError) as e:
            raise ServerUnavailable(f"cannot open the event stream at {url.split('?')[0]}: {e}") from None
        try:
            yield self._messages(ws, session_id, timeout)
        finally:
            ws.close()

    async def _messages(self, ws: Any, session_id: str, timeout: float | None) -> AsyncIterator[Message]:
        while True:
            raw = await asyncio.wait_for(ws.read_message(), timeout)
            if raw is None:  # closed
                return
            m = Message.from_json(json.loads(raw), session_id)
            if m is not None:
                yield m

    # -- hands and the workspace ---------------------------------------------------------------

    async def hands(self, session_id: str) -> dict[str, Any]:
        return await self.call("GET", f"/sessions/{part(session_id)}/hands")

    async def restart_hands(self, session_id: str) -> dict[str, Any]:
        return await self.call("POST", f"/sessions/{part(session_id)}/hands/restart", {})

    async def close_hands(self, session_id: str) -> dict[str, Any]:
        return await self.call("POST", f"/sessions/{part(session_id)}/hands/close", {})

    async def files(self, session_id: str) -> dict[str, Any]:
        return await self.call("GET", f"/sessions/{part(session_id)}/files")

    async def put_file(self, session_id: str, path: str, data: bytes | BinaryIO, *, name: str = "",
                       kind: str = "file") -> dict[str, Any]:
        """Streamed from `data` (bytes or a binary file) as it is sent."""
        import httpx

        params = {"path": path, "kind": kind, **({"name": name} if name else {})}
        content: Any = data if isinstance(data, bytes) else _chunks(data)
        try:
            r = await self.http.post(f"{self.api}/sessions/{part(session_id)}/files", params=params, content=content,
                                     headers={"Content-Type": "application/octet-stream"},
                                     timeout=max(self.timeout, UPLOAD_TIMEOUT))
        except httpx.HTTPError as e:
            raise ServerUnavailable(f"the upload of {path!r} to {self.url} failed ({type(e).__name__}: {e})") from None
        return self._checked(r)

    async def read_file(self, session_id: str, path: str, *, max_bytes: int | None = None) -> bytes:
        """A bigger file than `max_bytes` is refused before it is all read."""
        import httpx

        url = f"{self.api}/sessions/{part(session_id)}/files/content"
        try:
            async with self.http.stream("GET", url, params={"path": path}) as r:
                if r.status_code >= 400:
                    await r.aread()
                    self._checked(r)
                declared = int(r.headers.get("X-Workbench-Bytes") or 0)
                if max_bytes is not None and declared > max_bytes:
                    raise RequestRefused(413, f"{path!r} is {declared:,} bytes, more than max_bytes={max_bytes:,}")
                chunks, size = [], 0
                async for chunk in r.aiter_bytes():
                    size += len(chunk)
                    if max_bytes is not None and size > max_bytes:
                        raise RequestRefused(413, f"{path!r} is more than max_bytes={max_bytes:,} bytes")
                    chunks.append(chunk)
                return b"".join(chunks)
        except httpx.HTTPError as e:
            raise ServerUnavailable(f"fetching {path!r} from {self.url} failed ({type(e).__name__}: {e})") from None

    # -- plugins -------------------------------------------------------------------------------

    def part(self, name: str, kind: type[T]) -> T:
        made = self._parts.get(name)
        if made is None:
            plugin = next((p for p in self.plugins if p.name == name), None)
            found = plugin.service() if plugin is not None else None
            if found is None:
                raise no_part(name, [p.name for p in self.plugins])
            made = self._parts[name] = found.rest(self)
        return checked(name, made, kind)


async def _chunks(fh: BinaryIO, size: int = 1 << 20) -> AsyncIterator[bytes]:
    """A binary file's bytes a chunk at a time (read in a worker thread: the file may be on a slow disk)."""
    while True:
        chunk = await asyncio.to_thread(fh.read, size)
        if not chunk:
            return
        yield chunk


__all__ = ["HOW_TO_FIX", "Rest", "listing", "part"]
