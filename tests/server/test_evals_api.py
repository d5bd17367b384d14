"""The eval routes on an in-process Jupyter server: a run started over REST, followed to its end,
hostile bodies refused with a 400 that writes nothing, an unknown run a 404."""

from __future__ import annotations

import asyncio
import json

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
