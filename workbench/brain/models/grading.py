"""A model grading work against a rubric: the one grader both eval verifiers and delegate checks use.

The grading model gets a request of its own (its system prompt, the rubric, the task, the final answer and a
listing of the workspace's files) and answers with one JSON object: passed, a score in [0, 1] and an explanation.
`rubric_verdict` makes that call and reads the reply into a `Verdict`; a failed call or a reply that is not the
JSON asked for is a verdict with `details.error` (the grader could not grade), never an exception.
`scripted_grader` is the offline grading model (`scripted:grader`): every quoted phrase of the rubric must be in
the answer.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from ...hands.verdict import Verdict, clip, score_of
from ...strictnum import parse_constant
from .base import MessageBuilder
from .scripted import Reply, user_text

GRADER_SYSTEM = (
    "You grade the work of an AI agent against a rubric. Judge only what is shown. Reply with one JSON object "
    'and nothing else: {"passed": true|false, "score": a number from 0 to 1, "explanation": "one or two sentences"}.'
)
JSON_OBJECT = re.compile(r"\{.*\}", re.S)
QUOTED = re.compile(r'"([^"\n]{1,200})"')
TAG = re.compile(r"<(rubric|answer)>\n(.*?)\n</\1>", re.S)


def grader_request(rubric: str, task: str, answer: str, files: str, model: str) -> dict[str, Any]:
    """The grading model's request: its own system prompt, the rubric, the task, the answer and the files."""
    text = (f"<rubric>\n{rubric}\n</rubric>\n\n<task>\n{task}\n</task>\n\n"
            f"<answer>\n{answer}\n</answer>\n\n<files>\n{files}\n</files>")
    return {"model": model, "max_tokens": 2000, "system": GRADER_SYSTEM, "tools": [],
            "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}


def parse_grade(text: str) -> tuple[bool, float, str] | None:
    """(passed, score, explanation) from the grading model's reply, or None when it is not the JSON asked for."""
    m = JSON_OBJECT.search(text)
    if m is None:
        return None
    try:
        v = json.loads(m.group(0), parse_constant=parse_constant)
    except (ValueError, RecursionError):
        return None
    if not isinstance(v, dict) or not isinstance(v.get("passed"), bool):
        return None
    return v["passed"], score_of(v.get("score"), v["passed"]), clip(v.get("explanation", ""))


async def rubric_verdict(model: Any, *, rubric: str, task: str, answer: str, files: str) -> Verdict:
    """Ask the grading model; the request and its reply are in the verdict's details (and so in the log)."""
    t0 = time.perf_counter()
    request = grader_request(rubric, task, answer, files, model.name)  # the model sends the API its own name
    builder = MessageBuilder()
    try:
        async for ev in model.stream(request):
            builder.feed(ev)
        message = builder.result()
    except Exception as e:  # the grader's failure is this verdict's (an error: no verdict), never the caller's
        why = f"the grading model failed: {type(e).__name__}: {clip(e, 500)}"
        return Verdict(False, 0.0, why, "rubric", {"grader": {"model": model.name, "request": request}, "error": why})
    reply = "".join(b.get("text", "") for b in message.get("content", []) if b.get("type") == "text")
    details = {"duration_ms": round((time.perf_counter() - t0) * 1000, 1),
               "grader": {"model": model.name, "request": request, "reply": clip(reply, 20_000), "usage": message.get("usage")}}
    graded = parse_grade(reply)
    if graded is None:
        why = f"the grading model did not answer with the JSON asked for: {clip(reply, 300)}"
        return Verdict(False, 0.0, why, "rubric", {**details, "error": why})
    return Verdict(*graded, "rubric", details)


def is_grading(request: dict[str, Any]) -> bool:
    """Whether a request asks a model to grade (a scripted model answers it with `scripted_grader`)."""
    return request.get("system") == GRADER_SYSTEM


def scripted_grader(request: dict[str, Any]) -> Reply:
    """The offline grading model: every quoted phrase of the rubric must be in the answer."""
    msgs = request.get("messages") or [{}]
    text = user_text(msgs[-1]) if msgs[-1].get("content") else ""
    parts = dict(TAG.findall(text))
    phrases = QUOTED.findall(parts.get("rubric", ""))
    answer = parts.get("answer", "").casefold()
    found = [p for p in phrases if p.casefold() in answer]
    missing = [p for p in phrases if p.casefold() not in answer]
    score = len(found) / len(phrases) if phrases else 0.0
    verdict = {"passed": bool(phrases) and not missing, "score": round(score, 3),
               "explanation": ("the answer has " + ", ".join(found) if not missing and phrases
                               else "the answer lacks " + ", ".join(missing) if missing
                               else "the rubric quotes no phrase to look for")}
    return Reply(text=json.dumps(verdict))
