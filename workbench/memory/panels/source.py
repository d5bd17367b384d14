"""Where the review panels get memories from: the store in-process, or a server's REST API.

Both have the same five methods: `list`, `get`, `review`, `dreams` and
`session_events`. A notebook kernel cannot open the DuckDB file while the
Jupyter server holds it, so there the panels use `RestSource`, which talks to
the server through the notebook client (`workbench.connect()`), the one REST
client of the package.
"""

from __future__ import annotations

# both sources have a method named `list`; below it, their annotations reach the builtin as builtins.list
import builtins
from typing import Any, Protocol
from urllib.parse import urlencode


class MemorySource(Protocol):
    """What a review panel needs (MemoryStore has exactly these)."""

    def list(self, *, status: str | None = None, tag: str | None = None, dream: str | None = None) -> list[dict[str, Any]]: ...
    def get(self, memory_id: str) -> dict[str, Any]: ...
    def review(self, memory_id: str, action: str, actor: str, **kw: Any) -> dict[str, Any]: ...
    def dreams(self) -> builtins.list[dict[str, Any]]: ...
    def session_events(self, session_id: str, after: int | None = None, until: int | None = None) -> builtins.list[dict[str, Any]]: ...


class RestSource:
    """The memory routes of a running Jupyter server with workbench (docs/api.md, "Memory and dreams").

    `RestSource()` finds the server this kernel belongs to, as `workbench.connect()` does;
    `RestSource(url, token)` names one; `RestSource(client=...)` reuses a client.
    """

    def __init__(self, base_url: str | None = None, token: str | None = None, *, client: Any = None):
        from ...plugins.client import WorkbenchClient, connect

        self.client = client or (WorkbenchClient(base_url, token) if base_url else connect(token=token))

    def list(self, *, status: str | None = None, tag: str | None = None, dream: str | None = None) -> list[dict[str, Any]]:
        return self.client.memories(status=status, tag=tag, dream=dream)

    def get(self, memory_id: str) -> dict[str, Any]:
        return self.client.memory(memory_id)

    def review(self, memory_id: str, action: str, actor: str, **kw: Any) -> dict[str, Any]:
        # the server records the user this client authenticates as; `actor` is only the panel's label
        return self.client.review(memory_id, action, **kw)

    def dreams(self) -> builtins.list[dict[str, Any]]:
        return self.client.dreams()

    def session_events(self, session_id: str, after: int | None = None, until: int | None = None) -> builtins.list[dict[str, Any]]:
        limit = None if until is None else max(1, until - (after or 0))
        return self.client.events(session_id, after=after or 0, limit=limit)

    def session_url(self, session_id: str, seq: int) -> str:
        """JupyterLab on this server, opening `session_id` at event `seq` in the workbench sidebar (no token: the
        browser that shows the panel is signed in to the server already)."""
        return f"{self.client.url}/lab?{urlencode({'workbench-session': session_id, 'workbench-seq': seq})}"
