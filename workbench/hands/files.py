"""Every copy into and out of a workspace: the files routes, attachments, delegated files, verifiers.

A workspace is a directory on this machine that a session's (sandboxed) code controls, and that
code may still be running while the host reads it: the model may have planted symbolic links, odd
names, FIFOs or huge files, and a daemon of its own may swap a directory for a link between two
looks (`renameat2(RENAME_EXCHANGE)`). So nothing here names a file by a path the agent can change:
a path a person or the model gives is checked (relative, no `..`, no NUL, valid UTF-8, bounded)
and opened one component at a time from the workspace's root, each relative to its parent's
descriptor with O_NOFOLLOW; a walk over a whole tree (`copy_tree`, `list_files`) does the same for
every entry and judges each by `fstat` of what it opened, never by a look at the name before. No
link is ever followed (nor copied), FIFOs, sockets and devices are left out with a note, bytes
and entries are bounded, and the destination is written by descriptor too (O_EXCL, O_NOFOLLOW,
`fchown` to its owner).

A write goes to a fresh temporary file in the target directory and is renamed over the name at
the end, so a reader (or the agent's code) sees the old file or the whole new one, never a half;
concurrent writes of one name each land whole, the last rename wins. A write that fails (a bad
name, a full workspace) leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from ..errors import ConfigError, WorkbenchError

MAX_PATH_CHARS = 1024  # a path in a workspace
MAX_PART_BYTES = 255  # one name (the file systems' limit)
MAX_DEPTH = 64  # directory levels a walk goes down (each holds a descriptor open while it is walked)
CHUNK = 1 << 20
UPLOADING = ".wb-upload-"  # the prefix of a write's temporary file: not listed, not copied


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
    tmp = f"{UPLOADING}{secrets.token_hex(8)}"
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


def read_files(root: Path | None, paths: list[str], limit: int) -> dict[str, bytes]:
    """Each path's bytes (regular files, never through a link), within `limit` bytes in all; FileRefused
    names the first that cannot be read. For passing files to another session (a delegated child)."""
    if not paths:
        return {}
    if root is None:
        raise FileRefused("your hands have no workspace on this machine yet (run code first, or pass no files)")
    out: dict[str, bytes] = {}
    for path in paths:
        left = limit - sum(map(len, out.values()))
        too_big = FileRefused(f"cannot pass {path!r}: the files passed may hold {limit:,} bytes in all")
        try:
            with open_file(root, path, left) as (fh, _):
                data = fh.read(left + 1)
        except FileTooLarge:
            raise too_big from None
        except WorkbenchError as e:
            raise FileRefused(f"cannot read {path!r} from your workspace: {e}") from None
        if len(data) > left:  # it grew after it was opened
            raise too_big
        out[path] = data
    return out


# -- walking a whole tree ------------------------------------------------------------------------


def shown(path: str) -> str:
    """A path as text to show: the bytes of a name that are not UTF-8 as U+FFFD (the log takes no lone surrogate)."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


@dataclass
class Entry:
    """One entry met by a walk: its path under the root, what it is, and what was opened of it."""

    path: str  # a/b/c, names as the file system has them (bytes that are not UTF-8 as surrogate escapes)
    kind: str  # dir, file, link or other (FIFO, socket, device); `end` closes a directory after its entries
    st: os.stat_result  # fstat of the opened directory or file; lstat of a link or other (never opened)
    fd: int = -1  # the open directory or file (a file only if the walk opens files): valid until the walk goes on

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


class Walk:
    """The entries under `root` in order (a directory before its entries, sorted by name), never through a link.

    Each entry is opened relative to its parent's descriptor with O_NOFOLLOW (O_NONBLOCK for a file,
    so a FIFO swapped in never blocks) and judged by `fstat` of what was opened: an entry that was
    swapped for a link (or anything else) between the look and the open is left out with a note.
    Links and others are reported, never opened. Past `max_entries` or MAX_DEPTH the rest is left
    out, with a note, and `cut` is set.
    """

    def __init__(self, root: Path, *, max_entries: int, open_files: bool = True):
        self.root, self.max_entries, self.open_files = root, max_entries, open_files
        self.notes: list[str] = []
        self.cut = False
        self.count = 0
        self.full = False  # max_entries reached: nothing more is read

    def __iter__(self) -> Iterator[Entry]:
        top = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            yield from self._dir(top, "", 1)
        finally:
            os.close(top)

    def _dir(self, dfd: int, prefix: str, depth: int) -> Iterator[Entry]:
        for name in self._names(dfd, prefix):
            if name.startswith(UPLOADING):
                continue  # a write in progress
            self.count += 1
            entry = self._open(dfd, name, prefix + name)
            if entry is None:
                continue
            try:
                yield entry
                if entry.kind == "dir":
                    if depth < MAX_DEPTH:
                        yield from self._dir(entry.fd, entry.path + "/", depth + 1)
                    else:
                        self._leave_out(entry.path, f"its entries are left out (more than {MAX_DEPTH} levels deep)")
                    yield Entry(entry.path, "end", entry.st, entry.fd)
            finally:
                if entry.fd >= 0:
                    os.close(entry.fd)

    def _names(self, dfd: int, prefix: str) -> list[str]:
        """The directory's names, sorted; at most as many as the walk has room for (none once it is full)."""
        room = self.max_entries - self.count
        names: list[str] = []
        if self.full:
            return names
        with os.scandir(dfd) as it:
            for e in it:
                if len(names) >= room and not e.name.startswith(UPLOADING):
                    self.full = True
                    self._leave_out(prefix or "./", f"this and later entries are left out (at most {self.max_entries:,} "
                                    "are walked)")
                    break
                names.append(e.name)
        return sorted(names)

    def note(self, path: str, why: str) -> None:
        """Say why `path` is not (wholly) in what the walk gave (bytes that are not UTF-8 shown as U+FFFD)."""
        self.notes.append(f"{shown(path)}: {why}")

    def _leave_out(self, path: str, why: str) -> None:
        self.cut = True
        self.note(path, why)

    def _open(self, dfd: int, name: str, path: str) -> Entry | None:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            return None  # removed meanwhile
        if stat.S_ISLNK(st.st_mode):
            return Entry(path, "link", st)
        if stat.S_ISDIR(st.st_mode):
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
        elif stat.S_ISREG(st.st_mode):
            if not self.open_files:
                return Entry(path, "file", st)
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
        else:
            return Entry(path, "other", st)
        try:
            fd = os.open(name, flags, dir_fd=dfd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                self.note(path, "left out (it changed into a link or another kind of file while it was read)")
            elif e.errno != errno.ENOENT:  # gone meanwhile: nothing to say
                self.note(path, f"left out ({e.strerror or e})")
            return None
        opened = os.fstat(fd)
        if stat.S_IFMT(opened.st_mode) != stat.S_IFMT(st.st_mode):
            os.close(fd)
            self.note(path, "left out (it changed into another kind of file while it was read)")
            return None
        return Entry(path, "dir" if stat.S_ISDIR(opened.st_mode) else "file", opened, fd)


def list_files(root: Path, limit: int) -> tuple[list[dict[str, Any]], bool]:
    """The workspace's entries (files, directories, links: never followed), sorted by path; and whether cut."""
    walk = Walk(root, max_entries=limit, open_files=False)
    out: list[dict[str, Any]] = [
        {"path": shown(e.path), "type": e.kind,
         "bytes": e.st.st_size if e.kind == "file" else None, "mtime": e.st.st_mtime}
        for e in walk if e.kind != "end"]
    out.sort(key=lambda f: f["path"])
    return out, walk.cut


def copy_tree(src_root: Path, dst_root: Path, *, limit_bytes: int, max_entries: int,
              owner: tuple[int, int] | None = None) -> list[str]:
    """Copy the directories and regular files under `src_root` into `dst_root` (made if missing); notes on
    what was left out: links (never followed nor copied), FIFOs, sockets, devices, what passes `limit_bytes`
    or `max_entries`, what changed while it was read. `owner` (uid, gid): who the copies are for."""
    walk = Walk(src_root, max_entries=max_entries)
    with contextlib.suppress(FileExistsError):
        os.mkdir(dst_root, 0o755)
    top = os.open(dst_root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    stack = [top]  # the destination's directories down to the entry's parent; -1 where one could not be made
    total = 0
    try:
        if owner is not None:
            os.fchown(top, *owner)
        for e in walk:
            here = stack[-1]
            if e.kind == "end":
                if (done := stack.pop()) >= 0:
                    os.close(done)
            elif e.kind == "dir":
                stack.append(_make_dir(here, e, owner, walk.note) if here >= 0 else -1)
            elif here < 0:
                continue  # its directory could not be made: noted there
            elif e.kind == "file" and total + e.st.st_size > limit_bytes:
                walk.note(e.path, f"left out (the copy would pass {limit_bytes:,} bytes)")
            elif e.kind == "file":
                total += _copy_file(here, e, owner, walk.note)
            else:
                walk.note(e.path, f"left out ({'a symbolic link' if e.kind == 'link' else 'not a regular file'})")
    finally:
        for fd in stack:
            if fd >= 0:
                os.close(fd)
    return walk.notes


def _make_dir(parent: int, e: Entry, owner: tuple[int, int] | None, note: Callable[[str, str], None]) -> int:
    """The copy of directory `e` in `parent` (a descriptor), or -1 with a note."""
    try:
        os.mkdir(e.name, 0o755, dir_fd=parent)
        fd = os.open(e.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    except OSError as err:
        note(e.path + "/", f"not copied ({err.strerror or err})")
        return -1
    if owner is not None:
        os.fchown(fd, *owner)
    return fd


def _copy_file(parent: int, e: Entry, owner: tuple[int, int] | None, note: Callable[[str, str], None]) -> int:
    """Copy the open file of `e` into `parent` (a descriptor), at most the size it had when opened; bytes copied."""
    mode = 0o755 if e.st.st_mode & 0o100 else 0o644
    copied = 0
    try:
        out = os.open(e.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=parent)
    except OSError as err:
        note(e.path, f"not copied ({err.strerror or err})")
        return 0
    try:
        if owner is not None:
            os.fchown(out, *owner)
        while copied < e.st.st_size and (chunk := os.read(e.fd, min(CHUNK, e.st.st_size - copied))):
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view):]
            copied += len(chunk)
    except OSError as err:
        note(e.path, f"not copied ({err.strerror or err})")
        with contextlib.suppress(OSError):
            os.unlink(e.name, dir_fd=parent)
        copied = 0
    finally:
        os.close(out)
    return copied
