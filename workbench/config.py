"""Where the workbench's settings are defined, for the docs test to find.

Each component has one config object (a dataclass, or traitlets on the
server extension). Every class listed here has each field documented in
docs/settings.md; tests/test_docs.py fails when one is not.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

ENV_PREFIX = "WORKBENCH_"


def config_classes() -> list[type]:
    """Every config class whose fields must be documented in docs/settings.md."""
    from .brain import BrainSettings
    from .hands import HandsConfig

    classes: list[type] = [BrainSettings, HandsConfig]
    for extra in EXTRA_CONFIG_CLASSES:
        module, _, name = extra.rpartition(".")
        classes.append(getattr(__import__(module, fromlist=[name]), name))
    return classes


# Dotted paths of config classes that other parts of the package add.
EXTRA_CONFIG_CLASSES: list[str] = [
    "workbench.hands.sandbox.SandboxSettings",
    "workbench.hands.factory.HandsSettings",
    "workbench.egress.EgressSettings",
    "workbench.server.app.Workbench",  # traitlets: its class_own_traits(config=True)
    "workbench.memory.store.MemorySettings",
]


def from_env(cls: type, prefix: str = ENV_PREFIX, **overrides: Any) -> Any:
    """An instance of a config dataclass, fields read from WORKBENCH_<FIELD> when set."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        raw = os.environ.get(prefix + f.name.upper())
        if raw is None:
            continue
        values[f.name] = _parse(f, raw)
    values.update(overrides)
    return cls(**values)


def _parse(f: dataclasses.Field, raw: str) -> Any:
    from .errors import ConfigError

    default = f.default if f.default is not dataclasses.MISSING else None
    kind = type(default) if default is not None else str
    try:
        if kind is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind in (int, float):
            return kind(raw)
        return raw
    except ValueError:
        raise ConfigError(f"{ENV_PREFIX}{f.name.upper()}={raw!r} is not a valid {kind.__name__}") from None
