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

from .base import EventSink, Observation, failure
from .collect import TIMED_OUT, Collector, death_note, replay, setup_code, stuck_note
from .kernel import HandsConfig

POLL = 0.05
CLOSED = object()  # put on the queue when the websocket closes


class GatewayError(RuntimeError):
    """The gateway refused or failed a request."""


class GatewayHands:
    """Hands whose kernels live on a Jupyter Kernel Gateway."""

    launcher_name = "gateway"

    def __init__(self, config: HandsConfig | None = None, *, url: str, token: str = "", on_event: EventSink | None = None,
                 kernel_name: str = "python3"):
        self.config = config or HandsConfig()
        self.url, self.token, self.on_event, self.kernel_name = url.rstrip("/"), token, on_event, kernel_name
        self.replay_source: Any = None  # set by the brain: returns the replayable calls
        self.generation = 0
        self.kernel_id: str | None = None
        self.state = "not started"
        self._ws: WebSocketClientConnection | None = None
        self._queue: asyncio.Queue = asyncio.Queue()
        self._reader: asyncio.Task | None = None
        self._session = uuid.uuid4().hex
        self._lock = asyncio.Lock()
        self._busy = False
        self._interrupt_requested = False
        self._running = False  # the kernel has begun running the current cell (execute_input seen)
        self._interrupt_pending = False
        self._msg_id: str | None = None  # the execute request in flight
        self._settling: asyncio.Task | None = None  # finishing a cancelled call

    async def _emit(self, type: str, payload: dict[str, Any]) -> None:
        if self.on_event is not None:
            await self.on_event(type, payload)

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

    async def start(self, reason: str = "first call") -> list[str]:
        """Create a kernel on the gateway and connect to it; returns notes for the model."""
        if self.kernel_id is not None:
            return []
        if self.state == "dead":
            reason = "replace a dead kernel"
        t0 = time.perf_counter()
        self.state = "starting"
        model = await self._rest("POST", "/api/kernels", {"name": self.kernel_name, "env": dict(self.config.env)})
        self.kernel_id = model["id"]
        try:
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
        except BaseException:
            self.state = "failed"
            await asyncio.shield(self._discard())
            raise
        self.generation += 1
        self.state = "idle"
        await self._emit("hands_started", {
            "generation": self.generation, "pid": None, "kernel_id": self.kernel_id, "launcher": "gateway",
            "reason": reason, "start_ms": round((time.perf_counter() - t0) * 1000, 1), "pooled": False,
        })
        if reason != "restart" and self.config.replay and self.replay_source is not None:
            return await replay(await self.replay_source(), self._run, self._emit, self.generation, self.config.timeout)
        return []

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

    async def restart(self) -> None:
        """Replace the kernel with a fresh one."""
        async with self._lock:
            await self._discard()
            self.state = "not started"
            await self.start(reason="restart")

    async def shutdown(self) -> None:
        """Delete the kernel on the gateway."""
        had = self.kernel_id is not None
        if self._settling is not None and not self._settling.done():
            self._settling.cancel()
        await self._discard()
        self.state = "stopped"
        if had:
            await self._emit("hands_stopped", {"generation": self.generation})

    async def interrupt(self) -> None:
        """Interrupt the running call, if any."""
        if self.kernel_id is not None and self._busy:
            self._interrupt_requested = True
            if self._running:
                await self._rest("POST", f"/api/kernels/{self.kernel_id}/interrupt")
            else:  # a kernel ignores an interrupt that lands before the cell starts: send it then
                self._interrupt_pending = True

    def status(self) -> dict[str, Any]:
        return {"backend": "gateway", "state": "busy" if self._busy else self.state, "generation": self.generation,
                "pid": None, "kernel_id": self.kernel_id, "url": self.url}

    # -- execution -----------------------------------------------------------------

    async def execute(self, code: str, timeout: float | None = None) -> Observation:
        """Run code in the gateway kernel; failures come back as observations."""
        async with self._lock:
            t0 = time.perf_counter()
            notes: list[str] = []
            if self.kernel_id is None:
                try:
                    notes = await self.start()
                except Exception as e:
                    return failure(f"the kernel could not start on the gateway: {e}", ename="KernelStartError")
            timeout = min(timeout or self.config.timeout, self.config.max_timeout)
            self._busy = True
            try:
                obs = await self._run(code, timeout)
            except asyncio.CancelledError:
                # the caller gave up (a user interrupt): stop the cell too, once it has started
                kid, running = self.kernel_id, self._running
                if kid is not None and self._msg_id is not None:
                    if running:
                        await asyncio.shield(self._interrupt_kernel(kid))
                    self._settling = asyncio.get_running_loop().create_task(self._settle(kid, self._msg_id, running))
                raise
            finally:
                self._busy = self._running = self._interrupt_pending = False
                self._interrupt_requested = False
            obs.notes = notes + obs.notes
            obs.generation = obs.generation or self.generation
            obs.duration_ms = round((time.perf_counter() - t0) * 1000, 1)
            return obs

    async def _run(self, code: str, timeout: float) -> Observation:
        col = Collector(self.config.output_limit, self.generation)
        msg_id = self._msg_id = self._send("shell", "execute_request", {"code": code, "silent": False, "store_history": True,
                                                          "allow_stdin": False, "stop_on_error": True})
        deadline = time.monotonic() + timeout
        interrupted_at: float | None = None
        while True:
            now = time.monotonic()
            if interrupted_at is None and now > deadline:
                interrupted_at = now
                await self._emit("hands_timeout", {"generation": self.generation, "timeout": timeout, "action": "interrupt"})
                await self._rest("POST", f"/api/kernels/{self.kernel_id}/interrupt")
            elif interrupted_at is not None and now > interrupted_at + self.config.interrupt_grace:
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
                self._running = True
                if self._interrupt_pending:
                    self._interrupt_pending = False
                    await self._rest("POST", f"/api/kernels/{self.kernel_id}/interrupt")
            elif col.feed(t, c):
                break
        obs = col.done()
        if interrupted_at is not None:
            obs.truncated.append(TIMED_OUT.format(timeout=timeout))
        elif self._interrupt_requested:
            obs.notes.append("[interrupted on request; the kernel and its state survive]")
        return obs

    async def _interrupt_kernel(self, kid: str) -> None:
        try:
            await self._rest("POST", f"/api/kernels/{kid}/interrupt")
        except GatewayError:
            pass  # gone already: the next call finds out

    async def _settle(self, kid: str, msg_id: str, interrupted: bool) -> None:
        """After a cancelled call: interrupt it once it starts, wait for it to end, or replace the kernel."""
        async with self._lock:
            deadline = time.monotonic() + self.config.interrupt_grace
            while self.kernel_id == kid:
                if time.monotonic() > deadline:
                    await self._emit("hands_timeout", {"generation": self.generation, "timeout": None,
                                                       "action": "replaced", "grace": self.config.interrupt_grace,
                                                       "cause": "a cancelled call did not stop"})
                    await self._discard()
                    self.state = "dead"
                    return
                try:
                    msg = await asyncio.wait_for(self._queue.get(), POLL)
                except asyncio.TimeoutError:
                    continue
                if msg is CLOSED:
                    await self._queue.put(CLOSED)  # for the next call to find
                    return
                if msg.get("parent_header", {}).get("msg_id") != msg_id or msg.get("channel") != "iopub":
                    continue
                t = msg.get("msg_type") or msg["header"]["msg_type"]
                if t == "execute_input" and not interrupted:
                    interrupted = True
                    await self._interrupt_kernel(kid)
                    deadline = time.monotonic() + self.config.interrupt_grace
                elif t == "status" and msg.get("content", {}).get("execution_state") == "idle":
                    return

    async def _died(self, how: str, col: Collector) -> Observation:
        gen = self.generation
        await self._emit("hands_died", {"generation": gen, "exit_code": None, "signal": None, "how": how,
                                        "during": "call", "kernel_id": self.kernel_id})
        await self._discard()
        self.state = "dead"
        partial = col.done()
        return failure(death_note(how), ename="KernelDied", generation=gen, stdout=partial.stdout, stderr=partial.stderr)

    async def _replace_stuck(self, timeout: float, col: Collector) -> Observation:
        gen = self.generation
        await self._emit("hands_timeout", {"generation": gen, "timeout": timeout, "action": "replaced",
                                           "grace": self.config.interrupt_grace})
        await self._discard()
        self.state = "dead"
        partial = col.done()
        return failure(stuck_note(timeout, self.config.interrupt_grace), ename="KernelTimeout", generation=gen,
                       stdout=partial.stdout, stderr=partial.stderr)
