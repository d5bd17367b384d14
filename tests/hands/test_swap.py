"""The swap daemon against every copier of the workspace module, and the agent's processes frozen while it copies.

The agent's code forks a daemon that outlives its call and swaps, in a loop, a real directory with a
symbolic link to a directory outside the workspace (and a regular file with a link to a secret file)
with `renameat2(RENAME_EXCHANGE)`: whoever looks at a name and then opens it by path reads the
other one. Every copier and reader of `workbench.hands.files` (and the one verifier built on it) runs
against it many times, and the secret never appears in anything they produce. A new copier is one
more entry in COPIERS.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import pytest_asyncio

from workbench.errors import WorkbenchError
from workbench.evals.verify import listing
from workbench.hands.verdict import python_verdict
from workbench.hands.isolating import freeze, limits
from workbench.hands.factory import HandsFactory, HandsSettings
from workbench.hands.files import copy_tree, list_files, open_file, read_files, write_file

pytestmark = pytest.mark.asyncio

# run by the agent's kernel: the daemon, forked twice and in a session of its own, outlives the call
DAEMON = r'''
import ctypes, os, sys
os.chdir(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2

def swap(a, b):
    if hasattr(libc, "renameat2"):
        libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
    else:  # x86_64's number, for a libc without the wrapper
        libc.syscall(316, AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)

n = 0
while True:
    swap(b"a", b"b")
    swap(b"f.txt", b"g.txt")
    n += 1
    if n % 64 == 0:
        with open("count.tmp", "w") as f:
            f.write(str(n))
        os.replace("count.tmp", "count")
'''

START = '''\
import os, sys
os.makedirs("a", exist_ok=True)
open("a/innocent.txt", "w").write("innocent")
open("f.txt", "w").write("innocent file")
os.symlink({outside!r}, "b")
os.symlink({secret!r}, "g.txt")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", {daemon!r}, os.getcwd()])
    os._exit(0)
os.wait()
x = 41
print("daemon started")
'''


class Secret:
    """A directory outside the workspace with root-only secrets: a file the agent links to (it knows that path, not
    what the file holds), another whose name it does not know either, and a link to the first."""

    def __init__(self, tmp_path: Path):
        token = secrets.token_hex(8)
        self.text, self.name = f"SECRET-{token}", f"unlisted-{token}"
        self.dir = tmp_path / "outside"
        self.dir.mkdir()
        self.file = self.dir / "secret.txt"
        for f in (self.file, self.dir / self.name):
            f.write_text(self.text)
            f.chmod(0o600)
        (self.dir / "link").symlink_to(self.file)
        self.before = sorted(os.listdir(self.dir))

    def absent_from(self, produced: str, what: str) -> None:
        assert self.text not in produced and self.name not in produced, f"{what} leaked the secret: {produced[:500]}"
        assert sorted(os.listdir(self.dir)) == self.before, f"{what} wrote outside the workspace"


def everything_under(root: Path) -> str:
    """Every name, link target and file content under root (read without following anything)."""
    out = []
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(top) / name
            out.append(str(p.relative_to(root)))
            if p.is_symlink():
                out.append("-> " + os.readlink(p))
            elif p.is_file():
                out.append(p.read_text(errors="replace"))
    return "\n".join(out)


def copied(ws: Path, scratch: Path) -> str:
    dst = scratch / secrets.token_hex(4)
    notes = copy_tree(ws, dst, limit_bytes=1 << 20, max_entries=1000)
    return everything_under(dst) + "\n".join(notes)


def listed(ws: Path, scratch: Path) -> str:
    return json.dumps(list_files(ws, 1000))


def graders_listing(ws: Path, scratch: Path) -> str:
    return listing(ws)


def read(ws: Path, scratch: Path) -> str:
    try:
        return repr(read_files(ws, ["a/innocent.txt", "f.txt"], 1 << 20))
    except WorkbenchError as e:  # refused because it was a link at that moment: fine, and it must not say more
        return str(e)


def opened(ws: Path, scratch: Path) -> str:
    out = []
    for path in ("a/innocent.txt", "f.txt"):
        try:
            with open_file(ws, path, 1 << 20) as (fh, _):
                out.append(fh.read().decode(errors="replace"))
        except WorkbenchError as e:
            out.append(str(e))
    return "\n".join(out)


def written(ws: Path, scratch: Path) -> str:
    try:
        return json.dumps(write_file(ws, "a/new.txt", io.BytesIO(b"new")))
    except WorkbenchError as e:
        return str(e)


COPIERS: dict[str, Callable[[Path, Path], str]] = {
    "copy_tree": copied, "list_files": listed, "rubric listing": graders_listing, "read_files": read,
    "open_file": opened, "write_file": written,
}
ITERATIONS, SWAPS = 300, 2000  # each copier runs at least this often, while the daemon swaps at least this often


def count(ws: Path) -> int:
    try:
        return int((ws / "count").read_text() or 0)
    except (OSError, ValueError):
        return 0


async def until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.05)


def hands_factory(tmp_path: Path, backend: str = "sandbox") -> HandsFactory:
    """Hands as a host makes them (no warm pool, no spare: fewer kernels on a small machine)."""
    return HandsFactory(HandsSettings(backend=backend, pool_size=0, spare=False, registry_dir=str(tmp_path / "kernels")))


@pytest_asyncio.fixture
async def factory(tmp_path):
    f = hands_factory(tmp_path)
    yield f
    await f.close()


async def swapping_agent(agent, secret: Secret) -> Path:
    """Start the swap daemon from the agent's kernel, in its workspace; the workspace."""
    started = await agent.execute(START.format(outside=str(secret.dir), secret=str(secret.file), daemon=DAEMON))
    assert "daemon started" in started.stdout, started.text()
    ws = await agent.workspace()
    await until(lambda: count(ws) > 0, "the daemon swaps")
    return ws


@pytest.mark.parametrize("name", list(COPIERS))
async def test_no_copier_of_the_workspace_module_follows_a_swapped_link(factory, tmp_path, name):
    secret = Secret(tmp_path)
    agent = factory("agent", {}, None, None)
    try:
        ws = await swapping_agent(agent, secret)
        copier, scratch = COPIERS[name], tmp_path / "scratch"
        scratch.mkdir()
        first, deadline, runs = count(ws), time.monotonic() + 120, 0
        while runs < ITERATIONS or count(ws) < first + SWAPS:
            assert time.monotonic() < deadline, f"{runs} runs while the daemon swapped {count(ws) - first} times"
            secret.absent_from(await asyncio.to_thread(copier, ws, scratch), name)
            runs += 1
    finally:
        await agent.shutdown()


async def test_the_one_verifier_copies_a_frozen_workspace_and_leaks_nothing(factory, tmp_path):
    secret = Secret(tmp_path)
    agent = factory("agent", {}, None, None)
    # the check reports every file it sees: any secret that reached the copy would be in the verdict
    check = ("import os\nseen = []\nfor top, dirs, files in os.walk('.'):\n    for n in dirs + files:\n"
             "        p = os.path.join(top, n)\n        seen.append(p)\n"
             "        if os.path.isfile(p):\n            seen.append(open(p, errors='replace').read())\n"
             "explanation = repr(sorted(seen))\npassed = 'a/innocent.txt' in explanation or 'b/innocent.txt' in explanation")
    try:
        ws = await swapping_agent(agent, secret)
        for _ in range(3):
            before = count(ws)
            v = await python_verdict(factory, agent, check, "answer", label="check", timeout=120)
            secret.absent_from(json.dumps(v.to_json()), "the verifier")
            assert v.passed and "innocent" in v.explanation, v
            assert sum("a symbolic link" in n for n in v.details["copy_notes"]) == 2, v.details
            await until(lambda before=before: count(ws) > before, "the daemon goes on after the copy")
        assert (await agent.execute("x + 1")).result == "42"  # the kernel's state survived the freezes
    finally:
        await agent.shutdown()


def states(pids) -> dict[int, str]:
    found = {}
    for pid in pids:
        try:
            found[pid] = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            pass
    return found


@pytest.mark.parametrize("backend", ["sandbox", "local"])
async def test_the_agents_processes_hold_still_while_its_workspace_is_copied_and_go_on_after(tmp_path, backend):
    factory = hands_factory(tmp_path, backend)
    secret = Secret(tmp_path)
    try:
        agent = factory("agent", {}, None, None)
        await agent.execute("1")
        kernel = agent.kernel
        if backend == "local" and not limits.members(kernel.kid):
            pytest.skip("a local kernel without a cgroup: a daemon that left its process tree is not found (nor ended)")
        ws = await swapping_agent(agent, secret)
        under = freeze.descendants(kernel.pid, freeze.parents()) | set(limits.members(kernel.kid))
        under.discard(kernel.pid)  # a supervising launch wrapper runs on; a local kernel's own process stops too
        async with agent.frozen() as notes:
            assert notes == []
            held = count(ws)
            stopped = states(under | ({kernel.pid} if backend == "local" else set()))
            assert len(stopped) >= 2 and set(stopped.values()) <= {"T", "t"}, stopped
            notes = await asyncio.to_thread(copy_tree, ws, tmp_path / "copy", limit_bytes=1 << 20, max_entries=100)
            await asyncio.sleep(1.0)  # the daemon would have swapped thousands of times meanwhile
            assert count(ws) == held
            copy = everything_under(tmp_path / "copy")
            secret.absent_from(copy, "the frozen copy")
            assert "innocent\n" in copy + "\n" and "innocent file" in copy
            assert sorted(n.split(":")[0] for n in notes) in (["a", "f.txt"], ["a", "g.txt"], ["b", "f.txt"], ["b", "g.txt"])
        await until(lambda: count(ws) > held, "the daemon goes on after the thaw")
        assert (await agent.execute("x + 1")).result == "42"
        assert set(states(under).values()) <= {"R", "S", "D"}
    finally:
        await factory.close()
