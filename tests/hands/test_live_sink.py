"""The hands' live output sink against hostile kernel output: whatever a kernel publishes, the sink hears
(kind, text) with valid Unicode, a sink that raises never breaks the call, and the observation is the same
with a sink or without."""

from __future__ import annotations

import pytest
import pytest_asyncio

from workbench.hands.factory import HandsFactory

# Kernel-side: publish raw messages on iopub with the kernel's own session and socket (as kernel code can).
RAW = r'''
_k = get_ipython().kernel
_s = _k.session
def raw(msg_type, content):
    parts = [_s.pack(_s.msg_header(msg_type)), _s.pack(_k.get_parent()["header"]), b"{}",
             content if isinstance(content, bytes) else _s.pack(content)]
    _k.iopub_socket.send_multipart([b"<IDS|MSG>", _s.sign(parts), *parts])
'''

HOSTILE = r'''
print('before', flush=True)
raw('stream', b'{"name": "stdout", "text": "a\\ud800b"}')
raw('stream', {'name': 'stdout', 'text': 5})
raw('stream', {'name': ['x'], 'text': 'odd name\n'})
raw('display_data', {'data': [1, 2]})
raw('display_data', {'data': {('k' * 500): 'v', '<script>alert(1)</script>': 'x'}})
raw('execute_result', {'data': {'text/plain': 'r' * 100_000}})
raw('error', {'ename': None, 'evalue': {'deep': [1]}, 'traceback': 'x'})
raw('clear_output', {'wait': True})
raw('update_display_data', {'data': {'text/plain': 'u'}, 'transient': {'display_id': 'd'}})
print('after', flush=True)
'''


@pytest_asyncio.fixture
async def hands(settings):
    settings.pool_size = 0
    async with HandsFactory(settings) as factory:
        h = factory("live-sink", {"hands": {"timeout": 60}}, None)
        assert (await h.execute(RAW + "'ready'")).result == "'ready'"
        yield h


@pytest.mark.asyncio
async def test_hostile_messages_reach_the_sink_as_short_valid_text(hands):
    heard: list[tuple[str, str]] = []
    obs = await hands.execute(HOSTILE, on_output=lambda kind, text: heard.append((kind, text)))
    # the observation is what a notebook shows: the clear_output(wait=True) took everything before 'after'
    assert obs.stdout == "after\n", obs.stdout
    assert all(kind in ("stdout", "stderr", "note") and isinstance(text, str) for kind, text in heard)
    for _, text in heard:
        text.encode("utf-8")  # no lone surrogate: every watcher can send or print it
    joined = "".join(t for _, t in heard)
    assert "before\n" in joined and "a\ufffdb" in joined and "odd name\n" in joined and "after\n" in joined
    assert "[display: ?]" in joined and "[output cleared]" in joined and "[display updated: text/plain]" in joined
    assert all(len(t) <= 600 for k, t in heard if k == "note"), "a note is short whatever the message held"
    assert "[error] None: {'deep': [1]}" in joined
    plain = await hands.execute(HOSTILE)
    assert plain.to_json() | {"duration_ms": 0} == obs.to_json() | {"duration_ms": 0}, "a sink changes nothing the model reads"


@pytest.mark.asyncio
async def test_a_sink_that_raises_does_not_break_the_call(hands):
    def broken(kind: str, text: str) -> None:
        raise RuntimeError("a watcher's bug")

    obs = await hands.execute("print('still runs')\n6 * 7", on_output=broken)
    assert obs.ok and obs.stdout == "still runs\n" and obs.result == "42"
