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
