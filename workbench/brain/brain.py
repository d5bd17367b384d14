"""The brain: the harness loop, stateless between steps; `Brain` is what the rest of the code holds.

Everything it knows it reads back from the session log. A host passes in its
collaborators: the log, a way to make models, a way to make hands, the tools,
what plugins add to a new session's system prompt and how they say that they
drive a session. `Brain` builds its parts, each one idea, and starts turns on
them:

    turns.py   which turn runs where; whether a session is at work
    views.py   what is kept of each session, and every write to its log
    calls.py   tool calls in the session's hands, recorded
    loop.py    one turn, from its first event to turn_ended

Starting a turn returns the committed `user_message`, and a turn always ends
with `turn_ended`, whatever stops it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, KeyReused, TurnBusy
from ..hands import Hands
from ..log import Event, SessionLog
from .calls import Calls, HandsMaker
from .live import LiveOutput, OutputListener
from .loop import DeltaListener, Loop
from .models import Model, make_model
from .request import Conversation, TurnState
from .sessions import PromptHook, session_payload
from .tools import BUILTIN_TOOLS, Tool, tool_named
from .turns import Driver, Turns
from .views import Views


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
        log: SessionLog,
        *,
        hands_factory: HandsMaker | None,
        settings: BrainSettings | None = None,
        model_factory: Callable[[str], Model] = make_model,
        tools: Mapping[str, Tool] = BUILTIN_TOOLS,
        prompt_hooks: Sequence[PromptHook] = (),
        redact: Callable[[str], str] | None = None,
        drivers: Sequence[Driver] = (),
    ):
        self.log = log
        self.settings = settings or BrainSettings()
        self.model_factory = model_factory
        self.tools = tools
        self.prompt_hooks = tuple(prompt_hooks)
        self.turns = Turns(drivers)  # the plugins' `driving` hooks: a session they drive counts as at work
        self.live = LiveOutput(redact)  # running calls' output as it arrives: heard, never logged
        self.views = Views(log, self.turns, self.settings.session_cache)
        self.calls = Calls(log, self.views, tools=tools, live=self.live, hands_factory=hands_factory, redact=redact)
        self.loop = Loop(self.views, self.calls, self.model, self.settings)
        self._models: dict[str, Model] = {}

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
        """The session's request and turn state, up to date with the log (kept per session: brain/views.py)."""
        return await self.views.conversation(session_id)

    async def turn_state(self, session_id: str) -> TurnState:
        """Where the session's latest turn stands (a copy)."""
        return await self.views.turn_state(session_id)

    def listen(self, fn: DeltaListener) -> Callable[[], None]:
        """Hear every live stream event (not logged) of every session."""
        return self.loop.listen(fn)

    def listen_output(self, fn: OutputListener) -> Callable[[], None]:
        """Hear the live output of every session's running tool calls (brain/live.py; not logged)."""
        return self.live.listen(fn)

    def hands_state(self, session_id: str) -> str:
        """The state of the session's hands ("busy" while a call runs), "not started" before they exist."""
        return self.calls.hands_state(session_id)

    def model(self, name: str) -> Model:
        """The model called `name` (made once): UnknownModel / MissingAPIKey."""
        if name not in self._models:
            self._models[name] = self.model_factory(name)
        return self._models[name]

    async def hands(self, session_id: str) -> Hands:
        """This session's hands (made on first use; the kernel starts lazily)."""
        return await self.calls.hands(session_id)

    # -- turns: start, resume, interrupt ------------------------------------------

    async def start_turn(self, session_id: str, text: str, *, name_untitled: bool = False, key: str | None = None,
                         attachments: list[dict[str, Any]] | None = None) -> Event:
        """Append the user's message and start the turn in the background; returns the committed event.
        name_untitled: a session with no title is named after this message (`session_renamed`, auto),
        in the same transaction as the message, so the title is there exactly when the message is.
        key: the client's idempotency key, stored with the message: the same message sent again with it (a
        retry) starts nothing and returns the first one's event; another message with it is KeyReused.
        attachments: notebook context stored with the message, checked already (checks.check_attachments)."""
        event, _ = await self._start(session_id, text, name_untitled, key, attachments)
        return event

    async def run_turn(self, session_id: str, text: str, *, interrupted_by: str = "user",
                       name_untitled: bool = False, attachments: list[dict[str, Any]] | None = None) -> str:
        """Run a turn to its end; returns the stop reason. Cancelling the caller interrupts the turn, recorded
        as interrupted by `interrupted_by` (an eval run, a dream's driver: not a person). name_untitled: as
        for start_turn."""
        _, task = await self._start(session_id, text, name_untitled, attachments=attachments)
        assert task is not None  # only a message with a key is ever found sent before
        return await self._await_turn(session_id, task, interrupted_by)

    async def start_resume(self, session_id: str, *, close_by: str | None = None) -> bool:
        """Resume a turn that was cut off, in the background; False when there is none. close_by: only close it,
        as interrupted by `close_by` (an eval run, for which a cut-off try is an error whatever it does next)."""
        await self._made(session_id)
        async with self.turns.lock(session_id):
            if self.turns.running(session_id):
                # a turn whose turn_ended is committed (a client may answer it at once) is only finishing up
                if (await self.turn_state(session_id)).open or not await self.turns.settle(session_id):
                    raise TurnBusy(f"a turn is already running in session {session_id}")
            if not (await self.conversation(session_id)).state.open:
                return False
            await self._spawn(session_id, None, close_by=close_by)
            return True

    async def resume(self, session_id: str, *, interrupted_by: str = "user", close_by: str | None = None) -> str | None:
        """Finish a turn that was cut off; the stop reason, or None when there is nothing to finish. Cancelling
        the caller interrupts the turn, recorded as by `interrupted_by`. close_by: as for start_resume."""
        if not await self.start_resume(session_id, close_by=close_by):
            return None
        task = self.turns.task(session_id)
        return await self._await_turn(session_id, task, interrupted_by) if task is not None else None

    async def interrupt(self, session_id: str, by: str = "user") -> bool:
        """Interrupt the running turn (it records `interrupted` and ends); True if one was running."""
        await self.conversation(session_id)  # UnknownSession first
        async with self.turns.lock(session_id):
            if not self.turns.running(session_id):
                return False
            self.loop.interrupted_by[session_id] = by
            return await self.turns.cancel(session_id)

    def running(self, session_id: str) -> bool:
        """Whether a turn of the session runs here now (`turns.at_work` also counts a plugin driving it between turns)."""
        return self.turns.running(session_id)

    def running_sessions(self) -> list[str]:
        """The sessions whose turn runs in this brain now."""
        return self.turns.sessions()

    def turn_task(self, session_id: str) -> asyncio.Task | None:
        """The session's running turn (to wait for or watch), None when none runs."""
        return self.turns.task(session_id)

    async def wait_turn(self, session_id: str) -> str | None:
        """Wait for the session's running turn, if any (not cancelling it when the waiter is); its stop reason."""
        task = self.turns.task(session_id)
        return await asyncio.shield(task) if task is not None else None

    async def _await_turn(self, session_id: str, task: asyncio.Task, interrupted_by: str) -> Any:
        """The turn's result; a cancel of the caller interrupts the turn, recorded as by `interrupted_by`."""
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                self.loop.interrupted_by.setdefault(session_id, interrupted_by)
                task.cancel()
                await asyncio.wait({task})
            raise

    async def _made(self, session_id: str) -> None:
        """The session's model made (once), off the event loop: an SDK import and client take seconds."""
        conv = await self.conversation(session_id)
        model: str = (conv.frozen or {})["model"]  # session_payload always writes it; the request reads it so too
        if model not in self._models:
            await asyncio.to_thread(self.model, model)

    async def _start(self, session_id: str, text: Any, name_untitled: bool = False, key: str | None = None,
                     attachments: list[dict[str, Any]] | None = None) -> tuple[Event, asyncio.Task | None]:
        if not isinstance(text, str) or not text.strip():
            raise ConfigError("the message is empty")
        await self._made(session_id)
        busy = f"a turn is already running in session {session_id}; wait for it or interrupt it"
        async with self.turns.lock(session_id):
            # under the lock: a retry racing its first send finds the first's message committed (or commits its own)
            sent = (await self.conversation(session_id)).keys.get(key) if key is not None else None
            if sent is not None:
                return await self._sent_before(session_id, key, text, attachments, *sent), None
            if self.turns.running(session_id):
                if (await self.conversation(session_id)).state.open:
                    raise TurnBusy(busy)
                # its turn_ended is committed (a client may answer it at once): it is only finishing up
                if not await self.turns.settle(session_id):
                    raise TurnBusy(busy)
            elif (await self.conversation(session_id)).state.open:
                raise TurnBusy(f"session {session_id} has an unfinished turn; resume it or interrupt it first")
            return await self._spawn(session_id, text, name_untitled, key, attachments=attachments)

    async def _sent_before(self, session_id: str, key: Any, text: str, attachments: list[dict[str, Any]] | None,
                           seq: int, first: str) -> Event:
        """The user_message a key was first sent with, when this is the same message again (its text and its
        attachments); else KeyReused."""
        event = (await self.log.aevents(session_id, seq - 1, until=seq))[0] if text == first else None
        if event is None or (event.payload.get("attachments") or None) != (attachments or None):
            raise KeyReused(f"idempotency key {key!r} was sent before with another message (seq {seq} of session "
                            f"{session_id}); send a new message with a new key")
        return event

    async def _spawn(self, session_id: str, text: str | None, name_untitled: bool = False,
                     key: str | None = None, close_by: str | None = None,
                     attachments: list[dict[str, Any]] | None = None) -> tuple[Any, asyncio.Task]:
        """Start the turn's task; wait (not cancellably) until its first event is committed."""
        started: asyncio.Future = asyncio.get_running_loop().create_future()
        task = self.turns.spawn(session_id, lambda: self.loop.turn(session_id, text, started, name_untitled, key, close_by,
                                                                   attachments))

        def never_started(t: asyncio.Task) -> None:
            # cancelled before its first step (a shutdown's cancel landing just after the spawn): the turn wrote
            # nothing, and its starter, waiting for its first event, must hear so rather than wait for ever
            if not started.done():
                started.set_exception(TurnBusy(f"the turn in session {session_id} was stopped before it started "
                                               "(the workbench is shutting down); nothing was written"))

        task.add_done_callback(never_started)
        return await asyncio.shield(started), task

    # -- lifetime ----------------------------------------------------------------

    async def close(self, timeout: float = 30.0) -> None:
        """Interrupt running turns (recorded as interrupted), stop every session's hands, close the models."""
        for sid in self.turns.sessions():
            self.loop.interrupted_by[sid] = "shutdown"
        await self.turns.close(timeout)
        self.views.close()
        await self.calls.close()
        for m in self._models.values():
            aclose = getattr(m, "aclose", None)  # a Model may hold a client; the protocol does not require one
            if aclose is not None:
                await aclose()

    async def close_session(self, session_id: str) -> None:
        """Forget a session's cached events and stop its hands (it may be used again later)."""
        self.views.forget(session_id)
        await self.calls.forget(session_id)
