"""The memory plugin's part of the notebook client: memories, review, recall and dreams (`wb.memories()`, ...)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    from ..plugins.client import WorkbenchClient


def memories(client: WorkbenchClient, *, status: str | None = None, tag: str | None = None, dream: str | None = None,
             search: str | None = None, store: str | None = None) -> list[dict[str, Any]]:
    """Current memories, oldest first, filtered (store: only that store's)."""
    params = {k: v for k, v in dict(status=status, tag=tag, dream=dream, search=search, store=store).items() if v is not None}
    return client.call("GET", "/memories", params=params)["memories"]


def export_memories(client: WorkbenchClient, store: str = "default") -> dict[str, Any]:
    """Store `store` as the export format: every memory with its whole history (docs/memory.md, "Stores")."""
    return client.call("GET", "/memories/export", params={"store": store})


def import_memories(client: WorkbenchClient, data: bytes, store: str | None = None, allow_secret: bool = False,
                    review: bool = False) -> dict[str, Any]:
    """Import an export's bytes into `store` (default: the file's), all or nothing; the report. `review`:
    accepted memories come in as proposals for a person to accept here."""
    params = {k: v for k, v in dict(store=store, allow_secret="true" if allow_secret else None,
                                    review="true" if review else None).items() if v is not None}
    return client.call("POST", "/memories/import", params=params, content=data)


def memory(client: WorkbenchClient, memory_id: str) -> dict[str, Any]:
    """One memory with its history and redactions."""
    return client.call("GET", f"/memories/{quote(memory_id, safe='')}")


def review(client: WorkbenchClient, memory_id: str, action: str, **fields: Any) -> dict[str, Any]:
    """A review action (accept, reject, edit, merge, retire, redact, supersede with by=) as the authenticated user."""
    return client.call("PATCH", f"/memories/{quote(memory_id, safe='')}", {**fields, "action": action})


def recall(client: WorkbenchClient, query: str, limit: int | None = None) -> list[dict[str, Any]]:
    """Accepted memories ranked by relevance to the query (as the `recall` tool finds them), each with its score."""
    params = {"q": query, **({"limit": str(limit)} if limit is not None else {})}
    return client.call("GET", "/recall", params=params)["memories"]


def dreams(client: WorkbenchClient) -> list[dict[str, Any]]:
    """Every dream with its state."""
    return client.call("GET", "/dreams")["dreams"]


def dream_status(client: WorkbenchClient, dream_id: str) -> dict[str, Any]:
    """A dream's state (running, done, stopped, cancelled, unfinished), what it read and proposed."""
    return client.call("GET", f"/dreams/{dream_id}")


def cancel_dream(client: WorkbenchClient, dream_id: str) -> dict[str, Any]:
    """Cancel a dream: no later chunk runs and its running chunk is interrupted; its status."""
    return client.call("POST", f"/dreams/{dream_id}/cancel", {})


def dream(client: WorkbenchClient, sessions: list[str] | None = None, model: str | None = None,
          instructions: str | None = None, store: str | None = None) -> str:
    """Start a dream in the server that proposes into `store` (default: dream_store); returns its id."""
    body = {k: v for k, v in dict(sessions=sessions, model=model, instructions=instructions, store=store).items()
            if v is not None}
    return client.call("POST", "/dreams", body)["dream_id"]


METHODS: Mapping[str, Callable[..., Any]] = MappingProxyType({f.__name__: f for f in (
    memories, export_memories, import_memories, memory, review, recall, dreams, dream_status, cancel_dream, dream)})
