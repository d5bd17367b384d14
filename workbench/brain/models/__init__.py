"""Models the brain can talk to, chosen by name through a catalog.

- `scripted` or `scripted:SCRIPT`: the offline scripted model (see scripted.py);
  plugins may add scripts (the memory plugin adds `scripted:dream`);
- `claude-...`: Claude through the Anthropic SDK (needs ANTHROPIC_API_KEY);
- `anthropic:NAME`: any model name on an Anthropic-compatible server
  (ANTHROPIC_BASE_URL), e.g. a local one; the API is sent `NAME`, while the
  session, its requests in the log and a cassette keep `anthropic:NAME`;
- `PREFIX` or `PREFIX:ARG`: a model a plugin registers under PREFIX.

With ANTHROPIC_API_KEY set, the catalog asks the Models API once which models the key can use
(`available`, kept for `LISTED_FOR` seconds): the model picker offers them, and `check` refuses a
Claude name that is not among them, naming those that are. Where the list cannot be had (no Models
API at ANTHROPIC_BASE_URL, no network) nothing is refused for it.

A catalog given a `Cassette` (WORKBENCH_CASSETTE, see cassette.py) wraps every
model it makes in a `CassetteModel` of the same name, so sessions, requests and
logs look exactly as without it, and a replay needs no key.

A host builds one `ModelCatalog` from the built-ins and its plugins; nothing
is registered globally.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping

from ...errors import MissingAPIKey, UnknownModel
from .anthropic import DEFAULT_MODEL, AnthropicModel, list_models
from .base import FatalModelError, MessageBuilder, Model, RetryableError, message_events
from .cassette import Cassette, CassetteError, CassetteMiss, CassetteModel
from .scripted import BUILTIN_SCRIPTS, Reply, Script, ScriptedModel

__all__ = [
    "AnthropicModel", "Cassette", "CassetteError", "CassetteMiss", "CassetteModel",
    "DEFAULT_MODEL", "FatalModelError", "MessageBuilder", "Model", "ModelCatalog", "Reply",
    "RetryableError", "ScriptedModel", "default_model_name", "make_model", "message_events",
]

log = logging.getLogger("workbench.models")

# A plugin's model: called with the text after `PREFIX:` ("" when there is none).
ModelMaker = Callable[[str], Model]
RESERVED = ("scripted", "anthropic", "claude")
LISTED_FOR = 3600.0  # seconds the key's list of models is kept
UNLISTED_FOR = 300.0  # seconds before a list that could not be had is asked for again


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
        self._listed: tuple[float, tuple[str, ...] | None] | None = None  # (until when, the key's models)
        self._listing = threading.Lock()

    def available(self) -> tuple[str, ...] | None:
        """The models ANTHROPIC_API_KEY can use, by the names this catalog makes them by (`claude-...` as they
        are, any other as `anthropic:NAME`); None without a key, or when the Models API cannot list them."""
        ids = self._api_ids()
        return None if ids is None else tuple(i if i.startswith("claude-") else f"anthropic:{i}" for i in ids)

    def _api_ids(self) -> tuple[str, ...] | None:
        """The Models API's ids for the key, kept `LISTED_FOR` seconds (a failure: `UNLISTED_FOR` seconds)."""
        with self._listing:  # one request at a time: concurrent first uses wait for the same answer
            if self._listed is not None and time.monotonic() < self._listed[0]:
                return self._listed[1]
            try:
                ids = list_models()
                listed = tuple(ids) if ids is not None else None
                self._listed = (time.monotonic() + LISTED_FOR, listed)
            except Exception as e:  # the SDK's errors: no Models API there, no network, a refused key
                # info, not a warning: a compatible server without a Models API is ordinary, and a refused key is
                # said by the model call itself; a warning here printed on every CLI command's stderr
                log.info("workbench: the Models API did not list this key's models (%s); model names are not "
                         "checked against it", f"{type(e).__name__}: {str(e)[:200]}")
                listed = None
                self._listed = (time.monotonic() + UNLISTED_FOR, None)
            return listed

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
        """Raise UnknownModel / MissingAPIKey now, before anything is written: also for a Claude name the key's
        Models API does not list (a cassette being replayed is not asked)."""
        self.make(name)
        if self.cassette is not None and self.cassette.mode == "replay":
            return
        sent = name if name.startswith("claude-") else name.partition(":")[2] if name.startswith("anthropic:") else None
        ids = self._api_ids() if sent is not None else None
        if ids is not None and sent not in ids:
            raise UnknownModel(f"model {name[:100]!r} does not exist for this key; it can use: "
                               f"{', '.join(self.available() or ()) or 'none'}")


def make_model(name: str | None = None) -> Model:
    """A built-in model by name (what a host without plugins can make)."""
    return ModelCatalog().make(name)
