"""Notebook context reaches the model: the request the (fake) Messages API receives carries an attached cell's
source and traceback before the person's text, and a session read again from its log (a cold read, a second
brain going on with it) sends the same."""

from __future__ import annotations

import json

import pytest

from workbench.brain import Brain, BrainSettings, build_request
from workbench.brain.coldread import read_conversation
from workbench.checks import check_attachments
from workbench.testing import Reply

MODEL = "claude-opus-5-5"

FAILED = check_attachments([{"kind": "cells", "path": "analysis.ipynb", "cells": [{
    "index": 3, "id": "cell-4", "cell_type": "code", "source": "rates = load()\nrates['eur'] / 0",
    "outputs": [{"type": "error", "ename": "ZeroDivisionError", "evalue": "division by zero",
                 "traceback": ["\x1b[0;31mZeroDivisionError\x1b[0m Traceback (most recent call last)",
                               "Cell In[4], line 2", "ZeroDivisionError: division by zero"]}]}]}])


def canon(x) -> str:
    return json.dumps(x, sort_keys=True)


@pytest.mark.asyncio
async def test_the_model_request_carries_the_cells_source_and_traceback_before_the_text(api, brain, log, hands):
    api.use([Reply(text="Divide by the count instead."), Reply(text="Yes.")])
    sid = brain.create_session(model=MODEL)["id"]
    assert await brain.run_turn(sid, "Fix this error", attachments=FAILED) == "end_turn"

    [message] = api.requests[0]["messages"]
    context, text = message["content"]
    assert text == {"type": "text", "text": "Fix this error"}
    assert context["type"] == "text" and context["text"].startswith('<notebook-context kind="cells" from="cell 4 of')
    for part in ("rates['eur'] / 0", "Cell In[4], line 2", "ZeroDivisionError: division by zero"):
        assert part in context["text"]
    assert "\x1b" not in context["text"]
    stored = [e for e in log.events(sid) if e.type == "user_message"][0].payload
    assert stored["attachments"] == FAILED and stored["text"] == "Fix this error"

    # read again from the log (a cold read, the fold of its events) and by a second brain that goes on with it
    assert canon(read_conversation(log, sid).request()) == canon(build_request(log.events(sid)))
    await brain.close()
    again = Brain(log, hands_factory=hands, settings=BrainSettings(retry_base=0.01))
    try:
        assert await again.run_turn(sid, "Thanks") == "end_turn"
    finally:
        await again.close()
    first, _, last = api.requests[1]["messages"]
    assert first == message and last["content"] == [{"type": "text", "text": "Thanks"}]
    assert api.rejections == []
