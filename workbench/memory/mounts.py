"""Which memory stores a session mounts, and how: read-only or read-write (at most 8).

A session names its mounts in its config, `{"memory": {"stores": [...]}}`, each a store's name
(read-write) or `{"name": ..., "access": "read_only" | "read_write"}`. A session that names none
mounts "default" read-write; a dream that names none mounts its target store read-write. What a
session is told (injection), what `recall` finds and what a dream reads are the accepted memories
of its mounts; only a read-write mount can be written to, and a dream writes to its target store
alone. The config is frozen in `session_created`, so the mounts of every session are in its log.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ..plugins.errors import ConfigError
from ..plugins.log import SessionLog
from .store import DEFAULT_STORE, check_store

MAX_MOUNTS = 8  # as many stores as a Managed Agents session may attach
ACCESS = ("read_write", "read_only")


@dataclass(frozen=True)
class Mount:
    """One store a session mounts, and how."""

    store: str
    access: str = "read_write"

    @property
    def writable(self) -> bool:
        return self.access == "read_write"

    def to_json(self) -> dict[str, str]:
        return {"store": self.store, "access": self.access}


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def parse_mounts(value: Any) -> tuple[Mount, ...]:
    """The mounts `config.memory.stores` names; ConfigError says what is wrong with them."""
    where = '"config.memory.stores"'
    if not isinstance(value, list):
        raise ConfigError(f"{where} must be a list of store names or {{\"name\", \"access\"}} objects, not {_kind(value)}")
    if not value:
        raise ConfigError(f"{where} is empty; name at least one store (or leave it out: \"default\", read-write)")
    if len(value) > MAX_MOUNTS:
        raise ConfigError(f"{where} names {len(value)} stores; a session mounts at most {MAX_MOUNTS}")
    mounts: list[Mount] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            mount = Mount(check_store(item))
        elif isinstance(item, dict):
            unknown = sorted(set(item) - {"name", "access"})
            if unknown:
                raise ConfigError(f"{where}[{i}] has unknown key {unknown[0][:40]!r}; a mount has \"name\" and \"access\"")
            access = item.get("access", "read_write")
            if access not in ACCESS:
                shown = repr(access[:40]) if isinstance(access, str) else _kind(access)
                raise ConfigError(f"{where}[{i}].access is {shown}; one of read_only, read_write")
            mount = Mount(check_store(item.get("name")), access)
        else:
            raise ConfigError(f"{where}[{i}] must be a store name or an object, not {_kind(item)}")
        if any(m.store == mount.store for m in mounts):
            raise ConfigError(f"{where} mounts store {mount.store!r} twice; mount each store once")
        mounts.append(mount)
    return tuple(mounts)


def check_memory_config(value: Any) -> None:
    """The check of a session's `config.memory` (a plugin's config check: a bad value is a 400)."""
    if not isinstance(value, dict):
        raise ConfigError(f'"config.memory" must be an object, not {_kind(value)} (see docs/memory.md, "Stores")')
    unknown = sorted(set(value) - {"stores"})
    if unknown:
        raise ConfigError(f'"config.memory" has unknown key {unknown[0][:40]!r}; known: stores')
    if "stores" in value:
        parse_mounts(value["stores"])


def dream_target(config: Mapping[str, Any]) -> str:
    """The store a dream writes its proposals into (a dream from before stores: "default")."""
    return check_store((config.get("dream") or {}).get("store") or DEFAULT_STORE)


def session_mounts(config: Mapping[str, Any] | None, kind: str, shared: Collection[str] = ()) -> tuple[Mount, ...]:
    """The stores a session with this config and kind mounts: its `memory.stores`, else the default (a session's
    own store read-write, and the server's `shared` stores read-only). A shared store is read-only whatever the
    config says: only its maintainer's file writes it (shared.py)."""
    config = config or {}
    memory = config.get("memory")
    if memory is not None:
        check_memory_config(memory)
        if "stores" in memory:
            return tuple(Mount(m.store, "read_only") if m.store in shared else m for m in parse_mounts(memory["stores"]))
    own = dream_target(config) if kind == "dream" else DEFAULT_STORE
    extra = () if kind == "dream" else tuple(Mount(s, "read_only") for s in shared if s != own)
    return (Mount(own, "read_only" if own in shared else "read_write"), *extra)[:MAX_MOUNTS]


def dream_mounts(target: str, read_only: list[str] | None = None) -> tuple[Mount, ...]:
    """A dream's mounts: its target read-write, the others it may read but not change read-only."""
    mounts = (Mount(check_store(target)), *(Mount(check_store(s), "read_only") for s in dict.fromkeys(read_only or [])
                                              if s != target))
    if len(mounts) > MAX_MOUNTS:
        raise ConfigError(f"a dream mounts {len(mounts)} stores; at most {MAX_MOUNTS}")
    return mounts


def of_session(log: SessionLog, session_id: str, shared: Collection[str] = ()) -> tuple[Mount, ...]:
    """The mounts of a session, from its `session_created` event (where its config is frozen)."""
    first = log.events(session_id, until=1)
    payload = first[0].payload if first else {}
    return session_mounts(payload.get("config") or {}, log.session(session_id)["kind"], shared)


def stores_of(mounts: tuple[Mount, ...]) -> list[str]:
    return [m.store for m in mounts]
