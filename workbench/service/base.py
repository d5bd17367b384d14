"""The one service: every operation a face offers (the CLI, the notebook client, the server's handlers),
as one interface with two transports.

    faces        cli/ (a local host, or the server holding the file)   client/ (connect())   server/ handlers
                        │                                                   │                    │
    interface    Workbench (this module): one async method per operation ───┴────────────────────┘
                        │                                          │
    transports   Local (local.py): over a Host, in-process     Rest (rest.py): over the REST API and the websocket

A face is written once against `Workbench`; which transport it holds is the only difference between
a command run on the database file and the same command run through the server that holds it. A
plugin joins with operations of its own (`Workbench.part`): an interface, an in-process
implementation over the plugin and a REST one (workbench.plugins.ServicePart).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, BinaryIO, Literal, Protocol, TypeVar

from ..log.events import Event

T = TypeVar("T")


@dataclass(frozen=True)
class Message:
    """One message of a session's stream: a committed event, a live model delta, or a running call's output."""

    kind: Literal["event", "delta", "output"]
    session_id: str
    event: Event | None = None  # kind "event"
    data: Mapping[str, Any] | None = None  # "delta": the model's stream event; "output": the live output (brain/live.py)

    def to_json(self) -> dict[str, Any]:
        """The message as the session websocket sends it (docs/api.md)."""
        if self.kind == "event":
            assert self.event is not None, "an event message carries its event"
            return {"kind": "event", "event": self.event.to_json()}
        if self.kind == "delta":
            return {"kind": "delta", "session_id": self.session_id, "event": dict(self.data or {})}
        return {"kind": "output", "session_id": self.session_id, **(self.data or {})}

    @classmethod
    def from_json(cls, msg: Mapping[str, Any], session_id: str) -> Message | None:
        """A websocket message as a Message; None for a kind this version does not know."""
        kind = msg.get("kind")
        if kind == "event":
            return cls("event", session_id, event=event_of(msg["event"]))
        if kind == "delta":
            return cls("delta", msg.get("session_id") or session_id, data=msg["event"])
        if kind == "output":
            return cls("output", msg.get("session_id") or session_id,
                       data={k: v for k, v in msg.items() if k not in ("kind", "session_id")})
        return None


def event_of(e: Mapping[str, Any]) -> Event:
    """An event of the API (`Event.to_json()`) as an Event."""
    return Event(e["session_id"], e["seq"], datetime.fromisoformat(e["ts"]), e["type"], e["payload"])


Watch = Callable[[Message], None]  # hears a turn as it happens (called on the service's event loop)


class Workbench(Protocol):
    """Every operation of the workbench, whichever process holds the session log.

    Results are what the REST API answers (docs/api.md), except that events are `Event`s. Errors are the
    workbench's own (UnknownSession, ConfigError, TurnBusy, ...); over REST they come as RequestRefused
    with the server's words, whose `as_local()` is the error the in-process transport raises.
    """

    # -- the host ------------------------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        """Version, database, hands and sandbox, default model, running turns, plugins."""
        ...

    async def models(self) -> dict[str, Any]:
        """{"models": the models a session may be created with (the default first), "default": its name}."""
        ...

    # -- sessions ------------------------------------------------------------------------------

    async def sessions(self, *, limit: int | None = None, cursor: str | None = None, **filters: Any) -> dict[str, Any]:
        """{"sessions": [...], "next": cursor or None}: a page (every match without `limit`); filters: kind,
        state, text, updated_after, updated_before, order, archived (None: every session)."""
        ...

    async def session(self, session_id: str) -> dict[str, Any]:
        """The session's row with `running`; UnknownSession."""
        ...

    async def create_session(self, *, id: str | None = None, title: str | None = None, model: str | None = None,
                             system: str | None = None, config: Mapping[str, Any] | None = None,
                             tools: Sequence[str] | None = None, first_message: str | None = None) -> dict[str, Any]:
        """A new session, checked whole before anything is written; its row. `first_message`: the message about
        to be sent (not sent), what its memories are ranked by."""
        ...

    async def events(self, session_id: str, after: int | None = None, limit: int | None = None) -> list[Event]:
        """The session's events after `after` (all of them unless `limit`)."""
        ...

    async def notebook(self, session_id: str) -> dict[str, Any]:
        """The session's code and outputs as a notebook (nbformat 4)."""
        ...

    async def usage(self, session_id: str) -> dict[str, Any]:
        """Tokens and estimated cost per turn and in total: {"session_id", "turns", "total", "priced"}."""
        ...

    async def rename(self, session_id: str, title: str) -> dict[str, Any]:
        """A new title (recorded as `session_renamed`); the row after."""
        ...

    async def archive(self, session_id: str, archived: bool = True) -> dict[str, Any]:
        """Archive the session (or bring it back); the row after."""
        ...

    async def delete(self, session_id: str) -> dict[str, Any]:
        """Delete the session's events for good (TurnBusy while it runs): {"deleted", "events"}."""
        ...

    async def fork(self, session_id: str, seq: int | None = None, *, new_id: str | None = None,
                   title: str | None = None) -> dict[str, Any]:
        """A new session starting with a copy of this one's log up to `seq` (cut back to a turn boundary); its row."""
        ...

    async def search(self, text: str, *, limit: int = 20, cursor: str | None = None, kind: str | None = None,
                     archived: bool | None = None) -> dict[str, Any]:
        """Sessions whose title or messages hold `text`: {"hits": [row + seq, type, snippet], "next"}."""
        ...

    async def query(self, sql: str, params: Sequence[Any] = ()) -> dict[str, Any]:
        """One read-only SQL statement against the log: {"columns", "rows", "truncated"}."""
        ...

    # -- turns ---------------------------------------------------------------------------------

    async def send(self, session_id: str, text: str, *, key: str | None = None,
                   attachments: Sequence[Mapping[str, Any]] | None = None) -> int:
        """Start a turn (it runs on without the caller); the seq of its committed user_message. `key`: the message's
        idempotency key (over REST a new one when None): sent again with it, it starts nothing and answers the
        first one's seq; another message with it is KeyReused. `attachments`: notebook context sent with the text
        (workbench/attachments.py; ConfigError when malformed)."""
        ...

    async def resume(self, session_id: str) -> bool:
        """Resume a cut-off turn in the background (a session a plugin resumes itself: as a whole); False: none."""
        ...

    async def interrupt(self, session_id: str) -> bool:
        """Interrupt the running turn; True if one was running."""
        ...

    async def run_turn(self, session_id: str, text: str, watch: Watch, *,
                       attachments: Sequence[Mapping[str, Any]] | None = None) -> str:
        """Run a turn and hear it to its end (`watch`); its stop reason. Cancelling the caller interrupts it.
        `attachments`: as for `send`."""
        ...

    async def resume_turn(self, session_id: str, watch: Watch) -> str | None:
        """Resume a cut-off turn and hear it to its end; its stop reason, None when there was nothing to resume."""
        ...

    def stream(self, session_id: str, after: int = 0,
               timeout: float | None = None) -> AbstractAsyncContextManager[AsyncIterator[Message]]:
        """The session's messages: every event after `after`, then each as it is committed, with live deltas and
        output, no gap and no duplicate; `timeout`: seconds a read may wait (None: no limit)."""
        ...

    # -- hands and the workspace ---------------------------------------------------------------

    async def hands(self, session_id: str) -> dict[str, Any]:
        """The session's hands: state, generation, pid, and whether a turn runs."""
        ...

    async def restart_hands(self, session_id: str) -> dict[str, Any]:
        """Replace the session's kernel with a fresh one; the new status."""
        ...

    async def close_hands(self, session_id: str) -> dict[str, Any]:
        """Stop the session's kernel (its workspace stays); the status with `closed`."""
        ...

    async def files(self, session_id: str) -> dict[str, Any]:
        """The workspace: {"files": [{"path", "type", "bytes", "mtime"}], "truncated", "workspace"}."""
        ...

    async def put_file(self, session_id: str, path: str, data: bytes | BinaryIO, *, name: str = "",
                       kind: str = "file") -> dict[str, Any]:
        """Write `data` to `path` in the workspace, recorded as `file_attached`; its record with its seq."""
        ...

    async def read_file(self, session_id: str, path: str, *, max_bytes: int | None = None) -> bytes:
        """A file of the workspace (refused over `max_bytes`, and over the server's max_download_mb)."""
        ...

    # -- plugins -------------------------------------------------------------------------------

    def part(self, name: str, kind: type[T]) -> T:
        """The operations plugin `name` adds, over this transport, checked to be a `kind`; PluginError when the
        plugin is not loaded or adds none."""
        ...


__all__ = ["Message", "Watch", "Workbench", "event_of"]
