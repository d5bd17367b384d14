"""The leak check judges only the processes its own test run started.

A real Jupyter server runs with a kernel of its own (as a user's JupyterLab would); a separate
pytest run, with the leak check loaded, leaves a process of its own behind. That run must fail,
kill exactly its own leftover, and leave the server's kernel alone; a run that leaks nothing passes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from workbench.testing.jupyter import JupyterProcess

pytestmark = pytest.mark.slow

SUPPORT = Path(__file__).resolve().parent / "support"  # where leakcheck.py lives

LEAKY = '''
import subprocess, sys, tempfile

def test_leaves_a_kernel_like_process_behind():
    # a "kernel" whose connection file lives in this run's temp dir, like every kernel the suite starts
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "ipykernel_launcher", "-f",
                      tempfile.mkdtemp() + "/kernel.json"])
'''

CLEAN = '''
def test_nothing_left():
    assert True
'''


def inner_run(tmp: Path, name: str, source: str, *args: str) -> subprocess.CompletedProcess:
    d = tmp / name
    d.mkdir()
    (d / "pytest.ini").write_text("[pytest]\n")  # a run of its own, not this repository's configuration
    (d / f"test_{name}.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
    env.pop("TMPDIR", None)  # the inner run makes its own root, as a run started from a shell would
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "leakcheck", "-q", "-p", "no:cacheprovider", *args, str(d)],
                          cwd=d, env=env, capture_output=True, text=True, timeout=180)


def _cmdline(p: psutil.Process) -> list[str]:
    """A child's command line, or nothing for one that ended (or is a zombie) while we looked."""
    try:
        return p.cmdline()
    except psutil.Error:  # ZombieProcess is a NoSuchProcess: the server's short-lived children end any time
        return []


def test_the_leak_check_stops_its_own_leftovers_and_nothing_else(tmp_path):
    server = JupyterProcess(tmp_path / "lab", probe="/api/status")
    server.start()
    try:
        r = httpx.post(server.url + "/api/kernels", headers=server.headers, json={"name": "python3"}, timeout=60)
        assert r.status_code == 201, r.text
        kid = r.json()["id"]
        deadline = time.monotonic() + 60
        kernel_procs: list[psutil.Process] = []
        while not kernel_procs and time.monotonic() < deadline:  # the user's kernel: a real ipykernel
            kernel_procs = [p for p in psutil.Process(server.proc.pid).children(recursive=True)
                            if any(kid in a for a in _cmdline(p))]
            time.sleep(0.1)
        assert kernel_procs, "the server's kernel did not start"

        # in one process, and in pytest-xdist workers (each checks its own tests; the controller reports for all)
        for name, args in (("leaky", ()), ("leaky_workers", ("-n", "2"))):
            leaky = inner_run(tmp_path, name, LEAKY, *args)
            assert leaky.returncode == pytest.ExitCode.TESTS_FAILED, leaky.stdout + leaky.stderr
            assert "outlived it (now killed)" in leaky.stdout
            leftover = [line for line in leaky.stdout.splitlines() if "time.sleep(300)" in line]
            assert len(leftover) == 1, leaky.stdout
            pid = int(leftover[0].split("pid ")[1].split(":")[0])
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE

        for name, args in (("clean", ()), ("clean_workers", ("-n", "2"))):
            clean = inner_run(tmp_path, name, CLEAN, *args)
            assert clean.returncode == 0, clean.stdout + clean.stderr

        # the user's kernel lived through both runs' checks
        assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in kernel_procs)
        listed = httpx.get(server.url + "/api/kernels", headers=server.headers, timeout=10).json()
        assert [k["id"] for k in listed] == [kid]
    finally:
        server.stop()
