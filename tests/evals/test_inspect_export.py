"""A run exported as Inspect AI eval logs, read back with inspect_ai's own reader: every attempt a sample with its
transcript (user, assistant with tool calls, tool results as the model read them), its verdict as the score, an
errored attempt as a sample error with its earlier try, hostile output (escape sequences, undecodable bytes,
markup, a huge print) carried as the log holds it. Real kernels, a real DuckDB file, the scripted model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.errors import ConfigError
from workbench.evals import Task, TaskLimits, Verifier, load_tasks
from workbench.evals.inspect_log import clean, eval_logs, write_logs
from workbench.render import result_text
from workbench.evals.runs import spec_of

from evalsupport import open_host

inspect_log = pytest.importorskip("inspect_ai.log")


def read_log(*args, **kwargs):
    """inspect_ai's reader, off this thread's event loop: called in an async test, it would patch asyncio for the
    whole worker process (nest_asyncio), and later test files' asyncio.run would fail."""
    from workbench.evals.inspect_log import off_loop

    return off_loop(inspect_log.read_eval_log, *args, **kwargs)


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "evals" / "basic.jsonl"
ANSWER = Verifier.python("assert answer.strip().endswith('done'), 'the answer does not end with done'")
HOSTILE_CODE = (
    "import sys\n"
    "print('\\x1b[31mred\\x1b[0m \\x1b]0;title\\x07 </script><script>alert(1)</script> \\x00 nul')\n"
    "print('bytes:', b'\\xff\\xfe\\xc3('.decode('utf-8', 'surrogateescape'))\n"
    "print('x' * 3_000_000)\n"
    "print('the end')")
HOSTILE = Task("hostile", "Print hostile things, then say done.", ANSWER, limits=TaskLimits(turns=1),
               scripted=({"code": [HOSTILE_CODE, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"],
                          "answer": "done"},))
KILLS_ITSELF = Task("kills-itself", "Say done.", ANSWER, limits=TaskLimits(turns=1),
                    scripted=({"code": ["import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"], "answer": "done"},))


def text_of(message) -> str:
    return message.text if isinstance(message.content, list) else message.content


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_run_read_back_with_inspects_reader_has_every_attempt_and_transcript(tmp_path):
    tasks = [t for t in load_tasks(EXAMPLE) if t.id in ("retry-sorted-output", "fix-mean")] + [HOSTILE, KILLS_ITSELF]
    async with open_host(tmp_path, backend="local") as host:
        run = host.plugin("evals").make_run(tasks, ["scripted:eval", "scripted"], parallel=3, retries=1)
        df = await run.run()
        rows = df.to_dict("records")
        spec = spec_of(host.log.sql(), run.run_id)
        out = tmp_path / "logs"
        paths = write_logs(rows, host.log.events, out, spec)
        assert sorted(p.name for p in paths) == ["scripted-eval.eval", "scripted.eval"]
        with pytest.raises(ConfigError, match="exists already"):
            write_logs(rows, host.log.events, out, spec)
        with pytest.raises(ConfigError, match="2 models"):
            write_logs(rows, host.log.events, tmp_path / "one.eval", spec)
        events = {r["session_id"]: host.log.events(r["session_id"]) for r in rows}

    log = read_log(str(out / "scripted-eval.eval"), resolve_attachments=True)
    mine = {r["task"]: r for r in rows if r["model"] == "scripted:eval"}
    assert log.status == "success" and log.eval.model == "workbench/scripted:eval" and log.eval.run_id == run.run_id
    assert {s.id for s in log.samples} == set(mine) and len(log.samples) == len(mine)
    graded = [r for r in mine.values() if r["outcome"] in ("pass", "fail")]
    accuracy = log.results.scores[0].metrics["accuracy"].value
    assert accuracy == pytest.approx(sum(r["outcome"] == "pass" for r in graded) / len(graded))
    for s in log.samples:
        row = mine[s.id]
        evs = events[row["session_id"]]
        # every message of the transcript, in order: user messages, assistant turns, tool results
        kinds = [{"user_message": "user", "assistant_turn": "assistant", "tool_result": "tool"}[e.type] for e in evs
                 if e.type in ("user_message", "assistant_turn", "tool_result")]
        assert [m.role for m in s.messages if m.role != "system"] == kinds, s.id
        assert s.messages[0].role == "system" and s.input == [e for e in evs if e.type == "user_message"][0].payload["text"]
        calls = [c for m in s.messages if m.role == "assistant" for c in m.tool_calls or []]
        started = [e.payload for e in evs if e.type == "tool_started"]
        assert [(c.id, c.function, c.arguments) for c in calls] == [(p["tool_use_id"], p["name"], p["input"]) for p in started]
        tool_ids = [m.tool_call_id for m in s.messages if m.role == "tool"]
        assert tool_ids == [c.id for c in calls]
        # the transcript as Inspect's events: a model call per assistant turn (its input the messages before it),
        # a tool event per result, the verdicts
        models = [e for e in s.events if e.event == "model"]
        assert len(models) == kinds.count("assistant") and [e.id for e in s.events if e.event == "tool"] == tool_ids
        assert [m.role for m in models[-1].input][-1] in ("user", "tool") and models[0].input[0].role == "system"
        assert sum(e.event == "info" and e.source == "workbench verifier" for e in s.events) == \
            sum(e.type == "eval_verdict" for e in evs)
        assert s.uuid == row["session_id"] and s.metadata["workbench"]["outcome"] == row["outcome"]
        if row["outcome"] == "error":
            assert s.scores is None and s.error is not None and s.error.message == row["reason"]
        else:
            assert s.scores["verifier"].value == ("C" if row["outcome"] == "pass" else "I") and s.error is None
            assert s.model_usage["workbench/scripted:eval"].output_tokens == row["output_tokens"]
        assert s.target == next(t["verifier"]["code"] for t in spec["tasks"] if t["id"] == s.id)

    retry = next(s for s in log.samples if s.id == "retry-sorted-output")
    assert [v["passed"] for v in retry.metadata["workbench"]["verdicts"]] == [False, True]
    assert len([m for m in retry.messages if m.role == "user"]) == 2  # the failed verdict went back as a message

    killed = next(s for s in log.samples if s.id == "kills-itself")
    assert mine["kills-itself"]["outcome"] == "error" and mine["kills-itself"]["tries"] == 2
    assert len(killed.error_retries) == 1 and "try 1" in killed.error_retries[0].message
    assert killed.error.message.startswith("error:")

    hostile = next(s for s in log.samples if s.id == "hostile")
    first, plot = [m for m in hostile.messages if m.role == "tool"]
    text = text_of(first)
    stored = next(e.payload for e in events[mine["hostile"]["session_id"]] if e.type == "tool_result")
    assert text == clean(result_text(stored))  # what the model read of it, escape sequences made plain as for the model
    assert "</script><script>alert(1)</script>" in text and "the end" in text and "bytes:" in text
    assert len(text) < 200_000 and "cut here" in text  # cut as the hands cut it, the tail kept
    assert any(getattr(c, "type", None) == "image" and c.image.startswith("data:image/png;base64,") for c in plot.content), plot
    assert hostile.output.completion == "done"

    other = read_log(str(out / "scripted.eval"))
    assert other.eval.model == "workbench/scripted" and {s.id for s in other.samples} == set(mine)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_run_of_one_model_goes_to_a_json_file_that_the_reader_and_the_command_agree_on(tmp_path):
    task = Task("say-done", "Say done.", ANSWER, limits=TaskLimits(turns=1), scripted=({"code": ["print(1)"], "answer": "done"},))
    async with open_host(tmp_path, backend="local") as host:
        run = host.plugin("evals").make_run([task], ["scripted:eval"])
        df = await run.run()
        rows = df.to_dict("records")
        (path,) = write_logs(rows, host.log.events, tmp_path / "run.json", spec_of(host.log.sql(), run.run_id))
    log = read_log(str(path))
    assert json.loads(path.read_text())["eval"]["run_id"] == run.run_id
    assert [s.scores["verifier"].value for s in log.samples] == ["C"]
    # the command, on the closed file, writes the same samples
    cli = subprocess.run([sys.executable, "-m", "workbench", "eval-export", run.run_id, "-o", str(tmp_path / "cli.eval"),
                          "--db", str(tmp_path / "wb.duckdb")], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.strip() == str(tmp_path / "cli.eval") and "inspect view" in cli.stderr
    again = read_log(str(tmp_path / "cli.eval"))
    assert [m.model_dump(exclude={"id"}) for m in again.samples[0].messages] == \
        [m.model_dump(exclude={"id"}) for m in log.samples[0].messages]
    missing = subprocess.run([sys.executable, "-m", "workbench", "eval-export", "run-nope", "-o", str(tmp_path / "x.eval"),
                              "--db", str(tmp_path / "wb.duckdb")], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "no eval run 'run-nope'" in missing.stderr
    assert not (tmp_path / "x.eval").exists()


def test_no_rows_is_refused_before_anything_is_written():
    with pytest.raises(ConfigError, match="no attempts"):
        eval_logs([], lambda sid: [])


def synthetic(sid: str, text: str) -> list[dict]:
    """An attempt's events in their JSON form (as the server's API gives them), with what a kernel or a model may
    put in them: lone surrogates, escape sequences, markup, junk where blocks belong, a non-finite cost."""
    ts = "2026-01-01T00:00:0{}+00:00"
    return [
        {"seq": 1, "ts": ts.format(0), "type": "session_created", "payload": {"system": "sys \udcff"}},
        {"seq": 2, "ts": ts.format(1), "type": "eval_started", "payload": {"run": "r", "task": "t", "model": "m", "epoch": 1,
                                                                         "limits": {"turns": 1, "tokens": 0, "seconds": 9}}},
        {"seq": 3, "ts": ts.format(2), "type": "user_message", "payload": {"text": text}},
        {"seq": 4, "ts": ts.format(3), "type": "assistant_turn", "payload": {"message": {
            "model": "m", "stop_reason": "tool_use", "content": [
                "junk", {"type": "thinking", "thinking": "hmm \ud83d", "signature": "sig"}, {"type": "text", "text": text},
                {"type": "tool_use", "id": "tu1", "name": "python", "input": {"code": text}},
                {"type": "tool_use", "id": "tu2", "name": "x", "input": "not a dict"}]},
            "usage": {"input_tokens": 5, "output_tokens": 7, "cache_read_input_tokens": True}}},
        {"seq": 5, "ts": ts.format(4), "type": "tool_result", "payload": {"tool_use_id": "tu1", "name": "python", "is_error": True,
                                                                        "content": [{"type": "text", "text": text}, 7]}},
        {"seq": 6, "ts": ts.format(5), "type": "hands_died", "payload": {"how": "signal SIGKILL \udc80", "exit_code": -9}},
        {"seq": 7, "ts": ts.format(6), "type": "eval_finished", "payload": {"outcome": "fail", "passed": False, "score": None,
                                                                          "reason": "turns", "cost": float("nan")}},
    ]


def test_hostile_events_make_a_log_that_inspect_writes_and_reads_back(tmp_path):
    text = "\x1b[2J\x1b]8;;http://x\x07 \udcff\udcfe </script><img src=x onerror=alert(1)> \x00 \u202e end"
    row = {"run": "r", "task": "t", "model": "m\udcff/../x", "epoch": 1, "outcome": "fail", "passed": False,
           "score": float("nan"), "turns": 1, "tool_calls": 2, "input_tokens": 5, "output_tokens": 7, "cost": float("inf"),
           "wall_s": float("nan"), "session_id": "ev1", "reason": "turns", "tries": 1}
    (path,) = write_logs([row], lambda sid: synthetic(sid, text), tmp_path / "hostile.json")
    log = read_log(str(path))
    (s,) = log.samples
    want = clean(text)
    assert "\udcff" not in want and "\ufffd" in want and "\x1b[2J" in want and "<img src=x onerror=alert(1)>" in want
    assert s.input == want and s.output.completion == want and s.limit.type == "turn" and s.limit.limit == 1
    system, user, assistant, tool = s.messages
    assert system.content == "sys \ufffd" and user.content == want
    assert [c.arguments for c in assistant.tool_calls] == [{"code": want}, {}]
    assert tool.error is not None and tool.error.message == want and tool.text == want
    assert s.scores["verifier"].value == "I" and s.total_time is None
    assert [e.event for e in s.events] == ["model", "tool", "info"] and s.events[0].output.choices[0].stop_reason == "tool_calls"
    assert s.model_usage[f"workbench/{clean(row['model'])}"].input_tokens == 5
    assert s.metadata["workbench"]["cost"] is None and s.metadata["workbench"]["failures"][0]["how"] == "signal SIGKILL \ufffd"
    assert path.parent.samefile(tmp_path) and sorted(p.name for p in tmp_path.iterdir()) == ["hostile.json"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_inspect_view_serves_an_exported_log_with_its_samples(tmp_path):
    """`inspect view` (Inspect's own viewer server) lists the exported log and serves it whole to its browser app."""
    import time
    from urllib.parse import quote

    import httpx

    text = "a transcript line"
    row = {"run": "r", "task": "t", "model": "m", "epoch": 1, "outcome": "pass", "passed": True, "score": 1.0,
           "turns": 1, "tool_calls": 2, "input_tokens": 5, "output_tokens": 7, "cost": 0.0, "wall_s": 6.0,
           "session_id": "ev1", "reason": "passed", "tries": 1}
    (path,) = write_logs([row], lambda sid: synthetic(sid, text), tmp_path / "logs" / "run.eval")
    port = free_port()
    view = subprocess.Popen([sys.executable, "-m", "inspect_ai", "view", "--log-dir", str(path.parent), "--port", str(port),
                             "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, files = time.monotonic() + 120, []
        while time.monotonic() < deadline and not files:
            try:
                files = httpx.get(f"http://127.0.0.1:{port}/api/log-files", timeout=5).json()["files"]
            except httpx.HTTPError:
                time.sleep(0.5)
        assert [f["name"].rsplit("/", 1)[-1] for f in files] == ["run.eval"], files
        body = httpx.get(f"http://127.0.0.1:{port}/api/logs/{quote(files[0]['name'], safe='')}", timeout=30).json()
        assert body["status"] == "success" and body["eval"]["model"] == "workbench/m"
        (sample,) = body["samples"]
        assert sample["id"] == "t" and sample["scores"]["verifier"]["value"] == "C"
        assert [m["role"] for m in sample["messages"]] == ["system", "user", "assistant", "tool"]
    finally:
        view.terminate()
        view.wait(timeout=30)
