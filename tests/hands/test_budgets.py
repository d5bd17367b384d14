"""Hostile kernel output: malformed messages, huge and many displays, huge and false images, lone surrogates.

Kernel code holds the kernel's session key and its iopub socket, so it can publish anything there, signed or
not. Whatever it sends, a call ends with an observation (never an exception in the brain) that stays within
the session's budget and that the session log can store: valid UTF-8, strict JSON, well under its size limit.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import zlib

import pytest
import pytest_asyncio

from workbench.brain import Brain
from workbench.brain.models import ScriptedModel
from workbench.brain.models.scripted import Reply
from workbench.hands import Observation
from workbench.hands.factory import HandsFactory, HandsSettings
from workbench.render import result_blocks

MB = 1 << 20

# Kernel-side: publish raw messages on iopub with the kernel's own session and socket.
RAW = r'''
import json as _json
_k = get_ipython().kernel
_s = _k.session
def _parent():
    return _s.pack(_k.get_parent()["header"])
def raw(msg_type="display_data", content=None, header=None, parent=None, parts=None, sign=True, extra=()):
    """Publish one message, each part given as bytes (or built like the kernel would)."""
    if parts is None:
        header = header if header is not None else _s.pack(_s.msg_header(msg_type))
        parent = parent if parent is not None else _parent()
        content = content if isinstance(content, bytes) else _s.pack(content if content is not None else {})
        parts = [header, parent, b"{}", content]
    sig = _s.sign(parts[:4]) if sign else b"0" * 64
    _k.iopub_socket.send_multipart([b"<IDS|MSG>", sig, *parts, *extra])
'''


def png(width: int, height: int, noise: bool = False) -> bytes:
    """A PNG made without Pillow: grey or noisy rows (noise does not compress, so bytes ~ pixels)."""
    import os

    rows = b"".join(b"\x00" + (os.urandom(width) if noise else b"\x80" * width) for _ in range(height))
    return png_chunks(width, height, zlib.compress(rows, 1))


def png_chunks(width: int, height: int, idat: bytes) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def storable(obs: Observation) -> int:
    """Bytes of the observation as the log stores it; fails if it is not strict JSON in valid UTF-8."""
    return len(json.dumps(obs.to_json(), ensure_ascii=False, allow_nan=False).encode("utf-8"))


@pytest_asyncio.fixture
async def hands(settings):
    """Local hands (a real kernel) with a small message limit, the raw publisher defined in the kernel."""
    settings.pool_size, settings.max_message_mb = 0, 1
    async with HandsFactory(settings) as factory:
        h = factory("hostile", {"hands": {"timeout": 60, "max_observation_bytes": 3 * MB, "max_image_bytes": 200_000}},
                    None)
        assert (await h.execute(RAW + "'ready'")).result == "'ready'"
        yield h


MALFORMED = [
    ("no msg_type", "raw(header=_s.pack({'msg_id': 'm1'}))", "type is not a string"),
    ("content not JSON", "raw(content=b'\\xff{not json')", "malformed message"),
    ("content a list", "raw('stream', content=[1, 2])", "content is not an object"),
    ("parent a list", "raw('stream', {'name': 'stdout', 'text': 'x'}, parent=_s.pack([1]))", "parent header is not an object"),
    ("msg_type a number", "raw(header=_s.pack({**_s.msg_header('stream'), 'msg_type': 5}))", "type is not a string"),
    ("forged signature", "raw('stream', {'name': 'stdout', 'text': 'forged'}, sign=False)", "Invalid Signature"),
    ("too few parts", "raw(parts=[b'{}', b'{}'], sign=False)", "at least 5"),
    ("no delimiter", "_k.iopub_socket.send_multipart([b'a', b'b'])", "envelope is unreadable"),
    ("bundle a list", "raw(content={'data': [1, 2], 'metadata': {}})", "not a MIME bundle"),
    ("bundle of numbers", "raw(content={'data': {'text/plain': 5, 'text/html': ['a']}, 'metadata': {}})", "a int, not text"),
    ("image not base64", "raw(content={'data': {'image/png': '!!not base64!!'}, 'metadata': {}})", "is not base64"),
    ("image not an image", "raw(content={'data': {'image/png': 'bm90IGFuIGltYWdl'}, 'metadata': {}})",
     "not an image the hands can read"),
    ("image a number", "raw(content={'data': {'image/png': 7}, 'metadata': {}})", "its data is not a string"),
    ("stream text a number", "raw('stream', {'name': 'stdout', 'text': 5})", "without text"),
    ("error fields", "raw('error', {'ename': 1, 'evalue': None, 'traceback': 'x'})", "error message was malformed"),
    ("result data a list", "raw('execute_result', {'data': [], 'execution_count': 1})", "malformed execute_result"),
    ("JSON with NaN", "raw(content=b'{\"data\": {\"application/json\": {\"x\": NaN}}, \"metadata\": {}}')", "not finite"),
    ("JSON too deep", "raw(content={'data': {'application/json': _json.loads('[' * 60 + ']' * 60)}, 'metadata': {}})",
     "nested deeper"),
    ("dropped note a string", "raw(content={'data': {'application/vnd.workbench.dropped+json': 'lots'}})",
     "malformed note of dropped output"),
]


@pytest.mark.asyncio
async def test_each_malformed_message_is_dropped_with_a_note_and_the_call_ends(hands):
    for name, code, note in MALFORMED:
        obs = await hands.execute(f"print('before')\n{code}\nprint('after')")
        assert obs.stdout == "before\nafter\n" and (obs.ok or name == "error fields"), (name, obs.to_json())
        assert any(note in n for n in obs.truncated), (name, obs.truncated)
        storable(obs)
    # a message of another request (an earlier cell's, say) is none of this call's business: silently left out
    obs = await hands.execute("raw('stream', {'name': 'stdout', 'text': 'stray'}, parent=_s.pack({'msg_id': 'other'}))")
    assert obs.ok and obs.stdout == "" and obs.truncated == []
    assert (await hands.execute("6 * 7")).result == "42"


SURROGATES = r'''
lone = b'"a\\ud800b\\udfff"'
raw('stream', b'{"name": "stdout", "text": ' + lone + b'}')
raw('error', b'{"ename": ' + lone + b', "evalue": ' + lone + b', "traceback": [' + lone + b']}')
raw(content=b'{"data": {"text/plain": ' + lone + b', "text/x-\\ud800": "k", "application/json": {' + lone + b': [' + lone + b']}}, "metadata": {}}')
raw('execute_result', b'{"data": {"text/plain": ' + lone + b'}, "execution_count": 1}')
'''


@pytest.mark.asyncio
async def test_lone_surrogates_become_replacement_characters_everywhere(hands):
    obs = await hands.execute(SURROGATES)
    storable(obs)
    assert obs.stdout == "a\ufffdb\ufffd" and obs.result == "a\ufffdb\ufffd"
    assert obs.error == {"ename": "a\ufffdb\ufffd", "evalue": "a\ufffdb\ufffd", "traceback": ["a\ufffdb\ufffd"]}
    assert obs.displays == [{"text/plain": "a\ufffdb\ufffd", "text/x-\ufffd": "k",
                             "application/json": {"a\ufffdb\ufffd": ["a\ufffdb\ufffd"]}}]
    assert "\ufffd" in obs.text()


@pytest.mark.asyncio
async def test_many_and_huge_displays_stay_within_the_budget(hands):
    obs = await hands.execute("from IPython.display import display\nfor i in range(100): display({'text/plain': f'd{i}'}, raw=True)")
    assert [d["text/plain"] for d in obs.displays] == [f"d{i}" for i in range(20)]
    assert "80 more display(s) were dropped: a call keeps at most 20 (max_displays)" in obs.truncated[0]
    # text parts of a display are cut at output_limit; JSON over it is dropped
    obs = await hands.execute("display({'text/html': 'h' * 300_000, 'application/json': {'k': 'v' * 300_000}}, raw=True)")
    assert len(obs.displays[0]["text/html"]) < 21_000 and "text/html truncated at 20,000 characters" in obs.displays[0]["text/html"]
    assert "application/json" not in obs.displays[0] and any("over output_limit" in n for n in obs.truncated)
    # images up to max_image_bytes each, until the observation would be over max_observation_bytes (3 MiB here)
    noise = base64.b64encode(png(400, 400, noise=True)).decode()  # ~160 KB, kept as is
    obs = await hands.execute(f"for _ in range(19): display({{'image/png': {noise!r}}}, raw=True)\nprint('x' * 10)")
    assert obs.ok and obs.stdout == "x" * 10 + "\n"
    assert 10 <= len(obs.displays) < 19 and all(d["image/png"] == noise for d in obs.displays)
    assert any("display(s) were dropped: with them the output would have been over 3,145,728 bytes" in n for n in obs.truncated)
    assert storable(obs) <= 3 * MB
    assert len(obs.content_blocks()) == 1 + len(obs.displays)


@pytest.mark.asyncio
async def test_big_wide_and_false_images_are_downscaled_or_dropped_with_a_note(hands):
    from PIL import Image

    cases = {
        "big": png(600, 600, noise=True),  # 360 KB of noise: over max_image_bytes (200,000)
        "wide": png(9000, 4),  # small, but a side over 8000 px, which the model refuses
        "bomb": png_chunks(20000, 20000, zlib.compress(b"\x00" * 100)),  # 400 Mpx claimed in a few bytes
        "many pixels": png_chunks(6000, 6000, zlib.compress(b"\x00" * 100)),  # 36 Mpx: too many to decode here
        "truncated": png(50, 50)[:60],
    }
    notes = {}
    for name, data in cases.items():
        obs = await hands.execute(f"display({{'image/png': {base64.b64encode(data).decode()!r}}}, raw=True)")
        assert obs.ok, (name, obs.to_json())
        storable(obs)
        notes[name] = obs.truncated
        if name in ("big", "wide"):
            (shown,) = obs.displays
            raw = base64.b64decode(shown["image/png"])
            with Image.open(__import__("io").BytesIO(raw)) as im:
                assert im.format == "PNG" and max(im.size) <= 8000
                size = im.size
            assert len(raw) <= 200_000 and f"downscaled to {size[0]:,}×{size[1]:,} px" in obs.truncated[0], obs.truncated
            assert [b["type"] for b in obs.content_blocks()] == ["image", "text"]  # the image in its place, then the note
        else:
            assert obs.displays == [] and [b["type"] for b in obs.content_blocks()] == ["text"], name
    assert "8000 px a side" in notes["wide"][0] and "max_image_bytes (200,000)" in notes["big"][0]
    assert "not an image the hands can read" in notes["bomb"][0] or "too many pixels" in notes["bomb"][0]
    assert "too many pixels to check or downscale" in notes["many pixels"][0] and "not an image" in notes["truncated"][0]
    # a JPEG that says it is a PNG is made the PNG it claims to be: the model refuses a mismatch
    jpeg = "import io, base64\nfrom PIL import Image\nb = io.BytesIO(); Image.new('RGB', (40, 30), 'red').save(b, 'JPEG')\n"
    obs = await hands.execute(jpeg + "display({'image/png': base64.b64encode(b.getvalue()).decode()}, raw=True)")
    assert Image.open(__import__("io").BytesIO(base64.b64decode(obs.displays[0]["image/png"]))).format == "PNG"
    assert "its data was image/jpeg, now image/png as it said" in obs.truncated[0]


@pytest.mark.asyncio
async def test_a_message_over_the_limit_is_refused_unread_and_the_call_ends(hands):
    """Over max_message_mb (1 here): ZMQ refuses the frame and drops the connection; the hands connect again."""
    # (what the kernel sent just before it may be lost as well: ZMQ drops what it had queued from the connection)
    obs = await hands.execute("from IPython.display import display\ndisplay({'text/plain': 'x' * 3_000_000}, raw=True)")
    assert obs.ok and obs.displays == []
    assert any("output was lost" in n and "1,048,576" in n for n in obs.truncated), obs.truncated
    # many parts, each under the limit, together over it: dropped unread too
    obs = await hands.execute("raw('stream', {'name': 'stdout', 'text': 'parts'}, extra=[b'b' * 600_000] * 3)\n'done'")
    assert obs.result == "'done'" and any("dropped unread: 1,8" in n for n in obs.truncated), obs.truncated
    # the output channel works as before
    for _ in range(3):
        obs = await hands.execute("print('again'); 7")
        assert obs.ok and obs.stdout == "again\n" and obs.result == "7" and obs.truncated == []


@pytest.mark.asyncio
async def test_with_the_default_limit_a_40_mb_display_is_refused(settings):
    settings.pool_size = 0
    async with HandsFactory(settings) as factory:
        h = factory("huge", {}, None)
        obs = await h.execute("from IPython.display import display\ndisplay({'image/png': 'A' * 40_000_000}, raw=True)\n"
                              "print('after')")
        assert obs.ok and obs.displays == [] and any("16,777,216 bytes the hands read" in n for n in obs.truncated), obs.truncated
        assert storable(obs) < 10_000
        assert (await h.execute("1 + 1")).result == "2"


@pytest.mark.asyncio
async def test_through_the_brain_hostile_output_is_a_tool_result_the_log_stores(log, settings):
    """Every kind of hostile output in one call: the turn ends normally and the log holds the result."""
    settings.pool_size = 0
    factory = HandsFactory(settings)
    noise = base64.b64encode(png(1200, 1200, noise=True)).decode()  # ~1.4 MB: downscaled to 1 MiB at most
    code = RAW + SURROGATES + "\n".join(code for _, code, _ in MALFORMED) + (
        f"\nfrom IPython.display import display\nfor i in range(30): display({{'image/png': {noise!r}}}, raw=True)\n"
        "print('end')")
    huge = "display({'text/plain': 'x' * 30_000_000}, raw=True)"  # over the 16 MiB the hands read
    model = ScriptedModel([Reply(code=[code, huge]), Reply(code=["print('next call')"]), Reply(text="done")])
    brain = Brain(log, model_factory=lambda name: model, hands_factory=factory)
    sid = brain.create_session(model="scripted")["id"]
    try:
        assert await brain.run_turn(sid, "go") == "end_turn"
    finally:
        await brain.close()
        await factory.close()
    events = log.events(sid)
    assert "turn_failed" not in [e.type for e in events]
    first, lost, last = [e.payload for e in events if e.type == "tool_result"]
    observation = first["observation"]
    assert Observation.from_json(observation).stdout.endswith("end\n")
    assert Observation.from_json(last["observation"]).stdout == "next call\n"
    assert any("output was lost" in n for n in lost["observation"]["truncated"])
    assert 1 <= len([o for o in observation["outputs"] if o["output_type"] == "display_data"]) <= 20
    assert len(json.dumps(first, ensure_ascii=False).encode()) < 2 * 4 * MB + 100_000  # the observation, about twice
    assert len(observation["truncated"]) <= 20


@pytest.mark.asyncio
async def test_whatever_a_call_shows_the_model_reads_within_one_text_budget_and_an_image_count(log, settings):
    """Print, 500 displays of plain text and HTML, 50 images and a long result in one call: the tool result's text is
    within output_limit in all and its images within max_images, with notes on what was left out; the stored outputs
    stay within max_observation_bytes (issue 22: one result of 0.7 MB reached a model with output_limit 20,000)."""
    settings.pool_size = 0
    factory = HandsFactory(settings)
    img = base64.b64encode(png(64, 64, noise=True)).decode()
    code = ("import sys\nfrom IPython.display import display\nprint('start ' + 'o' * 5_000)\nsys.stdout.flush()\n"
            "for i in range(500):\n"
            "    display({'text/plain': f'plain {i} ' + 'p' * 300, 'text/html': f'<b>html {i}</b>' + 'h' * 3000}, raw=True)\n"
            f"for i in range(50):\n    display({{'image/png': {img!r}}}, raw=True)\n"
            "'r' * 5_000 + ' the end'")
    model = ScriptedModel([Reply(code=[code]), Reply(text="done")])
    brain = Brain(log, model_factory=lambda name: model, hands_factory=factory)
    sid = brain.create_session(model="scripted", config={"hands": {"max_displays": 1000}})["id"]
    try:
        assert await brain.run_turn(sid, "go") == "end_turn"
    finally:
        await brain.close()
        await factory.close()
    (result,) = [e.payload for e in log.events(sid) if e.type == "tool_result"]
    outputs = result["observation"]["outputs"]
    assert sum(o["output_type"] == "display_data" for o in outputs) == 550  # the record keeps them all
    assert len(json.dumps(outputs, ensure_ascii=False).encode()) <= 4 * MB  # within max_observation_bytes
    texts = [b["text"] for b in result_blocks(result) if b["type"] == "text"]
    assert sum(map(len, texts)) <= 20_000, sum(map(len, texts))
    assert sum(b["type"] == "image" for b in result_blocks(result)) == 20  # max_images: the first 20
    shown = "\n".join(texts)
    assert shown.startswith("start ooo") and "the end'" in shown  # the first output, and the last
    assert re.search(r"\[\.\.\. [0-9,]+ characters cut here: the model reads at most output_limit", shown)
    assert "[30 more image(s) not shown: the model is shown at most 20 images of a call (max_images)" in shown


GATEWAY_CASES = ["content a list", "parent a list", "bundle a list", "bundle of numbers", "image not base64",
                 "stream text a number", "error fields", "JSON with NaN", "dropped note a string"]


@pytest.mark.asyncio
async def test_over_a_gateway_hostile_output_is_dropped_with_notes_too(gateway, tmp_path):
    """The gateway passes on what the kernel publishes (as JSON): the same checks, and its websocket's size limit."""
    settings = HandsSettings(backend="gateway", pool_size=0, gateway_url=gateway.url, gateway_token=gateway.token,
                             registry_dir=str(tmp_path / "reg"), max_message_mb=1)
    async with HandsFactory(settings) as factory:
        h = factory("hostile-gw", {"hands": {"timeout": 60}}, None)
        assert (await h.execute(RAW + "'ready'")).result == "'ready'"
        for name, code, note in MALFORMED:
            if name not in GATEWAY_CASES:
                continue
            obs = await h.execute(f"print('before')\n{code}\nprint('after')")
            assert obs.stdout == "before\nafter\n" and (obs.ok or name == "error fields"), (name, obs.to_json())
            assert any(note in n for n in obs.truncated), (name, obs.truncated)
            storable(obs)
        obs = await h.execute(SURROGATES)
        assert obs.stdout == "a\ufffdb\ufffd" and storable(obs)
        # over max_message_mb: tornado drops the websocket; the kernel is still there, so the hands connect again
        obs = await h.execute("from IPython.display import display\ndisplay({'text/plain': 'x' * 3_000_000}, raw=True)")
        assert obs.ok and obs.displays == [] and any("output was lost" in n for n in obs.truncated), obs.to_json()
        kernel_id = h.status()["kernel_id"]
        obs = await h.execute("print('still here'); 6 * 7")
        assert obs.stdout == "still here\n" and obs.result == "42" and h.status()["kernel_id"] == kernel_id
