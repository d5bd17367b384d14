"""Two sessions share no uid-scoped kernel object: the seccomp filter takes keyrings (and more) away.

Every sandbox of a host runs as one uid (64123 when the server is root), and
every sandbox possesses the session keyring of the process that started it.
Without the filter, a key one sandbox adds is read by a sandbox another host
starts later, and a key the host holds is read by its sandboxes.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest
import pytest_asyncio

from workbench.errors import ConfigError
from workbench.hands import KernelHands, Observation
from workbench.hands.factory import HandsFactory, HandsSettings
from workbench.hands.isolating.bubblewrap import base_args
from workbench.hands.isolating.seccomp import (
    CLONE_NEW,
    DENIED,
    SeccompFilter,
    SeccompSettings,
    SeccompUnavailable,
    compile_filter,
    prepare,
)
from workbench.hands.launching import SandboxLauncher

from .conftest import needs_sandbox, no_process_left, run


def _unusable() -> str:
    try:
        compile_filter()
    except SeccompUnavailable as e:
        return str(e)
    return ""


pytestmark = [needs_sandbox, pytest.mark.skipif(bool(_unusable()), reason=_unusable())]


def numbers(names) -> dict[str, int]:
    """Syscall numbers of this architecture, by name (those it has)."""
    import pyseccomp

    nrs = {n: pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, n) for n in names}
    return {n: nr for n, nr in nrs.items() if nr >= 0}


# In-sandbox helpers: raw syscalls through libc, a negative errno on failure.
SYSCALLS = """
import ctypes, errno, json, os
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
def sys_(nr, *args):
    r = _libc.syscall(nr, *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return r if r >= 0 else -ctypes.get_errno()
USER, SESSION = -4, -3  # KEY_SPEC_USER_KEYRING, KEY_SPEC_SESSION_KEYRING
def add_key(desc, data, ring):
    kid = sys_(NR["add_key"], b"user", desc.encode(), data.encode(), len(data), ring)
    if kid > 0:
        sys_(NR["keyctl"], 15, kid, 120)  # KEYCTL_SET_TIMEOUT: a key that got in leaves by itself
    return kid
def read_key(desc, ring):
    kid = sys_(NR["keyctl"], 10, ring, b"user", desc.encode(), 0)  # KEYCTL_SEARCH
    if kid < 0:
        return kid
    buf = ctypes.create_string_buffer(4096)
    n = sys_(NR["keyctl"], 11, kid, buf, 4096)  # KEYCTL_READ
    return buf.raw[:n].decode() if n >= 0 else n
"""


def prelude() -> str:
    return f"NR = {numbers(['add_key', 'keyctl', 'clone', 'getpid', *DENIED])!r}\n" + SYSCALLS


@pytest.fixture
def flt(tmp_path):
    """The filter as a host prepares it, in a directory of the host's own."""
    f = prepare(SeccompSettings(), tmp_path / "host-private")
    assert f.enforced, f.how
    return f


@pytest_asyncio.fixture
async def filtered(tmp_path, flt):
    """filtered() -> a session's hands from a sandbox hands factory given this filter; all stopped and checked gone."""
    made: list[tuple[KernelHands, str]] = []
    # as a host makes them: the host's default limits (limits.py, then the filter's shell, then bwrap), sessions'
    # own workspaces, the filter compiled once for the host
    factory = HandsFactory(HandsSettings(backend="sandbox", pool_size=0, registry_dir=str(tmp_path / "reg")), seccomp=flt)
    assert factory.mode == "sandbox", factory.message

    async def make(workdir: Path | None = None) -> KernelHands:
        mark = "wbmark" + uuid.uuid4().hex
        config = {"env": {"WB_TEST_MARK": mark}, **({"workdir": str(workdir)} if workdir else {})}
        hands = factory(f"session-{len(made)}", {"hands": config}, None)
        assert isinstance(hands, KernelHands)
        made.append((hands, mark))
        return hands

    try:
        yield make
    finally:
        await factory.close()
        for hands, mark in made:
            await no_process_left(mark)


LEASED: list = []  # the identities sandbox_argv leased, given back after each test


@pytest.fixture(autouse=True)
def _give_back_identities():
    yield
    while LEASED:
        LEASED.pop().release()


def sandbox_argv(tmp: Path, flt, code: str) -> list[str]:
    """The kernels' own bwrap command line (SandboxLauncher.argv, without a filter), running `python -c code` instead."""
    launcher = SandboxLauncher(seccomp=SeccompFilter(None, "off"))
    run_dir, workdir = Path(tempfile.mkdtemp(dir=tmp)), Path(tempfile.mkdtemp(dir=tmp))
    identity = launcher.identities.lease()
    LEASED.append(identity)
    argv = launcher.argv(run_dir, workdir, {}, identity)
    assert argv[-4:-2] == ["/bin/sh", "-c"], argv[-4:]  # the kernel's start script, replaced below (what runs
    # before it stays: the uid drop, or an unprivileged sandbox's limits set in its own user namespace)
    python = launcher.settings.sandbox_python or sys.executable
    return flt.wrap(argv[:-4] + [python, "-c", code])


@pytest.mark.asyncio
async def test_a_key_added_in_one_sandbox_is_not_readable_in_another(filtered):
    name, secret = "wbkey-" + uuid.uuid4().hex, "canary-" + secrets.token_hex(8)
    a = await filtered()
    added = json.loads(await run(a, prelude() + f"print(json.dumps([add_key({name!r}, {secret!r}, r) for r in (USER, SESSION)]))"))
    assert added == [-errno.ENOSYS, -errno.ENOSYS]
    read = prelude() + f"print(json.dumps([read_key({name!r}, r) for r in (USER, SESSION)]))"
    b = await filtered()  # a later session while the first one is alive
    seen = await run(b, read)
    assert secret not in seen and json.loads(seen) == [-errno.ENOSYS, -errno.ENOSYS]
    await a.shutdown()
    c = await filtered()  # and once it is gone
    seen = await run(c, read)
    assert secret not in seen and json.loads(seen) == [-errno.ENOSYS, -errno.ENOSYS]


HOST = """
import ctypes, json, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
nr, argv, secret = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3].encode()
assert libc.syscall(nr["keyctl"], 1, None) > 0  # KEYCTL_JOIN_SESSION_KEYRING: this host's own session keyring
assert libc.syscall(nr["add_key"], b"user", b"wb-host-key", secret, len(secret), ctypes.c_long(-3)) > 0
p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
print(json.dumps({"rc": p.returncode, "out": p.stdout, "err": p.stderr[-2000:]}))
"""


def test_no_key_crosses_between_host_processes_or_from_a_host_into_its_sandbox(tmp_path, flt):
    name = "wbkey-" + uuid.uuid4().hex
    key_of = {"first": "canary-a-" + secrets.token_hex(8), "second": "canary-b-" + secrets.token_hex(8)}
    host_keys = {"first": "host-a-" + secrets.token_hex(8), "second": "host-b-" + secrets.token_hex(8)}
    outputs = {}
    for host in ("first", "second"):  # two host processes, one after the other, each with a sandbox
        code = prelude() + textwrap.dedent(f"""
            out = {{"added": add_key({name + host!r}, {key_of[host]!r}, USER)}}
            out["other"] = [read_key(n, USER) for n in {[name + h for h in key_of if h != host]!r}]
            out["host_key"] = read_key("wb-host-key", SESSION)
            print(json.dumps(out))
        """)
        argv = sandbox_argv(tmp_path, flt, code)
        nrs = numbers(["keyctl", "add_key"])
        p = subprocess.run([sys.executable, "-c", HOST, json.dumps(nrs), json.dumps(argv), host_keys[host]],
                           capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, p.stderr
        result = json.loads(p.stdout)
        assert result["rc"] == 0, result["err"]
        outputs[host] = result["out"]
    for host, out in outputs.items():
        assert not [s for s in [*key_of.values(), *host_keys.values()] if s in out], out
        parsed = json.loads(out)
        assert parsed["added"] == -errno.ENOSYS and parsed["host_key"] == -errno.ENOSYS, parsed


PROBE = """
import mmap, platform
ARGS = {"ptrace": (16, 1), "process_vm_readv": (1, 0, 0, 0, 0, 0), "process_vm_writev": (1, 0, 0, 0, 0, 0),
        "unshare": (0x10000000,)}
def in_child(nr, args):
    # each call in a child of its own, so one that did get through changes nothing here
    pid = os.fork()
    if pid == 0:
        r = sys_(nr, *args)
        os._exit(0 if r >= 0 else min(-r, 255))
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "signal %d" % os.WTERMSIG(status)
    return errno.errorcode.get(os.WEXITSTATUS(status), "ok")
out = {n: in_child(nr, ARGS.get(n, (0, 0, 0, 0, 0, 0))) for n, nr in NR.items() if n in DENIED}
out.update({"clone " + k: in_child(NR["clone"], (flag | 17, 0, 0, 0, 0)) for k, flag in CLONE_NEW.items()})
out["clone (fork)"] = in_child(NR["clone"], (17, 0, 0, 0, 0))  # SIGCHLD only: fork, which must still work
out["x32 getpid"] = sys_(0x40000000 | NR["getpid"])
if platform.machine() == "x86_64":  # the i386 table through int 0x80: mov eax, 20 (getpid); int 0x80; ret
    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    m.write(b"\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3")
    out["i386 getpid"] = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))()
out["status"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")]
out["fds"] = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")]
print(json.dumps(out))
"""


@pytest.mark.asyncio
async def test_every_denied_call_fails_with_its_errno_and_the_kernel_lives_on(filtered, flt):
    hands = await filtered()
    code = prelude() + f"DENIED = {dict(DENIED)!r}\nCLONE_NEW = {dict(CLONE_NEW)!r}\n" + PROBE
    out = json.loads(await run(hands, code))
    expected = {n: errno.errorcode[e] for n, e in DENIED.items() if n in numbers(DENIED)}
    assert {n: out[n] for n in expected} == expected
    assert {k: v for k, v in out.items() if k.startswith("clone ")} == {**{"clone " + k: "EPERM" for k in CLONE_NEW},
                                                                       "clone (fork)": "ok"}
    assert out["x32 getpid"] == -errno.ENOSYS
    if platform.machine() == "x86_64":
        assert out["i386 getpid"] == -errno.ENOSYS  # another architecture's table is shut, not a way around
    assert out["status"] == ["2"]  # filter mode
    assert str(flt.path) not in out["fds"]  # bwrap closed the descriptor it read the program from
    generation = hands.generation
    assert (await run(hands, "print(6 * 7)")).strip() == "42"  # the same kernel: nothing was killed
    assert hands.generation == generation


LIBRARIES = """
import json, os, subprocess, sys, threading, concurrent.futures as cf, multiprocessing as mp
import numpy as np, pandas as pd
out = {}
a = np.random.default_rng(0).random((400, 400))
out["numpy"] = bool(np.allclose(a @ np.linalg.inv(a), np.eye(400), atol=1e-6))
out["pandas"] = int(pd.DataFrame({"k": [1, 1, 2], "v": [1, 2, 3]}).groupby("k").v.sum().loc[1])
t = threading.Thread(target=lambda: out.__setitem__("thread", True)); t.start(); t.join()
with cf.ThreadPoolExecutor(4) as ex:
    out["threads"] = sum(ex.map(abs, [-1, -2, -3]))
out["subprocess"] = subprocess.run([sys.executable, "-c", "print(7)"], capture_output=True, text=True).stdout.strip()
for method in ("fork", "spawn", "forkserver"):
    p = mp.get_context(method).Process(target=os.getpid)
    p.start(); p.join(30)
    out[method] = p.exitcode
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt, io
    buf = io.BytesIO(); plt.plot([1, 2, 3]); plt.savefig(buf, format="png")
    out["matplotlib"] = buf.getvalue()[:4] == b"\\x89PNG"
except ImportError:
    out["matplotlib"] = "not installed"
print(json.dumps(out))
"""


@pytest.mark.asyncio
async def test_numpy_pandas_threads_and_processes_work_under_the_filter(filtered):
    hands = await filtered()
    out = json.loads(await run(hands, LIBRARIES))
    assert out.pop("matplotlib") in (True, "not installed")
    assert out == {"numpy": True, "pandas": 3, "thread": True, "threads": 6, "subprocess": "7",
                   "fork": 0, "spawn": 0, "forkserver": 0}


def test_settings_edges(tmp_path):
    with pytest.raises(ConfigError, match="does not deny: mount;rm"):
        SeccompSettings(seccomp_allow="keyctl, mount;rm").allowed()
    with pytest.raises(ConfigError, match="does not deny: read"):
        prepare(SeccompSettings(seccomp_allow="read"), tmp_path)  # nothing the kernel needs is on the list to begin with
    assert SeccompSettings(seccomp_allow=" ptrace ,, keyctl ").allowed() == {"ptrace", "keyctl"}
    off = prepare(SeccompSettings(seccomp=False), tmp_path / "off")
    assert not off.enforced and "off" in off.how and off.wrap(["bwrap", "--", "x"]) == ["bwrap", "--", "x"]
    assert not (tmp_path / "off").exists()
    flt = prepare(SeccompSettings(), tmp_path / "on")
    assert flt.path.parent == tmp_path / "on" and flt.path.stat().st_mode & 0o077 == 0
    assert prepare(SeccompSettings(), tmp_path / "on").path == flt.path  # same program, same file
    default = prepare().path  # the Jupyter runtime dir: the server user's own (this test's, here)
    assert default.parent == Path(os.environ["JUPYTER_RUNTIME_DIR"]) / "workbench-seccomp" and default.read_bytes() == flt.path.read_bytes()
    with pytest.raises(ValueError, match="already loads a seccomp filter"):
        flt.wrap(["bwrap", "--seccomp", "5", "--", "true"])
    # an option value that looks like one after the command separator does not count
    assert "--seccomp" in flt.wrap(["bwrap", "--", "env", "--seccomp"])


def test_allowed_calls_are_left_alone_and_a_missing_filter_stops_the_sandbox(tmp_path):
    code = prelude() + "print(json.dumps([sys_(NR['keyctl'], 0, USER, 0), sys_(NR['bpf'], 0, 0, 0)]))"
    flt = prepare(SeccompSettings(seccomp_allow="keyctl"), tmp_path / "host")
    p = subprocess.run(sandbox_argv(tmp_path, flt, code), capture_output=True, text=True, timeout=120)
    keyctl, bpf = json.loads(p.stdout)
    assert keyctl != -errno.ENOSYS and bpf == -errno.ENOSYS  # KEYCTL_GET_KEYRING_ID reached the kernel
    argv = sandbox_argv(tmp_path, flt, "print('ran')")
    flt.path.unlink()  # fail closed: without its filter, no sandbox starts
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "ran" not in p.stdout and flt.path.name in p.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become an unprivileged host")
def test_an_unprivileged_hosts_sandbox_gets_the_filter_too(tmp_path, flt):
    """A non-root server's bwrap runs in a user namespace; the filter holds there the same way."""
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 for the unprivileged host's sandbox")
    code = prelude() + "print(json.dumps([add_key('k', 'v', USER), sys_(NR['unshare'], 0x10000000), os.getuid()]))"
    with open(flt.path, "rb") as program:
        fd = program.fileno()
        host = ["setpriv", "--reuid=64124", "--regid=64124", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
        argv = [*host, shutil.which("bwrap"), *base_args(None), "--seccomp", str(fd), "--", python, "-c", code]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120, pass_fds=(fd,), cwd="/")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [-errno.ENOSYS, -errno.EPERM, 64124]


SESSION_HOST = """
import asyncio, ctypes, json, sys
from workbench.hands.factory import HandsFactory, HandsSettings

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
nr, registry, secret, code = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3].encode(), sys.argv[4]
assert libc.syscall(nr["keyctl"], 1, None) > 0  # KEYCTL_JOIN_SESSION_KEYRING: this host's own session keyring
assert libc.syscall(nr["add_key"], b"user", b"wb-host-key", secret, len(secret), ctypes.c_long(-3)) > 0

async def main():
    events = []

    async def sink(type, payload):
        events.append([type, payload])

    # a host's hands as the CLI and the server make them: the filter from WORKBENCH_SECCOMP*, a session's hands
    async with HandsFactory(HandsSettings(backend="sandbox", pool_size=0, registry_dir=registry)) as factory:
        hands = factory("keyring-session", {}, sink)
        obs = await hands.execute(code, timeout=60)
        status = hands.status()
    print(json.dumps({"obs": obs.to_json(), "events": events, "status": status, "how": factory.seccomp.how}))

asyncio.run(main())
"""


def test_no_key_crosses_between_two_hosts_sessions_or_from_a_host_into_its_sessions(tmp_path):
    """Two host processes, one after the other, each with a session's hands: no key of one reaches the other's."""
    name = "wbkey-" + uuid.uuid4().hex
    key_of = {"first": "canary-a-" + secrets.token_hex(8), "second": "canary-b-" + secrets.token_hex(8)}
    host_keys = {"first": "host-a-" + secrets.token_hex(8), "second": "host-b-" + secrets.token_hex(8)}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    env.pop("WORKBENCH_SECCOMP", None)
    results = {}
    for host in ("first", "second"):
        code = prelude() + textwrap.dedent(f"""
            out = {{"added": add_key({name + host!r}, {key_of[host]!r}, USER)}}
            out["other"] = [read_key(n, USER) for n in {[name + h for h in key_of if h != host]!r}]
            out["host_key"] = read_key("wb-host-key", SESSION)
            print(json.dumps(out))
        """)
        p = subprocess.run([sys.executable, "-c", SESSION_HOST, json.dumps(numbers(["keyctl", "add_key"])),
                            str(tmp_path / f"reg-{host}"), host_keys[host], code],
                           capture_output=True, text=True, timeout=300, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        results[host] = json.loads(p.stdout.strip().splitlines()[-1])
    for host, result in results.items():
        out = Observation.from_json(result["obs"]).stdout
        assert result["obs"]["error"] is None, result["obs"]
        assert not [s for s in [*key_of.values(), *host_keys.values()] if s in json.dumps(result)], out
        parsed = json.loads(out)
        assert parsed == {"added": -errno.ENOSYS, "other": [-errno.ENOSYS], "host_key": -errno.ENOSYS}, parsed
        started = [p for t, p in result["events"] if t == "hands_started"]
        assert [s["limits"]["seccomp"] for s in started] == [result["how"]] and "calls denied" in result["how"]
        assert result["status"]["limits"]["seccomp"] == result["how"]


@pytest.mark.asyncio
async def test_the_filter_is_in_every_sessions_hands_started_and_status(filtered, flt):
    hands = await filtered()
    assert (await run(hands, "print(open('/proc/self/status').read().count('Seccomp:\\t2'))")).strip() == "1"
    assert hands.status()["limits"]["seccomp"] == flt.how


def test_a_filter_that_breaks_start_up_refuses_the_host_loudly(tmp_path, caplog):
    """A filter under which no sandbox starts (here: execve denied) fails the preflight: model code is refused."""
    import logging

    import pyseccomp as sc

    broken = sc.SyscallFilter(sc.ALLOW)
    broken.add_rule(sc.ERRNO(errno.EPERM), "execve")
    path = tmp_path / "broken.bpf"
    with open(path, "wb") as f:
        broken.export_bpf(f)
    with caplog.at_level(logging.WARNING, logger="workbench.hands"):
        factory = HandsFactory(HandsSettings(backend="sandbox", pool_size=0, registry_dir=str(tmp_path / "reg")),
                               seccomp=SeccompFilter(path, "test: execve denied"))
    status = factory.status()["sandbox"]
    assert status["mode"] == "refused" and factory.launcher is None
    assert "under the seccomp filter" in status["reason"] and str(path) in status["reason"]
    assert "WORKBENCH_SECCOMP_ALLOW" in status["fix"] and status["seccomp"] == "test: execve denied"
    assert "sandbox unavailable" in caplog.text and "seccomp" in caplog.text
