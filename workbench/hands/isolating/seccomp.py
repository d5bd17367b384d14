"""A seccomp filter for sandboxed kernels: calls a kernel never needs fail as if this Linux lacked them.

Why: kernel objects scoped to a uid are shared by every sandbox running as
that uid, across hosts, and outlive the kernel. Measured on the dev VM: a key
that one sandbox put in its user keyring (`add_key`) was read by a sandbox
that a different host process started later; and every sandbox possesses the
session keyring of the process that started it, so it could read keys the
server had put there (as root and as an unprivileged server alike). A
distinct uid per sandbox would not close the second hole (possession beats
uid), so the keyring calls are simply not there for kernel code. The same
filter removes kernel attack surface no notebook kernel uses: bpf,
perf_event_open, userfaultfd, io_uring, modules and kexec, mounts, new
namespaces, ptrace and other processes' memory.

How: libseccomp (through pyseccomp) compiles the filter for the native
architecture; bwrap loads it with `--seccomp FD` as the last step before it
execs the command, so it covers setpriv, the kernel and all it starts.
A denied call returns an errno and never kills: ENOSYS ("not in this
kernel", so feature probes fall back), EPERM for new namespaces (as on a
host that forbids them). Calls of any other architecture (i386 `int 0x80`,
x32) fail with ENOSYS, so no second syscall table gets around the list.

    flt = prepare(SeccompSettings())               # once per host (the file goes to the Jupyter runtime dir)
    argv = flt.wrap(bwrap_argv)                    # per kernel: opens the program as fd 3 for bwrap
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from ...errors import ConfigError

FD = 3  # the descriptor bwrap reads the program from; the wrapper shell opens it just before exec
WRAP = f'exec "$@" {FD}<"$0"'  # sh -c WRAP FILTER bwrap ...: fd 3 is the filter, then bwrap replaces sh

# CLONE_NEW* flags of clone(2). CLONE_NEWTIME is left out: in clone() its bit is part of the exit signal.
CLONE_NEW = MappingProxyType({"ns": 0x00020000, "cgroup": 0x02000000, "uts": 0x04000000, "ipc": 0x08000000,
             "user": 0x10000000, "pid": 0x20000000, "net": 0x40000000})  # fmt: skip

NOSYS, PERM = errno.ENOSYS, errno.EPERM
DENIED: Mapping[str, int] = MappingProxyType({
    # uid-scoped and inherited keyrings: shared between sandboxes and with the host (see above)
    "add_key": NOSYS, "keyctl": NOSYS, "request_key": NOSYS,
    # kernel attack surface no notebook kernel uses
    "bpf": NOSYS, "perf_event_open": NOSYS, "userfaultfd": NOSYS,
    "io_uring_setup": NOSYS, "io_uring_enter": NOSYS, "io_uring_register": NOSYS,
    # the machine's business, not a kernel's
    "init_module": NOSYS, "finit_module": NOSYS, "delete_module": NOSYS, "kexec_load": NOSYS,
    "kexec_file_load": NOSYS, "reboot": NOSYS, "swapon": NOSYS, "swapoff": NOSYS, "acct": NOSYS,
    "syslog": NOSYS, "settimeofday": NOSYS, "clock_settime": NOSYS, "quotactl": NOSYS, "quotactl_fd": NOSYS,
    "iopl": NOSYS, "ioperm": NOSYS, "modify_ldt": NOSYS, "uselib": NOSYS, "lookup_dcookie": NOSYS,
    "fanotify_init": NOSYS, "vhangup": NOSYS,
    # mounts: the sandbox's file system is bwrap's to build, and stays as built
    "mount": NOSYS, "umount2": NOSYS, "pivot_root": NOSYS, "chroot": NOSYS, "move_mount": NOSYS,
    "open_tree": NOSYS, "fsopen": NOSYS, "fsconfig": NOSYS, "fsmount": NOSYS, "fspick": NOSYS,
    "mount_setattr": NOSYS,
    # file handles bypass path lookups (the "shocker" escape)
    "name_to_handle_at": NOSYS, "open_by_handle_at": NOSYS,
    # other processes: within the sandbox all share one uid, so the filter cannot tell "others" apart
    "ptrace": NOSYS, "process_vm_readv": NOSYS, "process_vm_writev": NOSYS, "pidfd_getfd": NOSYS,
    # new namespaces (a user namespace makes the kernel root of it, with mounts and more to attack)
    "unshare": PERM, "setns": PERM,
    # clone3 hides its flags in memory the filter cannot read: ENOSYS makes glibc fall back to clone()
    "clone3": NOSYS,
})  # fmt: skip


@dataclass
class SeccompSettings:
    """Host-level seccomp settings (env: WORKBENCH_SECCOMP, WORKBENCH_SECCOMP_ALLOW); see docs/settings.md."""

    seccomp: bool = True  # deny the calls in DENIED inside every sandbox
    seccomp_allow: str = ""  # comma-separated names of DENIED to leave allowed (e.g. "ptrace" to debug inside)

    def allowed(self) -> frozenset[str]:
        """The names of `seccomp_allow`, checked against the deny list."""
        names = {n.strip() for n in self.seccomp_allow.split(",") if n.strip()}
        unknown = sorted(names - set(DENIED) - {"clone"})
        if unknown:
            raise ConfigError(f"WORKBENCH_SECCOMP_ALLOW names calls the filter does not deny: {', '.join(unknown)}; "
                              f"choose from clone, {', '.join(sorted(DENIED))}")
        return frozenset(names)


class SeccompUnavailable(RuntimeError):
    """libseccomp (or its Python binding) is not installed here."""


def compile_filter(allow: frozenset[str] = frozenset()) -> tuple[bytes, list[str]]:
    """The BPF program for this machine's architecture, and the denied names it has no such call for."""
    try:
        import pyseccomp as sc
    except (ImportError, RuntimeError) as e:  # pyseccomp raises RuntimeError when libseccomp.so is missing
        raise SeccompUnavailable(f"libseccomp is not usable ({e}); install libseccomp2 and pyseccomp") from None
    flt = sc.SyscallFilter(sc.ALLOW)
    flt.set_attr(sc.Attr.ACT_BADARCH, sc.ERRNO(NOSYS))
    absent = []
    for name, code in DENIED.items():
        if name in allow:
            continue
        if sc.resolve_syscall(sc.Arch.NATIVE, name) < 0:  # not a call of this architecture (or this libseccomp)
            absent.append(name)
            continue
        flt.add_rule(sc.ERRNO(code), name)
    if "clone" not in allow:
        arg = 1 if sc.system_arch() in (sc.Arch.S390, sc.Arch.S390X) else 0  # where clone's flags are
        for flag in CLONE_NEW.values():
            flt.add_rule(sc.ERRNO(PERM), "clone", sc.Arg(arg, sc.MASKED_EQ, flag, flag))
    with tempfile.TemporaryFile() as f:
        flt.export_bpf(f)
        f.seek(0)
        return f.read(), absent


@dataclass
class SeccompFilter:
    """A compiled filter on disk (or none, and why), ready to put in front of bwrap command lines."""

    path: Path | None
    how: str  # for hands_started.limits: what is enforced, or why nothing is

    @property
    def enforced(self) -> bool:
        return self.path is not None

    def wrap(self, argv: list[str]) -> list[str]:
        """A bwrap command line that loads this filter (unchanged when there is none)."""
        if self.path is None:
            return list(argv)
        options = argv[1 : argv.index("--")] if "--" in argv else argv[1:]
        if "--seccomp" in options or "--add-seccomp-fd" in options:
            raise ValueError("this bwrap command line already loads a seccomp filter")
        # bwrap reads the program from a descriptor, and a kernel launcher passes none: a shell opens it
        return ["/bin/sh", "-c", WRAP, str(self.path), argv[0], "--seccomp", str(FD), *argv[1:]]


def default_dir() -> Path:
    """`workbench-seccomp` in the Jupyter runtime dir: the server user's own, never mounted in a sandbox."""
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir()) / "workbench-seccomp"


def prepare(settings: SeccompSettings | None = None, directory: str | Path | None = None) -> SeccompFilter:
    """Compile the filter into `directory` (the host's own, never mounted in a sandbox or writable by one)."""
    settings = settings or SeccompSettings()
    allow = settings.allowed()
    if not settings.seccomp:
        return SeccompFilter(None, "off (WORKBENCH_SECCOMP=0)")
    try:
        program, absent = compile_filter(allow)
    except SeccompUnavailable as e:
        return SeccompFilter(None, f"not enforced: {e}")
    directory = Path(directory) if directory else default_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    # named by content: hosts sharing the directory share the file, and a rewrite is a no-op
    path = directory / f"seccomp-{hashlib.sha256(program).hexdigest()[:16]}.bpf"
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".seccomp-")
    with os.fdopen(fd, "wb") as f:
        f.write(program)
    os.replace(tmp, path)
    denied = len(DENIED) - len(allow & set(DENIED)) - len(absent)
    how = f"{denied} calls denied (ENOSYS; EPERM for new namespaces), other architectures' calls too"
    return SeccompFilter(path, how + (f"; allowed by WORKBENCH_SECCOMP_ALLOW: {', '.join(sorted(allow))}" if allow else ""))
