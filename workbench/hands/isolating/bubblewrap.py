"""What a sandboxed kernel sees and who it is: bubblewrap's namespaces, mounts and environment.

The kernel runs in new network, PID, IPC and UTS namespaces and sees only
read-only /usr, its Python environment, a curated /etc, its own run
directory (connection file, ZMQ sockets, the proxy socket), workspace (at /workspace)
and state directory (at /session-state: IPython's history), and empty tmpfs /tmp,
/dev/shm and $HOME: never the Jupyter runtime directory, the session database, the
server's config or key files, or anyone's home.

When the server runs as root, each sandbox's processes run as a host uid of their own, leased
from a range (`sandbox_uid` and the next `sandbox_ids - 1`; no entry in the host's passwd is
needed: the sandbox gets a passwd of its own), with no capabilities and no_new_privs, so even a
file in a mounted directory is protected by its mode, and per-user counts (inotify, processes,
message queues) are the session's own (identity.py). Otherwise bwrap runs unprivileged in a user
namespace of its own as the same uid: protection comes from what is not mounted, and the
per-user counts are capped per namespace before the kernel drops its last capability.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .identity import Shares

PROXY_PORT = 3128
HOME = "/home/sandbox"
# where the session's workspace is inside: a fixed path, so the kernel learns nothing of where it is on the host
# (a workspace root under a home directory would name the host's user)
WORKSPACE = "/workspace"
# where the session's state directory is inside (launching/state.py: IPython's history), beside the workspace
STATE = "/session-state"
# What Python, ssl, locale, time zones and fonts read from /etc; nothing else of the host's /etc.
ETC = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl/certs", "ssl/openssl.cnf", "ca-certificates",
    "nsswitch.conf", "localtime", "timezone", "alternatives", "fonts", "mime.types", "protocols",
    "services", "os-release", "gai.conf", "host.conf", "locale.alias",
)  # fmt: skip
# The kernel's main (a local kernel's too, when its kernelspec is ipykernel's own: launching/local.py):
# ipykernel_launcher's, without the debugger. The hands are driven by the model, never by a
# debugger client, and importing debugpy is a quarter of a kernel's start (0.25 s of the 1.0 s of CPU that starting
# a kernel, running one cell and stopping it take here); the model's own code can still import debugpy.
KERNEL_MAIN = """\
import sys
if sys.path[:1] == [""]:  # as ipykernel_launcher: the working directory (the agent's files) is not on the path
    del sys.path[0]
sys.modules["debugpy"] = None
import ipykernel.debugger  # finds no debugpy: the kernel starts without a debugger
del sys.modules["debugpy"]
from ipykernel.kernelapp import launch_new_instance
launch_new_instance()
"""
# Parts of the kernel's environment that the sandbox sets itself.
OWN_ENV = ("PATH", "HOME", "USER", "LOGNAME", "JPY_PARENT_PID", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")


@dataclass
class SandboxSettings:
    """Host-level settings of sandboxed kernels."""

    bwrap: str = "bwrap"  # the bubblewrap binary (a name on PATH or a path)
    socat: str = "socat"  # bridges the egress proxy's socket into the sandbox; without it, no egress
    sandbox_uid: int = 64123  # a root server's sandboxes run as uids of their own from this one on
    sandbox_gid: int = 64123  # ... and gids from this one on
    sandbox_ids: int = 1024  # how many: at most this many live sandboxes on this machine (all its servers)
    sandbox_python: str = ""  # the kernel's interpreter (default: the server's own)


def python_trees(python: str) -> list[Path]:
    """The directories a Python environment needs: the venv and its base interpreter's prefix."""
    exe = Path(python or sys.executable)
    venv = exe.parent.parent
    cfg = venv / "pyvenv.cfg"
    trees = [venv]
    if cfg.exists():
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home":
                trees.append(Path(value.strip()).parent)
    trees.append(exe.resolve().parent.parent)
    if not python:
        trees += [Path(sys.base_prefix), Path(sys.base_exec_prefix)]
    out: list[Path] = []
    for t in sorted({p.resolve() for p in trees}, key=lambda p: len(p.parts)):
        if t.parts[:2] != ("/", "usr") and not any(t.is_relative_to(o) for o in out):
            out.append(t)
    return out


def base_args(owner: tuple[int, int] | None) -> list[str]:
    """Namespaces and the read-only system: the part of the sandbox every kernel shares."""
    args = ["--die-with-parent", "--new-session", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    args += ["--unshare-cgroup-try", "--hostname", "sandbox"]
    if owner is None:
        # a user namespace of its own, whose first process may set the namespace's limits (`inside`) and then
        # drops the capability with every other one
        args += ["--unshare-user", "--cap-add", "CAP_SYS_RESOURCE"]
    args += ["--ro-bind", "/usr", "/usr"]
    for d in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        p = Path("/") / d
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            args += ["--ro-bind", str(p), str(p)]
    # a /dev/shm of its own, writable by the kernel's uid: bwrap's --dev leaves a root-owned 0755 one,
    # and POSIX semaphores (multiprocessing's Pool, Queue, ProcessPoolExecutor) live there
    return args + ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm",
                   "--perms", "1777", "--tmpfs", "/tmp"]


def inside_args(shares: Shares, max_processes: int) -> list[str]:
    """What an unprivileged sandbox runs first, in its own user namespace: cap inotify there, set the limits the
    kernel counts per namespace (message queue bytes, processes), then drop every capability."""
    limits = [f"--msgqueue={shares.msgqueue_bytes}"] + ([f"--nproc={max_processes}"] if max_processes else [])
    return ["/bin/sh", "-c", f'{shares.script()} && exec "$@"', "sandbox-setup", "prlimit", *limits, "--",
            *setpriv_args(None)]


def setpriv_args(owner: tuple[int, int] | None) -> list[str]:
    """Become `owner` (when given) with no capability at all (ambient ones included) and no way to gain one."""
    ids = [f"--reuid={owner[0]}", f"--regid={owner[1]}", "--clear-groups"] if owner is not None else []
    return ["setpriv", *ids, "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]


def bwrap_argv(
    settings: SandboxSettings,
    run_dir: Path,
    workdir: Path,
    etc: Path,
    env: dict[str, str],
    owner: tuple[int, int] | None,
    socat: str | None,
    inside: list[str] | None = None,
    state: Path | None = None,
) -> list[str]:
    """The kernel's command line: bwrap, its mounts and environment, then the kernel (and socat)."""
    args = [shutil.which(settings.bwrap) or settings.bwrap, *base_args(owner), "--perms", "0755", "--dir", "/etc"]
    for name in ETC:
        p = Path("/etc") / name
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), str(p)]
        elif p.exists():
            args += ["--ro-bind", str(p), str(p)]
    for name in ("passwd", "group", "hosts"):
        args += ["--ro-bind", str(etc / name), f"/etc/{name}"]
    args += ["--perms", "0755", "--dir", "/home", "--perms", "1777" if owner else "0700", "--tmpfs", HOME]
    # bwrap would create missing parents with mode 0700, closed to a dropped uid
    made = {Path(p) for p in ("/", "/usr", "/etc", "/tmp", "/home", HOME, "/proc", "/dev")}
    trees = python_trees(settings.sandbox_python)
    # the run directory keeps its host path: the connection file names its sockets by it
    for target in [*trees, run_dir]:
        for parent in reversed(target.parents):
            if parent not in made:
                args += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        made.add(target)
        mode = "--ro-bind" if target in trees else "--bind"
        args += [mode, str(target), str(target)]
    # the sandbox's own root (where /etc and the mount points were made) is read-only: an unprivileged sandbox's
    # kernel owns it, and writes belong in /workspace, /tmp or $HOME
    args += ["--bind", str(workdir), WORKSPACE]
    if state is not None:
        args += ["--bind", str(state), STATE]
    args += ["--remount-ro", "/", "--chdir", WORKSPACE, "--clearenv"]
    python = settings.sandbox_python or sys.executable
    setenv = {k: v for k, v in env.items() if k not in OWN_ENV}
    setenv.update(
        PATH=f"{Path(python).parent}:/usr/local/bin:/usr/bin:/bin",
        HOME=HOME,
        USER="sandbox",
        LOGNAME="sandbox",
        JPY_PARENT_PID="1",  # no parent poller: the pid namespace ends with bwrap
    )
    script = f'exec {shlex.quote(python)} -c {shlex.quote(KERNEL_MAIN)} -f "$0" "$@"'
    if socat:
        url = f"http://127.0.0.1:{PROXY_PORT}"
        setenv.update(HTTP_PROXY=url, HTTPS_PROXY=url, http_proxy=url, https_proxy=url)
        listen = f"TCP-LISTEN:{PROXY_PORT},bind=127.0.0.1,fork,reuseaddr"
        bridge = shlex.join([socat, listen, f"UNIX-CONNECT:{run_dir / 'egress.sock'}"])
        script = f"{bridge} 2>/dev/null & {script}"
    for k, v in setenv.items():
        args += ["--setenv", k, v]
    args.append("--")
    args += setpriv_args(owner) if owner is not None else list(inside or [])
    return args + ["/bin/sh", "-c", script, "{connection_file}"]
