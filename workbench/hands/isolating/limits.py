"""Resource limits for one kernel, applied by the launch wrapper (launch.py) before it runs it.

Limits work in front of any argv (a plain ipykernel, or bwrap with its kernel inside),
because rlimits and cgroup membership are inherited across exec and fork. Memory and
processes go to a cgroup where one is writable (cgroup v1 `memory`/`pids` or a cgroup v2
tree with those controllers): an idle ipykernel maps ~800 MiB of *virtual* memory, so
RLIMIT_AS is only the fallback, set to the limit plus that overhead. RLIMIT_NPROC counts the
processes of a uid (in a user namespace: of that namespace), so without a pids cgroup it is set
here for a kernel that runs as a uid of its own (a root server's sandbox, `processes_by="uid"`),
left to the sandbox when it sets it inside its own user namespace (`"namespace"`), and otherwise
set only for a non-root uid, where it counts every process of that user (the report says so); as
root without a pids cgroup or a uid of its own the limit is not enforced. This module uses the
standard library alone: the wrapper loads it before any kernel.
"""

from __future__ import annotations

import os
import resource
import signal
import time

CGROUP_ROOT = "/sys/fs/cgroup"
GROUP_PARENT = "workbench"  # our cgroups live under <controller>/workbench/<name>
AS_OVERHEAD_MB = 1024  # virtual memory an idle ipykernel maps before any user data
MB = 1024 * 1024
FIELDS = ("memory_mb", "max_processes", "max_open_files", "max_file_mb", "cpu_seconds")


class Limits:
    """Per-kernel limits; 0 means no limit.

    A plain class, not a dataclass: the launch wrapper loads this module before every kernel, and importing
    `dataclasses` (with `inspect`, `re` and `enum` behind it) was a third of the wrapper's start."""

    __slots__ = FIELDS

    def __init__(self, memory_mb: int = 0, max_processes: int = 0, max_open_files: int = 0, max_file_mb: int = 0,
                 cpu_seconds: int = 0):
        self.memory_mb, self.max_processes, self.max_open_files = memory_mb, max_processes, max_open_files
        self.max_file_mb, self.cpu_seconds = max_file_mb, cpu_seconds

    def any(self) -> bool:
        return any(getattr(self, name) for name in FIELDS)

    def __repr__(self) -> str:
        return "Limits(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in FIELDS) + ")"


def _v1(controller: str) -> str | None:
    base = os.path.join(CGROUP_ROOT, controller)
    return base if os.path.exists(os.path.join(base, "cgroup.procs")) and os.access(base, os.W_OK) else None


def _v2() -> str | None:
    """The cgroup v2 root if it delegates memory and pids to us."""
    for base in (CGROUP_ROOT, os.path.join(CGROUP_ROOT, "unified")):
        ctl = os.path.join(base, "cgroup.controllers")
        if os.path.exists(ctl) and os.access(base, os.W_OK):
            have = _read(ctl).split()
            if "memory" in have and "pids" in have:
                return base
    return None


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _group_dirs(name: str) -> dict[str, str]:
    """Where the cgroups of kernel `name` live, per controller ('v2' for a unified tree)."""
    dirs = {}
    for ctrl in ("memory", "pids"):
        base = _v1(ctrl)
        if base is not None:
            dirs[ctrl] = os.path.join(base, GROUP_PARENT, name)
    if not dirs:
        base = _v2()
        if base is not None:
            dirs["v2"] = os.path.join(base, GROUP_PARENT, name)
    return dirs


def _join(group: str, settings: dict[str, str]) -> None:
    os.makedirs(group, exist_ok=True)
    parent = os.path.dirname(group)
    if os.path.basename(parent) == GROUP_PARENT and os.path.exists(os.path.join(parent, "cgroup.subtree_control")):
        try:  # v2: controllers must be enabled in the parent before a child can use them
            _write(os.path.join(os.path.dirname(parent), "cgroup.subtree_control"), "+memory +pids")
            _write(os.path.join(parent, "cgroup.subtree_control"), "+memory +pids")
        except OSError:
            pass
    for key, value in settings.items():
        _write(os.path.join(group, key), value)
    _write(os.path.join(group, "cgroup.procs"), str(os.getpid()))


def apply(limits: Limits, cgroup: str, processes_by: str = "") -> dict[str, str]:
    """Apply `limits` to this process (before exec); returns how each was enforced."""
    how: dict[str, str] = {}
    dirs = _group_dirs(cgroup)
    if limits.memory_mb:
        try:
            if "memory" in dirs:
                _join(dirs["memory"], {"memory.limit_in_bytes": str(limits.memory_mb * MB)})
                how["memory"] = "cgroup v1 memory"
            elif "v2" in dirs:
                _join(dirs["v2"], {"memory.max": str(limits.memory_mb * MB)})
                how["memory"] = "cgroup v2 memory"
            else:
                raise OSError("no writable memory cgroup")
        except OSError:
            cap = (limits.memory_mb + AS_OVERHEAD_MB) * MB
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            how["memory"] = f"RLIMIT_AS {limits.memory_mb + AS_OVERHEAD_MB} MiB (virtual)"
    if limits.max_processes:
        try:
            if "pids" in dirs:
                _join(dirs["pids"], {"pids.max": str(limits.max_processes)})
                how["processes"] = "cgroup v1 pids"
            elif "v2" in dirs:
                _join(dirs["v2"], {"pids.max": str(limits.max_processes)})
                how["processes"] = "cgroup v2 pids"
            else:
                raise OSError("no writable pids cgroup")
        except OSError:
            if processes_by == "namespace":
                how["processes"] = "RLIMIT_NPROC in the sandbox's own user namespace (counts only its processes)"
            elif processes_by == "uid":
                resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
                how["processes"] = "RLIMIT_NPROC of the sandbox's own uid (counts only its processes)"
            elif os.getuid() != 0:
                resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
                how["processes"] = "RLIMIT_NPROC (counts every process of this uid)"
            else:
                how["processes"] = "not enforced (root without a pids cgroup)"
    for key, res, value in (
        ("open_files", resource.RLIMIT_NOFILE, limits.max_open_files),
        ("file_size", resource.RLIMIT_FSIZE, limits.max_file_mb * MB),
        ("cpu", resource.RLIMIT_CPU, limits.cpu_seconds),
    ):
        if value:
            # the hard limit a bit above the soft one, so RLIMIT_CPU sends SIGXCPU before SIGKILL
            hard = value + 1 if res == resource.RLIMIT_CPU else value
            resource.setrlimit(res, (value, hard))
            how[key] = f"rlimit {value}"
    return how


def cleanup(cgroup: str, timeout: float = 2.0) -> None:
    """Kill whatever is left in a kernel's cgroups (a fork bomb's escapees) and remove them."""
    for group in _group_dirs(cgroup).values():
        if not os.path.exists(group):
            continue
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                pids = [int(p) for p in _read(os.path.join(group, "cgroup.procs")).split()]
            except OSError:
                break
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)
        try:
            os.rmdir(group)
        except OSError:
            pass


def members(cgroup: str) -> list[int]:
    """The pids in a kernel's cgroups (none when it has none)."""
    pids: set[int] = set()
    for group in _group_dirs(cgroup).values():
        try:
            pids.update(int(p) for p in _read(os.path.join(group, "cgroup.procs")).split())
        except (OSError, ValueError):
            continue
    return sorted(pids)


def oom_killed(cgroup: str) -> bool:
    """Whether the kernel's memory cgroup has OOM-killed a process."""
    dirs = _group_dirs(cgroup)
    try:
        for key, events in (("memory", "memory.oom_control"), ("v2", "memory.events")):
            if key in dirs:
                stats = dict(line.split() for line in _read(os.path.join(dirs[key], events)).splitlines())
                return int(stats.get("oom_kill", 0)) > 0
    except (OSError, ValueError):
        pass
    return False
