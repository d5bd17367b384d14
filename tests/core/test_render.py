"""What a stored tool result says to a person: the CLI's and dreams' text, the notebook's chat view, for a python
call's result stored once (its observation alone) as for one stored with its content beside it (before)."""

from __future__ import annotations

import base64
import io

import orjson
from PIL import Image

from workbench.brain.tools import observation_output
from workbench.client.render import ChatView
from workbench.hands import Observation
from workbench.render import event_text, result_blocks, result_text


def png() -> str:
    out = io.BytesIO()
    Image.new("RGB", (3, 2), "blue").save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode()


def stored_once(obs: Observation) -> dict:
    """A python call's result as the brain stores it (through JSON, as the log gives it back)."""
    out = observation_output(obs)
    return orjson.loads(orjson.dumps({"tool_use_id": "t1", "name": "python", "is_error": out.is_error, **out.details}))


OBS = Observation(outputs=[{"output_type": "stream", "name": "stdout", "text": "sum is 5\n"},
                           {"output_type": "display_data", "data": {"text/plain": "<Figure>", "image/png": png()}},
                           {"output_type": "display_data", "data": {"text/html": "<table><tr><td>x</td></tr></table>"}}],
                  truncated=["[a note]"], text_limit=20_000, max_images=20)


def test_a_result_stored_once_says_what_the_model_read():
    payload = stored_once(OBS)
    assert "content" not in payload
    assert result_blocks(payload) == OBS.content_blocks()
    assert result_text(payload) == "sum is 5\nx\n[a note]\n[1 image(s)]"
    assert event_text({"seq": 3, "type": "tool_result", "payload": payload}) == result_text(payload)
    before = {**payload, "content": [{"type": "text", "text": "as stored"}]}  # a result stored before: its content
    assert result_text(before) == "as stored"
    assert result_text({"tool_use_id": "t2", "name": "recall"}) == ""


def test_the_chat_view_shows_a_result_stored_once():
    chat = ChatView("s1")
    chat.feed({"kind": "event", "event": {"seq": 2, "type": "assistant_turn", "payload": {"message": {"content": [
        {"type": "tool_use", "id": "t1", "name": "python", "input": {"code": "print(5)"}}]}}}})
    chat.feed({"kind": "event", "event": {"seq": 3, "type": "tool_result", "payload": stored_once(OBS)}})
    assert chat.transcript().endswith("[output] sum is 5\nx\n[a note]")
    texts, images = chat._calls["t1"].children, chat._shown["t1"].children  # text in the call's fold, images below it
    assert [type(w).__name__ for w in texts] == ["HTML", "HTML"] and [type(w).__name__ for w in images] == ["Image"]
    assert "sum is 5" in texts[0].value and "x" in texts[1].value
