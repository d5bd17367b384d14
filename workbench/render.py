"""Events as text: the one renderer the CLI, the notebook client, the review panels and dreams share.

Each surface frames an event its own way (a CLI line with the time, a dream's
`#seq type` header, a panel's box), but what an event *says* is written here
once. Plain text only: whoever puts it into HTML escapes it there.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from .attachments import label


def parts(event: Any) -> tuple[int, str, Mapping[str, Any]]:
    """(seq, type, payload) of an Event or of its JSON form."""
    if isinstance(event, Mapping):
        return int(event.get("seq") or 0), str(event.get("type")), event.get("payload") or {}
    return event.seq, event.type, event.payload


def compact(value: Any, limit: int | None = None) -> str:
    """A JSON value on one line (non-ASCII kept), cut to `limit` characters."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if limit is None or len(text) <= limit else text[:limit] + "…"


def tool_input(name: Any, inp: Any) -> str:
    """A tool call's input: a python call's code as it is, any other input as JSON."""
    if name == "python" and isinstance(inp, Mapping) and isinstance(inp.get("code"), str):
        return inp["code"]
    return compact(inp)


def result_blocks(payload: Mapping[str, Any]) -> list[Any]:
    """The content blocks a tool result gave the model: as stored, or rendered from its observation (a python
    call's result keeps its outputs once: hands/observing, docs/events.md)."""
    content = payload.get("content")
    if isinstance(content, list) or not isinstance(payload.get("observation"), Mapping):
        return content if isinstance(content, list) else []
    from .hands.observing import result_content  # only here: what renders outputs is the hands', and this stays cheap

    return result_content(dict(payload))


def result_text(payload: Mapping[str, Any]) -> str:
    """The text a tool result gave the model, with a note per image."""
    blocks = [b for b in result_blocks(payload) if isinstance(b, Mapping)]
    texts = [str(b.get("text", "")) for b in blocks if b.get("type") == "text"]
    images = sum(1 for b in blocks if b.get("type") == "image")
    return "\n".join(texts + ([f"[{images} image(s)]"] if images else []))


def assistant_lines(message: Mapping[str, Any], *, thinking: bool = False) -> list[str]:
    """An assistant turn's text blocks and tool calls (`→ name input`); thinking as a note when asked."""
    out = []
    for b in message.get("content") or []:
        if not isinstance(b, Mapping):
            continue
        kind = b.get("type")
        if kind == "text":
            out.append(str(b.get("text", "")))
        elif kind == "tool_use":
            out.append(f"→ {b.get('name')} {compact(b.get('input'), 500)}")
        elif thinking and kind == "thinking":
            out.append(f"(thinking, {len(str(b.get('thinking', '')))} chars, signed)")
        elif thinking and kind == "redacted_thinking":
            out.append("(redacted thinking)")
    return out


def event_text(event: Any, *, thinking: bool = False) -> str:
    """What one event says, as plain text (no seq, time or type: the caller frames it)."""
    _, kind, p = parts(event)
    if kind == "user_message":
        # its notebook context (workbench/attachments.py) named, not repeated: the cells are the person's own
        attached = [f"[attached: {label(a)}]" for a in p.get("attachments") or [] if isinstance(a, Mapping)]
        return "\n".join([*attached, str(p.get("text", ""))])
    if kind == "assistant_turn":
        return "\n".join(assistant_lines(p.get("message") or {}, thinking=thinking))
    if kind == "tool_started":
        return tool_input(p.get("name"), p.get("input"))
    if kind == "tool_result":
        return ("ERROR " if p.get("is_error") else "") + result_text(p)
    if kind == "session_created":
        return f"title: {p.get('title')}\nmodel: {p.get('model')}"
    if kind == "delegate_checked":
        return f"check {'passed' if p.get('passed') else 'failed'}: {p.get('explanation')}"
    if kind == "memories_injected":
        return "recalled memories: " + ", ".join(str(m.get("id")) for m in p.get("memories") or [] if isinstance(m, Mapping))
    return compact(p)


def assistant_meta(payload: Mapping[str, Any]) -> str:
    """An assistant turn's stop reason, latency and usage, on one line."""
    m = payload.get("message") or {}
    return f"stop={m.get('stop_reason')} latency={payload.get('latency_ms')}ms usage={compact(m.get('usage'))}"


def safe_text(text: str) -> str:
    """Text for a terminal: control characters (escape sequences, carriage returns, bidi overrides) shown
    as U+FFFD, newlines and tabs kept; what a model or a title holds must not move the cursor or recolour it."""
    return "".join(c if c in "\n\t" or unicodedata.category(c) not in ("Cc", "Cf", "Cs") else "\ufffd" for c in text)


def width(text: str) -> int:
    """Columns a terminal gives text: wide (East Asian) characters take two, combining marks none."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def one_line(text: str, limit: int) -> str:
    """Whitespace (newlines included) collapsed to single spaces, control characters made visible, cut to
    `limit` columns."""
    flat = safe_text(" ".join(text.split()))
    if width(flat) <= limit:
        return flat
    out, used = [], 0
    for c in flat:
        w = width(c)
        if used + w > max(0, limit - 1):
            break
        out.append(c)
        used += w
    return "".join(out) + "…"


def table(rows: Sequence[Sequence[Any]], head: Sequence[str], widths: Sequence[int], last: int = 120) -> str:
    """Rows as a fixed-width table: each cell on one line and cut to its width (the last to `last` columns)."""
    def line(cells: Sequence[Any]) -> str:
        out = []
        for i, c in enumerate(cells):
            text = one_line("" if c is None else str(c), widths[i] if i < len(widths) else last)
            out.append(text + " " * (widths[i] - width(text)) if i < len(widths) else text)
        return "  ".join(out).rstrip()

    return "\n".join([line(head), *(line(r) for r in rows)])
