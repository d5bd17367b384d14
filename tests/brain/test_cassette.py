"""Cassettes: model calls recorded once and replayed offline (docs/cassettes.md).

Fast tests use the in-memory log twin and the scripted model; the tests marked slow drive the
official SDK against the fake Messages API with real kernels, and replay the shipped example.
"""

from __future__ import annotations

import asyncio
import fcntl
import importlib.util
import json
import threading
from pathlib import Path

import pytest

from workbench.brain import Brain, BrainSettings
from workbench.brain.models import Cassette, CassetteError, CassetteMiss, CassetteModel, ModelCatalog, Reply, RetryableError, ScriptedModel
from workbench.brain.models.cassette import HEADER, difference, read_entries, request_key
from workbench.errors import ConfigError, MissingAPIKey
from workbench.host import Host, HostSettings
from workbench.log import MemoryLog

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cassettes"
# wall-clock times, process ids and the sandbox uid a kernel leased: the only fields a replayed log may differ in
VOLATILE = ("latency_ms", "ttft_ms", "boot_ms", "start_ms", "pid", "duration_ms", "elapsed_ms",
            "identity")  # the sandbox uid a kernel leased: whichever was free on this machine at that moment


def echo(request) -> Reply:
    """Thinks, then says what the last user text was (and which model it is)."""
    text = request["messages"][-1]["content"][-1]["text"]
    return Reply(thinking=f"They said {text!r}.", text=f"{request['model']} heard: {text}")


class Counting:
    """A model that counts its calls and fails the first `fail` of them with a retryable error."""

    def __init__(self, name: str, fail: int = 0, delay: float = 0.0):
        self.name, self.calls, self.fail = name, 0, fail
        self.inner = ScriptedModel(echo, name=name, delay=delay)

    async def stream(self, request):
        self.calls += 1
        if self.calls <= self.fail:
            raise RetryableError("529 overloaded_error: injected", 529, 0.0)
        async for ev in self.inner.stream(request):
            yield ev


def brain_on(log, model_factory, **settings) -> Brain:
    return Brain(log, hands_factory=None, settings=BrainSettings(retry_base=0.0, **settings), model_factory=model_factory)


def recorder(path, mode="record", **kw):
    cassette = Cassette(path, mode)
    made: dict[str, Counting] = {}

    def make(name):
        made[name] = Counting(name, **kw)
        return CassetteModel(name, cassette, made[name])
    return cassette, make, made


def replayer(path):
    cassette = Cassette(path, "replay")

    def must_not_run():
        raise AssertionError("a replay made the inner model")
    return cassette, (lambda name: CassetteModel(name, cassette, must_not_run))


def comparable(log, sid):
    """The session's events as a recorded and a replayed run must agree on: all but ts and wall times."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in VOLATILE}
        return [strip(v) for v in x] if isinstance(x, list) else x
    return [json.dumps([e.seq, e.type, strip(e.payload)], sort_keys=True) for e in log.events(sid)]


async def run(brain, sid, model, *texts, system=None):
    brain.create_session(sid, model=model, system=system)
    return [await brain.run_turn(sid, t) for t in texts]


# -- record, replay, and what a mismatch says ------------------------------------------------------------


@pytest.mark.asyncio
async def test_replay_gives_the_same_log_without_calling_the_model(tmp_path):
    path = tmp_path / "c.jsonl"
    cassette, make, made = recorder(path, fail=1)  # the first call gets a 529: the retry is recorded too
    rec = MemoryLog()
    assert await run(brain_on(rec, make), "s1", "model-a", "hello", "and again") == ["end_turn", "end_turn"]
    assert made["model-a"].calls == 3 and len(cassette) == 3

    played, make2 = replayer(path)
    rep = MemoryLog()
    assert await run(brain_on(rep, make2), "s1", "model-a", "hello", "and again") == ["end_turn", "end_turn"]
    assert comparable(rep, "s1") == comparable(rec, "s1")
    assert [e.type for e in rep.events("s1")].count("model_retry") == 1
    assert played.unplayed() == []
    # thinking blocks come back with their signatures, verbatim
    blocks = [b for e in rep.events("s1", types=["assistant_turn"]) for b in e.payload["message"]["content"]]
    assert any(b["type"] == "thinking" and b["signature"].startswith("sig_") for b in blocks)
    # the file: a header, then one line per call, no secrets, each key the hash of its request
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == dict(HEADER) and len(lines) == 4
    assert [json.loads(line)["error"] is None for line in lines[1:]] == [False, True, True]
    assert all(json.loads(line)["key"] == request_key(json.loads(line)["request"]) for line in lines[1:])


@pytest.mark.asyncio
async def test_a_changed_request_fails_with_the_path_that_changed(tmp_path):
    path = tmp_path / "c.jsonl"
    _, make, _ = recorder(path)
    await run(brain_on(MemoryLog(), make), "s1", "model-a", "hello", "and again")

    async def replay_error(*texts, model="model-a", system=None):
        log = MemoryLog()
        stops = await run(brain_on(log, replayer(path)[1]), "s", model, *texts, system=system)
        errors = [e.payload for e in log.events("s", types=["model_error"])]
        assert stops[-1] == "error" and len(errors) == 1, stops
        assert errors[0]["attempts"] == 1  # a miss is not retried
        return errors[0]["error"]

    msg = await replay_error("hullo")
    assert "has no recording of this request (model 'model-a', 1 messages)" in msg
    assert "differs first at messages[0].content[0].text: recorded 'hello', now 'hullo'" in msg
    assert str(path) in msg and "record-missing" in msg
    msg = await replay_error("hello", "and once more")
    assert "messages[2].content[0].text: recorded 'and again', now 'and once more'" in msg
    msg = await replay_error("hello", system="another system prompt")
    assert "differs first at system: at character 0, recorded 'You are an agent working in a Jupyter wo...'" in msg
    assert "now 'another system prompt'" in msg
    msg = await replay_error("hello", model="model-b")
    assert "differs first at model: recorded 'model-a', now 'model-b'" in msg


@pytest.mark.asyncio
async def test_a_miss_is_compared_with_the_recording_it_most_resembles(tmp_path):
    # many first requests agree up to their prompt (an eval's tasks): the nearest is the prompt that changed,
    # not whichever came first
    path = tmp_path / "c.jsonl"
    _, make, _ = recorder(path)
    prompts = ["In sales.csv, which region sold the most units?", "What is the 30th Fibonacci number, with F(1) = 1?",
               "Fix stats.py so that mean([1, 2, 3]) is 2.", "x" * 10 + "What is the 30th Fibonacci number?"]
    for n, prompt in enumerate(prompts):
        await run(brain_on(MemoryLog(), make), f"s{n}", "model-a", prompt)

    async def miss(text):
        log = MemoryLog()
        assert await run(brain_on(log, replayer(path)[1]), "s", "model-a", text) == ["error"]
        return log.events("s", types=["model_error"])[0].payload["error"]

    assert "messages[0].content[0].text: recorded 'What is the 30th Fibonacci number, with F(1) = 1?', " \
           "now 'What is the 31st Fibonacci number, with F(1) = 1?'" in await miss(prompts[1].replace("30th", "31st"))
    # changed at its start: the rest of the text still says which recording it was
    assert "recorded 'Fix stats.py so that mean([1, 2, 3]) is 2.', now 'Please fix stats.py so that mean([1, 2, 3]) is 2.'" \
        in await miss("Please f" + prompts[2][1:])


@pytest.mark.asyncio
async def test_a_request_asked_more_often_than_recorded_is_a_miss_that_says_so(tmp_path):
    path = tmp_path / "c.jsonl"
    _, make, _ = recorder(path)
    await run(brain_on(MemoryLog(), make), "s1", "model-a", "hello")
    played, make2 = replayer(path)
    brain, log = brain_on(MemoryLog(), make2), None
    assert await run(brain, "s1", "model-a", "hello") == ["end_turn"]
    log = brain.log
    assert await run(brain, "s2", "model-a", "hello") == ["error"]
    assert "recorded this request 1 time(s) and it is asked once more" in log.events("s2", types=["model_error"])[0].payload["error"]


@pytest.mark.asyncio
async def test_record_missing_replays_what_it_has_and_records_the_rest(tmp_path):
    path = tmp_path / "c.jsonl"
    _, make, _ = recorder(path)
    await run(brain_on(MemoryLog(), make), "s1", "model-a", "hello")
    cassette, make2, made = recorder(path, mode="record-missing")
    brain = brain_on(MemoryLog(), make2)
    assert await run(brain, "s1", "model-a", "hello") == ["end_turn"]
    assert made["model-a"].calls == 0  # replayed
    assert await run(brain, "s2", "model-a", "something new") == ["end_turn"]
    assert made["model-a"].calls == 1 and len(read_entries(path)) == 2
    played, make3 = replayer(path)
    brain = brain_on(MemoryLog(), make3)
    assert await run(brain, "a", "model-a", "hello") == await run(brain, "b", "model-a", "something new") == ["end_turn"]
    assert played.unplayed() == []


@pytest.mark.asyncio
async def test_concurrent_sessions_share_one_cassette(tmp_path):
    path = tmp_path / "c.jsonl"
    # 12 sessions at once, two models, some asking identical requests (like epochs of one task)
    plan = [(f"s{i}", ("model-a", "model-b")[i % 2], f"question {i % 4}") for i in range(12)]
    _, make, _ = recorder(path, delay=0.002)
    rec = MemoryLog()
    brain = brain_on(rec, make)
    for sid, model, _ in plan:
        brain.create_session(sid, model=model)
    assert set(await asyncio.gather(*(brain.run_turn(sid, q) for sid, _, q in plan))) == {"end_turn"}
    assert len(read_entries(path)) == 12

    played, make2 = replayer(path)
    rep = MemoryLog()
    brain = brain_on(rep, make2)
    for sid, model, _ in plan:
        brain.create_session(sid, model=model)
    assert set(await asyncio.gather(*(brain.run_turn(sid, q) for sid, _, q in plan))) == {"end_turn"}
    assert played.unplayed() == []
    for sid, model, q in plan:
        assert comparable(rep, sid) == comparable(rec, sid)
        answer = rep.events(sid, types=["assistant_turn"])[-1].payload["message"]["content"][-1]["text"]
        assert answer == f"{model} heard: {q}"


@pytest.mark.asyncio
async def test_a_broken_stream_is_recorded_as_the_failure_it_was(tmp_path):
    class Broken:
        name = "broken"

        async def stream(self, request):
            yield {"type": "ping"}  # and then nothing: no message_start

    path = tmp_path / "c.jsonl"
    cassette = Cassette(path, "record")
    rec = MemoryLog()
    assert await run(brain_on(rec, lambda name: CassetteModel(name, cassette, Broken())), "s", "broken", "hi") == ["error"]
    rep = MemoryLog()
    assert await run(brain_on(rep, replayer(path)[1]), "s", "broken", "hi") == ["error"]
    assert comparable(rep, "s") == comparable(rec, "s")
    assert "ended before message_start" in rep.events("s", types=["model_error"])[0].payload["error"]


START = [{"type": "message_start", "message": {"role": "assistant", "content": []}}]


@pytest.mark.parametrize("mode", ["record", "record-missing"])
def test_a_new_cassette_file_is_never_seen_without_its_header(tmp_path, monkeypatch, mode):
    """Whenever a writer waits for its lock, a reader could open the file: it holds the header by then."""
    path = tmp_path / "c.jsonl"
    if mode == "record":
        Cassette(path, "record").record({"model": "old", "messages": []}, START, None)
    seen = []
    real = fcntl.flock

    def flock(fd, op):
        seen.append(path.read_bytes())
        return real(fd, op)
    monkeypatch.setattr(fcntl, "flock", flock)
    Cassette(path, mode).record({"model": "new", "messages": []}, START, None)
    assert seen and all(s.startswith(b'{"') and b"\n" in s for s in seen), seen
    assert [e.request["model"] for e in read_entries(path)] == ["new"]  # "record" started the file over


def test_two_writers_on_one_file_take_turns(tmp_path):
    """Two cassette objects (as two processes would) appending at once leave every line whole."""
    path = tmp_path / "c.jsonl"
    writers = [Cassette(path, "record-missing") for _ in range(2)]
    big = "x" * 200_000  # lines far over a pipe buffer, so an unlocked interleaving would show

    def write(w: Cassette, n: int) -> None:
        for i in range(20):
            w.record({"model": f"w{n}", "messages": [{"role": "user", "content": f"{i} {big}"}]}, START, None)
    threads = [threading.Thread(target=write, args=(w, n)) for n, w in enumerate(writers)]
    for t in threads:
        t.start()
    reads = 0
    while any(t.is_alive() for t in threads):  # a reader never sees half an entry
        reads += 1
        assert len(Cassette(path, "record-missing")) <= 40
    for t in threads:
        t.join()
    assert reads > 0
    entries = read_entries(path)
    assert len(entries) == 40 and len({e.key for e in entries}) == 40


# -- models by name, keys, and settings ----------------------------------------------------------------


def test_a_catalog_with_a_cassette_replays_claude_without_a_key(tmp_path, monkeypatch):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(dict(HEADER)) + "\n")
    model = ModelCatalog(cassette=Cassette(path, "replay")).make("claude-opus-5-5")
    assert isinstance(model, CassetteModel) and model.name == "claude-opus-5-5"
    with pytest.raises(MissingAPIKey):
        ModelCatalog(cassette=Cassette(path, "record")).make("claude-opus-5-5")
    assert path.read_text() == json.dumps(dict(HEADER)) + "\n"  # record mode starts over only at its first write

    async def ask(m):
        return [ev async for ev in m.stream({"model": "claude-opus-5-5", "messages": [{"role": "user", "content": "hi"}]})]
    with pytest.raises(CassetteMiss, match="holds no recordings at all"):
        asyncio.run(ask(model))
    missing = ModelCatalog(cassette=Cassette(path, "record-missing")).make("claude-opus-5-5")
    with pytest.raises(CassetteMiss, match="cannot be made: model 'claude-opus-5-5' needs ANTHROPIC_API_KEY"):
        asyncio.run(ask(missing))
    # a scripted model, wrapped in record-missing mode: recorded once, then replayed
    catalog = ModelCatalog(cassette=Cassette(path, "record-missing"))
    req = {"model": "scripted", "max_tokens": 10, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    first = asyncio.run(ask_with(catalog.make("scripted"), req))
    assert len(read_entries(path)) == 1
    assert asyncio.run(ask_with(ModelCatalog(cassette=Cassette(path, "replay")).make("scripted"), req)) == first


async def ask_with(model, request):
    return [ev async for ev in model.stream(request)]


def test_the_host_reads_its_cassette_from_settings_and_refuses_a_bad_one(tmp_path, monkeypatch):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(dict(HEADER)) + "\n")
    monkeypatch.setenv("WORKBENCH_CASSETTE", str(path))
    host = Host.build(log=MemoryLog(), hands=False, plugins=[])
    assert host.models.cassette is not None and host.models.cassette.mode == "replay"
    monkeypatch.setenv("WORKBENCH_CASSETTE_MODE", "rewind")
    with pytest.raises(ConfigError, match="cassette mode 'rewind' is not one of replay, record, record-missing"):
        Host.build(log=MemoryLog(), hands=False, plugins=[])
    with pytest.raises(CassetteError, match="does not exist"):
        Host.build(log=MemoryLog(), hands=False, plugins=[], settings=HostSettings(cassette=str(tmp_path / "nope.jsonl")))


HEAD = json.dumps(dict(HEADER)).encode()
GOOD = json.dumps({"key": request_key({"model": "m"}), "model": "m", "request": {"model": "m"}, "error": None,
                   "events": [{"type": "message_start", "message": {"role": "assistant", "content": []}}]})
EVENTS = '"events": [{"type": "message_start", "message": {"role": "assistant", "content": []}}]'



@pytest.mark.parametrize("content, message", [
    (b"", "is empty"),
    (b'{"format":"something-else"}\n', "line 1 is not the header"),
    (b"\xff\xfe{}\n", "line 1 is not UTF-8 (byte 0)"),
    (HEAD + b'\n{"key": "caf\xe9"}\n', "line 2 is not UTF-8"),
    (HEAD + b"\n" + GOOD.encode() + b"\n" + GOOD.encode()[:40], "ends in the middle of line 3"),
    (HEAD + b"\n{not json\n" + GOOD.encode() + b"\n", "line 2 is not valid JSON"),
    (HEAD + b"\n" + GOOD.replace(EVENTS, '"events": [NaN]').encode() + b"\n", "line 2 is not valid JSON"),
    (HEAD + b"\n[1, 2]\n", "line 2 is not an entry"),
    (HEAD + b"\n" + GOOD.replace(EVENTS, '"events": "x"').encode() + b"\n", "list of `events`"),
    (HEAD + b"\n" + GOOD.replace('"error": null', '"error": {"kind": "odd"}').encode() + b"\n", "`error` must be"),
    (HEAD + b"\n" + GOOD.replace('"request": {"model": "m"}', '"request": {"model": "n"}').encode() + b"\n",
     "its key is not the hash of its request"),
    (HEAD + b"\n" + GOOD.replace(EVENTS, '"events": []').encode() + b"\n", "do not make a whole message"),
    (HEAD + b"\n" + GOOD.replace(EVENTS, '"events": [{"type": "content_block_start"}]').encode() + b"\n", "do not make a whole message"),
    (HEAD + b"\n" + GOOD.replace(EVENTS, '"events": [{"type": "message_start", "message": 3}]').encode() + b"\n", "whole message"),
    (HEAD + b"\n" + b"[" * 100_000 + b"\n", "line 2 is nested too deeply"),
])
def test_a_broken_cassette_file_is_refused_with_the_line_and_what_to_do(tmp_path, content, message):
    path = tmp_path / "c.jsonl"
    path.write_bytes(content)
    for mode in ("replay", "record-missing"):
        with pytest.raises(CassetteError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")) as e:
            Cassette(path, mode)
        assert str(path) in str(e.value) and "\n" not in str(e.value)
    assert path.read_bytes() == content  # nothing was changed


def test_a_last_line_without_newline_is_kept_and_the_next_entry_starts_on_its_own_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(dict(HEADER)) + "\n" + GOOD)
    cassette = Cassette(path, "record-missing")
    cassette.record({"model": "m2", "note": "caf\u00e9 \udcff"}, START, None)  # a lone surrogate, escaped
    entries = read_entries(path)
    assert [e.request["model"] for e in entries] == ["m", "m2"] and entries[1].request["note"] == "caf\u00e9 \udcff"


def test_difference_names_the_first_path_that_changed():
    a = {"model": "m", "system": "s", "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}
    b = json.loads(json.dumps(a))
    assert difference(a, b).path.startswith("(nowhere")
    b["messages"].append({"role": "assistant", "content": []})
    d = difference(a, b)
    assert (d.path, d.agreed) == ("messages[1]", 5)
    b = json.loads(json.dumps(a))
    b["messages"][0]["content"][0]["text"] = "y"
    b["system"] = "t"
    assert difference(a, b).path == "system"  # system is compared before messages
    b = json.loads(json.dumps(a))
    b["temperature"] = 1.0
    assert difference(a, b).path == "temperature"
    assert difference(a, {**a, "model": 1}).path == "model"  # a type change is a change
    assert difference({"x": True}, {"x": 1}).path == "x"


# -- through the real SDK, the fake API and real kernels ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_fake_api_recording_replays_byte_identical_requests_and_log(fake_api, monkeypatch, tmp_path, hands):
    from workbench.log import DuckDBLog

    path = tmp_path / "c.jsonl"
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-a-real-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_api.url)
    fake_api.use([
        Reply(thinking="I should compute this in the kernel.", text="Computing.", code=["x = 6 * 7\nprint(x)"]),
        Reply(thinking="", redacted=True, code=["print(x + 1)", "print('caf\u00e9 \\u2603')"]),
        Reply(thinking="", text="x is 42."),
        Reply(thinking="They want the square.", code=["print(x ** 2)"]),
        Reply(thinking="", text="1764."),
    ])
    fake_api.fail_next(529)  # recorded, and replayed as the same retry
    turns = ("What is 6 times 7?", "And its square?")

    async def session(db, model_factory):
        log = DuckDBLog(db)
        brain = Brain(log, hands_factory=hands, settings=BrainSettings(retry_base=0.01), model_factory=model_factory)
        try:
            assert await run(brain, "s1", "claude-opus-5-5", *turns) == ["end_turn", "end_turn"]
            return comparable(log, "s1")
        finally:
            await brain.close()
            log.close()

    recorded = await session(tmp_path / "rec.duckdb", ModelCatalog(cassette=Cassette(path, "record")).make)
    assert fake_api.rejections == [] and len(fake_api.requests) == 6
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    monkeypatch.delenv("ANTHROPIC_BASE_URL")
    fake_api.stop()  # nothing to answer a replay that would call out
    played = Cassette(path, "replay")
    replayed = await session(tmp_path / "rep.duckdb", ModelCatalog(cassette=played).make)

    assert replayed == recorded
    kinds = [json.loads(e)[1] for e in recorded]
    assert kinds.count("assistant_turn") == 5 and kinds.count("tool_result") == 4 and kinds.count("model_retry") == 1
    assert played.unplayed() == []
    # what the brain sent the API, byte for byte, is what the cassette holds: the SDK only adds stream: true
    # and sends `betas` as the anthropic-beta header (the first request, the 529, is sent again as the second)
    sent = [json.dumps({k: v for k, v in r.items() if k != "stream"}, sort_keys=True) for r in fake_api.requests]
    held = [e.request for e in read_entries(path)]
    assert all(r["betas"] == ["compact-2026-01-12"] for r in held)
    assert [json.dumps({k: v for k, v in r.items() if k != "betas"}, sort_keys=True) for r in held] == sent
    text = path.read_text()
    assert "sk-test" not in text and fake_api.url not in text and "redacted_thinking" in text
    assert [e.error["status"] if e.error else None for e in read_entries(path)][:2] == [529, None]


def load_example():
    spec = importlib.util.spec_from_file_location("compare_example", EXAMPLE / "compare.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.asyncio
async def test_the_shipped_example_replays_offline_and_is_current(tmp_path, monkeypatch):
    from workbench.hands.factory import HandsSettings

    example = load_example()
    shipped = EXAMPLE / "compare.jsonl"
    hands = HandsSettings(pool_size=0, registry_dir=str(tmp_path / "kernels"))
    async with Host.open(tmp_path / "rep.duckdb", hands=hands, settings=HostSettings(cassette=str(shipped))) as host:
        played = host.models.cassette
        rows = await example.run_all(host)
    assert played.unplayed() == []
    passed = {(r["task"], r["model"]): r["passed"] for r in rows}
    assert sum(v for (_, m), v in passed.items() if m.endswith("careful")) == 3
    assert sum(v for (_, m), v in passed.items() if m.endswith("hasty")) == 1

    # recording it again gives the same bytes; if not, the message says what changed and how to re-record
    from workbench.testing import FakeMessagesAPI

    with FakeMessagesAPI(example.script, key=example.SIGNING_KEY) as api:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-a-real-key")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        fresh = tmp_path / "fresh.jsonl"
        async with Host.open(tmp_path / "rec.duckdb", hands=hands,
                             settings=HostSettings(cassette=str(fresh), cassette_mode="record")) as host:
            await example.run_all(host)
    if fresh.read_bytes() != shipped.read_bytes():
        new, old = read_entries(fresh), read_entries(shipped)
        first = next((i for i, (a, b) in enumerate(zip(new, old, strict=False)) if a != b), min(len(new), len(old)))
        where = difference(new[first].request, old[first].request).path if first < min(len(new), len(old)) else "the count"
        pytest.fail(f"examples/cassettes/compare.jsonl is stale (entry {first + 1} differs at {where}): "
                    "run python examples/cassettes/compare.py --record")


@pytest.mark.slow
def test_the_cli_replays_by_setting_and_says_what_changed(tmp_path):
    import subprocess

    from wbsupport import WORKBENCH, cli_env

    env = cli_env(WORKBENCH_CASSETTE=str(EXAMPLE / "compare.jsonl"))
    task = load_example().TASKS[0]

    def run_cli(prompt):
        return subprocess.run([*WORKBENCH, "run", prompt, "--model", "anthropic:fake-careful", "--db", str(tmp_path / "log.duckdb")],
                              env=env, capture_output=True, text=True, timeout=300)
    p = run_cli(task["prompt"])  # no key, no fake API: the cassette answers
    assert p.returncode == 0, p.stderr
    assert f"The answer is {task['answer']}." in p.stdout
    p = run_cli(task["prompt"].replace("6?", "7?"))
    assert p.returncode != 0
    assert "differs first at messages[0].content[0].text: at character 41" in p.stdout + p.stderr
