"""Hands backed by a local Jupyter kernel, started with jupyter_client.

The kernel is not the user's notebook kernel and not the server process: it
is a separate process with an explicit, allowlisted environment, talking ZMQ
over unix sockets in a run directory of its own. A launcher decides how the
kernel process is started (plain, or inside a sandbox); this class owns its
life: lazy start, death detection, timeouts and interrupts.
"""

from __future__ import annotations

import asyncio
import os
import queue
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client import AsyncKernelManager
from jupyter_client.kernelspec import KernelSpecManager

from .base import EventSink, Observation, OutputCap, failure

# Variables a kernel may inherit from the host. Everything else, secrets
# included, stays out: the kernel gets this allowlist and nothing more.
ENV_ALLOWLIST = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM")


def kernel_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The explicit environment of a kernel: the allowlist plus `extra`."""
    env = {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    bindir = str(Path(sys.executable).parent)
    if bindir not in env["PATH"].split(os.pathsep):
        env["PATH"] = bindir + os.pathsep + env["PATH"]
    env["PYTHONUNBUFFERED"] = "1"
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    env.update(extra or {})
    return env


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


class LocalLauncher:
    """Starts an ipykernel in this Python environment, unsandboxed."""

    name = "local"
    interrupt_mode = "signal"

    def __init__(self, kernel_name: str = "python3", spec_dirs: list[str] | None = None):
        self.kernel_name = kernel_name
        self.spec_dirs = spec_dirs

    def manager(self, run_dir: Path, env: dict[str, str], workdir: Path) -> tuple[AsyncKernelManager, dict]:
        """A kernel manager and the kwargs for its start_kernel()."""
        ksm = KernelSpecManager(kernel_dirs=self.spec_dirs) if self.spec_dirs else KernelSpecManager()
        km = AsyncKernelManager(kernel_name=self.kernel_name, kernel_spec_manager=ksm, transport="ipc")
        km.connection_file = str(run_dir / "kernel.json")
        km.ip = str(run_dir / "kernel-ipc")
        return km, {"env": env, "cwd": str(workdir)}


class KernelHands:
    """Hands on a local Jupyter kernel: lazy, watched, replaceable."""

    def __init__(
        self,
        config: HandsConfig | None = None,
        *,
        launcher: Any = None,
        on_event: EventSink | None = None,
    ):
        self.config = config or HandsConfig()
        self.launcher = launcher or LocalLauncher()
        self.on_event = on_event
        self.generation = 0
        self.km: AsyncKernelManager | None = None
        self.kc: Any = None
        self.state = "not started"
        self._run_dir: Path | None = None
        self._tmp_workdir: Path | None = None
        self._lock = asyncio.Lock()
        self._start_lock = asyncio.Lock()
        self._busy = False
        self._interrupt_requested = False

    # -- lifecycle ---------------------------------------------------------

    async def _emit(self, type: str, payload: dict[str, Any]) -> None:
        if self.on_event is not None:
            await self.on_event(type, payload)

    def _workdir(self) -> Path:
        if self.config.workdir:
            p = Path(self.config.workdir)
            p.mkdir(parents=True, exist_ok=True)
            return p
        if self._tmp_workdir is None:
            self._tmp_workdir = Path(tempfile.mkdtemp(prefix="workbench-work-"))
        return self._tmp_workdir

    async def start(self, reason: str = "first call") -> None:
        """Start a kernel now (normally the first execute does this)."""
        async with self._start_lock:
            if self.km is not None:
                return
            t0 = time.perf_counter()
            if self.state == "dead":
                reason = "replace a dead kernel"
            self.state = "starting"
            self._run_dir = Path(tempfile.mkdtemp(prefix="workbench-run-"))
            km, kw = self.launcher.manager(self._run_dir, kernel_env(self.config.env), self._workdir())
            try:
                await km.start_kernel(**kw)
                kc = km.client()
                kc.start_channels()
                await kc.wait_for_ready(timeout=self.config.startup_timeout)
            except BaseException:
                self.state = "failed"
                await self._kill(km)
                shutil.rmtree(self._run_dir, ignore_errors=True)
                raise
            self.km, self.kc = km, kc
            self.generation += 1
            self.state = "idle"
            await self._emit(
                "hands_started",
                {
                    "generation": self.generation,
                    "pid": self.pid,
                    "launcher": self.launcher.name,
                    "reason": reason,
                    "start_ms": round((time.perf_counter() - t0) * 1000, 1),
                },
            )

    @property
    def pid(self) -> int | None:
        prov = getattr(self.km, "provisioner", None) if self.km else None
        return getattr(prov, "pid", None)

    async def _kill(self, km: AsyncKernelManager | None) -> None:
        if km is None:
            return
        try:
            await km.shutdown_kernel(now=True)
        except Exception:
            prov = getattr(km, "provisioner", None)
            if prov is not None and getattr(prov, "process", None) is not None:
                try:
                    prov.process.kill()
                except ProcessLookupError:
                    pass

    async def _discard(self) -> None:
        """Forget the current kernel (dead or to be replaced) and free its resources."""
        km, kc = self.km, self.kc
        self.km = self.kc = None
        if kc is not None:
            kc.stop_channels()
        await self._kill(km)
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None

    async def restart(self) -> None:
        """Replace the kernel with a fresh one."""
        await self._discard()
        self.state = "not started"
        await self.start(reason="restart")

    async def shutdown(self) -> None:
        """Stop the kernel (if any) and remove its temporary directories."""
        had = self.km is not None
        await self._discard()
        self.state = "stopped"
        if self._tmp_workdir is not None:
            shutil.rmtree(self._tmp_workdir, ignore_errors=True)
            self._tmp_workdir = None
        if had:
            await self._emit("hands_stopped", {"generation": self.generation})

    async def interrupt(self) -> None:
        """Interrupt the running call, if any."""
        if self.km is not None and self._busy:
            self._interrupt_requested = True
            await self.km.interrupt_kernel()

    def status(self) -> dict[str, Any]:
        return {
            "backend": self.launcher.name,
            "state": "busy" if self._busy else self.state,
            "generation": self.generation,
            "pid": self.pid,
        }

    async def _exit_status(self) -> int | None:
        """The kernel's exit code (negative: signal) if it has died, else None."""
        prov = getattr(self.km, "provisioner", None) if self.km else None
        if prov is None:
            return None
        return await prov.poll()

    # -- execution ---------------------------------------------------------

    async def execute(self, code: str, timeout: float | None = None) -> Observation:
        """Run code in the kernel; returns what it printed, returned, displayed or raised."""
        async with self._lock:
            t0 = time.perf_counter()
            if self.km is None:
                try:
                    await self.start()
                except Exception as e:  # a kernel that cannot start is data for the model
                    return failure(f"the kernel could not start: {e}", ename="KernelStartError")
            timeout = min(timeout or self.config.timeout, self.config.max_timeout)
            self._busy = True
            try:
                obs = await self._run(code, timeout)
            except asyncio.CancelledError:
                # the caller gave up (a user interrupt): stop the code too, keep the kernel
                if self.km is not None:
                    await self.km.interrupt_kernel()
                raise
            finally:
                self._busy = False
                self._interrupt_requested = False
            obs.generation = obs.generation or self.generation
            obs.duration_ms = round((time.perf_counter() - t0) * 1000, 1)
            return obs

    async def _run(self, code: str, timeout: float) -> Observation:
        kc, limit = self.kc, self.config.output_limit
        out, err, res = OutputCap("stdout", limit), OutputCap("stderr", limit), OutputCap("result", limit)
        obs = Observation(generation=self.generation)
        msg_id = kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=True)
        deadline = time.monotonic() + timeout
        interrupted_at: float | None = None
        while True:
            try:
                msg = await kc.get_iopub_msg(timeout=0.05)
            except queue.Empty:
                code_ = await self._exit_status()
                if code_ is not None:
                    return await self._died(code_, obs, out, err)
                now = time.monotonic()
                if interrupted_at is None and now > deadline:
                    interrupted_at = now
                    await self._emit("hands_timeout", {"generation": self.generation, "timeout": timeout, "action": "interrupt"})
                    await self.km.interrupt_kernel()
                elif interrupted_at is not None and now > interrupted_at + self.config.interrupt_grace:
                    return await self._replace_stuck(timeout, obs, out, err)
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            t, c = msg["msg_type"], msg["content"]
            if t == "stream":
                (out if c.get("name") == "stdout" else err).add(c.get("text", ""))
            elif t == "execute_result":
                res.add(c["data"].get("text/plain", ""))
            elif t in ("display_data", "update_display_data"):
                obs.displays.append(_cap_bundle(c.get("data", {}), limit))
            elif t == "error":
                obs.error = {"ename": c.get("ename"), "evalue": c.get("evalue"), "traceback": c.get("traceback", [])[-50:]}
            elif t == "status" and c.get("execution_state") == "idle":
                break
        obs.stdout, obs.stderr = out.value(), err.value()
        obs.result = res.value() if res.parts else None
        obs.truncated = [n for n in (out.note(), err.note(), res.note()) if n]
        if interrupted_at is not None:
            obs.truncated.append(f"[timed out after {timeout:g} s: the call was interrupted; the kernel and its state survive]")
        return obs

    async def _died(self, exit_code: int, obs: Observation, out: OutputCap, err: OutputCap) -> Observation:
        gen = self.generation
        sig = -exit_code if exit_code < 0 else None
        how = f"signal {signal.Signals(sig).name}" if sig else f"exit code {exit_code}"
        await self._emit("hands_died", {"generation": gen, "exit_code": exit_code, "signal": sig, "how": how})
        await self._discard()
        self.state = "dead"
        dead = failure(
            f"the kernel died ({how}) while running this call; its in-memory state "
            "(variables, imports, open files) is gone. The next call runs in a fresh kernel.",
            ename="KernelDied",
            generation=gen,
        )
        dead.stdout, dead.stderr = out.value(), err.value()
        return dead

    async def _replace_stuck(self, timeout: float, obs: Observation, out: OutputCap, err: OutputCap) -> Observation:
        gen = self.generation
        await self._emit(
            "hands_timeout",
            {"generation": gen, "timeout": timeout, "action": "replaced", "grace": self.config.interrupt_grace},
        )
        await self._discard()
        self.state = "not started"
        stuck = failure(
            f"the call ran past its {timeout:g} s timeout and ignored the interrupt, so its kernel "
            "was killed; its in-memory state is gone. The next call runs in a fresh kernel.",
            ename="KernelTimeout",
            generation=gen,
        )
        stuck.stdout, stuck.stderr = out.value(), err.value()
        return stuck


def _cap_bundle(data: dict[str, Any], limit: int) -> dict[str, Any]:
    """A display bundle with text parts cut to `limit` (images are kept whole)."""
    out = {}
    for mime, value in data.items():
        if isinstance(value, str) and not mime.startswith("image/") and len(value) > limit:
            value = value[:limit] + f"\n[{mime} truncated at {limit:,} characters]"
        out[mime] = value
    return out
