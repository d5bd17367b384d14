"""Stopping every process of a kernel while its workspace is copied, and letting them go on after.

Why: a verifier copies the agent's workspace while the agent's kernel is alive, and the agent's
code may have left a daemon that keeps changing it (swapping a directory for a link, growing a
file). The copy never follows a link whatever happens (files.py); stopping the agent's processes
for the copy also makes it one consistent picture of the workspace as the turn left it.

Which processes: every descendant of the kernel's process (the launch wrapper when it supervises
a sandbox: a subreaper, and bwrap's init inside reaps the sandbox's orphans, so daemons that left
their parent stay under it), and every member of the kernel's cgroups (limits.py), which catches a
local kernel's daemons that left its tree. A supervising wrapper is not stopped itself: it must stay
able to end everything below it if the host dies meanwhile (SIGKILL ends a stopped process).

How: SIGSTOP through a pidfd (the process found, never a later one that got its pid), in rounds
until a round finds no new process (a stopped process forks no more), then a wait until each is
seen stopped. `cont()` sends SIGCONT in the reverse order. A kernel's state survives both.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

MAX_ROUNDS = 50  # rounds of looking for new processes: a fork bomb's pids limit ends it sooner
STOP_WAIT = 10.0  # seconds to wait until every signalled process is seen stopped (a loaded machine)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: the fields start after the last ')'
    fields = raw[raw.rindex(b")") + 2:].split()
    return fields[0].decode(), int(fields[1])


def parents() -> dict[int, int]:
    """Every process's parent pid."""
    out = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
            out[int(entry.name)] = st[1]
    return out


def _children(pid: int) -> list[int] | None:
    """The child pids of every thread of `pid` (the kernel's `children` lists); [] when it is gone, None when this
    kernel keeps no such list (CONFIG_PROC_CHILDREN off)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except FileNotFoundError:
            if os.path.isdir(f"/proc/{pid}/task/{tid}"):
                return None  # the thread is there and its list is not: this kernel keeps none
        except OSError:
            continue  # the thread ended meanwhile
    return out


def tree(root: int) -> set[int]:
    """The pids under `root` (not root itself): read down from it through each thread's `children` list, a few
    files per process of the tree, where `parents()` reads every process of the machine (a few ms of CPU on a
    busy one); through `parents()` where the kernel keeps no such lists. A process forking meanwhile may be
    missed by either: `stop` looks again, in rounds, until a round finds nothing new."""
    found: set[int] = set()
    todo = [root]
    while todo:
        kids = _children(todo.pop())
        if kids is None:
            return descendants(root, parents())
        for child in kids:
            if child not in found and child != root:
                found.add(child)
                todo.append(child)
    return found


def descendants(root: int, parent_of: dict[int, int]) -> set[int]:
    """The pids under `root` (not root itself)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parent_of.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


@dataclass
class Stopped:
    """The processes `stop` stopped (in that order), each by a pidfd, and notes on what did not go as asked."""

    pids: list[int] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)  # pidfds, or -1 where the system has none
    notes: list[str] = field(default_factory=list)

    def cont(self) -> None:
        """SIGCONT to every stopped process, the last stopped first; then close the pidfds."""
        for pid, fd in reversed(list(zip(self.pids, self.fds, strict=True))):
            with contextlib.suppress(ProcessLookupError):
                _signal(pid, fd, signal.SIGCONT)
        for fd in self.fds:
            if fd >= 0:
                os.close(fd)
        self.pids, self.fds = [], []


def _signal(pid: int, fd: int, sig: int) -> None:
    if fd >= 0:
        signal.pidfd_send_signal(fd, sig)
    else:
        os.kill(pid, sig)


def stop(root: int, *, keep_root: bool, members: Callable[[], Iterable[int]] = tuple) -> Stopped:
    """SIGSTOP every process under `root` and every pid `members()` gives (a cgroup's), root too unless `keep_root`."""
    done = Stopped()
    seen: set[int] = set()
    for _ in range(MAX_ROUNDS):
        found = tree(root) | set(members())
        if keep_root:
            found.discard(root)
        else:
            found.add(root)
        new = sorted(found - seen)
        if not new:
            break
        seen.update(new)
        for pid in new:
            _stop_one(pid, root, found, members, done)
    else:
        done.notes.append(f"processes were still appearing after {MAX_ROUNDS} rounds of stopping them")
    _wait_stopped(done)
    return done


def _stop_one(pid: int, root: int, found: set[int], members: Callable[[], Iterable[int]], done: Stopped) -> None:
    """SIGSTOP `pid` through a pidfd opened first, if the process it holds is still one of ours: the root, a child
    of one found, or in the cgroup (judged after the pidfd was opened: never a later process that got its pid)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError:  # no pidfds here (an old kernel, a seccomp filter): a plain signal, checked the same way
        fd = -1
    try:
        st = _stat(pid)
        if st is not None and (pid == root or st[1] == root or st[1] in found or pid in set(members())):
            _signal(pid, fd, signal.SIGSTOP)
            done.pids.append(pid)
            done.fds.append(fd)
            return
    except ProcessLookupError:
        pass
    if fd >= 0:
        os.close(fd)


def _wait_stopped(done: Stopped) -> None:
    """Until each stopped process is seen stopped (or gone): a signal is delivered when its target next runs."""
    deadline = time.monotonic() + STOP_WAIT
    waiting = list(done.pids)
    while waiting:
        waiting = [pid for pid in waiting if (st := _stat(pid)) is not None and st[0] not in ("T", "t", "Z", "X")]
        if not waiting:
            return
        if time.monotonic() > deadline:
            done.notes.append(f"{len(waiting)} process(es) had not stopped after {STOP_WAIT:g} s (in a long system call)")
            return
        time.sleep(0.005)
