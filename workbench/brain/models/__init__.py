"""Models the brain can talk to, chosen by name through a catalog.

- `scripted` or `scripted:SCRIPT`: the offline scripted model (see scripted.py);
  plugins may add scripts (the memory plugin adds `scripted:dream`);
- `claude-...`: Claude through the Anthropic SDK (needs ANTHROPIC_API_KEY);
- `anthropic:NAME`: any model name on an Anthropic-compatible server
  (ANTHROPIC_BASE_URL), e.g. a local one; the API is sent `NAME`, while the
  session, its requests in the log and a cassette keep `anthropic:NAME`;
- `PREFIX` or `PREFIX:ARG`: a model a plugin registers under PREFIX.

A catalog given a `Cassette` (WORKBENCH_CASSETTE, see cassette.py) wraps every
model it makes in a `CassetteModel` of the same name, so sessions, requests and
logs look exactly as without it, and a replay needs no key.

A host builds one `ModelCatalog` from the built-ins and its plugins; nothing
is registered globally.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from ...errors import MissingAPIKey, UnknownModel
from .anthropic import DEFAULT_MODEL, AnthropicModel
from .base import FatalModelError, MessageBuilder, Model, RetryableError, message_events
from .cassette import Cassette, CassetteError, CassetteMiss, CassetteModel
from .scripted import BUILTIN_SCRIPTS, Reply, Script, ScriptedModel

__all__ = [
    "AnthropicModel", "Cassette", "CassetteError", "CassetteMiss", "CassetteModel",
    "DEFAULT_MODEL", "FatalModelError", "MessageBuilder", "Model", "ModelCatalog", "Reply",
    "RetryableError", "ScriptedModel", "default_model_name", "make_model", "message_events",
]

# A plugin's model: called with the text after `PREFIX:` ("" when there is none).
ModelMaker = Callable[[str], Model]
RESERVED = ("scripted", "anthropic", "claude")


def default_model_name() -> str:
    """$WORKBENCH_MODEL, else claude-opus-5-5 when ANTHROPIC_API_KEY is set, else the scripted model."""
    return os.environ.get("WORKBENCH_MODEL") or (DEFAULT_MODEL if os.environ.get("ANTHROPIC_API_KEY") else "scripted")


class ModelCatalog:
    """Every model a host can make, by name: the built-ins plus its plugins' scripts and models."""

    def __init__(self, scripts: Mapping[str, Script] | None = None, providers: Mapping[str, ModelMaker] | None = None,
                 default: str | None = None, cassette: Cassette | None = None):
        self.scripts: Mapping[str, Script] = {**BUILTIN_SCRIPTS, **(scripts or {})}
        self.providers: Mapping[str, ModelMaker] = dict(providers or {})
        self.default = default or None
        self.cassette = cassette

    def default_name(self) -> str:
        """The model of sessions created without one."""
        return self.default or default_model_name()

    def make(self, name: str | None = None) -> Model:
        """The model called `name` (see the module docstring for the forms); UnknownModel / MissingAPIKey."""
        name = name or self.default_name()
        if self.cassette is None:
            return self._make(name)
        try:
            inner: Model | None = self._make(name)
        except MissingAPIKey:
            if self.cassette.mode == "record":
                raise
            inner = None  # replaying needs no key; recording a miss will say it lacks one
        return CassetteModel(name, self.cassette, inner or (lambda: self._make(name)))

    def _make(self, name: str) -> Model:
        if not isinstance(name, str) or not name.strip():
            raise UnknownModel("a model name must be a non-empty string")
        kind, _, arg = name.partition(":")
        if kind == "scripted":
            return ScriptedModel(arg or "default", scripts=self.scripts)
        if name.startswith("claude-"):
            return AnthropicModel(name)
        if kind == "anthropic" and arg:
            return AnthropicModel(arg)
        if kind in self.providers:
            return self.providers[kind](arg)
        plugins = "".join(f", {p}" for p in sorted(self.providers))
        raise UnknownModel(
            f"unknown model {name[:100]!r}: use scripted[:{'|'.join(self.scripts)}], a claude-... model name, "
            f"anthropic:NAME for an Anthropic-compatible server{plugins}"
        )

    def check(self, name: str) -> None:
        """Raise UnknownModel / MissingAPIKey now, before anything is written."""
        self.make(name)


def make_model(name: str | None = None) -> Model:
    """A built-in model by name (what a host without plugins can make)."""
    return ModelCatalog().make(name)
