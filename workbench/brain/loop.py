"""The brain: the harness loop, stateless between steps.

Everything it knows it reads back from the session log. A host passes in its
collaborators: the log, a way to make models, a way to make hands, the tools
and what plugins add to a new session's system prompt. The brain owns its
turns (brain/turns.py): starting one returns the committed `user_message`,
and a turn always ends with `turn_ended`, whatever stops it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, TurnBusy, UnknownSession
from ..hands import Hands
from ..log import Event
from .models import FatalModelError, MessageBuilder, Model, RetryableError, make_model
from .request import build_request, tool_uses, turn_state
from .sessions import PromptHook, session_payload
from .tools import BUILTIN_TOOLS, Tool, ToolContext, ToolOutput, tool_named
from .turns import Turns

log = logging.getLogger("workbench.brain")

DeltaListener = Callable[[str, dict[str, Any]], None]
# (session_id, session config, event sink, replay source) -> that session's hands
HandsMaker = Callable[[str, dict[str, Any], Callable[[str, dict[str, Any]], Awaitable[None]], Any], Hands]

INTERRUPTED_CALL = "interrupted by the user; the call's effect is unknown"
CUT_OFF_CALL = ("interrupted; state unknown: the call started but its result was never recorded (the process "
                "running the turn stopped). It was not re-run.")


@dataclass
class BrainSettings:
    """How the loop behaves; every field is documented in docs/settings.md."""

    max_retries: int = 4  # retries of a model call that failed with overloaded / 429 / 5xx
    retry_base: float = 1.0  # seconds before the first retry; doubles each time
    retry_cap: float = 30.0  # longest wait between retries
    max_pauses: int = 5  # how often a pause_turn is sent again within one turn
    max_tokens: int = 16000
    thinking: str = "adaptive"  # adaptive | disabled
    effort: str | None = None  # low | medium | high | xhigh | max


class Brain:
    """Runs turns: model calls and tool calls, every step appended to the log."""

    def __init__(
        self,
        log: Any,
        *,
        hands_factory: HandsMaker | None,
        settings: BrainSettings | None = None,
        model_factory: Callable[[str], Model] = make_model,
        tools: Mapping[str, Tool] = BUILTIN_TOOLS,
        prompt_hooks: Sequence[PromptHook] = (),
        redact: Callable[[str], str] | None = None,
    ):
        self.log = log
        self.settings = settings or BrainSettings()
        self.model_factory = model_factory
        self.hands_factory = hands_factory
        self.tools = tools
        self.prompt_hooks = tuple(prompt_hooks)
        self.redact = redact
        self.turns = Turns()
        self._models: dict[str, Model] = {}
        self._hands: dict[str, Hands] = {}
        self._listeners: list[DeltaListener] = []
        self._events: dict[str, list[Event]] = {}  # per session: every event read so far, in seq order
        self._event_locks: dict[str, asyncio.Lock] = {}
        self._cancelled_by: dict[str, str] = {}

    # -- sessions ------------------------------------------------------------

    def create_session(self, session_id: str | None = None, *, title: str | None = None, model: str,
                       system: str | None = None, tools: list[str] | None = None,
                       config: dict[str, Any] | None = None, kind: str = "chat") -> dict[str, Any]:
        """Create a session with its frozen system prompt, tools and model settings; returns its row."""
        sid, payload, then = session_payload(
            session_id, title=title, model=model, system=system, tools=[tool_named(self.tools, n) for n in tools or ["python"]],
            config=config, kind=kind, settings=self.settings, hooks=self.prompt_hooks)
        self.log.create_session(sid, title=title, model=model, kind=kind, payload=payload, then=then)
        return self.log.session(sid)

    async def events(self, session_id: str) -> list[Event]:
        """All events of a session, read incrementally: the log is append-only, so a cache
        extended with the events after its last seq is exact, and a step costs what is new,
        not the whole history."""
        lock = self._event_locks.setdefault(session_id, asyncio.Lock())
        async with lock:  # two readers must not both extend the cache with the same events
            cached = self._events.setdefault(session_id, [])
            after = cached[-1].seq if cached else None
            cached.extend(await self.log.aevents(session_id, after))
            return list(cached)

    async def _require(self, session_id: str) -> list[Event]:
        events = await self.events(session_id)
        if not events:
            self._events.pop(session_id, None)
            raise UnknownSession(f"no session {session_id!r}")
        return events

    def listen(self, fn: DeltaListener) -> Callable[[], None]:
        """Hear every live stream event (not logged) of every session."""
        self._listeners.append(fn)
        return lambda: self._listeners.remove(fn) if fn in self._listeners else None

    def model(self, name: str) -> Model:
        """The model called `name` (made once): UnknownModel / MissingAPIKey."""
        if name not in self._models:
            self._models[name] = self.model_factory(name)
        return self._models[name]

    async def hands(self, session_id: str) -> Hands:
        """This session's hands (made on first use; the kernel starts lazily)."""
        if session_id not in self._hands:
            config = (await self._require(session_id))[0].payload.get("config") or {}
            if session_id not in self._hands:  # another caller may have made them while we read
                if self.hands_factory is None:
                    raise ConfigError("this host runs no code: it was opened without hands")

                async def sink(type: str, payload: dict[str, Any]) -> None:
                    await self._append(session_id, type, payload)

                async def replayable() -> list[dict[str, Any]]:  # hands rehydrate from the log through us
                    return replayable_calls(await self.events(session_id))

                self._hands[session_id] = self.hands_factory(session_id, config, sink, replayable)
        return self._hands[session_id]

    # -- turns: start, resume, interrupt ------------------------------------------

    async def start_turn(self, session_id: str, text: str) -> Event:
        """Append the user's message and start the turn in the background; returns the committed event."""
        event, _ = await self._start(session_id, text)
        return event

    async def run_turn(self, session_id: str, text: str) -> str:
        """Run a turn to its end; returns the stop reason. Cancelling the caller interrupts the turn."""
        _, task = await self._start(session_id, text)
        return await task

    async def start_resume(self, session_id: str) -> bool:
        """Resume a turn that was cut off, in the background; False when there is none."""
        await self._require(session_id)
        async with self.turns.lock(session_id):
            if self.turns.running(session_id):
                raise TurnBusy(f"a turn is already running in session {session_id}")
            if not turn_state(await self.events(session_id)).open:
                return False
            await self._spawn(session_id, None)
            return True

    async def resume(self, session_id: str) -> str | None:
        """Finish a turn that was cut off; the stop reason, or None when there is nothing to finish."""
        if not await self.start_resume(session_id):
            return None
        task = self.turns.task(session_id)
        return await task if task is not None else None

    async def interrupt(self, session_id: str, by: str = "user") -> bool:
        """Interrupt the running turn (it records `interrupted` and ends); True if one was running."""
        await self._require(session_id)
        async with self.turns.lock(session_id):
            if not self.turns.running(session_id):
                return False
            self._cancelled_by[session_id] = by
            return await self.turns.cancel(session_id)

    def running(self, session_id: str) -> bool:
        return self.turns.running(session_id)

    async def _start(self, session_id: str, text: Any) -> tuple[Event, asyncio.Task]:
        if not isinstance(text, str) or not text.strip():
            raise ConfigError("the message is empty")
        events = await self._require(session_id)
        model: str = events[0].payload["model"]  # session_payload always writes it; build_request reads it so too
        if model not in self._models:  # an SDK import and client take seconds: not on the event loop
            await asyncio.to_thread(self.model, model)
        busy = f"a turn is already running in session {session_id}; wait for it or interrupt it"
        async with self.turns.lock(session_id):
            if self.turns.running(session_id):
                if turn_state(await self.events(session_id)).open:
                    raise TurnBusy(busy)
                # its turn_ended is committed (a client may answer it at once): it is only finishing up
                if not await self.turns.settle(session_id):
                    raise TurnBusy(busy)
            elif turn_state(await self.events(session_id)).open:
                raise TurnBusy(f"session {session_id} has an unfinished turn; resume it or interrupt it first")
            return await self._spawn(session_id, text)

    async def _spawn(self, session_id: str, text: str | None) -> tuple[Any, asyncio.Task]:
        """Start the turn's task; wait (not cancellably) until its first event is committed."""
        started: asyncio.Future = asyncio.get_running_loop().create_future()
        task = self.turns.spawn(session_id, lambda: self._turn(session_id, text, started))
        return await asyncio.shield(started), task

    async def _turn(self, session_id: str, text: str | None, started: asyncio.Future) -> str | None:
        try:
            first = await self._append(session_id, "user_message", {"text": text}) if text is not None \
                else await self._append(session_id, "resumed", {})
        except BaseException as e:
            if isinstance(e, asyncio.CancelledError):
                started.cancel()
                raise
            started.set_exception(e)
            return None
        started.set_result(first)
        try:
            return await (self._loop(session_id) if text is not None else self._resume(session_id))
        except asyncio.CancelledError:
            await self._close(session_id, "interrupted", self._cancelled_by.pop(session_id, "user"))
            raise
        except Exception as e:  # a harness failure still ends the turn, then propagates
            try:
                await self._close(session_id, "error", f"{type(e).__name__}: {e}")
            except Exception:  # the log itself fails: the turn stays open for a later resume
                log.exception("workbench: could not close the failed turn of session %s", session_id)
            raise

    # -- the loop --------------------------------------------------------------

    async def _loop(self, session_id: str) -> str:
        while True:
            events = await self.events(session_id)
            state = turn_state(events)
            message = await self._call_model(session_id, build_request(events))
            if message is None:
                return await self._end(session_id, "error")
            stop = message.get("stop_reason")
            await self._run_tools(session_id, tool_uses(message), run=stop == "tool_use")
            if stop == "tool_use" or (stop == "pause_turn" and state.pauses < self.settings.max_pauses):
                continue
            return await self._end(session_id, stop or "unknown")

    async def _end(self, session_id: str, stop: str) -> str:
        await self._append(session_id, "turn_ended", {"stop_reason": stop})
        return stop

    async def _call_model(self, session_id: str, request: dict[str, Any]) -> dict[str, Any] | None:
        """Stream one response, with retries; append it verbatim. None if it failed for good."""
        model = self.model(request["model"])
        s = self.settings
        for attempt in range(1, s.max_retries + 2):
            await self._append(session_id, "model_request",
                               {"attempt": attempt, "model": model.name, "messages": len(request["messages"])})
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
                    await self._append(session_id, "model_error", {"error": str(e), "status": e.status, "attempts": attempt})
                    return None
                delay = e.retry_after or min(s.retry_cap, s.retry_base * 2 ** (attempt - 1))
                await self._append(session_id, "model_retry",
                                   {"attempt": attempt, "error": str(e), "status": e.status, "delay_s": delay})
                await asyncio.sleep(delay)
                continue
            except FatalModelError as e:
                await self._append(session_id, "model_error", {"error": str(e), "status": e.status, "attempts": attempt})
                return None
            latency = {"latency_ms": round((time.perf_counter() - t0) * 1000, 1),
                       "ttft_ms": round(((first or t0) - t0) * 1000, 1)}
            await self._append(session_id, "assistant_turn",
                               {"message": message, "usage": message.get("usage"), "attempt": attempt, **latency})
            return message
        return None

    async def _run_tools(self, session_id: str, calls: list[dict[str, Any]], run: bool) -> None:
        """Run the turn's tool calls in order; each start and result is its own event."""
        for call in calls:
            if not run:
                await self._result(session_id, call, _error("not run: the response stopped before tool use"))
                continue
            await self._append(session_id, "tool_started", {"tool_use_id": call["id"], "name": call["name"], "input": call["input"]})
            try:
                tool = tool_named(self.tools, call["name"])
            except ConfigError as e:
                await self._result(session_id, call, _error(str(e)))
                continue
            ctx = ToolContext(session_id, lambda: self.hands(session_id), self.log)
            await self._result(session_id, call, await tool.run(call.get("input") or {}, ctx))

    async def _result(self, session_id: str, call: dict[str, Any], out: ToolOutput) -> None:
        payload = {"tool_use_id": call["id"], "name": call["name"], "content": out.content, "is_error": out.is_error, **out.details}
        if self.redact is not None:
            # every string, tracebacks and display text included, before the log or the model sees it
            payload = _map_strings(payload, self.redact, skip=("data",))
        await self._append(session_id, "tool_result", payload)

    async def _append(self, session_id: str, type: str, payload: dict[str, Any]) -> Event:
        """Append and wait for the commit. A cancel arriving meanwhile waits for the write to finish,
        so whoever handles the cancel reads a log that already holds it (never a second turn_ended)."""
        done = asyncio.wrap_future(self.log.write(lambda tx: tx.append(session_id, type, payload)))
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            if not done.done():
                await asyncio.wait({done})
            raise

    # -- ending a turn that did not end by itself ------------------------------------

    async def _close(self, session_id: str, how: str, detail: str) -> None:
        """Close the open turn after an interrupt (`interrupted`) or a harness failure (`error`)."""
        if not turn_state(await self.events(session_id)).open:
            return  # it ended already (an interrupt that came just after turn_ended)
        if how == "interrupted":
            hands = self._hands.get(session_id)
            if hands is not None:
                await hands.interrupt()
            await self._append(session_id, "interrupted", {"by": detail})
            await self._answer_pending(session_id, INTERRUPTED_CALL)
        else:
            await self._append(session_id, "turn_failed", {"error": detail[:2000]})
            await self._answer_pending(session_id, f"not finished: the turn failed ({detail[:300]})")
        await self._end(session_id, how)

    async def _answer_pending(self, session_id: str, why: str) -> None:
        """Give an error result to every tool call of the open turn that has none."""
        st = turn_state(await self.events(session_id))
        for call in tool_uses(st.last_message or {}):
            if call["id"] not in st.answered:
                note = why if call["id"] in st.started else "not run: the turn was interrupted before this call started"
                await self._result(session_id, call, _error(note, interrupted=True))

    async def _resume(self, session_id: str) -> str:
        """Finish a cut-off turn (its `resumed` is committed): answer cut-off calls, then go on."""
        st = turn_state(await self.events(session_id))
        msg = st.last_message
        if msg is not None:
            calls = tool_uses(msg)
            if msg.get("stop_reason") == "tool_use" and calls:
                # a call that started but has no result is never re-run: its effect is unknown
                for call in calls:
                    if call["id"] in st.started and call["id"] not in st.answered:
                        await self._result(session_id, call, _error(CUT_OFF_CALL, interrupted=True))
                st = turn_state(await self.events(session_id))
                await self._run_tools(session_id, [c for c in calls if c["id"] not in st.answered], run=True)
            elif msg.get("stop_reason") != "pause_turn":
                await self._run_tools(session_id, [c for c in calls if c["id"] not in st.answered], run=False)
                return await self._end(session_id, msg.get("stop_reason") or "unknown")
        return await self._loop(session_id)

    # -- lifetime ----------------------------------------------------------------

    async def close(self, timeout: float = 30.0) -> None:
        """Interrupt running turns (recorded as interrupted), stop every session's hands, close the models."""
        for sid in self.turns.sessions():
            self._cancelled_by[sid] = "shutdown"
        await self.turns.close(timeout)
        hands, self._hands = list(self._hands.values()), {}
        await asyncio.gather(*(h.shutdown() for h in hands), return_exceptions=True)
        for m in self._models.values():
            aclose = getattr(m, "aclose", None)  # a Model may hold a client; the protocol does not require one
            if aclose is not None:
                await aclose()

    async def close_session(self, session_id: str) -> None:
        """Forget a session's cached events and stop its hands (it may be used again later)."""
        self._events.pop(session_id, None)
        hands = self._hands.pop(session_id, None)
        if hands is not None:
            await hands.shutdown()


def _map_strings(value: Any, fn: Callable[[str], str], skip: tuple[str, ...] = ()) -> Any:
    """A copy of a JSON value with fn applied to every string (not under keys in `skip`, e.g. image data)."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        return [_map_strings(v, fn, skip) for v in value]
    if isinstance(value, dict):
        return {k: (v if k in skip else _map_strings(v, fn, skip)) for k, v in value.items()}
    return value


def _error(text: str, **details: Any) -> ToolOutput:
    return ToolOutput([{"type": "text", "text": text}], True, details)


def replayable_calls(events: list[Any]) -> list[dict[str, Any]]:
    """Successful `python` calls the model marked replayable, in order: [{tool_use_id, code}]."""
    code = {e.payload["tool_use_id"]: e.payload["input"].get("code") for e in events
            if e.type == "tool_started" and e.payload.get("name") == "python"}
    return [{"tool_use_id": e.payload["tool_use_id"], "code": code[e.payload["tool_use_id"]]} for e in events
            if e.type == "tool_result" and e.payload.get("replayable") and not e.payload.get("is_error")
            and isinstance(code.get(e.payload["tool_use_id"]), str)]
