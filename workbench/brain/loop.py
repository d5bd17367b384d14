"""The turn loop: one turn of a session, from its first event to its `turn_ended`.

A turn appends the user's message (or `resumed`), then steps: a model call streamed and
appended verbatim, its tool calls run and recorded (brain/calls.py), again until the model
ends the turn. Whatever stops it, a turn ends with `turn_ended`: an interrupt or a harness
failure closes it (`_close`, run to its end by `_to_the_end` even when cancelled again), and a
turn cut off by a dead process is finished by `_resume`. Which turn runs where, and who
started it, is the brain's (brain/brain.py, brain/turns.py); every write goes through the
session's view (brain/views.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from ..log.manage import auto_title, rename
from .calls import CUT_OFF_CALL, INTERRUPTED_CALL, Calls
from .models import FatalModelError, MessageBuilder, Model, RetryableError
from .request import tool_uses
from .views import Views

DeltaListener = Callable[[str, dict[str, Any]], None]


class Loop:
    """Runs turns: model calls and tool calls, every step appended to the log through the sessions' views."""

    def __init__(self, views: Views, calls: Calls, model: Callable[[str], Model], settings: Any):
        self.views, self.calls, self.model, self.settings = views, calls, model, settings
        self._listeners: list[DeltaListener] = []
        # per session: who cancelled its turn (a person, an eval run, a shutdown), read when the turn closes
        self.interrupted_by: dict[str, str] = {}

    def listen(self, fn: DeltaListener) -> Callable[[], None]:
        """Hear every live stream event (not logged) of every session."""
        self._listeners.append(fn)
        return lambda: self._listeners.remove(fn) if fn in self._listeners else None

    async def turn(self, session_id: str, text: str | None, started: asyncio.Future,
                   name_untitled: bool = False, key: str | None = None, close_by: str | None = None,
                   attachments: list[dict[str, Any]] | None = None) -> str | None:
        """A turn of the session: `text` the user's message (None: resume a cut-off turn; with `close_by`, only close
        it, as interrupted by `close_by`), `attachments` its notebook context; `started` hears its first event once
        committed (or why nothing was written); the stop reason."""
        title = auto_title(text) if name_untitled and text is not None else None

        def name(tx: Any) -> None:
            if title is not None:
                rename(tx, session_id, title, auto=True, only_untitled=True)

        try:
            if text is not None:  # the first model_request with it: the call starts once both are committed
                asked = await self._model_request(session_id, 1, (await self.views.folded(session_id)).size_with_message())
                message = {"text": text, **({"idempotency_key": key} if key is not None else {}),
                           **({"attachments": attachments} if attachments else {})}
                first, cut = await _written(self.views.append(session_id, "user_message", message, before=name, then=[asked]))
            else:
                first, cut = await _written(self.views.append(session_id, "resumed", {}))
        except BaseException as e:
            if isinstance(e, asyncio.CancelledError):  # before the first write: nothing was written
                started.cancel()
                raise
            started.set_exception(e)
            return None
        started.set_result(first)
        try:
            if cut:  # a cancel came while the first event was committed: the turn is open now, so it is closed
                raise asyncio.CancelledError
            if close_by is not None:
                return await self._close_cut_off(session_id, close_by)
            return await (self._loop(session_id, asked=True) if text is not None else self._resume(session_id))
        except asyncio.CancelledError:
            await _to_the_end(self._close(session_id, "interrupted", self.interrupted_by.pop(session_id, "user")))
            raise
        except Exception as e:  # a harness failure still ends the turn, then propagates (so does a close that fails)
            await _to_the_end(self._close(session_id, "error", f"{type(e).__name__}: {e}"))
            raise

    async def _loop(self, session_id: str, asked: bool = False) -> str:
        while True:
            if not asked:  # the step's model_request, committed with the results the model is about to read
                results_only = all(t == "tool_result" for t in self.views.held(session_id))
                # held results do not change the request's size; anything else held is written first
                conv = await (self.views.folded(session_id) if results_only else self.views.conversation(session_id))
                await self.views.append(session_id, *await self._model_request(session_id, 1, conv.request_size()))
            asked = False
            conv = await self.views.conversation(session_id)
            pauses = conv.state.pauses
            message = await self._call_model(session_id, conv.request())
            if message is None:
                return await self._end(session_id, "error")
            stop = message.get("stop_reason")
            await self.calls.run(session_id, tool_uses(message), run=stop == "tool_use")
            # pause_turn, and compaction when the API pauses after one: send the request again to go on
            if stop == "tool_use" or (stop in ("pause_turn", "compaction") and pauses < self.settings.max_pauses):
                continue
            return await self._end(session_id, stop or "unknown")

    async def _end(self, session_id: str, stop: str) -> str:
        await self.views.append(session_id, "turn_ended", {"stop_reason": stop})
        return stop

    async def _model_request(self, session_id: str, attempt: int, messages: int) -> tuple[str, dict[str, Any]]:
        """The `model_request` event of a call of the session's model with a request of `messages` messages."""
        conv = await self.views.folded(session_id)
        return "model_request", {"attempt": attempt, "model": self.model((conv.frozen or {})["model"]).name,
                                 "messages": messages}

    async def _call_model(self, session_id: str, request: dict[str, Any]) -> dict[str, Any] | None:
        """Stream one response, with retries; append it verbatim. None if it failed for good.
        The first attempt's model_request is committed already (see _loop)."""
        model = self.model(request["model"])
        s = self.settings
        append = self.views.append
        for attempt in range(1, s.max_retries + 2):
            if attempt > 1:
                await append(session_id, *await self._model_request(session_id, attempt, len(request["messages"])))
            t0, first = time.perf_counter(), None
            builder = MessageBuilder()
            try:
                async for ev in model.stream(request):
                    first = first or time.perf_counter()
                    builder.feed(ev)
                    for fn in list(self._listeners):
                        fn(session_id, ev)
                message = builder.result()
            except RetryableError as e:
                if attempt > s.max_retries:
                    await append(session_id, "model_error", {"error": str(e), "status": e.status, "attempts": attempt})
                    return None
                delay = e.retry_after or min(s.retry_cap, s.retry_base * 2 ** (attempt - 1))
                await append(session_id, "model_retry",
                             {"attempt": attempt, "error": str(e), "status": e.status, "delay_s": delay})
                await asyncio.sleep(delay)
                continue
            except FatalModelError as e:
                await append(session_id, "model_error", {"error": str(e), "status": e.status, "attempts": attempt})
                return None
            latency = {"latency_ms": round((time.perf_counter() - t0) * 1000, 1),
                       "ttft_ms": round(((first or t0) - t0) * 1000, 1)}
            # committed with what follows at once (the first tool_started, or turn_ended): one transaction less
            self.views.hold(session_id, "assistant_turn",
                            {"message": message, "usage": message.get("usage"), "attempt": attempt, **latency})
            return message
        return None

    # -- a turn that did not end by itself -----------------------------------------------

    async def _close(self, session_id: str, how: str, detail: str) -> None:
        """Close the open turn after an interrupt (`interrupted`) or a harness failure (`error`); every event
        of the closing goes through `Views.closing`, so a turn is closed whatever its error's text holds."""
        printed = self.calls.cut_short(session_id)
        if not (await self.views.conversation(session_id)).state.open:
            return  # it ended already (an interrupt that came just after turn_ended)
        closing = self.views.closing
        if how == "interrupted":
            await self.calls.interrupt(session_id)
            await closing(session_id, "interrupted", {"by": detail})
            await self.calls.answer_pending(session_id, INTERRUPTED_CALL, printed, "interrupted")
        else:
            await closing(session_id, "turn_failed", {"error": detail[:2000]})
            await self.calls.answer_pending(session_id, f"not finished: the turn failed ({detail[:300]})", printed,
                                            "cut short by the turn's failure")
        await closing(session_id, "turn_ended", {"stop_reason": how})

    async def _resume(self, session_id: str) -> str:
        """Finish a cut-off turn (its `resumed` is committed): answer cut-off calls, then go on."""
        st = await self.views.turn_state(session_id)
        msg = st.last_message
        if msg is not None:
            calls = tool_uses(msg)
            if msg.get("stop_reason") == "tool_use" and calls:
                # a call that started but has no result is never re-run: its effect is unknown
                await self.calls.answer_cut_off(session_id, [c for c in calls if c["id"] in st.started
                                                             and c["id"] not in st.answered])
                st = await self.views.turn_state(session_id)
                await self.calls.run(session_id, [c for c in calls if c["id"] not in st.answered], run=True)
            elif msg.get("stop_reason") not in ("pause_turn", "compaction"):
                await self.calls.run(session_id, [c for c in calls if c["id"] not in st.answered], run=False)
                return await self._end(session_id, msg.get("stop_reason") or "unknown")
        return await self._loop(session_id)


    async def _close_cut_off(self, session_id: str, by: str) -> str:
        """Close a cut-off turn (its `resumed` is committed) without going on: no model call, no tool re-attached;
        its cut-off calls are answered "interrupted; state unknown", then the turn ends as interrupted by `by`."""
        await self.calls.answer_pending(session_id, CUT_OFF_CALL, how="cut off")
        await _to_the_end(self._close(session_id, "interrupted", by))
        return "interrupted"


async def _written(write: Any) -> tuple[Any, bool]:
    """A turn's first write, run to its commit even when cancelled meanwhile (an interrupt, a shutdown, the
    starter's own cancel): its event, and whether a cancel came. A cancel caught here must still close the turn,
    since the turn is open once the event is committed; left to `turn`'s first handler, which takes a cancel for
    one before anything was written, the turn stayed open with nothing running it."""
    task = asyncio.ensure_future(write)
    cut = False
    while True:
        try:
            return await asyncio.shield(task), cut
        except asyncio.CancelledError:
            if task.done():
                return task.result(), True  # the write's own failure, if any, is raised here
            cut = True


async def _to_the_end(closing: Any) -> None:
    """Run a turn's closing to its end: a second cancel (another interrupt, a hands close, a shutdown) that
    lands while it writes must not cut it off, or the turn would stay open with nothing running it. The
    cancel is kept: it is raised once the closing is done."""
    task = asyncio.ensure_future(closing)
    cancelled = False
    while True:
        try:
            await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                break
            cancelled = True
    task.result()
    if cancelled:
        raise asyncio.CancelledError

