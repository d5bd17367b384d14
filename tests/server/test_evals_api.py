"""The eval routes on an in-process Jupyter server: a run started over REST, followed to its end,
hostile bodies refused with a 400 that writes nothing, an unknown run a 404."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from tornado.httpclient import HTTPClientError

from workbench.evals import Task, TaskLimits, Verifier, task_to_json

SQUARE = Task("sq", "What is 3 squared?", Verifier.python("assert answer.strip() == '9', 'not 9'"), limits=TaskLimits(turns=1),
              scripted=({"code": ["print(3 * 3)"], "answer": "{output}"},))


async def call(jp_fetch, method, path, body=None):
    try:
        r = await jp_fetch("workbench", "api", *path.split("/"), method=method,
                           body=None if body is None else json.dumps(body), raise_error=True)
        return r.code, json.loads(r.body)
    except HTTPClientError as e:
        return e.code, json.loads(e.response.body) if e.response is not None and e.response.body else {}


async def test_a_run_over_rest(jp_fetch):
    code, started = await call(jp_fetch, "POST", "evals", {"tasks": [task_to_json(SQUARE)], "models": ["scripted:eval"],
                                                          "epochs": 2, "run": "rest-run"})
    assert code == 202 and started == {"run": "rest-run", "state": "running", "total": 2, "models": ["scripted:eval"],
                                       "parallel": 4}
    for _ in range(600):
        code, st = await call(jp_fetch, "GET", "evals/rest-run")
        if st["state"] != "running":
            break
        await asyncio.sleep(0.2)
    assert st["state"] == "done" and st["finished"] == 2 and all(r["passed"] for r in st["results"])
    code, runs = await call(jp_fetch, "GET", "evals")
    assert [r["run"] for r in runs["runs"]] == ["rest-run"] and runs["runs"][0]["finished"] == 2
    assert (await call(jp_fetch, "POST", "evals/rest-run/interrupt", {}))[1] == {"run": "rest-run", "interrupted": False}
    # the same run again: nothing to do, nothing run twice
    code, _ = await call(jp_fetch, "POST", "evals", {"tasks": [task_to_json(SQUARE)], "models": ["scripted:eval"],
                                                     "epochs": 2, "run": "rest-run"})
    assert code == 202
    changed = {**task_to_json(SQUARE), "prompt": "What is 4 squared?"}
    code, err = await call(jp_fetch, "POST", "evals", {"tasks": [changed], "models": ["scripted:eval"], "run": "rest-run"})
    assert code == 400 and "different version" in err["error"]


async def test_a_status_read_while_the_run_ends_says_running_until_its_rows_are_all_there(jp_fetch, jp_serverapp,
                                                                                         monkeypatch):
    """A run that ends while its rows are read is still running in that answer: `done` only beside rows read after
    its end (a report read under load said `done` beside rows from before its last try)."""
    from workbench.evals import routes

    plugin = jp_serverapp.web_app.settings["workbench_runtime"].host.plugin("evals")
    real = routes.result_rows

    def rows_then_the_end(log, run_id):  # the rows as they are, handed back only once the run has ended
        rows = real(log, run_id)
        deadline = time.monotonic() + 120
        while not plugin.running[run_id][1].done() and time.monotonic() < deadline:
            time.sleep(0.05)
        return rows

    monkeypatch.setattr(routes, "result_rows", rows_then_the_end)
    code, _ = await call(jp_fetch, "POST", "evals", {"tasks": [task_to_json(SQUARE)], "models": ["scripted:eval"],
                                                    "epochs": 2, "run": "ending-run"})
    assert code == 202
    code, st = await call(jp_fetch, "GET", "evals/ending-run")
    assert code == 200 and plugin.running["ending-run"][1].done()
    assert st["state"] == "running", st
    monkeypatch.undo()
    code, st = await call(jp_fetch, "GET", "evals/ending-run")
    assert (st["state"], st["finished"]) == ("done", 2), st


async def test_hostile_bodies_are_refused_and_write_nothing(jp_fetch):
    good = task_to_json(SQUARE)
    bad = [
        {"tasks": [good], "models": []},
        {"tasks": [good], "models": ["no-such-model"]},
        {"tasks": [], "models": ["scripted:eval"]},
        {"tasks": [{**good, "files": {"../x": "y"}}], "models": ["scripted:eval"]},
        {"tasks": [{**good, "files": {"x": {"path": "/etc/passwd"}}}], "models": ["scripted:eval"]},
        {"tasks": [good], "models": ["scripted:eval"], "epochs": 0},
        {"tasks": [good], "models": ["scripted:eval"], "epochs": 1.5},
        {"tasks": [good], "models": ["scripted:eval"], "parallel": 10**6},
        {"tasks": [good], "models": ["scripted:eval"], "run": "../x"},
        {"tasks": [good], "models": ["scripted:eval"], "unknown": 1},
        {"tasks": [{**good, "prompt": "<script>alert(1)</script>" * 20_000}], "models": ["scripted:eval"]},
        {"tasks": "nope", "models": ["scripted:eval"]},
    ]
    for body in bad:
        code, err = await call(jp_fetch, "POST", "evals", body)
        assert code == 400, (body if len(str(body)) < 300 else str(body)[:300], code, err)
        assert err["error"]
    assert (await call(jp_fetch, "GET", "evals"))[1] == {"runs": []}
    assert (await call(jp_fetch, "GET", "sessions"))[1]["sessions"] == []
    assert (await call(jp_fetch, "GET", "evals/nope"))[0] == 404


async def raw(jp_fetch, body: bytes):
    try:
        r = await jp_fetch("workbench", "api", "evals", method="POST", body=body, raise_error=True)
        return r.code, json.loads(r.body)
    except HTTPClientError as e:
        return e.code, json.loads(e.response.body) if e.response is not None and e.response.body else {}


async def test_hostile_bytes_are_refused_with_json_and_write_nothing(jp_fetch):
    """What `workbench eval` beside a server sends is bytes a client made: every malformed kind is a 4xx with JSON."""
    from workbench.evals.routes import MAX_EVAL_BODY_BYTES

    good = json.dumps(task_to_json(SQUARE)).encode()
    models = b'"models": ["scripted:eval"]'
    deep = b"[" * 1000 + b"]" * 1000
    cases = [
        (b'{"tasks": [' + good, 400, "JSON"),  # cut off
        (b"not json at all", 400, "JSON"),
        (b'{"tasks": [' + good + b'], ' + models + b', "epochs": 1,}', 400, "JSON"),  # trailing comma
        (b'{"tasks": [' + good.replace(b'"What', b'"\xff\xfeWhat') + b'], ' + models + b"}", 400, "UTF-8"),
        (b'{"tasks": [' + good.replace(b'"What', b'"\\ud800What') + b'], ' + models + b"}", 400, "surrogate"),
        (b'{"tasks": [' + good + b'], ' + models + b', "epochs": NaN}', 400, "NaN"),
        (b'{"tasks": [' + good + b'], ' + models + b', "parallel": Infinity}', 400, "JSON"),
        (b'{"tasks": [' + good + b'], ' + models + b', "epochs": 1e309}', 400, ""),
        (b'{"tasks": [' + good.replace(b'"timeout": 120.0', b'"timeout": NaN') + b'], ' + models + b"}", 400, "NaN"),
        (b'{"tasks": ' + deep + b", " + models + b"}", 400, "deeper than"),
        (b'{"tasks": [' + good[:-1] + b', "limits": {"turns": ' + deep + b"}}], " + models + b"}", 400, "deeper than"),
        (b'{"tasks": [' + good[:-1] + b', "extra": 1}], ' + models + b"}", 400, "unknown task field"),
        (b'{"tasks": [' + good + b'], ' + models + b', "epochs": "2"}', 400, "epochs"),
        (b'{"tasks": [' + good + b'], ' + models + b', "epochs": true}', 400, "epochs"),
        (b'{"tasks": [' + good + b'], "models": "scripted:eval"}', 400, "models"),
        (b"[]", 400, ""),
        # over the documented limit: read and dropped, a 413
        (b'{"tasks": [{"id": "big", "prompt": "' + b"x" * (MAX_EVAL_BODY_BYTES + 1) + b'"}], ' + models + b"}", 413,
         f"{MAX_EVAL_BODY_BYTES:,}"),
    ]
    for body, status, words in cases:
        code, err = await raw(jp_fetch, body)
        assert code == status, (body[:200], code, err)
        assert isinstance(err.get("error"), str) and words in err["error"], (body[:200], err)
    assert (await call(jp_fetch, "GET", "evals"))[1] == {"runs": []}
    assert (await call(jp_fetch, "GET", "sessions"))[1]["sessions"] == []


# Tasks that start no kernel: answers without code, graded by a rubric. `greet` is graded by the offline grader, so the
# default scripted model (which answers with what it is) fails it; `explain` is graded by the attempt's own model,
# and the default scripted model answers the grading request with no JSON: no verdict, an error (tried again).
CHEAP = [Task("greet", "Greet me.", Verifier.graded('The answer says "hi there".', model="scripted:grader"),
              limits=TaskLimits(turns=1), scripted=({"answer": "Well, hi there."},)),
         Task("explain", "Why is the median robust?", Verifier.graded('It depends on the "middle" value.'),
              limits=TaskLimits(turns=1), scripted=({"answer": "Only the middle value counts."},))]


@pytest.fixture
def jp_server_config(jp_server_config, monkeypatch):
    """This module's server prices one model (the eval setting `prices`): the report says which cost is known."""
    monkeypatch.setenv("WORKBENCH_EVAL_PRICES", "scripted:eval=1000/2000")
    return jp_server_config


async def test_a_runs_report_is_what_the_report_computes_from_its_rows_with_errors_apart(jp_fetch, jp_serverapp):
    """`GET /evals/{id}/report` gives the numbers `summary` and `compare` give for the run's rows read through Python;
    the listing counts passes, failures and errors apart."""
    from workbench.evals import results
    from workbench.evals.report import summary
    from workbench.evals.stats import comparisons

    body = {"tasks": [task_to_json(t) for t in CHEAP], "models": ["scripted:eval", "scripted"], "epochs": 2,
            "run": "report-run"}
    assert (await call(jp_fetch, "POST", "evals", body))[0] == 202
    for _ in range(600):
        code, rep = await call(jp_fetch, "GET", "evals/report-run/report")
        assert code == 200, rep
        if rep["state"] != "running":
            break
        await asyncio.sleep(0.2)
    assert rep["state"] == "done" and (rep["total"], rep["finished"]) == (8, 8), rep
    assert rep["models"] == ["scripted", "scripted:eval"] and rep["tasks"] == ["explain", "greet"]
    log = jp_serverapp.web_app.settings["workbench_runtime"].host.log
    df = results(log, "report-run")
    want = summary(df)
    by = {s["model"]: s for s in rep["summary"]}
    for s in want:
        got = dict(by[s["model"]])
        assert got.pop("priced") is (s["model"] == "scripted:eval")
        assert got.keys() == s.keys()
        for k, v in s.items():
            assert (got[k] is None) if v != v else got[k] == pytest.approx(v), (s["model"], k, got[k], v)
    ours, plain = by["scripted:eval"], by["scripted"]
    assert (ours["passed"], ours["failed"], ours["errors"], ours["rate"]) == (4, 0, 0, 1.0)
    assert (plain["passed"], plain["failed"], plain["errors"], plain["retried"]) == (0, 2, 2, 4)  # errors apart
    assert ours["cost"] > 0 and plain["cost"] == 0 and ours["tokens"] == ours["input_tokens"] + ours["output_tokens"]
    (pair,) = rep["comparisons"]
    (c,) = comparisons(df)
    assert pair == {**{k: pytest.approx(v) for k, v in vars(c).items()}, "verdict": c.verdict}
    assert (pair["a"], pair["b"], pair["n"], pair["estimate"], pair["wins"]) == ("scripted", "scripted:eval", 1, 1.0, 1)
    assert [r["session_id"] for r in rep["results"]] == list(df["session_id"])
    assert sorted(r["outcome"] for r in rep["results"]) == ["error"] * 2 + ["fail"] * 2 + ["pass"] * 4
    (listed,) = (await call(jp_fetch, "GET", "evals"))[1]["runs"]
    assert {k: listed[k] for k in ("state", "total", "attempts", "finished", "passed", "failed", "errors", "retried")} \
        == {"state": "done", "total": 8, "attempts": 8, "finished": 8, "passed": 4, "failed": 2, "errors": 2, "retried": 4}


async def test_a_report_of_no_run_or_a_hostile_id_is_a_json_refusal_never_a_500(jp_fetch, http_server_client,
                                                                              jp_base_url, jp_auth_header):
    """Unknown, malformed, oversized, non-UTF-8 and script-bearing run ids, unknown query arguments and other verbs,
    sent as raw request targets (jp_fetch would escape them)."""
    cases = [("nope/report", 404), ("%3Cscript%3Ealert(1)%3C%2Fscript%3E/report", 404), ("r" * 1001 + "/report", 404),
             ("r" * 20_000 + "/report", 404), ("%FF%FE/report", 400), ("a%00b/report", 404),
             ("%F0%9F%92%A5/report", 404), ("..%2F..%2Fsessions/report", 404), ("%20/report", 404),
             ("nope/report?extra=1", 400), ("nope/report?x=%FF", 400), ("nope/report?a=1&a=2", 400)]
    for target, status in cases:
        r = await http_server_client.fetch(f"{jp_base_url}workbench/api/evals/{target}", headers=jp_auth_header,
                                           raise_error=False)
        body = json.loads(r.body)
        assert r.code == status and isinstance(body.get("error"), str) and body["error"], (target[:80], r.code, body)
    assert (await call(jp_fetch, "POST", "evals/nope/report", {}))[0] == 405
    assert (await call(jp_fetch, "GET", "evals"))[1] == {"runs": []}
