"""A kernel process started with jupyter_client, and the ZMQ channel to it (local and sandboxed kernels).

`start_process()` starts one behind the launch wrapper (bound to the host, with limits) and
with nothing of the host's: stdin is /dev/null, stdout and stderr are pipes the hands read
into a bounded tail (`output.OutputTail`), no other descriptor passes (Popen closes them), and
the environment is the one the launcher gives. It registers the kernel for the reaper and
waits until it answers. A `ProcessKernel` is the handle the hands (or the pool) hold until
`kill()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import zmq
from jupyter_client import AsyncKernelManager
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.launcher import launch_kernel
from jupyter_client.provisioning import LocalProvisioner

from ..base import IDLE_AFTER_REPLY, IDLE_NEVER_CAME, Death, Dropped, Workspace
from ..isolating import freeze, limits as _limits
from ..isolating.limits import Limits
from . import launch
from .channel import MAX_MESSAGE, HandsKernelClient, IOPub
from .output import OutputTail

REPLY_LOOK = 0.25  # seconds between looks at a kernel that has not replied yet
SUPERVISOR_GRACE = 2.0  # seconds a supervising launch wrapper has to end its sandbox before a SIGKILL
__all__ = ["MAX_MESSAGE", "ProcessKernel", "start_process"]


class _OneSpec(KernelSpecManager):
    """A kernelspec held in memory, never in a directory the kernel could write to."""

    def __init__(self, spec: KernelSpec, **kw: Any):
        super().__init__(**kw)
        self._spec = spec

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return self._spec


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


class HandsProvisioner(LocalProvisioner):
    """Launches behind the launch wrapper with stdin /dev/null and stdout, stderr to the hands' pipes."""

    @property
    def manager(self) -> HandsKernelManager:
        km = self.parent
        assert isinstance(km, HandsKernelManager), "a HandsProvisioner belongs to a HandsKernelManager"
        return km

    async def launch_kernel(self, cmd: list[str], **kw: Any) -> Any:
        km = self.manager
        # close_fds is Popen's default, said out loud: the kernel gets these three descriptors and no other
        kw.update(stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True)
        # LocalProvisioner.launch_kernel, with the spawn off the event loop: a fork and exec blocked it for 10-70 ms
        # on a loaded machine, and a spare boots while the session's kernel runs a call (right after a death)
        argv = km.wrap(cmd) if km.wrap is not None else cmd
        spawn = asyncio.ensure_future(asyncio.to_thread(launch_kernel, argv, **LocalProvisioner._scrub_kwargs(kw)))
        try:
            await asyncio.shield(spawn)
        finally:  # cancelled meanwhile: the process is still known, so the caller's kill stops it
            while not spawn.done():  # a spawn takes milliseconds; a second cancel does not lose its process
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(spawn)
            process = spawn.result()
            self.process, self.pid, self.pgid = process, process.pid, _pgid(process.pid)
            self.cwd = kw.get("cwd", Path.cwd())
        info = self.connection_info
        assert process is not None and process.stdout is not None and process.stderr is not None
        pipes = {"stdout": process.stdout, "stderr": process.stderr}
        process.stdout = process.stderr = None  # ours to read and close, not jupyter_client's
        await km.output.attach(pipes)
        return info

    async def poll(self) -> int | None:
        status = await super().poll()
        if self.manager.signal_codes and status is not None and 128 < status < 128 + signal.NSIG:
            return -(status - 128)  # bwrap reports a kernel killed by N as 128+N; say it as a plain process would
        return status

    async def kill(self, restart: bool = False) -> None:
        if self.manager.supervised and self.process is not None:
            # the supervising wrapper ends everything under it, orphans included; a SIGKILL to the
            # group would kill it first and could leave a sandbox's init (in a session of its own) behind
            try:
                self.process.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + SUPERVISOR_GRACE
            while self.process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if self.process.poll() is not None:
                return
        await super().kill(restart)


class HandsKernelManager(AsyncKernelManager):
    """A kernel manager whose kernels start through HandsProvisioner, as `start_process` configures."""

    wrap: Callable[[list[str]], list[str]] | None = None  # what goes in front of the kernel's argv
    output: OutputTail
    supervised = False  # the launch wrapper stays as the kernel's parent (bwrap)
    signal_codes = False  # an exit code 128+N means killed by signal N (bwrap)
    owner: tuple[int, int] | None = None  # the kernel's uid:gid, when it differs from ours

    def write_connection_file(self, **kw: Any) -> None:
        super().write_connection_file(**kw)
        if self.owner is not None:
            # mode stays 0600; the kernel's uid must read it, and it is the only secret in the run dir
            os.chown(self.connection_file, *self.owner)

    async def _async_pre_start_kernel(self, **kw: Any) -> Any:
        if self.provisioner is None:
            self.kernel_id = self.kernel_id or kw.get("kernel_id") or str(uuid.uuid4())
            self.provisioner = HandsProvisioner(kernel_id=self.kernel_id, kernel_spec=self.kernel_spec, parent=self)
        return await super()._async_pre_start_kernel(**kw)


class ProcessKernel:
    """A started kernel process: the ZMQ channel to it, its output, its directories and registry entry."""

    def __init__(self, km: HandsKernelManager, *, launcher: str, kid: str, run_dir: Path, workdir: Path,
                 workspace: Workspace | None, registry: Any, closers: list[Callable[[], Awaitable[None]]],
                 held: dict[str, Any], state: Path | None = None):
        self.km: HandsKernelManager = km
        self.kc: HandsKernelClient | None = None
        self.iopub: IOPub | None = None
        self.launcher, self.kid = launcher, kid
        self.run_dir, self.workdir = run_dir, workdir
        self.workspace = workspace  # a pooled kernel's own workspace, until a session adopts it
        self.state = state  # a pooled kernel's own state directory (launching/state.py), until a session adopts it
        self.registry, self.closers, self.held = registry, closers, held
        self.output: OutputTail = km.output  # fd-level output of the kernel process, bounded
        self.boot_ms = 0.0
        self.limits: dict[str, str] = {}
        self.stopped = False
        self._replied: dict[str, float] = {}  # msg_id -> when its execute_reply came (looked for after a loss)
        self._reply_content: dict[str, dict[str, Any]] = {}  # replies read while looking for the end of a call
        self._frozen: freeze.Stopped | None = None

    @property
    def pid(self) -> int | None:
        prov = self.km.provisioner
        return prov.pid if isinstance(prov, HandsProvisioner) else None

    @property
    def ident(self) -> dict[str, Any]:
        return {"pid": self.pid}

    def _client(self) -> HandsKernelClient:
        if self.kc is None:
            raise RuntimeError("the kernel has no client: it did not start, or it was stopped")
        return self.kc

    def execute(self, code: str, *, silent: bool = False) -> str:
        """Send an execute request; returns its msg_id."""
        msg_id: str = self._client().execute(code, silent=silent, store_history=not silent, allow_stdin=False,
                                             stop_on_error=not silent)
        if not silent and self.iopub is not None:
            self.iopub.expect(msg_id)
        return msg_id

    async def message(self, msg_id: str, timeout: float) -> tuple[str, dict[str, Any]] | Dropped | None:
        """The next iopub message of request `msg_id` (or a note of one dropped); None if none came within `timeout`."""
        if self.iopub is None:
            return None
        got = await self.iopub.next(msg_id, timeout)
        if got is None:
            return await self._idle_after_reply(msg_id)
        return got

    async def _idle_after_reply(self, msg_id: str) -> tuple[str, dict[str, Any]] | Dropped | None:
        """The call's end when its idle status does not come (lost with other output, or dropped by ZMQ unseen):
        its execute_reply, then a wait. Where nothing was seen lost, a note says what may be missing first."""
        kc = self._client()
        while msg_id not in self._replied:
            try:
                msg = await kc.get_shell_msg(timeout=0)
            except (queue.Empty, zmq.ZMQError):
                return None
            except Exception:  # a malformed reply: the kernel's, not ours
                continue
            parent = msg.get("parent_header")
            if isinstance(parent, dict) and parent.get("msg_id") == msg_id:
                self._replied[msg_id] = time.monotonic()
                content = msg.get("content")
                self._reply_content = {msg_id: content} if isinstance(content, dict) else {}
        if time.monotonic() - self._replied[msg_id] < IDLE_AFTER_REPLY:
            return None
        del self._replied[msg_id]
        assert self.iopub is not None
        return self.iopub.end(msg_id, IDLE_NEVER_CAME if self.iopub.lost_at is None else None)

    async def reply(self, msg_id: str, timeout: float) -> dict[str, Any]:
        """The content of the shell reply to `msg_id`; a kernel that dies meanwhile is an error at once."""
        if (content := self._reply_content.pop(msg_id, None)) is not None:
            return content
        kc = self._client()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the kernel did not answer within {timeout:g} s")
            try:
                msg = await kc.get_shell_msg(timeout=min(left, REPLY_LOOK))
            except queue.Empty:
                if (death := await self.death()) is not None:
                    raise RuntimeError(f"the kernel died ({death.how})") from None
                continue
            parent, content = msg.get("parent_header"), msg.get("content")
            if isinstance(parent, dict) and parent.get("msg_id") == msg_id:
                return content if isinstance(content, dict) else {"status": "error", "ename": "MalformedReply"}

    async def death(self) -> Death | None:
        """How the kernel process ended (exit code, signal, out of memory), or None while it runs."""
        prov = self.km.provisioner
        if prov is None:
            return Death("it was stopped") if self.stopped else None
        status = await prov.poll()
        if status is None:
            return None
        sig = -status if status < 0 else None
        if sig:
            how = f"signal {_signame(sig)}"
        elif status > 128 and _signame(status - 128) != str(status - 128):
            how = f"exit code {status}, i.e. signal {_signame(status - 128)} inside a wrapper"
        else:
            how = f"exit code {status}"
        if _limits.oom_killed(self.kid):
            how += ", out of memory: it went over its memory limit"
        return Death(how, exit_code=status, signal=sig)

    async def interrupt(self) -> None:
        """Interrupt the running cell (a signal or a message, as the kernelspec says)."""
        try:
            await self.km.interrupt_kernel()
        except (RuntimeError, OSError):
            pass  # no kernel any more: death() says so at the next look

    async def freeze(self) -> list[str]:
        """Stop (SIGSTOP) every process of the kernel: those under its process, those in its cgroups (freeze.py);
        a supervising launch wrapper stays running. Notes on what could not be stopped."""
        pid = self.pid
        if pid is None or self.stopped or self._frozen is not None:
            return []
        self._frozen = await asyncio.to_thread(freeze.stop, pid, keep_root=self.km.supervised,
                                               members=lambda: _limits.members(self.kid))
        return self._frozen.notes

    async def thaw(self) -> None:
        """Let the processes `freeze` stopped go on (SIGCONT)."""
        frozen, self._frozen = self._frozen, None
        if frozen is not None:
            await asyncio.to_thread(frozen.cont)

    async def kill(self) -> None:
        """Stop the kernel now and free everything it held; safe to call twice."""
        if self.stopped:
            return
        self.stopped = True
        if self.iopub is not None:
            self.iopub.close()
        if self.kc is not None:
            # the client's sockets with no linger (stop_channels would give them 100 ms): a request queued to a dead
            # kernel is dropped at once instead of holding the event loop while the context terminates
            self._close_contexts(self.kc)
            self.kc.stop_channels()
        # jupyter_client's shutdown sends an interrupt first, on a control socket that lingers 100 ms: to a dead
        # kernel it is never delivered, and terminating the context blocked the event loop for that long (100-200
        # ms at load) per death, right when the replacement answers; a kill needs no interrupt delivered
        control = self.km._control_socket
        if control is not None and not control.closed:
            control.linger = 0
        try:
            await self.km.shutdown_kernel(now=True)
        except Exception:  # jupyter_client's shutdown of a kernel that is half there; make sure it is gone
            prov = self.km.provisioner
            proc = prov.process if isinstance(prov, HandsProvisioner) else None
            if proc is not None and proc.poll() is None:
                proc.kill()
        finally:
            # also when the shutdown failed or was cancelled (an event loop closing under a kill nobody awaits
            # any more): a context left to garbage collection is terminated there, and that blocks for good
            # while a socket of it is open (a test worker hung so in Context.__del__ -> term())
            self._close_contexts(self.km, self.kc)
        self.output.close()
        for close in self.closers:
            await close()
        await asyncio.to_thread(self._cleanup)

    @staticmethod
    def _close_contexts(*owners: Any) -> None:
        """Close the ZMQ contexts that the manager and the client made for themselves, with their sockets."""
        for owner in owners:
            if owner is not None and owner._created_context and not owner.context.closed:
                owner.context.destroy(linger=0)

    def _cleanup(self) -> None:
        _limits.cleanup(self.kid)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if self.workspace is not None:
            workspace, self.workspace = self.workspace, None
            workspace.destroy()
        if self.state is not None:
            state, self.state = self.state, None
            shutil.rmtree(state, ignore_errors=True)
        if self.registry is not None:
            self.registry.remove(self.kid)


async def start_process(spec: KernelSpec, *, launcher: str, env: dict[str, str], run_dir: Path, workdir: Path,
                        workspace: Workspace | None = None, limits: Limits | None, registry: Any,
                        startup_timeout: float, owner: tuple[int, int] | None = None, supervise: bool = False,
                        signal_codes: bool = False, closers: list[Callable[[], Awaitable[None]]] | None = None,
                        held: dict[str, Any] | None = None, max_message: int = MAX_MESSAGE,
                        processes_by: str = "", state: Path | None = None) -> ProcessKernel:
    """Start a kernel from `spec` in `run_dir` and wait until it is ready; `closers` run when it is killed.

    From the call on, the kernel owns `run_dir` (and `workspace`, a pooled kernel's own, at `workdir`, and its `state`):
    a start that fails removes them, and raises RuntimeError with the kernel's last words. Its
    iopub messages over `max_message` bytes are refused (`channel.IOPub`). `processes_by` says how the kernel's
    processes are counted when no cgroup does it (limits.apply).
    """
    t0 = time.perf_counter()
    kid = uuid.uuid4().hex[:12]
    report = run_dir / "limits.json"
    km = HandsKernelManager(kernel_name="workbench", kernel_spec_manager=_OneSpec(spec), transport="ipc")
    km.connection_file, km.ip = str(run_dir / "kernel.json"), str(run_dir / "kernel-ipc")
    km.output, km.owner, km.supervised, km.signal_codes = OutputTail(), owner, supervise, signal_codes
    km.wrap = lambda argv: launch.command(argv, parent=os.getpid(), supervise=supervise, limits=limits, cgroup=kid,
                                          report=str(report), processes_by=processes_by)
    kernel = ProcessKernel(km, launcher=launcher, kid=kid, run_dir=run_dir, workdir=workdir, workspace=workspace,
                           registry=registry, closers=list(closers or []), held=dict(held or {}), state=state)
    try:
        # history in memory until the kernel serves a session, which moves it to the session's state directory
        # (launching/state.py): no sqlite file in HOME, none shared between sessions
        await km.start_kernel(env=env, cwd=str(workdir), extra_arguments=["--HistoryManager.hist_file=:memory:"])
        if registry is not None and kernel.pid:
            registry.add(kid, kernel.pid, run_dir=str(run_dir), cgroup=kid, launcher=launcher)
        km.client_factory = HandsKernelClient
        kc = km.client()
        assert isinstance(kc, HandsKernelClient)
        kernel.kc, kc.max_message = kc, max_message
        # no heartbeat channel: death is the process's exit (death()), and stopping a heartbeat thread blocks
        # the event loop for up to a second (it joins a thread that polls in 1 s steps), on the path of recovery
        kc.start_channels(hb=False)
        await kc.wait_for_ready(timeout=startup_timeout)
        kernel.iopub = IOPub(kc, max_message)
    except Exception as e:
        await asyncio.shield(kernel.kill())
        last = kernel.output.last_line()
        raise RuntimeError(f"{e}" + (f"; its last output: {last}" if last else "")) from e
    except BaseException:
        await asyncio.shield(kernel.kill())
        raise
    try:
        kernel.limits = json.loads(report.read_text()) if report.exists() else {}
    except ValueError:
        kernel.limits = {}
    kernel.boot_ms = round((time.perf_counter() - t0) * 1000, 1)
    return kernel


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)
