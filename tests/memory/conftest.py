"""Fixtures for memory and dreaming: three sessions recorded with real kernels, a brain with a store."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the tests import their helpers from wbmemory.py and wbforget.py

from wbmemory import RECORDED, SYSTEMS, build_host, model_factory  # noqa: E402

@pytest.fixture
def systems() -> list[str]:
    """The system prompts the `capture` model saw, from this test on."""
    SYSTEMS.clear()
    return SYSTEMS


@pytest.fixture(scope="session")
def recorded_db(tmp_path_factory):
    """A database holding the three sessions, recorded once per test run (real kernels run their code)."""
    tmp = tmp_path_factory.mktemp("recorded")
    path = tmp / "recorded.duckdb"
    host = build_host(path, tmp)

    async def go() -> list[str]:
        ids = []
        try:
            for name, (title, text, _) in RECORDED.items():
                sid = host.brain.create_session(title=title, model=name)["id"]
                assert await host.brain.run_turn(sid, text) == "end_turn"
                ids.append(sid)
        finally:
            await host.close()
        return ids

    return path, asyncio.run(go())


@pytest.fixture
def recorded(recorded_db, db_path) -> list[str]:
    """A fresh copy of the recorded database at db_path; returns the three session ids."""
    shutil.copy(recorded_db[0], db_path)
    return recorded_db[1]


@pytest.fixture
def host(recorded, db_path, tmp_path):
    """A host (not started) over a copy of the recorded database."""
    h = build_host(db_path, tmp_path)
    yield h
    asyncio.run(h.close())


@pytest.fixture
def store(host):
    return host.plugin("memory").store


@pytest.fixture
def brain(host):
    return host.brain


@pytest.fixture
def fresh(tmp_path):
    """A host factory over new databases (no recorded sessions), each closed after the test; `make(factory,
    **memory_settings)` takes the models (default: the memory suite's) and sets the memory plugin's settings."""
    hosts = []

    def make(factory=model_factory, **settings):
        h = build_host(tmp_path / f"fresh{len(hosts)}.duckdb", tmp_path, model_factory=factory)
        for k, v in settings.items():
            setattr(h.plugin("memory").settings, k, v)
        hosts.append(h)
        return h

    yield make
    for h in hosts:
        asyncio.run(h.close())


# The REST tests run against a real in-process Jupyter server: pytest-jupyter's fixtures and
# hooks for this directory only (pytest refuses `pytest_plugins` outside the top-level conftest).
from pytest_jupyter.jupyter_server import *  # noqa: E402,F403


@pytest.fixture
def jp_server_config(db_path):
    return {
        "ServerApp": {"jpserver_extensions": {"workbench": True}, "allow_unauthenticated_access": False},
        "Workbench": {"db": str(db_path), "hands": {"pool_size": 0}},
    }
