"""Hands on a remote kernel, through a Jupyter Kernel Gateway (or Enterprise Gateway).

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
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from .base import EventSink, Observation
from .collect import Collector, setup_code
from .kernel import HandsConfig
from .lifecycle import GONE, Deadline, Lifecycle

POLL = 0.05
CLOSED = object()  # put on the queue when the websocket closes


class GatewayError(RuntimeError):
    """The gateway refused or failed a request."""


class GatewayHands(Lifecycle):
    """Hands whose kernels live on a Jupyter Kernel Gateway."""

    launcher_name = "gateway"
    start_failed = "the kernel could not start on the gateway"

    def __init__(self, config: HandsConfig | None = None, *, url: str, token: str = "", on_event: EventSink | None = None,
                 kernel_name: str = "python3"):
        super().__init__(config or HandsConfig(), on_event)
        self.url, self.token, self.kernel_name = url.rstrip("/"), token, kernel_name
        self.kernel_id: str | None = None
        self._ws: WebSocketClientConnection | None = None
        self._queue: asyncio.Queue = asyncio.Queue()
        self._reader: asyncio.Task | None = None
        self._session = uuid.uuid4().hex

    def _handle(self) -> str | None:
        return self.kernel_id

    def _backend(self) -> str:
        return "gateway"

    # -- REST and websocket ----------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"} if self.token else {}

    async def _rest(self, method: str, path: str, body: Any = None) -> Any:
        req = HTTPRequest(self.url + path, method=method, headers={**self._headers(), "Content-Type": "application/json"},
                          body=json.dumps(body) if body is not None else (b"" if method == "POST" else None),
                          request_timeout=self.config.startup_timeout)
        try:
            resp = await AsyncHTTPClient().fetch(req)
        except HTTPClientError as e:
            raise GatewayError(f"{method} {path} on the gateway failed: HTTP {e.code} {e.message}") from None
        except OSError as e:
            raise GatewayError(f"cannot reach the gateway at {self.url}: {e}") from None
        return json.loads(resp.body) if resp.body else None

    def _ws_url(self) -> str:
        u = urlsplit(self.url)
        scheme = "wss" if u.scheme == "https" else "ws"
        return urlunsplit((scheme, u.netloc, f"{u.path}/api/kernels/{self.kernel_id}/channels", "", ""))

    async def _read(self, ws: WebSocketClientConnection) -> None:
        while True:
            raw = await ws.read_message()
            if raw is None:
                await self._queue.put(CLOSED)
                return
            await self._queue.put(json.loads(raw))

    def _send(self, channel: str, msg_type: str, content: dict[str, Any]) -> str:
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "msg_type": msg_type, "username": "workbench", "session": self._session,
                  "date": datetime.now(timezone.utc).isoformat(), "version": "5.3"}
        self._ws.write_message(json.dumps({"header": header, "parent_header": {}, "metadata": {},
                                           "content": content, "channel": channel, "buffers": []}))
        return msg_id

    async def _reply(self, msg_id: str, timeout: float) -> dict[str, Any]:
        """Wait for the shell reply to `msg_id` (other messages are dropped)."""
        deadline = time.monotonic() + timeout
        while True:
            msg = await asyncio.wait_for(self._queue.get(), max(0.01, deadline - time.monotonic()))
            if msg is CLOSED:
                raise GatewayError("the gateway closed the kernel's websocket")
            if msg.get("channel") == "shell" and msg.get("parent_header", {}).get("msg_id") == msg_id:
                return msg["content"]

    # -- lifecycle ---------------------------------------------------------------

    async def _boot(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Create a kernel on the gateway and connect to it."""
        model = await self._rest("POST", "/api/kernels", {"name": self.kernel_name, "env": dict(self.config.env)})
        self.kernel_id = model["id"]  # from here on a failed start deletes it (the caller's _discard)
        req = HTTPRequest(self._ws_url(), headers=self._headers(), request_timeout=self.config.startup_timeout)
        self._ws = await websocket_connect(req, max_message_size=64 * 1024 * 1024)
        self._queue = asyncio.Queue()
        self._reader = asyncio.get_running_loop().create_task(self._read(self._ws))
        info = self._send("shell", "kernel_info_request", {})
        await self._reply(info, self.config.startup_timeout)
        setup = self._send("shell", "execute_request", {"code": setup_code(self.config.output_limit), "silent": True,
                                                        "store_history": False, "allow_stdin": False})
        reply = await self._reply(setup, self.config.startup_timeout)
        if reply.get("status") != "ok":
            raise GatewayError(f"preparing the kernel failed: {reply.get('ename')}: {reply.get('evalue')}")
        return {"pid": None, "kernel_id": self.kernel_id, "launcher": "gateway"}, {"pooled": False}

    async def _discard(self) -> None:
        """Close the websocket and delete the kernel on the gateway."""
        kid, ws, reader = self.kernel_id, self._ws, self._reader
        self.kernel_id = self._ws = self._reader = None
        if ws is not None:
            ws.close()
        if reader is not None:
            reader.cancel()
        if kid is not None:
            try:
                await self._rest("DELETE", f"/api/kernels/{kid}")
            except GatewayError:
                pass  # already gone (or the gateway is); nothing left for us to stop

    async def _interrupt_now(self) -> None:
        await self._rest("POST", f"/api/kernels/{self.kernel_id}/interrupt")

    async def _interrupt_handle(self, kid: str) -> None:
        try:
            await self._rest("POST", f"/api/kernels/{kid}/interrupt")
        except GatewayError:
            pass  # gone already: the next call finds out

    def status(self) -> dict[str, Any]:
        return {**super().status(), "kernel_id": self.kernel_id, "url": self.url}

    # -- execution -----------------------------------------------------------------

    async def _run(self, code: str, timeout: float) -> Observation:
        col = Collector(self.config.output_limit, self.generation)
        msg_id = self._msg_id = self._send("shell", "execute_request", {"code": code, "silent": False, "store_history": True,
                                                          "allow_stdin": False, "stop_on_error": True})
        deadline = Deadline(self, timeout)
        while True:
            if await deadline.stuck():
                return await self._replace_stuck(timeout, col)
            try:
                msg = await asyncio.wait_for(self._queue.get(), POLL)
            except asyncio.TimeoutError:
                continue
            if msg is CLOSED:
                return await self._died("the gateway closed the websocket", col)
            if msg.get("channel") != "iopub":
                continue
            t, c = msg.get("msg_type") or msg["header"]["msg_type"], msg.get("content", {})
            if t == "status" and c.get("execution_state") in ("restarting", "dead"):
                return await self._died(f"the gateway reported it {c['execution_state']}", col)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if t == "execute_input":
                await self._cell_started()
            elif col.feed(t, c):
                break
        return self._finish(col, timeout, deadline.passed)

    async def _still_current(self, kid: str) -> bool:
        return self.kernel_id == kid

    async def _settle_msg(self, kid: str, msg_id: str) -> Any:
        try:
            msg = await asyncio.wait_for(self._queue.get(), POLL)
        except asyncio.TimeoutError:
            return None
        if msg is CLOSED:
            await self._queue.put(CLOSED)  # for the next call to find
            return GONE
        if msg.get("parent_header", {}).get("msg_id") != msg_id or msg.get("channel") != "iopub":
            return None
        return msg.get("msg_type") or msg["header"]["msg_type"], msg.get("content", {})

    async def _died(self, how: str, col: Collector) -> Observation:
        gen = self.generation
        await self._emit("hands_died", {"generation": gen, "exit_code": None, "signal": None, "how": how,
                                        "during": "call", "kernel_id": self.kernel_id})
        await self._lose()
        return self._death_observation(how, gen, col)
