"""Building the model request from the session log, and reading where a turn stands.

The request is a pure function of the events: the system prompt, tools and
model settings frozen in `session_created`, then the messages, append-only,
with every assistant turn exactly as the API returned it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..log import Event


def tool_uses(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for b in message.get("content", []) if b.get("type") == "tool_use"]


def build_request(events: list[Event]) -> dict[str, Any]:
    """The Messages API request body for the next model call of a session."""
    created = events[0]
    assert created.type == "session_created", "a session's first event is session_created"
    frozen = created.payload
    messages: list[dict[str, Any]] = []
    results: dict[str, dict[str, Any]] = {}
    order: list[str] = []  # tool_use ids awaiting results, in the assistant's order

    def flush_results() -> None:
        if order:
            blocks = [results[i] for i in order if i in results]
            messages.append({"role": "user", "content": blocks})
            order.clear()
            results.clear()

    for e in events[1:]:
        if e.type == "user_message":
            text_block = {"type": "text", "text": e.payload["text"]}
            if order:
                flush_results()
                messages[-1]["content"].append(text_block)
            else:
                messages.append({"role": "user", "content": [text_block]})
        elif e.type == "assistant_turn":
            msg = e.payload["message"]
            if msg.get("stop_reason") == "refusal":
                continue  # refused turns are recorded but not sent back (their content may be empty)
            flush_results()
            messages.append({"role": "assistant", "content": msg["content"]})
            order.extend(b["id"] for b in tool_uses(msg))
        elif e.type == "tool_result":
            p = e.payload
            block = {"type": "tool_result", "tool_use_id": p["tool_use_id"], "content": p["content"]}
            if p.get("is_error"):
                block["is_error"] = True
            results[p["tool_use_id"]] = block
    flush_results()
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
    return request


@dataclass
class TurnState:
    """Where a session's latest turn stands, read from its log."""

    open: bool = False  # a turn started and has not ended
    last_message: dict[str, Any] | None = None  # the latest assistant turn of the open turn
    answered: set[str] = field(default_factory=set)  # tool_use ids with a result
    started: set[str] = field(default_factory=set)  # tool_use ids whose start was recorded
    pauses: int = 0


def turn_state(events: list[Event]) -> TurnState:
    """Read the state of the latest turn from the events."""
    st = TurnState()
    for e in events:
        if e.type == "user_message":
            st = TurnState(open=True)
        elif e.type == "turn_ended":
            st = TurnState(open=False)
        elif e.type == "assistant_turn" and st.open:
            st.last_message = e.payload["message"]
            st.answered, st.started = set(), set()
            if st.last_message.get("stop_reason") == "pause_turn":
                st.pauses += 1
        elif e.type == "tool_started" and st.open:
            st.started.add(e.payload["tool_use_id"])
        elif e.type == "tool_result" and st.open:
            st.answered.add(e.payload["tool_use_id"])
    return st
