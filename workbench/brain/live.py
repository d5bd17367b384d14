"""Live output of running tool calls: a channel beside the log, never written to it.

While a call runs, its hands hand each piece of output to the call's sink (`LiveOutput.begin`).
Pieces are coalesced: listeners hear at most one message per `INTERVAL` per call, plus a
heartbeat every `HEARTBEAT` seconds while nothing is printed (with the elapsed time and the
hands' state), and one `done` message when the call ends, just before its `tool_result` is
committed. The committed tool result stays the single record of what the call printed.

Everything is bounded, whatever the call prints: a message carries at most `MAX_OUTPUT_MESSAGE_CHARS`
characters (the latest ones: a flood shows its most recent output, with a count of what was
skipped), a call sends at most `MAX_OUTPUT_CALL_CHARS` characters live (then only counts), and each call
keeps its latest `MAX_OUTPUT_KEPT_CHARS` characters for a watcher who arrives mid-call (`snapshots`).

A message (the `output` kind of the websocket, docs/api.md):
    {"tool_use_id", "name", "n", "text", "skipped", "elapsed_s", "started_at", "state", "hands", "snapshot"}
`n` numbers a call's messages from 1; `skipped` counts the characters of output left out just
before `text`; `state` is "running" or "done"; `hands` is the hands' state ("busy" while the call
runs); a snapshot's `text` is the call's output so far (its latest `MAX_OUTPUT_KEPT_CHARS` characters) and
`skipped` everything before it, up to and including message `n`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("workbench.brain")

INTERVAL = 0.1  # seconds: at most one message per call this often
HEARTBEAT = 1.0  # seconds: a message at least this often while a call runs, printed or not
MAX_OUTPUT_MESSAGE_CHARS = 16_384  # characters of output in one message (the latest of an interval)
MAX_OUTPUT_CALL_CHARS = 2_000_000  # characters of output a call sends live; then messages carry counts only
MAX_OUTPUT_KEPT_CHARS = 65_536  # characters of a running call's latest output kept for a watcher who connects mid-call

# (session_id, message): on the event loop, must not block
OutputListener = Callable[[str, dict[str, Any]], None]


class LiveCall:
    """One running call's live output: what is pending, what was sent, its latest output."""

    def __init__(self, owner: LiveOutput, session_id: str, tool_use_id: str, name: str, state: Callable[[], str]):
        self.owner, self.session_id, self.tool_use_id, self.name, self.state = owner, session_id, tool_use_id, name, state
        self.t0, self.started_at = time.monotonic(), time.time()
        self.pending = ""  # output since the last message (its latest MAX_OUTPUT_MESSAGE_CHARS characters)
        self.skipped = 0  # characters dropped since the last message
        self.sent = 0  # characters sent live so far
        self.kept = ""  # the latest MAX_OUTPUT_KEPT_CHARS characters of the call's output, as of message n
        self.total = 0  # characters of output seen, as of message n
        self.n = 0
        self.last = self.t0  # when the last message went
        self.tick = self.t0  # when the timer last looked at what is pending
        self.timer: asyncio.TimerHandle | None = None
        self.ended = False
        self._loop = asyncio.get_running_loop()
        self.beat: asyncio.TimerHandle | None = self._loop.call_later(HEARTBEAT, self._heartbeat)

    def write(self, kind: str, text: str) -> None:
        """One piece of output (the hands' sink); coalesced into the next message."""
        if self.ended or not text:
            return
        joined = self.pending + text
        if len(joined) > MAX_OUTPUT_MESSAGE_CHARS:
            self.skipped += len(joined) - MAX_OUTPUT_MESSAGE_CHARS
            joined = joined[-MAX_OUTPUT_MESSAGE_CHARS:]
        self.pending = joined
        if self.timer is None:
            self.timer = self._loop.call_later(max(0.0, self.tick + INTERVAL - time.monotonic()), self.flush)

    def flush(self, state: str = "running", whole: bool = False) -> None:
        """Send what is pending as one message. A running call's timer sends whole lines only (a secret
        split over two messages would escape redaction); a heartbeat and `done` send everything, and
        send a message even with nothing pending (the elapsed time, the hands' state)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.tick = time.monotonic()
        whole = whole or state != "running"
        cut = len(self.pending) if whole else self.pending.rfind("\n") + 1
        if not cut and not whole:
            return  # a partial line: it goes with the next line, or the next heartbeat
        text, skipped = self.pending[:cut], self.skipped
        self.pending, self.skipped = self.pending[cut:], 0
        if text and self.owner.redact is not None:
            text = self.owner.redact(text)
        self.total += skipped + len(text)
        self.kept = (self.kept + text)[-MAX_OUTPUT_KEPT_CHARS:] if not skipped else text[-MAX_OUTPUT_KEPT_CHARS:]
        if self.sent + len(text) > MAX_OUTPUT_CALL_CHARS:  # over the call's live budget: counts only from here
            room = max(0, MAX_OUTPUT_CALL_CHARS - self.sent)
            skipped += len(text) - room
            text = text[len(text) - room:] if room else ""
        self.sent += len(text)
        self.n += 1
        self.last = time.monotonic()
        self.owner.emit(self.session_id, self.message(text, skipped, state))

    def message(self, text: str, skipped: int, state: str, snapshot: bool = False) -> dict[str, Any]:
        try:
            hands = self.state()
        except Exception:  # the state is a nicety; never fail a message for it
            hands = "unknown"
        return {"tool_use_id": self.tool_use_id, "name": self.name, "n": self.n, "text": text, "skipped": skipped,
                "elapsed_s": round(time.monotonic() - self.t0, 3), "started_at": self.started_at, "state": state,
                "hands": hands, "snapshot": snapshot, "live_limit": MAX_OUTPUT_CALL_CHARS, "over_limit": self.sent >= MAX_OUTPUT_CALL_CHARS}

    def snapshot(self) -> dict[str, Any]:
        """The output so far (as of message n), for a watcher who arrives now."""
        return self.message(self.kept, self.total - len(self.kept), "running", snapshot=True)

    def _heartbeat(self) -> None:
        self.beat = None
        if self.ended:
            return
        if self.timer is None and time.monotonic() - self.last >= HEARTBEAT * 0.9:
            self.flush(whole=True)
        self.beat = self._loop.call_later(HEARTBEAT, self._heartbeat)

    def end(self) -> None:
        """The call ended: send what is pending and a `done` message; stop the timers."""
        if self.ended:
            return
        self.flush("done")
        self.ended = True
        if self.beat is not None:
            self.beat.cancel()
            self.beat = None


class LiveOutput:
    """Every running call's live output, and who listens to it."""

    def __init__(self, redact: Callable[[str], str] | None = None) -> None:
        self.redact = redact  # masks secrets in what is sent, as in the committed result
        self._listeners: list[OutputListener] = []
        self._calls: dict[str, dict[str, LiveCall]] = {}  # session id -> tool_use_id -> its call

    def listen(self, fn: OutputListener) -> Callable[[], None]:
        """Hear every live output message of every session; returns an unlisten."""
        self._listeners.append(fn)
        return lambda: self._listeners.remove(fn) if fn in self._listeners else None

    def begin(self, session_id: str, tool_use_id: str, name: str, state: Callable[[], str]) -> LiveCall:
        """A call starts: its LiveCall, whose `write` is the hands' sink; `end` it when the call ends."""
        call = LiveCall(self, session_id, tool_use_id, name, state)
        self._calls.setdefault(session_id, {})[tool_use_id] = call
        return call

    def end(self, call: LiveCall) -> None:
        call.end()
        calls = self._calls.get(call.session_id, {})
        if calls.get(call.tool_use_id) is call:
            del calls[call.tool_use_id]
            if not calls:
                del self._calls[call.session_id]

    def snapshots(self, session_id: str) -> list[dict[str, Any]]:
        """The output so far of each of the session's running calls (a snapshot message each)."""
        return [c.snapshot() for c in self._calls.get(session_id, {}).values()]

    def emit(self, session_id: str, message: dict[str, Any]) -> None:
        for fn in list(self._listeners):
            try:
                fn(session_id, message)
            except Exception:  # one broken listener must not starve the others, or fail the call
                log.exception("workbench: a live output listener failed")


__all__ = [
    "HEARTBEAT", "INTERVAL", "MAX_OUTPUT_CALL_CHARS", "MAX_OUTPUT_KEPT_CHARS", "MAX_OUTPUT_MESSAGE_CHARS", "LiveCall", "LiveOutput",
    "OutputListener",
]
