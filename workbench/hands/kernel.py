"""Hands backed by a Jupyter kernel process, started with jupyter_client.

The kernel is not the user's notebook kernel and not the server process: it
is a separate process with an explicit, allowlisted environment, talking ZMQ
over unix sockets in a run directory of its own. A launcher decides how the
process starts (plain, or inside a sandbox); `live.boot` starts it with
limits; this class owns the session's succession of kernels: lazy start or
a warm one from the pool, death detection, timeouts, interrupts, replay.
"""

from __future__ import annotations

import asyncio
import queue
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from .base import EventSink, Observation
from .collect import Collector, setup_code
from .lifecycle import Deadline, Lifecycle
from .limits import Limits
from .live import LiveKernel, LocalLauncher, boot, kernel_env

__all__ = ["HandsConfig", "KernelHands", "LocalLauncher", "kernel_env"]

POLL = 0.03  # seconds between looks at the kernel process while a call runs

# Returns the earlier successful calls marked replayable: [{"tool_use_id", "code"}].
ReplaySource = Callable[[], Awaitable[list[dict[str, Any]]]]


@dataclass
class HandsConfig:
    """Settings of one session's hands."""

    timeout: float = 60.0  # default per-call timeout, seconds
    max_timeout: float = 600.0  # the cap on a timeout the model asks for
    interrupt_grace: float = 5.0  # after an interrupt, how long before the kernel is replaced
    output_limit: int = 20_000  # characters of stdout/stderr/results kept per call
    startup_timeout: float = 60.0
    workdir: str | None = None  # the kernel's working directory (default: a temp dir)
    env: dict[str, str] = field(default_factory=dict)  # extra variables for the kernel
    replay: bool = False  # re-run replayable calls in a fresh kernel after a death


class KernelHands(Lifecycle):
    """Hands on a Jupyter kernel process: lazy, watched, replaceable."""

    def __init__(self, config: HandsConfig | None = None, *, launcher: Any = None, on_event: EventSink | None = None,
                 pool: Any = None, limits: Limits | None = None, registry: Any = None):
        super().__init__(config or HandsConfig(), on_event)
        self.launcher = launcher or LocalLauncher()
        self.pool, self.limits, self.registry = pool, limits, registry
        self.replay_source: ReplaySource | None = None
        self.kernel: LiveKernel | None = None
        self._workdir: Path | None = Path(self.config.workdir) if self.config.workdir else None
        self._owns_workdir = False

    @property
    def pid(self) -> int | None:
        return self.kernel.pid if self.kernel else None

    def _handle(self) -> LiveKernel | None:
        return self.kernel

    def _backend(self) -> str:
        return self.launcher.name

    # -- lifecycle ---------------------------------------------------------

    async def _boot(self) -> tuple[dict[str, Any], dict[str, Any]]:
        lk, pooled = await self._provision()
        await self._prepare(lk, pooled)
        self.kernel = lk
        return {"pid": lk.pid, "launcher": self.launcher.name}, {"pooled": pooled, "boot_ms": lk.boot_ms, "limits": lk.applied}

    async def _provision(self) -> tuple[LiveKernel, bool]:
        env = self.config.env
        if self._workdir is not None:
            self._workdir.mkdir(parents=True, exist_ok=True)
        adoptable = hasattr(self.launcher, "adopt_code") or (self._workdir is None and not env)
        if self.pool is not None and adoptable:
            lk = await self.pool.take()
            if lk is not None:
                return lk, True
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="workbench-work-"))
            self._owns_workdir = True
        lk = await boot(self.launcher, env=kernel_env(env), workdir=self._workdir, limits=self.limits,
                        registry=self.registry, startup_timeout=self.config.startup_timeout)
        return lk, False

    async def _prepare(self, lk: LiveKernel, pooled: bool) -> None:
        """Install the in-kernel output cap and, for a pooled kernel, the session's workdir and env."""
        code = setup_code(self.config.output_limit)
        if pooled:
            if hasattr(self.launcher, "adopt"):  # the sandbox points the kernel's egress at this session
                await self.launcher.adopt(lk)
            if self._workdir is None:  # the session adopts the pooled kernel's workdir as its own
                self._workdir, self._owns_workdir, lk.owns_workdir = lk.workdir, True, False
            if hasattr(self.launcher, "adopt_code") and (lk.workdir != self._workdir or self.config.env):
                code += self.launcher.adopt_code(self._workdir, self.config.env) + "\n"
        try:
            if pooled and hasattr(self.launcher, "adopt"):  # e.g. a sandbox attaches this session's egress proxy
                await self.launcher.adopt(lk)
            reply = await _silent(lk.kc, code, self.config.startup_timeout)
        except BaseException:
            await asyncio.shield(lk.kill())
            raise
        if reply.get("status") != "ok":
            await lk.kill()
            raise RuntimeError(f"preparing the kernel failed: {reply.get('ename')}: {reply.get('evalue')}")

    async def _discard(self) -> None:
        lk, self.kernel = self.kernel, None
        if lk is not None:
            await asyncio.shield(lk.kill())

    async def _after_shutdown(self) -> None:
        if self._owns_workdir and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir, self._owns_workdir = None, False

    async def _interrupt_now(self) -> None:
        await self.kernel.interrupt()

    async def _interrupt_handle(self, handle: LiveKernel) -> None:
        await handle.interrupt()

    # -- execution ---------------------------------------------------------

    async def _check_idle(self) -> list[str]:
        if self.kernel is not None and (status := await self.kernel.poll()) is not None:
            how = await self._record_death(status, during="idle")
            return [f"[the kernel died between calls ({how}); this call runs in a fresh kernel, "
                    "so earlier variables and imports are gone]"]
        return []

    async def _run(self, code: str, timeout: float) -> Observation:
        lk = self.kernel
        col = Collector(self.config.output_limit, self.generation)
        msg_id = self._msg_id = lk.kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=True)
        deadline = Deadline(self, timeout)
        next_poll = 0.0
        while True:
            now = time.monotonic()
            if now >= next_poll:  # look at the process even while output floods in
                next_poll = now + POLL
                status = await lk.poll()
                if status is not None:
                    return await self._died(status, col)
                if await deadline.stuck():
                    return await self._replace_stuck(timeout, col)
            try:
                msg = await lk.kc.get_iopub_msg(timeout=POLL)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "execute_input":
                await self._cell_started()
            elif col.feed(msg["msg_type"], msg["content"]):
                break
        return self._finish(col, timeout, deadline.passed)

    async def _still_current(self, handle: LiveKernel) -> bool:
        return handle is self.kernel and await handle.poll() is None

    async def _settle_msg(self, handle: LiveKernel, msg_id: str) -> Any:
        try:
            msg = await handle.kc.get_iopub_msg(timeout=POLL)
        except queue.Empty:
            return None
        if msg["parent_header"].get("msg_id") != msg_id:
            return None
        return msg["msg_type"], msg["content"]

    async def _record_death(self, status: int, during: str) -> str:
        """Log a death, forget the kernel, and return how it died, in words."""
        lk, gen = self.kernel, self.generation
        sig = -status if status < 0 else None
        if sig:
            how = f"signal {_signame(sig)}"
        elif status > 128 and _signame(status - 128) != str(status - 128):
            how = f"exit code {status}, i.e. signal {_signame(status - 128)} inside a wrapper"
        else:
            how = f"exit code {status}"
        if lk is not None and lk.oom_killed():
            how += ", out of memory: it went over its memory limit"
        await self._emit("hands_died", {"generation": gen, "exit_code": status, "signal": sig, "how": how,
                                        "during": during, "pid": lk.pid if lk else None})
        await self._lose()
        return how

    async def _died(self, status: int, col: Collector) -> Observation:
        gen = self.generation
        how = await self._record_death(status, during="call")
        return self._death_observation(how, gen, col)


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


async def _silent(kc: Any, code: str, timeout: float) -> dict[str, Any]:
    """Run setup code without history or output; returns the execute_reply content."""
    msg_id = kc.execute(code, silent=True, store_history=False, allow_stdin=False)
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the kernel did not answer a setup request")
        msg = await kc.get_shell_msg(timeout=left)
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg["content"]
