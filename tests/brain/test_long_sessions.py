"""Long sessions through the fake Messages API (real HTTP, the real SDK): a session that passes far more
than the context window keeps going, by server-side compaction or, on an endpoint without it, by clearing
old tool results; thinking and compaction blocks go back verbatim (the fake API refuses anything else)."""

from __future__ import annotations

import json

import pytest
import pytest_asyncio

from workbench.brain import Brain, BrainSettings, Tool, ToolOutput
from workbench.render import result_blocks
from workbench.testing import FakeMessagesAPI, Reply
from workbench.testing.fake_api import count_tokens

pytestmark = pytest.mark.slow

MODEL = "claude-opus-5-5"
WINDOW = 200_000  # the fake API's context window, tokens
TRIGGER = 100_000
RESULT_CHARS = 100_000  # about 25,000 tokens a tool result
CALLS = 5  # tool calls a turn


def canon(x) -> str:
    return json.dumps(x, sort_keys=True)


def script(request) -> Reply:
    """Thinks, then calls `blob` CALLS times in each turn, then answers."""
    msgs = request["messages"]
    opened = max(i for i, m in enumerate(msgs) if m["role"] == "user" and any(b["type"] == "text" for b in m["content"]))
    calls = sum(1 for m in msgs[opened:] if m["role"] == "assistant" for b in m["content"] if b["type"] == "tool_use")
    if calls < CALLS:
        return Reply(thinking=f"call {calls} of this turn", tool_calls=[("blob", {"n": calls})])
    return Reply(thinking="", text=f"done after {calls} calls")


async def blob(inp, ctx) -> ToolOutput:
    line = f"row {inp.get('n')} " + "0123456789abcdef" * 6 + "\n"
    return ToolOutput([{"type": "text", "text": (line * (RESULT_CHARS // len(line) + 1))[:RESULT_CHARS]}])


TOOLS = {"blob": Tool("blob", "returns a large text", {"type": "object", "properties": {"n": {"type": "integer"}}}, blob)}


@pytest.fixture
def endpoint(monkeypatch, request):
    api = FakeMessagesAPI(script, context_window=WINDOW, compaction=request.param).start()
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-a-real-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
    yield api
    api.stop()


@pytest_asyncio.fixture
async def brain(log):
    b = Brain(log, hands_factory=None, tools=TOOLS, settings=BrainSettings(retry_base=0.01, max_retries=0))
    yield b
    await b.close()


async def run_long(api, brain, log, context: str, turns: int) -> tuple[str, int]:
    sid = brain.create_session(model=MODEL, tools=["blob"], config={"context": context, "context_trigger": TRIGGER})["id"]
    passed, biggest = 0, 0
    for t in range(turns):
        assert await brain.run_turn(sid, f"turn {t}: fetch the blobs") == "end_turn", api.rejections
        for req in api.requests:
            biggest = max(biggest, count_tokens(req))
        api.requests.clear()  # what was sent was checked by the fake API as it came; keep memory flat
    passed = sum(len(result_blocks(e.payload)[0]["text"]) for e in log.events(sid, types=["tool_result"])) // 4
    assert not api.rejections
    assert biggest <= WINDOW
    return sid, passed


@pytest.mark.asyncio
@pytest.mark.parametrize("endpoint", [True], indirect=True)
async def test_a_two_million_token_session_keeps_going_by_compaction(endpoint, brain, log):
    api = endpoint
    sid, passed = await run_long(api, brain, log, "compact", turns=17)
    assert passed > 2_000_000  # tool results alone: ten context windows
    assert api.compactions >= 10
    turns = [e.payload["message"] for e in log.events(sid, types=["assistant_turn"])]
    compacted = [m for m in turns if any(b["type"] == "compaction" for b in m["content"])]
    assert len(compacted) == api.compactions
    assert all(m["content"][0]["type"] == "compaction" and m["content"][0]["content"] for m in compacted)
    # the next request sends the latest compaction block and every thinking block after it verbatim
    api.requests.clear()
    assert await brain.run_turn(sid, "one more") == "end_turn"
    sent = [m["content"] for m in api.requests[0]["messages"] if m["role"] == "assistant"]
    last = next(i for i, m in enumerate(turns) if m is compacted[-1])
    stored = [m["content"] for m in turns[last:] if m.get("stop_reason") != "refusal"]
    assert [canon(c) for c in sent[-len(stored):]] == [canon(c) for c in stored]
    assert canon(compacted[-1]["content"]) in {canon(c) for c in sent}
    # and the request stayed small: it starts at the user message that opened the compaction's turn
    assert count_tokens(api.requests[0]) < WINDOW
    assert len(api.requests[0]["messages"]) < 60 < len(log.events(sid, types=["assistant_turn"]))


@pytest.mark.asyncio
@pytest.mark.parametrize("endpoint", [False], indirect=True)
async def test_without_compaction_clearing_old_tool_results_keeps_it_going(endpoint, brain, log):
    api = endpoint
    sid, passed = await run_long(api, brain, log, "clear", turns=17)
    assert passed > 2_000_000
    assert api.compactions == 0
    # thinking blocks were sent back as they came (the fake API checks every one); results were cleared
    api.requests.clear()
    assert await brain.run_turn(sid, "one more") == "end_turn"
    req = api.requests[-1]
    stored = [e.payload["message"]["content"] for e in log.events(sid, types=["assistant_turn"])]
    assert [canon(m["content"]) for m in req["messages"] if m["role"] == "assistant"] == [canon(c) for c in stored[:-1]]
    cleared = [b for m in req["messages"] if m["role"] == "user" for b in m["content"]
               if b["type"] == "tool_result" and isinstance(b["content"], str)]
    assert len(cleared) > 50
    assert "context_management" not in req


@pytest.mark.asyncio
@pytest.mark.parametrize("endpoint", [True], indirect=True)
async def test_with_no_context_management_the_window_is_enforced(endpoint, brain, log):
    sid = brain.create_session(model=MODEL, tools=["blob"], config={"context": "off"})["id"]
    stops = [await brain.run_turn(sid, f"turn {t}") for t in range(3)]
    assert stops[0] == "end_turn" and "error" in stops
    errors = [e.payload["error"] for e in log.events(sid, types=["model_error"])]
    assert errors and "prompt is too long" in errors[0]


@pytest.mark.asyncio
@pytest.mark.parametrize("endpoint", [False], indirect=True)
async def test_compaction_on_an_endpoint_without_it_fails_with_a_clear_error(endpoint, brain, log):
    sid = brain.create_session(model=MODEL, tools=["blob"])["id"]  # the default: compact
    assert await brain.run_turn(sid, "hi") == "error"
    errors = [e.payload["error"] for e in log.events(sid, types=["model_error"])]
    assert "context_management" in errors[0]


def test_the_fake_api_refuses_what_the_real_one_does():
    api = FakeMessagesAPI("default", min_trigger=50_000)
    base = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    edit = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 60_000}}
    beta = ("compact-2026-01-12",)
    assert api.check({**base, "context_management": {"edits": [edit]}}, ()) is not None  # no beta header
    assert api.check({**base, "context_management": {"edits": [edit]}}, beta) is None
    low = {**edit, "trigger": {"type": "input_tokens", "value": 1000}}
    assert "at least" in api.check({**base, "context_management": {"edits": [low]}}, beta)
    assert api.check({**base, "context_management": {"edits": [{"type": "clear_everything"}]}}, beta) is not None
    # a compaction block is checked like any assistant turn: one the server never sent is refused
    forged = {**base, "messages": [{"role": "user", "content": "hi"},
                                   {"role": "assistant", "content": [{"type": "compaction", "content": "made up"}]},
                                   {"role": "user", "content": "go on"}]}
    assert "not one the model produced" in api.check(forged, beta)
    assert "beta header" in api.check(forged, ())
    without = FakeMessagesAPI("default", compaction=False)
    assert "not permitted" in without.check({**base, "context_management": {"edits": [edit]}}, beta)
    small = FakeMessagesAPI("default", context_window=100)
    assert "prompt is too long" in small.check({**base, "messages": [{"role": "user", "content": "x" * 1000}]}, ())
