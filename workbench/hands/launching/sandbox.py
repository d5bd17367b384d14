"""Sandboxed kernels: bubblewrap around the kernel (isolating/bubblewrap.py), the egress proxy beside it.

Inside, a seccomp filter (seccomp.py, compiled once per host) takes away the
system calls a kernel never needs, the keyrings first. Each session's workspace
is a loop-mounted image of a fixed size (quota.py) on the host, bound in as the
kernel's working directory: kept across the session's kernels, destroyed with
its hands; a pooled kernel brings one of its own, which the session adopts. So
with the session's state directory (launching/state.py), bound in beside it.

Interrupts are messages on the control channel: a SIGINT to the process
group would kill bwrap, and with it the kernel. The launch wrapper stays as
bwrap's parent (`supervise`): bwrap's init binds itself to bwrap only after it
has set up the mounts, and a host killed before then would leave it running.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpec

from ...config import from_env
from ...egress import EgressProxy, EgressSettings, Vault
from ..base import Kernel, Place
from ..isolating import quota
from ..isolating.bubblewrap import HOME, STATE, SandboxSettings, bwrap_argv, inside_args
from ..isolating.identity import Identities, Identity
from ..isolating.limits import Limits
from ..isolating.quota import WorkspaceSettings
from ..isolating.seccomp import SeccompFilter, SeccompSettings, prepare
from .local import kernel_env
from .process import MAX_MESSAGE, ProcessKernel, start_process
from .proxies import SessionProxies
from .state import give_state, new_state

OWN_WORKDIR = "none: the session's own workdir (hands.workdir), used as it is"


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
        self.proxies = SessionProxies(vault, egress_settings)
        self.python = self.settings.sandbox_python or sys.executable

    def proxy(self, place: Place | None) -> EgressProxy:
        """A session's egress proxy, built once per session (its request count spans kernels); deny-all for the pool."""
        return self.proxies.of(place)

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

    def argv(self, run_dir: Path, workdir: Path, env: dict[str, str], identity: Identity,
             state: Path | None = None, python: str = "") -> list[str]:
        """The kernel's command line (bwrap, loading the seccomp filter), with the files and owners its directories need;
        `python`: the session's interpreter (its environment bound read-only), else the host's."""
        settings = replace(self.settings, sandbox_python=python) if python else self.settings
        owner = identity.owner
        uid, gid = identity.uid, identity.gid
        if owner is not None:
            os.chown(run_dir, uid, gid)
            if state is not None:
                os.chown(state, uid, gid)
            if not any(workdir.iterdir()):  # a fresh workspace; a user's directory with files keeps its owner
                os.chown(workdir, uid, gid)
        etc = run_dir / "etc"
        etc.mkdir(mode=0o755)
        (etc / "passwd").write_text(f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
                                    f"sandbox:x:{uid}:{gid}:workbench sandbox:{HOME}:/usr/sbin/nologin\n")
        (etc / "group").write_text(f"root:x:0:\nsandbox:x:{gid}:\n")
        (etc / "hosts").write_text("127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost\n")
        socat = shutil.which(settings.socat, path="/usr/bin:/bin:/usr/local/bin")
        inside = [] if owner is not None else self.inside()
        return self.seccomp.wrap(bwrap_argv(settings, run_dir, workdir, etc, env, owner, socat, inside, state))

    def inside(self) -> list[str]:
        """What an unprivileged sandbox runs first (`inside_args`), with this launcher's shares and limits."""
        return inside_args(self.identities.shares, self.limits.max_processes if self.limits is not None else 0)

    async def start(self, place: Place | None) -> ProcessKernel:
        """Start a kernel in a sandbox around `place`'s workdir (making the session's workspace the first time;
        a pooled kernel gets one of its own) and wait until it is ready."""
        socat = shutil.which(self.settings.socat, path="/usr/bin:/bin:/usr/local/bin")
        proxy = self.proxy(place) if socat else None  # first: a bad policy fails before anything is made
        own: quota.Workspace | None = None  # a pooled kernel's, until a session adopts it
        own_state: Path | None = None  # the same for its state directory
        state: Path | None = None
        identity: Identity | None = None
        run_dir: Path | None = None
        listener = None
        try:
            if place is None:
                own = await self._new_workspace("pool")
                workdir, how = own.path, own.how
                own_state = state = new_state()
            else:
                if place.workdir is None:  # the session's, for all its kernels
                    place.workspace = await self._new_workspace(place.session, place.keep)
                    place.workdir = place.workspace.path
                workdir, how = place.workdir, place.workspace.how if place.workspace is not None else OWN_WORKDIR
                if place.state is None:
                    give_state(place, new_state(), Path(STATE))
                state = place.state
            identity = self._identity(place, own)
            run_dir = Path(tempfile.mkdtemp(prefix="workbench-run-")).resolve()
            argv = self.argv(run_dir, workdir.resolve(), kernel_env(place.env if place else None), identity, state,
                             python=place.python if place else "")
            spec = KernelSpec(argv=argv, display_name="workbench sandbox", language="python", interrupt_mode="message", env={})
            if proxy is not None:
                listener = await proxy.listen(run_dir / "egress.sock", identity.uid, identity.gid)
        except BaseException:
            if listener is not None:
                await listener.close()
            for made in (run_dir, own_state):
                if made is not None:
                    shutil.rmtree(made, ignore_errors=True)
            if own is not None:
                await asyncio.to_thread(own.destroy)
            raise
        kernel = await start_process(
            spec, launcher=self.name, env={"PATH": "/usr/bin:/bin"}, run_dir=run_dir, workdir=workdir.resolve(),
            workspace=own, limits=self.limits, registry=self.registry,
            startup_timeout=place.startup_timeout if place else 60.0, owner=identity.owner, supervise=True, signal_codes=True,
            closers=[listener.close] if listener else [], held={"egress": listener}, max_message=self.max_message,
            processes_by="uid" if identity.own else "namespace", state=own_state,
        )
        kernel.limits.update(seccomp=self.seccomp.how, workspace=how, identity=identity.how)
        return kernel

    async def make_workspace(self, place: Place) -> None:
        """Make the session's workspace before its first kernel (files put in before any code runs)."""
        if place.workdir is None:
            place.workspace = await self._new_workspace(place.session, place.keep)
            place.workdir = place.workspace.path

    def fits(self, place: Place) -> bool:
        """A pooled sandbox has its workdir, state directory and variables bound in: it serves only sessions that
        have none of them yet (nor keep their workspace somewhere of their own)."""
        return (place.workdir is None and place.state is None and place.keep is None and not place.env
                and not place.python)

    async def adopt(self, kernel: Kernel, place: Place) -> str:
        """A pooled kernel's egress now follows the session's policy and log; its workspace and state are the session's."""
        if not isinstance(kernel, ProcessKernel):
            raise TypeError(f"a sandbox launcher cannot adopt a {type(kernel).__name__}")
        listener = kernel.held.get("egress")
        if listener is not None:
            listener.proxy = self.proxy(place)
        if place.workdir is None and kernel.workspace is not None:
            place.workspace, kernel.workspace = kernel.workspace, None
            place.workdir = place.workspace.path
        if place.state is None and kernel.state is not None:
            give_state(place, kernel.state, Path(STATE))
            kernel.state = None
        return ""

    async def aclose(self) -> None:
        """Nothing is held beyond each kernel (and each session's proxy and workspace, in its Place)."""
