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

from .base import EventSink, Observation, failure
from .collect import TIMED_OUT, Collector, death_note, replay, setup_code, stuck_note
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


class KernelHands:
    """Hands on a Jupyter kernel process: lazy, watched, replaceable."""

    def __init__(self, config: HandsConfig | None = None, *, launcher: Any = None, on_event: EventSink | None = None,
                 pool: Any = None, limits: Limits | None = None, registry: Any = None):
        self.config = config or HandsConfig()
        self.launcher = launcher or LocalLauncher()
        self.on_event = on_event
        self.pool, self.limits, self.registry = pool, limits, registry
        self.replay_source: ReplaySource | None = None  # set by the brain; hands never read the log
        self.generation = 0
        self.kernel: LiveKernel | None = None
        self.state = "not started"
        self._workdir: Path | None = Path(self.config.workdir) if self.config.workdir else None
        self._owns_workdir = False
        self._lock = asyncio.Lock()
        self._start_lock = asyncio.Lock()
        self._busy = False
        self._interrupt_requested = False
        self._running = False  # the kernel has begun running the current cell (execute_input seen)
        self._interrupt_pending = False
        self._msg_id: str | None = None  # the execute request in flight
        self._settling: asyncio.Task | None = None  # finishing a cancelled call

    async def _emit(self, type: str, payload: dict[str, Any]) -> None:
        if self.on_event is not None:
            await self.on_event(type, payload)

    @property
    def pid(self) -> int | None:
        return self.kernel.pid if self.kernel else None

    # -- lifecycle ---------------------------------------------------------

    async def start(self, reason: str = "first call") -> list[str]:
        """Make sure a kernel is ready (normally the first execute does this); returns notes for the model."""
        async with self._start_lock:
            if self.kernel is not None:
                return []
            if self.state == "dead":
                reason = "replace a dead kernel"
            t0 = time.perf_counter()
            self.state = "starting"
            try:
                lk, pooled = await self._provision()
                await self._prepare(lk, pooled)
            except BaseException:
                self.state = "failed"
                raise
            self.kernel = lk
            self.generation += 1
            self.state = "idle"
            await self._emit("hands_started", {
                "generation": self.generation, "pid": lk.pid, "launcher": self.launcher.name, "reason": reason,
                "start_ms": round((time.perf_counter() - t0) * 1000, 1), "pooled": pooled,
                "boot_ms": lk.boot_ms, "limits": lk.applied,
            })
            if reason != "restart" and self.config.replay and self.replay_source is not None:
                return await self._replay()
            return []

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

    async def _replay(self) -> list[str]:
        return await replay(await self.replay_source(), self._run, self._emit, self.generation, self.config.timeout)

    async def _discard(self) -> None:
        """Forget the current kernel (dead or to be replaced) and free what it held."""
        lk, self.kernel = self.kernel, None
        if lk is not None:
            await asyncio.shield(lk.kill())

    async def restart(self) -> None:
        """Replace the kernel with a fresh one."""
        async with self._lock:
            await self._discard()
            self.state = "not started"
            await self.start(reason="restart")

    async def shutdown(self) -> None:
        """Stop the kernel (if any) and remove the session's temporary workdir."""
        had = self.kernel is not None
        if self._settling is not None and not self._settling.done():
            self._settling.cancel()
        await self._discard()
        self.state = "stopped"
        if self._owns_workdir and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir, self._owns_workdir = None, False
        if had:
            await self._emit("hands_stopped", {"generation": self.generation})

    async def interrupt(self) -> None:
        """Interrupt the running call, if any."""
        if self.kernel is not None and self._busy:
            self._interrupt_requested = True
            if self._running:
                await self.kernel.interrupt()
            else:  # a kernel ignores an interrupt that lands before the cell starts: send it then
                self._interrupt_pending = True

    def status(self) -> dict[str, Any]:
        return {"backend": self.launcher.name, "state": "busy" if self._busy else self.state,
                "generation": self.generation, "pid": self.pid}

    # -- execution ---------------------------------------------------------

    async def execute(self, code: str, timeout: float | None = None) -> Observation:
        """Run code in the kernel; returns what it printed, returned, displayed or raised."""
        async with self._lock:
            t0 = time.perf_counter()
            notes: list[str] = []
            if self.kernel is not None and (status := await self.kernel.poll()) is not None:
                how = await self._record_death(status, during="idle")
                notes.append(f"[the kernel died between calls ({how}); this call runs in a fresh kernel, "
                             "so earlier variables and imports are gone]")
            if self.kernel is None:
                try:
                    notes += await self.start()
                except Exception as e:  # a kernel that cannot start is data for the model
                    return failure(f"the kernel could not start: {e}", ename="KernelStartError", notes=notes)
            timeout = min(timeout or self.config.timeout, self.config.max_timeout)
            self._busy = True
            try:
                obs = await self._run(code, timeout)
            except asyncio.CancelledError:
                # the caller gave up (a user interrupt): stop the code too, keep the kernel
                lk, running = self.kernel, self._running
                if lk is not None and self._msg_id is not None:
                    if running:
                        await asyncio.shield(lk.interrupt())
                    self._settling = asyncio.get_running_loop().create_task(self._settle(lk, self._msg_id, running))
                raise
            finally:
                self._busy = self._running = self._interrupt_pending = False
                self._interrupt_requested = False
            obs.notes = notes + obs.notes
            obs.generation = obs.generation or self.generation
            obs.duration_ms = round((time.perf_counter() - t0) * 1000, 1)
            return obs

    async def _run(self, code: str, timeout: float) -> Observation:
        lk = self.kernel
        col = Collector(self.config.output_limit, self.generation)
        msg_id = self._msg_id = lk.kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=True)
        deadline = time.monotonic() + timeout
        interrupted_at: float | None = None
        next_poll = 0.0
        while True:
            now = time.monotonic()
            if now >= next_poll:  # look at the process even while output floods in
                next_poll = now + POLL
                status = await lk.poll()
                if status is not None:
                    return await self._died(status, col)
                if interrupted_at is None and now > deadline:
                    interrupted_at = now
                    await self._emit("hands_timeout", {"generation": self.generation, "timeout": timeout, "action": "interrupt"})
                    await lk.interrupt()
                elif interrupted_at is not None and now > interrupted_at + self.config.interrupt_grace:
                    return await self._replace_stuck(timeout, col)
            try:
                msg = await lk.kc.get_iopub_msg(timeout=POLL)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "execute_input":
                self._running = True
                if self._interrupt_pending:
                    self._interrupt_pending = False
                    await lk.interrupt()
            elif col.feed(msg["msg_type"], msg["content"]):
                break
        obs = col.done()
        if interrupted_at is not None:
            obs.truncated.append(TIMED_OUT.format(timeout=timeout))
        elif self._interrupt_requested:
            obs.notes.append("[interrupted on request; the kernel and its state survive]")
        return obs

    async def _settle(self, lk: LiveKernel, msg_id: str, interrupted: bool) -> None:
        """After a cancelled call: interrupt it once it starts, wait for it to end, or replace a stuck kernel.

        Holds the lock, so the next call waits for this (at most about the grace period) instead
        of queueing behind a cell nobody is waiting for.
        """
        async with self._lock:
            deadline = time.monotonic() + self.config.interrupt_grace
            try:
                while lk is self.kernel and await lk.poll() is None:
                    if time.monotonic() > deadline:
                        await self._emit("hands_timeout", {"generation": self.generation, "timeout": None,
                                                           "action": "replaced", "grace": self.config.interrupt_grace,
                                                           "cause": "a cancelled call did not stop"})
                        await self._discard()
                        self.state = "dead"
                        return
                    try:
                        msg = await lk.kc.get_iopub_msg(timeout=POLL)
                    except queue.Empty:
                        continue
                    if msg["parent_header"].get("msg_id") != msg_id:
                        continue
                    if msg["msg_type"] == "execute_input" and not interrupted:
                        interrupted = True
                        await lk.interrupt()
                        deadline = time.monotonic() + self.config.interrupt_grace
                    elif msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
                        return
            except Exception:  # the kernel was stopped under us (shutdown): nothing left to settle
                return

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
        await self._discard()
        self.state = "dead"
        return how

    async def _died(self, status: int, col: Collector) -> Observation:
        gen = self.generation
        how = await self._record_death(status, during="call")
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
