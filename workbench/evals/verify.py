"""Verifiers: grading an attempt where the agent cannot reach.

A **python** verifier is `python_verdict` (workbench/hands/verdict.py, offered to plugins by
`workbench.plugins.hands`; delegate checks use it too): the check runs in fresh hands of its own
over a copy of the agent's workspace taken while the agent's kernel is stopped.

A **rubric** verifier is a second model call with its own prompt (the rubric, the task,
the final answer and the workspace's file list); the grading model answers with JSON
(workbench/brain/models/grading.py, offered by `workbench.plugins.models`; delegate checks use it too).
Both give a `Verdict`: passed, a score in [0, 1] and an explanation.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ..plugins.hands import Verdict, listing
from ..plugins.models import GRADER_SYSTEM, grader_request as _grader_request, parse_grade, rubric_verdict as _rubric_verdict
from .tasks import Task

__all__ = ["GRADER_SYSTEM", "grader_request", "listing", "parse_grade", "rubric_verdict"]


def grader_request(task: Task, answer: str, files: str, model: str) -> dict[str, Any]:
    """The grading model's request for a task's rubric."""
    return _grader_request(task.verifier.rubric, task.prompt, answer, files, model)


async def rubric_verdict(model: Any, task: Task, answer: str, workspace: Path) -> Verdict:
    """A task's rubric graded by `model` on the answer and the workspace's files."""
    files = await asyncio.to_thread(listing, workspace)
    return await _rubric_verdict(model, rubric=task.verifier.rubric, task=task.prompt, answer=answer, files=files)
