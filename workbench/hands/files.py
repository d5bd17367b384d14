"""Files in a session's workspace, read and written by the server for people (docs/api.md, "Files").

The workspace is a directory on this machine that the session's (sandboxed) code controls: the
model may have planted symbolic links, odd names or huge files in it. So every path is checked
(relative, no `..`, no NUL, valid UTF-8, bounded), and opened one component at a time from the
workspace's root without following a symbolic link: nothing here reads or writes outside it.

A write goes to a fresh temporary file in the target directory and is renamed over the name at
the end, so a reader (or the agent's code) sees the old file or the whole new one, never a half;
concurrent writes of one name each land whole, the last rename wins. A write that fails (a bad
name, a full workspace) leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from ..errors import ConfigError, WorkbenchError

MAX_PATH_CHARS = 1024  # a path in a workspace
MAX_PART_BYTES = 255  # one name (the file systems' limit)
CHUNK = 1 << 20


@dataclass
class FilesSettings:
    """Moving files between people and session workspaces (env: WORKBENCH_FILES_<FIELD>); docs/settings.md."""

    max_upload_mb: int = 256  # the largest file one upload may write into a workspace
    max_download_mb: int = 256  # the largest file GET .../files/content sends
    max_list: int = 10_000  # entries listed per workspace (the rest is cut, with `truncated`)


class FileRefused(ConfigError):
    """A path or file a request names cannot be used: the message says which and why (400)."""


class NoSuchFile(WorkbenchError):
    """The workspace has no such file (404)."""

    http_status = 404


class WorkspaceFull(WorkbenchError):
    """The workspace's size limit (or the disk) has no room for the file (413: too large for where it goes)."""

    http_status = 413


class NoWorkspace(WorkbenchError):
    """The session's workspace is not on this machine (a gateway's kernels): 409."""

    http_status = 409


def check_path(path: Any) -> str:
    """A relative path inside a workspace, normalised to `a/b/c`; FileRefused otherwise."""
    if not isinstance(path, str) or not path.strip():
        raise FileRefused("give a path relative to the session's workspace, e.g. data/sales.csv")
    shown = repr(path[:80]) + ("..." if len(path) > 80 else "")
    if len(path) > MAX_PATH_CHARS:
        raise FileRefused(f"the path {shown} is longer than {MAX_PATH_CHARS} characters")
    if "\0" in path:
        raise FileRefused(f"the path {shown} contains a NUL character")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise FileRefused(f"the path {shown} is not valid Unicode") from None
    if not path.isprintable():
        raise FileRefused(f"the path {shown} contains control characters")
    p = PurePosixPath(path)
    if p.is_absolute() or path.startswith("\\") or any(part == ".." for part in p.parts):
        raise FileRefused(f"the path {shown} is not inside the workspace (give a relative path without '..')")
    parts = [q for q in p.parts if q not in (".", "")]
    if not parts:
        raise FileRefused(f"the path {shown} names no file")
    if any(len(q.encode()) > MAX_PART_BYTES for q in parts):
        raise FileRefused(f"a name in the path {shown} is longer than {MAX_PART_BYTES} bytes")
    return "/".join(parts)


def _open_dir(root: Path, parts: list[str], create: bool, owner: tuple[int, int] | None, path: str) -> int:
    """A descriptor of the directory `parts` under root, opened without following links (made if `create`)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise NoSuchFile(f"the workspace has no {path!r}") from None
                with contextlib.suppress(FileExistsError):  # a concurrent upload made it first
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if owner is not None:
                        os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except OSError as e:
        os.close(fd)
        raise _refusal(e, path) from None
    except BaseException:
        os.close(fd)
        raise


def _refusal(e: OSError, path: str) -> WorkbenchError:
    import errno

    if e.errno in (errno.ELOOP, errno.ENOTDIR):
        return FileRefused(f"{path!r} goes through a symbolic link or a file in the workspace; it is not followed")
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return WorkspaceFull(f"the session's workspace has no room for {path!r} ({e.strerror})")
    if e.errno == errno.ENOENT:
        return NoSuchFile(f"the workspace has no {path!r}")
    if e.errno == errno.EISDIR:
        return FileRefused(f"{path!r} is a directory in the workspace")
    return FileRefused(f"cannot use {path!r} in the workspace: {e.strerror or e}")


def write_file(root: Path, path: str, source: IO[bytes], owner: tuple[int, int] | None = None) -> dict[str, Any]:
    """Copy `source` (from its start) to `path` under root; returns {"path", "bytes", "sha256"}.

    Directories on the way are made; a symbolic link on the way is refused, one at the name itself
    is replaced (never followed). `owner` (uid, gid): who the files are for (the sandbox's kernel user).
    """
    path = check_path(path)
    *dirs, name = path.split("/")
    dfd = _open_dir(root, dirs, True, owner, path)
    tmp = f".wb-upload-{secrets.token_hex(8)}"
    digest, size = hashlib.sha256(), 0
    try:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                raise FileRefused(f"{path!r} is a directory in the workspace")
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb", closefd=False) as out:
                source.seek(0)
                while chunk := source.read(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
            if owner is not None:
                os.fchown(fd, *owner)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise _refusal(e, path) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise
    finally:
        os.close(dfd)
    return {"path": path, "bytes": size, "sha256": digest.hexdigest()}


def list_files(root: Path, limit: int) -> tuple[list[dict[str, Any]], bool]:
    """The workspace's entries (files, directories, links: never followed), sorted by path; and whether cut."""
    out: list[dict[str, Any]] = []
    truncated = False
    for top, dirs, files, dfd in os.fwalk(root, follow_symlinks=False):
        dirs.sort()
        rel = os.path.relpath(top, root)
        for name in sorted(dirs + files):
            if name.startswith(".wb-upload-"):
                continue  # an upload in progress
            if len(out) >= limit:
                truncated = True
                break
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                continue  # removed meanwhile
            kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else \
                "link" if stat.S_ISLNK(st.st_mode) else "other"
            shown = (name if rel == "." else f"{rel}/{name}").encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            out.append({"path": shown, "type": kind, "bytes": st.st_size if kind == "file" else None,
                        "mtime": st.st_mtime})
        if truncated:
            break
    out.sort(key=lambda f: f["path"])
    return out, truncated


@contextlib.contextmanager
def open_file(root: Path, path: str, limit: int) -> Iterator[tuple[IO[bytes], int]]:
    """(an open regular file, its size) at `path` under root, never through a link; FileRefused over `limit` bytes."""
    path = check_path(path)
    *dirs, name = path.split("/")
    dfd = _open_dir(root, dirs, False, None, path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    except OSError as e:
        raise _refusal(e, path) from None
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise FileRefused(f"{path!r} is not a regular file (a directory, a pipe or a device)")
    with os.fdopen(fd, "rb") as fh:
        if st.st_size > limit:
            raise FileTooLarge(f"{path!r} is {st.st_size:,} bytes; files of at most {limit:,} bytes are sent "
                               "(the setting max_download_mb, docs/settings.md)")
        yield fh, st.st_size


class FileTooLarge(WorkbenchError):
    """A file over the route's limit (413)."""

    http_status = 413
