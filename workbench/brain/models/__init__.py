"""Models the brain can talk to, chosen by name.

- `scripted` or `scripted:SCRIPT`: the offline scripted model (see scripted.py);
- `claude-...`: Claude through the Anthropic SDK (needs ANTHROPIC_API_KEY);
- `anthropic:NAME`: any model name on an Anthropic-compatible server
  (ANTHROPIC_BASE_URL), e.g. a local one;
- `PLUGIN:ARG`: a model registered under the `workbench.models` entry point group.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points

from ...errors import UnknownModel
from .anthropic import DEFAULT_MODEL, AnthropicModel
from .base import FatalModelError, MessageBuilder, Model, RetryableError, message_events
from .scripted import Reply, ScriptedModel

__all__ = [
    "AnthropicModel", "DEFAULT_MODEL", "FatalModelError", "MessageBuilder", "Model", "Reply",
    "RetryableError", "ScriptedModel", "default_model_name", "make_model", "message_events", "check_model_name",
]


def default_model_name() -> str:
    """claude-opus-5-5 when ANTHROPIC_API_KEY is set, else the scripted model."""
    return os.environ.get("WORKBENCH_MODEL") or (DEFAULT_MODEL if os.environ.get("ANTHROPIC_API_KEY") else "scripted")


def check_model_name(name: str) -> None:
    """Raise UnknownModel / MissingAPIKey now, before anything is written."""
    make_model(name)


def make_model(name: str | None = None) -> Model:
    """The model called `name` (see the module docstring for the forms)."""
    name = name or default_model_name()
    kind, _, arg = name.partition(":")
    if kind == "scripted":
        return ScriptedModel(arg or "default")
    if name.startswith("claude-"):
        return AnthropicModel(name)
    if kind == "anthropic" and arg:
        return AnthropicModel(arg)
    for ep in entry_points(group="workbench.models"):
        if ep.name == kind and kind not in ("scripted", "anthropic"):
            return ep.load()(arg) if arg else ep.load()()
    raise UnknownModel(
        f"unknown model {name!r}: use scripted[:default|demo|crash], a claude-... model name, "
        "or anthropic:NAME for an Anthropic-compatible server"
    )
