"""Where the review panels get memories from: the store in-process, or a server's REST API.

Both have the same five methods: `list`, `get`, `review`, `dreams` and
`session_events`. A notebook kernel cannot open the DuckDB file while the
Jupyter server holds it, so there the panels use `RestSource`.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Protocol

from ..errors import ConfigError, WorkbenchError


class MemorySource(Protocol):
    """What a review panel needs (MemoryStore has exactly these)."""

    def list(self, *, status: str | None = None, tag: str | None = None, dream: str | None = None) -> list[dict[str, Any]]: ...
    def get(self, memory_id: str) -> dict[str, Any]: ...
    def review(self, memory_id: str, action: str, actor: str, **kw: Any) -> dict[str, Any]: ...
    def dreams(self) -> list[dict[str, Any]]: ...
    def session_events(self, session_id: str, after: int | None = None, until: int | None = None) -> list[dict[str, Any]]: ...


class RestSource:
    """The memory routes of a running Jupyter server with workbench (docs/api.md, "Memory and dreams")."""

    def __init__(self, base_url: str | None = None, token: str | None = None):
        self.base = (base_url or os.environ.get("WORKBENCH_SERVER_URL") or "http://127.0.0.1:8888/").rstrip("/") + "/workbench/api/"
        self.token = token if token is not None else os.environ.get("JUPYTER_TOKEN", "")

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, **query: Any) -> dict[str, Any]:
        q = urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        req = urllib.request.Request(self.base + path + (f"?{q}" if q else ""), method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                msg = json.loads(e.read()).get("error") or e.reason
            except ValueError:
                msg = e.reason
            raise WorkbenchError(f"{method} {path}: {e.code} {msg}") from None
        except urllib.error.URLError as e:
            raise ConfigError(f"cannot reach the workbench server at {self.base}: {e.reason}") from None

    def list(self, *, status: str | None = None, tag: str | None = None, dream: str | None = None) -> list[dict[str, Any]]:
        return self._call("GET", "memories", status=status, tag=tag, dream=dream)["memories"]

    def get(self, memory_id: str) -> dict[str, Any]:
        return self._call("GET", f"memories/{memory_id}")

    def review(self, memory_id: str, action: str, actor: str, **kw: Any) -> dict[str, Any]:
        return self._call("PATCH", f"memories/{memory_id}", dict(kw, action=action, actor=actor))

    def dreams(self) -> list[dict[str, Any]]:
        return self._call("GET", "dreams")["dreams"]

    def session_events(self, session_id: str, after: int | None = None, until: int | None = None) -> list[dict[str, Any]]:
        limit = None if until is None else max(0, until - (after or 0))
        return self._call("GET", f"sessions/{session_id}/events", after=after, limit=limit)["events"]
