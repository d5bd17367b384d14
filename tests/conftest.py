"""Shared fixtures: real DuckDB files in temp dirs, the fake Messages API over HTTP."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import pytest_asyncio

from workbench.brain import Brain, BrainSettings
from workbench.hands.factory import HandsFactory, HandsSettings
from workbench.log import DuckDBLog
from workbench.testing import FakeMessagesAPI

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "support"))  # the helpers several folders import by name (wbsupport, leakcheck)
FILE_SECONDS = REPO / "tests" / "file_seconds.json"  # seconds per test file in a CI run: the order files start in


@pytest.fixture(autouse=True, scope="module")
def _asyncio_unpatched():
    """No test module leaves asyncio patched for the tests after it in its worker (inspect_ai applies nest_asyncio
    when its synchronous API is called where a loop runs: a later `asyncio.run` then fails on a closed loop)."""
    import asyncio

    run = asyncio.run
    yield
    assert asyncio.run is run, f"this module left asyncio.run patched ({asyncio.run.__module__}): call what patches " \
                               "it off the event loop (workbench.evals.inspect_log.off_loop)"


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


@pytest.fixture
def api(fake_api, monkeypatch):
    """The fake Messages API, and the key and address the real SDK reads to reach it."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-a-real-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_api.url)
    return fake_api


@pytest_asyncio.fixture
async def brain(log, hands):
    """A brain on the test's log and hands that retries a failed model call at once; closed after the test."""
    b = Brain(log, hands_factory=hands, settings=BrainSettings(retry_base=0.01))
    yield b
    await b.close()


# -- tiers -------------------------------------------------------------------------------------------------
# `pytest -m "not slow"` is the fast tier (under a minute): the log and its twin, the brain on the twin,
# pure policy and structure checks. Everything that starts kernels, sandboxes, Jupyter servers, CLI
# subprocesses or a browser is slow: these directories and modules, plus any test marked slow itself.

# Modules by their path under tests/ (tests/test_structure.py checks that each one exists, so a moved file keeps its
# tier); FAST_MODULES are pure checks that live beside the slow tests of their package.
SLOW_DIRS = ("hands", "sandbox", "server", "service", "ui", "memory", "fidelity", "hub")
SLOW_MODULES = ("brain/test_loop.py", "cli/test_cli.py", "cli/test_manage.py", "bench/test_quick.py", "test_leakcheck.py")
FAST_MODULES = ("hands/test_fold.py", "hands/test_workspace_copy.py", "hands/test_channel.py", "server/test_fuzz_routes.py")
# The sandbox, quota, identity and escape tests: CI runs them a second time as an unprivileged user
# (scripts/unprivileged.sh -m isolation), since a researcher's server is not root and CI's is.
ISOLATION_DIRS = ("sandbox",)
ISOLATION_MODULES = ("hands/test_swap.py", "hands/test_workspace_copy.py", "hands/test_descriptors.py", "evals/test_workspaces.py")


def _isolation_path(rel: Path) -> bool:
    """Whether a file or directory under tests/ holds isolation tests (or is on the way to one)."""
    posix = rel.as_posix()
    return rel.parts[0] in ISOLATION_DIRS or any(m == posix or m.startswith(posix + "/") for m in ISOLATION_MODULES)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """`-m isolation` (scripts/unprivileged.sh) collects only the files of the isolation tests: importing every
    test module of the suite in each worker, to deselect 1,916 of its 2,012 tests, was 11 s of CPU per process
    (more as the ordinary user, where no rewritten test module is cached) before the first test ran."""
    if config.getoption("markexpr", "") != "isolation":
        return None
    try:
        rel = collection_path.relative_to(REPO / "tests")
    except ValueError:
        return None
    if not rel.parts or (collection_path.is_file() and not collection_path.name.startswith("test_")):
        return None  # the tests' root, and the conftest and helper files of the directories kept
    return None if _isolation_path(rel) else True


def pytest_collection_modifyitems(config, items):
    for item in items:
        rel = Path(str(item.fspath)).relative_to(REPO / "tests")
        if (rel.parts[0] in SLOW_DIRS and rel.as_posix() not in FAST_MODULES) or rel.as_posix() in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        if rel.parts[0] in ISOLATION_DIRS or rel.as_posix() in ISOLATION_MODULES:
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


# -- no process this run started outlives it: see support/leakcheck.py -------------------------------------------

from leakcheck import pytest_configure, pytest_sessionfinish  # noqa: E402,F401  (hooks of this run)
