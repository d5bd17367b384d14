"""Shared fixtures: real DuckDB files in temp dirs, the fake Messages API over HTTP."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import pytest_asyncio

from workbench.hands.factory import HandsFactory, HandsSettings
from workbench.log import DuckDBLog
from workbench.testing import FakeMessagesAPI

REPO = Path(__file__).resolve().parent.parent
FILE_SECONDS = REPO / "tests" / "file_seconds.json"  # seconds per test file in a CI run: the order files start in


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


@pytest_asyncio.fixture
async def hands(tmp_path):
    """A hands factory as hosts make them (sandboxed by default), with no warm pool; closed after the test."""
    factory = HandsFactory(HandsSettings(pool_size=0, registry_dir=str(tmp_path / "kernels")))
    yield factory
    await factory.close()


@pytest.fixture
def fake_api():
    """A started fake Messages API; set its script with `fake_api.script = ...`."""
    api = FakeMessagesAPI("default").start()
    yield api
    api.stop()


# -- tiers -------------------------------------------------------------------------------------------------
# `pytest -m "not slow"` is the fast tier (under a minute): the log and its twin, the brain on the twin,
# pure policy and structure checks. Everything that starts kernels, sandboxes, Jupyter servers, CLI
# subprocesses or a browser is slow: these directories and modules, plus any test marked slow itself.

SLOW_DIRS = ("hands", "sandbox", "server", "service", "ui", "memory", "fidelity")
SLOW_MODULES = ("test_brain.py", "test_cli.py", "test_cli_manage.py", "test_bench_quick.py", "test_leakcheck.py")
# The sandbox, quota, identity and escape tests: CI runs them a second time as an unprivileged user
# (scripts/unprivileged.sh -m isolation), since a researcher's server is not root and CI's is.
ISOLATION_DIRS = ("sandbox",)
ISOLATION_MODULES = ("test_swap.py", "test_workspace_copy.py", "test_descriptors.py", "test_workspaces.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        rel = Path(str(item.fspath)).relative_to(REPO / "tests")
        if rel.parts[0] in SLOW_DIRS or rel.name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        if rel.parts[0] in ISOLATION_DIRS or rel.name in ISOLATION_MODULES:
            item.add_marker(pytest.mark.isolation)
    # The longest files run first, so that in several worker processes (scripts/test.sh: a file whole in one
    # worker, in this order) none of them starts last and runs on alone while the other workers idle: by the
    # seconds a CI run measured (tests/file_seconds.json, written by scripts/file_seconds.py), and a file it did
    # not measure by the longest timeout its tests were given (a long new file then starts early, not last)
    measured = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.exists() else {}
    longest: dict[str, float] = {}
    for item in items:
        rel = Path(str(item.fspath)).relative_to(REPO).as_posix()
        mark = item.get_closest_marker("timeout")
        seconds = (mark.args[0] if mark.args else mark.kwargs.get("timeout", 0)) if mark else 0
        longest[rel] = measured.get(rel, max(longest.get(rel, 0), seconds or 0))
    items.sort(key=lambda item: -longest[Path(str(item.fspath)).relative_to(REPO).as_posix()])  # stable


# -- no process this run started outlives it: see leakcheck.py -------------------------------------------------

from leakcheck import pytest_configure, pytest_sessionfinish  # noqa: E402,F401  (hooks of this run)
