"""The pure parts of evals: Wilson intervals, prices, the report's escaping, the scripted solver and grader,
and the verdict line (the workspace copy is tests/hands/test_workspace_copy.py's)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from workbench.brain.models.scripted import Reply
from workbench.errors import ConfigError
from workbench.evals import Prices, Task, Verifier, report_html, summary, wilson
from workbench.evals.report import compare_html
from workbench.evals.cli import print_summary
from workbench.evals.faults import cut_off, killed_from_outside, verdict_error
from workbench.evals.results import COLUMNS, attempt_row, frame, latest_tries
from workbench.evals.script import grader, solver
from workbench.evals.verify import GRADER_SYSTEM, grader_request, parse_grade
from workbench.hands.verdict import harness_code, read_verdict
from workbench.log import Event

HOSTILE = '<script>alert(1)</script>"\'&<img src=x onerror=alert(2)>'


def test_wilson_matches_known_values():
    low, high = wilson(8, 10)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    assert wilson(0, 0) == (0.0, 1.0)
    assert wilson(0, 5)[0] == 0.0 and wilson(5, 5)[1] == 1.0
    assert wilson(50, 100)[0] < 0.5 < wilson(50, 100)[1]


def test_prices_by_name_and_prefix_and_bad_entries_refused():
    p = Prices.parse("claude-opus-5-5=5/25, claude-*=3/15,scripted*=0/0")
    assert p("claude-opus-5-5", 1_000_000, 1_000_000) == 30.0
    assert p("claude-haiku-9", 2_000_000, 0) == 6.0
    assert p("unknown", 10**9, 10**9) == 0.0
    for bad in ("x=1", "=1/2", "x=a/b", "x=-1/2", "x=nan/1", "x=inf/1"):
        with pytest.raises(ConfigError, match="NAME=INPUT/OUTPUT"):
            Prices.parse(bad)


def ev(sid, seq, type, payload, ts):
    return Event(sid, seq, ts, type, payload)


def rows_with(task: str, model: str, transcript_text: str) -> list[dict]:
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    events = [ev("s1", 1, "eval_started", {"run": "r", "task": task, "model": model, "epoch": 1}, t0),
              ev("s1", 2, "user_message", {"text": transcript_text}, t0),
              ev("s1", 3, "assistant_turn", {"message": {"content": [{"type": "text", "text": transcript_text}]},
                                             "usage": {"input_tokens": 10, "output_tokens": 3}}, t0),
              ev("s1", 4, "eval_finished", {"passed": True, "score": 1.0, "reason": "passed", "cost": 0.5},
                 t0 + timedelta(seconds=2))]
    row = attempt_row(events)
    assert row is not None
    return [row]


def test_attempt_rows_count_what_the_view_counts():
    (row,) = rows_with("t", "m", "hi")
    assert set(row) == set(COLUMNS)
    assert (row["turns"], row["input_tokens"], row["output_tokens"], row["wall_s"], row["passed"]) == (1, 10, 3, 2.0, True)


def test_the_report_escapes_everything_and_puts_each_transcript_one_click_away():
    rows = rows_with(HOSTILE, HOSTILE, HOSTILE)
    df = frame(rows)
    events = {"s1": [{"seq": 1, "type": "user_message", "payload": {"text": HOSTILE}}]}
    html = report_html(df, lambda sid: events[sid], title=HOSTILE) + compare_html(df, df)
    assert "<script>" not in html and "<img" not in html and "onerror=alert(2)>" not in html
    assert "&lt;script&gt;" in html
    assert html.count('<details class="wb-attempt"') == 1 and 'data-session="s1"' in html
    (s,) = summary(df)
    assert (s["n"], s["passed"], s["cost"]) == (1, 1, 0.5)


def request(*messages, system="sys"):
    return {"system": system, "messages": list(messages)}


def test_the_solver_plays_a_tasks_turns_and_fills_in_the_output():
    t = Task("t", "the prompt", Verifier.python("assert 1"),
             scripted=({"code": ["print(1)"], "answer": "got {output}"}, {"code": [], "answer": "second"}))
    script = solver(lambda: {"the prompt": t})
    first = script(request({"role": "user", "content": "the prompt"}))
    assert isinstance(first, Reply) and first.code == ["print(1)"]
    done = script(request({"role": "user", "content": "the prompt"},
                          {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "python", "input": {}}]},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": " 42 \n"}]}))
    assert done.text == "got 42"
    again = script(request({"role": "user", "content": "the prompt"}, {"role": "assistant", "content": "x"},
                           {"role": "user", "content": "feedback"}))
    assert again.text == "second"
    assert "no scripted solution" in (script(request({"role": "user", "content": "other"})).text or "")


def test_the_scripted_grader_looks_for_the_rubrics_quoted_phrases():
    t = Task("t", "q", Verifier.graded('say "alpha" and "beta"'))
    yes = grader(grader_request(t, "Alpha, then BETA.", "(no files)", "m"))
    no = grader(grader_request(t, "alpha only", "(no files)", "m"))
    assert json.loads(yes.text or "")["passed"] is True
    v = json.loads(no.text or "")
    assert v["passed"] is False and v["score"] == 0.5 and "beta" in v["explanation"]
    assert grader_request(t, "a", "f", "m")["system"] == GRADER_SYSTEM


@pytest.mark.parametrize("reply, expected", [
    ('{"passed": true, "score": 0.9, "explanation": "ok"}', (True, 0.9, "ok")),
    ('Here: {"passed": false, "score": 7, "explanation": "no"}', (False, 1.0, "no")),
    ('{"passed": "yes"}', None), ("no json", None), ('{"passed": true, "score": NaN}', None),
])
def test_a_grade_is_read_strictly(reply, expected):
    assert parse_grade(reply) == expected


def test_the_verdict_line_needs_the_nonce():
    out = 'WBVERDICT-fake{"passed": true}\nNONCE{"passed": false, "explanation": "real"}\nNONCEnot json'
    assert read_verdict(out, "NONCE") is None  # the last marked line counts, and it is broken
    assert read_verdict(out.rsplit("\n", 1)[0], "NONCE") == {"passed": False, "explanation": "real"}
    assert read_verdict('WBVERDICT-fake{"passed": true}', "WBVERDICT-real") is None
    code = harness_code('x = """\n"""', HOSTILE + "\n\"\"\"", "N")
    compile(code, "<harness>", "exec")  # the answer and the check enter the cell as literals only


def test_a_run_checks_its_models_and_graders_before_anything_is_written(tmp_path):
    from workbench.errors import UnknownModel
    from workbench.evals import EvalRun
    from workbench.host import Host

    host = Host.build(tmp_path / "wb.duckdb", hands=False)
    try:
        rubric = Task("r", "q", Verifier.graded('"x"', model="no-such-grader"))
        with pytest.raises(UnknownModel, match="no-such-grader"):
            EvalRun(host, [rubric], ["scripted:eval"])
        with pytest.raises(UnknownModel, match="no-such-model"):
            EvalRun(host, [rubric], ["no-such-model"])
        with pytest.raises(ConfigError, match="without hands"):
            EvalRun(host, [Task("p", "q", Verifier.python("assert 1"))], ["scripted:eval"])
        for bad in ({"epochs": 0}, {"parallel": 0}, {"run_id": "../x"}, {"epochs": True}, {"retries": -1},
                    {"retries": 11}, {"retries": True}):
            with pytest.raises(ConfigError):
                EvalRun(host, [rubric], ["scripted:eval"], **bad)
        assert host.log.sessions() == []
    finally:
        import asyncio

        asyncio.run(host.close())


@pytest.mark.parametrize("died, outside", [
    ({"exit_code": -9, "signal": 9, "how": "signal SIGKILL"}, True),
    ({"exit_code": -15, "signal": 15, "how": "signal SIGTERM"}, True),
    ({"exit_code": 137, "signal": None, "how": "exit code 137, i.e. signal SIGKILL inside a wrapper"}, True),
    ({"exit_code": None, "signal": None, "how": "the gateway closed the websocket"}, True),
    ({"exit_code": -9, "signal": 9, "how": "signal SIGKILL, out of memory: it went over its memory limit"}, False),
    ({"exit_code": 137, "signal": None, "how": "exit code 137, i.e. signal SIGKILL inside a wrapper, out of memory: it "
                                               "went over its memory limit"}, False),
    ({"exit_code": 3, "signal": None, "how": "exit code 3"}, False),
    ({"exit_code": 0, "signal": None, "how": "exit code 0"}, False),
    ({"exit_code": None, "signal": None, "how": "it called exit()"}, False),
    ({"exit_code": -11, "signal": 11, "how": "signal SIGSEGV"}, False),
    ({"exit_code": -6, "signal": 6, "how": "signal SIGABRT"}, False),
    ({"exit_code": -31, "signal": 31, "how": "signal SIGSYS"}, False),
    ({"exit_code": -24, "signal": 24, "how": "signal SIGXCPU"}, False),
    ({"exit_code": 139, "signal": None, "how": "exit code 139, i.e. signal SIGSEGV inside a wrapper"}, False),
])
def test_a_kernel_death_is_the_models_doing_unless_it_came_from_outside(died, outside):
    assert killed_from_outside(died) is outside


def turn(*events):
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return [ev("s", n, t, p, t0) for n, (t, p) in enumerate([("user_message", {"text": "earlier"}),
                                                              ("hands_died", {"signal": 9, "how": "signal SIGKILL"}),
                                                              ("turn_ended", {"stop_reason": "end_turn"}),
                                                              ("user_message", {"text": "now"}), *events], 1)]


def test_a_turn_is_cut_off_by_what_its_model_did_not_cause_and_only_by_its_own_events():
    assert cut_off(turn(("turn_ended", {"stop_reason": "end_turn"}))) is None  # an earlier turn's kill is not this one's
    assert cut_off(turn(("hands_died", {"exit_code": 3, "how": "exit code 3"}))) is None
    assert cut_off(turn(("hands_timeout", {"action": "replaced"}))) is None
    assert cut_off(turn(("turn_ended", {"stop_reason": "max_tokens"}))) is None  # graded: a failure, `stopped: ...`
    assert cut_off(turn(("resumed", {}), ("interrupted", {"by": "eval"}))).startswith("the process running the turn died")
    assert cut_off(turn(("interrupted", {"by": "shutdown"}))) == "the turn was interrupted (by shutdown)"
    assert cut_off(turn(("turn_failed", {"error": "RuntimeError: x"}))) == "the harness failed: RuntimeError: x"
    assert cut_off(turn(("model_error", {"error": "overloaded", "status": 529, "attempts": 5}))) == \
        "the model call failed (529) after 5 attempt(s): overloaded"
    assert cut_off(turn(("hands_died", {"signal": 9, "how": "signal SIGKILL"}))) == \
        "the kernel was killed from outside (signal SIGKILL)"
    # a call whose kernel never started (a gateway that did not connect it within its startup timeout, on a loaded
    # machine: it failed an attempt of test_cli_resume, graded on the agent's answer "KernelStartError: ...")
    start = {"outputs": [], "error": {"ename": "KernelStartError", "evalue": "the kernel could not start: Timeout during request"}}
    assert cut_off(turn(("tool_result", {"tool_use_id": "t", "is_error": True, "observation": start}))) == \
        "the agent's kernel could not start: the kernel could not start: Timeout during request"
    # the agent's own code raising an exception of that name ran in a kernel (it has a generation): graded
    raised = {"outputs": [{"output_type": "error", "ename": "KernelStartError", "evalue": "mine", "traceback": []}],
              "error": {"ename": "KernelStartError", "evalue": "mine", "traceback": []}, "generation": 1}
    assert cut_off(turn(("tool_result", {"tool_use_id": "t", "is_error": True, "observation": raised}))) is None
    assert cut_off(turn(("tool_result", {"tool_use_id": "t", "observation": {**start, "error": {"ename": "ValueError"}}}))) is None
    assert cut_off(turn(("tool_result", {"tool_use_id": "t", "observation": "not an object"}))) is None
    assert cut_off(turn(("tool_result", {"tool_use_id": "t", "observation": {"error": ["not", "an", "object"]}}))) is None
    assert verdict_error({"passed": False, "details": {"error": "not checked: x"}}) == "the verifier could not run: not checked: x"
    assert verdict_error({"passed": False, "details": {"copy_notes": []}}) is None


def test_errors_stay_out_of_the_pass_rate_and_are_counted_beside_it(capsys):
    def row(task, outcome, tries=1, model="m"):
        graded = outcome in ("pass", "fail")
        return {**dict.fromkeys(COLUMNS), "run": "r", "task": task, "model": model, "epoch": 1, "outcome": outcome,
                "passed": (outcome == "pass") if graded else None, "score": (1.0 if outcome == "pass" else 0.0) if graded
                else None, "turns": 1, "tool_calls": 0, "input_tokens": 10, "output_tokens": 1, "cost": 0.25,
                "wall_s": 1.0, "session_id": f"s-{task}-{tries}", "reason": "error: x" if outcome == "error" else outcome,
                "tries": tries}
    rows = [row("a", "pass", 2), row("b", "fail"), row("c", "error", 3), row("d", "pass"), row("e", None)]
    # the latest try of each attempt is its row
    assert [r["session_id"] for r in latest_tries([row("a", "error", 1), *rows])] == [r["session_id"] for r in rows]
    df = frame(rows)
    (s,) = summary(df)
    assert (s["n"], s["passed"], s["rate"], s["errors"], s["retried"]) == (3, 2, 2 / 3, 1, 3)
    assert (s["low"], s["high"]) == wilson(2, 3) and s["cost"] == 1.0  # the finished attempts' cost, errors' too
    print_summary(df)
    out = capsys.readouterr().out
    assert "errors" in out and "retried" in out
    (line,) = [x for x in out.splitlines() if x.startswith("m ")]
    assert line.split()[1:6] == ["2/3", "67%", f"{wilson(2, 3)[0]:.0%}–{wilson(2, 3)[1]:.0%}", "1", "3"], line
    html = report_html(df)
    assert html.count("⚠") == 1 and html.count("✓") == 2 and html.count("✗") == 1 and html.count("…") == 1
    assert "epoch 1, try 3: error: x" in html
    (only_errors,) = summary(frame([row("c", "error", 3, model="other")]))
    assert only_errors["n"] == 0 and only_errors["rate"] != only_errors["rate"] and only_errors["errors"] == 1
    print_summary(frame([row("c", "error", 3, model="other")]))
    assert "other" in capsys.readouterr().out  # a model with no graded attempt: a rate of "-", not a crash


def test_a_grading_model_that_fails_or_does_not_answer_the_json_is_an_error_not_a_verdict(tmp_path):
    import asyncio

    from workbench.brain.models.scripted import ScriptedModel
    from workbench.evals.verify import rubric_verdict

    task = Task("r", "q", Verifier.graded('says "x"'))

    def broken(request):
        raise RuntimeError("the grader fell over")

    chatty = ScriptedModel(lambda request: Reply(text="I think it passed."), name="g")
    for model, words in ((chatty, "did not answer with the JSON"), (ScriptedModel(broken, name="g"),
                                                                    "the grading model failed: RuntimeError")):
        v = asyncio.run(rubric_verdict(model, task, "x", tmp_path))
        assert v.passed is False and words in v.details["error"] and words in v.explanation, v
        assert verdict_error(v.to_json()).startswith("the verifier could not run: ")
    good = asyncio.run(rubric_verdict(ScriptedModel(grader, name="g"), task, "it says x", tmp_path))
    assert good.passed and "error" not in good.details
