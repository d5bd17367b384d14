"""Widgets and updates of earlier calls' outputs, as the model reads them: kernel messages fed to a Collector.

What a kernel sends for a widget is its state on comm messages and a display of its view; the model
reads what the widget shows (its kind named), an Output widget's captures where the widget is, and a
change a later call makes to an earlier call's display or widget as an update that says which.
"""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from workbench.hands.observing.collect import Budget, Collector, Notebook

VIEW = "application/vnd.jupyter.widget-view+json"


def png_b64() -> str:
    b = io.BytesIO()
    Image.new("RGB", (8, 4), "red").save(b, "PNG")
    return base64.b64encode(b.getvalue()).decode()


async def opened(c: Collector, model: str, name: str, **state) -> None:
    await c.feed("comm_open", {"comm_id": model, "target_name": "jupyter.widget",
                               "data": {"state": {"_model_name": f"{name}Model", **state}, "buffer_paths": []}})


async def shown(c: Collector, model: str, repr_: str = "W()") -> None:
    await c.feed("display_data", {"data": {"text/plain": repr_, VIEW: {"model_id": model, "version_major": 2}}})


async def capturing(c: Collector, model: str, on: bool) -> None:
    await c.feed("comm_msg", {"comm_id": model, "data": {"method": "update", "state": {"msg_id": "m" if on else ""},
                                                         "buffer_paths": []}})


def read(c: Collector) -> list[str | tuple[str, str]]:
    return [b["text"] if b["type"] == "text" else ("image", b["source"]["media_type"])
            for b in c.done().content_blocks()]


@pytest.mark.asyncio
async def test_state_widgets_and_containers_read_as_what_they_show():
    c = Collector(Budget(), 1)
    await opened(c, "s", "IntSlider", value=7, description="Test:", _view_name="ignored")
    await opened(c, "d", "Dropdown", _options_labels=["One", "Two"], index=1, description="Number")
    await opened(c, "p", "Password", value="secret", description="key")
    await opened(c, "b", "Button", description="Click me")
    await opened(c, "h", "HTML", value="Hello <b>World</b>")
    await opened(c, "v", "VBox", children=["IPY_MODEL_d", "IPY_MODEL_p"])
    await opened(c, "t", "Tab", children=["IPY_MODEL_s", "IPY_MODEL_v"], titles=["slider", ""])
    await opened(c, "loop", "HBox", children=["IPY_MODEL_loop", "IPY_MODEL_nowhere"])  # hostile: itself, unknown
    for model in ("s", "b", "h", "t", "loop"):
        await shown(c, model)
    assert read(c) == ["[IntSlider widget] Test: 7\n[Button widget] Click me\n[HTML widget] Hello World\n"
                       "[Tab widget]\n  slider:\n    [IntSlider widget] Test: 7\n  [VBox widget]\n"
                       "    [Dropdown widget] Number: Two\n    [Password widget] key: ••••••\n"
                       "[HBox widget]\n  [Widget widget]\n  [Widget widget]"]


@pytest.mark.asyncio
async def test_an_output_widget_shows_what_it_captured_where_it_is_shown_images_in_place():
    """Captured before and after it is shown, the widget's outputs read in their order where the widget is; the
    call's own outputs around it stay the call's."""
    c = Collector(Budget(), 1)
    await opened(c, "o", "Output", outputs=[])
    await capturing(c, "o", True)
    await c.feed("stream", {"name": "stdout", "text": "before it was shown\n"})
    await capturing(c, "o", False)
    await c.feed("stream", {"name": "stdout", "text": "the call's own\n"})
    await shown(c, "o", "Output()")
    await capturing(c, "o", True)
    await c.feed("display_data", {"data": {"image/png": png_b64(), "text/plain": "<Figure>"}})
    await c.feed("stream", {"name": "stderr", "text": "after it\n"})
    await capturing(c, "o", False)
    assert read(c) == ["the call's own\n[Output widget]\n  before it was shown", ("image", "image/png"),
                       "  [stderr]\n  after it"]


@pytest.mark.asyncio
async def test_a_later_change_of_an_earlier_widget_reads_as_its_update():
    """An Output widget an earlier call showed reads, in the call that writes into it, what it now also shows
    (or, after a clear_output in it, what it now shows), once, in its place; a slider it set reads as the slider's
    new line; a widget no call showed reads nowhere, as in a notebook."""
    nb = Notebook()
    first = Collector(Budget(), 1, nb)
    await opened(first, "o", "Output", outputs=[])
    await opened(first, "s", "IntSlider", value=1, description="s")
    await opened(first, "hidden", "Output", outputs=[])
    await shown(first, "o", "Output()")
    await shown(first, "s")
    first.done()
    second = Collector(Budget(), 1, nb)
    await second.feed("stream", {"name": "stdout", "text": "own\n"})
    await capturing(second, "o", True)
    await second.feed("stream", {"name": "stdout", "text": "into the widget\n"})
    await capturing(second, "hidden", True)
    await second.feed("stream", {"name": "stdout", "text": "shown nowhere\n"})
    await capturing(second, "hidden", False)
    await second.feed("stream", {"name": "stdout", "text": "more\n"})
    await capturing(second, "o", False)
    await second.feed("comm_msg", {"comm_id": "s", "data": {"method": "update", "state": {"value": 9}}})
    await second.feed("stream", {"name": "stdout", "text": "own again\n"})
    assert read(second) == ["own\n[the Output widget from the previous call now also shows:]\n  into the widget\n"
                            "  more\nown again\n[the IntSlider widget from the previous call is now:]\n"
                            "[IntSlider widget] s: 9"]
    third = Collector(Budget(), 1, nb)
    await capturing(third, "o", True)
    await third.feed("clear_output", {"wait": False})
    await third.feed("stream", {"name": "stdout", "text": "fresh\n"})
    await capturing(third, "o", False)
    await third.feed("clear_output", {"wait": False})  # the call's own: the widget's outputs are the widget's
    assert read(third) == ["[the Output widget from 2 calls ago is now:]\n[Output widget]\n  fresh"]
    fourth = Collector(Budget(), 1, nb)
    await shown(fourth, "hidden", "Output()")  # shown at last: with what it captured
    assert read(fourth) == ["[Output widget]\n  shown nowhere"]


@pytest.mark.asyncio
async def test_an_update_of_an_earlier_display_says_which_display_and_call():
    """Updates of a display an earlier call showed read as that display's new content, after a line naming the
    display and its call, once however often this call updates it, and no clear_output of this call removes them."""
    nb = Notebook()
    first = Collector(Budget(), 1, nb)
    await first.feed("display_data", {"data": {"text/plain": "'first'"}, "transient": {"display_id": "abc"}})
    first.done()
    Collector(Budget(), 1, nb).done()  # a call in between
    third = Collector(Budget(), 1, nb)
    await third.feed("stream", {"name": "stdout", "text": "own\n"})
    for text in ("'second'", "'third'"):
        await third.feed("update_display_data", {"data": {"text/plain": text}, "transient": {"display_id": "abc"}})
    await third.feed("clear_output", {"wait": False})
    await third.feed("stream", {"name": "stdout", "text": "after the clear\n"})
    obs = third.done()
    assert [o.get("updated") for o in obs.outputs] == [True, None]
    assert obs.text() == "[display abc from 2 calls ago is now:]\n'third'\nafter the clear"


@pytest.mark.asyncio
async def test_hostile_widget_messages_are_bounded_and_never_raise():
    c = Collector(Budget(), 1)
    for content in ({}, {"comm_id": 5}, {"comm_id": "x", "data": "no"}, {"comm_id": "x", "data": {"state": []}},
                    {"comm_id": "y" * 10_000, "target_name": "jupyter.widget", "data": {"state": {"value": float("nan")}}},
                    {"comm_id": "z", "data": {"method": "update", "state": {"value": 1}}}):
        await c.feed("comm_open", content)
        await c.feed("comm_msg", content)
    await opened(c, "big", "Text", value="v" * 1_000_000, description="d")  # over the state kept: the value goes
    await opened(c, "deep", "VBox", children=[f"IPY_MODEL_deep{i}" for i in range(1)])
    for i in range(20):
        await opened(c, f"deep{i}", "VBox", children=[f"IPY_MODEL_deep{i + 1}"])
    await shown(c, "big")
    await shown(c, "deep")
    text = c.done().text()
    assert text.startswith("[Text widget] d\n[VBox widget]") and len(text) < 2_000
    for i in range(3000):
        await opened(c, f"many{i}", "IntSlider", value=i)
    assert len(c.notebook.widgets.states) <= 2000
