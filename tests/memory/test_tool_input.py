"""A dream tool's input is the model's: any JSON it sends is refused as data the model can act on, never raised."""

from __future__ import annotations

import pytest

from workbench.brain.tools import ToolContext
from workbench.memory import tools
from workbench.memory.store import MemoryStore


@pytest.fixture
def dream(log):
    """(store, the context of a dream's tool call, an accepted memory's id)."""
    store = MemoryStore(log)
    log.create_session("dream1", title="a dream", model="scripted", kind="dream", payload={"config": {}})
    mid = store.create(title="a fact", text="something once true", actor="person:ann", provenance=[], status="accepted")
    return store, ToolContext("dream1", None, log), mid


@pytest.mark.parametrize(("tool", "inp", "says"), [
    (tools.propose_merge, lambda mid: {"memory_ids": 5, "title": "t", "text": "x", "reason": "r"}, "at least two"),
    (tools.propose_merge, lambda mid: {"memory_ids": [["m1"], mid], "title": "t", "text": "x", "reason": "r"}, "no memory ['m1']"),
    (tools.propose_retire, lambda mid: {"memory_id": {"id": "m1"}, "reason": "out of date"}, "no memory {'id': 'm1'}"),
    (tools.propose_retire, lambda mid: {"memory_id": mid, "reason": "out of date", "title": 5}, "title must be a string"),
])
def test_malformed_proposals_are_refused(dream, tool, inp, says):
    store, ctx, mid = dream
    out = tool(store, inp(mid), ctx)
    assert out.is_error and says in out.content[0]["text"]


def test_a_well_formed_retirement_is_staged(dream):
    store, ctx, mid = dream
    out = tools.propose_retire(store, {"memory_id": mid, "reason": "out of date"}, ctx)
    assert not out.is_error and out.details["proposal"]["title"] == "a fact" and out.details["proposal"]["targets"] == [mid]
