"""What one session's egress may cost the server: silence it may hold, denials it may log.

Kernel code controls how many connections it opens and how many requests it
sends, so every cost it can make the server pay is capped: connections at
once (counted by the proxy), seconds of silence on a connection (`Silence`),
and `egress_denied` events per second (`DenialLog`: a token bucket; the
denials it does not write are counted into the next event it writes).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

EventSink = Callable[[str, dict[str, Any]], Awaitable[None]]
log = logging.getLogger("workbench.egress")


class DenialLog:
    """Writes at most `per_second` `egress_denied` events a second (bursts of as many); counts the rest.

    Each event's `suppressed` says how many denials before it were not written,
    so the number of denials is always the number of events plus the sum of
    their `suppressed`. Denials held back are written, as one event, as soon
    as the bucket allows, so a flood that stops is still accounted for.
    """

    def __init__(self, emit: EventSink, per_second: int):
        self.emit, self.rate = emit, float(per_second)
        self.tokens, self.stamp = self.rate, 0.0
        self.denied = 0  # every denial, written or not
        self.pending = 0  # denials since the last event written
        self.last: dict[str, Any] | None = None  # the latest of them, written when the bucket allows
        self._later: asyncio.Task | None = None

    async def deny(self, payload: dict[str, Any]) -> None:
        """Count a denial; write it now if the bucket has room, else later with the others held back."""
        self.denied += 1
        if self._take():
            held, self.pending = self.pending, 0
            await self.emit("egress_denied", {**payload, "suppressed": held})
            return
        self.pending += 1
        self.last = payload
        if self._later is None:
            self._later = asyncio.get_running_loop().create_task(self._write_later((1 - self.tokens) / self.rate))

    async def flush(self) -> None:
        """Write the denials held back now (when the session's egress closes)."""
        if self._later is not None:
            self._later.cancel()
            self._later = None
        await self._write_held()

    def _take(self) -> bool:
        now = asyncio.get_running_loop().time()
        self.tokens = min(self.rate, self.tokens + (now - self.stamp) * self.rate) if self.stamp else self.tokens
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False

    async def _write_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self._later = None
        if not self.pending:  # a denial written since then carried the count
            return
        self._take()  # spend the token this write uses
        held = self.pending
        try:
            await self._write_held()
        except Exception:  # nobody awaits this task: say what was lost rather than drop it
            log.exception("could not write %d held-back egress denials to the log", held)

    async def _write_held(self) -> None:
        if self.pending and self.last is not None:
            held, last, self.pending, self.last = self.pending, self.last, 0, None
            await self.emit("egress_denied", {**last, "suppressed": held - 1})


class Silence:
    """`async with Silence(s) as watch:` raises TimeoutError once no byte has moved for `s` seconds.

    The connection calls `touch()` whenever bytes move (either way); one timer
    per connection checks the time of the last touch, so moving bytes costs a
    clock read, not a timer.
    """

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.answered = False  # a response head went to the client: a timeout can no longer answer it
        self._timeout = asyncio.timeout(None)

    async def __aenter__(self) -> Silence:
        self._loop = asyncio.get_running_loop()
        await self._timeout.__aenter__()
        self.touch()
        self._check = self._loop.call_at(self.last + self.seconds, self._expire)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._check.cancel()
        await self._timeout.__aexit__(*exc)  # never suppresses: it raises TimeoutError when the silence ran out

    def touch(self) -> None:
        """Bytes moved: the silence starts again."""
        self.last = self._loop.time()

    def _expire(self) -> None:
        due = self.last + self.seconds
        if self._loop.time() >= due:
            self._timeout.reschedule(self._loop.time())
        else:
            self._check = self._loop.call_at(due, self._expire)
