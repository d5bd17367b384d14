"""The `workbench` sandbox environment of Inspect AI: an Inspect task's tools run in workbench hands.

The example task (examples/inspect/workbench_task.py) runs offline with Inspect's mock model, found through
Inspect's entry point group as a third-party sandbox is; its calls are in the workbench log, its kernel killed
mid-call is replaced and the call says so. The sandbox's verbs are tested on their own with hostile input: paths
out of the workspace, a link out of it, a timeout, a user, binary files. Real kernels and DuckDB files."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

inspect_log = pytest.importorskip("inspect_ai.log")


def read_log(*args, **kwargs):
    """inspect_ai's reader, off this thread's event loop: called in an async test, it would patch asyncio for the
    whole worker process (nest_asyncio), and later test files' asyncio.run would fail."""
    from workbench.evals.inspect_log import off_loop

    return off_loop(inspect_log.read_eval_log, *args, **kwargs)


from inspect_ai.util import SandboxUserUnsupportedError  # noqa: E402
from inspect_ai.util._sandbox.registry import registry_find_sandboxenv  # noqa: E402

pytestmark = [pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "inspect" / "workbench_task.py"


def test_the_example_task_runs_its_tools_in_workbench_hands_and_its_log_is_a_success(tmp_path):
    db, logs = tmp_path / "wb.duckdb", tmp_path / "logs"
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--db", str(db), "--log-dir", str(logs)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = read_log(proc.stdout.strip().splitlines()[-1])
    assert log.status == "success" and log.eval.sandbox.type == "workbench"
    (sample,) = log.samples
    assert sample.scores["note_written"].value == "C" and sample.scores["note_written"].answer == "hello from sandbox"
    bash_out, died, again = [m.text for m in sample.messages if m.role == "tool"]
    # the sandboxed kernel's workspace and identity, not this process's
    assert bash_out == "/workspace\nhello from sandbox\n"
    assert died.startswith("KernelDied: the kernel died (signal SIGKILL)") and "fresh kernel" in died
    assert again.startswith("alive again in /workspace pid ") and "hello from sandbox" in again

    con = duckdb.connect(str(db), read_only=True)
    try:
        ((sid,),) = con.execute("SELECT id FROM sessions WHERE kind = 'inspect'").fetchall()
        events = con.execute("SELECT type, payload FROM events WHERE session_id = ? ORDER BY seq", [sid]).fetchall()
    finally:
        con.close()
    types = [t for t, _ in events]
    assert types.count("tool_started") == types.count("tool_result") == 3
    assert types.count("hands_died") == 1 and types.count("hands_started") == 2  # the killed kernel was replaced
    assert json.loads(next(p for t, p in events if t == "hands_started"))["launcher"] == "sandbox"
    assert types.index("hands_died") < [i for i, t in enumerate(types) if t == "tool_result"][1]


@pytest.mark.asyncio
async def test_the_sandboxs_verbs_stay_in_the_workspace_and_fail_as_inspect_expects(tmp_path):
    cls = registry_find_sandboxenv("workbench")  # found by its name, as Inspect finds it for sandbox="workbench"
    from workbench.inspect_sandbox import WorkbenchSandboxConfig, WorkbenchSandboxEnvironment

    assert cls is WorkbenchSandboxEnvironment
    cfg = WorkbenchSandboxConfig(db=str(tmp_path / "wb.duckdb"), backend="local")
    envs = await cls.sample_init("t", cfg, {"k": "v"})
    env = envs["default"]
    try:
        root = await (await env.host.brain.hands(env.session_id)).workspace()
        r = await env.exec(["bash", "-c", "cat; echo err >&2; printf '\\xff'; exit 3"], input="piped ", env={"X": "1"})
        assert (r.success, r.returncode, r.stdout, r.stderr) == (False, 3, "piped \ufffd", "err\n")
        r = await env.exec(["sh", "-c", "echo $X; pwd"], env={"X": "from-env"})
        assert r.stdout == f"from-env\n{root}\n" and r.success
        r = await env.exec(["python3", "-"], input="x = 6 * 7\nprint(x)")
        r2 = await env.exec(["python3", "-"], input="print(x + 1)")  # the kernel keeps its state between calls
        assert (r.stdout, r2.stdout) == ("42\n", "43\n")
        r = await env.exec(["python3", "-"], input="raise ValueError('boom')")
        assert not r.success and r.returncode == 1 and "ValueError: boom" in r.stderr and "\x1b[" not in r.stderr
        r = await env.exec(["no-such-program-here"])
        assert not r.success and "FileNotFoundError" in r.stderr
        with pytest.raises(TimeoutError):
            await env.exec(["sleep", "30"], timeout=1)
        with pytest.raises(TimeoutError):
            await env.exec(["python3", "-"], input="import time\ntime.sleep(60)", timeout=1)
        r = await env.exec(["python3", "-"], input="raise KeyboardInterrupt")  # its own, at once: not a timeout
        assert not r.success and "KeyboardInterrupt" in r.stderr
        assert (await env.exec(["python3", "-"], input="print(x)")).stdout == "42\n"  # interrupted, not replaced
        with pytest.raises(SandboxUserUnsupportedError):
            await env.exec(["id"], user="root")

        blob = bytes(range(256)) * 10
        await env.write_file("deep/dir/blob.bin", blob)
        assert await env.read_file("deep/dir/blob.bin", text=False) == blob
        await env.write_file(str(root / "abs.txt"), "é\n")
        assert await env.read_file("/workspace/abs.txt") == "é\n" and (root / "abs.txt").read_text() == "é\n"
        outside = tmp_path / "outside.txt"
        outside.write_text("secret")
        os.symlink(outside, root / "link.txt")
        for bad in ("../outside.txt", str(outside), "/etc/passwd", "link.txt", "a\0b", ""):
            with pytest.raises((PermissionError, FileNotFoundError)):
                await env.read_file(bad)
        await env.write_file("link.txt", "written")  # the link is replaced by a file, never followed
        assert not (root / "link.txt").is_symlink() and (root / "link.txt").read_text() == "written"
        with pytest.raises(FileNotFoundError):
            await env.read_file("missing.txt")
        with pytest.raises(IsADirectoryError):
            await env.write_file("deep", "a directory")
        assert outside.read_text() == "secret"
        with pytest.raises(PermissionError):
            await env.write_file("../escape.txt", "x")
        assert not (tmp_path / "escape.txt").exists()
        events = env.host.log.events(env.session_id)
        assert sum(e.type == "tool_started" for e in events) == sum(e.type == "tool_result" for e in events) == 10
    finally:
        await cls.sample_cleanup("t", cfg, envs, False)
    assert cls.hosts == {}  # the host closed with its last sample


@pytest.mark.asyncio
async def test_samples_without_a_configured_log_share_one_in_a_temporary_directory(tmp_path, monkeypatch):
    import types

    from workbench import inspect_sandbox
    from workbench.inspect_sandbox import WorkbenchSandboxEnvironment as cls

    made = []

    def mkdtemp(prefix: str) -> str:  # the temporary directory under the test's, not the machine's (nor the kernels')
        made.append(tmp_path / f"{prefix}{len(made)}")
        made[-1].mkdir()
        return str(made[-1])

    monkeypatch.delenv("WORKBENCH_DB", raising=False)
    monkeypatch.setattr(inspect_sandbox, "tempfile", types.SimpleNamespace(mkdtemp=mkdtemp))
    monkeypatch.setattr(cls, "default_db", None)
    samples = [await cls.sample_init("t", {"backend": "local"}, {}) for _ in range(2)]
    try:
        a, b = (s["default"] for s in samples)
        assert a.host is b.host and a.db == b.db == made[0] / "workbench.duckdb" and len(made) == 1
        assert a.session_id != b.session_id
        assert len(cls.hosts) == 1
        ra, rb = await asyncio.gather(a.exec(["sh", "-c", "pwd"]), b.exec(["sh", "-c", "pwd"]))
        assert ra.stdout != rb.stdout  # a workspace each
    finally:
        for s in samples:
            await cls.sample_cleanup("t", None, s, False)
    assert cls.hosts == {}
