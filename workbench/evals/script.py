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

from collections.abc import Callable, Mapping
from typing import Any

from ..plugins.models import Reply, is_grading, last_tool_output, position, scripted_grader, user_text
from .tasks import Task


def first_prompt(request: dict[str, Any]) -> str:
    """The text of the session's first user message: an eval attempt's task prompt."""
    for m in request.get("messages", []):
        if m.get("role") == "user":
            return user_text(m) if isinstance(m.get("content"), (str, list)) else ""
    return ""


def solver(tasks: Callable[[], Mapping[str, Task]]) -> Callable[[dict[str, Any]], Reply]:
    """The `scripted:eval` script over the tasks `tasks()` returns, by prompt."""

    def script(request: dict[str, Any]) -> Reply:
        if is_grading(request):  # the attempt's own model grading a rubric
            return scripted_grader(request)
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


grader = scripted_grader  # `scripted:grader`: the offline grading model (workbench/brain/models/grading.py)
