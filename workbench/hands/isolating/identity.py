"""Who a sandbox's processes are on this machine: an identity of its own for every live workspace.

Why: Linux counts some resources per user: inotify instances and watches, processes under
RLIMIT_NPROC, POSIX message queue bytes, pending signals, pipe buffers. Sandboxes that share a
host uid share those counts, across servers: one session that opened 128 inotify instances left
every other session of the machine with none (`inotify_init1` failed with EMFILE).

- **A root server** gives each live sandbox a host uid and gid of its own, leased from a range
  (`sandbox_uid` .. `sandbox_uid + sandbox_ids - 1`, the same for gids). A lease is a lock on
  a file named for the uid in a root-only directory (`/run/workbench/sandbox-ids`), held by the
  server that leased it and dropped when the workspace goes or the server dies; a uid that some
  process of this machine still runs as (a dead server's sandbox, not reaped yet, or anything
  else that uses the number) is skipped, so two sandboxes never share one. Every per-user count
  is then the session's own.
- **An unprivileged server** cannot run anything as another host uid. Each sandbox is a user
  namespace of its own: the kernel counts processes (RLIMIT_NPROC), message queue bytes and
  pending signals per namespace (Linux 5.14 and later) when the limit is set inside it, so the
  sandbox sets them there (`inside()`), and inotify instances and watches are capped per namespace
  (its `/proc/sys/user` limits, written before the kernel drops every capability). One session
  that exhausts its share leaves the others theirs. What it cannot have is a uid of its own:
  the files its kernel writes are the user's, and all sessions together stay within the user's
  own limits (the sum of the shares is what is left to the user's other programs).

    ids = Identities(settings)
    me = ids.lease()          # Identity(uid, gid, ...); me.owner: None when it is this process's uid
    me.release()              # when the workspace (or the session's hands) goes; safe twice
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ConfigError, WorkbenchError

LEASE_DIR = Path("/run/workbench/sandbox-ids")
MAX_ID = 2**31 - 2  # ids above this are read as negative by some tools; 2**32-1 is (uid_t)-1
MAX_IDS = 1 << 20


class NoIdentity(WorkbenchError):
    """Every uid of the sandbox range is leased or in use on this machine (the message says how to get more)."""

    http_status = 503


@dataclass
class Identity:
    """The host uid:gid a sandbox's processes run as, and how per-user limits are kept apart."""

    uid: int
    gid: int
    how: str  # for hands_started.limits (identity)
    own: bool  # a uid of its own on this machine (a root server's lease), not the server's
    _lock: int | None = field(default=None, repr=False)

    @property
    def owner(self) -> tuple[int, int] | None:
        """uid:gid for the files made for this sandbox when they are not this process's (else None)."""
        return (self.uid, self.gid) if self.own else None

    def release(self) -> None:
        """Give the uid back (its lock file stays, unlocked); safe to call twice."""
        fd, self._lock = self._lock, None
        if fd is not None:
            os.close(fd)


@dataclass
class Shares:
    """What one unprivileged sandbox may use of its user's per-user limits (its namespace's own)."""

    inotify_instances: int = 16
    inotify_watches: int = 8192
    msgqueue_bytes: int = 64 * 1024

    def script(self) -> str:
        """Shell that caps inotify in the sandbox's own user namespace (run while it still holds CAP_SYS_RESOURCE)."""
        return (f"echo {self.inotify_instances} > /proc/sys/user/max_inotify_instances && "
                f"echo {self.inotify_watches} > /proc/sys/user/max_inotify_watches")


class Identities:
    """Leases sandbox identities for one host (see the module docstring)."""

    def __init__(self, first_uid: int, first_gid: int, count: int, shares: Shares | None = None,
                 lease_dir: Path = LEASE_DIR):
        for name, value, top in (("sandbox_uid", first_uid, MAX_ID), ("sandbox_gid", first_gid, MAX_ID),
                                 ("sandbox_ids", count, MAX_IDS)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise ConfigError(f"{name} must be a whole number from 1 to {top}, not {value!r}")
        if first_uid + count - 1 > MAX_ID or first_gid + count - 1 > MAX_ID:
            raise ConfigError(f"sandbox_uid/sandbox_gid + sandbox_ids must stay at or below {MAX_ID}")
        self.first_uid, self.first_gid, self.count = first_uid, first_gid, count
        self.shares = shares or Shares()
        self.lease_dir = lease_dir
        self.root = os.geteuid() == 0

    def lease(self) -> Identity:
        """A uid of its own (a root server) or the server's own in a namespace of its own (otherwise)."""
        if not self.root:
            s = self.shares
            return Identity(os.getuid(), os.getgid(), (
                f"the server's uid in a user namespace of its own: processes, message queues ({s.msgqueue_bytes} "
                f"bytes) and signals counted per namespace, inotify capped at {s.inotify_instances} instances and "
                f"{s.inotify_watches} watches per session; not a uid of its own (an unprivileged server cannot "
                "run anything as another uid)"), own=False)
        directory = self._directory()
        # Locked first, then looked at: a look after the lock is the one that decides (a process that took the
        # number before it is seen), so one scan of /proc serves a lease (a few ms of CPU on a busy machine). A uid
        # an earlier look of this lease saw in use is skipped without a lock.
        busy: set[int] = set()
        for k in range(self.count):
            uid = self.first_uid + k
            if uid in busy:
                continue
            fd = os.open(directory / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            busy = _uids_in_use()
            if uid in busy:  # a process of this machine runs as it (a dead server's sandbox, say)
                os.close(fd)
                continue
            return Identity(uid, self.first_gid + k, f"uid {uid} of its own (leased from {self.first_uid}-"
                            f"{self.first_uid + self.count - 1}): every per-user count is the session's", own=True, _lock=fd)
        raise NoIdentity(f"all {self.count} sandbox uids from {self.first_uid} are in use on this machine; "
                         "raise sandbox_ids (WORKBENCH_SANDBOX_IDS) or close idle sessions")

    def _directory(self) -> Path:
        """The root-only directory of lease files, made if missing; never one someone else could have planted."""
        d = self.lease_dir
        with contextlib.suppress(FileExistsError):
            d.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            d.mkdir(mode=0o700)
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            raise ConfigError(f"{d} must be a directory owned by root and writable by root alone")
        return d


def _uids_in_use() -> set[int]:
    """Every uid (real, effective, saved or file system) some process of this machine runs as."""
    found: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        found.update(int(x) for x in line.split()[1:])
                        break
        except OSError:
            continue  # gone meanwhile
    return found
