"""Shared fixtures: real DuckDB files in temp dirs, the fake Messages API over HTTP."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import psutil
import pytest

from workbench.log import DuckDBLog
from workbench.testing import FakeMessagesAPI

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path_factory):
    """No test sees the developer's key, database or Jupyter dirs."""
    for var in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "WORKBENCH_DB", "WORKBENCH_MODEL"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path_factory.mktemp("jupyter")
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(home / "data"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(home / "runtime"))


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "log.duckdb"


@pytest.fixture
def log(db_path):
    lg = DuckDBLog(db_path)
    yield lg
    lg.close()


@pytest.fixture
def fake_api():
    """A started fake Messages API; set its script with `fake_api.script = ...`."""
    api = FakeMessagesAPI("default").start()
    yield api
    api.stop()


# -- no kernel outlives the test run ------------------------------------------
#
# Every kernel this run starts (directly, through a CLI or Jupyter server subprocess, a
# gateway, nbclient) names a path under RUN_ROOT on its command line: its run directory or
# connection file is made under TMPDIR (or the Jupyter runtime dir, under pytest's basetemp,
# which lives there too), and every subprocess inherits TMPDIR. So a process whose command
# line mentions RUN_ROOT is this run's, and no other process is ever judged or stopped: not a
# user's JupyterLab kernels, not another test run's.

RUN_ROOT = tempfile.mkdtemp(prefix=f"wbtest-{uuid.uuid4().hex[:8]}-")


def pytest_configure(config):
    """Point every temporary file of this run (and of its subprocesses) under RUN_ROOT."""
    os.environ["TMPDIR"] = RUN_ROOT
    tempfile.tempdir = RUN_ROOT


def _started_by_this_run() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid != os.getpid() and any(RUN_ROOT in a for a in p.info["cmdline"] or []):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if a process this run started (a kernel, a sandbox) is still alive at the end."""
    # a kernel whose host was killed leaves on its own once it notices (ipykernel polls its parent)
    _, alive = psutil.wait_procs(_started_by_this_run(), timeout=15)
    lines = []
    for p in alive:
        try:
            lines.append(f"  pid {p.pid}: {' '.join(p.cmdline())[:200]}")
            p.kill()
        except psutil.NoSuchProcess:
            continue
    if lines:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = "processes this test run started outlived it (now killed):\n" + "\n".join(lines)
        if reporter is not None:
            reporter.write_line(text, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    else:
        shutil.rmtree(RUN_ROOT, ignore_errors=True)
