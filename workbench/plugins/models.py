"""Models for plugins: a reply assembled from a stream, the scripted model's parts (offline scripts of a
plugin's own), the model a host uses by default, a session's turn read from its events, and a model grading
work against a rubric (eval verifiers, delegate checks)."""

from __future__ import annotations

from ..brain.models import MessageBuilder, ModelMaker, default_model_name
from ..brain.models.base import FatalModelError
from ..brain.models.grading import GRADER_SYSTEM, grader_request, is_grading, parse_grade, rubric_verdict, scripted_grader
from ..brain.models.scripted import Reply, Script, ScriptedModel, last_tool_output, position, user_text
from ..brain.request import turn_state

__all__ = ["GRADER_SYSTEM", "FatalModelError", "MessageBuilder", "ModelMaker", "Reply", "Script", "ScriptedModel", "default_model_name",
           "grader_request", "is_grading", "last_tool_output", "parse_grade", "position", "rubric_verdict",
           "scripted_grader", "turn_state", "user_text"]
