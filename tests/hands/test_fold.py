"""Folding outputs as JupyterLab does, and rendering them for the model: pure functions, hostile input included."""

from __future__ import annotations

import base64
import io
import random
import re

import pytest
from PIL import Image

from workbench.hands import Observation
from workbench.hands.observing.fold import Fold, overwrite
from workbench.hands.observing.images import svg_png
from workbench.hands.observing.render import blocks, html_text


def texts(fold: Fold) -> list[str]:
    return [o.get("text") or str(o.get("data")) for o in fold.outputs()]


def png_b64(size=(8, 4)) -> str:
    b = io.BytesIO()
    Image.new("RGB", size, "red").save(b, "PNG")
    return base64.b64encode(b.getvalue()).decode()


def test_carriage_returns_and_backspaces_leave_what_a_terminal_shows():
    assert overwrite("10%\r20%\r100%\n") == "100%\n"
    assert overwrite("abc\rX") == "Xbc"
    assert overwrite("abc\b\bZ") == "aZ"
    assert overwrite("line\r\nnext") == "line\nnext"
    f = Fold(1000, 20, 10**6)
    for i in range(500):  # a progress bar written piece by piece
        f.stream("stderr", f"\r{i:3d}%")
    f.stream("stderr", "\n")
    assert texts(f) == ["499%\n"]


def test_the_cursor_column_is_kept_across_stream_messages():
    """A carriage return's cursor stays where it is when the message ends: the next message writes from there, as
    JupyterLab shows `["\\r 3\\r 4\\r ", "5"]` (` 5`, not ` 45`)."""
    f = Fold(1000, 20, 10**6)
    f.stream("stdout", "\r 3\r 4\r ")
    f.stream("stdout", "5")
    assert texts(f) == [" 5"]
    f = Fold(1000, 20, 10**6)
    for piece in ("abc\r", "X", "\rYZ", "\x08", "!\n", "done"):
        f.stream("stdout", piece)
    assert texts(f) == [overwrite("abc\rX\rYZ\x08!\ndone")] == ["Y!\ndone"]
    # a message split anywhere reads as the whole text does
    text = "".join(f"\r{i:4d}%|{'#' * (i // 10)}" + ("\x08" * (i % 3)) + ("\n" if i % 37 == 0 else "") for i in range(300))
    for size in (1, 2, 7, 64):
        f = Fold(100_000, 20, 10**7)
        for k in range(0, len(text), size):
            f.stream("stderr", text[k:k + size])
        assert texts(f) == [overwrite(text)], size


def test_clear_output_now_and_on_the_next_output():
    f = Fold(1000, 20, 10**6)
    f.stream("stdout", "gone")
    f.clear(wait=False)
    f.stream("stdout", "kept")
    assert texts(f) == ["kept"]
    for i in range(100):
        f.clear(wait=True)
        f.stream("stdout", f"step {i}\n")
    assert texts(f) == ["step 99\n"]
    f.clear(wait=True)  # pending: nothing came after it, so what was there stays
    assert texts(f) == ["step 99\n"]


def test_updates_replace_every_display_with_the_id_and_streams_keep_their_order():
    f = Fold(1000, 20, 10**6)
    f.stream("stdout", "before\n")
    f.rich("display_data", {"text/plain": "a"}, "d1")
    f.stream("stdout", "after\n")
    f.rich("display_data", {"text/plain": "b"}, "d1")
    assert f.update("d1", {"text/plain": "new"})
    assert not f.update("unknown", {"text/plain": "x"})
    assert [o["output_type"] for o in f.outputs()] == ["stream", "display_data", "stream", "display_data"]
    assert [o["data"] for o in f.outputs() if "data" in o] == [{"text/plain": "new"}] * 2


def test_a_new_display_with_a_shown_id_updates_the_earlier_ones_and_clears_are_remembered():
    f = Fold(1000, 20, 10**6)
    f.rich("display_data", {"text/plain": "p"}, "same")
    f.rich("display_data", {"text/plain": "q"}, "other")
    f.rich("display_data", {"text/plain": "r"}, "same")
    assert [o["data"]["text/plain"] for o in f.outputs()] == ["r", "q", "r"]
    f.clear(wait=False)
    assert f.outputs() == [] and f.cleared_ids == {"same", "other"}
    # a display an earlier call showed, shown here as updated, is not this call's to clear from the notebook
    f.rich("display_data", {"text/plain": "u"}, "earlier", {"updated": True})
    f.clear(wait=False)
    assert "earlier" not in f.cleared_ids


@pytest.mark.asyncio
async def test_an_update_reaches_only_a_display_still_shown():
    """A later call's update of a display an earlier call cleared is shown nowhere, as in a notebook; one of a
    display still shown reads as an updated display; a new kernel starts with none shown."""
    from workbench.hands.observing.collect import Budget, Collector, Notebook

    shown = Notebook()
    first = Collector(Budget(), 1, shown)
    await first.feed("display_data", {"data": {"text/plain": "'kept'"}, "transient": {"display_id": "k"}})
    await first.feed("display_data", {"data": {"text/plain": "'gone'"}, "transient": {"display_id": "g"}})
    await first.feed("clear_output", {"wait": True})
    await first.feed("display_data", {"data": {"text/plain": "'kept'"}, "transient": {"display_id": "k"}})
    first.done()
    assert set(shown.displays) == {"k"}
    second = Collector(Budget(), 1, shown)
    for display_id in ("k", "g", "never"):
        await second.feed("update_display_data", {"data": {"text/plain": f"'{display_id} 2'"},
                                                  "transient": {"display_id": display_id}})
    outs = second.done().outputs
    assert [(o["data"]["text/plain"], o.get("updated")) for o in outs] == [("'k 2'", True)]


@pytest.mark.asyncio
async def test_every_cut_is_reported_to_the_model():
    """Text over output_limit in a display, a result or an error is cut with a note in `truncated`, which the
    model reads, as a stream's cut is."""
    from workbench.hands.observing.collect import Budget, Collector

    c = Collector(Budget(output_limit=100), 1)
    await c.feed("display_data", {"data": {"text/html": "<p>" + "h" * 500 + "</p>"}})
    await c.feed("execute_result", {"data": {"text/plain": "r" * 300}, "execution_count": 1})
    await c.feed("error", {"ename": "E", "evalue": "v" * 200, "traceback": [f"frame {i}" for i in range(80)]})
    obs = c.done()
    notes = "\n".join(obs.truncated)
    assert "the text/html of a display truncated: showed its first 100 of 507 characters" in notes, notes
    assert "the text/plain of a result truncated: showed its first 100 of 300 characters" in notes, notes
    assert "the error's value truncated: showed its first 100 of 200 characters" in notes, notes
    assert "the traceback truncated: showed its last 50 of 80 lines" in notes, notes
    obs.text_limit = None  # the model's budget of 100 characters would cut the notes themselves
    assert all(n in obs.text() for n in obs.truncated)


def test_a_long_stream_keeps_its_head_and_its_tail():
    f = Fold(100, 20, 10**6)
    f.stream("stdout", "".join(f"{i}\n" for i in range(10_000)))
    (out,) = f.outputs()
    assert out["text"].startswith("0\n1\n2\n") and out["text"].endswith("9998\n9999\n")
    assert "characters of stdout cut here" in out["text"] and len(out["text"]) < 200
    assert "cut 48,790 in between" in f.notes()[0]
    # interleaved streams: bounded however many pieces come
    f = Fold(100, 20, 10**6)
    for i in range(20_000):
        f.stream("stdout" if i % 2 else "stderr", f"{i}\n")
    assert sum(len(o["text"]) for o in f.outputs()) < 2_000 and f.outputs()[-1]["text"].endswith("19999\n")


def test_output_widget_captures_are_cleared_on_their_own():
    f = Fold(1000, 20, 10**6)
    f.stream("stdout", "cell\n")
    f.capture("w1", True)
    f.stream("stdout", "in widget\n")
    f.clear(wait=False)
    f.stream("stdout", "again\n")
    f.capture("w1", False)
    assert texts(f) == ["cell\n", "again\n"]
    f.clear(wait=False)
    assert texts(f) == ["again\n"]  # the widget's, not the cell's


def test_displays_over_the_budget_are_counted_not_kept():
    f = Fold(1000, 3, 200)
    for i in range(10):
        f.rich("display_data", {"text/plain": f"d{i}"})
    assert len(f.outputs()) == 3 and f.over_count == {"display_data": 7}
    f.rich("execute_result", {"text/plain": "x" * 500})
    assert f.over_bytes == 1


def test_blocks_put_images_in_place_and_rich_text_as_text():
    png = png_b64()
    outputs = [
        {"output_type": "stream", "name": "stdout", "text": "\x1b[31mred\x1b[0m\n"},
        {"output_type": "display_data", "data": {"text/plain": "<Figure size 640x480 with 1 Axes>", "image/png": png}},
        {"output_type": "execute_result", "data": {"text/plain": "1"}},
        {"output_type": "execute_result", "data": {"text/plain": "2"}},
        {"output_type": "display_data", "data": {"text/plain": "<IPython.core.display.Markdown object>",
                                                 "text/markdown": "**bold**"}},
        {"output_type": "display_data", "data": {"text/plain": "<IPython.core.display.HTML object>",
                                                 "text/html": "<p>hi</p><script>x()</script><table><tr><th>a</th><th>bb</th></tr>"
                                                              "<tr><td>1</td><td>2</td></tr></table>"}},
        {"output_type": "display_data", "data": {"text/plain": "IntSlider(value=3)",
                                                 "application/vnd.jupyter.widget-view+json": {"model_id": "m"}}},
        {"output_type": "set_next_input", "text": "x = 1"},
        {"output_type": "error", "ename": "E", "evalue": "v", "traceback": ["\x1b[0;31mE\x1b[0m: v"]},
    ]
    got = blocks(outputs, ["[note before]"], ["[note after]"])
    assert [b["type"] for b in got] == ["text", "image", "text"]
    assert got[0]["text"] == "[note before]\nred"
    assert got[1]["source"] == {"type": "base64", "media_type": "image/png", "data": png}
    assert got[2]["text"] == ("1\n2\n**bold**\nhi\n\na  bb\n1  2\nIntSlider(value=3)\n"
                              "[the kernel proposes this as the next input]\nx = 1\nE: v\n[note after]")
    assert blocks([], [], []) == [{"type": "text", "text": "(no output)"}]


def test_what_the_model_reads_of_a_call_is_one_text_budget_and_an_image_count():
    png = png_b64()
    outputs = [{"output_type": "stream", "name": "stdout", "text": "first line\n" + "o" * 30_000},
               *({"output_type": "display_data", "data": {"text/plain": f"plain {i}", "text/html": f"<b>t{i}</b>" + "h" * 3000}}
                 for i in range(500)),
               *({"output_type": "display_data", "data": {"image/png": png}} for _ in range(50)),
               {"output_type": "execute_result", "data": {"text/plain": "r" * 20_000 + " the end"}}]
    notes = ["[stdout truncated: ...]", "[480 more display(s) were dropped ...]"]
    got = blocks(outputs, ["[replayed 2 calls]"], notes, 20_000, 20)
    texts = [b["text"] for b in got if b["type"] == "text"]
    assert sum(map(len, texts)) <= 20_000
    assert [b["type"] for b in got].count("image") == 20
    shown = "\n".join(texts)
    assert shown.startswith("[replayed 2 calls]\nfirst line\nooo") and "r the end\n[stdout truncated: ...]" in shown
    assert "[30 more image(s) not shown: the model is shown at most 20 images of a call (max_images)" in shown
    (cut,) = re.findall(r"\[\.\.\. ([0-9,]+) characters cut here: the model reads at most output_limit", shown)
    everything = "\n".join(b["text"] for b in blocks(outputs, ["[replayed 2 calls]"], notes) if b["type"] == "text")
    assert abs(int(cut.replace(",", "")) - (len(everything) - len(shown))) < 500  # what was not shown, give or take the notes
    # a stream cut already: the count says what both cuts left out
    stream = [{"output_type": "stream", "name": "stdout", "text": "y" * 10_000 + "\n[... 80,001 characters of stdout cut here ...]\n" + "y" * 10_000}]
    text = blocks(stream, [], ["[stdout truncated: showed its first 10,000 and last 10,000 characters]"], 20_000)[0]["text"]
    (n,) = re.findall(r"\[\.\.\. ([0-9,]+) characters cut here", text)
    assert len(text) <= 20_000 and int(n.replace(",", "")) > 80_001


@pytest.mark.parametrize("seed", range(5))
def test_any_outputs_and_notes_fit_any_text_budget(seed):
    rng = random.Random(seed)
    for _ in range(300):
        outputs = [{"output_type": "stream", "name": "stdout", "text": "".join(rng.choice("ab \n") for _ in range(rng.randint(0, 400)))}
                   if rng.random() < 0.8 else {"output_type": "display_data", "data": {"image/png": png_b64()}}
                   for _ in range(rng.randint(0, 9))]
        before, after = ["[b]" * rng.randint(0, 50)] * rng.randint(0, 3), ["[a]" * rng.randint(0, 50)] * rng.randint(0, 3)
        limit, most = rng.randint(1, 2500), rng.randint(0, 4)
        got = blocks(outputs, before, after, limit, most)
        assert sum(len(b["text"]) for b in got if b["type"] == "text") <= max(limit, len("(no output)")), (limit, got)
        assert [b["type"] for b in got].count("image") <= most


def test_html_text_survives_broken_and_hostile_markup():
    assert html_text("<table><tr><td>1<td>2</table>") == "1  2"
    assert "alert" not in html_text("<b>x</b><script>alert(1)</script><style>p{}</style>")
    assert html_text("<div>" * 5000 + "deep" + "</div>" * 5000) == "deep"
    assert html_text("<<<>>> &amp; &bogus; \x00") .startswith("<<<>>> &")


def test_svg_becomes_a_bounded_png_and_a_bad_one_a_note():
    data, note = svg_png('<svg xmlns="http://www.w3.org/2000/svg" width="40" height="20"><rect width="40" height="20"/></svg>', 10**6)
    assert note is None and Image.open(io.BytesIO(base64.b64decode(data))).size == (40, 20)
    data, note = svg_png('<svg xmlns="http://www.w3.org/2000/svg" width="90000" height="30000"><rect width="9" height="9"/></svg>',
                         10**6)
    assert max(Image.open(io.BytesIO(base64.b64decode(data))).size) <= 2000
    for bad in ("not svg", '<svg xmlns="http://www.w3.org/2000/svg" width="9" height="9"><image href="file:///etc/passwd"/></svg>',
                "<svg" * 10_000):
        data, note = svg_png(bad, 10**6)
        assert data is None and note and "could not be rendered" in note


def test_an_observation_stored_before_outputs_reads_as_before():
    old = {"stdout": "out\n", "stderr": "", "result": "3", "displays": [{"image/png": png_b64()}], "error": None,
           "truncated": [], "generation": 1, "duration_ms": 1.0, "notes": []}
    obs = Observation.from_json(old)
    assert [o["output_type"] for o in obs.outputs] == ["stream", "display_data", "execute_result"]
    assert [b["type"] for b in obs.content_blocks()] == ["text", "image", "text"]
    assert Observation.from_json(obs.to_json()).to_json() == obs.to_json()


@pytest.mark.parametrize("seed", range(3))
def test_a_stored_observation_reads_back_as_the_model_read_it(seed):
    """Stored once (its outputs, notes and budget, not its text by kind), an observation gives the same blocks and the
    same stdout, stderr and result when it is read back, whatever it holds."""
    import orjson

    from workbench.hands.observing.observation import text_by_kind

    rng = random.Random(seed)
    kinds = [lambda: {"output_type": "stream", "name": rng.choice(["stdout", "stderr"]), "text": "x\r y\n" * rng.randint(0, 50)},
             lambda: {"output_type": "display_data", "data": {"image/png": png_b64()}},
             lambda: {"output_type": "execute_result", "data": {"text/plain": "r" * rng.randint(1, 300)}, "execution_count": 1},
             lambda: {"output_type": "display_data", "data": {"text/plain": "<x>", "text/html": "<p>ü</p>" * rng.randint(1, 90)}},
             lambda: {"output_type": "error", "ename": "E", "evalue": "v", "traceback": ["\x1b[31mE\x1b[0m"]}]
    for _ in range(200):
        outputs = [rng.choice(kinds)() for _ in range(rng.randint(0, 8))]
        obs = Observation(outputs=outputs, notes=["[n]"] * rng.randint(0, 2), truncated=["[t]"] * rng.randint(0, 2),
                          text_limit=rng.choice([None, rng.randint(1, 3000)]), max_images=rng.choice([None, rng.randint(0, 3)]),
                          error=rng.choice([None, {"ename": "KernelDied", "evalue": "gone", "traceback": []}]))
        obs.stdout, obs.stderr, obs.result = text_by_kind(outputs)
        stored = orjson.loads(orjson.dumps(obs.to_json()))
        assert not {"stdout", "stderr", "result"} & set(stored)
        back = Observation.from_json(stored)
        assert back.content_blocks() == obs.content_blocks()
        assert (back.stdout, back.stderr, back.result) == (obs.stdout, obs.stderr, obs.result)
    # a failure that kept only the text of what ran (no outputs) keeps it
    died = Observation(stdout="partial\n", error={"ename": "KernelDied", "evalue": "gone", "traceback": []})
    assert Observation.from_json(died.to_json()).content_blocks() == died.content_blocks()
