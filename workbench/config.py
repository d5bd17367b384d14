"""Settings objects from the environment and from overrides: one leaf every part can use.

Each component has one config object: a dataclass whose fields are read from
`WORKBENCH_<FIELD>` (or a component prefix such as `WORKBENCH_HANDS_`), or
traitlets on the server extension. Which classes exist is the host's
business (`workbench.host.settings_classes`): this module imports nothing
of the workbench but its errors and how numbers from outside are read (strictnum).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import ConfigError
from .strictnum import INT_MAX, INT_MIN, NumberRefused, number, shown

if TYPE_CHECKING:
    from _typeshed import DataclassInstance  # the protocol dataclasses.fields() takes; only type checkers have it

ENV_PREFIX = "WORKBENCH_"

T = TypeVar("T", bound="DataclassInstance")  # config objects are dataclasses


def from_env(cls: type[T], prefix: str = ENV_PREFIX, *, defaults: Mapping[str, Any] | None = None, **overrides: Any) -> T:
    """An instance of a config dataclass: `defaults` (a caller's own, in place of the class's), then fields read
    from <prefix><FIELD> when set, then `overrides`."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = (set(defaults or ()) | set(overrides)) - set(fields)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} settings: {', '.join(sorted(unknown))}; known: {', '.join(fields)}")
    values: dict[str, Any] = {name: _check(fields[name], value, f"{cls.__name__}.{name}")
                              for name, value in (defaults or {}).items()}
    for name, f in fields.items():
        raw = os.environ.get(prefix + name.upper())
        if raw is not None:
            values[name] = _parse(f, raw, prefix + name.upper())
    for name, value in overrides.items():
        values[name] = _check(fields[name], value, f"{cls.__name__}.{name}")
    return cls(**values)


def settings_from(cls: type[T], overrides: Mapping[str, Any] | None, prefix: str = ENV_PREFIX, where: str = "") -> T:
    """`from_env` for a mapping of overrides (a traitlet dict, a config file), naming `where` in errors."""
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ConfigError(f"{where or cls.__name__} must be a mapping of settings")
    try:
        return from_env(cls, prefix, **dict(overrides or {}))
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}" if where else str(e)) from None


def _kind(f: dataclasses.Field) -> type | None:
    """The field's type as its default shows it (None: no default to judge by)."""
    default = f.default if f.default is not dataclasses.MISSING else None
    return type(default) if default is not None else None


def _parse(f: dataclasses.Field, raw: str, name: str) -> Any:
    kind = _kind(f) or str
    try:
        if kind is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind in (int, float):
            return number(raw, kind)  # bounded before it is parsed: plain ASCII, finite, 64 bits
        return raw
    except NumberRefused as e:
        raise ConfigError(f"{name}: {e}") from None
    except ValueError:
        raise ConfigError(f"{name}={shown(raw)} is not a valid {kind.__name__}") from None


def _check(f: dataclasses.Field, value: Any, name: str) -> Any:
    """An override must have the field's type (an int is fine for a float); non-finite numbers never are."""
    kind = _kind(f)
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, not {value!r}"[:200])
    elif kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
            raise ConfigError(f"{name} must be a{'n integer' if kind is int else ' number'}, not {value!r}"[:200])
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number")
        if isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
            raise ConfigError(f"{name} is outside the integers of 64 bits")
    elif kind is str and not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, not {value!r}"[:200])
    elif kind is None and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number")
    return value
