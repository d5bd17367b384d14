"""Helpers of the memory tests: three recorded sessions, their models, a host with the memory plugin, a dream."""

from __future__ import annotations

import asyncio

from workbench.brain.models import ModelCatalog, Reply, ScriptedModel
from workbench.hands.factory import HandsFactory, HandsSettings
from workbench.host import Host
from workbench.memory.dream import create_dream, run_dream
from workbench.memory.dream_script import dream_script
from workbench.memory.plugin import MemoryPlugin

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
    return ModelCatalog(scripts={"dream": dream_script}).make(name)


def build_host(db, tmp, **kw) -> Host:
    """A host over `db` with the memory plugin, sandboxed hands without a pool, and this file's models (unless given)."""
    if "hands" not in kw:
        kw["hands"] = HandsFactory(HandsSettings(pool_size=0, registry_dir=str(tmp / "kernels")))
    kw.setdefault("plugins", [MemoryPlugin()])
    kw.setdefault("model_factory", model_factory)
    return Host.build(db, **kw)


def dream(brain, store, *, sessions=None, model="scripted:dream", instructions=None) -> dict:
    """Create and run a dream to its end, committed: its commit summary with the stop reason."""
    dream_id = create_dream(brain, store, sessions=sessions, model=model)
    return asyncio.run(run_dream(brain, store, dream_id, instructions))


def pause_between_chunks(monkeypatch):
    """Make every dream pause right after it commits a chunk (before its next one), in this process:
    (between, go_on), two threading.Events: `between` is set at the pause, `go_on.set()` ends it."""
    import threading

    from workbench.memory import dream as dreams

    between, go_on = threading.Event(), threading.Event()
    real = dreams.commit_dream

    def paused(store, dream_id):  # runs off the loop, between one chunk's turn and the next
        out = real(store, dream_id)
        between.set()
        go_on.wait(120)
        return out

    monkeypatch.setattr(dreams, "commit_dream", paused)
    return between, go_on
