"""A stream that breaks the Messages API's order is the model's failure, not the harness's."""

from __future__ import annotations

import pytest

from workbench.brain import Brain, BrainSettings
from workbench.brain.models import FatalModelError, MessageBuilder
from workbench.log import MemoryLog

BLOCK_FIRST = ({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},)


class BrokenStream:
    """Sends a content block before message_start, as a misbehaving compatible server might."""

    name = "broken"

    async def stream(self, request):
        for ev in BLOCK_FIRST:
            yield ev


@pytest.mark.parametrize("ev", [
    *BLOCK_FIRST,
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}},
])
def test_an_event_before_message_start_is_a_model_error(ev):
    builder = MessageBuilder()
    builder.feed({"type": "ping"})  # carries nothing, so it may come first
    with pytest.raises(FatalModelError, match="before message_start"):
        builder.feed(ev)


@pytest.mark.asyncio
async def test_a_broken_stream_ends_the_turn_with_a_model_error():
    log = MemoryLog()
    brain = Brain(log, hands_factory=None, settings=BrainSettings(retry_base=0.01), model_factory=lambda name: BrokenStream())
    sid = brain.create_session(model="scripted")["id"]
    assert await brain.run_turn(sid, "go") == "error"
    kinds = [e.type for e in log.events(sid)]
    assert "model_error" in kinds and "turn_failed" not in kinds and kinds[-1] == "turn_ended"


def tool_input(raw: str) -> list[dict]:
    """A stream whose one tool call streams `raw` as its input JSON."""
    return [
        {"type": "message_start", "message": {"role": "assistant", "content": []}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "python", "input": {}}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": raw}},
        {"type": "content_block_stop", "index": 0},
    ]


@pytest.mark.parametrize("raw", ['{"code": ' + "9" * 5000 + "}", '{"code": 1e400}', '{"code": NaN}', '{"code": -Infinity}',
                                 '{"code": ' + "1" * 4000 + "}", '{"code": "x"', "[" * 100_000])
def test_a_tool_input_the_log_cannot_keep_is_a_model_error(raw):
    """The model's numbers come from outside: one too long or not finite is its failure (the turn ends with a
    model_error), not a harness failure with a ValueError (a 4,000-digit integer passed json.loads, then the
    log refused the assistant turn)."""
    builder = MessageBuilder()
    with pytest.raises(FatalModelError, match="toolu_1") as e:
        for ev in tool_input(raw):
            builder.feed(ev)
    assert "\n" not in str(e.value) and len(str(e.value)) < 400


class HostileToolInput:
    name = "hostile"

    async def stream(self, request):
        for ev in tool_input('{"code": ' + "9" * 5000 + "}"):
            yield ev


@pytest.mark.asyncio
async def test_a_hostile_tool_input_ends_the_turn_with_a_model_error():
    log = MemoryLog()
    brain = Brain(log, hands_factory=None, settings=BrainSettings(retry_base=0.01), model_factory=lambda name: HostileToolInput())
    sid = brain.create_session(model="scripted")["id"]
    assert await brain.run_turn(sid, "go") == "error"
    kinds = [e.type for e in log.events(sid)]
    assert "model_error" in kinds and "turn_failed" not in kinds and kinds[-1] == "turn_ended"
