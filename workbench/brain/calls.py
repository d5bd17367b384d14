"""Tool calls: run in the session's hands, recorded in the log, answered when they cannot finish.

Each call's start (`tool_started`) is committed before it runs and its result after; results are
recorded in the order the model made the calls, even when a run of concurrent calls finishes out
of order. A call whose start is logged but whose result is not (the process running the turn
stopped) is never run again: it is answered "interrupted; state unknown", unless its tool can
re-attach to work that outlived the process (`Tool.resume`). A call cut short by an interrupt or
a failure keeps the tail of what it printed live, as a stopped notebook cell keeps its output.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any

from ..errors import ConfigError
from ..hands import Hands, Observation
from ..log import SessionLog
from .live import LiveCall, LiveOutput
from .request import tool_uses
from .tools import Tool, ToolContext, ToolOutput, tool_named
from .views import Views, map_strings

# (session_id, session config, event sink, replay source) -> that session's hands
HandsMaker = Callable[[str, dict[str, Any], Callable[[str, dict[str, Any]], Awaitable[None]], Any], Hands]

INTERRUPTED_CALL = "interrupted by the user; the call's effect is unknown"
# a cut-short call keeps the tail of what it printed, as a stopped notebook cell keeps its output
PRINTED_KEPT_CHARS = 20_000
CUT_OFF_CALL = ("interrupted; state unknown: the call started but its result was never recorded (the process "
                "running the turn stopped). It was not re-run.")
# keys whose string values are base64 (an image block's data, a bundle's images, an SVG rendered as PNG)
BASE64_KEYS = ("data", "svg_png", "image/png", "image/jpeg", "image/gif", "image/webp")


class Calls:
    """Runs a turn's tool calls in the sessions' hands (made here, one set per session) and records them."""

    def __init__(self, log: SessionLog, views: Views, *, tools: Mapping[str, Tool], live: LiveOutput,
                 hands_factory: HandsMaker | None, redact: Callable[[str], str] | None):
        self.log, self.views, self.tools, self.live = log, views, tools, live
        self.hands_factory = hands_factory
        self.redact = redact
        self._hands: dict[str, Hands] = {}
        # per session: the live output of calls a cancel cut short, until the turn's closing answers them
        self._cut_short: dict[str, dict[str, LiveCall]] = {}

    # -- hands ---------------------------------------------------------------------

    async def hands(self, session_id: str) -> Hands:
        """This session's hands (made on first use; the kernel starts lazily)."""
        if session_id not in self._hands:
            config = ((await self.views.conversation(session_id)).frozen or {}).get("config") or {}
            if session_id not in self._hands:  # another caller may have made them while we read
                if self.hands_factory is None:
                    raise ConfigError("this host runs no code: it was opened without hands")

                async def sink(type: str, payload: dict[str, Any]) -> None:
                    await self.views.append(session_id, type, payload)

                async def replayable() -> list[dict[str, Any]]:  # hands rehydrate from the log through us
                    return replayable_calls(await self.log.aevents(session_id, types=["tool_started", "tool_result"]))

                self._hands[session_id] = self.hands_factory(session_id, config, sink, replayable)
        return self._hands[session_id]

    def hands_state(self, session_id: str) -> str:
        """The state of the session's hands ("busy" while a call runs), "not started" before they exist."""
        hands = self._hands.get(session_id)
        return str(hands.status().get("state")) if hands is not None else "not started"

    async def interrupt(self, session_id: str) -> None:
        """Interrupt what the session's hands run now, if they exist."""
        hands = self._hands.get(session_id)
        if hands is not None:
            await hands.interrupt()

    async def forget(self, session_id: str) -> None:
        """Stop the session's hands (made again on next use)."""
        hands = self._hands.pop(session_id, None)
        if hands is not None:
            await hands.shutdown()

    async def close(self) -> None:
        """Stop every session's hands."""
        hands, self._hands = list(self._hands.values()), {}
        await asyncio.gather(*(h.shutdown() for h in hands), return_exceptions=True)

    # -- a step's calls --------------------------------------------------------------

    async def run(self, session_id: str, calls: list[dict[str, Any]], run: bool) -> None:
        """Run the turn's tool calls; each start and result is its own event, results in the calls' order.

        A run of consecutive calls whose tools say they are `concurrent` runs at once; any other
        call runs alone, after the calls before it have their results. `run` False (the response
        stopped before tool use): each call is answered "not run"."""
        if not run:
            for call in calls:
                await self._result(session_id, call, _error("not run: the response stopped before tool use"))
            return
        for batch in _batches(calls, lambda c: getattr(self._tool(c), "concurrent", False)):
            for call in batch:
                await self.views.append(session_id, "tool_started",
                                        {"tool_use_id": call["id"], "name": call["name"], "input": call["input"]})
            await self._answer_in_order(session_id, [(call, self._call(session_id, call)) for call in batch])

    async def answer_cut_off(self, session_id: str, calls: list[dict[str, Any]]) -> None:
        """Answer calls whose start is logged but whose result is not: a tool's `resume` re-attaches to work that
        outlived the process; any other call is answered "interrupted; state unknown" and never re-run."""
        await self._answer_in_order(session_id, [(c, self._finish_cut_off(session_id, c)) for c in calls])

    def cut_short(self, session_id: str) -> Mapping[str, LiveCall]:
        """The live output of the session's calls a cancel cut short (by call id), handed over once."""
        return self._cut_short.pop(session_id, {})

    async def answer_pending(self, session_id: str, why: str, printed: Mapping[str, LiveCall] = MappingProxyType({}),
                             how: str = "interrupted") -> None:
        """Give an error result to every tool call of the open turn that has none (part of its closing); a call
        that printed before it was cut short keeps what it printed (`printed`: its live output; `how` it ended)."""
        st = await self.views.turn_state(session_id)
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

    def _tool(self, call: dict[str, Any]) -> Tool | None:
        try:
            return tool_named(self.tools, call["name"])
        except ConfigError:
            return None

    async def _finish_cut_off(self, session_id: str, call: dict[str, Any]) -> ToolOutput:
        tool = self._tool(call)
        if tool is None or tool.resume is None:
            return _error(CUT_OFF_CALL, interrupted=True)
        return await self._call(session_id, call, resuming=True)

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
            payload = map_strings(payload, self.redact, skip=BASE64_KEYS)
        if hold:
            self.views.hold(session_id, "tool_result", payload)
        else:
            await (self.views.closing if closing else self.views.append)(session_id, "tool_result", payload)


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
