"""The launch wrapper in front of every kernel: bind it to its host, apply its limits, run it.

    python -I -S .../workbench/hands/launching/launch.py --parent PID [--supervise] [--cgroup NAME
        --memory-mb N ... --report FILE] -- <kernel argv>

It runs as a file, on the standard library alone, before every kernel (plain or sandboxed).

1. Bind to the host. `PR_SET_PDEATHSIG` makes the kernel die with the host; but a host that
   died between fork and that call is never noticed, so the wrapper then checks that its
   parent is still the host pid it was given and exits if not. Without this, a host killed
   while a (pooled) kernel was booting left a bwrap reparented to init, with the kernel
   inside running forever: bwrap sets its own `--die-with-parent` only after it has parsed
   its arguments and cloned, tens of milliseconds after the host forked it.
2. Apply the limits (`limits.apply`: cgroups and rlimits, inherited across exec and fork).
3. Exec the kernel. With `--supervise` (for commands that start a process of their own
   before binding it, like bwrap's init in a new pid namespace), stay as the parent
   instead: on the host's death, or a SIGTERM, kill the whole process group (the command
   and anything it left reparented); else exit the way the command did.

The parent-death signal goes to the *thread* that forked: the host must start kernels from
a thread that lives as long as they do (its event loop's).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PARENT_GONE = 75  # the host died before the kernel could be bound to it; nobody waits for this code
LIMIT_FLAGS = ("memory-mb", "max-processes", "max-open-files", "max-file-mb", "cpu-seconds")


def command(argv: list[str], *, parent: int, supervise: bool = False, limits: Any = None,
            cgroup: str = "", report: str | None = None, processes_by: str = "") -> list[str]:
    """`argv` behind the launch wrapper, bound to host `parent`, with `limits` (a `Limits`); `processes_by`: see
    `limits.apply`."""
    pre = [sys.executable, "-I", "-S", str(Path(__file__).resolve()), "--parent", str(parent)]
    if supervise:
        pre.append("--supervise")
    if limits is not None and limits.any():
        pre += ["--cgroup", cgroup]
        for flag in LIMIT_FLAGS:
            value = getattr(limits, flag.replace("-", "_"))
            if value:
                pre += ["--" + flag, str(value)]
        if report:
            pre += ["--report", report]
        if processes_by:
            pre += ["--processes-by", processes_by]
    return pre + ["--"] + list(argv)


def bind_to_parent(parent: int, sig: int) -> None:
    """Get `sig` when the host dies; exit now if it already has (we were reparented)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        sys.exit(f"launch.py: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}")
    if os.getppid() != parent:
        os._exit(PARENT_GONE)


def _limits_module() -> Any:
    # loaded by path: run as a file with -I, the package is not on sys.path (and must not be)
    path = Path(__file__).resolve().parent.parent / "isolating" / "limits.py"
    spec = importlib.util.spec_from_file_location("_workbench_limits", path)
    if spec is None or spec.loader is None:
        sys.exit(f"launch.py: {path} is missing")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses looks its module up while building the class
    spec.loader.exec_module(module)
    return module


def children(pid: int) -> list[int]:
    """The pids whose parent is `pid` (from /proc: this wrapper has no psutil)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            # the command name may hold spaces and parentheses: the fields start after the last ')'
            if int(stat[stat.rindex(b")") + 2 :].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def end_subtree(me: int) -> None:
    """SIGKILL our children until none is left, including any orphan reparented to us meanwhile."""
    while True:
        for pid in children(me):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def supervise(argv: list[str]) -> None:
    """Run `argv` as our child; on SIGTERM (the host's death, or a kill) end everything below us."""
    me = os.getpid()
    # a subreaper: a process the command leaves behind (bwrap's init, before it binds itself
    # to bwrap) becomes our child instead of init's, so it is ours to end
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def end(signum: int, frame: object) -> None:
        end_subtree(me)
        os._exit(128 + signum)

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        bind_to_parent(me, signal.SIGKILL)
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    signal.signal(signal.SIGTERM, end)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            break
    end_subtree(me)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(me, sig)
    os._exit(os.waitstatus_to_exitcode(status))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="launch.py", description="bind a kernel to its host, set limits, run it")
    p.add_argument("--parent", type=int, required=True, help="the host's pid: exit if it is not our parent")
    p.add_argument("--supervise", action="store_true", help="stay as the command's parent and end its group with the host")
    p.add_argument("--cgroup", default="", help="the name of this kernel's cgroup")
    for flag in LIMIT_FLAGS:
        p.add_argument("--" + flag, type=int, default=0)
    p.add_argument("--report", help="write how each limit was enforced to this JSON file")
    p.add_argument("--processes-by", choices=("", "uid", "namespace"), default="",
                   help="uid: the kernel runs as a uid of its own; namespace: it sets RLIMIT_NPROC in its user namespace")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        p.error("no command to run after --")
    if a.supervise:
        # until supervise() takes over, the host's death (SIGTERM) ends us before anything was started
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a sandboxed kernel is interrupted by message, never by signal
    bind_to_parent(a.parent, signal.SIGTERM if a.supervise else signal.SIGKILL)
    limits_mod = _limits_module()
    limits = limits_mod.Limits(**{f.replace("-", "_"): getattr(a, f.replace("-", "_")) for f in LIMIT_FLAGS})
    if limits.any():
        how = limits_mod.apply(limits, a.cgroup, processes_by=a.processes_by)
        if a.report:
            Path(a.report).write_text(json.dumps(how))
    if a.supervise:
        supervise(cmd)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
