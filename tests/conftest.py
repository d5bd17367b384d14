"""Shared fixtures: real DuckDB files in temp dirs, the fake Messages API over HTTP."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from workbench.log import SessionLog
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
    lg = SessionLog(db_path)
    yield lg
    lg.close()


@pytest.fixture
def fake_api():
    """A started fake Messages API; set its script with `fake_api.script = ...`."""
    api = FakeMessagesAPI("default").start()
    yield api
    api.stop()


# -- no kernel outlives the test run ------------------------------------------

def _kernel_processes() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any("ipykernel" in a for a in p.info["cmdline"] or []):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


# kernels that were already running when the test run started are not ours
_BEFORE_RUN = {(p.pid, p.create_time()) for p in _kernel_processes()}


def _kernels_started_by_this_run() -> list[psutil.Process]:
    out = []
    for p in _kernel_processes():
        try:
            if (p.pid, p.create_time()) not in _BEFORE_RUN:
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if a kernel (plain or sandboxed) started during it is still alive at the end."""
    left = [p for p in _kernels_started_by_this_run() if p.pid != os.getpid()]
    # a kernel whose host was killed leaves on its own once it notices (ipykernel polls its parent)
    _, alive = psutil.wait_procs(left, timeout=15)
    if not alive:
        return
    lines = []
    for p in alive:
        try:
            lines.append(f"  pid {p.pid}: {' '.join(p.cmdline())[:200]}")
            p.kill()
        except psutil.NoSuchProcess:
            continue
    if lines:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = "kernels outlived the test run (now killed):\n" + "\n".join(lines)
        if reporter is not None:
            reporter.write_line(text, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
