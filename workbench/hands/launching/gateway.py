"""Kernels on a Jupyter Kernel Gateway (or Enterprise Gateway): REST to start them, a websocket to talk.

REST (`/api/kernels`) starts, interrupts and deletes kernels; the websocket
`/api/kernels/{id}/channels` carries Jupyter protocol v5 messages as JSON.

What can be detected over a gateway, and what cannot:
- a kernel that dies: the gateway's restarter notices (its `time_to_dead`,
  3 s by default, is the gateway's setting, not ours) and sends a `status`
  of `restarting` (or `dead`) on the websocket; we treat either as a death,
  delete that kernel and start a fresh one for the next call. The exit code
  and signal are not sent, so `hands_died` has `exit_code: null`.
  Sooner than that, the probe: while no cell runs (from an execute_request's
  send to its idle status), a `kernel_info_request` goes on the control channel
  every PROBE_EVERY seconds, and a kernel that answers nothing (no reply, no
  status, no output) for `probe` seconds after one counts as dead. A cell
  that runs is never judged by the probe (its C code may hold the GIL that the
  control and iopub threads need): a death then is the restarter's to notice.
- limits: the gateway's own business, except what a kernel can set on itself:
  rlimits (address space, open files, file size, CPU seconds), set by code
  when the kernel starts. A kernel running as root on the gateway could
  raise them again, and `limits` says so.
- a gateway that dies or drops the connection: the websocket closes; the
  pending call gets an error observation and the next call starts over.
- limits, sandboxing and the kernel's working directory are the gateway's
  business; only `KERNEL_*` (and whitelisted) variables of `env` reach it.
- a message over `max_message` bytes: tornado refuses it and drops the
  websocket; if the kernel is still there, we connect again and the call's
  observation says that output was lost (what the kernel sent meanwhile is gone).

Only messages of the call in flight are kept, within a byte budget, and each is
checked here: kernel code can publish anything on iopub.
"""

from __future__ import annotations

import ast
import asyncio
import json
import time
import uuid
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from ...egress import EgressSettings, Vault
from ...egress.network import Lease, NetworkEgress, proxy_env
from ..base import IDLE_AFTER_REPLY, IDLE_NEVER_CAME, Death, Dropped, Kernel, Place
from ..files import NoWorkspace
from ..isolating.limits import AS_OVERHEAD_MB, Limits
from .channel import MAX_MESSAGE, RESERVE, SMALL, inbox_budget
from .proxies import SessionProxies
from .reaper import KernelRegistry, host_alive

# Run in a gateway kernel when it starts: the rlimits a process may set on itself, and how each was set.
LIMITS_CODE = """\
def _wb_limits(asked):
    import os, resource
    how, root = {}, os.geteuid() == 0
    used = resource.getrusage(resource.RUSAGE_SELF)
    for key, name, value in asked:
        res = getattr(resource, name)
        if key == "cpu":  # the kernel's CPU time so far counts: the limit is on what its code may use
            value += int(used.ru_utime + used.ru_stime) + 1
        hard = value + 1 if key == "cpu" else value
        old_soft, old_hard = resource.getrlimit(res)
        if old_hard != resource.RLIM_INFINITY and old_hard < hard:
            hard = old_hard
        resource.setrlimit(res, (min(value, hard), hard))
        how[key] = f"rlimit {min(value, hard)}, set in the kernel" + (" (it runs as root: its code could raise it)"
                                                                     if root else "")
    return how
_wb_how = __import__("json").dumps(_wb_limits(%r))
del _wb_limits
"""

# What a gateway's kernel lacks that the brain's own machine's kernels have, said in each `hands_started.limits`
# (docs/settings.md "On a gateway"): the gateway's machine holds its files and its network, not this one
GATEWAY_GAPS = MappingProxyType({
    "workspace": "none here: its files are on the gateway's machine (no files routes, attachments or task files; "
                 "a python verifier checks the answer alone)",
    "spare": "none: a dead kernel is replaced from the warm pool, or started cold",
    "egress": "the gateway's: no egress proxy of the workbench offered (gateway_egress), no credential injected",
})

# the kernel's HTTP clients (urllib, requests, httpx, pip) go through the workbench's egress proxy: its variables set
# in the kernel's own environment (a gateway passes a kernel only KERNEL_* variables); no name is left behind
PROXY_CODE = "__import__('os').environ.update(%r)"

PROBE_EVERY = 0.2  # seconds between control-channel probes of a kernel that runs no cell
DELETE_RETRY_S = 30.0  # how long a kernel's DELETE is asked again while the gateway answers it with a 5xx
WAKE = object()  # put on a kernel's queue when it dies, so that a reader waiting on it looks again
RECONNECTS = 10  # websockets a kernel may lose (and get again) before it counts as gone


class GatewayError(RuntimeError):
    """The gateway refused or failed a request; `status` is its HTTP status when it answered one."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class GatewayLauncher:
    """Starts kernels on a Jupyter Kernel Gateway; one HTTP client for all of them."""

    name = "gateway"
    python = ""  # its kernels' interpreter is on the gateway's machine

    def __init__(self, url: str, token: str = "", kernel_name: str = "python3", max_message: int = MAX_MESSAGE,
                 *, limits: Limits | None = None, probe: float = 2.0, registry: KernelRegistry | None = None,
                 egress: NetworkEgress | None = None, vault: Vault | None = None,
                 egress_settings: EgressSettings | None = None):
        self.url, self.token, self.kernel_name = url.rstrip("/"), token, kernel_name
        # the workbench's egress proxy for its kernels, over the network (`gateway_egress`): each kernel a lease
        self.egress = egress
        self.proxies = SessionProxies(vault, egress_settings)
        self.max_message = max_message
        self.limits = limits
        # each kernel started here is recorded (its id and this gateway, never the token) until it is deleted, so
        # the next host deletes what a host killed by SIGKILL left running on the gateway (`reap`)
        self.registry = registry
        self.probe = probe  # seconds a kernel may leave a request unanswered (no cell running); 0: no probe
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
                               f"{e.response.reason_phrase}", e.response.status_code) from None
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
        # the session's egress proxy first: a bad policy (an unknown credential) fails before a kernel is made
        proxy = self.proxies.of(place) if self.egress is not None else None
        kernel = GatewayKernel(self)
        try:
            env = dict(place.env if place else {})
            # the kernel's id is chosen here and recorded before it is asked for (Enterprise Gateway takes it from
            # KERNEL_ID, a kernel gateway from `kernel_id`), so a host killed while the gateway starts it is no
            # reason for it to run there unseen
            asked = env.setdefault("KERNEL_ID", str(uuid.uuid4()))
            self._record(asked)
            kernel.kernel_id = asked  # a start that fails from here (a timeout, say) deletes it: it may be there
            model = await self.rest("POST", "/api/kernels", {"name": self.kernel_name, "env": env, "kernel_id": asked},
                                    timeout)
            if not isinstance(model, dict) or not isinstance(model.get("id"), str):
                raise GatewayError("the gateway's answer to starting a kernel has no kernel id")
            kernel.kernel_id = model["id"]
            if kernel.kernel_id != asked:  # a gateway that chose its own id
                self._record(kernel.kernel_id)
                self._forget(asked)
            await kernel.connect(timeout)
            await kernel.reply(kernel.send("shell", "kernel_info_request", {}), timeout)
            if self.limits is not None and self.limits.any():
                kernel.limits = await kernel.set_limits(self.limits, timeout)
            kernel.limits.update(GATEWAY_GAPS)
            if self.egress is not None and proxy is not None:
                await self.egress.start()
                kernel.lease = self.egress.lease(proxy)
                await kernel.run_quietly(PROXY_CODE % (proxy_env(kernel.lease.url),), timeout, "pointing it at the egress proxy")
                kernel.limits["egress"] = (f"the workbench's egress proxy at {self.egress.address} (the kernel's HTTP(S)_PROXY): "
                                           "this session's allowlist, credentials and budgets for what goes through it; "
                                           "the kernel's own network is the gateway's to limit")
            if self.probe > 0:
                kernel.watch(self.probe)
        except BaseException:
            await asyncio.shield(kernel.kill())
            raise
        kernel.boot_ms = round((time.perf_counter() - t0) * 1000, 1)
        return kernel

    async def make_workspace(self, place: Place) -> None:
        """A gateway's kernels keep their files on its machine: none can be put in from here."""
        raise NoWorkspace(f"this session's kernels run on a {self.name} whose files are not on this machine; "
                          "files cannot be copied into its workspace")

    def owner(self, place: Place) -> tuple[int, int] | None:
        """Nothing of a gateway's kernels is written from here."""
        return None

    async def release(self, place: Place) -> None:
        """Nothing is held per session."""

    def fits(self, place: Place) -> bool:
        """A pooled gateway kernel was started without the session's variables: only for sessions with none."""
        return not place.env

    async def adopt(self, kernel: Kernel, place: Place) -> str:
        """A pooled kernel's egress now follows the session's policy and log; the workdir is the gateway's business."""
        if not isinstance(kernel, GatewayKernel):
            raise TypeError(f"a gateway launcher cannot adopt a {type(kernel).__name__}")
        if kernel.lease is not None:
            kernel.lease.proxy = self.proxies.of(place)
        return ""

    def _record(self, kernel_id: str) -> None:
        if self.registry is not None:
            self.registry.add(registry_key(kernel_id), 0, gateway_url=self.url, kernel_id=kernel_id)

    def _forget(self, kernel_id: str) -> None:
        if self.registry is not None:
            self.registry.remove(registry_key(kernel_id))

    async def reap(self) -> list[str]:
        """Delete the kernels on this gateway that hosts now gone started and could not delete (a SIGKILL); their ids.
        A kernel the gateway no longer has is forgotten; one it could not be asked about is kept for the next start."""
        reaped: list[str] = []
        if self.registry is None:
            return reaped
        for entry in self.registry.entries().values():
            kernel_id = entry.get("kernel_id")
            if entry.get("gateway_url") != self.url or not isinstance(kernel_id, str) or host_alive(entry):
                continue
            if await _delete(self, kernel_id):
                self._forget(kernel_id)
                reaped.append(kernel_id)
        return reaped

    async def aclose(self) -> None:
        """Stop the egress listener; close the HTTP client."""
        if self.egress is not None:
            await self.egress.close()
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
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._waiting = 0  # bytes of the messages in the queue
        self._current: str | None = None  # the msg_id of the call in flight: only its iopub messages are kept
        self._lost_at: float | None = None  # when output of the current call was lost
        self._overflowed = False
        self._probe: str | None = None  # a kernel_info_request sent after a reconnect: its reply follows the call's end
        self._replied: dict[str, float] = {}
        self._reply_content: dict[str, dict[str, Any]] = {}  # the last execute reply read while reading its output
        self._reconnects = 0
        self._reader: asyncio.Task[None] | None = None
        self._session = uuid.uuid4().hex
        self._death: Death | None = None
        self.stopped = False
        # the probe: when a request first went unanswered (None: the kernel spoke since), and the
        # execute_request the kernel is running (its busy status came, its idle one not yet)
        self._unanswered_since: float | None = None
        self._running: str | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.lease: Lease | None = None  # its way out through the workbench's egress proxy, if the host offers one

    @property
    def ident(self) -> dict[str, Any]:
        return {"pid": None, "kernel_id": self.kernel_id}

    async def connect(self, timeout: float) -> None:
        if self.kernel_id is None:
            raise GatewayError("no kernel to connect to")
        req = HTTPRequest(self.gateway.ws_url(self.kernel_id), headers=self.gateway.headers(), request_timeout=timeout)
        self._ws = await websocket_connect(req, max_message_size=self.gateway.max_message)
        self._reader = asyncio.get_running_loop().create_task(self._read(self._ws))

    async def _read(self, ws: WebSocketClientConnection) -> None:
        while True:
            raw = await ws.read_message()
            if raw is None:
                if not self.stopped and self._death is None and not await self._reconnect():
                    self._died("the gateway closed the websocket")
                return
            msg = _parse(raw)
            if msg is None:
                continue
            self._unanswered_since = None  # it spoke: alive
            self._track(msg)
            if msg["channel"] == "iopub":
                if msg["msg_type"] == "status" and isinstance(msg["content"], dict) \
                        and msg["content"].get("execution_state") in ("restarting", "dead"):
                    self._died(f"the gateway reported it {msg['content']['execution_state']}")
                    continue
                if isinstance(msg["parent"], dict) and msg["parent"].get("msg_id") != self._current:
                    continue  # another request's output
            budget = inbox_budget(self.gateway.max_message)
            if self._waiting + len(raw) > budget + (RESERVE if len(raw) <= SMALL else 0):  # nobody reads fast enough
                if not self._overflowed:
                    self._overflowed, self._lost_at = True, time.monotonic()
                    self._queue.put_nowait(Dropped(f"[some of the kernel's output was dropped: more than {budget:,} "
                                                   "bytes of it waited to be read at once]"))
                continue
            self._waiting += len(raw)
            msg["size"] = len(raw)
            self._queue.put_nowait(msg)

    async def _reconnect(self) -> bool:
        """The websocket went but the kernel may not have (tornado drops it on a message over max_message)."""
        if self._reconnects >= RECONNECTS or self.kernel_id is None:
            return False
        self._reconnects += 1
        try:
            model = await self.gateway.rest("GET", f"/api/kernels/{self.kernel_id}", timeout=10)
            if not isinstance(model, dict) or model.get("execution_state") == "dead":
                return False
            await self.connect(30)
        except (GatewayError, OSError, TimeoutError):
            return False
        # the call's own reply went to the old connection: the kernel answers this one once the call is done
        self._probe = self.send("shell", "kernel_info_request", {})
        self._lost_at = time.monotonic()
        self._queue.put_nowait(Dropped(
            f"[output was lost: the kernel sent a message over the {self.gateway.max_message:,} bytes the hands read "
            "(max_message_mb), or the connection broke, so its websocket was made again; what it sent meanwhile is gone]"))
        return True

    def _track(self, msg: dict[str, Any]) -> None:
        """Follow whether the kernel runs a cell: from its execute_request's send until its idle status."""
        parent, content = msg["parent"], msg["content"]
        if msg["channel"] != "iopub" or msg["msg_type"] != "status" or not isinstance(parent, dict) \
                or not isinstance(content, dict):
            return
        state, msg_id = content.get("execution_state"), parent.get("msg_id")
        if state == "idle" and msg_id == self._running:
            self._running = None

    def watch(self, probe: float) -> None:
        """Start probing the kernel (see the module's docstring)."""
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._probe_loop(probe))

    async def _probe_loop(self, probe: float) -> None:
        while self._death is None and not self.stopped:
            await asyncio.sleep(PROBE_EVERY)
            if self._running is not None:
                continue  # a cell runs: the restarter's to judge
            since = self._unanswered_since
            if since is not None and time.monotonic() - since > probe:
                self._died(f"it answered nothing for {probe:g} s, not even a kernel_info_request on the control channel")
                return
            self.send("control", "kernel_info_request", {})

    async def set_limits(self, limits: Limits, timeout: float) -> dict[str, str]:
        """Set what rlimits the kernel can set on itself; returns how each limit is enforced (or why not)."""
        asked: list[tuple[str, str, int]] = []
        how: dict[str, str] = {}
        if limits.memory_mb:
            asked.append(("memory", "RLIMIT_AS", (limits.memory_mb + AS_OVERHEAD_MB) * 1024 * 1024))
        for key, name, value in (("open_files", "RLIMIT_NOFILE", limits.max_open_files),
                                 ("file_size", "RLIMIT_FSIZE", limits.max_file_mb * 1024 * 1024),
                                 ("cpu", "RLIMIT_CPU", limits.cpu_seconds)):
            if value:
                asked.append((key, name, value))
        if limits.max_processes:
            how["processes"] = "not enforced: the gateway's business (RLIMIT_NPROC counts every process of its uid)"
        reply = await self.run_quietly(LIMITS_CODE % (asked,), timeout, "setting the kernel's limits",
                                       {"how": "_wb_how"})
        try:
            text = reply["user_expressions"]["how"]["data"]["text/plain"]
            set_how = json.loads(ast.literal_eval(text))
        except (KeyError, TypeError, ValueError, SyntaxError):
            raise GatewayError("the kernel did not say how its limits were set") from None
        if not isinstance(set_how, dict):
            raise GatewayError("the kernel did not say how its limits were set")
        how.update({str(k): str(v)[:200] for k, v in set_how.items()})
        return how

    async def run_quietly(self, code: str, timeout: float, doing: str,
                          expressions: dict[str, str] | None = None) -> dict[str, Any]:
        """Run the host's own code in the kernel (not in its history, no output kept); its reply, or GatewayError."""
        msg_id = self.send("shell", "execute_request", {
            "code": code, "silent": True, "store_history": False, "allow_stdin": False, "stop_on_error": False,
            "user_expressions": expressions or {}})
        reply = await self.reply(msg_id, timeout)
        if reply.get("status") != "ok":
            raise GatewayError(f"{doing} failed: {reply.get('ename')}: {reply.get('evalue')}")
        return reply

    def _died(self, how: str) -> None:
        if self._death is None:
            self._death = Death(how)
        self._queue.put_nowait(WAKE)

    def send(self, channel: str, msg_type: str, content: dict[str, Any]) -> str:
        """Send a message on the websocket; returns its msg_id."""
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "msg_type": msg_type, "username": "workbench", "session": self._session,
                  "date": datetime.now(UTC).isoformat(), "version": "5.3"}
        if self._unanswered_since is None:
            self._unanswered_since = time.monotonic()
        if self._ws is not None and self._death is None:
            self._ws.write_message(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": content,
                                               "channel": channel, "buffers": []}))
        return msg_id

    def execute(self, code: str, *, silent: bool = False) -> str:
        """Send an execute request; returns its msg_id."""
        msg_id = self.send("shell", "execute_request", {"code": code, "silent": silent, "store_history": not silent,
                                                        "allow_stdin": False, "stop_on_error": not silent})
        if not silent:
            self._current, self._lost_at, self._overflowed = msg_id, None, False
        # running from the send on, not from its busy status: a cell whose C code holds the GIL from its first
        # line keeps the kernel's iopub thread from sending that status, and the probe must not judge it
        self._running = msg_id
        return msg_id

    async def _next(self, deadline: float) -> Any:
        """The next queued message, WAKE when the kernel is gone, None at the deadline."""
        if self._death is not None:
            return WAKE
        try:
            # not wait_for: in 3.11 it swallows a cancel that lands as a message arrives
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                msg = await self._queue.get()
        except TimeoutError:
            return None
        if isinstance(msg, dict):
            self._waiting -= msg["size"]
        return msg

    async def message(self, msg_id: str, timeout: float) -> tuple[str, dict[str, Any]] | Dropped | None:
        """The next iopub message of request `msg_id` (or a note of what was dropped); None if none came
        in `timeout` or the kernel is gone."""
        deadline = time.monotonic() + timeout
        while (msg := await self._next(deadline)) not in (None, WAKE):
            if isinstance(msg, Dropped):
                return msg
            parent = msg["parent"]
            if msg["channel"] == "shell" and isinstance(parent, dict) and parent.get("msg_id") in (msg_id, self._probe):
                self._replied[msg_id] = time.monotonic()
                if parent.get("msg_id") == msg_id and isinstance(msg["content"], dict):
                    self._reply_content = {msg_id: msg["content"]}
            if msg["channel"] != "iopub":
                continue
            if not isinstance(parent, dict):
                return Dropped("[a malformed message from the kernel was dropped: its parent header is not an object]")
            if parent.get("msg_id") == msg_id:
                if not isinstance(msg["msg_type"], str) or not isinstance(msg["content"], dict):
                    return Dropped("[a malformed message from the kernel was dropped: its type is not a string or its "
                                   "content is not an object]")
                return msg["msg_type"], msg["content"]
        if msg is None and await self._idle_after_reply(msg_id):
            if self._lost_at is None:  # nothing was seen lost: say what may be missing, then end
                self._lost_at = time.monotonic()
                return IDLE_NEVER_CAME
            return "status", {"execution_state": "idle"}  # its idle status was lost with the rest
        return None

    async def _idle_after_reply(self, msg_id: str) -> bool:
        """Whether a call whose idle status did not come has ended: its execute_reply, or the reply to the probe sent
        after the websocket was made again (the kernel answers it only once the call is done), came a while ago."""
        replied = self._replied.get(msg_id)
        return replied is not None and time.monotonic() - replied > IDLE_AFTER_REPLY

    async def reply(self, msg_id: str, timeout: float) -> dict[str, Any]:
        """The content of the shell reply to `msg_id`."""
        if (content := self._reply_content.pop(msg_id, None)) is not None:
            return content
        deadline = time.monotonic() + timeout
        while True:
            msg = await self._next(deadline)
            if msg is None:
                raise TimeoutError(f"the kernel on the gateway did not answer within {timeout:g} s")
            if msg is WAKE:
                raise GatewayError(f"the kernel went away: {self._death.how if self._death else 'stopped'}")
            if isinstance(msg, Dropped):
                continue
            parent, content = msg["parent"], msg["content"]
            if msg["channel"] == "shell" and isinstance(parent, dict) and parent.get("msg_id") == msg_id:
                return content if isinstance(content, dict) else {"status": "error", "ename": "MalformedReply"}

    async def death(self) -> Death | None:
        """How the kernel ended, as the websocket told, or None while it lives."""
        return self._death

    async def interrupt(self) -> None:
        """Ask the gateway to interrupt the kernel."""
        try:
            await self.gateway.rest("POST", f"/api/kernels/{self.kernel_id}/interrupt")
        except GatewayError:
            pass  # gone already: death() says so at the next look

    async def freeze(self) -> list[str]:
        """A gateway's kernel cannot be stopped from here (its processes, and its workspace, are on the gateway's machine)."""
        return ["the kernel runs on a gateway: its processes cannot be stopped from here (its workspace is not on "
                "this machine either)"]

    async def thaw(self) -> None:
        """Nothing was stopped."""

    async def kill(self) -> None:
        """Close the websocket and delete the kernel on the gateway; safe to call twice."""
        if self.stopped:
            return
        self.stopped = True
        if self.lease is not None:  # its token is refused from now on, its open connections end
            await self.lease.close()
        if self._death is None:
            self._death = Death("it was stopped")
        ws, reader, watcher = self._ws, self._reader, self._watcher
        if ws is not None:
            ws.close()
        for task in (reader, watcher):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        if self.kernel_id is not None and await _delete(self.gateway, self.kernel_id):
            self.gateway._forget(self.kernel_id)


def registry_key(kernel_id: str) -> str:
    """A gateway kernel's name in the kernel registry (beside local kernels' pids)."""
    return f"gateway-{kernel_id}"


async def _delete(gateway: GatewayLauncher, kernel_id: str) -> bool:
    """Delete a kernel on the gateway; whether it is gone (deleted, or unknown to the gateway). A gateway whose
    restarter is bringing a dead kernel back answers a DELETE in that moment with a 500 and keeps the restarted
    kernel (jupyter_client's shutdown reads a restart future that is not done yet), so a 5xx is asked again for a
    while: a kernel left there would run, unseen, until the gateway stops."""
    deadline = time.monotonic() + DELETE_RETRY_S
    while True:
        try:
            await gateway.rest("DELETE", f"/api/kernels/{kernel_id}")
            return True
        except GatewayError as e:
            if e.status == 404:
                return True  # gone already
            if e.status is None or e.status < 500 or time.monotonic() > deadline:
                return False  # the gateway is not there, or will not: nothing we can stop now
        await asyncio.sleep(0.2)


def _parse(raw: str | bytes) -> dict[str, Any] | None:
    """A websocket message's channel, type, parent header and content (unchecked), or None if it is not JSON."""
    try:
        msg = json.loads(raw)
    except ValueError:
        return None  # not a Jupyter message in JSON (a binary one carries buffers, which nothing here reads)
    if not isinstance(msg, dict):
        return None
    header = msg.get("header")
    msg_type = msg.get("msg_type") or (header.get("msg_type") if isinstance(header, dict) else None)
    return {"channel": msg.get("channel"), "msg_type": msg_type, "parent": msg.get("parent_header"),
            "content": msg.get("content")}
