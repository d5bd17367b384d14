"""Sandboxed kernels: bubblewrap around the kernel, the egress proxy beside it.

The kernel runs in new network, PID, IPC and UTS namespaces and sees only
read-only /usr, its Python environment, a curated /etc, its own run
directory (connection file, ZMQ sockets, the proxy socket) and workspace,
and empty tmpfs /tmp and $HOME: never the Jupyter runtime directory, the
session database, the server's config or key files, or anyone's home.

When the server runs as root, the kernel runs as a separate unprivileged uid
(`sandbox_uid`, 64123 by default, with no entry in the host's passwd: a
fixed number needs no user to be created on the host, and the sandbox gets a
passwd of its own), with no capabilities and no_new_privs, so even a file
in a mounted directory is protected by its mode. Otherwise bwrap runs
unprivileged in a user namespace as the same uid, and protection comes only
from what is not mounted.

Interrupts are messages on the control channel: a SIGINT to the process
group would kill bwrap, and with it the kernel.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_client import AsyncKernelManager
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.provisioning import LocalProvisioner

from ..egress import EgressPolicy, EgressProxy, EgressSettings, Listener, Vault
from .base import EventSink

PROXY_PORT = 3128
HOME = "/home/sandbox"
# What Python, ssl, locale, time zones and fonts read from /etc; nothing else of the host's /etc.
ETC = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl/certs", "ssl/openssl.cnf", "ca-certificates",
    "nsswitch.conf", "localtime", "timezone", "alternatives", "fonts", "mime.types", "protocols",
    "services", "os-release", "gai.conf", "host.conf", "locale.alias",
)  # fmt: skip
# Parts of the kernel's environment that the sandbox sets itself.
OWN_ENV = ("PATH", "HOME", "USER", "LOGNAME", "JPY_PARENT_PID", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")


@dataclass
class SandboxSettings:
    """Host-level settings of sandboxed kernels."""

    bwrap: str = "bwrap"  # the bubblewrap binary (a name on PATH or a path)
    socat: str = "socat"  # bridges the egress proxy's socket into the sandbox; without it, no egress
    sandbox_uid: int = 64123  # the kernel's uid when the server runs as root
    sandbox_gid: int = 64123
    sandbox_python: str = ""  # the kernel's interpreter (default: the server's own)


class _OneSpec(KernelSpecManager):
    """A kernelspec held in memory, never in a directory the kernel could write to."""

    def __init__(self, spec: KernelSpec, **kw: Any):
        super().__init__(**kw)
        self._spec = spec

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return self._spec


class SandboxProvisioner(LocalProvisioner):
    """Reports a kernel killed by signal N as killed by N, not as bwrap's exit code 128+N."""

    async def poll(self) -> int | None:
        status = await super().poll()
        if status is not None and 128 < status < 128 + signal.NSIG:
            return -(status - 128)  # what a plain kernel process would report (a kernel's own exit(137) reads the same)
        return status


class SandboxKernelManager(AsyncKernelManager):
    """A kernel manager that hands the connection file to the sandbox uid and runs its egress listener."""

    owner: tuple[int, int] | None = None
    egress: EgressProxy | None = None
    egress_path: Path | None = None
    _listener: Listener | None = None

    def write_connection_file(self, **kw: Any) -> None:
        super().write_connection_file(**kw)
        if self.owner is not None:
            # mode stays 0600; the kernel's uid must read it, and it is the only secret in the run dir
            os.chown(self.connection_file, *self.owner)

    async def _async_pre_start_kernel(self, **kw: Any) -> Any:
        if self.provisioner is None:
            self.kernel_id = self.kernel_id or kw.get("kernel_id") or str(uuid.uuid4())
            self.provisioner = SandboxProvisioner(kernel_id=self.kernel_id, kernel_spec=self.kernel_spec, parent=self)
        return await super()._async_pre_start_kernel(**kw)

    async def start_kernel(self, **kw: Any) -> None:  # type: ignore[override]
        if self.egress is not None and self._listener is None:
            uid, gid = self.owner or (None, None)
            self._listener = await self.egress.listen(self.egress_path, uid, gid)
        try:
            await super().start_kernel(**kw)
        except BaseException:
            await self.close_egress()
            raise

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart:
            await self.close_egress()

    async def close_egress(self) -> None:
        if self._listener is not None:
            listener, self._listener = self._listener, None
            await listener.close()


class SandboxLauncher:
    """Starts each kernel inside bubblewrap, with this session's egress proxy beside it."""

    name = "sandbox"
    interrupt_mode = "message"
    poolable = True  # a pooled kernel is handed to a session by adopt(), which rebinds its egress
    supervise = True  # bwrap's init binds itself to bwrap late: the launch wrapper stays to end it with the host

    def __init__(
        self,
        settings: SandboxSettings | None = None,
        *,
        egress: dict[str, Any] | None = None,
        vault: Vault | None = None,
        egress_settings: EgressSettings | None = None,
        on_event: EventSink | None = None,
    ):
        self.settings = settings or SandboxSettings()
        self.egress_config = egress
        self.vault, self.egress_settings, self.on_event = vault, egress_settings, on_event
        self._proxy: EgressProxy | None = None

    def proxy(self) -> EgressProxy:
        """This session's egress proxy (built once: its request count spans kernels)."""
        if self._proxy is None:
            policy = EgressPolicy.from_config(self.egress_config, self.egress_settings)
            self._proxy = EgressProxy(policy, self.vault, self.on_event, self.egress_settings)
        return self._proxy

    async def adopt(self, lk: Any) -> None:
        """Make a pooled kernel this session's: its egress now follows this session's policy and log."""
        km = lk.km
        km.egress = self.proxy()
        if km._listener is not None:
            km._listener.proxy = km.egress

    def owner(self) -> tuple[int, int] | None:
        """The uid:gid the kernel runs as, when it differs from ours (we are root)."""
        return (self.settings.sandbox_uid, self.settings.sandbox_gid) if os.geteuid() == 0 else None

    def manager(self, run_dir: Path, env: dict[str, str], workdir: Path) -> tuple[AsyncKernelManager, dict]:
        """A kernel manager whose kernel runs in the sandbox, and the kwargs for its start_kernel()."""
        socat = shutil.which(self.settings.socat, path="/usr/bin:/bin:/usr/local/bin")
        proxy = self.proxy() if socat else None  # first: a bad policy fails before anything is made
        run_dir, workdir = Path(run_dir).resolve(), Path(workdir).resolve()
        owner = self.owner()
        uid, gid = owner or (os.getuid(), os.getgid())
        if owner is not None:
            os.chown(run_dir, uid, gid)
            if not any(workdir.iterdir()):  # a fresh workspace; a user's directory with files keeps its owner
                os.chown(workdir, uid, gid)
        etc = run_dir / "etc"
        etc.mkdir(mode=0o755)
        (etc / "passwd").write_text(f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{uid}:{gid}:workbench sandbox:{HOME}:/usr/sbin/nologin\n")
        (etc / "group").write_text(f"root:x:0:\nsandbox:x:{gid}:\n")
        (etc / "hosts").write_text("127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost\n")
        argv = bwrap_argv(self.settings, run_dir, workdir, etc, env, owner, socat)
        spec = KernelSpec(argv=argv, display_name="workbench sandbox", language="python", interrupt_mode="message", env={})
        km = SandboxKernelManager(kernel_name="workbench-sandbox", kernel_spec_manager=_OneSpec(spec), transport="ipc")
        km.connection_file = str(run_dir / "kernel.json")
        km.ip = str(run_dir / "kernel-ipc")
        km.owner, km.egress, km.egress_path = owner, proxy, run_dir / "egress.sock"
        return km, {"env": {"PATH": "/usr/bin:/bin"}, "cwd": str(workdir)}


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
        args.append("--unshare-user")
    args += ["--ro-bind", "/usr", "/usr"]
    for d in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        p = Path("/") / d
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            args += ["--ro-bind", str(p), str(p)]
    return args + ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]


def setpriv_args(owner: tuple[int, int]) -> list[str]:
    uid, gid = owner
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]


def bwrap_argv(
    settings: SandboxSettings,
    run_dir: Path,
    workdir: Path,
    etc: Path,
    env: dict[str, str],
    owner: tuple[int, int] | None,
    socat: str | None,
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
    for target in [*trees, run_dir, workdir]:
        for parent in reversed(target.parents):
            if parent not in made:
                args += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        made.add(target)
        mode = "--ro-bind" if target in trees else "--bind"
        args += [mode, str(target), str(target)]
    args += ["--chdir", str(workdir), "--clearenv"]
    python = settings.sandbox_python or sys.executable
    setenv = {k: v for k, v in env.items() if k not in OWN_ENV}
    setenv.update(
        PATH=f"{Path(python).parent}:/usr/local/bin:/usr/bin:/bin",
        HOME=HOME,
        USER="sandbox",
        LOGNAME="sandbox",
        JPY_PARENT_PID="1",  # no parent poller: the pid namespace ends with bwrap
    )
    script = f'exec {shlex.quote(python)} -m ipykernel_launcher -f "$0"'
    if socat:
        url = f"http://127.0.0.1:{PROXY_PORT}"
        setenv.update(HTTP_PROXY=url, HTTPS_PROXY=url, http_proxy=url, https_proxy=url)
        listen = f"TCP-LISTEN:{PROXY_PORT},bind=127.0.0.1,fork,reuseaddr"
        bridge = shlex.join([socat, listen, f"UNIX-CONNECT:{run_dir / 'egress.sock'}"])
        script = f"{bridge} 2>/dev/null & {script}"
    for k, v in setenv.items():
        args += ["--setenv", k, v]
    args.append("--")
    if owner is not None:
        args += setpriv_args(owner)
    return args + ["/bin/sh", "-c", script, "{connection_file}"]
