"""Fixtures for memory and dreaming: three sessions recorded with real kernels, a brain with a store."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from workbench.brain import Brain
from workbench.brain.models import Reply, ScriptedModel, make_model
from workbench.log import DuckDBLog
from workbench.memory import MemoryStore
from workbench.memory import dream  # noqa: F401  (registers the dream tools and scripted:dream)

# Three recorded sessions: (title, user message, the scripted model's steps).
RECORDED = {
    "rec:ratio": (
        "ratio of two numbers",
        "Compute the ratio of hits to trials. Always print results with two decimals.",
        [Reply(text="Dividing.", code=["trials = 0\nratio = 7 / trials"]),
         Reply(text="Guarding against zero trials.", code=["ratio = 7 / max(trials, 1)\nprint(f'{ratio:.2f}')"]),
         Reply(text="The ratio is 7.00.")],
    ),
    "rec:duckdb": (
        "query with duckdb",
        "Count the rows with SQL. I prefer duckdb over pandas for queries.",
        [Reply(text="Using duckdb.", code=["import duckdb\nprint(duckdb.sql('select 42 as n').fetchall())"]),
         Reply(text="It returned 42.")],
    ),
    "rec:json": (
        "parse a config",
        "Parse the config string and show its keys.",
        [Reply(text="Parsing.", code=["import json\ncfg = json.loads(\"{'a': 1}\")"]),
         Reply(text="Single quotes are not JSON; fixing.", code=["cfg = json.loads('{\"a\": 1}')\nprint(sorted(cfg))"]),
         Reply(text="The keys are ['a'].")],
    ),
}


SYSTEMS: list[str] = []  # the system prompt of every request the `capture` model answered


def capture_script(request: dict) -> Reply:
    SYSTEMS.append(request["system"])
    return Reply(text="noted")


def model_factory(name: str):
    if name == "capture":
        return ScriptedModel(capture_script, name="capture")
    if name in RECORDED:
        return ScriptedModel(RECORDED[name][2], name=name)
    return make_model(name)


@pytest.fixture
def systems() -> list[str]:
    """The system prompts the `capture` model saw, from this test on."""
    SYSTEMS.clear()
    return SYSTEMS


@pytest.fixture(scope="session")
def recorded_db(tmp_path_factory):
    """A database holding the three sessions, recorded once per test run (real kernels run their code)."""
    path = tmp_path_factory.mktemp("recorded") / "recorded.duckdb"
    log = DuckDBLog(path)
    b = Brain(log, model_factory=model_factory)

    async def go() -> list[str]:
        ids = []
        try:
            for name, (title, text, _) in RECORDED.items():
                sid = b.create_session(title=title, model=name)["id"]
                assert await b.run_turn(sid, text) == "end_turn"
                ids.append(sid)
        finally:
            await b.close()
        return ids

    try:
        ids = asyncio.run(go())
    finally:
        log.close()
    return path, ids


@pytest.fixture
def recorded(recorded_db, db_path) -> list[str]:
    """A fresh copy of the recorded database at db_path; returns the three session ids."""
    shutil.copy(recorded_db[0], db_path)
    return recorded_db[1]


@pytest.fixture
def store(recorded, db_path):
    log = DuckDBLog(db_path)
    st = MemoryStore(log)
    yield st
    log.close()


@pytest.fixture
def brain(store):
    b = Brain(store.log, model_factory=model_factory)
    b.extras["memory"] = store
    yield b
    asyncio.run(b.close())


# The REST tests run against a real in-process Jupyter server: pytest-jupyter's fixtures and
# hooks for this directory only (pytest refuses `pytest_plugins` outside the top-level conftest).
from pytest_jupyter.jupyter_server import *  # noqa: E402,F403


@pytest.fixture
def jp_server_config(db_path):
    return {
        "ServerApp": {"jpserver_extensions": {"workbench": True}, "allow_unauthenticated_access": False},
        "Workbench": {"db": str(db_path), "hands": {"pool_size": 0}},
    }
