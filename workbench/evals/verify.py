"""Verifiers: grading an attempt where the agent cannot reach.

A **python** verifier is `python_verdict` (workbench/hands/verdict.py, offered to plugins by
`workbench.plugins.hands`; delegate checks use it too): the check runs in fresh hands of its own
over a copy of the agent's workspace taken while the agent's kernel is stopped.

A **rubric** verifier is a second model call with its own prompt (the rubric, the task,
the final answer and the workspace's file list); the grading model answers with JSON.
Both give a `Verdict`: passed, a score in [0, 1] and an explanation.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

from ..plugins.hands import Verdict, clip, list_files, score_of
from ..plugins.models import MessageBuilder
from ..plugins.settings import parse_constant
from .tasks import Task

MAX_LISTED_FILES = 200
MAX_LISTED_ENTRIES = 2_000  # entries walked to list the files for a grading model


# -- rubric verifiers ---------------------------------------------------------------------

GRADER_SYSTEM = (
    "You grade the work of an AI agent against a rubric. Judge only what is shown. Reply with one JSON object "
    'and nothing else: {"passed": true|false, "score": a number from 0 to 1, "explanation": "one or two sentences"}.'
)
JSON_OBJECT = re.compile(r"\{.*\}", re.S)


def listing(workspace: Path) -> str:
    """The workspace's files with their sizes (at most MAX_LISTED_FILES; links never followed), for the grading model."""
    if not workspace.is_dir():
        return "(no files)"
    entries, cut = list_files(workspace, MAX_LISTED_ENTRIES)
    files = [f for f in entries if f["type"] == "file"]
    rows = [f"{f['path']} ({f['bytes']} bytes)" for f in files[:MAX_LISTED_FILES]]
    if cut or len(files) > MAX_LISTED_FILES:
        rows.append("…")
    return "\n".join(rows) or "(no files)"


def grader_request(task: Task, answer: str, files: str, model: str) -> dict[str, Any]:
    """The grading model's request: its own system prompt, the rubric, the task, the answer and the files."""
    text = (f"<rubric>\n{task.verifier.rubric}\n</rubric>\n\n<task>\n{task.prompt}\n</task>\n\n"
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


async def rubric_verdict(model: Any, task: Task, answer: str, workspace: Path) -> Verdict:
    """Ask the grading model; the request and its reply are in the verdict's details (and so in the log)."""
    t0 = time.perf_counter()
    files = await asyncio.to_thread(listing, workspace)
    request = grader_request(task, answer, files, model.name)  # the model sends the API its own name
    builder = MessageBuilder()
    try:
        async for ev in model.stream(request):
            builder.feed(ev)
        message = builder.result()
    except Exception as e:  # the grader's failure is this verdict's (an error: no verdict), never the run's
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
