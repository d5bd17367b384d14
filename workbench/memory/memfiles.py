"""`/memories` as the memory tool shows it to a session: its mounted stores as directories, memories as files.

- `/memories/<store>/` is a store the session mounts (read-only or read-write); nothing else is at the top.
- A memory is the file `/memories/<store>/<name>`: its title when the title is a file path (what the memory tool
  writes: `notes.md`, `project/decisions.md`), else a slug of its title and its id (`never-use-pandas-m3f2a9c1b7d.md`,
  what dreams and people write). Of two memories with one name in a store, the newer is `<name>-<id>`.
- A file's content is the memory's text. Directories are the paths' prefixes: there are no empty ones.
- A session sees the accepted memories of its mounts and, over them, its own writes still waiting for review
  (`agent:<session id>`'s proposals): its edit of a memory in its place, no file for a memory it deleted.

Path rules, checked before anything is read or written: under `/memories`, segments of letters, digits and
`_ . - + @`, none `.` or `..`, none hidden (a leading `.`), at most MAX_DEPTH deep in a store, a name at most
MAX_NAME_CHARS long; no NUL, control character or lone surrogate.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

ROOT = "/memories"
MAX_DEPTH = 6  # directories and file within a store
MAX_NAME_CHARS = 200  # a memory's title at most (store.MAX_TITLE_CHARS)
MAX_PATH_INPUT = 1000  # characters of a path the tool reads at all
SEGMENT = re.compile(r"[\w.@+-]{1,100}")
MAX_LISTED = 300  # lines of a directory listing


class PathRefused(ValueError):
    """A path outside the rules: the message says which rule, for the model to act on."""


@dataclass(frozen=True)
class Where:
    """A checked path: the store it is in (None: `/memories` itself) and the name within the store ("" for its root)."""

    store: str | None
    name: str

    @property
    def path(self) -> str:
        return "/".join(p for p in (ROOT, self.store, self.name) if p)


def parse_path(path: Any) -> Where:
    """The store and name a memory-tool path names; PathRefused says which rule it breaks."""
    if not isinstance(path, str) or not path:
        raise PathRefused("path must be a non-empty string under /memories")
    if len(path) > MAX_PATH_INPUT:
        raise PathRefused(f"path is {len(path):,} characters; a memory path is at most {MAX_NAME_CHARS} within its store")
    if any(ord(c) < 32 or 0xD800 <= ord(c) <= 0xDFFF or ord(c) == 127 for c in path):
        raise PathRefused("path holds a NUL, control character or lone surrogate; use letters, digits and _ . - + @")
    if path != ROOT and not path.startswith(ROOT + "/"):
        raise PathRefused(f"path {path[:200]!r} is outside /memories; every memory path starts with /memories/")
    rest = path[len(ROOT) + 1:]  # one slash after /memories and one at the end (a directory) are allowed
    rest = rest[:-1] if rest.endswith("/") else rest
    parts = rest.split("/") if rest else []
    for seg in parts:
        if seg in (".", ".."):
            raise PathRefused(f"path {path[:200]!r} holds {seg!r}; name the file from /memories down, without . or ..")
        if not seg:
            raise PathRefused(f"path {path[:200]!r} has an empty segment (//)")
        if seg.startswith("."):
            raise PathRefused(f"{seg[:60]!r} starts with a dot; memory files are never hidden")
        if not SEGMENT.fullmatch(seg):
            raise PathRefused(f"{seg[:60]!r} is not a valid file or directory name: 1 to 100 letters, digits and _ . - + @")
    if not parts:
        return Where(None, "")
    if len(parts) - 1 > MAX_DEPTH:
        raise PathRefused(f"path is {len(parts) - 1} levels deep in store {parts[0]!r}; at most {MAX_DEPTH}")
    name = "/".join(parts[1:])
    if len(name) > MAX_NAME_CHARS:
        raise PathRefused(f"the name {name[:60]!r}... is {len(name)} characters; at most {MAX_NAME_CHARS} within a store")
    return Where(parts[0], name)


def is_name(title: str) -> bool:
    """Whether a title is a file path within a store (the memory tool's titles are)."""
    try:
        where = parse_path(f"{ROOT}/s/{title}")
    except PathRefused:
        return False
    return where.name == title


def slug_name(m: dict[str, Any]) -> str:
    """The file name of a memory whose title is not a path: a slug of its title, then its id."""
    slug = re.sub(r"[^a-z0-9]+", "-", m["title"].lower()).strip("-")[:60].strip("-")
    return f"{slug}-{m['id']}.md" if slug else f"{m['id']}.md"


def _with_id(name: str, memory_id: str) -> str:
    head, dot, ext = name.rpartition(".")
    return f"{head}-{memory_id}.{ext}" if dot and head and "/" not in ext else f"{name}-{memory_id}"


@dataclass(frozen=True)
class File:
    """One file a session sees: its memory, and whether it is the session's own write waiting for review."""

    store: str
    name: str
    memory: dict[str, Any]
    pending: bool = False  # the session's own proposal (not yet accepted)

    @property
    def path(self) -> str:
        return f"{ROOT}/{self.store}/{self.name}"

    @property
    def size(self) -> int:
        return len(self.memory["text"].encode("utf-8", "surrogatepass"))


def session_files(rows: Iterable[dict[str, Any]], actor: str, stores: Sequence[str]) -> dict[tuple[str, str], File]:
    """The files a session (`actor`, agent:<id>) sees in its mounted `stores`, by (store, name); `rows` are the
    memories of those stores (any status)."""
    rows = [m for m in rows if m["store"] in stores]
    own = [m for m in rows if m["status"] == "proposed" and m["created_by"] == actor]
    replaced = {t for m in own for t in m["targets"]}  # what the session's own edits and deletes stand in for
    accepted = {m["id"]: m for m in rows if m["status"] == "accepted"}
    names: dict[str, str] = {}  # memory id -> its name
    for m in accepted.values():
        names[m["id"]] = m["title"] if is_name(m["title"]) else slug_name(m)
    shown: list[tuple[dict[str, Any], str, bool]] = [(m, names[m["id"]], False) for m in accepted.values()
                                                     if m["id"] not in replaced]
    for m in own:
        if m["proposal"] == "retire":
            continue
        target = accepted.get(m["targets"][0]) if m["targets"] else None
        same = target is not None and target["title"] == m["title"]  # an edit that keeps its target's name
        shown.append((m, names[target["id"]] if same and target else m["title"] if is_name(m["title"]) else slug_name(m), True))
    files: dict[tuple[str, str], File] = {}
    for m, name, pending in sorted(shown, key=lambda x: (x[0]["created_at"], x[0]["id"])):
        key = (m["store"], name)
        if key in files:  # the older keeps the name
            key = (m["store"], _with_id(name, m["id"]))
        files[key] = File(m["store"], key[1], m, pending)
    return files


def children(files: dict[tuple[str, str], File], where: Where, stores: Sequence[str]) -> list[tuple[str, int, bool]]:
    """(path, size, is a directory) of what is under the directory `where`, at most two levels down, in path order."""
    found: dict[str, tuple[int, bool]] = {}
    for (store, name), f in files.items():
        if where.store is not None and store != where.store:
            continue
        inner = f"{store}/{name}" if where.store is None else name
        prefix = "" if where.store is None or not where.name else where.name + "/"
        if not inner.startswith(prefix):
            continue
        parts = inner[len(prefix):].split("/")
        base = where.path
        for depth in range(1, min(len(parts), 2) + 1):
            path = base + "/" + "/".join(parts[:depth])
            is_dir = depth < len(parts)
            size, _ = found.get(path, (0, is_dir))
            found[path] = (size + f.size, is_dir)
    if where.store is None:
        for s in stores:  # a mounted store is there even when the session sees nothing in it
            found.setdefault(f"{ROOT}/{s}", (0, True))
    return [(p, size, d) for p, (size, d) in sorted(found.items())]


def is_dir(files: dict[tuple[str, str], File], where: Where, stores: Sequence[str]) -> bool:
    """Whether `where` is a directory: /memories, a mounted store, or a prefix of a file's name."""
    if where.store is None or (not where.name and where.store in stores):
        return True
    prefix = where.name + "/"
    return any(s == where.store and n.startswith(prefix) for s, n in files)


def human_size(n: int) -> str:
    """Bytes as a listing shows them: 812B, 1.5K, 2.0M."""
    if n < 1024:
        return f"{n}B"
    return f"{n / 1024:.1f}K" if n < 1024 * 1024 else f"{n / 1024 / 1024:.1f}M"


def numbered(path: str, text: str, view_range: list[int] | None) -> str:
    """A file's lines with their numbers (all, or `view_range` [first, last], last -1: to the end)."""
    lines = text.split("\n")
    start, end = 1, len(lines)
    if view_range is not None:
        if len(view_range) != 2 or view_range[0] < 1 or view_range[0] > len(lines) \
                or not (view_range[1] == -1 or view_range[0] <= view_range[1]):
            raise PathRefused(f"view_range {view_range[:3]} is not [first, last] within the file's lines 1..{len(lines)} "
                              "(last -1: to the end)")
        start, end = view_range[0], len(lines) if view_range[1] == -1 else min(view_range[1], len(lines))
    body = "\n".join(f"{i:>6}\t{lines[i - 1]}" for i in range(start, end + 1))
    return f"Here's the content of {path} with line numbers:\n{body}"
