"""Hands on Jupyter kernels: one session's succession of kernels, and the one execute loop.

A session's hands own a succession of kernels: started lazily by the first call (or taken
from the warm pool), numbered by `generation`, replaced after a death, a stuck timeout or a
restart, and stopped once. Calls run one at a time under a lock; a call the caller gives up
on (a user interrupt) is interrupted once the kernel has begun running it, and settled in the
background before the next call runs.

How a kernel starts is a launcher's business (local, sandbox, gateway: `base.Launcher`); the
kernel is a channel (`base.Kernel`, over ZMQ or a gateway's websocket). Everything else, the
execute loop and the settle loop included, is written here once.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import MEMORY, Death, Dropped, EventSink, Hands, Kernel, Launcher, Place
from .launching.pip import packages_code
from .launching.pythons import session_python
from .launching.state import history_code
from .observing import (
    TIMED_OUT,
    Budget,
    Collector,
    Notebook,
    Observation,
    OutputSink,
    death_note,
    failure,
    missing_module,
    setup_code,
    stuck_note,
)
from .replay import replay

REPLY_WAIT = 2.0  # seconds to wait for an execute reply after the idle status (it is normally there already)
POLL = 0.03  # seconds between looks at the kernel (alive? past the deadline?) while a call runs
DRAIN = 1.0  # seconds at most to read what a kernel that died sent before it died

# Returns the earlier successful calls marked replayable: [{"tool_use_id", "code"}].
ReplaySource = Callable[[], Awaitable[list[dict[str, Any]]]]


@dataclass
class HandsConfig:
    """Settings of one session's hands."""

    timeout: float = 60.0  # default per-call timeout, seconds
    max_timeout: float = 600.0  # the cap on a timeout the model asks for
    interrupt_grace: float = 5.0  # after an interrupt, how long before the kernel is replaced
    output_limit: int = 20_000  # characters of stdout/stderr/results (and of each text part of a display) kept per call
    max_displays: int = 20  # displays kept per call; later ones are dropped with a note
    max_observation_bytes: int = 4 * 1024 * 1024  # all of a call's output together, as the log stores it
    max_image_bytes: int = 1024 * 1024  # one image, decoded; a bigger one is downscaled (or dropped) with a note
    max_images: int = 20  # images the model is shown of one call (the first ones); the others with a note
    startup_timeout: float = 60.0
    workdir: str | None = None  # the kernel's working directory (default: a workspace of the session's own)
    keep_dir: str | None = None  # where the session's workspace is kept across shutdowns and restarts (evals)
    env: dict[str, str] = field(default_factory=dict)  # extra variables for the kernel
    python: str | None = None  # the kernels' environment: a kernelspec's name or a Python's path (default: the host's)
    replay: bool = False  # re-run replayable calls in a fresh kernel after a death
    spare: bool = True  # keep a spare kernel beside the live one (if the host keeps spares); off for hands nobody waits on

    def budget(self) -> Budget:
        """What one call's observation may hold."""
        return Budget(self.output_limit, self.max_displays, self.max_observation_bytes, self.max_image_bytes,
                      self.max_images)


class Deadline:
    """A call's timeout: interrupt the cell when it passes, give up on the kernel a grace period later."""

    def __init__(self, timeout: float, grace: float):
        self.at, self.grace = time.monotonic() + timeout, grace
        self.interrupted_at: float | None = None

    @property
    def passed(self) -> bool:
        return self.interrupted_at is not None

    def due(self, now: float) -> str | None:
        """`interrupt` once the timeout passes, `replace` once the grace period after it has too."""
        if self.interrupted_at is None:
            if now > self.at:
                self.interrupted_at = now
                return "interrupt"
            return None
        return "replace" if now > self.interrupted_at + self.grace else None


@dataclass
class Call:
    """The call in flight: its request, whether its cell started, what interrupt it was asked for."""

    msg_id: str | None = None
    started: bool = False  # the kernel began running the cell (execute_input seen)
    interrupt: str = ""  # "pending": asked before the cell started, sent when it does; "sent"
    asked: bool = False  # someone asked for the interrupt (the observation says so)
    on_output: OutputSink | None = None  # hears the call's output as it arrives (observing/live.py)


class KernelHands(Hands):
    """Hands on Jupyter kernels of one launcher: lazy, watched, replaceable."""

    start_failed = "the kernel could not start"  # the start of a failed call's message for the model

    def __init__(self, config: HandsConfig | None = None, *, launcher: Launcher | None = None, pool: Any = None,
                 on_event: EventSink | None = None, replay: ReplaySource | None = None,
                 session_config: dict[str, Any] | None = None, session_id: str = "", spare: bool = False,
                 spare_after: float = 0.0):
        from .launching.local import LocalLauncher

        self.config = config or HandsConfig()
        self.launcher: Launcher = launcher if launcher is not None else LocalLauncher()
        self.pool, self.on_event, self.replay_source = pool, on_event, replay
        self.place = Place(
            workdir=Path(self.config.workdir) if self.config.workdir else None, env=dict(self.config.env),
            startup_timeout=self.config.startup_timeout, egress=(session_config or {}).get("egress"), sink=on_event,
            session=session_id, keep=Path(self.config.keep_dir) if self.config.keep_dir else None,
            python=session_python(self.config.python) if self.config.python else "",
        )
        self.kernel: Kernel | None = None
        self.generation = 0
        self.notebook = Notebook()  # what this kernel's calls left shown (a later call's update may reach it)
        self.state = "not started"
        self._call: Call | None = None
        self._settling: asyncio.Task | None = None  # finishing a cancelled call
        self._lock = asyncio.Lock()
        self._start_lock = asyncio.Lock()
        # the hot spare: a second kernel of the session, started beside the live one once the session has
        # run code, bound to the same workspace and egress policy; a dead kernel's replacement at once
        self.use_spare = spare
        self.spare_after = spare_after  # seconds idle after a call before the spare boots (0: at once)
        self._spare_timer: asyncio.TimerHandle | None = None
        self.spare: Kernel | None = None
        self._spare_task: asyncio.Task[None] | None = None
        self.spare_error: str | None = None  # why the last spare could not start
        self._epoch = 0  # +1 at each close: a spare that finishes booting after one is stopped, not kept
        self.last_used = time.monotonic()  # the end of the last call (or the start): what idle closing measures
        self._freeing: set[asyncio.Task[None]] = set()  # lost kernels being freed in the background
        self._exiting: Kernel | None = None  # a kernel whose last call asked it to exit (`exit()`): it runs no more

    async def __aenter__(self) -> KernelHands:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.shutdown()

    def status(self) -> dict[str, Any]:
        """JSON-ready: backend, state (busy while a call runs), generation, the kernel's pid (or id), the call,
        and how the kernel's limits (seccomp and workspace included) are enforced."""
        call = self._call
        return {"backend": self.launcher.name, "state": "busy" if call else self.state, "generation": self.generation,
                "pid": None, **(self.kernel.ident if self.kernel else {}),
                "call": None if call is None else "running" if call.started else "sent",
                "limits": dict(self.kernel.limits) if self.kernel else {},
                "spare": self._spare_state(), "idle_s": round(self.idle_for(), 1)}

    def _spare_state(self) -> str | None:
        """`ready`, `starting`, `failed` (spare_error says why), or None when there is none (or spares are off)."""
        if self.spare is not None:
            return "ready"
        if self._spare_task is not None and not self._spare_task.done():
            return "starting"
        return "failed" if self.spare_error and self.use_spare else None

    def idle_for(self) -> float:
        """Seconds since the last call ended, while a kernel (or a spare) is up and no call runs (nor a spare
        boots: closing then would throw its boot away); else 0."""
        if self._call is not None or self._lock.locked() or (self.kernel is None and self.spare is None):
            return 0.0
        if self._spare_task is not None and not self._spare_task.done():
            return 0.0
        return max(0.0, time.monotonic() - self.last_used)

    # -- lifecycle ---------------------------------------------------------

    async def _emit(self, type: str, payload: dict[str, Any]) -> None:
        if self.on_event is not None:
            await self.on_event(type, payload)

    async def start(self, reason: str = "first call") -> list[str]:
        """Make sure a kernel is ready (normally the first execute does this); returns notes for the model."""
        async with self._start_lock:
            if self.kernel is not None:
                return []
            if self.state == "dead":
                reason = "replace a dead kernel"
            elif self.state == "closed" and reason == "first call":
                reason = "reopen after close"
            t0 = time.perf_counter()
            self.state = "starting"
            try:
                kernel, source = await self._provision()
            except BaseException:
                self.state = "failed"
                raise
            self.kernel, self.state = kernel, "idle"
            if source == "spare" or reason == "replace a dead kernel":
                # a death: the next spare boots now, not after the next call, so that another death soon after
                # is served by a spare too (a second kernel per session, as before: idle closing stops both)
                self._want_spare()
            self.generation += 1
            self.notebook = Notebook()  # a new kernel holds no handle of the old one's displays or widgets
            await self._emit("hands_started", {
                "generation": self.generation, **kernel.ident, "launcher": kernel.launcher, "reason": reason,
                "start_ms": round((time.perf_counter() - t0) * 1000, 1), "pooled": source == "pool",
                "spare": source == "spare", "boot_ms": kernel.boot_ms, "limits": kernel.limits,
                "history": "memory" if self.place.history == MEMORY else "session",
                **({"python": self.place.python} if self.place.python else {}),
            })
            if reason != "restart" and self.config.replay and self.replay_source is not None:
                notes = await replay(await self.replay_source(), self._call_once, self._emit, self.generation,
                                     self.config.timeout)
                self.notebook.replayed()
                return notes
            return []

    async def _provision(self) -> tuple[Kernel, str]:
        """A ready kernel for the session and where it came from: `spare`, `pool` or `new`."""
        place = self.place
        if place.workdir is not None and place.workspace is None:  # the session's own directory
            place.workdir.mkdir(parents=True, exist_ok=True)
        spare = await self._take_spare()
        if spare is not None:
            return spare, "spare"
        if self.pool is not None and self.launcher.fits(place):
            kernel = await self.pool.take()
            if kernel is not None:
                await self._prepare(kernel, adopt=True)
                return kernel, "pool"
        kernel = await self.launcher.start(place)  # makes the session's workspace, the first time
        await self._prepare(kernel, adopt=False)
        return kernel, "new"

    async def workspace(self, create: bool = False) -> Path | None:
        """The session's workspace directory on this machine; None while there is none (and not `create`).

        With `create`, one is made now (as the first kernel would make it), so that files can be put in
        before any code runs; the kernels started later start in it. A launcher whose kernels' files are
        not on this machine (a gateway) has none: NoWorkspace.
        """
        place = self.place
        if place.workdir is not None or not create:
            if place.workdir is not None and create and place.workspace is None:
                place.workdir.mkdir(parents=True, exist_ok=True)  # the session's own directory
            return place.workdir
        async with self._start_lock:  # not while a kernel start makes one
            if place.workdir is None:
                await self.launcher.make_workspace(place)
        return place.workdir

    def workspace_owner(self) -> tuple[int, int] | None:
        """Who the workspace's files are for when not this process's user (the session's sandbox uid)."""
        return self.launcher.owner(self.place)

    @contextlib.asynccontextmanager
    async def frozen(self) -> AsyncIterator[list[str]]:
        """The session's kernel and every process it left running stopped for the block (its workspace holds
        still while it is copied), then continued with their state intact; yields notes on what was not stopped.

        No call runs meanwhile (the block holds the call lock), and kernels lost earlier are gone first."""
        async with self._lock:
            await self._freed()
            kernel = self.kernel
            notes = await kernel.freeze() if kernel is not None else []
            try:
                yield notes
            finally:
                if kernel is not None:
                    await asyncio.shield(kernel.thaw())

    # -- the hot spare ----------------------------------------------------

    def _spare_soon(self) -> None:
        """After a call: the spare boots once the kernel has been idle `spare_after` seconds (a call meanwhile puts
        it off again). It never competes with the session's own calls for the machine, and hands that run a call
        and are closed at once (a single cell's call, a script, a test) never boot one."""
        if not self.use_spare or self.spare is not None:
            return
        if self._spare_timer is not None:
            self._spare_timer.cancel()
            self._spare_timer = None
        if self.spare_after <= 0:
            self._want_spare()
            return
        self._spare_timer = asyncio.get_running_loop().call_later(self.spare_after, self._spare_due)

    def _spare_due(self) -> None:
        self._spare_timer = None
        if self._call is None and not self._lock.locked():  # else the call under way asks again when it ends
            self._want_spare()

    def _want_spare(self) -> None:
        """Start a spare in the background if the session has a live kernel and no spare (ready or coming)."""
        if not self.use_spare or self.kernel is None or self.spare is not None:
            return
        if self._spare_task is not None and not self._spare_task.done():
            return
        self._spare_task = asyncio.get_running_loop().create_task(self._boot_spare(self._epoch))

    async def _boot_spare(self, epoch: int) -> None:
        """The spare starts exactly as a cold replacement would (`launcher.start(place)`: the session's
        workspace, variables and egress policy), and is prepared like one, so taking it is all that is left."""
        try:
            kernel = await self.launcher.start(self.place)
            await self._prepare(kernel, adopt=False)  # kills it if the preparation fails
        except asyncio.CancelledError:
            raise
        except Exception as e:  # no spare: a death is then replaced the cold way
            self.spare_error = f"{type(e).__name__}: {e}"
            return
        if epoch != self._epoch or self.spare is not None:  # the hands were closed while it booted
            await asyncio.shield(kernel.kill())
            return
        self.spare, self.spare_error = kernel, None

    async def _take_spare(self) -> Kernel | None:
        """The spare if it is alive (waiting for one that is booting: it is ready sooner than a new one)."""
        task = self._spare_task
        if self.spare is None and task is not None and not task.done():
            await asyncio.wait({task})
        spare, self.spare = self.spare, None
        if spare is None:
            return None
        if await spare.death() is not None:  # died while waiting: the cold way, and a new spare after
            await asyncio.shield(spare.kill())
            return None
        return spare

    async def _drop_spare(self) -> None:
        """Stop the spare, one that is booting, and one that was to boot."""
        self._epoch += 1
        if self._spare_timer is not None:
            self._spare_timer.cancel()
            self._spare_timer = None
        task, self._spare_task = self._spare_task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        spare, self.spare = self.spare, None
        if spare is not None:
            await asyncio.shield(spare.kill())

    async def _prepare(self, kernel: Kernel, adopt: bool) -> None:
        """Install the in-kernel output cap and, in a pooled kernel, what makes it this session's."""
        try:
            code = setup_code(self.config.output_limit)
            if adopt:
                code += await self.launcher.adopt(kernel, self.place) + "\n"
            code += packages_code() + history_code(self.place.history)
            reply = await kernel.reply(kernel.execute(code, silent=True), self.config.startup_timeout)
        except BaseException:
            await asyncio.shield(kernel.kill())
            raise
        if reply.get("status") != "ok":
            await kernel.kill()
            raise RuntimeError(f"preparing the kernel failed: {reply.get('ename')}: {reply.get('evalue')}")

    async def restart(self) -> None:
        """Replace the kernel with a fresh one."""
        async with self._lock:
            await self._discard()
            self.state = "not started"
            await self.start(reason="restart")

    async def shutdown(self) -> None:
        """Stop the kernel (if any) and free what the session held; the next execute may start again."""
        had = self.kernel is not None
        if self._settling is not None and not self._settling.done():
            self._settling.cancel()
        await self._drop_spare()
        await self._discard()
        await self._freed()
        self.state = "stopped"
        if self.place.workspace is not None:  # the session's workspace goes with its hands
            workspace, self.place.workspace, self.place.workdir = self.place.workspace, None, None
            await asyncio.to_thread(workspace.destroy)
        state, self.place.state, self.place.history = self.place.state, None, MEMORY  # and the hands' own files for it
        if state is not None:
            await asyncio.to_thread(shutil.rmtree, state, True)
        await self.launcher.release(self.place)
        if had:
            await self._emit("hands_stopped", {"generation": self.generation, "reason": "shutdown"})

    async def close(self, reason: str = "closed", *, if_idle: float | None = None) -> bool:
        """Stop the kernel and its spare but keep the session's workspace: the next execute starts a kernel
        again (lazily, in the same workspace). Returns whether anything was stopped.

        A running call is interrupted first and answered (with what it printed, and the note that it was
        interrupted); one that does not stop within `interrupt_grace` ends as a kernel death. With `if_idle`
        (seconds) nothing is interrupted: the hands close only if no call came for that long.
        """
        if if_idle is None:
            await self._stop_call()
        else:
            await self._lock.acquire()
        try:
            if if_idle is not None and time.monotonic() - self.last_used < if_idle:
                return False  # a call came meanwhile
            had = self.kernel is not None or self.spare is not None or self._spare_state() == "starting"
            await self._drop_spare()
            await self._discard()
            await self._freed()
            if not had:
                return False
            self.state = "closed"
            await self._emit("hands_stopped", {"generation": self.generation, "reason": reason})
            return True
        finally:
            self._lock.release()

    async def _stop_call(self) -> None:
        """Take the lock from a call (or a kernel start) in progress: interrupt the call once it is sent, and kill
        its kernel if it has not stopped `interrupt_grace` seconds later (the call then ends as a death)."""
        asked_at: float | None = None
        while True:
            try:
                async with asyncio.timeout(POLL):
                    await self._lock.acquire()
                return
            except TimeoutError:
                pass
            call = self._call
            if call is None:
                continue  # a kernel is starting for the call, or a cancelled call settles: its end comes
            if asked_at is None:
                asked_at = time.monotonic()
                await self.interrupt()
            elif time.monotonic() - asked_at > self.config.interrupt_grace and self.kernel is not None:
                await asyncio.shield(self.kernel.kill())

    async def interrupt(self) -> None:
        """Interrupt the running call, if any."""
        call, kernel = self._call, self.kernel
        if call is None or kernel is None:
            return
        call.asked = True
        await self._interrupt_once_started(kernel, call)

    @staticmethod
    async def _interrupt_once_started(kernel: Kernel, call: Call) -> None:
        """Interrupt the call's cell now if it has started; a kernel ignores an interrupt that lands before the cell
        starts, so otherwise it is sent when the cell does (_run)."""
        if call.started:
            call.interrupt = "sent"
            await kernel.interrupt()
        else:
            call.interrupt = "pending"

    async def _discard(self) -> None:
        kernel, self.kernel = self.kernel, None
        if kernel is not None:
            await asyncio.shield(kernel.kill())

    async def _lose(self) -> None:
        """The current kernel is dead or beyond saving: the next call starts a fresh one.

        Freeing what it held (its supervisor's exit, cgroups, run dir) takes from a tenth of a second to a
        second on a loaded machine, so it happens in the background, off the path of the call that replaces
        it; shutdown and close wait for it, so no process outlives them."""
        kernel, self.kernel = self.kernel, None
        if kernel is not None:
            task = asyncio.get_running_loop().create_task(kernel.kill())
            self._freeing.add(task)
            task.add_done_callback(self._freeing.discard)
        self.state = "dead"

    async def _freed(self) -> None:
        """Wait until the kernels lost in the background are freed."""
        if self._freeing:
            await asyncio.gather(*list(self._freeing), return_exceptions=True)

    async def _record_death(self, death: Death, during: str) -> None:
        await self._emit("hands_died", {"generation": self.generation, "exit_code": death.exit_code,
                                        "signal": death.signal, "how": death.how, "during": during,
                                        **(self.kernel.ident if self.kernel else {})})
        await self._lose()

    # -- execution ---------------------------------------------------------

    async def execute(self, code: str, timeout: float | None = None, on_output: OutputSink | None = None) -> Observation:
        """Run code in the kernel; returns what it printed, returned, displayed or raised.

        `on_output` hears the call's output while it runs (not stored: the observation is the record)."""
        async with self._lock:
            t0 = time.perf_counter()
            notes = await self._check_idle()
            if self.kernel is None:
                try:
                    notes += await self.start()
                except Exception as e:  # a kernel that cannot start is data for the model
                    return failure(f"{self.start_failed}: {e}", ename="KernelStartError", notes=notes)
                if self.kernel is None:
                    return failure("the kernel died while earlier calls were replayed in it; this call was not run, "
                                   "the next one gets a fresh kernel", ename="KernelDied", notes=notes)
            try:
                obs = await self._call_once(code, self._timeout(timeout), on_output)
            finally:
                self.last_used = time.monotonic()
            obs.notes = notes + obs.notes
            obs.hint = obs.hint or missing_module(obs.error, self.place.python or self.launcher.python)
            obs.generation = obs.generation or self.generation
            obs.duration_ms = round((time.perf_counter() - t0) * 1000, 1)
            self._spare_soon()  # the session has run code: a replacement will wait beside its kernel
            return obs

    def _timeout(self, asked: Any) -> float:
        """The model's timeout if it is a positive, finite number of seconds, capped; else the default."""
        ok = isinstance(asked, (int, float)) and not isinstance(asked, bool) and math.isfinite(asked) and asked > 0
        return min(asked if ok else self.config.timeout, self.config.max_timeout)

    async def _check_idle(self) -> list[str]:
        """Before a call: notes for the model about what happened to the kernel since the last one."""
        if self.kernel is not None and self.kernel is self._exiting:
            # it ends a moment after its reply: a call sent now might run in it and die with it, blamed for a death
            # that is not its own, so it is never sent there
            self._exiting = None
            await self._record_death(await self.kernel.death() or Death("it called exit()"), "idle")
            return ["[the kernel had ended before this call (it called exit()); this call runs in a fresh kernel, "
                    "so earlier variables and imports are gone]"]
        if self.kernel is not None and (death := await self.kernel.death()) is not None:
            await self._record_death(death, "idle")
            return [f"[the kernel died between calls ({death.how}); this call runs in a fresh kernel, "
                    "so earlier variables and imports are gone]"]
        return []

    async def _call_once(self, code: str, timeout: float, on_output: OutputSink | None = None) -> Observation:
        kernel, call = self.kernel, Call(on_output=on_output)
        if kernel is None:
            raise RuntimeError("a call needs a started kernel")  # execute() starts one first: a bug if not
        self._call = call
        try:
            return await self._run(kernel, call, code, timeout)
        except asyncio.CancelledError:
            # the caller gave up (a user interrupt): stop the code too, once it has started; keep the kernel
            if call.msg_id is not None and kernel is self.kernel:
                if call.started:
                    await asyncio.shield(kernel.interrupt())
                self._settling = asyncio.get_running_loop().create_task(self._settle(kernel, call))
            raise
        finally:
            self._call = None

    async def _run(self, kernel: Kernel, call: Call, code: str, timeout: float) -> Observation:
        """The execute loop: send the cell, fold its messages, watch the kernel and the clock."""
        col = Collector(self.config.budget(), self.generation, self.notebook, call.on_output)
        call.msg_id = msg_id = kernel.execute(code)
        deadline = Deadline(timeout, self.config.interrupt_grace)
        next_look = 0.0
        while True:
            now = time.monotonic()
            if now >= next_look:  # even while output floods in
                next_look = now + POLL
                if (death := await kernel.death()) is not None:
                    return await self._died(death, col, kernel, call)
                due = deadline.due(now)
                if due == "replace":
                    return await self._replace_stuck(timeout, col)
                if due == "interrupt":
                    await self._emit("hands_timeout", {"generation": self.generation, "timeout": timeout,
                                                       "action": "interrupt"})
                    await self._interrupt_once_started(kernel, call)
            got = await kernel.message(msg_id, POLL)
            if got is None:  # nothing came, or the kernel went: look at it now
                next_look = 0.0
                continue
            if isinstance(got, Dropped):
                col.note(got.note)
                continue
            msg_type, content = got
            if msg_type == "execute_input":
                call.started = True
                if call.interrupt == "pending":
                    call.interrupt = "sent"
                    await kernel.interrupt()
            if await col.feed(msg_type, content):
                break
        replied = await self._payloads(kernel, msg_id, col)
        if not replied and call.interrupt == "sent" and col.obs.error is None:  # a request's or the timeout's
            col.interrupted_outside_the_code()
        if col.exiting:
            self._exiting = kernel
        obs = col.done()
        if deadline.passed:
            obs.truncated.append(TIMED_OUT.format(timeout=timeout))
        elif call.asked:
            obs.notes.append("[interrupted on request; the kernel and its state survive]")
        return obs

    async def _payloads(self, kernel: Kernel, msg_id: str, col: Collector) -> bool:
        """What the execute reply carries besides its status: the pager's text (`len?`), a proposed next input.
        False when no reply came."""
        try:
            reply = await kernel.reply(msg_id, REPLY_WAIT)
        except Exception:  # a reply that cannot be read loses its payloads only; the output is whole
            return False
        await col.reply(reply)
        return True

    async def _settle(self, kernel: Kernel, call: Call) -> None:
        """The settle loop, after a cancelled call: interrupt it once it starts, wait for it to end, or replace the kernel.

        Holds the lock, so the next call waits for this (at most about the grace period) instead
        of queueing behind a cell nobody is waiting for.
        """
        async with self._lock:
            interrupted = call.started  # then the cancel sent the interrupt already
            deadline = time.monotonic() + self.config.interrupt_grace
            msg_id = call.msg_id or ""
            while kernel is self.kernel and await kernel.death() is None:
                if time.monotonic() > deadline:
                    await self._emit("hands_timeout", {"generation": self.generation, "timeout": None,
                                                       "action": "replaced", "grace": self.config.interrupt_grace,
                                                       "cause": "a cancelled call did not stop"})
                    await self._lose()
                    return
                got = await kernel.message(msg_id, POLL)
                if got is None or isinstance(got, Dropped):
                    continue
                msg_type, content = got
                if msg_type == "execute_input" and not interrupted:
                    interrupted = True
                    await kernel.interrupt()
                    deadline = time.monotonic() + self.config.interrupt_grace
                elif msg_type == "status" and content.get("execution_state") == "idle":
                    return

    async def _died(self, death: Death, col: Collector, kernel: Kernel, call: Call) -> Observation:
        """The call's result when its kernel died: blamed on it as having run only if the kernel said it started (a
        kernel killed at once can die before it says so, so a call it never said it started may have run, too)."""
        gen = self.generation
        # what the kernel sent before it died is still to be read (its output, and the sign that the call started)
        until = time.monotonic() + DRAIN
        while time.monotonic() < until and (got := await kernel.message(call.msg_id or "", POLL)) is not None:
            if isinstance(got, Dropped):
                col.note(got.note)
                continue
            call.started = call.started or got[0] == "execute_input"
            if await col.feed(*got):
                break
        await self._record_death(death, "call")
        partial = col.done()
        return failure(death_note(death.how, call.started), ename="KernelDied", generation=gen, stdout=partial.stdout,
                       stderr=partial.stderr, outputs=partial.outputs, text_limit=partial.text_limit,
                       max_images=partial.max_images)

    async def _replace_stuck(self, timeout: float, col: Collector) -> Observation:
        gen = self.generation
        await self._emit("hands_timeout", {"generation": gen, "timeout": timeout, "action": "replaced",
                                           "grace": self.config.interrupt_grace})
        await self._lose()
        partial = col.done()
        return failure(stuck_note(timeout, self.config.interrupt_grace), ename="KernelTimeout", generation=gen,
                       stdout=partial.stdout, stderr=partial.stderr, outputs=partial.outputs,
                       text_limit=partial.text_limit, max_images=partial.max_images)
