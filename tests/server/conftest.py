"""Fixtures for the server extension: a real in-process Jupyter server (pytest-jupyter),
real kernels, the fake Messages API, and real `jupyter server` subprocesses.

pytest-jupyter runs these async tests with its own runner (its hooks are imported
below, scoped to this directory); pytest-asyncio stays in strict mode, so do not
mark these tests with pytest.mark.asyncio.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the tests import their helpers from wbsrv.py

from wbsrv import WB, ServerProcess  # noqa: E402

# pytest-jupyter's fixtures and hooks for this directory only. Not `pytest_plugins`:
# pytest refuses that outside the top-level conftest, and at the top level its
# autouse fixtures and async runner would reach every other test.
from pytest_jupyter.jupyter_server import *  # noqa: E402,F403


@pytest.fixture
def wb_db(tmp_path: Path) -> Path:
    return tmp_path / "wb.duckdb"


@pytest.fixture
def jp_server_config(wb_db: Path) -> dict[str, Any]:
    return {
        # terminals off: pytest-jupyter adds them unless told, and they are not ours to test
        "ServerApp": {"jpserver_extensions": {"workbench": True, "jupyter_server_terminals": False}, "allow_unauthenticated_access": False},
        "Workbench": {"db": str(wb_db), "hands": {"pool_size": 0}},
    }


@pytest.fixture
def fake_api(monkeypatch: pytest.MonkeyPatch):
    """Start a FakeMessagesAPI with `script`; the server's Anthropic model talks to it."""
    from workbench.testing import FakeMessagesAPI

    started = []

    def start(script: Any) -> FakeMessagesAPI:
        api = FakeMessagesAPI(script).start()
        started.append(api)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        return api

    yield start
    for api in started:
        api.stop()


@pytest.fixture
def wb(jp_fetch, jp_ws_fetch):
    """A small client of the in-process server's API for tests."""
    return WB(jp_fetch, jp_ws_fetch)


@pytest.fixture
def server_process(tmp_path: Path):
    """A factory of real server subprocesses, all stopped at the end."""
    started: list[ServerProcess] = []

    def make(db: Path | None = None, **kw: Any) -> ServerProcess:
        s = ServerProcess(tmp_path / "home", db or tmp_path / "wb.duckdb", **kw)
        started.append(s)
        return s.start()

    yield make
    for s in started:
        s.stop()
