"""Local kernels: an ipykernel in this Python environment, unsandboxed, with an allowlisted environment."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager

from ..base import Kernel, Place
from ..isolating.bubblewrap import KERNEL_MAIN
from ..isolating.limits import Limits
from .process import MAX_MESSAGE, ProcessKernel, start_process
from .state import give_state, new_state

# Variables a kernel may inherit from the host. Everything else, secrets
# included, stays out: the kernel gets this allowlist and nothing more.
ENV_ALLOWLIST = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM")


def kernel_env(extra: dict[str, str] | None = None, python: str = "") -> dict[str, str]:
    """The explicit environment of a kernel: the allowlist plus `extra`; `python`'s directory (default: this
    interpreter's) first on its PATH, so `!pip` and `python` are the kernel's own."""
    env = {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    bindir = str(Path(python or sys.executable).parent)
    if bindir not in env["PATH"].split(os.pathsep):
        env["PATH"] = bindir + os.pathsep + env["PATH"]
    env["PYTHONUNBUFFERED"] = "1"
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    # what IPython and common libraries look for, as in a terminal a data scientist starts Jupyter from:
    # `!` lines run under bash (brace expansion, pipefail), text is UTF-8, pip does not ask for upgrades
    env["SHELL"] = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
    env.setdefault("LANG", "C.UTF-8")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra or {})
    return env


@dataclass
class TempWorkspace:
    """A plain temporary directory as a workspace: no size limit but `max_file_mb` per file."""

    path: Path
    how: str = "no quota (a plain directory); each file is limited by max_file_mb only"
    owner: tuple[int, int] | None = None  # a local kernel runs as this process's user
    kept: bool = False  # the session keeps it (config.keep_dir): destroy leaves it

    @classmethod
    def make(cls, keep: Path | None = None) -> TempWorkspace:
        if keep is not None:
            path = keep / "work"
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
            return cls(path, kept=True)
        return cls(Path(tempfile.mkdtemp(prefix="workbench-work-")))

    def destroy(self) -> None:
        if not self.kept:
            shutil.rmtree(self.path, ignore_errors=True)


def without_debugger(spec: KernelSpec) -> KernelSpec:
    """ipykernel's own kernelspec, started as the sandbox starts it: without the debugger (bubblewrap.KERNEL_MAIN).
    Any other kernelspec (its own main, options of its own) is started as it says."""
    argv = list(spec.argv)
    if argv[1:3] != ["-m", "ipykernel_launcher"]:
        return spec
    return KernelSpec(**{**spec.to_dict(), "argv": [argv[0], "-c", KERNEL_MAIN, *argv[3:]]})


class LocalLauncher:
    """Starts an ipykernel in this Python environment, unsandboxed."""

    def __init__(self, *, limits: Limits | None = None, registry: Any = None, kernel_name: str = "python3",
                 spec_dirs: list[str] | None = None, name: str = "local", max_message: int = MAX_MESSAGE):
        self.limits, self.registry, self.max_message = limits, registry, max_message
        self.kernel_name, self.spec_dirs, self.name = kernel_name, spec_dirs, name
        self.python = sys.executable  # kernel_env puts its directory first on the kernel's PATH

    async def start(self, place: Place | None) -> ProcessKernel:
        """Start a kernel (in `place`'s workdir, or a fresh one of its own) and wait until it is ready."""
        ksm = KernelSpecManager(kernel_dirs=self.spec_dirs) if self.spec_dirs else KernelSpecManager()
        spec = ksm.get_kernel_spec(self.kernel_name)
        if place is not None and place.python:  # the session's environment: the same kernel, on its interpreter
            spec = KernelSpec(**{**spec.to_dict(), "argv": [place.python, *spec.argv[1:]]})
        spec = without_debugger(spec)
        own = None  # a pooled kernel's workspace, its own until a session adopts it
        if place is None:
            own = TempWorkspace.make()
            workdir = own.path
        else:
            if place.workdir is None:  # the session's workspace, kept across its kernels
                place.workspace = TempWorkspace.make(place.keep)
                place.workdir = place.workspace.path
            workdir = place.workdir
            _state(place)
        run_dir = Path(tempfile.mkdtemp(prefix="workbench-run-"))
        # a profile dir of its own: the user's IPython startup files and history stay out of the hands
        env = {**kernel_env(place.env if place else None, place.python if place else ""),
               "IPYTHONDIR": str(run_dir / "ipython")}
        return await start_process(spec, launcher=self.name, env=env, run_dir=run_dir, workdir=workdir,
                                   workspace=own, limits=self.limits, registry=self.registry,
                                   startup_timeout=place.startup_timeout if place else 60.0,
                                   max_message=self.max_message)

    async def make_workspace(self, place: Place) -> None:
        """Make the session's workspace before its first kernel (files put in before any code runs)."""
        if place.workdir is None:
            place.workspace = TempWorkspace.make(place.keep)
            place.workdir = place.workspace.path

    def owner(self, place: Place) -> tuple[int, int] | None:
        """A local kernel runs as this process's user."""
        return None

    async def release(self, place: Place) -> None:
        """Nothing is held per session."""

    def fits(self, place: Place) -> bool:
        """A pooled kernel can serve any session on the host's Python: its workdir and variables are set by code."""
        return not place.python

    async def adopt(self, kernel: Kernel, place: Place) -> str:
        """Code that moves a pooled kernel into the session's workdir, with its variables."""
        if not isinstance(kernel, ProcessKernel):
            raise TypeError(f"a local launcher cannot adopt a {type(kernel).__name__}")
        if place.workdir is None and kernel.workspace is not None:  # the session takes the kernel's workspace
            place.workspace, kernel.workspace = kernel.workspace, None
            place.workdir = place.workspace.path
        _state(place)
        return f"import os as _o; _o.chdir({str(place.workdir)!r}); _o.environ.update({place.env!r}); del _o"

    async def aclose(self) -> None:
        """Nothing is held beyond each kernel."""


def _state(place: Place) -> None:
    """The session's state directory, made with its first kernel: a local kernel names it by its own path."""
    if place.state is None:
        state = new_state()
        give_state(place, state, state)
