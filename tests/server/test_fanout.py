"""The websockets' feed: each item encoded once for every socket of a session, a loop turn's deltas of one block joined."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime

import pytest

from workbench.log import Event
from workbench.server.fanout import Fanout


def delta(i: int, text: str, kind: str = "text_delta", key: str = "text") -> dict:
    return {"type": "content_block_delta", "index": i, "delta": {"type": kind, key: text}}


@pytest.mark.asyncio
async def test_every_socket_gets_one_encoding_and_a_turns_deltas_come_joined_before_the_next_event():
    fan = Fanout(logging.getLogger("test"))
    heard: dict[str, list] = {"a": [], "b": [], "other": []}
    for name in ("a", "b"):
        fan.watch("s1", lambda kind, obj, text, name=name: heard[name].append((kind, text)))
    unwatch = fan.watch("s2", lambda kind, obj, text: heard["other"].append((kind, text)))
    sent = [delta(0, "Hel"), delta(0, "lo "), delta(0, "\ud800!"), delta(1, "{\"a\"", "input_json_delta", "partial_json"),
            delta(1, ": 1}", "input_json_delta", "partial_json"), {"type": "content_block_delta", "index": 1,
                                                                   "delta": {"type": "signature_delta", "signature": "s"}},
            delta(1, "x", "input_json_delta", "partial_json")]
    for ev in sent:
        fan.delta("s1", ev)
    before = dict(sent[0]["delta"])
    fan.events([Event("s1", 7, datetime(2026, 1, 1, tzinfo=UTC), "assistant_turn", {"message": {"content": []}})])
    await asyncio.sleep(0)
    assert heard["a"] == heard["b"] and heard["other"] == []
    assert all(x is y for (_, x), (_, y) in zip(heard["a"], heard["b"], strict=True))  # the same text, encoded once
    msgs = [json.loads(text) for _, text in heard["a"]]
    assert [m["kind"] for m in msgs] == ["delta", "delta", "delta", "delta", "event"]  # deltas first, then the event
    assert [m["event"]["delta"].get("text", m["event"]["delta"].get("partial_json")) for m in msgs[:4:]] \
        == ["Hello \ud800!", "{\"a\": 1}", None, "x"]
    assert msgs[4]["event"]["seq"] == 7 and sent[0]["delta"] == before  # what the brain passed is not changed
    unwatch()
    fan.delta("s2", delta(0, "nobody hears"))
    await asyncio.sleep(0)
    assert heard["other"] == []
