"""What a kernel sends, made fit to keep: valid Unicode, strict JSON, bounded.

Strings from a kernel may hold lone surrogates (JSON's "\\ud800" decodes to one), which no UTF-8
encoder takes, so the session log would refuse the observation; they become U+FFFD here. JSON
values of a display (application/json, *+json) must be strict JSON for the log: finite numbers,
string keys, bounded depth.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

MAX_DEPTH = 32  # JSON nesting kept in a display's value (the log allows 64, and the value sits ~5 deep)


class NotJSON(ValueError):
    """A value that the log could not store as it is (says why)."""


def text(s: str) -> str:
    """`s` with every lone surrogate replaced by U+FFFD (pairs are joined), so it encodes as UTF-8."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def json_value(value: Any, depth: int = 0) -> Any:
    """A copy of a decoded JSON value with its strings fixed; NotJSON for what the log cannot store."""
    if depth > MAX_DEPTH:
        raise NotJSON(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        return text(value)
    if value is None or isinstance(value, (bool, int)):
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
            raise NotJSON("an integer beyond 64 bits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotJSON(f"a number that is not finite ({value})")
        return value
    if isinstance(value, list):
        return [json_value(v, depth + 1) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise NotJSON("a key that is not a string")
            out[text(k)] = json_value(v, depth + 1)
        return out
    raise NotJSON(f"a {type(value).__name__}")


def size(value: Any) -> int:
    """Bytes of a (clean) value as the log stores it: compact UTF-8 JSON, escapes included."""
    return len(orjson.dumps(value))


def cut(s: str, limit: int, what: str) -> str:
    """`s` cut to `limit` characters, saying so."""
    return s if len(s) <= limit else s[:limit] + f"\n[{what} truncated at {limit:,} characters]"
