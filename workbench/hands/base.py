"""The protocols of the hands, in one place, and the Observation they return.

    Hands     what the brain calls: execute(code, timeout) -> Observation, restart,
              interrupt, shutdown, status. One implementation runs kernels
              (kernel.KernelHands); preflight.RefusedHands runs nothing.
    Launcher  how kernels of one kind start: local, sandbox, gateway (and whatever comes
              next). The hands, the pool and the factory call only its four methods.
    Kernel    one started, ready kernel: the channel the one execute loop talks through,
              over ZMQ (process.ProcessKernel) or a gateway's websocket (gateway.GatewayKernel).

Hands run the model's code somewhere else (a kernel) and report what
happened as an Observation. Failures of the hands (a traceback, a timeout,
a dead kernel) are observations for the model, never exceptions in the brain.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .render import blocks

# A sink for hands events (`hands_started`, `hands_died`, ...): the brain
# passes one in so that hands never import the log or the brain.
EventSink = Callable[[str, dict[str, Any]], Awaitable[None]]



@dataclass
class Observation:
    """What one code execution produced: its outputs in order, as a notebook shows them (see fold.py).

    `outputs` is the record (nbformat-like dicts, every MIME bundle kept within the budget);
    `stdout`, `stderr` and `result` are its text by kind, for a quick look; `error` the call's error.
    """

    stdout: str = ""
    stderr: str = ""
    result: str | None = None  # text/plain of the execute result(s), one per line
    outputs: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None  # {ename, evalue, traceback}
    truncated: list[str] = field(default_factory=list)  # notes on what was cut
    generation: int | None = None
    duration_ms: float | None = None
    notes: list[str] = field(default_factory=list)  # e.g. what was replayed
    # what the model reads of it (content_blocks): characters of text in all, images (None: not bounded); not stored
    text_limit: int | None = None
    max_images: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def displays(self) -> list[dict[str, Any]]:
        """The MIME bundles of the call's displays (not its results), in order."""
        return [o["data"] for o in self.outputs if o.get("output_type") == "display_data" and isinstance(o.get("data"), dict)]

    def to_json(self) -> dict[str, Any]:
        return {
            "outputs": self.outputs,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "result": self.result,
            "error": self.error,
            "truncated": self.truncated,
            "generation": self.generation,
            "duration_ms": self.duration_ms,
            "notes": self.notes,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Observation:
        """An observation as stored; one stored before `outputs` existed gets them from its fields."""
        fields: dict[str, Any] = {k: d.get(k) for k in cls.__dataclass_fields__ if k in d}
        obs = cls(**fields)
        if "outputs" not in d:
            obs.outputs = [*({"output_type": "stream", "name": n, "text": t} for n, t in
                             (("stdout", obs.stdout), ("stderr", obs.stderr)) if t),
                           *({"output_type": "display_data", "data": b} for b in d.get("displays") or []),
                           *([{"output_type": "execute_result", "data": {"text/plain": obs.result}}] if obs.result else [])]
        return obs

    def all_outputs(self) -> list[dict[str, Any]]:
        """The outputs, with the error last if it is not among them (a death, a timeout, a refusal)."""
        outputs = list(self.outputs)
        if not outputs and (self.stdout or self.stderr):  # a failure that kept the text of what ran
            outputs = [{"output_type": "stream", "name": n, "text": t} for n, t in
                       (("stdout", self.stdout), ("stderr", self.stderr)) if t]
        if self.error and not any(o.get("output_type") == "error" for o in outputs):
            outputs.append({"output_type": "error", **self.error})
        return outputs

    def content_blocks(self) -> list[dict[str, Any]]:
        """tool_result content: text and image blocks in the order of the outputs, within the observation's
        text_limit and max_images (see render.py)."""
        return blocks(self.all_outputs(), self.notes, self.truncated, self.text_limit, self.max_images)

    def text(self) -> str:
        """The observation as plain text (its text blocks; images as a mark)."""
        return "\n".join(b["text"] if b["type"] == "text" else f"[image: {b['source']['media_type']}]"
                         for b in self.content_blocks())


def failure(message: str, ename: str = "HandsError", **kw: Any) -> Observation:
    """An observation that carries only an error message."""
    return Observation(error={"ename": ename, "evalue": message, "traceback": [f"{ename}: {message}"]}, **kw)


@runtime_checkable
class Hands(Protocol):
    """Where the model's code runs. One main verb: execute."""

    async def execute(self, code: str, timeout: float | None = None,
                      on_output: Callable[[str, str], None] | None = None) -> Observation:
        """Run code; a dead kernel or a timeout is an Observation with `error` set.

        `on_output(kind, text)`, if given, hears the output while the call runs (hands/live.py)."""
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


@dataclass
class Dropped:
    """What a kernel's channel threw away instead of delivering (too big, malformed, lost): a note for the model."""

    note: str


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
