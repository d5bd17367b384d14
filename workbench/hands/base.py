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

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from . import clean

# A sink for hands events (`hands_started`, `hands_died`, ...): the brain
# passes one in so that hands never import the log or the brain.
EventSink = Callable[[str, dict[str, Any]], Awaitable[None]]

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


@dataclass
class Observation:
    """What one code execution produced, in the shape the model will see."""

    stdout: str = ""
    stderr: str = ""
    result: str | None = None  # text/plain of the execute_result
    displays: list[dict[str, Any]] = field(default_factory=list)  # mime bundles
    error: dict[str, Any] | None = None  # {ename, evalue, traceback}
    truncated: list[str] = field(default_factory=list)  # notes on what was cut
    generation: int | None = None
    duration_ms: float | None = None
    notes: list[str] = field(default_factory=list)  # e.g. what was replayed

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        return {
            "stdout": self.stdout,
            "stderr": self.stderr,
            "result": self.result,
            "displays": self.displays,
            "error": self.error,
            "truncated": self.truncated,
            "generation": self.generation,
            "duration_ms": self.duration_ms,
            "notes": self.notes,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Observation:
        fields: dict[str, Any] = {k: d.get(k) for k in cls.__dataclass_fields__ if k in d}
        return cls(**fields)

    def text(self) -> str:
        """The observation as plain text for the model."""
        parts = list(self.notes)
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append("[stderr]\n" + self.stderr.rstrip("\n"))
        for d in self.displays:
            if not any(t in d for t in IMAGE_TYPES) and "text/plain" in d:
                parts.append(d["text/plain"])
        if self.result is not None:
            parts.append(self.result)
        if self.error:
            tb = "\n".join(ANSI.sub("", line) for line in self.error.get("traceback") or [])
            parts.append(tb or f"{self.error.get('ename')}: {self.error.get('evalue')}")
        parts.extend(self.truncated)
        return "\n".join(parts) if parts else "(no output)"

    def content_blocks(self) -> list[dict[str, Any]]:
        """tool_result content: one text block, then each image as an image block."""
        blocks: list[dict[str, Any]] = [{"type": "text", "text": self.text()}]
        for d in self.displays:
            for mime in IMAGE_TYPES:
                if mime in d:
                    data = d[mime]
                    blocks.append(
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": mime, "data": data.strip()},
                        }
                    )
                    break
        return blocks


def failure(message: str, ename: str = "HandsError", **kw: Any) -> Observation:
    """An observation that carries only an error message."""
    return Observation(error={"ename": ename, "evalue": message, "traceback": [f"{ename}: {message}"]}, **kw)


@runtime_checkable
class Hands(Protocol):
    """Where the model's code runs. One main verb: execute."""

    async def execute(self, code: str, timeout: float | None = None) -> Observation:
        """Run code; a dead kernel or a timeout is an Observation with `error` set."""
        ...

    async def restart(self) -> None:
        """Replace the kernel with a fresh one."""
        ...

    async def interrupt(self) -> None:
        """Interrupt the running call, if any."""
        ...

    async def shutdown(self) -> None:
        """Stop the kernel; the hands may be started again by the next execute."""
        ...

    def status(self) -> dict[str, Any]:
        """A JSON-ready status: state, generation, kernel pid, ..."""
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

    async def aclose(self) -> None:
        """Free what the launcher holds for all its kernels (after they are stopped)."""
        ...


class OutputCap:
    """Keeps at most `limit` characters of one stream and remembers what it dropped."""

    def __init__(self, name: str, limit: int):
        self.name, self.limit = name, limit
        self.parts: list[str] = []
        self.kept = 0
        self.dropped = 0

    def add(self, text: str) -> None:
        room = self.limit - self.kept
        if room > 0:
            piece = text[:room]
            self.parts.append(clean.text(piece))  # what a kernel sends may hold lone surrogates
            self.kept += len(piece)
            self.dropped += len(text) - len(piece)
        else:
            self.dropped += len(text)

    def value(self) -> str:
        return "".join(self.parts)

    def note(self) -> str | None:
        if not self.dropped:
            return None
        return (
            f"[{self.name} truncated: showed the first {self.kept:,} characters, "
            f"dropped {self.dropped:,} more; write large output to a file and read parts of it]"
        )
