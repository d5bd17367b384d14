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

It runs before every kernel, so it imports little: os, signal, sys and ctypes (for prctl); its
options are read by hand (argparse, pathlib, json, typing and dataclasses were more than half of
its start: 20 to 30 ms of CPU per kernel). A command line it cannot read exits with code 2 and
says why, as argparse would.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

TYPE_CHECKING = False  # typing's own costs an import; mypy reads any TYPE_CHECKING as true
if TYPE_CHECKING:
    from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PARENT_GONE = 75  # the host died before the kernel could be bound to it; nobody waits for this code
# the fields of limits.Limits (its FIELDS; a test keeps the two equal), each an option --memory-mb, ...
LIMITS = ("memory_mb", "max_processes", "max_open_files", "max_file_mb", "cpu_seconds")


def command(argv: list[str], *, parent: int, supervise: bool = False, limits: Any = None,
            cgroup: str = "", report: str | None = None, processes_by: str = "") -> list[str]:
    """`argv` behind the launch wrapper, bound to host `parent`, with `limits` (a `Limits`); `processes_by`: see
    `limits.apply`."""
    pre = [sys.executable, "-I", "-S", os.path.realpath(__file__), "--parent", str(parent)]
    if supervise:
        pre.append("--supervise")
    if limits is not None and limits.any():
        pre += ["--cgroup", cgroup]
        for key in LIMITS:
            value = getattr(limits, key)
            if value:
                pre += [_flag(key), str(value)]
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
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "isolating", "limits.py")
    spec = importlib.util.spec_from_file_location("_workbench_limits", path)
    if spec is None or spec.loader is None or not os.path.exists(path):
        sys.exit(f"launch.py: {path} is missing")
    module = importlib.util.module_from_spec(spec)
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


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


USAGE = ("usage: launch.py --parent PID [--supervise] [--cgroup NAME] [--memory-mb N] [--max-processes N] "
         "[--max-open-files N] [--max-file-mb N] [--cpu-seconds N] [--report FILE] [--processes-by uid|namespace] "
         "-- COMMAND...")


def parse(argv: list[str]) -> dict[str, Any]:
    """The options (`--flag value` or `--flag=value`) and the command after `--`; exit 2 with the usage and the
    reason on anything else."""
    def bad(why: str) -> None:
        sys.stderr.write(f"{USAGE}\nlaunch.py: error: {why}\n")
        sys.exit(2)

    a: dict[str, Any] = {"parent": None, "supervise": False, "cgroup": "", "report": None, "processes_by": "",
                         **dict.fromkeys(LIMITS, 0)}
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        if arg == "--":
            a["command"] = rest
            break
        if arg == "--supervise":
            a["supervise"] = True
            continue
        name, eq, value = arg.partition("=")
        if name not in ("--parent", "--cgroup", "--report", "--processes-by", *map(_flag, LIMITS)):
            bad(f"unrecognized argument {arg[:80]!r}" if arg.startswith("-") else "the command must follow --")
        if not eq:
            if not rest:
                bad(f"{name} needs a value")
            value = rest.pop(0)
        key = name[2:].replace("-", "_")
        if key == "parent" or key in LIMITS:
            if not value.isascii() or not value.isdigit() or len(value) > 18:
                bad(f"{name} needs a whole number, not {value[:40]!r}")
            a[key] = int(value)
        elif key == "processes_by" and value not in ("", "uid", "namespace"):
            bad(f"{name} is uid or namespace, not {value[:40]!r}")
        else:
            a[key] = value
    if a["parent"] is None:
        bad("--parent is required")
    if not a.get("command"):
        bad("no command to run after --")
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse(sys.argv[1:] if argv is None else argv)
    if a["supervise"]:
        # until supervise() takes over, the host's death (SIGTERM) ends us before anything was started
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a sandboxed kernel is interrupted by message, never by signal
    bind_to_parent(a["parent"], signal.SIGTERM if a["supervise"] else signal.SIGKILL)
    asked = {key: a[key] for key in LIMITS}
    if any(asked.values()):
        limits_mod = _limits_module()
        how = limits_mod.apply(limits_mod.Limits(**asked), a["cgroup"], processes_by=a["processes_by"])
        if a["report"]:
            import json  # only here: it imports re

            with open(a["report"], "w") as f:
                json.dump(how, f)
    if a["supervise"]:
        supervise(a["command"])
    os.execvp(a["command"][0], a["command"])


if __name__ == "__main__":
    main()
