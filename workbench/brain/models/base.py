"""The Model protocol and the Messages-API stream format both sides share.

A model turns a request (a Messages API request body, as a dict) into an
async iterator of stream events (dicts shaped like the API's SSE events).
`MessageBuilder` folds those events back into the finished message, keeping
every content block exactly as it arrived; `message_events` does the reverse
for models that know the whole answer up front (the scripted model, the fake
API server).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

from ...strictnum import parse_constant, parse_float, parse_int

THINKING = ("adaptive", "disabled")  # what a session's config may set `thinking` to
EFFORTS = ("low", "medium", "high", "xhigh", "max")  # and `effort`


@runtime_checkable
class Model(Protocol):
    """Something that answers Messages API requests with stream events."""

    name: str

    def stream(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Stream the response to `request` as Messages-API stream events."""
        ...


class RetryableError(Exception):
    """A model call failed in a way that a retry may fix (overloaded, 429, 5xx)."""

    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class FatalModelError(Exception):
    """A model call failed in a way a retry will not fix (400, 401, ...)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class MessageBuilder:
    """Folds stream events into the finished message, blocks kept as received."""

    def __init__(self) -> None:
        self.message: dict[str, Any] | None = None
        self._json: dict[int, str] = {}

    def feed(self, ev: dict[str, Any]) -> None:
        t = ev.get("type")
        if t == "message_start":
            self.message = dict(ev["message"])
            self.message["content"] = list(self.message.get("content") or [])
            return
        if t not in ("content_block_start", "content_block_delta", "content_block_stop", "message_delta"):
            return  # ping, message_stop and event types added later carry nothing to keep
        if self.message is None:  # a broken stream is the model's failure, as in result()
            raise FatalModelError(f"the model's stream sent {t} before message_start")
        message = self.message
        if t == "content_block_start":
            blocks = message["content"]
            while len(blocks) <= ev["index"]:
                blocks.append(None)
            blocks[ev["index"]] = dict(ev["content_block"])
        elif t == "content_block_delta":
            block, d = message["content"][ev["index"]], ev["delta"]
            dt = d.get("type")
            if dt == "text_delta":
                block["text"] = block.get("text", "") + d["text"]
            elif dt == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + d["thinking"]
            elif dt == "signature_delta":
                block["signature"] = block.get("signature", "") + d["signature"]
            elif dt == "input_json_delta":
                self._json[ev["index"]] = self._json.get(ev["index"], "") + d["partial_json"]
            elif dt == "compaction_delta":  # a compaction block's summary (and opaque state), kept as sent
                for key in ("content", "encrypted_content"):
                    if d.get(key) is not None:
                        block[key] = (block.get(key) or "") + d[key]
            elif dt == "citations_delta":
                block.setdefault("citations", []).append(d["citation"])
        elif t == "content_block_stop":
            i = ev["index"]
            if i in self._json:
                message["content"][i]["input"] = _tool_input(message["content"][i], self._json.pop(i))
        elif t == "message_delta":
            for k, v in (ev.get("delta") or {}).items():
                message[k] = v
            if ev.get("usage"):
                usage = dict(message.get("usage") or {})
                usage.update({k: v for k, v in ev["usage"].items() if v is not None})
                message["usage"] = usage

    def result(self) -> dict[str, Any]:
        if self.message is None:
            raise FatalModelError("the model's stream ended before message_start")
        self.message["content"] = [b for b in self.message["content"] if b is not None]
        return self.message


def _tool_input(block: dict[str, Any], raw: str) -> Any:
    """A tool call's streamed input JSON; its numbers are bounded like any from outside (the log keeps integers of
    64 bits, finite floats), and what cannot be read is the model's failure, not the harness's."""
    if not raw.strip():
        return {}
    try:
        return json.loads(raw, parse_int=parse_int, parse_float=parse_float, parse_constant=parse_constant)
    except (ValueError, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else str(e)[:200]
        raise FatalModelError(f"the model's input for tool call {str(block.get('id'))[:100]} is not JSON the workbench "
                              f"can keep: {why}") from None


def message_events(message: dict[str, Any], *, chunk: int = 24) -> list[dict[str, Any]]:
    """The stream events that deliver `message`, deltas cut into small chunks."""
    start = {k: v for k, v in message.items() if k not in ("content", "stop_reason", "stop_sequence", "stop_details")}
    start.update(content=[], stop_reason=None, stop_sequence=None)
    usage = message.get("usage") or {}
    start["usage"] = {"input_tokens": usage.get("input_tokens", 0), "output_tokens": 1}
    evs: list[dict[str, Any]] = [{"type": "message_start", "message": start}]

    def deltas(i: int, kind: str, key: str, s: str) -> list[dict[str, Any]]:
        return [{"type": "content_block_delta", "index": i, "delta": {"type": kind, key: s[j : j + chunk]}}
                for j in range(0, len(s), chunk)]

    for i, block in enumerate(message["content"]):
        bt = block["type"]
        if bt == "text":
            evs.append({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}})
            evs += deltas(i, "text_delta", "text", block["text"])
        elif bt == "thinking":
            evs.append({"type": "content_block_start", "index": i, "content_block": {"type": "thinking", "thinking": ""}})
            evs += deltas(i, "thinking_delta", "thinking", block["thinking"])
            evs.append({"type": "content_block_delta", "index": i, "delta": {"type": "signature_delta", "signature": block["signature"]}})
        elif bt == "tool_use":
            head = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            evs.append({"type": "content_block_start", "index": i, "content_block": head})
            evs += deltas(i, "input_json_delta", "partial_json", json.dumps(block["input"]))
        elif bt == "compaction" and block.get("content") is not None:  # the summary comes as a delta
            evs.append({"type": "content_block_start", "index": i, "content_block": {**block, "content": None}})
            evs.append({"type": "content_block_delta", "index": i, "delta": {"type": "compaction_delta", "content": block["content"]}})
        else:  # redacted_thinking and anything else arrive whole
            evs.append({"type": "content_block_start", "index": i, "content_block": block})
        evs.append({"type": "content_block_stop", "index": i})
    delta = {"stop_reason": message.get("stop_reason"), "stop_sequence": message.get("stop_sequence")}
    if message.get("stop_details") is not None:
        delta["stop_details"] = message["stop_details"]
    evs.append({"type": "message_delta", "delta": delta, "usage": {"output_tokens": usage.get("output_tokens", 0)}})
    evs.append({"type": "message_stop"})
    return evs
