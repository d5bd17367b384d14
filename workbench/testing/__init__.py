"""Test doubles that ship with the package: the only stand-ins the tests use.

- `FakeMessagesAPI`: a Messages API over real HTTP with SSE streaming that
  checks requests like the real API (verbatim assistant turns, signed
  thinking, unchanged prefixes), for driving the official SDK offline.
- The scripted model lives in `workbench.brain.models.scripted`.
"""

from ..brain.models.scripted import Reply, ScriptedModel
from .fake_api import FakeMessagesAPI

__all__ = ["FakeMessagesAPI", "Reply", "ScriptedModel"]
