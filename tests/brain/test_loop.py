"""The brain loop against the fake Messages API, driven through the real SDK, with real kernels."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from workbench.brain import Brain, BrainSettings, build_request
from workbench.hands import Observation
from workbench.render import result_blocks
from workbench.testing import Reply

MODEL = "claude-opus-5-5"


def canon(x) -> str:
    return json.dumps(x, sort_keys=True)


def types(log, sid):
    return [e.type for e in log.events(sid)]


@pytest.mark.asyncio
async def test_multi_turn_tool_use_with_thinking_reaches_end_turn_verbatim(api, brain, log):
    api.use(
        [
            Reply(thinking="I should compute this in the kernel.", text="Computing.", code=["x = 6 * 7\nprint(x)"]),
            Reply(thinking="", redacted=True, code=["print(x + 1)", "import sys; print(sys.version_info[0])"]),
            Reply(thinking="", text="x is 42."),
            # second user turn
            Reply(thinking="They want the square.", code=["print(x ** 2)"]),
            Reply(thinking="", text="1764."),
        ]
    )
    sid = brain.create_session(model=MODEL, title="verbatim")["id"]
    assert await brain.run_turn(sid, "What is 6 times 7?") == "end_turn"
    assert await brain.run_turn(sid, "And its square?") == "end_turn"

    assert api.rejections == []
    assert len(api.requests) == 5
    first = api.requests[0]
    stored = [e.payload["message"]["content"] for e in log.events(sid, types=["assistant_turn"])]
    for n, req in enumerate(api.requests):
        # system prompt and tools never change, thinking config is sent every time
        assert req["system"] == first["system"] and req["tools"] == first["tools"]
        assert req["thinking"] == {"type": "adaptive"}
        # messages only ever grow: each request extends the previous one
        if n:
            prev = api.requests[n - 1]["messages"]
            assert canon(req["messages"][: len(prev)]) == canon(prev)
        # every earlier assistant turn is exactly what the log stored, which is what the API sent
        sent = [m["content"] for m in req["messages"] if m["role"] == "assistant"]
        assert [canon(c) for c in sent] == [canon(c) for c in stored[: len(sent)]]
    # thinking blocks with and without text, signed, and a redacted block, all stored
    blocks = [b for content in stored for b in content]
    assert any(b["type"] == "thinking" and b["thinking"] == "" and b["signature"] for b in blocks)
    assert any(b["type"] == "thinking" and b["thinking"] and b["signature"] for b in blocks)
    assert any(b["type"] == "redacted_thinking" for b in blocks)
    # the tool results the model saw came from the real kernel
    results = [e.payload for e in log.events(sid, types=["tool_result"])]
    assert [result_blocks(r)[0]["text"] for r in results] == ["42", "43", "3", "1764"]
    # the request the brain would build now equals the last request plus the final answer
    assert len(build_request(log.events(sid))["messages"]) == len(api.requests[-1]["messages"]) + 1
    # usage and latency of every model call were recorded
    for e in log.events(sid, types=["assistant_turn"]):
        assert e.payload["usage"]["output_tokens"] > 0 and e.payload["latency_ms"] >= e.payload["ttft_ms"] >= 0


@pytest.mark.asyncio
async def test_fake_api_rejects_an_altered_assistant_turn(api, brain, log):
    api.use([Reply(thinking="secret plan", code=["print(1)"]), Reply(text="done")])
    sid = brain.create_session(model=MODEL)["id"]
    assert await brain.run_turn(sid, "go") == "end_turn"
    req = json.loads(json.dumps(api.requests[-1]))
    req["messages"][1]["content"][0]["thinking"] = "a different plan"
    assert "signature" in api.check(req)
    req = json.loads(json.dumps(api.requests[-1]))
    req["system"] = "a new system prompt"
    assert "different conversation" in api.check(req)
    req = json.loads(json.dumps(api.requests[-1]))
    req["messages"][1]["content"][1]["input"]["code"] = "print(2)"
    assert "cannot be modified" in api.check(req)


@pytest.mark.asyncio
async def test_retries_are_recorded_and_then_succeed(api, brain, log):
    api.use([Reply(text="hello")])
    api.fail_next(529, times=2)
    api.fail_next(200, times=1, error_type="overloaded_error", midstream=True)
    api.fail_next(429, times=1)
    sid = brain.create_session(model=MODEL)["id"]
    assert await brain.run_turn(sid, "hi") == "end_turn"
    retries = [e.payload for e in log.events(sid, types=["model_retry"])]
    assert [r["attempt"] for r in retries] == [1, 2, 3, 4]
    assert [r["status"] for r in retries][:2] == [529, 529] and retries[3]["status"] == 429
    assert len(log.events(sid, types=["model_request"])) == 5
    assert len(log.events(sid, types=["assistant_turn"])) == 1  # the cut-off stream was not recorded as a turn


@pytest.mark.asyncio
async def test_fatal_and_exhausted_errors_end_the_turn(api, log, hands):
    brain = Brain(log, hands_factory=hands, settings=BrainSettings(retry_base=0.01, max_retries=1))
    try:
        sid = brain.create_session(model=MODEL)["id"]
        api.fail_next(400, times=1)
        assert await brain.run_turn(sid, "hi") == "error"
        api.fail_next(503, times=2)
        assert await brain.run_turn(sid, "again") == "error"
        errors = [e.payload for e in log.events(sid, types=["model_error"])]
        assert errors[0]["status"] == 400 and errors[1]["attempts"] == 2
        assert types(log, sid)[-1] == "turn_ended"
        # the session is still usable
        api.use([Reply(text="fine now")])
        assert await brain.run_turn(sid, "third") == "end_turn"
    finally:
        await brain.close()


@pytest.mark.asyncio
async def test_stop_reasons(api, log, hands):
    brain = Brain(log, hands_factory=hands, settings=BrainSettings(max_pauses=2))
    try:
        # max_tokens with a cut-off tool call: the call is answered "not run", the turn stops
        api.use([Reply(text="partial", code=["print(1)"], stop_reason="max_tokens")])
        sid = brain.create_session(model=MODEL)["id"]
        assert await brain.run_turn(sid, "go") == "max_tokens"
        res = log.events(sid, types=["tool_result"])[0].payload
        assert res["is_error"] and "not run" in res["content"][0]["text"]
        assert not log.events(sid, types=["tool_started"])

        # pause_turn is sent again as-is, and bounded
        api.use(lambda req: Reply(text="thinking a while", stop_reason="pause_turn"))
        sid = brain.create_session(model=MODEL)["id"]
        n0 = len(api.requests)
        assert await brain.run_turn(sid, "long task") == "pause_turn"
        assert len(api.requests) - n0 == 3  # the first call plus max_pauses=2
        r1, r2 = api.requests[n0], api.requests[n0 + 1]
        assert r2["messages"][: len(r1["messages"])] == r1["messages"] and r2["messages"][-1]["role"] == "assistant"

        # refusal is recorded and stops; it is not sent back on the next turn
        refuse = Reply(stop_reason="refusal", stop_details={"type": "refusal", "category": None})
        api.use(lambda req: refuse if "refused" in json.dumps(req["messages"][-1]) else Reply(text="ok"))
        sid = brain.create_session(model=MODEL)["id"]
        assert await brain.run_turn(sid, "something refused") == "refusal"
        assert log.events(sid, types=["assistant_turn"])[0].payload["message"]["stop_reason"] == "refusal"
        assert await brain.run_turn(sid, "something else") == "end_turn"
        assert [m["role"] for m in api.requests[-1]["messages"]] == ["user", "user"]  # the API joins them
        assert api.rejections == []
    finally:
        await brain.close()


@pytest.mark.asyncio
async def test_kernel_never_sees_the_api_key(api, brain, log):
    api.use(
        [
            Reply(code=["import os\nprint(sorted(k for k in os.environ if 'KEY' in k or 'ANTHROPIC' in k))\n"
                        "print('sk-test' in open('/proc/self/environ').read())"]),
            Reply(text="checked"),
        ]
    )
    sid = brain.create_session(model=MODEL)["id"]
    assert await brain.run_turn(sid, "look for secrets") == "end_turn"
    out = Observation.from_json(log.events(sid, types=["tool_result"])[0].payload["observation"]).stdout
    assert out.splitlines() == ["[]", "False"]


@pytest.mark.asyncio
async def test_images_and_big_outputs(api, brain, log):
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    api.use(
        [
            Reply(code=[f"from IPython.display import display\ndisplay({{'image/png': '{png}'}}, raw=True)", "print('y' * 100_000)"]),
            Reply(text="seen"),
        ]
    )
    sid = brain.create_session(model=MODEL)["id"]
    assert await brain.run_turn(sid, "show me") == "end_turn"
    results = api.requests[-1]["messages"][-1]["content"]
    (image,) = results[0]["content"]  # a display of an image alone: the image, nothing else
    assert image == {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
    big = results[1]["content"][0]["text"]
    # within output_limit in all, its note included: the stream's own cut is cut a little wider, and counted
    assert len(big) <= 20_000 and "stdout truncated" in big and "cut 80,001 in between" in big, big[-500:]
    head, cut, tail = re.fullmatch(r"(y+)\n\[\.\.\. ([0-9,]+) characters cut here: [^\]]*\]\n(y+)\n\[stdout truncated.*", big, re.S).groups()
    assert len(head) > 9_000 and len(tail) > 9_000 and len(head) + len(tail) + int(cut.replace(",", "")) > 100_000


@pytest.mark.asyncio
async def test_interrupt_records_and_the_session_goes_on(api, brain, log):
    api.use([Reply(code=["import time\nfor i in range(600): time.sleep(0.1)"]), Reply(text="after"), Reply(text="next turn")])
    sid = brain.create_session(model=MODEL)["id"]
    task = asyncio.create_task(brain.run_turn(sid, "sleep"))
    while "tool_started" not in types(log, sid) or (await brain.hands(sid)).status()["state"] != "busy":
        await asyncio.sleep(0.05)
    assert await brain.interrupt(sid)
    with pytest.raises(asyncio.CancelledError):  # the caller waiting for the turn sees it end interrupted
        await task
    t = types(log, sid)
    assert t[-3:] == ["interrupted", "tool_result", "turn_ended"]
    assert log.events(sid)[-1].payload["stop_reason"] == "interrupted"
    assert log.events(sid, types=["tool_result"])[0].payload["is_error"]
    # the kernel survived the interrupt and the conversation continues, accepted by the API
    assert (await brain.hands(sid)).status()["state"] == "idle"
    assert await brain.run_turn(sid, "continue") == "end_turn"
    assert api.rejections == []


@pytest.mark.asyncio
async def test_redaction_reaches_every_string_of_a_result(api, log, hands):
    secret = "s3cr3t-value-123"
    brain = Brain(log, hands_factory=hands, redact=lambda text: text.replace(secret, "[secret demo]"))
    try:
        api.use(
            [
                Reply(code=[f"print('{secret}')", f"raise ValueError('{secret}')", f"'{secret}'"]),
                Reply(text="done"),
            ]
        )
        sid = brain.create_session(model=MODEL)["id"]
        assert await brain.run_turn(sid, "leak it") == "end_turn"
        results = log.events(sid, types=["tool_result"])
        assert len(results) == 3
        for e in results:
            assert secret not in json.dumps(e.payload) and "[secret demo]" in json.dumps(e.payload)
        # what went back to the model as tool results is masked too (its own tool_use input is its own text)
        assert secret not in json.dumps(api.requests[-1]["messages"][-1])
    finally:
        await brain.close()
