"""Live output: what a running call's kernel sends, as it arrives, for whoever watches the call.

The execute loop hands each message of the call to `forward` along with the caller's sink
(`OutputSink`, optional, given to `Hands.execute`). Stream text goes on as it is; a display, a
result or an error becomes a short note. The content comes from kernel code: anything that is
not the expected shape is skipped here (the observation notes it). A sink that raises is
logged and never breaks the call. None of this is stored: the call's observation is the record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from . import clean

log = logging.getLogger("workbench.hands")

# (kind, text): kind is "stdout", "stderr" or "note"; called on the event loop, must not block.
OutputSink = Callable[[str, str], None]

MAX_NOTE_CHARS = 200  # a result's or an error's text in its note


def piece(msg_type: str, content: dict[str, Any]) -> tuple[str, str] | None:
    """(kind, text) of one iopub message of a call, or None for what watchers need not see."""
    if msg_type == "stream":
        text = content.get("text")
        if isinstance(text, str) and text:
            return ("stdout" if content.get("name") == "stdout" else "stderr"), text
        return None
    if msg_type == "execute_result":
        data = content.get("data")
        plain = data.get("text/plain") if isinstance(data, dict) else None
        return "note", f"[result] {_short(plain) if isinstance(plain, str) else '(not text)'}\n"
    if msg_type in ("display_data", "update_display_data"):
        data = content.get("data")
        kinds = ", ".join(str(k)[:60] for k in list(data)[:5]) if isinstance(data, dict) else "?"
        verb = "display updated" if msg_type == "update_display_data" else "display"
        return "note", f"[{verb}: {kinds}]\n"
    if msg_type == "error":
        ename, evalue = content.get("ename"), content.get("evalue")
        return "note", f"[error] {_short(str(ename))}: {_short(str(evalue))}\n"
    if msg_type == "clear_output":
        return "note", "[output cleared]\n"
    return None


def forward(sink: OutputSink | None, msg_type: str, content: Any) -> None:
    """Give one message of a running call to its sink, if it has one and the message shows something."""
    if sink is None or not isinstance(content, dict):
        return
    got = piece(msg_type, content)
    if got is None:
        return
    kind, text = got
    try:
        sink(kind, clean.text(text))  # no lone surrogates: every watcher can encode it
    except Exception:  # a watcher's failure is not the call's
        log.exception("workbench: a live output sink failed")


def _short(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= MAX_NOTE_CHARS else one[:MAX_NOTE_CHARS - 1] + "…"
