"""Building the model request from the session log, and reading where a turn stands.

The request is a pure function of the events: the system prompt, tools and
model settings frozen in `session_created`, then the messages, append-only,
with every assistant turn exactly as the API returned it.

`Conversation` folds events into that request one at a time: the log is
append-only, so the message list only grows (a tool result joins the
assistant turn that asked for it, a user's text joins pending results), and
a step costs what is new, not the whole history. `build_request(events)` is
the same fold from scratch; tests hold the two equal.

Long sessions (docs/settings.md, `context`): with `compact` the request asks
the API for server-side compaction (beta `compact-2026-01-12`); the API
answers with a `compaction` block, stored verbatim in the assistant turn like
a thinking block, and ignores everything before it, so requests start at the
user message (text only) that opened the turn of the latest compaction. With `clear` (endpoints without
compaction) the results of old tool calls are replaced by a short note once
the estimated context passes the trigger; assistant turns, and so every
thinking block, are never touched, nor is anything of the latest turns. With `turn` (a dream's chunks: each turn is given all it needs)
every turn starts afresh: its requests hold only the messages since the user message that opened it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..attachments import context_blocks
from ..hands.observing import result_content
from ..log import Event

COMPACT_BETA = "compact-2026-01-12"
COMPACT_EDIT = "compact_20260112"
CLEARED = "[cleared to keep the conversation within the context window: an old tool result]"
# the events a request or a turn's state depends on: what a cold load reads
REQUEST_TYPES = ("session_created", "user_message", "assistant_turn", "tool_started", "tool_result", "turn_ended")


def tool_uses(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for b in message.get("content", []) if b.get("type") == "tool_use"]


def context_request(context: dict[str, Any] | None) -> dict[str, Any]:
    """What a session's frozen `context` setting adds to every request (compaction's edit and beta)."""
    if not context or context.get("mode") != "compact":
        return {}
    edit = {"type": COMPACT_EDIT, "trigger": {"type": "input_tokens", "value": int(context["trigger"])}}
    return {"context_management": {"edits": [edit]}, "betas": [COMPACT_BETA]}


def _tokens(value: Any) -> int:
    """A rough token count: 4 bytes of JSON a token (what the fake API counts too)."""
    return len(orjson.dumps(value)) // 4 + 1


@dataclass
class TurnState:
    """Where a session's latest turn stands, read from its log."""

    open: bool = False  # a turn started and has not ended
    last_message: dict[str, Any] | None = None  # the latest assistant turn of the open turn
    answered: set[str] = field(default_factory=set)  # tool_use ids with a result
    started: set[str] = field(default_factory=set)  # tool_use ids whose start was recorded
    pauses: int = 0

    def copy(self) -> TurnState:
        return TurnState(self.open, self.last_message, set(self.answered), set(self.started), self.pauses)


class Conversation:
    """A session's request and turn state, maintained event by event (feed them in seq order)."""

    def __init__(self) -> None:
        self.frozen: dict[str, Any] | None = None
        self.messages: list[dict[str, Any]] = []  # complete messages; only the clear fallback rewrites old ones
        self.state = TurnState()
        self.seq = 0  # the last event folded in
        self.keys: dict[str, tuple[int, str]] = {}  # a message's idempotency key -> (its seq, its text)
        self._tokens: list[int] = []  # estimated tokens of each message
        self._results: dict[str, dict[str, Any]] = {}  # results awaiting the next message, by tool_use id
        self._order: list[str] = []  # tool_use ids of the latest assistant turn, in its order
        self._start = 0  # index of the first message sent (after a compaction: see feed)
        self._opened = 0  # index of the latest user message that holds only text
        self._opened_seq = 0  # and the seq of its user_message
        # the seq a cold read may start from (with session_created): the user message the latest compaction's
        # requests start at; 1 before any compaction
        self.start_seq = 1
        self._cleared = 0  # messages before this index had their tool results cleared
        self._base = 0  # estimated tokens of system prompt and tools
        self._clearing = 0  # the trigger when old tool results are cleared (context mode `clear`), else 0
        self._per_turn = False  # context mode `turn`: a request holds only its own turn's messages

    def feed_all(self, events: Iterable[Event]) -> Conversation:
        for e in events:
            self.feed(e)
        return self

    def feed(self, e: Event) -> None:
        self.fold(e.seq, e.type, e.payload)

    def fold(self, seq: int, t: str, p: dict[str, Any]) -> None:
        """Fold in the event `seq` of type `t` with payload `p` (the payload is kept, never changed)."""
        self.seq = seq
        st = self.state
        if t == "session_created":
            self.frozen = p
            self._base = _tokens([p.get("system"), p.get("tools")])
            context = p.get("context") or {}
            self._clearing = int(context["trigger"]) if context.get("mode") == "clear" else 0
            self._per_turn = context.get("mode") == "turn"
        elif t == "user_message":
            self.state = TurnState(open=True)
            if isinstance(p.get("idempotency_key"), str):
                self.keys.setdefault(p["idempotency_key"], (seq, p["text"]))
            # the notebook context attached to the message (workbench/attachments.py) goes before its text
            text_blocks = context_blocks(p.get("attachments")) + [{"type": "text", "text": p["text"]}]
            if self._order and not self._per_turn:  # the results the latest assistant turn waits for, then the text
                self._push({"role": "user", "content": self._pending() + text_blocks})
            else:
                if self._per_turn:  # earlier turns are not sent: neither are results still owed to them
                    self._order, self._results = [], {}
                    self._start = len(self.messages)
                self._opened, self._opened_seq = len(self.messages), seq
                self._push({"role": "user", "content": text_blocks})
        elif t == "turn_ended":
            self.state = TurnState(open=False)
        elif t == "assistant_turn":
            msg = p["message"]
            if st.open:
                st.last_message = msg
                st.answered, st.started = set(), set()
                if msg.get("stop_reason") in ("pause_turn", "compaction"):
                    st.pauses += 1
            if msg.get("stop_reason") == "refusal":
                return  # refused turns are recorded but not sent back (their content may be empty)
            if self._order:
                self._push({"role": "user", "content": self._pending()})
            content = msg["content"]
            self._push({"role": "assistant", "content": content})
            if any(b.get("type") == "compaction" for b in content):
                # the API drops what came before the compaction block; we send from the user message that
                # opened the step's turn (text only: no tool result whose call would be missing), so the
                # request keeps the shape the API checks, and stops growing with the session. What came
                # before is not kept either (but by the clear fallback, whose estimates go by message), and
                # a cold read may start there (start_seq).
                if self._clearing:
                    self._start = self._opened
                else:
                    del self.messages[:self._opened]
                    self._start = self._opened = 0
                    self.start_seq = self._opened_seq
            self._order = [b["id"] for b in content if b.get("type") == "tool_use"]
        elif t == "tool_started":
            if st.open:
                st.started.add(p["tool_use_id"])
        elif t == "tool_result":
            if st.open:
                st.answered.add(p["tool_use_id"])
            block = {"type": "tool_result", "tool_use_id": p["tool_use_id"], "content": result_content(p)}
            if p.get("is_error"):
                block["is_error"] = True
            self._results[p["tool_use_id"]] = block

    def _pending(self) -> list[dict[str, Any]]:
        blocks = [self._results[i] for i in self._order if i in self._results]
        self._order, self._results = [], {}
        return blocks

    def _push(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        if self._clearing:
            self._tokens.append(_tokens(message["content"]))
            self._clear(self._clearing, 6)

    def _clear(self, trigger: int, keep: int) -> None:
        """Past the trigger, clear old tool results until the estimate is at half of it (in one go, so
        the prefix changes seldom). Assistant turns are never touched; the last `keep` messages neither."""
        total = self._base + sum(self._tokens[self._start:])
        if total <= trigger:
            return
        stop = len(self.messages) - keep
        i = max(self._cleared, self._start)
        while i < stop and total > trigger // 2:
            m = self.messages[i]
            if m["role"] == "user" and any(b.get("type") == "tool_result" and b.get("content") != CLEARED for b in m["content"]):
                content = [{**b, "content": CLEARED} if b.get("type") == "tool_result" else b for b in m["content"]]
                self.messages[i] = {"role": "user", "content": content}
                before, self._tokens[i] = self._tokens[i], _tokens(content)
                total -= before - self._tokens[i]
            i += 1
        self._cleared = i

    def request(self) -> dict[str, Any]:
        """The Messages API request body for the next model call (fresh lists; the blocks are shared)."""
        frozen = self.frozen
        assert frozen is not None, "a session's first event is session_created"
        messages = self.messages[self._start:]
        if self._order:  # results of the latest assistant turn, not yet followed by anything
            blocks = [self._results[i] for i in self._order if i in self._results]
            messages.append({"role": "user", "content": blocks})
        request = {
            "model": frozen["model"],
            "max_tokens": frozen["max_tokens"],
            "system": frozen["system"],
            "tools": frozen["tools"],
            "messages": messages,
        }
        for key in ("thinking", "output_config", "metadata", "temperature"):
            if frozen.get(key) is not None:
                request[key] = frozen[key]
        extra = context_request(frozen.get("context"))
        betas = [*frozen.get("betas", ()), *extra.pop("betas", ())]  # the tools' (frozen) and compaction's
        request.update(extra)
        if betas:
            request["betas"] = list(dict.fromkeys(betas))
        return request

    def request_size(self) -> int:
        """How many messages `request()` holds, without building it (tool results still owed do not change it)."""
        return len(self.messages) - self._start + (1 if self._order else 0)

    def size_with_message(self) -> int:
        """How many messages `request()` will hold once the next user message is folded in."""
        return 1 if self._per_turn else len(self.messages) - self._start + 1

    def tokens(self) -> int:
        """The estimated input tokens of the next request (4 bytes of JSON a token)."""
        return _tokens(self.request()) if not self._clearing else self._base + sum(self._tokens[self._start:])


def build_request(events: list[Event]) -> dict[str, Any]:
    """The Messages API request body for the next model call of a session, from all its events."""
    assert events and events[0].type == "session_created", "a session's first event is session_created"
    return Conversation().feed_all(events).request()


def turn_state(events: list[Event]) -> TurnState:
    """Read the state of the latest turn from the events."""
    return Conversation().feed_all(events).state
