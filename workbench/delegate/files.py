"""Files a parent passes to a child: read from the parent's workspace, written by the child's own kernel.

The parent's workspace is a directory on this machine that the parent's (sandboxed) code controls,
so every path is checked, and opened one component at a time without following a symbolic link:
a link the model planted cannot make the brain read a file outside the workspace.
"""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any


class FileRefused(ValueError):
    """A file the parent asked to pass cannot be: the message says which and why."""


def check_path(path: Any) -> str:
    """A relative path inside a workspace, normalised; FileRefused otherwise."""
    if not isinstance(path, str) or not path.strip() or "\0" in path or len(path) > 1024:
        raise FileRefused(f"a file must be a relative path in your workspace, not {str(path)[:80]!r}")
    p = PurePosixPath(path)
    if p.is_absolute() or any(part == ".." for part in p.parts):
        raise FileRefused(f"{path[:200]!r} is not inside your workspace (give a relative path without '..')")
    parts = [q for q in p.parts if q not in (".", "")]
    if not parts:
        raise FileRefused(f"{path[:200]!r} names no file")
    return "/".join(parts)


def read_file(root: Path, path: str, limit: int) -> bytes:
    """The bytes of `path` under `root`, never through a symbolic link, at most `limit` bytes."""
    parts = path.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError as e:
        raise FileRefused(f"cannot read {path!r} from your workspace: {e.strerror or e}") from None
    finally:
        os.close(fd)
    try:
        st = os.fstat(f)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"{path!r} is not a regular file")
        if st.st_size > limit:
            raise FileRefused(f"{path!r} is {st.st_size} bytes; the files passed to one child may hold {limit} in all")
        with os.fdopen(f, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
        if len(data) > limit:
            raise FileRefused(f"{path!r} is larger than the {limit} bytes the files passed to one child may hold")
        return data
    finally:
        os.close(f)


def read_files(root: Path | None, paths: list[str], limit: int) -> dict[str, bytes]:
    """Every path's bytes, within `limit` bytes in all; FileRefused names the first that cannot be passed."""
    if not paths:
        return {}
    if root is None:
        raise FileRefused("your hands have no workspace on this machine yet (run code first, or pass no files)")
    out: dict[str, bytes] = {}
    for path in paths:
        out[path] = read_file(root, path, limit - sum(map(len, out.values())))
    return out


def read_tree(root: Path, limit: int, max_files: int = 10_000) -> dict[str, bytes]:
    """Every regular file under `root` (links are skipped, never followed), within `limit` bytes in all."""
    out: dict[str, bytes] = {}
    total = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
        for name in filenames:
            full = os.path.join(dirpath, name)
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            if len(out) >= max_files:
                raise FileRefused(f"the workspace holds more than {max_files} files")
            data = read_file(root, rel, limit - total)
            out[rel] = data
            total += len(data)
    return out


def placing_code(files: dict[str, bytes]) -> str:
    """Python that writes the files (relative paths) into the kernel's working directory."""
    blob = json.dumps({p: base64.b64encode(b).decode() for p, b in files.items()})
    return (
        "import base64 as _b, json as _j, os as _o\n"
        f"for _p, _d in _j.loads({blob!r}).items():\n"
        "    _o.makedirs(_o.path.dirname(_p) or '.', exist_ok=True)\n"
        "    with open(_p, 'wb') as _f:\n"
        "        _f.write(_b.b64decode(_d))\n"
        f"print('placed {len(files)} file(s)')\n"
        "del _b, _j, _o, _p, _d, _f"
    )
