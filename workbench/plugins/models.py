"""Models for plugins: a reply assembled from a stream, the scripted model's parts (offline scripts of a
plugin's own), the model a host uses by default, and a session's turn read from its events."""

from __future__ import annotations

from ..brain.models import MessageBuilder, ModelMaker, default_model_name
from ..brain.models.base import FatalModelError
from ..brain.models.scripted import Reply, Script, ScriptedModel, last_tool_output, position, user_text
from ..brain.request import turn_state

__all__ = ["FatalModelError", "MessageBuilder", "ModelMaker", "Reply", "Script", "ScriptedModel", "default_model_name",
           "last_tool_output", "position", "turn_state", "user_text"]
