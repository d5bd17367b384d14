"""Scrubbing: the one exception to append-only (docs/events.md, "Redaction").

A redaction (of a memory that held a secret or personal data) replaces every
copy of some texts in stored payloads and session titles, in place, and the
caller appends a `redacted` tombstone to each session it changed, in the same
transaction. Every string value is scrubbed, wherever it sits in the payload;
the opaque `signature` and `data` of thinking blocks are left alone (they hold
no text). A thinking block whose thinking held a text is dropped from its turn,
signature and all: a signature would no longer match the changed thinking, and
the API accepts earlier turns without their thinking blocks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import orjson

from .payload import decode_payload

OPAQUE = frozenset({"signature", "data"})


def scrub_text(text: str, targets: Sequence[str], replacement: str) -> str:
    for t in targets:
        if t in text:
            text = text.replace(t, replacement)
    return text


def scrub_value(value: Any, targets: Sequence[str], replacement: str) -> Any:
    """value with every occurrence of each target (longest first) in its strings replaced."""
    if isinstance(value, str):
        return scrub_text(value, targets, replacement)
    if isinstance(value, dict):
        return {k: v if k in OPAQUE else scrub_value(v, targets, replacement) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_value(v, targets, replacement) for v in value if not _thinking_with(v, targets)]
    return value


def _thinking_with(block: Any, targets: Sequence[str]) -> bool:
    if not isinstance(block, dict) or block.get("type") != "thinking" or not isinstance(block.get("thinking"), str):
        return False
    return any(t in block["thinking"] for t in targets)


def ordered(targets: Sequence[str]) -> list[str]:
    """The targets to scrub, longest first (so a text is replaced whole before a part of it), without empties."""
    return sorted({t for t in targets if isinstance(t, str) and t}, key=lambda t: (-len(t), t))


def scrub_payload(raw: str | bytes, targets: Sequence[str], replacement: str) -> bytes | None:
    """The stored payload with the targets scrubbed, as the JSON to store; None when nothing changes."""
    before = decode_payload(raw)
    after = scrub_value(before, targets, replacement)
    return None if after == before else orjson.dumps(after)


def needles(targets: Sequence[str]) -> list[str]:
    """How each target can appear inside stored JSON text: as orjson writes it, and as json.dumps
    (ASCII escapes) wrote older rows; a quick filter before payloads are decoded."""
    out: set[str] = set()
    for t in targets:
        out.add(orjson.dumps(t).decode("utf-8")[1:-1])
        out.add(json.dumps(t)[1:-1])
    return sorted(out)
