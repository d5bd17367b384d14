"""Kernels on a Jupyter Kernel Gateway (or Enterprise Gateway): REST to start them, a websocket to talk.

REST (`/api/kernels`) starts, interrupts and deletes kernels; the websocket
`/api/kernels/{id}/channels` carries Jupyter protocol v5 messages as JSON.

What can be detected over a gateway, and what cannot:
- a kernel that dies: the gateway's restarter notices (its `time_to_dead`,
  3 s by default, is the gateway's setting, not ours) and sends a `status`
  of `restarting` (or `dead`) on the websocket; we treat either as a death,
  delete that kernel and start a fresh one for the next call. The exit code
  and signal are not sent, so `hands_died` has `exit_code: null`.
- a gateway that dies or drops the connection: the websocket closes; the
  pending call gets an error observation and the next call starts over.
- limits, sandboxing and the kernel's working directory are the gateway's
  business; only `KERNEL_*` (and whitelisted) variables of `env` reach it.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from .base import Death, Kernel, Place

MAX_MESSAGE = 64 * 1024 * 1024  # the largest websocket message taken from the gateway
WAKE = object()  # put on a kernel's queue when it dies, so that a reader waiting on it looks again


class GatewayError(RuntimeError):
    """The gateway refused or failed a request."""


class GatewayLauncher:
    """Starts kernels on a Jupyter Kernel Gateway; one HTTP client for all of them."""

    name = "gateway"

    def __init__(self, url: str, token: str = "", kernel_name: str = "python3"):
        self.url, self.token, self.kernel_name = url.rstrip("/"), token, kernel_name
        self._http: httpx.AsyncClient | None = None

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"} if self.token else {}

    async def rest(self, method: str, path: str, body: Any = None, timeout: float = 60.0) -> Any:
        """One REST call; errors become a GatewayError that says what failed."""
        if self._http is None:  # made on first use, inside the event loop that will use it
            self._http = httpx.AsyncClient(headers=self.headers())
        try:
            resp = await self._http.request(method, self.url + path, json=body, timeout=timeout)
            resp.raise_for_status()
        except httpx.HTTPStatusError as e:
            raise GatewayError(f"{method} {path} on the gateway failed: HTTP {e.response.status_code} "
                               f"{e.response.reason_phrase}") from None
        except httpx.HTTPError as e:
            raise GatewayError(f"cannot reach the gateway at {self.url}: {type(e).__name__}: {e}") from None
        try:
            return resp.json() if resp.content else None
        except ValueError:
            raise GatewayError(f"{method} {path} on the gateway answered with something that is not JSON") from None

    def ws_url(self, kernel_id: str) -> str:
        u = urlsplit(self.url)
        scheme = "wss" if u.scheme == "https" else "ws"
        return urlunsplit((scheme, u.netloc, f"{u.path}/api/kernels/{kernel_id}/channels", "", ""))

    async def start(self, place: Place | None) -> GatewayKernel:
        """Create a kernel on the gateway, connect to it and wait for its kernel_info reply."""
        timeout = place.startup_timeout if place else 60.0
        t0 = time.perf_counter()
        kernel = GatewayKernel(self)
        try:
            model = await self.rest("POST", "/api/kernels", {"name": self.kernel_name, "env": dict(place.env if place else {})},
                                    timeout)
            if not isinstance(model, dict) or not isinstance(model.get("id"), str):
                raise GatewayError("the gateway's answer to starting a kernel has no kernel id")
            kernel.kernel_id = model["id"]  # from here on a failed start deletes it
            await kernel.connect(timeout)
            await kernel.reply(kernel.send("shell", "kernel_info_request", {}), timeout)
        except BaseException:
            await asyncio.shield(kernel.kill())
            raise
        kernel.boot_ms = round((time.perf_counter() - t0) * 1000, 1)
        return kernel

    def fits(self, place: Place) -> bool:
        """A pooled gateway kernel was started without the session's variables: only for sessions with none."""
        return not place.env

    async def adopt(self, kernel: Kernel, place: Place) -> str:
        """Nothing to do: the workdir is the gateway's business."""
        return ""

    async def aclose(self) -> None:
        """Close the HTTP client."""
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()


class GatewayKernel:
    """One kernel on a gateway: its websocket, read into a queue by a task, and how it died."""

    launcher = "gateway"

    def __init__(self, gateway: GatewayLauncher):
        self.gateway = gateway
        self.kernel_id: str | None = None
        self.boot_ms = 0.0
        self.limits: dict[str, str] = {}
        self.output = None  # the kernel's process output stays on the gateway's side
        self._ws: WebSocketClientConnection | None = None
        self._queue: asyncio.Queue = asyncio.Queue()
        self._reader: asyncio.Task | None = None
        self._session = uuid.uuid4().hex
        self._death: Death | None = None
        self.stopped = False

    @property
    def ident(self) -> dict[str, Any]:
        return {"pid": None, "kernel_id": self.kernel_id}

    async def connect(self, timeout: float) -> None:
        req = HTTPRequest(self.gateway.ws_url(self.kernel_id), headers=self.gateway.headers(), request_timeout=timeout)
        self._ws = await websocket_connect(req, max_message_size=MAX_MESSAGE)
        self._reader = asyncio.get_running_loop().create_task(self._read(self._ws))

    async def _read(self, ws: WebSocketClientConnection) -> None:
        while True:
            raw = await ws.read_message()
            if raw is None:
                self._died("the gateway closed the websocket")
                return
            try:
                msg = json.loads(raw)
            except ValueError:
                continue  # not a Jupyter message: nothing to fold
            if not isinstance(msg, dict):
                continue
            if msg.get("channel") == "iopub" and _type(msg) == "status":
                state = (msg.get("content") or {}).get("execution_state")
                if state in ("restarting", "dead"):
                    self._died(f"the gateway reported it {state}")
                    continue
            self._queue.put_nowait(msg)

    def _died(self, how: str) -> None:
        if self._death is None:
            self._death = Death(how)
        self._queue.put_nowait(WAKE)

    def send(self, channel: str, msg_type: str, content: dict[str, Any]) -> str:
        """Send a message on the websocket; returns its msg_id."""
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "msg_type": msg_type, "username": "workbench", "session": self._session,
                  "date": datetime.now(UTC).isoformat(), "version": "5.3"}
        if self._ws is not None and self._death is None:
            self._ws.write_message(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": content,
                                               "channel": channel, "buffers": []}))
        return msg_id

    def execute(self, code: str, *, silent: bool = False) -> str:
        """Send an execute request; returns its msg_id."""
        return self.send("shell", "execute_request", {"code": code, "silent": silent, "store_history": not silent,
                                                      "allow_stdin": False, "stop_on_error": not silent})

    async def _next(self, deadline: float) -> Any:
        """The next queued message, WAKE when the kernel is gone, None at the deadline."""
        if self._death is not None:
            return WAKE
        try:
            return await asyncio.wait_for(self._queue.get(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return None

    async def message(self, msg_id: str, timeout: float) -> tuple[str, dict[str, Any]] | None:
        """The next iopub message of request `msg_id`; None if none came in `timeout` or the kernel is gone."""
        deadline = time.monotonic() + timeout
        while (msg := await self._next(deadline)) not in (None, WAKE):
            if msg.get("channel") == "iopub" and (msg.get("parent_header") or {}).get("msg_id") == msg_id:
                return _type(msg), msg.get("content") or {}
        return None

    async def reply(self, msg_id: str, timeout: float) -> dict[str, Any]:
        """The content of the shell reply to `msg_id`."""
        deadline = time.monotonic() + timeout
        while True:
            msg = await self._next(deadline)
            if msg is None:
                raise TimeoutError(f"the kernel on the gateway did not answer within {timeout:g} s")
            if msg is WAKE:
                raise GatewayError(f"the kernel went away: {self._death.how if self._death else 'stopped'}")
            if msg.get("channel") == "shell" and (msg.get("parent_header") or {}).get("msg_id") == msg_id:
                return msg.get("content") or {}

    async def death(self) -> Death | None:
        """How the kernel ended, as the websocket told, or None while it lives."""
        return self._death

    async def interrupt(self) -> None:
        """Ask the gateway to interrupt the kernel."""
        try:
            await self.gateway.rest("POST", f"/api/kernels/{self.kernel_id}/interrupt")
        except GatewayError:
            pass  # gone already: death() says so at the next look

    async def kill(self) -> None:
        """Close the websocket and delete the kernel on the gateway; safe to call twice."""
        if self.stopped:
            return
        self.stopped = True
        if self._death is None:
            self._death = Death("it was stopped")
        ws, reader = self._ws, self._reader
        if ws is not None:
            ws.close()
        if reader is not None:
            reader.cancel()
        if self.kernel_id is not None:
            try:
                await self.gateway.rest("DELETE", f"/api/kernels/{self.kernel_id}")
            except GatewayError:
                pass  # already gone (or the gateway is); nothing left for us to stop


def _type(msg: dict[str, Any]) -> str:
    return msg.get("msg_type") or (msg.get("header") or {}).get("msg_type") or ""
