"""A plugin for the server tests whose per-session config check breaks on anything unexpected."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from workbench.plugins import Plugin


@dataclass
class FragilePlugin(Plugin):
    """Its `fragile` config key must be {"level": int}; anything else raises TypeError or KeyError in its check."""

    name: str = "fragile"

    def config_checks(self) -> Mapping[str, Callable[[Any], None]]:
        return {"fragile": lambda value: value["level"] + 1}
