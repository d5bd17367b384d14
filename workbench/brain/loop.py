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
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..errors import ConfigError, KeyReused, TurnBusy, UnknownSession
from ..hands import Hands, Observation
from ..log import Event
from ..log.manage import auto_title, rename
from .coldread import read_conversation
from .live import LiveCall, LiveOutput, OutputListener
from .models import FatalModelError, MessageBuilder, Model, RetryableError, make_model
from .request import Conversation, TurnState, tool_uses
from .sessions import PromptHook, session_payload
from .tools import BUILTIN_TOOLS, Tool, ToolContext, ToolOutput, tool_named
from .turns import Turns, printable

log = logging.getLogger("workbench.brain")

DeltaListener = Callable[[str, dict[str, Any]], None]
# (session_id, session config, event sink, replay source) -> that session's hands
HandsMaker = Callable[[str, dict[str, Any], Callable[[str, dict[str, Any]], Awaitable[None]], Any], Hands]

INTERRUPTED_CALL = "interrupted by the user; the call's effect is unknown"
# a cut-short call keeps the tail of what it printed, as a stopped notebook cell keeps its output
PRINTED_KEPT_CHARS = 20_000
CUT_OFF_CALL = ("interrupted; state unknown: the call started but its result was never recorded (the process "
                "running the turn stopped). It was not re-run.")


@dataclass
class BrainSettings:
    """How the loop behaves; every field is documented in docs/settings.md."""

    max_retries: int = 4  # retries of a model call that failed with overloaded / 429 / 5xx
    retry_base: float = 1.0  # seconds before the first retry; doubles each time
    retry_cap: float = 30.0  # longest wait between retries
    max_pauses: int = 5  # how often a pause_turn (or a compaction pause) is sent again within one turn
    max_tokens: int = 16000
    thinking: str = "adaptive"  # adaptive | disabled
    effort: str | None = None  # low | medium | high | xhigh | max
    context: str = "compact"  # compact (server-side compaction) | clear (clear old tool results) | off
    context_trigger: int = 150_000  # input tokens at which compaction (or clearing) starts
    session_cache: int = 64  # sessions whose request the brain keeps in memory (least recently used dropped)


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
        self.live = LiveOutput(redact)  # running calls' output as it arrives: heard, never logged
        self._models: dict[str, Model] = {}
        self._hands: dict[str, Hands] = {}
        self._listeners: list[DeltaListener] = []
        self._views: dict[str, _View] = {}  # per session: its request and turn state (bounded: session_cache)
        self._clock = 0
        # per session: events held back to be committed with the brain's next write for it, which always
        # follows at once (an assistant turn waits for its first tool_started, or its turn_ended; a step's
        # last tool result for the model_request that sends it): a turn with one tool call is 4 commits
        self._held: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        self._unsubscribe = log.subscribe(self._heard)
        self._cancelled_by: dict[str, str] = {}
        # per session: the live output of calls a cancel cut short, until the turn's closing answers them
        self._cut_short: dict[str, dict[str, LiveCall]] = {}

    # -- sessions ------------------------------------------------------------

    def create_session(self, session_id: str | None = None, *, title: str | None = None, model: str,
                       system: str | None = None, tools: list[str] | None = None,
                       config: dict[str, Any] | None = None, kind: str = "chat", parent_id: str | None = None,
                       origin: dict[str, Any] | None = None, message: str | None = None,
                       then: Sequence[tuple[str, dict[str, Any]]] = ()) -> dict[str, Any]:
        """Create a session with its frozen system prompt, tools and model settings; returns its row.
        A child session names its parent (`parent_id`) and what started it (`origin`); `message`, the
        first user message when known, lets prompt hooks fit what they add to it (it is not sent);
        `then` are events of the caller's written in the same transaction (none is without the session)."""
        sid, payload, extra = session_payload(
            session_id, title=title, model=model, system=system, tools=[tool_named(self.tools, n) for n in tools or ["python"]],
            config=config, kind=kind, settings=self.settings, hooks=self.prompt_hooks, parent_id=parent_id, origin=origin,
            message=message)
        self.log.create_session(sid, title=title, model=model, kind=kind, payload=payload, then=[*extra, *then])
        return self.log.session(sid)

    async def events(self, session_id: str) -> list[Event]:
        """All events of a session, read from the log (the brain itself keeps only their fold, `Conversation`)."""
        return await self.log.aevents(session_id)

    async def conversation(self, session_id: str) -> Conversation:
        """The session's request and turn state, up to date with the log.

        Kept per session and extended with what is new: events the brain appends itself
        and events others append (heard from the log's subscription, after their commit),
        so a step reads nothing from the database. A session seen first (or again after
        eviction) is read once, only the event types a request depends on."""
        if session_id in self._held:  # events held for the next write: written now, read below
            t, p = self._held[session_id].pop()
            if not self._held[session_id]:
                del self._held[session_id]
            await self._append(session_id, t, p)
        return await self._folded(session_id)

    async def _folded(self, session_id: str) -> Conversation:
        """The session's Conversation with every committed event folded in (events the brain holds are not)."""
        self._clock += 1
        view = self._views.get(session_id)
        if view is None:
            view = self._views[session_id] = _View()  # before the read: what commits from now on is heard
            view.used = self._clock
            self._evict()
        view.used = self._clock
        async with view.lock:  # two readers must not both fold in the same events
            if view.conv.frozen is None:
                view.conv = await asyncio.to_thread(read_conversation, self.log, session_id)
            while view.inbox:
                e = view.inbox.popleft()
                if e.seq <= view.conv.seq:
                    continue
                if e.seq != view.conv.seq + 1:  # events committed but not heard (before the view existed)
                    view.conv.feed_all(await self.log.aevents(session_id, view.conv.seq, until=e.seq - 1))
                view.conv.feed(e)
            if view.conv.frozen is None:
                self._views.pop(session_id, None)
                raise UnknownSession(f"no session {session_id!r}")
            return view.conv

    def _heard(self, event: Event) -> None:
        """A committed event (on the log's writer thread): queued for the session's view, if one is kept."""
        view = self._views.get(event.session_id)
        if view is not None and event.type == "redacted":
            # events before this one were scrubbed in place: the kept request holds what was removed,
            # so it is dropped and the next step reads the session again from the log
            self._views.pop(event.session_id, None)
        elif view is not None:
            view.inbox.append(event)  # deque.append is atomic; the view folds it in on the event loop
            if len(view.inbox) > 10_000:  # a kept session nobody steps: forget it rather than queue without end
                self._views.pop(event.session_id, None)

    def _evict(self) -> None:
        """Keep at most `session_cache` views: drop the least recently used of sessions with no running turn."""
        limit = max(1, self.settings.session_cache)
        while len(self._views) > limit:
            idle = [(v.used, sid) for sid, v in list(self._views.items()) if not self.turns.running(sid)]
            if not idle:
                return
            self._views.pop(min(idle)[1], None)

    async def _require(self, session_id: str) -> Conversation:
        return await self.conversation(session_id)

    async def turn_state(self, session_id: str) -> TurnState:
        """Where the session's latest turn stands (a copy)."""
        return (await self.conversation(session_id)).state.copy()

    def listen(self, fn: DeltaListener) -> Callable[[], None]:
        """Hear every live stream event (not logged) of every session."""
        self._listeners.append(fn)
        return lambda: self._listeners.remove(fn) if fn in self._listeners else None

    def listen_output(self, fn: OutputListener) -> Callable[[], None]:
        """Hear the live output of every session's running tool calls (brain/live.py; not logged)."""
        return self.live.listen(fn)

    def hands_state(self, session_id: str) -> str:
        """The state of the session's hands ("busy" while a call runs), "not started" before they exist."""
        hands = self._hands.get(session_id)
        return str(hands.status().get("state")) if hands is not None else "not started"

    def model(self, name: str) -> Model:
        """The model called `name` (made once): UnknownModel / MissingAPIKey."""
        if name not in self._models:
            self._models[name] = self.model_factory(name)
        return self._models[name]

    async def hands(self, session_id: str) -> Hands:
        """This session's hands (made on first use; the kernel starts lazily)."""
        if session_id not in self._hands:
            config = ((await self._require(session_id)).frozen or {}).get("config") or {}
            if session_id not in self._hands:  # another caller may have made them while we read
                if self.hands_factory is None:
                    raise ConfigError("this host runs no code: it was opened without hands")

                async def sink(type: str, payload: dict[str, Any]) -> None:
                    await self._append(session_id, type, payload)

                async def replayable() -> list[dict[str, Any]]:  # hands rehydrate from the log through us
                    return replayable_calls(await self.log.aevents(session_id, types=["tool_started", "tool_result"]))

                self._hands[session_id] = self.hands_factory(session_id, config, sink, replayable)
        return self._hands[session_id]

    # -- turns: start, resume, interrupt ------------------------------------------

    async def start_turn(self, session_id: str, text: str, *, name_untitled: bool = False, key: str | None = None) -> Event:
        """Append the user's message and start the turn in the background; returns the committed event.
        name_untitled: a session with no title is named after this message (`session_renamed`, auto),
        in the same transaction as the message, so the title is there exactly when the message is.
        key: the client's idempotency key, stored with the message: the same message sent again with it (a
        retry) starts nothing and returns the first one's event; another message with it is KeyReused."""
        event, _ = await self._start(session_id, text, name_untitled, key)
        return event

    async def run_turn(self, session_id: str, text: str, *, interrupted_by: str = "user") -> str:
        """Run a turn to its end; returns the stop reason. Cancelling the caller interrupts the turn, recorded
        as interrupted by `interrupted_by` (an eval run, a dream's driver: not a person)."""
        _, task = await self._start(session_id, text)
        assert task is not None  # only a message with a key is ever found sent before
        return await self._await_turn(session_id, task, interrupted_by)

    async def _await_turn(self, session_id: str, task: asyncio.Task, interrupted_by: str) -> Any:
        """The turn's result; a cancel of the caller interrupts the turn, recorded as by `interrupted_by`."""
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                self._cancelled_by.setdefault(session_id, interrupted_by)
                task.cancel()
                await asyncio.wait({task})
            raise

    async def _made(self, session_id: str) -> None:
        """The session's model made (once), off the event loop: an SDK import and client take seconds."""
        conv = await self._require(session_id)
        model: str = (conv.frozen or {})["model"]  # session_payload always writes it; the request reads it so too
        if model not in self._models:
            await asyncio.to_thread(self.model, model)

    async def start_resume(self, session_id: str) -> bool:
        """Resume a turn that was cut off, in the background; False when there is none."""
        await self._made(session_id)
        async with self.turns.lock(session_id):
            if self.turns.running(session_id):
                # a turn whose turn_ended is committed (a client may answer it at once) is only finishing up
                if (await self.turn_state(session_id)).open or not await self.turns.settle(session_id):
                    raise TurnBusy(f"a turn is already running in session {session_id}")
            if not (await self.conversation(session_id)).state.open:
                return False
            await self._spawn(session_id, None)
            return True

    async def resume(self, session_id: str, *, interrupted_by: str = "user") -> str | None:
        """Finish a turn that was cut off; the stop reason, or None when there is nothing to finish. Cancelling
        the caller interrupts the turn, recorded as by `interrupted_by`."""
        if not await self.start_resume(session_id):
            return None
        task = self.turns.task(session_id)
        return await self._await_turn(session_id, task, interrupted_by) if task is not None else None

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

    def running_sessions(self) -> list[str]:
        """The sessions whose turn runs in this brain now."""
        return self.turns.sessions()

    async def wait_turn(self, session_id: str) -> str | None:
        """Wait for the session's running turn, if any (not cancelling it when the waiter is); its stop reason."""
        task = self.turns.task(session_id)
        return await asyncio.shield(task) if task is not None else None

    async def _start(self, session_id: str, text: Any, name_untitled: bool = False,
                     key: str | None = None) -> tuple[Event, asyncio.Task | None]:
        if not isinstance(text, str) or not text.strip():
            raise ConfigError("the message is empty")
        await self._made(session_id)
        busy = f"a turn is already running in session {session_id}; wait for it or interrupt it"
        async with self.turns.lock(session_id):
            # under the lock: a retry racing its first send finds the first's message committed (or commits its own)
            sent = (await self.conversation(session_id)).keys.get(key) if key is not None else None
            if sent is not None:
                return await self._sent_before(session_id, key, text, *sent), None
            if self.turns.running(session_id):
                if (await self.conversation(session_id)).state.open:
                    raise TurnBusy(busy)
                # its turn_ended is committed (a client may answer it at once): it is only finishing up
                if not await self.turns.settle(session_id):
                    raise TurnBusy(busy)
            elif (await self.conversation(session_id)).state.open:
                raise TurnBusy(f"session {session_id} has an unfinished turn; resume it or interrupt it first")
            return await self._spawn(session_id, text, name_untitled, key)

    async def _sent_before(self, session_id: str, key: Any, text: str, seq: int, first: str) -> Event:
        """The user_message a key was first sent with, when this is the same message again; else KeyReused."""
        if text != first:
            raise KeyReused(f"idempotency key {key!r} was sent before with another message (seq {seq} of session "
                            f"{session_id}); send a new message with a new key")
        return (await self.log.aevents(session_id, seq - 1, until=seq))[0]

    async def _spawn(self, session_id: str, text: str | None, name_untitled: bool = False,
                     key: str | None = None) -> tuple[Any, asyncio.Task]:
        """Start the turn's task; wait (not cancellably) until its first event is committed."""
        started: asyncio.Future = asyncio.get_running_loop().create_future()
        task = self.turns.spawn(session_id, lambda: self._turn(session_id, text, started, name_untitled, key))

        def never_started(t: asyncio.Task) -> None:
            # cancelled before its first step (a shutdown's cancel landing just after the spawn): the turn wrote
            # nothing, and its starter, waiting for its first event, must hear so rather than wait for ever
            if not started.done():
                started.set_exception(TurnBusy(f"the turn in session {session_id} was stopped before it started "
                                               "(the workbench is shutting down); nothing was written"))

        task.add_done_callback(never_started)
        return await asyncio.shield(started), task

    async def _turn(self, session_id: str, text: str | None, started: asyncio.Future,
                    name_untitled: bool = False, key: str | None = None) -> str | None:
        title = auto_title(text) if name_untitled and text is not None else None

        def name(tx: Any) -> None:
            if title is not None:
                rename(tx, session_id, title, auto=True, only_untitled=True)

        try:
            if text is not None:  # the first model_request with it: the call starts once both are committed
                asked = await self._model_request(session_id, 1, (await self._folded(session_id)).size_with_message())
                message = {"text": text, **({"idempotency_key": key} if key is not None else {})}
                first = await self._append(session_id, "user_message", message, before=name, then=[asked])
            else:
                first = await self._append(session_id, "resumed", {})
        except BaseException as e:
            if isinstance(e, asyncio.CancelledError):
                started.cancel()
                raise
            started.set_exception(e)
            return None
        started.set_result(first)
        try:
            return await (self._loop(session_id, asked=True) if text is not None else self._resume(session_id))
        except asyncio.CancelledError:
            await _to_the_end(self._close(session_id, "interrupted", self._cancelled_by.pop(session_id, "user")))
            raise
        except Exception as e:  # a harness failure still ends the turn, then propagates (so does a close that fails)
            await _to_the_end(self._close(session_id, "error", f"{type(e).__name__}: {e}"))
            raise

    # -- the loop --------------------------------------------------------------

    async def _loop(self, session_id: str, asked: bool = False) -> str:
        while True:
            if not asked:  # the step's model_request, committed with the results the model is about to read
                results_only = all(t == "tool_result" for t, _ in self._held.get(session_id, ()))
                # held results do not change the request's size; anything else held is written first
                conv = await (self._folded(session_id) if results_only else self.conversation(session_id))
                await self._append(session_id, *await self._model_request(session_id, 1, conv.request_size()))
            asked = False
            conv = await self.conversation(session_id)
            pauses = conv.state.pauses
            message = await self._call_model(session_id, conv.request())
            if message is None:
                return await self._end(session_id, "error")
            stop = message.get("stop_reason")
            await self._run_tools(session_id, tool_uses(message), run=stop == "tool_use")
            # pause_turn, and compaction when the API pauses after one: send the request again to go on
            if stop == "tool_use" or (stop in ("pause_turn", "compaction") and pauses < self.settings.max_pauses):
                continue
            return await self._end(session_id, stop or "unknown")

    async def _end(self, session_id: str, stop: str) -> str:
        await self._append(session_id, "turn_ended", {"stop_reason": stop})
        return stop

    async def _model_request(self, session_id: str, attempt: int, messages: int) -> tuple[str, dict[str, Any]]:
        """The `model_request` event of a call of the session's model with a request of `messages` messages."""
        conv = await self._folded(session_id)
        return "model_request", {"attempt": attempt, "model": self.model((conv.frozen or {})["model"]).name,
                                 "messages": messages}

    async def _call_model(self, session_id: str, request: dict[str, Any]) -> dict[str, Any] | None:
        """Stream one response, with retries; append it verbatim. None if it failed for good.
        The first attempt's model_request is committed already (see _loop)."""
        model = self.model(request["model"])
        s = self.settings
        for attempt in range(1, s.max_retries + 2):
            if attempt > 1:
                await self._append(session_id, *await self._model_request(session_id, attempt, len(request["messages"])))
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
            # committed with what follows at once (the first tool_started, or turn_ended): one transaction less
            self._held.setdefault(session_id, []).append(
                ("assistant_turn", {"message": message, "usage": message.get("usage"), "attempt": attempt, **latency}))
            return message
        return None

    async def _run_tools(self, session_id: str, calls: list[dict[str, Any]], run: bool) -> None:
        """Run the turn's tool calls; each start and result is its own event, results in the calls' order.

        A run of consecutive calls whose tools say they are `concurrent` runs at once; any other
        call runs alone, after the calls before it have their results."""
        if not run:
            for call in calls:
                await self._result(session_id, call, _error("not run: the response stopped before tool use"))
            return
        for batch in _batches(calls, lambda c: getattr(self._tool(c), "concurrent", False)):
            for call in batch:
                await self._append(session_id, "tool_started", {"tool_use_id": call["id"], "name": call["name"], "input": call["input"]})
            await self._answer_in_order(session_id, [(call, self._call(session_id, call)) for call in batch])

    def _tool(self, call: dict[str, Any]) -> Tool | None:
        try:
            return tool_named(self.tools, call["name"])
        except ConfigError:
            return None

    async def _call(self, session_id: str, call: dict[str, Any], resuming: bool = False) -> ToolOutput:
        """One tool call's output (its start is logged); an unknown tool is an error result."""
        try:
            tool = tool_named(self.tools, call["name"])
        except ConfigError as e:
            return _error(str(e))
        live = self.live.begin(session_id, call["id"], call["name"], lambda: self.hands_state(session_id))
        ctx = ToolContext(session_id, lambda: self.hands(session_id), self.log, tool_use_id=call["id"], output=live.write)
        fn = tool.resume if resuming and tool.resume is not None else tool.run
        try:
            return await fn(call.get("input") or {}, ctx)
        except asyncio.CancelledError:
            self.live.end(live)  # what was pending is flushed into what the call kept
            self._cut_short.setdefault(session_id, {})[call["id"]] = live
            raise
        finally:
            self.live.end(live)  # its `done` goes before the committed result

    async def _answer_in_order(self, session_id: str, pending: list[tuple[dict[str, Any], Awaitable[ToolOutput]]]) -> None:
        """Run the calls' coroutines at once; append each result as soon as every earlier call has one.

        A harness failure in one call cancels the others (each is then answered by the turn's close);
        a cancel of the turn cancels them all and waits until each has stopped."""
        if len(pending) == 1:
            call, coro = pending[0]
            await self._result(session_id, call, await coro, hold=True)
            return
        tasks = [asyncio.ensure_future(coro) for _, coro in pending]
        try:
            for (call, _), task in zip(pending, tasks, strict=True):
                while True:
                    failed = next((t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None), None)
                    if failed is not None:
                        raise failed.exception()  # type: ignore[misc]
                    if task.done():
                        break
                    await asyncio.wait([t for t in tasks if not t.done()], return_when=asyncio.FIRST_COMPLETED)
                await self._result(session_id, call, task.result(), hold=call is pending[-1][0])
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _result(self, session_id: str, call: dict[str, Any], out: ToolOutput, hold: bool = False,
                      closing: bool = False) -> None:
        """Record a call's result; `hold`: no other call runs, so it is committed with the write that follows at
        once (the next model_request, a tool_started, or the turn's end); `closing`: part of a turn's closing."""
        content = {} if out.content is None else {"content": out.content}  # None: read from its observation
        payload = {"tool_use_id": call["id"], "name": call["name"], **content, "is_error": out.is_error, **out.details}
        if self.redact is not None:
            # every string, tracebacks and display text included, before the log or the model sees it
            payload = _map_strings(payload, self.redact, skip=BASE64_KEYS)
        if hold:
            self._held.setdefault(session_id, []).append(("tool_result", payload))
        else:
            await (self._closing if closing else self._append)(session_id, "tool_result", payload)

    async def _append(self, session_id: str, type: str, payload: dict[str, Any],
                      before: Callable[[Any], None] | None = None,
                      then: Sequence[tuple[str, dict[str, Any]]] = ()) -> Event:
        """Append and wait for the commit (`before(tx)` first, `then` after, in the same transaction). A cancel
        arriving meanwhile waits for the write to finish, so whoever handles the cancel reads a log that already
        holds it (never a second turn_ended)."""
        held = self._held.pop(session_id, None)  # popped and submitted with no await between: order is kept
        view = self._views.get(session_id)
        # where a cold read may start, once a compaction moved it: recorded with the next write, never ahead of it
        mark = view.conv.start_seq if view is not None and view.conv.start_seq > view.marked else None

        def write(tx: Any) -> Event:
            for t, p in held or ():
                tx.append(session_id, t, p)
            if before is not None:
                before(tx)
            event = tx.append(session_id, type, payload)
            for t, p in then:
                tx.append(session_id, t, p)
            if mark is not None:
                tx.set_session(session_id, request_from=mark)
            return event

        done = self.log.write_soon(write)
        try:
            event = await asyncio.shield(done)
        except asyncio.CancelledError:
            if not done.done():
                await asyncio.wait({done})
            raise
        if mark is not None and view is not None:
            view.marked = max(view.marked, mark)
        return event

    # -- ending a turn that did not end by itself ------------------------------------

    async def _close(self, session_id: str, how: str, detail: str) -> None:
        """Close the open turn after an interrupt (`interrupted`) or a harness failure (`error`); every event
        of the closing goes through `_closing`, so a turn is closed whatever its error's text holds."""
        printed = self._cut_short.pop(session_id, {})
        if not (await self.conversation(session_id)).state.open:
            return  # it ended already (an interrupt that came just after turn_ended)
        if how == "interrupted":
            hands = self._hands.get(session_id)
            if hands is not None:
                await hands.interrupt()
            await self._closing(session_id, "interrupted", {"by": detail})
            await self._answer_pending(session_id, INTERRUPTED_CALL, printed, "interrupted")
        else:
            await self._closing(session_id, "turn_failed", {"error": detail[:2000]})
            await self._answer_pending(session_id, f"not finished: the turn failed ({detail[:300]})", printed,
                                       "cut short by the turn's failure")
        await self._closing(session_id, "turn_ended", {"stop_reason": how})

    async def _closing(self, session_id: str, event_type: str, payload: dict[str, Any]) -> Event:
        """Append an event that closes a turn. One the log refuses as it is (a lone surrogate in an error's
        text, one too big for its max_payload_bytes, a write that failed) is written once more, minimal: every
        string made storable (`storable`). One refused even so raises: a turn must never stay open quietly."""
        try:
            return await self._append(session_id, event_type, payload)
        except Exception as refused:
            log.warning("workbench: the log refused %s of session %s as it was (%s); writing it minimal", event_type,
                        session_id, storable(str(refused)))
            try:
                return await self._append(session_id, event_type, _map_strings(payload, storable))
            except Exception as e:
                raise RuntimeError(f"the turn of session {session_id} cannot be closed: the log refused its {event_type} "
                                   f"twice, the second time a minimal one ({type(e).__name__}: {storable(str(e))}); "
                                   "it stays open until it is resumed") from refused

    async def _finish_cut_off(self, session_id: str, call: dict[str, Any]) -> ToolOutput:
        """A cut-off call's result: its tool's `resume` re-attaches to work that outlived the process;
        any other call is answered "interrupted; state unknown" and never re-run."""
        tool = self._tool(call)
        if tool is None or tool.resume is None:
            return _error(CUT_OFF_CALL, interrupted=True)
        return await self._call(session_id, call, resuming=True)

    async def _answer_pending(self, session_id: str, why: str, printed: Mapping[str, LiveCall] = MappingProxyType({}),
                              how: str = "interrupted") -> None:
        """Give an error result to every tool call of the open turn that has none (part of its closing); a call
        that printed before it was cut short keeps what it printed (`printed`: its live output; `how` it ended)."""
        st = await self.turn_state(session_id)
        for call in tool_uses(st.last_message or {}):
            if call["id"] not in st.answered:
                live = printed.get(call["id"])
                if call["id"] not in st.started:
                    out = _error("not run: the turn was interrupted before this call started", interrupted=True)
                elif live is not None and live.total:
                    out = _cut_short(why, how, live)
                else:
                    out = _error(why, interrupted=True)
                await self._result(session_id, call, out, closing=True)

    async def _resume(self, session_id: str) -> str:
        """Finish a cut-off turn (its `resumed` is committed): answer cut-off calls, then go on."""
        st = await self.turn_state(session_id)
        msg = st.last_message
        if msg is not None:
            calls = tool_uses(msg)
            if msg.get("stop_reason") == "tool_use" and calls:
                # a call that started but has no result is never re-run: its effect is unknown
                cut = [c for c in calls if c["id"] in st.started and c["id"] not in st.answered]
                await self._answer_in_order(session_id, [(c, self._finish_cut_off(session_id, c)) for c in cut])
                st = await self.turn_state(session_id)
                await self._run_tools(session_id, [c for c in calls if c["id"] not in st.answered], run=True)
            elif msg.get("stop_reason") not in ("pause_turn", "compaction"):
                await self._run_tools(session_id, [c for c in calls if c["id"] not in st.answered], run=False)
                return await self._end(session_id, msg.get("stop_reason") or "unknown")
        return await self._loop(session_id)

    # -- lifetime ----------------------------------------------------------------

    async def close(self, timeout: float = 30.0) -> None:
        """Interrupt running turns (recorded as interrupted), stop every session's hands, close the models."""
        for sid in self.turns.sessions():
            self._cancelled_by[sid] = "shutdown"
        await self.turns.close(timeout)
        self._unsubscribe()
        self._views.clear()
        hands, self._hands = list(self._hands.values()), {}
        await asyncio.gather(*(h.shutdown() for h in hands), return_exceptions=True)
        for m in self._models.values():
            aclose = getattr(m, "aclose", None)  # a Model may hold a client; the protocol does not require one
            if aclose is not None:
                await aclose()

    async def close_session(self, session_id: str) -> None:
        """Forget a session's cached events and stop its hands (it may be used again later)."""
        self._views.pop(session_id, None)
        hands = self._hands.pop(session_id, None)
        if hands is not None:
            await hands.shutdown()


# keys whose string values are base64 (an image block's data, a bundle's images, an SVG rendered as PNG)
BASE64_KEYS = ("data", "svg_png", "image/png", "image/jpeg", "image/gif", "image/webp")


class _View:
    """What the brain keeps of one session: its fold, the committed events not yet folded in, and who last used it."""

    def __init__(self) -> None:
        self.conv = Conversation()
        self.inbox: deque[Event] = deque()
        self.lock = asyncio.Lock()
        self.used = 0
        self.marked = 1  # the request_from this process recorded (1: none; after a cold read, recorded once again)


def _map_strings(value: Any, fn: Callable[[str], str], skip: tuple[str, ...] = ()) -> Any:
    """A copy of a JSON value with fn applied to every string (not to a string under a key in `skip`, e.g. image data)."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        return [_map_strings(v, fn, skip) for v in value]
    if isinstance(value, dict):
        return {k: (v if k in skip and isinstance(v, str) else _map_strings(v, fn, skip)) for k, v in value.items()}
    return value


MINIMAL_CHARS = 200  # each string of a closing event written minimal: room for any max_payload_bytes but a tiny one


def storable(text: str) -> str:
    """Text every log stores and every terminal shows: a lone surrogate and NUL escaped (`\\ud800`, `\\x00`),
    at most MINIMAL_CHARS characters."""
    safe = printable(text)
    return safe if len(safe) <= MINIMAL_CHARS else safe[:MINIMAL_CHARS - 3] + "..."


def _batches(calls: list[dict[str, Any]], concurrent: Callable[[dict[str, Any]], bool]) -> list[list[dict[str, Any]]]:
    """The calls in order, grouped: consecutive concurrent ones together, every other call alone."""
    out: list[list[dict[str, Any]]] = []
    for call in calls:
        if out and concurrent(call) and concurrent(out[-1][-1]):
            out[-1].append(call)
        else:
            out.append([call])
    return out


def _error(text: str, **details: Any) -> ToolOutput:
    return ToolOutput([{"type": "text", "text": text}], True, details)


def _cut_short(why: str, how: str, live: LiveCall) -> ToolOutput:
    """The result of a call cut short after it printed: its output so far (the latest PRINTED_KEPT_CHARS
    characters), then why it stopped, as an observation: the model reads "[interrupted after it printed:] ...",
    a person sees the output the call showed live, then the interrupt."""
    text = live.kept[-PRINTED_KEPT_CHARS:]
    skipped = live.total - len(text)
    obs = Observation(outputs=[{"output_type": "stream", "name": "stdout", "text": text}],
                      error={"ename": "Interrupted", "evalue": why, "traceback": [f"[{why}]"]},
                      notes=[f"[{how} after it printed:]"])
    if skipped:
        obs.truncated = [f"[the first {skipped:,} characters it printed are not kept]"]
    return ToolOutput(content=None, is_error=True, details={"observation": obs.to_json(), "interrupted": True})


def replayable_calls(events: list[Any]) -> list[dict[str, Any]]:
    """Successful `python` calls the model marked replayable, in order: [{tool_use_id, code}]."""
    code = {e.payload["tool_use_id"]: e.payload["input"].get("code") for e in events
            if e.type == "tool_started" and e.payload.get("name") == "python"}
    return [{"tool_use_id": e.payload["tool_use_id"], "code": code[e.payload["tool_use_id"]]} for e in events
            if e.type == "tool_result" and e.payload.get("replayable") and not e.payload.get("is_error")
            and isinstance(code.get(e.payload["tool_use_id"]), str)]


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
