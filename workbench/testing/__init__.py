"""Test doubles and tools that ship with the package: the only stand-ins the tests use.

- `FakeMessagesAPI`: a Messages API over real HTTP with SSE streaming that
  checks requests like the real API (verbatim assistant turns, signed
  thinking, unchanged prefixes), for driving the official SDK offline.
- The scripted model lives in `workbench.brain.models.scripted`.
- `JupyterProcess` (`workbench.testing.jupyter`): not a stand-in but a tool, a
  real `jupyter server`/`jupyter lab` subprocess on a free 127.0.0.1 port with
  a token and temp dirs, for tests and benchmarks that need a whole server.
"""

from ..brain.models.scripted import Reply, ScriptedModel
from .fake_api import FakeMessagesAPI
from .jupyter import JupyterProcess, free_port

__all__ = ["FakeMessagesAPI", "JupyterProcess", "Reply", "ScriptedModel", "free_port"]
