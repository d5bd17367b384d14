"""Sandboxed kernels: bubblewrap around the kernel, the egress proxy beside it.

The kernel runs in new network, PID, IPC and UTS namespaces and sees only
read-only /usr, its Python environment, a curated /etc, its own run
directory (connection file, ZMQ sockets, the proxy socket) and workspace (at /workspace),
and empty tmpfs /tmp, /dev/shm and $HOME: never the Jupyter runtime directory, the
session database, the server's config or key files, or anyone's home.

When the server runs as root, each sandbox's processes run as a host uid of their own, leased
from a range (`sandbox_uid` and the next `sandbox_ids - 1`; no entry in the host's passwd is
needed: the sandbox gets a passwd of its own), with no capabilities and no_new_privs, so even a
file in a mounted directory is protected by its mode, and per-user counts (inotify, processes,
message queues) are the session's own (identity.py). Otherwise bwrap runs unprivileged in a user
namespace of its own as the same uid: protection comes from what is not mounted, and the
per-user counts are capped per namespace before the kernel drops its last capability.

Inside, a seccomp filter (seccomp.py, compiled once per host) takes away the
system calls a kernel never needs, the keyrings first. Each session's workspace
is a loop-mounted image of a fixed size (quota.py) on the host, bound in as the
kernel's working directory: kept across the session's kernels, destroyed with
its hands; a pooled kernel brings one of its own, which the session adopts.

Interrupts are messages on the control channel: a SIGINT to the process
group would kill bwrap, and with it the kernel. The launch wrapper stays as
bwrap's parent (`supervise`): bwrap's init binds itself to bwrap only after it
has set up the mounts, and a host killed before then would leave it running.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpec

from ..config import from_env
from ..egress import EgressPolicy, EgressProxy, EgressSettings, Vault
from . import quota
from .base import Kernel, Place
from .identity import Identities, Identity, Shares
from .limits import Limits
from .local import kernel_env
from .process import MAX_MESSAGE, ProcessKernel, start_process
from .quota import WorkspaceSettings
from .seccomp import SeccompFilter, SeccompSettings, prepare

PROXY_PORT = 3128
HOME = "/home/sandbox"
# where the session's workspace is inside: a fixed path, so the kernel learns nothing of where it is on the host
# (a workspace root under a home directory would name the host's user)
WORKSPACE = "/workspace"
# What Python, ssl, locale, time zones and fonts read from /etc; nothing else of the host's /etc.
ETC = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl/certs", "ssl/openssl.cnf", "ca-certificates",
    "nsswitch.conf", "localtime", "timezone", "alternatives", "fonts", "mime.types", "protocols",
    "services", "os-release", "gai.conf", "host.conf", "locale.alias",
)  # fmt: skip
OWN_WORKDIR = "none: the session's own workdir (hands.workdir), used as it is"
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


class SandboxLauncher:
    """Starts each kernel inside bubblewrap under the host's seccomp filter, in its session's workspace,
    with its session's egress proxy beside it."""

    name = "sandbox"

    def __init__(self, settings: SandboxSettings | None = None, *, limits: Limits | None = None, registry: Any = None,
                 vault: Vault | None = None, egress_settings: EgressSettings | None = None,
                 seccomp: SeccompFilter | None = None, workspaces: WorkspaceSettings | None = None,
                 max_message: int = MAX_MESSAGE):
        self.settings = settings or SandboxSettings()
        self.limits, self.registry = limits, registry
        self.vault, self.egress_settings = vault, egress_settings
        # a host prepares its filter once (HandsFactory); a launcher made by itself prepares the default one
        self.seccomp = seccomp if seccomp is not None else prepare(from_env(SeccompSettings))
        self.workspaces = workspaces if workspaces is not None else from_env(WorkspaceSettings)
        self.max_message = max_message
        self.identities = Identities(self.settings.sandbox_uid, self.settings.sandbox_gid, self.settings.sandbox_ids)
        self._pool_proxy: EgressProxy | None = None

    def proxy(self, place: Place | None) -> EgressProxy:
        """A session's egress proxy, built once per session (its request count spans kernels); deny-all for the pool."""
        if place is None:
            if self._pool_proxy is None:
                self._pool_proxy = EgressProxy(EgressPolicy.from_config(None, self.egress_settings), self.vault, None,
                                               self.egress_settings)
            return self._pool_proxy
        if "egress" not in place.held:
            policy = EgressPolicy.from_config(place.egress, self.egress_settings)
            place.held["egress"] = EgressProxy(policy, self.vault, place.sink, self.egress_settings)
        proxy: EgressProxy = place.held["egress"]
        return proxy

    def owner(self, place: Place) -> tuple[int, int] | None:
        """The uid:gid of the session's sandboxes, when it is not ours (a root server leases one per workspace)."""
        return self._identity(place, None).owner

    def _identity(self, place: Place | None, own: quota.Workspace | None) -> Identity:
        """Who a kernel runs as: its workspace's identity; a session with a workdir of its own leases one, kept
        in its place until its hands shut down (`release`)."""
        if own is not None and own.identity is not None:
            return own.identity
        if place is not None and isinstance(place.workspace, quota.Workspace) and place.workspace.identity is not None:
            return place.workspace.identity
        if place is None:
            raise RuntimeError("a pooled sandbox kernel starts with a workspace of its own")
        if "identity" not in place.held:
            place.held["identity"] = self.identities.lease()
        identity: Identity = place.held["identity"]
        return identity

    async def release(self, place: Place) -> None:
        """Give back what the session held beyond its workspace: its identity (a session with its own workdir)."""
        identity = place.held.pop("identity", None)
        if isinstance(identity, Identity):
            identity.release()

    def workspace(self, label: str, keep: Path | None = None) -> quota.Workspace:
        """A new workspace of `workspace_mb` for a session (or a pooled kernel), or the session's kept one (`keep`:
        made or mounted again there), with an identity of its own whose uid owns it."""
        w = self.workspaces
        root = w.workspace_root or quota.default_root()
        label = label if quota.LABEL.fullmatch(label) else ""
        identity = self.identities.lease()
        try:
            if keep is not None:
                ws = quota.keep(keep, w.workspace_mb, identity.owner, root, label=label)
            else:
                ws = quota.create(root, w.workspace_mb, owner=identity.owner, label=label)
        except BaseException:
            identity.release()
            raise
        ws.identity = identity
        return ws

    async def _new_workspace(self, label: str, keep: Path | None = None) -> quota.Workspace:
        """`workspace(label)` off the event loop (mkfs and mount take a while); if the start is cancelled
        meanwhile (a factory closing, a pool kernel booting), what was made is destroyed when it is done."""
        made = asyncio.ensure_future(asyncio.to_thread(self.workspace, label, keep))
        try:
            return await asyncio.shield(made)
        except asyncio.CancelledError:
            loop = asyncio.get_running_loop()

            def undo(done: asyncio.Future[quota.Workspace]) -> None:
                if not done.cancelled() and done.exception() is None:
                    loop.run_in_executor(None, done.result().destroy)

            made.add_done_callback(undo)
            raise

    def argv(self, run_dir: Path, workdir: Path, env: dict[str, str], identity: Identity) -> list[str]:
        """The kernel's command line (bwrap, loading the seccomp filter), with the files and owners its directories need."""
        owner = identity.owner
        uid, gid = identity.uid, identity.gid
        if owner is not None:
            os.chown(run_dir, uid, gid)
            if not any(workdir.iterdir()):  # a fresh workspace; a user's directory with files keeps its owner
                os.chown(workdir, uid, gid)
        etc = run_dir / "etc"
        etc.mkdir(mode=0o755)
        (etc / "passwd").write_text(f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
                                    f"sandbox:x:{uid}:{gid}:workbench sandbox:{HOME}:/usr/sbin/nologin\n")
        (etc / "group").write_text(f"root:x:0:\nsandbox:x:{gid}:\n")
        (etc / "hosts").write_text("127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost\n")
        socat = shutil.which(self.settings.socat, path="/usr/bin:/bin:/usr/local/bin")
        inside = [] if owner is not None else self.inside()
        return self.seccomp.wrap(bwrap_argv(self.settings, run_dir, workdir, etc, env, owner, socat, inside))

    def inside(self) -> list[str]:
        """What an unprivileged sandbox runs first (`inside_args`), with this launcher's shares and limits."""
        return inside_args(self.identities.shares, self.limits.max_processes if self.limits is not None else 0)

    async def start(self, place: Place | None) -> ProcessKernel:
        """Start a kernel in a sandbox around `place`'s workdir (making the session's workspace the first time;
        a pooled kernel gets one of its own) and wait until it is ready."""
        socat = shutil.which(self.settings.socat, path="/usr/bin:/bin:/usr/local/bin")
        proxy = self.proxy(place) if socat else None  # first: a bad policy fails before anything is made
        own: quota.Workspace | None = None  # a pooled kernel's, until a session adopts it
        identity: Identity | None = None
        run_dir: Path | None = None
        listener = None
        try:
            if place is None:
                own = await self._new_workspace("pool")
                workdir, how = own.path, own.how
            else:
                if place.workdir is None:  # the session's, for all its kernels
                    place.workspace = await self._new_workspace(place.session, place.keep)
                    place.workdir = place.workspace.path
                workdir, how = place.workdir, place.workspace.how if place.workspace is not None else OWN_WORKDIR
            identity = self._identity(place, own)
            run_dir = Path(tempfile.mkdtemp(prefix="workbench-run-")).resolve()
            argv = self.argv(run_dir, workdir.resolve(), kernel_env(place.env if place else None), identity)
            spec = KernelSpec(argv=argv, display_name="workbench sandbox", language="python", interrupt_mode="message", env={})
            if proxy is not None:
                listener = await proxy.listen(run_dir / "egress.sock", identity.uid, identity.gid)
        except BaseException:
            if listener is not None:
                await listener.close()
            if run_dir is not None:
                shutil.rmtree(run_dir, ignore_errors=True)
            if own is not None:
                await asyncio.to_thread(own.destroy)
            raise
        kernel = await start_process(
            spec, launcher=self.name, env={"PATH": "/usr/bin:/bin"}, run_dir=run_dir, workdir=workdir.resolve(),
            workspace=own, limits=self.limits, registry=self.registry,
            startup_timeout=place.startup_timeout if place else 60.0, owner=identity.owner, supervise=True, signal_codes=True,
            closers=[listener.close] if listener else [], held={"egress": listener}, max_message=self.max_message,
            processes_by="uid" if identity.own else "namespace",
        )
        kernel.limits.update(seccomp=self.seccomp.how, workspace=how, identity=identity.how)
        return kernel

    async def make_workspace(self, place: Place) -> None:
        """Make the session's workspace before its first kernel (files put in before any code runs)."""
        if place.workdir is None:
            place.workspace = await self._new_workspace(place.session, place.keep)
            place.workdir = place.workspace.path

    def fits(self, place: Place) -> bool:
        """A pooled sandbox has its workdir and variables bound in: it serves only sessions that set neither
        (nor keep their workspace somewhere of their own)."""
        return place.workdir is None and place.keep is None and not place.env

    async def adopt(self, kernel: Kernel, place: Place) -> str:
        """A pooled kernel's egress now follows the session's policy and log; its workspace is the session's."""
        if not isinstance(kernel, ProcessKernel):
            raise TypeError(f"a sandbox launcher cannot adopt a {type(kernel).__name__}")
        listener = kernel.held.get("egress")
        if listener is not None:
            listener.proxy = self.proxy(place)
        if place.workdir is None and kernel.workspace is not None:
            place.workspace, kernel.workspace = kernel.workspace, None
            place.workdir = place.workspace.path
        return ""

    async def aclose(self) -> None:
        """Nothing is held beyond each kernel (and each session's proxy and workspace, in its Place)."""


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
    args += ["--bind", str(workdir), WORKSPACE, "--chdir", WORKSPACE, "--clearenv"]
    python = settings.sandbox_python or sys.executable
    setenv = {k: v for k, v in env.items() if k not in OWN_ENV}
    setenv.update(
        PATH=f"{Path(python).parent}:/usr/local/bin:/usr/bin:/bin",
        HOME=HOME,
        USER="sandbox",
        LOGNAME="sandbox",
        JPY_PARENT_PID="1",  # no parent poller: the pid namespace ends with bwrap
    )
    script = f'exec {shlex.quote(python)} -m ipykernel_launcher -f "$0" "$@"'
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
