"""Progress output and capped streams through a real kernel: the model reads a stream as a person sees it.

The in-kernel output cap counts what a person would see (a progress bar that rewrites one line
ten thousand times is one line), carriage returns go on where the last message left the cursor,
and the head and the tail of a capped stream stay where they were written.
"""

from __future__ import annotations

import pytest
import pytest_asyncio

from workbench.hands.factory import HandsFactory


@pytest_asyncio.fixture
async def hands(settings):
    """Local hands (a real kernel) with a small output_limit."""
    settings.pool_size = 0
    async with HandsFactory(settings) as factory:
        h = factory("progress", {"hands": {"timeout": 120, "output_limit": 2_000}}, None)
        assert (await h.execute("'ready'")).result == "'ready'"
        yield h


@pytest.mark.asyncio
async def test_a_tqdm_loop_of_ten_thousand_updates_reads_as_its_final_line(hands):
    obs = await hands.execute("from tqdm import tqdm\nfor i in tqdm(range(10_000), mininterval=0, miniters=1, ncols=60,"
                              " bar_format='{l_bar}{bar}| {n_fmt}/{total_fmt}'):\n    pass")
    assert obs.ok and obs.truncated == [], obs.truncated
    (text,) = [b["text"] for b in obs.content_blocks()]
    assert text.startswith("[stderr]\n100%|") and text.endswith("| 10000/10000") and text.count("\n") == 1, text


@pytest.mark.asyncio
async def test_the_cursor_stays_where_a_message_left_it(hands):
    obs = await hands.execute("import sys, time\nsys.stdout.write('\\r 3\\r 4\\r '); sys.stdout.flush(); time.sleep(0.5)\n"
                              "sys.stdout.write('5'); sys.stdout.flush()")
    assert obs.stdout == " 5", repr(obs.stdout)


@pytest.mark.asyncio
async def test_a_capped_stream_keeps_its_head_and_tail_in_their_places(hands):
    """The tail of a capped stream is where it was written, before the result, not after it."""
    obs = await hands.execute("for i in range(3_000):\n    print(f'line {i}')\n'the result'")
    assert [o["output_type"] for o in obs.outputs] == ["stream", "execute_result"], obs.outputs
    text = obs.outputs[0]["text"]
    assert text.startswith("line 0\n") and text.endswith("line 2999\n") and "characters of stdout cut here" in text
    assert any("stdout truncated" in n for n in obs.truncated), obs.truncated
    # a display between: the stream's head before it, its tail (the last of all it wrote) after it
    obs = await hands.execute("from IPython.display import display, Markdown\nfor i in range(3_000):\n    print(f'line {i}')\n"
                              "display(Markdown('**the display**'))\nfor i in range(3_000):\n    print(f'more {i}')\n'the result'")
    kinds = [o["output_type"] for o in obs.outputs]
    assert kinds == ["stream", "display_data", "stream", "execute_result"], kinds
    first, second = obs.outputs[0]["text"], obs.outputs[2]["text"]
    assert first.startswith("line 0\n") and "characters of stdout cut here" in first
    assert second.endswith("more 2999\n") and "line" not in second, second[:300]


@pytest.mark.asyncio
async def test_a_flood_of_overwrites_past_the_raw_cap_still_reads_as_its_last_line(hands):
    """Past what a call may send as written (RAW_FACTOR times output_limit), overwrites of one line are held in the
    kernel, and the line as it ends is sent at the end."""
    obs = await hands.execute("import sys\nfor i in range(100_000):\n    sys.stdout.write(f'\\rstep {i:6d}')\nprint(' done')")
    assert obs.stdout == "step  99999 done\n" and obs.truncated == [], (obs.stdout[-300:], obs.truncated)
