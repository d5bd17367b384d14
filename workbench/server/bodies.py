"""Checking request bodies before anything is written, so a bad request never half-writes.

Each function takes the decoded JSON and returns clean arguments, or raises
ConfigError with one line that says what to fix (the handler turns it into a 400).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from ..errors import ConfigError

SESSION_FIELDS = ("title", "model", "system", "config", "tools")
THINKING = ("adaptive", "disabled")
EFFORTS = ("low", "medium", "high", "xhigh", "max")



def decode(raw: bytes) -> Any:
    """The JSON of a request body; an empty body is {}."""
    if not raw or not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ConfigError("the body is not valid JSON") from None


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ConfigError("the body must be a JSON object")
    return body


def _optional_str(body: dict[str, Any], key: str, limit: int = 100_000) -> str | None:
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise ConfigError(f'"{key}" must be a string')
    if len(v) > limit:
        raise ConfigError(f'"{key}" is longer than {limit:,} characters')
    return v


def _positive_int(key: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConfigError(f'config "{key}" must be a positive integer')


def _check_hands(v: Any) -> None:
    if not isinstance(v, dict):
        raise ConfigError('config "hands" must be an object (see docs/settings.md, Hands)')
    from ..hands import HandsConfig

    fields = HandsConfig.__dataclass_fields__
    unknown = set(v) - set(fields)
    if unknown:
        raise ConfigError(f"unknown hands settings: {', '.join(sorted(unknown))}; known: {', '.join(fields)}")
    for k, x in v.items():
        default = fields[k].default
        if k == "env":
            if not isinstance(x, dict) or not all(isinstance(a, str) and isinstance(b, str) for a, b in x.items()):
                raise ConfigError('hands "env" must be an object of strings')
        elif k == "workdir":
            if x is not None and not isinstance(x, str):
                raise ConfigError('hands "workdir" must be a string')
        elif isinstance(default, bool):
            if not isinstance(x, bool):
                raise ConfigError(f'hands "{k}" must be true or false')
        elif isinstance(default, (int, float)):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or x <= 0:
                raise ConfigError(f'hands "{k}" must be a positive number')


def _check_thinking(v: Any) -> None:
    if v not in THINKING:
        raise ConfigError(f'config "thinking" must be one of {", ".join(THINKING)}')


def _check_effort(v: Any) -> None:
    if v is not None and v not in EFFORTS:
        raise ConfigError(f'config "effort" must be one of {", ".join(EFFORTS)}')


def _check_egress(v: Any) -> None:
    if not isinstance(v, dict):
        raise ConfigError('config "egress" must be an object (see docs/settings.md, egress)')
    from ..egress.policy import EgressPolicy

    EgressPolicy.from_config(v)


# Per-session config keys of the core and their checks (plugins add theirs: Plugin.config_checks).
CONFIG_CHECKS: Mapping[str, Callable[[Any], None]] = MappingProxyType({
    "max_tokens": lambda v: _positive_int("max_tokens", v),
    "thinking": _check_thinking,
    "effort": _check_effort,
    "hands": _check_hands,
    "egress": _check_egress,
})


def config_checks(host: Any) -> dict[str, Callable[[Any], None]]:
    """Every per-session config key this host knows, with its check: the core's and its plugins'."""
    checks = dict(CONFIG_CHECKS)
    for p in host.plugins:
        checks.update(p.config_checks())
    return checks


def session_body(body: Any, host: Any) -> dict[str, Any]:
    """Arguments for Brain.create_session from a `POST /sessions` body, checked against this host."""
    body = _object(body)
    unknown = set(body) - set(SESSION_FIELDS)
    if unknown:
        raise ConfigError(f"unknown fields {', '.join(sorted(unknown))}; a session takes {', '.join(SESSION_FIELDS)}")
    out: dict[str, Any] = {
        "title": _optional_str(body, "title", 1000),
        "model": _optional_str(body, "model", 200),
        "system": _optional_str(body, "system"),
    }
    config = body.get("config")
    if config is not None:
        if not isinstance(config, dict):
            raise ConfigError('"config" must be an object (see docs/settings.md, per-session config)')
        checks = config_checks(host)
        unknown = set(config) - set(checks)
        if unknown:
            raise ConfigError(f"unknown config keys {', '.join(sorted(unknown))}; known: {', '.join(checks)}")
        for k, v in config.items():
            checks[k](v)
        out["config"] = config
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
            raise ConfigError('"tools" must be a list of tool names')
        from ..brain.tools import tool_named

        for t in tools:
            tool_named(host.tools, t)  # raises ConfigError naming the known tools
        out["tools"] = tools
    if out["model"]:
        host.models.check(out["model"])  # UnknownModel / MissingAPIKey, before anything is written
    return out


def message_body(body: Any) -> str:
    """The text of a `POST /sessions/{id}/messages` body."""
    body = _object(body)
    text = body.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ConfigError('the body needs "text": a non-empty string')
    if len(text) > 1_000_000:
        raise ConfigError('"text" is longer than 1,000,000 characters')
    return text


def query_body(body: Any) -> tuple[str, list[Any]]:
    """(sql, params) of a `POST /query` body."""
    body = _object(body)
    sql, params = body.get("sql"), body.get("params", [])
    if not isinstance(sql, str) or not sql.strip():
        raise ConfigError('the body needs "sql": one read-only statement')
    if params is None:
        params = []
    if not isinstance(params, list):
        raise ConfigError('"params" must be a list')
    return sql, params


def int_arg(value: str | None, name: str, *, minimum: int = 0, maximum: int | None = None) -> int | None:
    """A non-negative integer query argument, or None when absent."""
    if value is None or value == "":
        return None
    try:
        n = int(value)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, not {value[:40]!r}") from None
    if n < minimum or (maximum is not None and n > maximum):
        raise ConfigError(f"{name} must be between {minimum} and {maximum}" if maximum else f"{name} must be >= {minimum}")
    return n
