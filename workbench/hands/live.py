"""One started kernel process: how it is launched, watched and stopped.

A launcher decides how the kernel process starts (plain, or in a sandbox);
`boot()` starts one with limits applied and registers it for the reaper;
a `LiveKernel` is the handle the hands (or the pool) hold until `kill()`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from jupyter_client import AsyncKernelManager
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager

from . import launch, limits as _limits
from .limits import Limits

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


class LocalLauncher:
    """Starts an ipykernel in this Python environment, unsandboxed."""

    name = "local"
    interrupt_mode = "signal"
    poolable = True  # nothing per session: any pooled kernel can be adopted
    supervise = False  # the launch wrapper execs the kernel itself: bound to the host from its first instruction

    def __init__(self, kernel_name: str = "python3", spec_dirs: list[str] | None = None):
        self.kernel_name = kernel_name
        self.spec_dirs = spec_dirs

    def manager(self, run_dir: Path, env: dict[str, str], workdir: Path) -> tuple[AsyncKernelManager, dict]:
        """A kernel manager and the kwargs for its start_kernel()."""
        ksm = KernelSpecManager(kernel_dirs=self.spec_dirs) if self.spec_dirs else KernelSpecManager()
        km = AsyncKernelManager(kernel_name=self.kernel_name, kernel_spec_manager=ksm, transport="ipc")
        km.connection_file = str(run_dir / "kernel.json")
        km.ip = str(run_dir / "kernel-ipc")
        # a profile dir of its own: the user's IPython startup files and history stay out of the hands
        env = {**env, "IPYTHONDIR": str(run_dir / "ipython")}
        return km, {"env": env, "cwd": str(workdir)}

    def adopt_code(self, workdir: Path, env: dict[str, str]) -> str:
        """Code that makes a pooled kernel a session's own: its workdir and variables."""
        return f"import os as _o; _o.chdir({str(workdir)!r}); _o.environ.update({env!r}); del _o"


class LiveKernel:
    """A started, ready kernel: its manager, client, directories and registry entry."""

    def __init__(self, km: AsyncKernelManager, kc: Any, *, kid: str, run_dir: Path, workdir: Path,
                 owns_workdir: bool, launcher: Any, registry: Any, boot_ms: float, applied: dict[str, str]):
        self.km, self.kc, self.kid = km, kc, kid
        self.run_dir, self.workdir, self.owns_workdir = run_dir, workdir, owns_workdir
        self.launcher, self.registry = launcher, registry
        self.boot_ms, self.applied = boot_ms, applied
        self.stopped = False

    @property
    def pid(self) -> int | None:
        return getattr(getattr(self.km, "provisioner", None), "pid", None)

    async def poll(self) -> int | None:
        """The exit status if the kernel process has ended (negative: a signal), else None."""
        prov = getattr(self.km, "provisioner", None)
        if prov is None:
            return -1 if self.stopped else None
        return await prov.poll()

    def oom_killed(self) -> bool:
        """Whether the kernel's memory cgroup OOM-killed something."""
        return _limits.oom_killed(self.kid)

    async def interrupt(self) -> None:
        """Interrupt the running cell (signal or message, as the kernel spec says)."""
        await self.km.interrupt_kernel()

    async def kill(self) -> None:
        """Stop the kernel now and free everything it held; safe to call twice."""
        if self.stopped:
            return
        self.stopped = True
        try:
            self.kc.stop_channels()
        except Exception:
            pass
        try:
            await self.km.shutdown_kernel(now=True)
        except Exception:
            proc = getattr(getattr(self.km, "provisioner", None), "process", None)
            if proc is not None:
                try:
                    proc.kill()
                except ProcessLookupError:
                    pass
        await asyncio.to_thread(self._cleanup)

    def _cleanup(self) -> None:
        _limits.cleanup(self.kid)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if self.owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self.registry is not None:
            self.registry.remove(self.kid)


def _wrapped_spec(km: AsyncKernelManager, limits: Limits | None, kid: str, report: str, supervise: bool) -> None:
    """Put the launch wrapper in front of the kernel's argv (works for any launcher)."""
    spec = km.kernel_spec
    km._kernel_spec = KernelSpec(
        argv=launch.command(spec.argv, parent=os.getpid(), supervise=supervise, limits=limits, cgroup=kid, report=report),
        display_name=spec.display_name,
        language=spec.language,
        interrupt_mode=spec.interrupt_mode,
        env=dict(spec.env or {}),
        metadata=dict(spec.metadata or {}),
        resource_dir=spec.resource_dir,
    )


async def boot(launcher: Any, *, env: dict[str, str], workdir: Path | None = None, limits: Limits | None = None,
               registry: Any = None, startup_timeout: float = 60.0) -> LiveKernel:
    """Start a kernel with `launcher` and wait until it is ready."""
    t0 = time.perf_counter()
    kid = uuid.uuid4().hex[:12]
    run_dir = Path(tempfile.mkdtemp(prefix="workbench-run-"))
    owns = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="workbench-work-")) if owns else workdir
    km, kw = launcher.manager(run_dir, env, workdir)
    report = run_dir / "limits.json"
    _wrapped_spec(km, limits, kid, str(report), launcher.supervise)
    kc = None
    try:
        await km.start_kernel(**kw)
        pid = getattr(km.provisioner, "pid", None)
        if registry is not None and pid:
            registry.add(kid, pid, run_dir=str(run_dir), cgroup=kid, launcher=launcher.name)
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=startup_timeout)
    except BaseException:
        lk = LiveKernel(km, kc, kid=kid, run_dir=run_dir, workdir=workdir, owns_workdir=owns, launcher=launcher,
                        registry=registry, boot_ms=0, applied={})
        await asyncio.shield(lk.kill())
        raise
    try:
        applied = json.loads(report.read_text()) if report.exists() else {}
    except ValueError:
        applied = {}
    return LiveKernel(km, kc, kid=kid, run_dir=run_dir, workdir=workdir, owns_workdir=owns, launcher=launcher,
                      registry=registry, boot_ms=round((time.perf_counter() - t0) * 1000, 1), applied=applied)
