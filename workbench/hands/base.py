"""The protocols of the hands, in one place (the Observation they return is observing's).

    Hands     what the brain calls: execute(code, timeout) -> Observation, restart,
              interrupt, shutdown, status; and what the workspace module needs: the
              session's workspace and its owner, and the kernel frozen while it is
              copied. One implementation runs kernels (kernel.KernelHands);
              isolating.RefusedHands runs nothing. Both subclass it, so mypy checks them.
    Launcher  how kernels of one kind start: local, sandbox, gateway (and whatever comes
              next). The hands, the pool and the factory call only its four methods.
    Kernel    one started, ready kernel: the channel the one execute loop talks through,
              over ZMQ (launching.ProcessKernel) or a gateway's websocket (launching.GatewayKernel).

Hands run the model's code somewhere else (a kernel) and report what
happened as an Observation (observing/observation.py). Failures of the hands (a traceback, a timeout,
a dead kernel) are observations for the model, never exceptions in the brain.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .observing import Observation

MEMORY = ":memory:"  # IPython's name for a history kept in the kernel's memory only

# A sink for hands events (`hands_started`, `hands_died`, ...): the brain
# passes one in so that hands never import the log or the brain.
EventSink = Callable[[str, dict[str, Any]], Awaitable[None]]


@runtime_checkable
class Hands(Protocol):
    """Where the model's code runs. One main verb: execute."""

    async def execute(self, code: str, timeout: float | None = None,
                      on_output: Callable[[str, str], None] | None = None) -> Observation:
        """Run code; a dead kernel or a timeout is an Observation with `error` set.

        `on_output(kind, text)`, if given, hears the output while the call runs (observing/live.py)."""
        ...

    async def restart(self) -> None:
        """Replace the kernel with a fresh one."""
        ...

    async def interrupt(self) -> None:
        """Interrupt the running call, if any."""
        ...

    async def close(self, reason: str = "closed", *, if_idle: float | None = None) -> bool:
        """Stop the kernel (and its spare) but keep the session's workspace; the next execute starts again.
        With `if_idle`, only if no call came for that many seconds. Returns whether anything was stopped."""
        ...

    async def shutdown(self) -> None:
        """Stop the kernel; the hands may be started again by the next execute."""
        ...

    def status(self) -> dict[str, Any]:
        """A JSON-ready status: state, generation, kernel pid, ..."""
        ...

    async def workspace(self, create: bool = False) -> Path | None:
        """The session's workspace directory on this machine (made now if `create`); None while there is none.
        Raises files.NoWorkspace when its kernels' files are not on this machine (a gateway's, refused hands)."""
        ...

    def workspace_owner(self) -> tuple[int, int] | None:
        """The uid:gid the workspace's files are for when not this process's (the session's sandbox uid)."""
        ...

    def frozen(self) -> AbstractAsyncContextManager[list[str]]:
        """Every process of the session's kernel stopped for the block, so that its workspace holds still while it
        is copied (no call runs meanwhile), then let go on with its state intact; yields notes on what was not
        stopped. Without a kernel there is nothing to stop."""
        ...


@dataclass
class Death:
    """How a kernel ended: words for the model and `hands_died`, and the exit status when known."""

    how: str  # e.g. "signal SIGKILL", "the gateway closed the websocket"
    exit_code: int | None = None  # negative: killed by that signal
    signal: int | None = None


class Workspace(Protocol):
    """A working directory the hands made for a session (or a pooled kernel): where, how it is limited, how it goes."""

    how: str  # for hands_started.limits: its size limit, or why it has none

    @property
    def path(self) -> Path: ...

    @property
    def owner(self) -> tuple[int, int] | None:
        """The uid:gid its files are for when not this process's (a root server's sandbox); else None."""
        ...

    def destroy(self) -> None:
        """Remove it and everything in it; safe to call twice."""
        ...


@dataclass
class Place:
    """What a session asks of every kernel its hands start (a pool kernel has none until adopted)."""

    workdir: Path | None = None  # the session's own (config.workdir), or its workspace's path once one is made
    env: dict[str, str] = field(default_factory=dict)  # extra environment variables for the kernel
    startup_timeout: float = 60.0
    egress: dict[str, Any] | None = None  # the session's egress config (a sandbox's proxy policy)
    sink: EventSink | None = None  # the session's event sink, for what a launcher reports (egress events)
    session: str = ""  # the session's id, to name what is made for it
    keep: Path | None = None  # where its workspace is kept across its hands and hosts (config.keep_dir; evals)
    # the workspace a launcher made (or a pooled kernel brought) for the session: kept across its
    # kernels, destroyed when its hands shut down; None while there is none, or with a workdir of its own
    workspace: Workspace | None = None
    held: dict[str, Any] = field(default_factory=dict)  # what a launcher keeps per session across kernels
    # the hands' own files for the session on this machine, beside its workspace and never in it (IPython's
    # history): made with its first kernel, kept across its kernels, removed with its workspace; None while there
    # is none, or where the kernels' files are not on this machine (a gateway's)
    state: Path | None = None
    history: str = MEMORY  # where its kernels keep IPython's history, as a kernel names it: a file in `state`
    python: str = ""  # the interpreter its kernels run on (config.hands.python, resolved); "": the launcher's


@dataclass
class Dropped:
    """What a kernel's channel threw away instead of delivering (too big, malformed, lost): a note for the model."""

    note: str


# seconds from a call's execute_reply to taking that reply as its end when its idle status does not come
IDLE_AFTER_REPLY = 2.0
# the note of a call whose idle status never came, though nothing was seen lost: ZMQ's PUB socket drops, silently,
# what a reader that fell behind has not taken in (a flood of output on a loaded machine)
IDLE_NEVER_CAME = Dropped("[the kernel's end-of-call status never arrived (ZMQ drops messages a busy reader does not "
                          "take in time), so the call's reply was taken as its end: output sent just before may be "
                          "missing]")


@runtime_checkable
class Kernel(Protocol):
    """One started, ready kernel: the channel the execute loop talks through."""

    launcher: str  # the launcher's name, for `hands_started`
    boot_ms: float  # how long it took to become ready
    limits: dict[str, str]  # how each resource limit is enforced
    output: Any  # an output.OutputTail of what the kernel process wrote to its fds 1 and 2, or None (gateway)

    @property
    def ident(self) -> dict[str, Any]:
        """How events and status name it: {"pid": ...} (and "kernel_id" on a gateway)."""
        ...

    def execute(self, code: str, *, silent: bool = False) -> str:
        """Send an execute request; returns its msg_id."""
        ...

    async def message(self, msg_id: str, timeout: float) -> tuple[str, dict[str, Any]] | Dropped | None:
        """The next iopub (msg_type, content) of request `msg_id`, or what was dropped instead of one;
        None if none came in `timeout` or the kernel is gone. `content` is a dict; nothing else is checked."""
        ...

    async def reply(self, msg_id: str, timeout: float) -> dict[str, Any]:
        """The content of the shell reply to `msg_id`; raises TimeoutError, or RuntimeError if the kernel went away."""
        ...

    async def death(self) -> Death | None:
        """How the kernel ended, or None while it lives."""
        ...

    async def interrupt(self) -> None:
        """Interrupt the running cell; a kernel that is gone is left for death() to report."""
        ...

    async def freeze(self) -> list[str]:
        """Stop every process of the kernel (its code, and what that code left running) until `thaw`, so
        that nothing changes its workspace meanwhile; returns notes on what could not be stopped."""
        ...

    async def thaw(self) -> None:
        """Let what `freeze` stopped go on, its state intact."""
        ...

    async def kill(self) -> None:
        """Stop the kernel now and free everything it held; safe to call twice."""
        ...


@runtime_checkable
class Launcher(Protocol):
    """How kernels of one kind start (local, sandbox, gateway); shared by a host's sessions."""

    name: str  # in every `hands_started` (local, sandbox, unsafe-local, gateway)
    python: str  # the interpreter its kernels run on, named in hints ("": not on this machine, a gateway's)

    async def start(self, place: Place | None) -> Kernel:
        """Start a kernel for `place` (None: for the warm pool) and wait until it is ready.

        A place without a workdir gets its workspace here: the launcher makes it and records it
        in the place (`workdir`, `workspace`), so the session's later kernels start in it too.
        """
        ...

    def fits(self, place: Place) -> bool:
        """Whether a pooled kernel can be made to serve `place` (if not, the hands start their own)."""
        ...

    async def adopt(self, kernel: Kernel, place: Place) -> str:
        """Make a pooled kernel serve `place` (a place without a workdir takes the kernel's workspace);
        returns code the hands run in it (may be empty)."""
        ...

    async def make_workspace(self, place: Place) -> None:
        """Make the session's workspace before its first kernel, so files can be put in before any code
        runs; raises `NoWorkspace` when its kernels' files are not on this machine (a gateway's)."""
        ...

    def owner(self, place: Place) -> tuple[int, int] | None:
        """The uid:gid the files of `place`'s workspace are for when not this process's (a root host's sandbox)."""
        ...

    async def release(self, place: Place) -> None:
        """Give back what the launcher held for the session beyond its kernels and workspace (after both are gone)."""
        ...

    async def aclose(self) -> None:
        """Free what the launcher holds for all its kernels (after they are stopped)."""
        ...
