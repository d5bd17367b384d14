"""The event types of the session log.

Every event the workbench writes has one of these types. `docs/events.md`
documents each one (its payload fields and when it is written); a test fails
when a type here is missing from the docs, and a log refuses a type that is not
in its `event_types`, so nothing undocumented reaches the log. A plugin that
writes events of its own gives the log `{**EVENT_TYPES, **its_types}` (and
documents them); EVENT_TYPES itself is read-only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any

# a session id a client may choose, and the id a memory's provenance or a dream's actor cites: safe as it is
# in a URL path, a prompt and HTML (sessions the workbench names itself use hex digits)
SESSION_ID = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}$"
_SESSION_ID = re.compile(SESSION_ID[1:-1])


def is_session_id(value: Any) -> bool:
    """Whether value has the form of SESSION_ID (all of it: no trailing newline either)."""
    return isinstance(value, str) and _SESSION_ID.fullmatch(value) is not None

EVENT_TYPES: Mapping[str, str] = MappingProxyType({
    # conversation
    "session_created": "a session was created: its frozen system prompt, tools, model and config",
    "user_message": "a person (or a script) sent text to the agent; starts a turn",
    "model_request": "the brain sent a request to the model",
    "model_retry": "a model call failed with a retryable error and will be retried",
    "model_error": "a model call failed for good; the turn stops",
    "assistant_turn": "a finished model response, stored verbatim, with usage and latency",
    "tool_started": "the brain started running a tool call",
    "tool_result": "a tool call finished (or was interrupted); what goes back to the model",
    "turn_ended": "the turn is over, with its stop reason",
    "turn_failed": "the harness failed during the turn (a bug or data it could not handle); the turn was closed",
    "interrupted": "a person interrupted the running turn or tool call",
    "resumed": "an interrupted turn was picked up again from the log",
    # managing sessions
    "session_renamed": "the session's title was set, by a person or automatically from its first message",
    "session_archived": "the session was archived (hidden from listings by default) or unarchived",
    # hands
    "hands_started": "a kernel for this session's hands is ready (generation, timings)",
    "hands_died": "the kernel died (exit code or signal); its in-memory state is gone",
    "hands_restarted": "the hands were replaced by a fresh kernel on request",
    "hands_timeout": "a tool call ran past its timeout and was interrupted or its kernel replaced",
    "hands_replayed": "after a kernel death, replayable earlier calls were re-run in the new kernel",
    "hands_stopped": "the session's kernel was shut down",
    "hands_refused": "model code was not run because no safe sandbox is available",
    # files
    "file_attached": "a person put a file (or a notebook variable) into the session's workspace: name, path, bytes, sha256, kind",
    # egress
    "egress_allowed": "the egress proxy let a request from the hands through",
    "egress_denied": "the egress proxy refused a request from the hands, with the reason",
    # the one exception to append-only
    "redacted": "a tombstone: copies of a redacted text were removed from this session's earlier events (who, why, which seqs)",
    # memory
    "memories_injected": "accepted memories were put into this session's frozen system prompt",
    "dream_read": "a dream session recorded which events of other sessions it has read",
    "memory_proposed": "a dream proposed a memory (new, edit, merge or retire), with provenance",
    # delegation
    "delegate_checked": "a delegated child's check ran in fresh hands against a copy of its workspace: the verdict",
})


@dataclass(frozen=True)
class Event:
    """One committed event of a session."""

    session_id: str
    seq: int
    ts: datetime
    type: str
    payload: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The event as a JSON-ready dict (the export format)."""
        return {
            "session_id": self.session_id,
            "seq": self.seq,
            "ts": self.ts.isoformat(),
            "type": self.type,
            "payload": self.payload,
        }
