"""The lifecycle every kind of hands shares, whatever runs the kernel.

A session's hands own a succession of kernels: started lazily by the first
call, numbered by `generation`, replaced after a death, a stuck timeout or a
restart, and stopped once. Calls run one at a time under a lock; a call the
caller gives up on (a user interrupt) is interrupted once the kernel has
begun running it, and settled in the background before the next call runs.

`Lifecycle` holds that logic once; a subclass says only what differs: how a
kernel starts (`_boot`), is thrown away (`_discard`), is interrupted, and
how a call runs (`_run`, which reports through the helpers below).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .base import EventSink, Observation, failure
from .collect import TIMED_OUT, Collector, death_note, replay, stuck_note

GONE = object()  # from `_settle_msg`: the connection to the kernel is gone, nothing left to settle


class Deadline:
    """A call's timeout: interrupt the cell when it passes, give up on the kernel a grace period later."""

    def __init__(self, hands: "Lifecycle", timeout: float):
        self.hands, self.timeout = hands, timeout
        self.at = time.monotonic() + timeout
        self.interrupted_at: float | None = None

    @property
    def passed(self) -> bool:
        return self.interrupted_at is not None

    async def stuck(self) -> bool:
        """Interrupt once the timeout passes; true when the kernel then outlives the grace period."""
        now = time.monotonic()
        if self.interrupted_at is None:
            if now > self.at:
                self.interrupted_at = now
                await self.hands._emit("hands_timeout", {"generation": self.hands.generation, "timeout": self.timeout,
                                                         "action": "interrupt"})
                await self.hands._interrupt_now()
            return False
        return now > self.interrupted_at + self.hands.config.interrupt_grace


class Lifecycle:
    """Lazy start, restart, shutdown, interrupt, status and the call wrapper of one session's hands."""

    start_failed = "the kernel could not start"  # the start of a failed call's message for the model

    def __init__(self, config: Any, on_event: EventSink | None):
        self.config = config
        self.on_event = on_event
        self.replay_source: Any = None  # set by the brain (returns the replayable calls); hands never read the log
        self.generation = 0
        self.state = "not started"
        self._lock = asyncio.Lock()
        self._start_lock = asyncio.Lock()
        self._busy = False
        self._interrupt_requested = False
        self._running = False  # the kernel has begun running the current cell (execute_input seen)
        self._interrupt_pending = False
        self._msg_id: str | None = None  # the execute request in flight
        self._settling: asyncio.Task | None = None  # finishing a cancelled call

    # -- what a subclass provides ---------------------------------------------

    def _handle(self) -> Any:
        """The current kernel (whatever identifies it), or None."""
        raise NotImplementedError

    def _backend(self) -> str:
        raise NotImplementedError

    async def _boot(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start a kernel and make it current; returns `hands_started` fields (before reason, after start_ms)."""
        raise NotImplementedError

    async def _discard(self) -> None:
        """Forget the current kernel (dead or to be replaced) and free what it held."""
        raise NotImplementedError

    async def _interrupt_now(self) -> None:
        """Interrupt the current kernel's cell."""
        raise NotImplementedError

    async def _interrupt_handle(self, handle: Any) -> None:
        """Interrupt a given kernel's cell (for a cancelled call: the kernel may be gone by then)."""
        raise NotImplementedError

    async def _still_current(self, handle: Any) -> bool:
        """Whether `handle` is still the current, living kernel."""
        raise NotImplementedError

    async def _settle_msg(self, handle: Any, msg_id: str) -> Any:
        """The next (msg_type, content) on iopub for `msg_id`, None if nothing came, or GONE."""
        raise NotImplementedError

    async def _run(self, code: str, timeout: float) -> Observation:
        raise NotImplementedError

    async def _check_idle(self) -> list[str]:
        """Before a call: notes for the model about what happened since the last one."""
        return []

    async def _after_shutdown(self) -> None:
        """Free what the session held besides its kernel."""

    @property
    def pid(self) -> int | None:
        return None

    # -- lifecycle ---------------------------------------------------------

    async def _emit(self, type: str, payload: dict[str, Any]) -> None:
        if self.on_event is not None:
            await self.on_event(type, payload)

    async def start(self, reason: str = "first call") -> list[str]:
        """Make sure a kernel is ready (normally the first execute does this); returns notes for the model."""
        async with self._start_lock:
            if self._handle() is not None:
                return []
            if self.state == "dead":
                reason = "replace a dead kernel"
            t0 = time.perf_counter()
            self.state = "starting"
            try:
                head, tail = await self._boot()
            except BaseException:
                self.state = "failed"
                await asyncio.shield(self._discard())
                raise
            self.generation += 1
            self.state = "idle"
            await self._emit("hands_started", {"generation": self.generation, **head, "reason": reason,
                                               "start_ms": round((time.perf_counter() - t0) * 1000, 1), **tail})
            if reason != "restart" and self.config.replay and self.replay_source is not None:
                return await replay(await self.replay_source(), self._run, self._emit, self.generation, self.config.timeout)
            return []

    async def restart(self) -> None:
        """Replace the kernel with a fresh one."""
        async with self._lock:
            await self._discard()
            self.state = "not started"
            await self.start(reason="restart")

    async def shutdown(self) -> None:
        """Stop the kernel (if any) and free what the session held."""
        had = self._handle() is not None
        if self._settling is not None and not self._settling.done():
            self._settling.cancel()
        await self._discard()
        self.state = "stopped"
        await self._after_shutdown()
        if had:
            await self._emit("hands_stopped", {"generation": self.generation})

    async def interrupt(self) -> None:
        """Interrupt the running call, if any."""
        if self._handle() is not None and self._busy:
            self._interrupt_requested = True
            if self._running:
                await self._interrupt_now()
            else:  # a kernel ignores an interrupt that lands before the cell starts: send it then
                self._interrupt_pending = True

    def status(self) -> dict[str, Any]:
        return {"backend": self._backend(), "state": "busy" if self._busy else self.state,
                "generation": self.generation, "pid": self.pid}

    async def _lose(self) -> None:
        """The current kernel is dead or beyond saving: the next call starts a fresh one."""
        await self._discard()
        self.state = "dead"

    # -- execution ---------------------------------------------------------

    async def execute(self, code: str, timeout: float | None = None) -> Observation:
        """Run code in the kernel; returns what it printed, returned, displayed or raised."""
        async with self._lock:
            t0 = time.perf_counter()
            notes = await self._check_idle()
            if self._handle() is None:
                try:
                    notes += await self.start()
                except Exception as e:  # a kernel that cannot start is data for the model
                    return failure(f"{self.start_failed}: {e}", ename="KernelStartError", notes=notes)
            timeout = min(timeout or self.config.timeout, self.config.max_timeout)
            self._busy = True
            try:
                obs = await self._run(code, timeout)
            except asyncio.CancelledError:
                # the caller gave up (a user interrupt): stop the code too, once it has started; keep the kernel
                handle, running = self._handle(), self._running
                if handle is not None and self._msg_id is not None:
                    if running:
                        await asyncio.shield(self._interrupt_handle(handle))
                    self._settling = asyncio.get_running_loop().create_task(self._settle(handle, self._msg_id, running))
                raise
            finally:
                self._busy = self._running = self._interrupt_pending = False
                self._interrupt_requested = False
            obs.notes = notes + obs.notes
            obs.generation = obs.generation or self.generation
            obs.duration_ms = round((time.perf_counter() - t0) * 1000, 1)
            return obs

    async def _cell_started(self) -> None:
        """The kernel began the cell (execute_input): send an interrupt that was waiting for that."""
        self._running = True
        if self._interrupt_pending:
            self._interrupt_pending = False
            await self._interrupt_now()

    def _finish(self, col: Collector, timeout: float, timed_out: bool) -> Observation:
        """The observation of a call that ended normally, with a note on why it ended early."""
        obs = col.done()
        if timed_out:
            obs.truncated.append(TIMED_OUT.format(timeout=timeout))
        elif self._interrupt_requested:
            obs.notes.append("[interrupted on request; the kernel and its state survive]")
        return obs

    def _death_observation(self, how: str, gen: int, col: Collector) -> Observation:
        partial = col.done()
        return failure(death_note(how), ename="KernelDied", generation=gen, stdout=partial.stdout, stderr=partial.stderr)

    async def _replace_stuck(self, timeout: float, col: Collector) -> Observation:
        gen = self.generation
        await self._emit("hands_timeout", {"generation": gen, "timeout": timeout, "action": "replaced",
                                           "grace": self.config.interrupt_grace})
        await self._lose()
        partial = col.done()
        return failure(stuck_note(timeout, self.config.interrupt_grace), ename="KernelTimeout", generation=gen,
                       stdout=partial.stdout, stderr=partial.stderr)

    async def _settle(self, handle: Any, msg_id: str, interrupted: bool) -> None:
        """After a cancelled call: interrupt it once it starts, wait for it to end, or replace a stuck kernel.

        Holds the lock, so the next call waits for this (at most about the grace period) instead
        of queueing behind a cell nobody is waiting for.
        """
        async with self._lock:
            deadline = time.monotonic() + self.config.interrupt_grace
            try:
                while await self._still_current(handle):
                    if time.monotonic() > deadline:
                        await self._emit("hands_timeout", {"generation": self.generation, "timeout": None,
                                                           "action": "replaced", "grace": self.config.interrupt_grace,
                                                           "cause": "a cancelled call did not stop"})
                        await self._lose()
                        return
                    got = await self._settle_msg(handle, msg_id)
                    if got is GONE:
                        return
                    if got is None:
                        continue
                    msg_type, content = got
                    if msg_type == "execute_input" and not interrupted:
                        interrupted = True
                        await self._interrupt_handle(handle)
                        deadline = time.monotonic() + self.config.interrupt_grace
                    elif msg_type == "status" and content.get("execution_state") == "idle":
                        return
            except Exception:  # the kernel was stopped under us (shutdown): nothing left to settle
                return
