"""Payloads at the log's edge: strict JSON going in, lenient JSON coming out.

A payload is stored only if every reader can read it back: a JSON object of
objects, arrays, strings, finite numbers, booleans and nulls, with string keys,
valid Unicode, bounded nesting and size. Reading never fails on rows written
before these checks (e.g. the `Infinity` that `json.dumps` let through).
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

from ..errors import InvalidPayload
from .settings import LogSettings

# orjson stores integers of 64 bits; a larger one would fail later, with no path
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


def encode_payload(payload: Any, settings: LogSettings, what: str) -> bytes:
    """The payload as compact UTF-8 JSON, or InvalidPayload saying what to fix."""
    if not isinstance(payload, dict):
        raise InvalidPayload(f"the payload of {what} must be a JSON object, not {type(payload).__name__}")
    _check_tree(payload, settings.max_depth, what)
    try:
        # the walk let only str keys through; the option lets a str subclass (a StrEnum) be one too
        data = orjson.dumps(payload, default=_plain, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError as e:
        if "surrogates" not in str(e):
            raise InvalidPayload(f"the payload of {what} cannot be stored as JSON: {e}") from None
        raise InvalidPayload(
            f"the payload of {what} has a string that is not valid Unicode (a lone surrogate) at "
            f"{_bad_string_path(payload)}; encode binary data as base64 text"
        ) from None
    if len(data) > settings.max_payload_bytes:
        raise InvalidPayload(
            f"the payload of {what} is {len(data):,} bytes as JSON; the log stores at most "
            f"{settings.max_payload_bytes:,} (log setting max_payload_bytes): cut it down before appending"
        )
    return data


def _plain(value: Any) -> Any:
    # what json.dumps took and orjson does not: a float subclass (numpy.float64), a namedtuple
    if isinstance(value, float):
        return float(value)
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _check_tree(root: dict[str, Any], max_depth: int, what: str) -> None:
    # iterative, so a payload nested a million deep costs no stack; a path is a linked
    # (parent, key) pair, turned into text only for the error message
    stack: list[tuple[Any, int, Any]] = [(root, 1, None)]
    while stack:
        node, depth, path = stack.pop()
        if depth > max_depth:
            raise InvalidPayload(
                f"the payload of {what} nests deeper than {max_depth} levels at {_where(path)} (log setting max_depth)"
            )
        is_dict = isinstance(node, dict)
        for key, value in node.items() if is_dict else enumerate(node):
            if is_dict and not isinstance(key, str):
                raise InvalidPayload(f"the payload of {what} has a non-string key {key!r:.40} at {_where(path)}; JSON keys are strings")
            if value is None or isinstance(value, (str, bool)):
                continue
            if isinstance(value, int):
                if not _INT_MIN <= value <= _INT_MAX:
                    raise InvalidPayload(
                        f"the payload of {what} has an integer outside 64 bits at {_where((path, key))}; store it as a string")
                continue
            if isinstance(value, float):
                if not math.isfinite(value):
                    raise InvalidPayload(
                        f"the payload of {what} has {value} at {_where((path, key))}; strict JSON has no NaN or Infinity"
                    )
                continue
            if isinstance(value, (dict, list, tuple)):
                stack.append((value, depth + 1, (path, key)))
                continue
            raise InvalidPayload(
                f"the payload of {what} has a {type(value).__name__} at {_where((path, key))}; "
                "only JSON values (objects, arrays, strings, numbers, booleans, null) can be stored"
            )


def _where(path: Any) -> str:
    keys = []
    while path is not None:
        path, key = path
        keys.append(key)
    keys.reverse()
    parts = [f"[{k}]" if isinstance(k, int) else f".{k[:40]}" if k.isidentifier() else f"[{k[:40]!r}]" for k in keys]
    if len(parts) > 12:  # a path as deep as the payload is no help in one line
        parts = parts[:5] + [f"...({len(parts) - 10} more)..."] + parts[-5:]
    return "$" + "".join(parts)


def _bad_string_path(root: dict[str, Any]) -> str:
    stack: list[tuple[Any, Any]] = [(root, None)]
    while stack:
        node, path = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(key, str) and not encodable(key):
                return _where(path) + " (a key)"
            if isinstance(value, str) and not encodable(value):
                return _where((path, key))
            if isinstance(value, (dict, list, tuple)):
                stack.append((value, (path, key)))
    return "$"


def encodable(text: str) -> bool:
    """Whether text is valid Unicode that UTF-8 (and so DuckDB) can store."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_field(name: str, value: Any, settings: LogSettings, *, optional: bool = False) -> None:
    """Refuse a session id, title, model or kind that is not a short valid string (optional: or None, or empty)."""
    if optional and (value is None or value == ""):
        return
    if not isinstance(value, str) or not value:
        shown = "an empty string" if value == "" else f"a {type(value).__name__}"
        raise InvalidPayload(f"the session's {name} must be a non-empty string, not {shown}")
    if len(value) > settings.max_field_chars:
        raise InvalidPayload(
            f"the session's {name} is {len(value):,} characters; at most {settings.max_field_chars:,} "
            "(log setting max_field_chars)"
        )
    if not encodable(value):
        raise InvalidPayload(f"the session's {name} is not valid Unicode (it has a lone surrogate)")


def decode_payload(raw: str | bytes) -> dict[str, Any]:
    """A stored payload as a dict; never raises, whatever an older version stored."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = _lenient(raw)
    if isinstance(value, dict):
        return value
    return {"unreadable": raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw}


def _finite_or_none(text: str) -> float | None:
    number = float(text)
    return number if math.isfinite(number) else None


def _lenient(raw: str | bytes) -> Any:
    # rows written by json.dumps may hold NaN, Infinity or 1e309: read them as null
    try:
        return json.loads(raw, parse_constant=lambda _: None, parse_float=_finite_or_none)
    except (ValueError, RecursionError):
        return None
