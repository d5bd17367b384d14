"""Shared stores: a lab's reviewed memories, which several people's servers mount read-only from a file.

A lab on JupyterHub gives each person a server and a session log of their own; what the lab has learned is
shared without sharing those logs. One named **maintainer** dreams into a store of their own log
(`workbench dream --store team`), reviews it, and publishes it as an export file at a path the others can
read and only the maintainer can write (`workbench memories export --store team -o PATH`). Every server that
names the file (`shared_stores`, `team=PATH`) mirrors it into its own log as store `team`, read-only: at its
start, and again when a new session starts after the file changed. Its sessions mount it read-only (a session
that names no mounts: `default` read-write and each shared store read-only), are told its accepted memories
and find them with `recall`; every write there (a review, an import, a dream into it, the memory tool) is
refused with SharedStoreReadOnly. A file that is not a valid export of that store by that maintainer leaves
the last good mirror as it was and is named in the server's log.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ..plugins.errors import ConfigError, MemoryConflict
from .mounts import MAX_MOUNTS
from .store import MemoryStore, check_store, person
from .transfer import MAX_FILE_BYTES, mirror_store, parse_export, shown_fields

log_ = logging.getLogger(__name__)


@dataclass(frozen=True)
class Shared:
    """One shared store: its name here and the file its maintainer publishes."""

    store: str
    path: Path


def parse_shared(value: str) -> tuple[Shared, ...]:
    """`shared_stores` (`NAME=PATH`, comma-separated) as Shared stores; ConfigError says what is wrong."""
    out: list[Shared] = []
    for item in (x.strip() for x in value.split(",")):
        if not item:
            continue
        name, eq, path = item.partition("=")
        if not eq or not path.strip():
            raise ConfigError(f"WORKBENCH_MEMORY_SHARED_STORES: {item[:80]!r} is not NAME=PATH (e.g. team=/srv/lab/team.json)")
        try:
            name = check_store(name.strip())
        except ConfigError as e:
            raise ConfigError(f"WORKBENCH_MEMORY_SHARED_STORES: {e}") from None
        if not os.path.isabs(path.strip()):
            raise ConfigError(f"WORKBENCH_MEMORY_SHARED_STORES: the file of store {name!r} must be an absolute path")
        if any(s.store == name for s in out):
            raise ConfigError(f"WORKBENCH_MEMORY_SHARED_STORES names store {name!r} twice")
        out.append(Shared(name, Path(path.strip())))
    if len(out) > MAX_MOUNTS - 1:  # every session mounts each of them beside its own store
        raise ConfigError(f"WORKBENCH_MEMORY_SHARED_STORES names {len(out)} stores; at most {MAX_MOUNTS - 1} "
                          f"(a session mounts at most {MAX_MOUNTS} stores, its own among them)")
    return tuple(out)


class SharedStores:
    """The shared stores of one server, mirrored from their files into its log when the files change."""

    def __init__(self, store: MemoryStore, shared: tuple[Shared, ...], maintainer: str):
        self.store, self.shared = store, shared
        self.maintainer = person(maintainer) if maintainer.strip() else None
        self._seen: dict[str, tuple[int, int, int]] = {}  # the (inode, mtime, size) of each file last read
        self.problems: dict[str, str] = {}  # why a store's file was not mirrored, the last time it was read
        who = f"its maintainer {self.maintainer.removeprefix('person:')}" if self.maintainer else "its maintainer"
        store.shared = {s.store: f"store {s.store!r} is shared: this server mounts it read-only from {s.path}, which only "
                                 f"{who} writes (docs/memory.md, \"Shared stores\")" for s in shared}

    def refresh(self) -> None:
        """Mirror each shared store whose file changed since it was read (a stat each, when none did)."""
        for s in self.shared:
            try:
                st = s.path.stat()
            except OSError as e:
                self._problem(s, f"cannot read {s.path}: {e.strerror or e}")
                continue
            mark = (st.st_ino, st.st_mtime_ns, st.st_size)
            if self._seen.get(s.store) == mark:
                continue
            self._seen[s.store] = mark
            try:
                self._mirror(s)
            except (ConfigError, MemoryConflict, OSError) as e:
                self._problem(s, str(e))

    def _mirror(self, s: Shared) -> None:
        with open(s.path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise ConfigError(f"{s.path} is over {MAX_FILE_BYTES >> 20} MiB, the largest export")
        doc = parse_export(data)
        if doc["store"] != s.store:
            raise ConfigError(f"{s.path} is an export of store {doc['store']!r}, not {s.store!r}")
        if self.maintainer and doc["exported_by"] != self.maintainer:
            raise ConfigError(f"{s.path} was exported by {doc['exported_by']!r}; only {self.maintainer!r} "
                              "(shared_maintainer) publishes it")
        problems = self.store.scanner.problems_of(shown_fields(doc))  # the guard an import has
        if problems:
            raise ConfigError(f"{s.path} not read: {problems[0]}")
        n = mirror_store(self.store, doc)
        self.problems.pop(s.store, None)
        log_.info("workbench: shared store %s: %d memories from %s (exported by %s at %s)", s.store, n, s.path,
                  doc["exported_by"], doc["exported_at"])

    def _problem(self, s: Shared, why: str) -> None:
        if self.problems.get(s.store) != why:
            log_.warning("workbench: shared store %s kept as it was: %s", s.store, why)
        self.problems[s.store] = why
