"""Scripted stand-ins for evals: `scripted:eval` solves tasks from their `scripted` solution, `scripted:grader` grades.

Both are ordinary scripts of the offline scripted model (and scripts the fake Messages API
can answer with), so a whole eval runs with no key and no network:

- `scripted:eval` finds the task by the first user message of the session (the task's
  prompt) and plays the task's `scripted` turns: each code string is one `python` call,
  then the turn's answer, in which `{output}` stands for the last call's output. Turn n of
  the session plays `scripted[n]` (the last one again when there are fewer), so a task can
  be written to fail first and pass once the verifier's explanation comes back. Asked to
  grade a rubric (the grader's system prompt), it answers as `scripted:grader`.
- `scripted:grader` grades a rubric: it passes when every "double-quoted" phrase of the
  rubric occurs in the answer (case-insensitively); the score is the fraction that does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from ..plugins.models import Reply, last_tool_output, position, user_text
from .tasks import Task
from .verify import GRADER_SYSTEM

QUOTED = re.compile(r'"([^"\n]{1,200})"')
TAG = re.compile(r"<(rubric|answer)>\n(.*?)\n</\1>", re.S)


def first_prompt(request: dict[str, Any]) -> str:
    """The text of the session's first user message: an eval attempt's task prompt."""
    for m in request.get("messages", []):
        if m.get("role") == "user":
            return user_text(m) if isinstance(m.get("content"), (str, list)) else ""
    return ""


def solver(tasks: Callable[[], Mapping[str, Task]]) -> Callable[[dict[str, Any]], Reply]:
    """The `scripted:eval` script over the tasks `tasks()` returns, by prompt."""

    def script(request: dict[str, Any]) -> Reply:
        if request.get("system") == GRADER_SYSTEM:  # the attempt's own model grading a rubric
            return grader(request)
        task = tasks().get(first_prompt(request).strip())
        if task is None or not task.scripted:
            return Reply(text="I have no scripted solution for this task.")
        turn, step, _ = position(request)
        plan = task.scripted[min(turn, len(task.scripted) - 1)]
        code = list(plan.get("code") or [])
        if step < len(code):
            return Reply(thinking="", text=f"Step {step + 1} of {len(code)}.", code=[code[step]])
        output = last_tool_output(request).strip() if code else ""
        answer = str(plan.get("answer") or "").replace("{output}", output)
        return Reply(text=answer or output or "Done.")

    return script


def grader(request: dict[str, Any]) -> Reply:
    """The `scripted:grader` script: every quoted phrase of the rubric must be in the answer."""
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
