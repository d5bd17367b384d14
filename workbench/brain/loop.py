"""The brain: the harness loop, stateless between steps.

Everything it knows it reads back from the session log. A host (the CLI, the
server extension, a test) passes in its collaborators: the log, a way to make
models, and a way to make hands.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ConfigError, TurnBusy, UnknownSession
from ..hands import Hands
from ..log import SessionLog
from .models import FatalModelError, MessageBuilder, Model, RetryableError, make_model
from .request import build_request, tool_uses, turn_state
from .tools import ToolContext, ToolOutput, get_tool

DEFAULT_SYSTEM = (
    "You are an agent working in a Jupyter workbench. You run Python with the `python` tool in a "
    "persistent kernel of your own (your hands), separate from the user's notebook. Think briefly, "
    "run code to check facts rather than guessing, and report results plainly."
)

DeltaListener = Callable[[str, dict[str, Any]], None]


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
        log: SessionLog,
        *,
        settings: BrainSettings | None = None,
        model_factory: Callable[[str], Model] = make_model,
        hands_factory: Callable[[str, dict[str, Any], Any], Hands] | None = None,
        redact: Callable[[str], str] | None = None,
    ):
        self.log = log
        self.settings = settings or BrainSettings()
        self.model_factory = model_factory
        self.hands_factory = hands_factory or default_hands_factory
        self.redact = redact
        self._models: dict[str, Model] = {}
        self._hands: dict[str, Hands] = {}
        self._active: set[str] = set()
        self._listeners: list[DeltaListener] = []
        self._events: dict[str, list] = {}  # per session: every event read so far, in seq order
        self._event_locks: dict[str, asyncio.Lock] = {}
        self.extras: dict[str, Any] = {}  # passed to tools (memory store, ...)

    # -- sessions ------------------------------------------------------------

    def create_session(
        self,
        session_id: str | None = None,
        *,
        title: str | None = None,
        model: str,
        system: str | None = None,
        tools: list[str] | None = None,
        config: dict[str, Any] | None = None,
        kind: str = "chat",
        preamble: str | None = None,
    ) -> dict[str, Any]:
        """Create a session with its frozen system prompt, tools and model settings."""
        session_id = session_id or uuid.uuid4().hex[:12]
        config = dict(config or {})
        memory, injected = self.extras.get("memory"), []
        if memory is not None and kind != "dream":  # accepted memories join the frozen prefix, only at the start
            memory_text, injected = memory.prompt_memories()
            if injected:
                preamble = f"{preamble}\n\n{memory_text}" if preamble else memory_text
        names = tools if tools is not None else ["python"]
        specs = [get_tool(n).spec() for n in names]
        s = self.settings
        thinking = config.get("thinking", s.thinking)
        payload = {
            "title": title,
            "model": model,
            "system": (system or DEFAULT_SYSTEM) + (f"\n\n{preamble}" if preamble else ""),
            "tools": specs,
            "max_tokens": int(config.get("max_tokens", s.max_tokens)),
            "thinking": {"type": thinking} if thinking != "disabled" else None,
            "output_config": {"effort": config.get("effort", s.effort)} if config.get("effort", s.effort) else None,
            "config": config,
        }
        # what was injected is recorded in the same transaction as the prompt it went into
        then = [("memories_injected", {"memories": injected, "text": memory_text})] if injected else []
        self.log.create_session(session_id, title=title, model=model, kind=kind, payload=payload, then=then)
        return self.log.session(session_id)

    async def events(self, session_id: str) -> list:
        """All events of a session, read incrementally: the log is append-only, so a cache
        extended with the events after its last seq is exact, and a step costs what is new,
        not the whole history."""
        lock = self._event_locks.setdefault(session_id, asyncio.Lock())
        async with lock:  # two readers must not both extend the cache with the same events
            cached = self._events.setdefault(session_id, [])
            after = cached[-1].seq if cached else None
            cached.extend(await self.log.aevents(session_id, after))
            return list(cached)

    def listen(self, fn: DeltaListener) -> Callable[[], None]:
        """Hear every live stream event (not logged) of every session."""
        self._listeners.append(fn)
        return lambda: self._listeners.remove(fn) if fn in self._listeners else None

    def model(self, name: str) -> Model:
        if name not in self._models:
            self._models[name] = self.model_factory(name)
        return self._models[name]

    def hands(self, session_id: str) -> Hands:
        """This session's hands (created on first use; the kernel starts lazily)."""
        if session_id not in self._hands:
            # session_created is normally in the cache already: no blocking read on the event loop
            cached = self._events.get(session_id)
            first = cached[0] if cached else self.log.events(session_id, until=1)[0]
            config = first.payload.get("config", {})

            async def sink(type: str, payload: dict[str, Any]) -> None:
                await self.log.aappend(session_id, type, payload)

            async def replayable() -> list[dict[str, Any]]:  # hands rehydrate from the log through us
                return replayable_calls(await self.events(session_id))

            self._hands[session_id] = self.hands_factory(session_id, config, sink, replayable)
        return self._hands[session_id]

    # -- the loop --------------------------------------------------------------

    async def run_turn(self, session_id: str, text: str) -> str:
        """Append the user's message and run the turn to its end; returns the stop reason."""
        if not isinstance(text, str) or not text.strip():
            raise ConfigError("the message is empty")
        if not await self.events(session_id):  # off the loop, and it warms the cache the turn reads
            raise UnknownSession(f"no session {session_id!r}")
        self._claim(session_id)
        try:
            if turn_state(await self.events(session_id)).open:
                raise TurnBusy(f"session {session_id} has an unfinished turn; resume it first")
            await self.log.aappend(session_id, "user_message", {"text": text})
            return await self._loop(session_id)
        finally:
            self._active.discard(session_id)

    async def _loop(self, session_id: str) -> str:
        try:
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
        except asyncio.CancelledError:
            await self._close_interrupted(session_id)
            raise

    async def _end(self, session_id: str, stop: str) -> str:
        await self.log.aappend(session_id, "turn_ended", {"stop_reason": stop})
        return stop

    async def _call_model(self, session_id: str, request: dict[str, Any]) -> dict[str, Any] | None:
        """Stream one response, with retries; append it verbatim. None if it failed for good."""
        model = self.model(request["model"])
        for attempt in range(1, self.settings.max_retries + 2):
            await self.log.aappend(
                session_id, "model_request", {"attempt": attempt, "model": model.name, "messages": len(request["messages"])}
            )
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
                if attempt > self.settings.max_retries:
                    await self.log.aappend(session_id, "model_error", {"error": str(e), "status": e.status, "attempts": attempt})
                    return None
                delay = e.retry_after or min(self.settings.retry_cap, self.settings.retry_base * 2 ** (attempt - 1))
                await self.log.aappend(
                    session_id, "model_retry", {"attempt": attempt, "error": str(e), "status": e.status, "delay_s": delay}
                )
                await asyncio.sleep(delay)
                continue
            except FatalModelError as e:
                await self.log.aappend(session_id, "model_error", {"error": str(e), "status": e.status, "attempts": attempt})
                return None
            latency = {
                "latency_ms": round((time.perf_counter() - t0) * 1000, 1),
                "ttft_ms": round(((first or t0) - t0) * 1000, 1),
            }
            await self.log.aappend(
                session_id, "assistant_turn", {"message": message, "usage": message.get("usage"), "attempt": attempt, **latency}
            )
            return message
        return None

    async def _run_tools(self, session_id: str, calls: list[dict[str, Any]], run: bool) -> None:
        """Run the turn's tool calls in order; each start and result is its own event."""
        for call in calls:
            if not run:
                await self._result(session_id, call, ToolOutput([_text("not run: the response stopped before tool use")], True))
                continue
            await self.log.aappend(session_id, "tool_started", {"tool_use_id": call["id"], "name": call["name"], "input": call["input"]})
            try:
                tool = get_tool(call["name"])
            except ConfigError as e:
                await self._result(session_id, call, ToolOutput([_text(str(e))], True))
                continue
            ctx = ToolContext(session_id, lambda: self.hands(session_id), self.log, self.extras)
            await self._result(session_id, call, await tool.run(call.get("input") or {}, ctx))

    async def _result(self, session_id: str, call: dict[str, Any], out: ToolOutput) -> None:
        payload = {"tool_use_id": call["id"], "name": call["name"], "content": out.content, "is_error": out.is_error, **out.details}
        if self.redact is not None:
            # every string, tracebacks and display text included, before the log or the model sees it
            payload = _map_strings(payload, self.redact, skip=("data",))
        await self.log.aappend(session_id, "tool_result", payload)

    # -- interrupts and resume -------------------------------------------------

    def _claim(self, session_id: str) -> None:
        if session_id in self._active:
            raise TurnBusy(f"a turn is already running in session {session_id}")
        self._active.add(session_id)

    async def _close_interrupted(self, session_id: str, by: str = "user") -> None:
        """Record an interrupt: answer pending tool calls and end the turn."""
        hands = self._hands.get(session_id)
        if hands is not None:
            await hands.interrupt()
        await self.log.aappend(session_id, "interrupted", {"by": by})
        await self._answer_pending(session_id, "interrupted by the user; the call's effect is unknown")
        await self._end(session_id, "interrupted")

    async def _answer_pending(self, session_id: str, why: str) -> int:
        """Give an error result to every tool call of the open turn that has none."""
        st = turn_state(await self.events(session_id))
        n = 0
        for call in tool_uses(st.last_message or {}):
            if call["id"] not in st.answered:
                started = call["id"] in st.started
                note = why if started else "not run: the turn was interrupted before this call started"
                await self._result(session_id, call, ToolOutput([_text(note)], True, {"interrupted": True}))
                n += 1
        return n

    async def resume(self, session_id: str) -> str | None:
        """Finish a turn that was cut off; None when there is nothing to finish."""
        if not await self.events(session_id):
            raise UnknownSession(f"no session {session_id!r}")
        self._claim(session_id)
        try:
            st = turn_state(await self.events(session_id))
            if not st.open:
                return None
            await self.log.aappend(session_id, "resumed", {})
            msg = st.last_message
            if msg is not None:
                calls = tool_uses(msg)
                if msg.get("stop_reason") == "tool_use" and calls:
                    # a call that started but has no result is never re-run: its effect is unknown
                    for call in calls:
                        if call["id"] in st.started and call["id"] not in st.answered:
                            note = "interrupted; state unknown: the call started but its result was never recorded (the process running the turn stopped). It was not re-run."
                            await self._result(session_id, call, ToolOutput([_text(note)], True, {"interrupted": True}))
                    st = turn_state(await self.events(session_id))
                    await self._run_tools(session_id, [c for c in calls if c["id"] not in st.answered], run=True)
                elif msg.get("stop_reason") != "pause_turn":
                    await self._run_tools(session_id, [c for c in calls if c["id"] not in st.answered], run=False)
                    return await self._end(session_id, msg.get("stop_reason") or "unknown")
            return await self._loop(session_id)
        finally:
            self._active.discard(session_id)

    async def interrupt_session(self, session_id: str, task: asyncio.Task | None) -> bool:
        """Interrupt a running turn by cancelling its task; True if one was running."""
        if task is None or task.done():
            return False
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, Exception):
            pass
        return True

    async def close(self) -> None:
        """Stop every session's hands and close the models."""
        for hands in list(self._hands.values()):
            await hands.shutdown()
        self._hands.clear()
        for m in self._models.values():
            if hasattr(m, "aclose"):
                await m.aclose()

    async def close_session(self, session_id: str) -> None:
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


def _text(s: str) -> dict[str, Any]:
    return {"type": "text", "text": s}


_default_factory: Any = None


def default_hands_factory(session_id: str, config: dict[str, Any], sink: Any, replay: Any = None) -> Hands:
    """Hands as a host would make them (sandboxed by default, WORKBENCH_HANDS_* settings), without a pool.

    Hosts that want a warm pool, or to close every kernel at once, pass their own HandsFactory.
    """
    global _default_factory
    if _default_factory is None:
        from ..config import from_env
        from ..hands.factory import HandsFactory, HandsSettings

        _default_factory = HandsFactory(from_env(HandsSettings, prefix="WORKBENCH_HANDS_", pool_size=0))
    return _default_factory(session_id, config, sink, replay)


def replayable_calls(events: list[Any]) -> list[dict[str, Any]]:
    """Successful `python` calls the model marked replayable, in order: [{tool_use_id, code}]."""
    code = {e.payload["tool_use_id"]: e.payload["input"].get("code") for e in events
            if e.type == "tool_started" and e.payload.get("name") == "python"}
    return [{"tool_use_id": e.payload["tool_use_id"], "code": code[e.payload["tool_use_id"]]} for e in events
            if e.type == "tool_result" and e.payload.get("replayable") and not e.payload.get("is_error")
            and isinstance(code.get(e.payload["tool_use_id"]), str)]
