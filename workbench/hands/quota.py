"""Session workspaces with a size limit: an ext4 image per session, loop-mounted on the host.

Why: a workspace on the host's root file system is limited only per file
(RLIMIT_FSIZE), so kernel code can fill the disk the server and its log live
on. A loop-mounted image caps the whole workspace (ENOSPC past the limit,
inodes included), lives on disk rather than in memory (a size-limited tmpfs
would be charged to the kernel's memory cgroup and compete with the host's
RAM), is mounted on the host, so it outlives kernel deaths and stays readable
by the host, and costs ~20 ms to make (mkfs and mount). Images are sparse: a
workspace uses the disk it holds, up to its size. This kernel has no quota
format for ext4 or XFS (QFMT_V2, XFS_QUOTA off), so no quota on a shared
file system was possible here.

Only root can loop-mount. Elsewhere (an unprivileged server, or a container
without loop devices) the workspace is a plain directory and `how` says the
quota is not enforced, and why: never silently.

    ws = create(root, size_mb, owner=(uid, gid))   # the kernel's workdir: ws.path
    ws.destroy()                                   # at shutdown; idempotent
    reap(root)                                     # at host start: workspaces of dead hosts

Each workspace has a record `<name>.json` beside it (its host's pid and start
time), written before anything is made, so a host killed at any point leaves
nothing `reap` cannot find.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..errors import ConfigError

SBIN = "/usr/sbin:/sbin:/usr/bin:/bin"
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

    root: Path
    name: str
    size_mb: int
    how: str  # for hands_started.limits: the quota, or why there is none
    enforced: bool = False

    @property
    def path(self) -> Path:
        """The directory the kernel works in (bind it into the sandbox as its workdir)."""
        return self.root / self.name

    @property
    def image(self) -> Path:
        return self.root / f"{self.name}.img"

    def destroy(self) -> None:
        """Unmount and delete the workspace and its image; safe to call twice, or after a crash."""
        _destroy(self.root, self.name)
        atexit.unregister(self._at_exit)

    def _at_exit(self, pid: int) -> None:
        """A host that exits without destroying its workspaces (an exception, not a kill) leaves no mounts."""
        if pid != os.getpid():
            return  # a forked child exiting: the workspace is its parent's
        try:
            self.destroy()
        except (OSError, subprocess.SubprocessError):
            pass


def create(root: str | Path, size_mb: int, owner: tuple[int, int] | None = None, label: str = "") -> Workspace:
    """A new workspace under `root` of at most `size_mb` MiB, owned by `owner` (uid, gid)."""
    if isinstance(size_mb, bool) or not isinstance(size_mb, int) or not 0 <= size_mb <= MAX_MB:
        raise ConfigError(f"workspace_mb must be a whole number of MiB from 0 to {MAX_MB}, not {size_mb!r}")
    if label and not LABEL.fullmatch(label):
        raise ConfigError(f"a workspace label is 1-40 letters, digits, '-' or '_', not {label!r}")
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = f"{label}-{uuid.uuid4().hex[:12]}" if label else uuid.uuid4().hex[:12]
    ws = Workspace(root, name, size_mb, "")
    _write_record(ws)
    atexit.register(ws._at_exit, os.getpid())
    try:
        _fill(ws, owner)
    except BaseException:
        ws.destroy()
        raise
    return ws


def _fill(ws: Workspace, owner: tuple[int, int] | None) -> None:
    """Make the workspace's directory, with its image mounted on it when this host can."""
    size_mb = ws.size_mb
    ws.path.mkdir(mode=0o700)
    if size_mb == 0:
        ws.how = "no quota (workspace_mb is 0); each file is limited by max_file_mb only"
    elif os.geteuid() != 0:
        ws.how = ("not enforced: only root can loop-mount a workspace image and this server is not root; "
                  "each file is limited by max_file_mb only")
    else:
        try:
            _make_image(ws, owner or (os.geteuid(), os.getegid()))
            ws.enforced = True
            ws.how = f"{size_mb} MiB: a loop-mounted ext4 image"
        except (OSError, subprocess.SubprocessError) as e:
            _unmount(ws.path)
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
        try:
            entry = json.loads(record.read_text())
            pid, started = int(entry["host_pid"]), float(entry["host_started"])
        except (OSError, ValueError, KeyError, TypeError):
            pid, started = 0, 0.0  # unreadable: its host cannot be checked, so it is treated as dead
        now = _start_time(pid) if pid > 0 else None
        if now is not None and abs(now - started) < 0.5:
            continue
        _destroy(root, name)
        reaped.append(name)
    return reaped


def _write_record(ws: Workspace) -> None:
    record = ws.root / f"{ws.name}.json"
    tmp = ws.root / f".{ws.name}.tmp"
    pid = os.getpid()
    tmp.write_text(json.dumps({"host_pid": pid, "host_started": _start_time(pid), "size_mb": ws.size_mb}))
    tmp.replace(record)


def _run(*argv: str) -> None:
    tool = shutil.which(argv[0], path=SBIN)
    if tool is None:
        raise OSError(f"{argv[0]} is not installed (Debian: e2fsprogs, mount)")
    p = subprocess.run([tool, *argv[1:]], capture_output=True, text=True, timeout=TOOL_TIMEOUT, env={"PATH": SBIN})
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
        raise OSError(f"{argv[0]} failed: {why}")


def _make_image(ws: Workspace, owner: tuple[int, int]) -> None:
    with open(ws.image, "xb") as f:  # x: never reuse (or follow) something already there
        f.truncate(ws.size_mb * 1024 * 1024)
    os.chmod(ws.image, 0o600)
    uid, gid = owner
    # -m 0: the sandbox uid may use every block (root's reserve would be the host's, not the kernel's)
    _run("mkfs.ext4", "-q", "-F", "-m", "0", "-E", f"root_owner={uid}:{gid},lazy_itable_init=1,lazy_journal_init=1",
         str(ws.image))
    _run("mount", "-o", "loop,nodev,nosuid,noatime", str(ws.image), str(ws.path))
    os.rmdir(ws.path / "lost+found")  # an empty workspace, as the kernel expects


def _unmount(path: Path) -> None:
    if not os.path.ismount(path):
        return
    try:
        _run("umount", str(path))
    except (OSError, subprocess.SubprocessError):
        _run("umount", "--lazy", str(path))  # busy (a process still in it): detach now, free when it leaves


def _destroy(root: Path, name: str) -> None:
    path = root / name
    if path.is_symlink():  # not something we made: remove the link, never what it points to
        path.unlink()
    _unmount(path)
    (root / f"{name}.img").unlink(missing_ok=True)  # a loop still held by a live sandbox frees it when that ends
    if not os.path.ismount(path):  # never delete through a mount we could not remove
        shutil.rmtree(path, ignore_errors=True)
    (root / f"{name}.json").unlink(missing_ok=True)
