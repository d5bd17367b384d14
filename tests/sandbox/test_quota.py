"""Workspace quota: a kernel fills its own workspace and no more; workspaces go at shutdown and after a dead host."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import pytest_asyncio

from workbench.errors import ConfigError
from workbench.hands import HandsConfig, KernelHands
from workbench.hands.isolating import quota
from workbench.hands.launching import SandboxLauncher

from .conftest import needs_sandbox, no_process_left, run

pytestmark = needs_sandbox
ROOT = os.geteuid() == 0
root_only = pytest.mark.skipif(not ROOT, reason="a root server's own case (loop devices, CAP_SYS_ADMIN)")
FUSE = bool(shutil.which("fuse2fs", path=quota.SBIN) and shutil.which("fusermount3", path=quota.SBIN)
            and os.access("/dev/fuse", os.R_OK | os.W_OK))
# root loop-mounts a workspace image; anyone else mounts it with fuse2fs (the test below checks what others get without)
quota_here = pytest.mark.skipif(not (ROOT or FUSE), reason="an unprivileged server needs fuse2fs, fusermount3 and /dev/fuse")
MOUNTED = "a loop-mounted ext4 image" if ROOT else "an ext4 image mounted with fuse2fs (the server is not root)"
OWNER = (64123, 64123) if ROOT else None
MB = 1 << 20


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root`, from this process's mount table."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")  # spaces and the like are octal escapes
        if point == str(root) or point.startswith(f"{root}/"):
            out.append(point)
    return out


def loops_backing(image: Path, within: float = 10.0) -> list[str]:
    """Loop devices whose backing file is `image` (deleted or not), after waiting for the kernel to free them."""
    deadline = time.monotonic() + within
    while True:
        found = []
        for f in Path("/sys/block").glob("loop*/loop/backing_file"):
            try:
                if f.read_text().strip().removesuffix(" (deleted)") == str(image):
                    found.append(f.parent.parent.name)
            except OSError:
                continue
        if not found or time.monotonic() > deadline:  # a loop's release may finish in a kernel work queue
            return found
        time.sleep(0.05)


@pytest.fixture
def ws_root(tmp_path):
    """A workspace root; whatever a test leaves mounted there is unmounted, also when it fails."""
    root = (tmp_path / "workspaces").resolve()
    try:
        yield root
    finally:
        for point in sorted(mounts_under(root), key=len, reverse=True):
            subprocess.run(["umount", "--lazy", point] if ROOT else ["fusermount3", "-u", "-z", point], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
        assert mounts_under(root) == []


@pytest.fixture
def launcher(ws_root):
    """A sandbox launcher whose workspaces are 32 MiB images under ws_root, each with a sandbox uid of its own."""
    return SandboxLauncher(workspaces=quota.WorkspaceSettings(workspace_mb=32, workspace_root=str(ws_root)))


@pytest_asyncio.fixture
async def hands_in(launcher):
    """hands_in(workspace) -> sandboxed hands whose session workspace it is; all stopped and checked gone."""
    made: list[tuple[KernelHands, str]] = []

    async def make(ws: quota.Workspace) -> KernelHands:
        mark = "wbmark" + uuid.uuid4().hex
        hands = KernelHands(HandsConfig(env={"WB_TEST_MARK": mark}), launcher=launcher)
        hands.place.workspace, hands.place.workdir = ws, ws.path  # as if its first kernel had made it
        made.append((hands, mark))
        return hands

    try:
        yield make
    finally:
        for hands, mark in made:
            await hands.shutdown()
            await no_process_left(mark)


WRITE = """
import errno, json, os
def fill(name, mb):
    written, err, chunk = 0, None, b"x" * (1 << 20)
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for _ in range(mb):
            written += os.write(fd, chunk)
        os.fsync(fd)
    except OSError as e:
        err = errno.errorcode.get(e.errno, str(e.errno))
    finally:
        os.close(fd)
    return {"written": written, "error": err}
"""


@quota_here
@pytest.mark.asyncio
async def test_kernel_writes_past_the_quota_fail_and_nobody_else_notices(ws_root, launcher, hands_in):
    a, b = launcher.workspace("a"), launcher.workspace("b")
    assert a.enforced and b.enforced and "32 MiB" in a.how
    ka, kb = await hands_in(a), await hands_in(b)
    out = json.loads(await run(ka, WRITE + "print(json.dumps(fill('big', 64)))"))
    assert out["error"] in ("ENOSPC", "EDQUOT") and out["written"] <= 32 * MB, out
    # the other session, and the host, write on as before
    (b.path / "from-host.txt").write_text("host")
    other = json.loads(await run(kb, WRITE + "print(json.dumps(fill('mid', 16)))"))
    assert other == {"written": 16 * MB, "error": None}
    assert (b.path / "mid").stat().st_size == 16 * MB and (b.path / "from-host.txt").read_text() == "host"
    # the full workspace recovers once its kernel deletes what filled it
    again = json.loads(await run(ka, WRITE + "os.remove('big'); print(json.dumps(fill('small', 4)))"))
    assert again == {"written": 4 * MB, "error": None}
    assert sorted(os.listdir(a.path)) == ["small"]  # readable by the host: no lost+found or other residue
    for ws in (a, b):
        ws.destroy()


@quota_here
@pytest.mark.asyncio
async def test_the_workspace_outlives_kernel_deaths_and_goes_with_destroy(ws_root, launcher, hands_in):
    ws = launcher.workspace("")
    hands = await hands_in(ws)
    await run(hands, "open('notes.txt', 'w').write('kept')")
    obs = await hands.execute("import os; os._exit(1)", timeout=30)
    assert not obs.ok and obs.error["ename"] == "KernelDied"
    assert (await run(hands, "print(open('notes.txt').read())")).strip() == "kept"  # a fresh kernel, same workspace
    assert hands.generation == 2
    assert (ws.path / "notes.txt").read_text() == "kept"
    await hands.close()
    assert mounts_under(ws_root) == [str(ws.path)]  # the session's, not the kernel's: it stays until destroyed
    image = ws.image
    ws.destroy()
    ws.destroy()  # twice is fine
    assert mounts_under(ws_root) == [] and list(ws_root.iterdir()) == [] and loops_backing(image) == []


@quota_here
def test_destroy_while_a_file_is_still_open_in_the_workspace(ws_root):
    ws = quota.create(ws_root, 16, OWNER)
    image = ws.image
    (ws.path / "open.txt").write_text("still here")
    with open(ws.path / "open.txt") as held:  # e.g. a copy for a verifier in progress: the mount is busy
        ws.destroy()
        assert mounts_under(ws_root) == [] and list(ws_root.iterdir()) == []
        assert held.read() == "still here"  # detached, not pulled away from under the reader
    assert loops_backing(image) == []  # and freed once the last user went


HOST = """
import json, sys, time
from workbench.hands.isolating import quota
ws = quota.create(sys.argv[1], 32, json.loads(sys.argv[2]))
open(ws.path / "left-behind.txt", "w").write("x")
print(json.dumps({"name": ws.name, "enforced": ws.enforced}), flush=True)
time.sleep(600)
"""


def test_reap_cleans_up_after_a_sigkilled_host_and_leaves_live_ones_alone(ws_root):
    mine = quota.create(ws_root, 32, OWNER, label="live")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(quota.__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    host = subprocess.Popen([sys.executable, "-c", HOST, str(ws_root), json.dumps(OWNER)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        dead = json.loads(host.stdout.readline())
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait(30)
        host.stdout.close()
    dead_path, dead_image = ws_root / dead["name"], ws_root / f"{dead['name']}.img"
    assert (dead_path / "left-behind.txt").exists()
    if dead["enforced"]:
        assert str(dead_path) in mounts_under(ws_root)
    # hostile leftovers: a record of no host at all, one whose pid is alive but started at another time
    # (a reused pid), and a name we never make, which must be left alone
    for name, body in (("bad-0123456789ab", "{not json"), ("reused-0123456789ab", json.dumps({"host_pid": os.getpid(), "host_started": 1.0}))):
        (ws_root / f"{name}.json").write_text(body)
        (ws_root / name).mkdir()
    outside = ws_root.parent / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep")
    (ws_root / "link-0123456789ab.json").write_text("{}")
    (ws_root / "link-0123456789ab").symlink_to(outside)  # a workspace name pointing elsewhere is not followed
    (ws_root / "NOT-OURS.json").write_text("{}")
    reaped = quota.reap(ws_root)
    assert sorted(reaped) == sorted([dead["name"], "bad-0123456789ab", "reused-0123456789ab", "link-0123456789ab"])
    assert (outside / "precious.txt").read_text() == "keep" and not (ws_root / "link-0123456789ab").exists()
    assert not dead_path.exists() and not dead_image.exists() and loops_backing(dead_image) == []
    assert str(dead_path) not in mounts_under(ws_root)
    assert mine.path.is_dir() and (ws_root / f"{mine.name}.json").exists() and (ws_root / "NOT-OURS.json").exists()
    if mine.enforced:
        assert mounts_under(ws_root) == [str(mine.path)]
    assert quota.reap(ws_root) == []  # nothing more to do
    mine.destroy()


@root_only
def test_a_host_that_cannot_mount_says_the_quota_is_not_enforced(ws_root):
    """Root without CAP_SYS_ADMIN (as in many containers) gets a plain directory, and is told why."""
    code = textwrap.dedent("""
        import json, os, sys
        from workbench.hands.isolating import quota
        ws = quota.create(sys.argv[1], 32, (64123, 64123))
        st = os.stat(ws.path)
        print(json.dumps({"enforced": ws.enforced, "how": ws.how, "dir": ws.path.is_dir(), "owner": [st.st_uid, st.st_gid],
                          "image": ws.image.exists(), "name": ws.name}))
        ws.destroy()
        print(json.dumps(sorted(os.listdir(sys.argv[1]))))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(quota.__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run(["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", sys.executable, "-c", code, str(ws_root)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    made, left = (json.loads(line) for line in p.stdout.splitlines())
    assert made["enforced"] is False and made["how"].startswith("not enforced: mount failed") and "max_file_mb" in made["how"]
    assert made["dir"] and made["owner"] == [64123, 64123] and not made["image"]
    assert left == [] and mounts_under(ws_root) == [] and loops_backing(ws_root / f"{made['name']}.img") == []


def test_hostile_sizes_and_labels_and_no_quota(ws_root):
    for size in (-1, True, "10", 1.5, None, quota.MAX_MB + 1):
        with pytest.raises(ConfigError, match="workspace_mb must be a whole number"):
            quota.create(ws_root, size)
    for label in ("../up", "a/b", "x" * 41, "sp ace", "ok\n", ".hidden"):
        with pytest.raises(ConfigError, match="a workspace label is"):
            quota.create(ws_root, 8, label=label)
    assert not ws_root.exists() or list(ws_root.iterdir()) == []  # a refused request leaves nothing behind
    plain = quota.create(ws_root, 0, OWNER)
    assert not plain.enforced and "no quota" in plain.how and plain.path.is_dir()
    (plain.path / "f").write_text("x")
    plain.destroy()
    assert list(ws_root.iterdir()) == []
    if not ROOT:
        ws = quota.create(ws_root, 8)
        if FUSE:
            assert ws.enforced and ws.how == f"8 MiB: {MOUNTED}"
        else:
            assert not ws.enforced and ws.how.startswith("not enforced: ") and "fuse" in ws.how
        ws.destroy()


# -- the workspaces of sessions' hands, as a host's hands factory makes them -------------------------------------

@pytest_asyncio.fixture
async def sessions(ws_root, tmp_path):
    """sessions(pool_size=0) -> (factory, make): sandbox hands with 32 MiB workspaces under ws_root; all stopped after."""
    from workbench.hands.factory import HandsFactory, HandsSettings

    made: list[tuple[KernelHands, str]] = []
    factories: list[HandsFactory] = []

    async def open_factory(pool_size: int = 0) -> tuple[HandsFactory, object]:
        factory = HandsFactory(HandsSettings(backend="sandbox", pool_size=pool_size, registry_dir=str(tmp_path / "reg")),
                               workspaces=quota.WorkspaceSettings(workspace_mb=32, workspace_root=str(ws_root)))
        await factory.start()
        factories.append(factory)

        def make(name: str, hands: dict | None = None, sink=None) -> KernelHands:
            mark = "wbmark" + uuid.uuid4().hex
            h = factory(name, {"hands": {**(hands or {}), **({} if pool_size else {"env": {"WB_TEST_MARK": mark}})}}, sink)
            made.append((h, mark))
            return h

        return factory, make

    try:
        yield open_factory
    finally:
        for factory in factories:
            await factory.close()
        for _, mark in made:
            await no_process_left(mark)


def recorder():
    events: list[tuple[str, dict]] = []

    async def sink(type: str, payload: dict) -> None:
        events.append((type, payload))

    return events, sink


@quota_here
@pytest.mark.asyncio
async def test_a_sessions_kernel_fills_its_workspace_and_no_more(sessions, ws_root):
    _, make = await sessions()
    (a_events, a_sink), (b_events, b_sink) = recorder(), recorder()
    a, b = make("fill-a", sink=a_sink), make("fill-b", sink=b_sink)
    out = json.loads(await run(a, WRITE + "print(json.dumps(fill('big', 64)))"))
    assert out["error"] in ("ENOSPC", "EDQUOT") and out["written"] <= 32 * MB, out
    other = json.loads(await run(b, WRITE + "print(json.dumps(fill('mid', 16)))"))
    assert other == {"written": 16 * MB, "error": None}
    # the host writes where it likes, the other session's workspace included
    (ws_root.parent / "host-file").write_bytes(b"h" * MB)
    b_path = Path(b.place.workdir)
    (b_path / "from-host.txt").write_text("host")
    assert (b_path / "mid").stat().st_size == 16 * MB and (b_path / "from-host.txt").read_text() == "host"
    for events in (a_events, b_events):
        (started,) = [p for t, p in events if t == "hands_started"]
        assert started["limits"]["workspace"] == f"32 MiB: {MOUNTED}"
    assert sorted(mounts_under(ws_root)) == sorted([str(a.place.workdir), str(b.place.workdir)])


@quota_here
@pytest.mark.asyncio
@pytest.mark.parametrize("pool_size", [0, 1], ids=["own-kernel", "pooled-kernel"])
async def test_a_killed_kernels_replacement_works_in_the_same_workspace(sessions, ws_root, pool_size):
    factory, make = await sessions(pool_size)
    events, sink = recorder()
    hands = make("survivor", sink=sink)
    await run(hands, "open('notes.txt', 'w').write('kept')")
    workspace = hands.place.workdir
    obs = await hands.execute("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", timeout=30)
    assert not obs.ok and obs.error["ename"] == "KernelDied"
    assert (await run(hands, "import os; print(open('notes.txt').read(), os.getcwd())")).split() == ["kept", "/workspace"]
    started = [p for t, p in events if t == "hands_started"]
    assert [s["pooled"] for s in started] == [bool(pool_size), False]  # a replacement boots around the workspace
    assert all(s["limits"]["workspace"].startswith("32 MiB") for s in started)
    assert str(workspace) in mounts_under(ws_root)
    await hands.shutdown()  # the session's hands go, and its workspace with them
    assert str(workspace) not in mounts_under(ws_root) and not Path(workspace).exists()
    left = sorted(p.name for p in ws_root.iterdir())
    pooled = [m for m in mounts_under(ws_root)]  # a refilled pool kernel's own workspace, if any
    assert len(pooled) == pool_size and all(Path(m).name in left for m in pooled)
    await factory.close()
    assert mounts_under(ws_root) == [] and list(ws_root.iterdir()) == []


@quota_here
@pytest.mark.asyncio
async def test_a_session_that_names_its_workdir_keeps_it_without_a_quota(sessions, ws_root, tmp_path):
    _, make = await sessions()
    events, sink = recorder()
    own = tmp_path / "mine"
    hands = make("own-dir", {"workdir": str(own)}, sink=sink)
    await run(hands, "open('kept.txt', 'w').write('x' * 100)")
    (started,) = [p for t, p in events if t == "hands_started"]
    assert started["limits"]["workspace"].startswith("none: the session's own workdir")
    assert mounts_under(ws_root) == [] and not os.path.ismount(own)
    await hands.shutdown()
    assert (own / "kept.txt").read_text() == "x" * 100  # the session's directory is not the hands' to remove


SANDBOX_HOST = """
import asyncio, json, sys
from workbench.hands.isolating import quota
from workbench.hands.factory import HandsFactory, HandsSettings

async def main():
    factory = HandsFactory(HandsSettings(backend="sandbox", pool_size=1, registry_dir=sys.argv[1]),
                           workspaces=quota.WorkspaceSettings(workspace_mb=32, workspace_root=sys.argv[2]))
    await factory.start()
    hands = factory("doomed", {}, None)
    obs = await hands.execute("open('left.txt', 'w').write('x')")
    assert obs.ok, obs.text()
    while factory.pool.status()["ready"] < 1:  # and the refilled pool kernel, with a workspace of its own
        await asyncio.sleep(0.05)
    print(json.dumps({"workdir": str(await hands.workspace())}), flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


@quota_here
@pytest.mark.asyncio
async def test_a_sigkilled_hosts_workspaces_go_at_the_next_hosts_start(sessions, ws_root, tmp_path):
    from workbench.hands.launching import reap_orphans

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(quota.__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    host = subprocess.Popen([sys.executable, "-c", SANDBOX_HOST, str(tmp_path / "reg"), str(ws_root)],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        workdir = json.loads(host.stdout.readline())["workdir"]
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait(30)
        host.stdout.close()
    assert workdir in mounts_under(ws_root) and len(mounts_under(ws_root)) == 2  # the session's and the pool kernel's
    images = list(ws_root.glob("*.img"))
    assert len(images) == 2
    reap_orphans(tmp_path / "reg")  # the next host: its kernels first (Host.start), then the factory's start
    await sessions()
    assert mounts_under(ws_root) == [] and list(ws_root.iterdir()) == []
    assert all(loops_backing(image) == [] for image in images)


@quota_here
@pytest.mark.asyncio
@pytest.mark.parametrize("pool_size", [0, 1], ids=["own-kernel", "pooled-kernel"])
async def test_the_history_is_beside_the_workspace_where_no_listing_copy_or_quota_sees_it(sessions, pool_size):
    from workbench.hands.files import list_files
    from workbench.hands.launching.state import HISTORY_FILE
    from workbench.hands.verdict import python_verdict

    factory, make = await sessions(pool_size)
    hands = make("history-beside")
    await run(hands, "first = 1")
    workspace, state = Path(hands.place.workdir), hands.place.state
    assert state is not None and (state / HISTORY_FILE).is_file()
    assert os.stat(state).st_uid == os.stat(workspace).st_uid  # the session's sandbox uid writes it

    def free() -> int:
        st = os.statvfs(workspace)
        return st.f_bfree * st.f_frsize

    before = free()
    for i in range(6):  # 1.2 MB of code: the history holds every cell's source
        await run(hands, f"s{i} = {'x' * 200_000!r}")
    assert sum(f.stat().st_size for f in state.iterdir()) > 1_200_000  # the file and its write-ahead log
    assert before - free() < MB // 2  # none of it against the quota
    assert list_files(workspace, 100) == ([], False)
    check = "import os\nassert os.listdir('.') == [], os.listdir('.')"
    verdict = await python_verdict(factory, hands, check, "", label="history-verifier")
    assert verdict.passed and verdict.details["copy_notes"] == [], verdict
    # what the kernels ran is there for the next one
    obs = await hands.execute("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", timeout=30)
    assert obs.error is not None and obs.error["ename"] == "KernelDied"
    assert "first = 1" in await run(hands, "%history -g first")
    await hands.shutdown()
    assert not state.exists()
