"""The eval of notebooks/eval.ipynb: two Claude models replayed from the shipped cassette
(examples/cassettes/eval_two_models.jsonl), with no key and no model server to fall back on."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from workbench.brain.models.cassette import difference, read_entries
from workbench.evals import compare
from workbench.hands.factory import HandsSettings
from workbench.host import Host, HostSettings
from workbench.testing import FakeMessagesAPI

from evalsupport import reference_bootstrap

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cassettes"
SHIPPED = EXAMPLE / "eval_two_models.jsonl"
SAME = ["task", "model", "epoch", "passed", "score", "turns", "tool_calls", "input_tokens", "output_tokens", "cost",
        "reason", "session_id"]
VOLATILE = ("latency_ms", "ttft_ms", "boot_ms", "start_ms", "pid", "duration_ms", "elapsed_ms", "at", "ts")


def example():
    spec = importlib.util.spec_from_file_location("eval_two_models", EXAMPLE / "eval_two_models.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hands(tmp_path: Path) -> HandsSettings:
    return HandsSettings(pool_size=0, registry_dir=str(tmp_path / "kernels"))


def transcript(log, sid: str) -> list[tuple[str, str]]:
    """What the agent and the verifiers did, without wall-clock times and pids."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in VOLATILE}
        return [strip(v) for v in x] if isinstance(x, list) else x
    return [(e.type, json.dumps(strip(e.payload), sort_keys=True)) for e in log.events(sid)
            if e.type in ("user_message", "assistant_turn", "tool_result", "eval_verdict", "eval_finished", "turn_ended")]


@pytest.mark.timeout(600)  # about a minute alone; it passed the 300 s default in neither CI run at load 10 to 20
async def test_the_shipped_eval_cassette_is_current_and_replays_the_recorded_results(tmp_path, monkeypatch):
    ex = example()
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    fresh = tmp_path / "fresh.jsonl"
    with FakeMessagesAPI(ex.scripts(), key=ex.SIGNING_KEY) as api:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-a-real-key")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        async with Host.open(tmp_path / "rec.duckdb", hands=hands(tmp_path),
                             settings=HostSettings(cassette=str(fresh), cassette_mode="record")) as host:
            recorded = await ex.run(host)
            recorded_log = {sid: transcript(host.log, sid) for sid in recorded.session_id}
    assert api.rejections == []
    assert {r["model"] for r in api.requests} == set(ex.MODELS)

    # the two models differ, as the notebook says
    rate = recorded.groupby("model").passed.mean()
    assert rate["claude-opus-5-5"] == 1.0 and rate["claude-haiku-5-5"] == 0.6
    assert recorded.set_index(["task", "model"]).loc[("retry-sorted-output", "claude-haiku-5-5"), "reason"] == "turns"
    # the paired comparison of the example set, against the bootstrap written again by hand: two tasks won by opus,
    # none lost, is no evidence yet
    c = compare(recorded, "claude-haiku-5-5", "claude-opus-5-5")
    by = recorded.pivot(index="task", columns="model", values="passed").astype(float)
    diffs = (by["claude-opus-5-5"] - by["claude-haiku-5-5"]).to_numpy()
    assert (c.n, c.wins, c.losses, c.estimate) == (5, 2, 0, pytest.approx(0.4))
    assert (c.low, c.high) == tuple(pytest.approx(x) for x in reference_bootstrap(diffs))
    assert c.verdict == "no difference shown"

    if fresh.read_bytes() != SHIPPED.read_bytes():
        new, old = read_entries(fresh), read_entries(SHIPPED)
        first = next((i for i, (a, b) in enumerate(zip(new, old, strict=False)) if a != b), min(len(new), len(old)))
        where = difference(new[first].request, old[first].request).path if first < min(len(new), len(old)) else "the count"
        pytest.fail(f"examples/cassettes/eval_two_models.jsonl is stale (entry {first + 1} differs at {where}): "
                    "run python examples/cassettes/eval_two_models.py --record, then run notebooks/eval.ipynb again")

    # replay: no key, no server to answer a miss; several attempts at a time, in whatever order they finish
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    monkeypatch.delenv("ANTHROPIC_BASE_URL")
    async with Host.open(tmp_path / "rep.duckdb", hands=hands(tmp_path),
                         settings=HostSettings(cassette=str(SHIPPED), cassette_mode="replay")) as host:
        replayed = await ex.run(host, parallel=4)
        played = host.models.cassette
        assert played.unplayed() == []
        assert {sid: transcript(host.log, sid) for sid in replayed.session_id} == recorded_log
        model_errors = [e for sid in replayed.session_id for e in host.log.events(sid, types=["model_error"])]
    assert model_errors == []
    assert replayed[SAME].to_dict("records") == recorded[SAME].to_dict("records")


async def test_a_changed_task_prompt_ends_its_attempt_as_an_error_with_the_difference(tmp_path, monkeypatch):
    ex = example()
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    (task,) = [t for t in ex.tasks() if t.id == "num-fib-30"]
    changed = dataclasses.replace(task, prompt=task.prompt.replace("30th", "31st"))
    async with Host.open(tmp_path / "rep.duckdb", hands=hands(tmp_path),
                         settings=HostSettings(cassette=str(SHIPPED), cassette_mode="replay")) as host:
        df = await host.plugin("evals").make_run([changed], ["claude-opus-5-5"], run_id="changed").run()
        (row,) = df.to_dict("records")
        errors = [e.payload for e in host.log.events(row["session_id"], types=["model_error"])]
    # not the model's doing: an error (out of the pass rate), tried again up to the retries, each missing the same way
    assert row["outcome"] == "error" and row["passed"] is None and row["tries"] == 3, row
    assert row["reason"].startswith("error: the model call failed after 1 attempt(s): ")
    (error,) = errors
    message = error["error"]
    assert "eval_two_models.jsonl has no recording of this request (model 'claude-opus-5-5', 1 messages)" in message
    assert "differs first at messages[0].content[0].text: at character 13" in message
    assert "recorded 'What is the 30th Fibonacci number" in message and "now 'What is the 31st Fibonacci number" in message
    assert "re-record it" in message
