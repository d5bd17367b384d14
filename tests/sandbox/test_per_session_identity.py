"""Per-user kernel counts are per session: one session that exhausts inotify, processes or message queues leaves
another session untouched (hands/identity.py).

A root server's sandboxes each run as a host uid of their own, leased machine-wide from a range; an unprivileged
server's each run in a user namespace of their own, whose counts are capped (inotify) or set (processes, message
queue bytes) inside it. On the code before this, every sandbox of a root server ran as uid 64123 and every sandbox
of an unprivileged one as the server's uid: the first session to open 128 inotify instances (or 800 KB of message
queues) left every other session with none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
import pytest_asyncio

from workbench.hands import KernelHands
from workbench.hands.factory import HandsFactory, HandsSettings
from workbench.hands.isolating.identity import Identities, NoIdentity, _uids_in_use

from .conftest import needs_sandbox, no_process_left, run

pytestmark = needs_sandbox
ROOT = os.geteuid() == 0
MAX_PROCESSES = 40


@pytest_asyncio.fixture
async def sessions(tmp_path):
    """sessions(n) -> n sessions' sandboxed hands from one host's factory; every kernel stopped and checked gone."""
    made: list[tuple[KernelHands, str]] = []
    events: list[tuple[str, dict]] = []
    factory = HandsFactory(HandsSettings(backend="sandbox", pool_size=0, spare=False, max_processes=MAX_PROCESSES,
                                         registry_dir=str(tmp_path / "reg")))
    assert factory.mode == "sandbox", factory.message

    async def sink(type: str, payload: dict) -> None:
        events.append((type, payload))

    class Sessions:
        def __init__(self):
            self.events = events

        def __call__(self, n: int) -> list[KernelHands]:
            out = []
            for _ in range(n):
                mark = "wbmark" + uuid.uuid4().hex
                hands = factory(f"s{len(made)}", {"hands": {"env": {"WB_TEST_MARK": mark}}}, sink)
                assert isinstance(hands, KernelHands)
                made.append((hands, mark))
                out.append(hands)
            return out

    try:
        yield Sessions()
    finally:
        await factory.close()
        for _, mark in made:
            await no_process_left(mark)


@pytest.mark.asyncio
async def test_each_live_sandbox_has_an_identity_of_its_own(sessions):
    a, b = sessions(2)
    ids = [json.loads(await run(h, "import os, json; print(json.dumps([os.getuid(), os.getgid()]))")) for h in (a, b)]
    limits = [p["limits"] for t, p in sessions.events if t == "hands_started"]
    assert len(limits) == 2 and all("identity" in lim for lim in limits)
    if ROOT:
        assert ids[0] != ids[1] and all(uid >= 64123 and uid not in (0, 65534) for uid, _ in ids), ids
        assert all("of its own" in lim["identity"] for lim in limits)
        # the files each writes are its own uid's: a session's kernel cannot touch another's files even if it saw them
        assert a.workspace_owner() == tuple(ids[0]) and b.workspace_owner() == tuple(ids[1])
    else:
        assert ids[0] == ids[1] == [os.getuid(), os.getgid()]
        assert all("user namespace of its own" in lim["identity"] for lim in limits)
        assert a.workspace_owner() is None


INOTIFY = """
import ctypes, json, os
_libc = ctypes.CDLL(None, use_errno=True)
def take_inotify(most):
    fds = []
    while len(fds) < most:
        fd = _libc.inotify_init1(0)
        if fd < 0:
            return fds, os.strerror(ctypes.get_errno())
        fds.append(fd)
    return fds, None
"""


@pytest.mark.asyncio
async def test_one_session_that_exhausts_inotify_leaves_another_its_own(sessions):
    hog, other = sessions(2)
    await run(other, "1")  # both live: the other session's kernel is up before the hog takes everything
    out = json.loads(await run(hog, INOTIFY + "held, err = take_inotify(100000); print(json.dumps([len(held), err]))"))
    assert out[1] is not None and out[0] >= 8, out  # it ran out: of its uid's 128, or of its namespace's share
    got = json.loads(await run(other, INOTIFY + "held, err = take_inotify(8); print(json.dumps([len(held), err]))"))
    assert got == [8, None], got
    # the hog still holds all of them (its kernel lives): the other's are its own, not what the hog left over
    assert json.loads(await run(hog, INOTIFY + "held2, err2 = take_inotify(1); print(json.dumps([len(held2), len(held)]))")) \
        == [0, out[0]]


FORK = """
import json, os, signal, time
def take_processes(most):
    kids, err = [], None
    while len(kids) < most:
        try:
            pid = os.fork()
        except OSError as e:
            err = e.strerror
            break
        if pid == 0:
            time.sleep(120)
            os._exit(0)
        kids.append(pid)
    return kids, err
def free(kids):
    for pid in kids:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
"""


@pytest.mark.asyncio
async def test_one_session_that_exhausts_its_processes_leaves_another_its_own(sessions):
    hog, other = sessions(2)
    await run(other, "1")
    out = json.loads(await run(hog, FORK + "kids, err = take_processes(10000); print(json.dumps([len(kids), err]))"))
    assert out[1] is not None and 8 <= out[0] <= MAX_PROCESSES, out
    got = json.loads(await run(other, FORK + "k, e = take_processes(8); free(k); print(json.dumps([len(k), e]))"))
    assert got == [8, None], got
    await run(hog, "free(kids)")


MQUEUE = """
import ctypes, json, os
_libc = ctypes.CDLL(None, use_errno=True)
class _Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long),
                ("curmsgs", ctypes.c_long), ("pad", ctypes.c_long * 4)]
_libc.mq_open.restype = ctypes.c_int
def take_queues(most, tag):
    attr = _Attr(0, 8, 1024, 0)
    fds = []
    while len(fds) < most:
        fd = _libc.mq_open(f"/{tag}-{len(fds)}".encode(), os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(attr))
        if fd < 0:
            return fds, os.strerror(ctypes.get_errno())
        fds.append(fd)
    return fds, None
"""


@pytest.mark.asyncio
async def test_one_session_that_exhausts_message_queues_leaves_another_its_own(sessions):
    hog, other = sessions(2)
    await run(other, "1")
    out = json.loads(await run(hog, MQUEUE + "qs, err = take_queues(100000, 'hog'); print(json.dumps([len(qs), err]))"))
    assert out[1] is not None and out[0] >= 2, out  # its uid's (or its namespace's) message queue bytes ran out
    got = json.loads(await run(other, MQUEUE + "qs, err = take_queues(2, 'other'); print(json.dumps([len(qs), err]))"))
    assert got == [2, None], got


LEASE = """
import json, sys, time
from workbench.hands.isolating.identity import Identities
from pathlib import Path
ids = Identities(int(sys.argv[1]), int(sys.argv[1]), 3, lease_dir=Path(sys.argv[2]))
mine = ids.lease()
print(json.dumps(mine.uid), flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not ROOT, reason="only a root server leases uids")
def test_leases_are_machine_wide_skip_uids_in_use_and_say_when_the_range_is_full(tmp_path):
    first = 2_000_000_000 + int(uuid.uuid4().hex[:5], 16) * 4  # a range nothing else here uses
    lease_dir = tmp_path / "ids"
    other = subprocess.Popen([sys.executable, "-c", LEASE, str(first), str(lease_dir)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert json.loads(other.stdout.readline()) == first  # another host process holds the first uid
        # a process of this machine runs as the second one (a dead server's sandbox, say): never handed out
        squatter = subprocess.Popen(["setpriv", f"--reuid={first + 1}", f"--regid={first + 1}", "--clear-groups",
                                     "sleep", "120"])
        try:
            ids = Identities(first, first, 3, lease_dir=lease_dir)
            deadline = time.monotonic() + 30
            while first + 1 not in _uids_in_use():
                assert time.monotonic() < deadline, "the squatter never ran as its uid"
                time.sleep(0.02)
            mine = ids.lease()
            assert (mine.uid, mine.gid, mine.own, mine.owner) == (first + 2, first + 2, True, (first + 2, first + 2))
            with pytest.raises(NoIdentity, match="all 3 sandbox uids .* sandbox_ids"):
                ids.lease()
            mine.release()
            mine.release()  # twice is fine
            assert ids.lease().uid == first + 2  # given back, leased again
        finally:
            squatter.kill()
            squatter.wait()
    finally:
        other.kill()
        other.wait()
    # the other host is gone: its lock went with it
    assert Identities(first, first, 1, lease_dir=lease_dir).lease().uid == first


def test_an_unprivileged_server_runs_every_sandbox_as_itself_in_a_namespace_of_its_own():
    code = textwrap.dedent("""
        import json
        from workbench.hands.isolating.identity import Identities
        me = Identities(64123, 64123, 4).lease()
        print(json.dumps([me.uid, me.own, me.owner, me.how]))
    """)
    if ROOT:
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code]
        uid = 65534
    else:
        argv, uid = [sys.executable, "-c", code], os.getuid()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    if p.returncode != 0 and "Permission denied" in p.stderr:
        pytest.skip("this interpreter is not readable by another user")
    assert p.returncode == 0, p.stderr
    got_uid, own, owner, how = json.loads(p.stdout)
    assert (got_uid, own, owner) == (uid, False, None) and "user namespace of its own" in how


@pytest.mark.parametrize("bad", [{"first_uid": 0}, {"count": 0}, {"count": True}, {"first_gid": -1},
                                 {"first_uid": 2**31 - 3, "count": 5}, {"count": "8"}])
def test_identity_settings_are_checked(bad):
    kw = {"first_uid": 64123, "first_gid": 64123, "count": 4, **bad}
    with pytest.raises(Exception, match="sandbox_"):
        Identities(kw["first_uid"], kw["first_gid"], kw["count"])
