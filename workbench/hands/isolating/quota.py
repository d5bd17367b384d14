"""Session workspaces with a size limit: an ext4 image per session, mounted on the host.

Why: a workspace on the host's root file system is limited only per file
(RLIMIT_FSIZE), so kernel code can fill the disk the server and its log live
on. A mounted image caps the whole workspace (ENOSPC past the limit, inodes
included), lives on disk rather than in memory (a size-limited tmpfs would be
charged to the kernel's memory cgroup and compete with the host's RAM), is
mounted on the host, so it outlives kernel deaths and stays readable by the
host, and costs ~20 ms to make (mkfs and mount). Images are sparse: a
workspace uses the disk it holds, up to its size. This kernel has no quota
format for ext4 or XFS (QFMT_V2, XFS_QUOTA off), so no quota on a shared file
system was possible here.

How it is mounted depends on who the server is:
- root: a loop mount (`mount -o loop,nodev,nosuid`);
- anyone else: fuse2fs, an ext4 driver in user space, through the setuid
  `fusermount3` (Debian: fuse2fs, fuse3; /dev/fuse), so an unprivileged server's
  workspaces are limited too. Without them (or without /dev/fuse) the workspace
  is a plain directory and `how` says the quota is not enforced, and why: never
  silently.

    ws = create(root, size_mb, owner=(uid, gid))   # the kernel's workdir: ws.path
    ws.destroy()                                   # at shutdown; idempotent
    ws = keep(directory, size_mb, owner, root)     # a workspace kept across hosts (evals): made or mounted again
    reap(root)                                     # at host start: workspaces of dead hosts

Each workspace has a record `<name>.json` under `root` (its host's pid and start
time), written before anything is made, so a host killed at any point leaves
nothing `reap` cannot find. A kept workspace's image and directory are not the
host's to delete: `destroy` and `reap` only unmount it, and `keep` mounts it again
(handing its files to the new owner when the owner changed).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import psutil

from ...errors import ConfigError

if TYPE_CHECKING:
    from .identity import Identity

SBIN = "/usr/sbin:/sbin:/usr/bin:/bin"
KEPT_IMAGE, KEPT_DIR = "workspace.img", "work"  # in a kept workspace's directory
LABEL = re.compile(r"[A-Za-z0-9_-]{1,40}")
NAME = re.compile(r"(?:[A-Za-z0-9_-]{1,40}-)?[0-9a-f]{12}")
MAX_MB = 1 << 24  # 16 TiB, ext4's largest file: the image is one
TOOL_TIMEOUT = 60  # seconds for mkfs, mount or umount on a loaded machine


@dataclass
class WorkspaceSettings:
    """Host-level workspace settings (env: WORKBENCH_WORKSPACE_MB, WORKBENCH_WORKSPACE_ROOT)."""

    workspace_mb: int = 4096  # the size of each session's workspace; 0: no quota (a plain directory)
    workspace_root: str = ""  # where images and mount points live (default: Jupyter data dir/workbench/workspaces)


def default_root() -> Path:
    """`workbench/workspaces` in the Jupyter data dir: on disk, per user, never mounted in a sandbox."""
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / "workbench" / "workspaces"


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


@dataclass
class Workspace:
    """A session's workspace: a directory, with a size limit when `enforced`."""

    root: Path  # where its record lives (and its image and directory, unless it is kept elsewhere)
    name: str
    size_mb: int
    how: str  # for hands_started.limits: the quota, or why there is none
    enforced: bool = False
    identity: Identity | None = None  # who the sandbox's processes are, leased with the workspace (identity.py)
    kept: Path | None = None  # a kept workspace's directory: its image and mount point outlive the host

    @property
    def owner(self) -> tuple[int, int] | None:
        """The uid:gid its files are for when not this process's (its identity's)."""
        return self.identity.owner if self.identity is not None else None

    @property
    def path(self) -> Path:
        """The directory the kernel works in (bind it into the sandbox as its workdir)."""
        return self.kept / KEPT_DIR if self.kept is not None else self.root / self.name

    @property
    def image(self) -> Path:
        return self.kept / KEPT_IMAGE if self.kept is not None else self.root / f"{self.name}.img"

    def destroy(self) -> None:
        """Unmount the workspace (and delete it and its image unless it is kept), and give its identity back;
        safe to call twice."""
        _destroy(self.root, self.name, self.kept)
        atexit.unregister(self._at_exit)
        if self.identity is not None:
            self.identity.release()

    def _at_exit(self, pid: int) -> None:
        """A host that exits without destroying its workspaces (an exception, not a kill) leaves no mounts."""
        if pid != os.getpid():
            return  # a forked child exiting: the workspace is its parent's
        try:
            self.destroy()
        except (OSError, subprocess.SubprocessError):
            pass


def _check(size_mb: int, label: str) -> None:
    if isinstance(size_mb, bool) or not isinstance(size_mb, int) or not 0 <= size_mb <= MAX_MB:
        raise ConfigError(f"workspace_mb must be a whole number of MiB from 0 to {MAX_MB}, not {size_mb!r}")
    if label and not LABEL.fullmatch(label):
        raise ConfigError(f"a workspace label is 1-40 letters, digits, '-' or '_', not {label!r}")


def _begin(root: str | Path, size_mb: int, label: str, kept: Path | None) -> Workspace:
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = f"{label}-{uuid.uuid4().hex[:12]}" if label else uuid.uuid4().hex[:12]
    ws = Workspace(root, name, size_mb, "", kept=kept)
    _write_record(ws)
    atexit.register(ws._at_exit, os.getpid())
    return ws


def create(root: str | Path, size_mb: int, owner: tuple[int, int] | None = None, label: str = "") -> Workspace:
    """A new workspace under `root` of at most `size_mb` MiB, owned by `owner` (uid, gid)."""
    _check(size_mb, label)
    ws = _begin(root, size_mb, label, None)
    try:
        ws.path.mkdir(mode=0o700)
        _fill(ws, owner, fresh=True)
    except BaseException:
        ws.destroy()
        raise
    return ws


def keep(directory: str | Path, size_mb: int, owner: tuple[int, int] | None, root: str | Path, label: str = "") -> Workspace:
    """The workspace kept in `directory` (its image and mount point), made the first time and mounted again
    later (by this host or the next one); its record goes under `root` like any workspace's."""
    _check(size_mb, label)
    kept = Path(directory).resolve()
    kept.mkdir(parents=True, exist_ok=True, mode=0o700)
    ws = _begin(root, size_mb, label, kept)
    try:
        _unmount(ws.path)  # a dead host's mount (a loop, or fuse2fs with its daemon gone) is mounted again
        fresh = not ws.image.exists() and not (ws.path.is_dir() and any(ws.path.iterdir()))
        ws.path.mkdir(mode=0o700, exist_ok=True)
        _fill(ws, owner, fresh=fresh)
        if not fresh:
            hand_over(ws.path, owner or (os.geteuid(), os.getegid()))
    except BaseException:
        ws.destroy()
        raise
    return ws


def discard(directory: str | Path) -> None:
    """Delete a kept workspace (its image and mount point) once no one needs it, its hands stopped; never through a
    mount that could not be removed."""
    kept = Path(directory)
    path = kept / KEPT_DIR
    if path.is_symlink():  # not something we made: remove the link, never what it points to
        path.unlink()
    _unmount(path)
    if not _mounted(path):
        shutil.rmtree(kept, ignore_errors=True)


def hand_over(path: Path, owner: tuple[int, int]) -> None:
    """Give every file under `path` to `owner` (a kept workspace's new sandbox uid), never following a link."""
    if os.geteuid() != 0:
        return  # an unprivileged server's files are its own already
    top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.chown(top, *owner)
        for _, dirs, files, dfd in os.fwalk(dir_fd=top, follow_symlinks=False):
            for name in dirs + files:
                try:
                    os.chown(name, *owner, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    pass
    finally:
        os.close(top)


def _fill(ws: Workspace, owner: tuple[int, int] | None, fresh: bool) -> None:
    """Mount the workspace's image on its directory (making the image if `fresh`) when this host can."""
    size_mb = ws.size_mb
    if size_mb == 0:
        ws.how = "no quota (workspace_mb is 0); each file is limited by max_file_mb only"
    else:
        try:
            how = _mount_image(ws, owner or (os.geteuid(), os.getegid()), fresh)
            ws.enforced = True
            ws.how = f"{size_mb} MiB: {how}"
        except (OSError, subprocess.SubprocessError) as e:
            _unmount(ws.path)
            if fresh:
                ws.image.unlink(missing_ok=True)
            ws.how = f"not enforced: {e}; each file is limited by max_file_mb only"
    if not ws.enforced and owner is not None:
        os.chown(ws.path, *owner)


def reap(root: str | Path | None = None) -> list[str]:
    """Destroy the workspaces under `root` whose host process is gone; returns their names.

    Call it when a host starts, after reaping kernels. Workspaces of live hosts
    (other servers sharing the root) are left alone; a host is judged by pid and
    start time, so a reused pid does not keep a dead host's workspace alive.
    """
    root = Path(root) if root else default_root()
    if not root.is_dir():
        return []
    reaped = []
    for record in sorted(root.glob("*.json")):
        name = record.stem
        if not NAME.fullmatch(name):
            continue  # not ours: never act on a name we did not make
        entry: object = None
        try:
            entry = json.loads(record.read_text())
            assert isinstance(entry, dict)
            pid, started = int(entry["host_pid"]), float(entry["host_started"])
        except (OSError, ValueError, KeyError, TypeError, AssertionError):
            pid, started = 0, 0.0  # unreadable: its host cannot be checked, so it is treated as dead
        now = _start_time(pid) if pid > 0 else None
        if now is not None and abs(now - started) < 0.5:
            continue
        kept = entry.get("kept") if isinstance(entry, dict) and isinstance(entry.get("kept"), str) else None
        _destroy(root, name, Path(kept) if kept else None)
        reaped.append(name)
    return reaped


def _write_record(ws: Workspace) -> None:
    record = ws.root / f"{ws.name}.json"
    tmp = ws.root / f".{ws.name}.tmp"
    pid = os.getpid()
    kept = {"kept": str(ws.kept)} if ws.kept is not None else {}
    tmp.write_text(json.dumps({"host_pid": pid, "host_started": _start_time(pid), "size_mb": ws.size_mb, **kept}))
    tmp.replace(record)


def _run(*argv: str, env: dict[str, str] | None = None) -> None:
    tool = shutil.which(argv[0], path=SBIN)
    if tool is None:
        raise OSError(f"{argv[0]} is not installed (Debian: {PACKAGES.get(argv[0], 'e2fsprogs, mount')})")
    p = subprocess.run([tool, *argv[1:]], capture_output=True, text=True, timeout=TOOL_TIMEOUT,
                       env=env or {"PATH": SBIN}, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
        raise OSError(f"{argv[0]} failed: {why}")


PACKAGES = MappingProxyType({"fuse2fs": "fuse2fs", "fusermount3": "fuse3"})  # the Debian package of a tool


def _mount_image(ws: Workspace, owner: tuple[int, int], fresh: bool) -> str:
    """Make the image (when fresh) and mount it on ws.path; how it is mounted."""
    if fresh:
        with open(ws.image, "xb") as f:  # x: never reuse (or follow) something already there
            f.truncate(ws.size_mb * 1024 * 1024)
        os.chmod(ws.image, 0o600)
        uid, gid = owner
        # -m 0: the sandbox uid may use every block (root's reserve would be the host's, not the kernel's)
        _run("mkfs.ext4", "-q", "-F", "-m", "0", "-E", f"root_owner={uid}:{gid},lazy_itable_init=1,lazy_journal_init=1",
             str(ws.image))
    elif ws.image.is_symlink() or not ws.image.is_file():
        raise OSError(f"{ws.image} is not the workspace image this host made")
    if os.geteuid() == 0:
        _run("mount", "-o", "loop,nodev,nosuid,noatime", str(ws.image), str(ws.path))
        how = "a loop-mounted ext4 image"
    else:
        _fuse_mount(ws)
        how = "an ext4 image mounted with fuse2fs (the server is not root)"
    if fresh:
        os.rmdir(ws.path / "lost+found")  # an empty workspace, as the kernel expects
    return how


def _fuse_mount(ws: Workspace) -> None:
    """Mount the image with fuse2fs as this (unprivileged) user; it runs as a daemon until it is unmounted."""
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        raise OSError("/dev/fuse is missing or closed to this user, and an unprivileged server can only mount a "
                      "workspace image through it")
    fusermount = shutil.which("fusermount3", path=SBIN)
    if fusermount is None:
        raise OSError("fusermount3 is not installed (Debian: fuse3)")
    # fuse2fs is built with libfuse 2, which mounts by running `fusermount`: fusermount3 speaks its protocol
    with tempfile.TemporaryDirectory(prefix="workbench-fuse-") as shim:
        os.symlink(fusermount, os.path.join(shim, "fusermount"))
        _run("fuse2fs", str(ws.image), str(ws.path), "-o", "fsname=workbench,nosuid,nodev,noatime",
             env={"PATH": f"{shim}:{SBIN}"})


def _mounted(path: Path) -> bool:
    """Whether something is mounted on `path` (from mountinfo: a FUSE mount whose daemon died fails stat)."""
    want = os.fsencode(os.path.abspath(path))
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            for line in f:
                point = line.split(b" ")[4]
                if _unescape(point) == want:
                    return True
    except OSError:
        return os.path.ismount(path)
    return False


def _unescape(field: bytes) -> bytes:
    """A mountinfo path field: spaces, tabs, newlines and backslashes are written as octal escapes."""
    return re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field)


def _unmount(path: Path) -> None:
    if not _mounted(path):
        return
    if os.geteuid() == 0:
        try:
            _run("umount", str(path))
        except (OSError, subprocess.SubprocessError):
            _run("umount", "--lazy", str(path))  # busy (a process still in it): detach now, free when it leaves
        return
    try:
        _run("fusermount3", "-u", str(path))
    except (OSError, subprocess.SubprocessError):
        _run("fusermount3", "-u", "-z", str(path))  # busy, or its daemon is gone: detach now


def _destroy(root: Path, name: str, kept: Path | None = None) -> None:
    path = kept / KEPT_DIR if kept is not None else root / name
    if path.is_symlink():  # not something we made: remove the link, never what it points to
        path.unlink()
    _unmount(path)
    if kept is None:
        (root / f"{name}.img").unlink(missing_ok=True)  # a loop still held by a live sandbox frees it when that ends
        if not _mounted(path):  # never delete through a mount we could not remove
            shutil.rmtree(path, ignore_errors=True)
    (root / f"{name}.json").unlink(missing_ok=True)
