"""A fake Messages API server over real HTTP, for tests and offline demos.

It speaks the wire format the official SDK expects (`POST /v1/messages`,
JSON or SSE streaming with `message_start`, `content_block_delta` with
`text_delta` / `thinking_delta` / `signature_delta` / `input_json_delta`,
`message_delta`, `message_stop`, `ping`), answers from a script like the
scripted model, and checks requests the way the real API does:

- every earlier assistant turn must be byte-for-byte one this server sent,
  in reply to exactly the same prefix (system prompt, tools and earlier
  messages): an altered turn, an altered or re-signed thinking block, a
  dropped `redacted_thinking` block or a changed system prompt gets a 400;
- every `tool_use` must be answered by a `tool_result` in the next message;
- the context window (`context_window`, counted approximately: 4 bytes of
  JSON a token, from the latest compaction block on): a longer request gets
  the 400 the real API sends for a prompt that is too long;
- server-side compaction (`compaction=True`, as the real API with the beta
  header `compact-2026-01-12`): a `compact_20260112` edit in
  `context_management` needs that header and a trigger of at least
  `min_trigger` tokens; a request over its trigger is answered with a
  `compaction` block (a summary) before the script's reply, or alone with
  stop_reason `compaction` when `pause_after_compaction` is set; a
  compaction block must come back verbatim and first in its message, and
  everything before it is dropped (not counted, and an assistant turn after
  it is bound only to what follows it). With `compaction=False` (an endpoint
  without it) `context_management` and compaction blocks are refused.
- tool declarations: a custom tool needs its `input_schema`; the one tool of the API's own it knows,
  the client-side memory tool, is `{"type": "memory_20250818", "name": "memory"}` (and the optional
  fields of its param, nothing else) with the beta header `context-management-2025-06-27`.

Tool results are left out of the prefix an assistant turn is bound to: a
client may clear old ones (as the real API's own context editing does).

A script may be one per model (`FakeMessagesAPI({"claude-opus-5-5": a, "claude-haiku-5-5": b})`),
so two models of one run answer differently; a model it does not name gets the 404
`not_found_error` the real API sends for an unknown model.

It also serves the Models API (`GET /v1/models`, paged with `limit` and `after_id`, and
`GET /v1/models/{id}`): the models of a per-model script, else those set in `listed`; a server
whose script answers any model and that lists none has no Models API (a 404, as an
Anthropic-compatible server without one), so a client cannot check names against it.

Faults can be injected (`fail_next`, `delay`) to test retries and crashes.
Run it standalone with `python -m workbench.testing.fake_api --port 8765`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import secrets
import threading
from collections.abc import Mapping
from typing import Any

import tornado.httpserver
import tornado.ioloop
import tornado.netutil
import tornado.web

from ..brain.models.base import message_events
from ..brain.models.scripted import BUILTIN_SCRIPTS, Reply, steps_script


def _canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


COMPACT_BETA = "compact-2026-01-12"
MEMORY_TOOL = "memory_20250818"
MEMORY_BETA = "context-management-2025-06-27"
# what a memory tool's param may hold besides type and name (the SDK's MemoryTool20250818Param)
MEMORY_PARAM = frozenset({"type", "name", "cache_control", "defer_loading", "strict", "allowed_callers", "input_examples"})


def _bound(message: dict[str, Any]) -> Any:
    """What of a message an assistant turn after it is bound to: all but the content of tool results."""
    content = message.get("content")
    if isinstance(content, list):
        content = [{**b, "content": None} if isinstance(b, dict) and b.get("type") == "tool_result" else b for b in content]
    return [message.get("role"), content]


def _prefix_hashes(request: dict[str, Any], start: int) -> list[str]:
    """h[k]: the hash of system, tools and messages[start:start + k], chained (linear in the request)."""
    h = hashlib.sha256(_canon([request.get("system"), request.get("tools")]).encode()).hexdigest()
    out = [h]
    for m in request["messages"][start:]:
        h = hashlib.sha256((h + _canon(_bound(m))).encode()).hexdigest()
        out.append(h)
    return out


def _compaction_at(msgs: list[dict[str, Any]]) -> int | None:
    """Index of the latest assistant message with a compaction block."""
    for i in range(len(msgs) - 1, -1, -1):
        m = msgs[i]
        if m.get("role") == "assistant" and any(b.get("type") == "compaction" for b in _content_list(m.get("content")) or []
                                                if isinstance(b, dict)):
            return i
    return None


def count_tokens(req: dict[str, Any]) -> int:
    """The request's input tokens as this server counts them: 4 bytes of JSON a token, from the latest
    compaction block on (the API drops what came before it)."""
    msgs = req.get("messages") or []
    c = _compaction_at(msgs)
    counted: list[Any] = [req.get("system"), req.get("tools")]
    if c is None:
        counted.append(msgs)
    else:
        content = _content_list(msgs[c]["content"])
        first = next(j for j, b in enumerate(content) if b.get("type") == "compaction")
        counted += [content[first:], msgs[c + 1:]]
    return len(_canon(counted).encode()) // 4


def _content_list(content: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


class FakeMessagesAPI:
    """A Messages API on 127.0.0.1 that answers from a script and checks what it is sent."""

    def __init__(self, script: Any = "default", *, port: int = 0, chunk_delay: float = 0.0, key: bytes | None = None,
                 context_window: int = 1_000_000, compaction: bool = True, min_trigger: int = 50_000):
        self.use(script)
        self.context_window = context_window  # tokens, counted by count_tokens
        self.compaction = compaction  # whether this endpoint offers server-side compaction
        self.min_trigger = min_trigger  # the smallest compaction trigger it takes
        self.compactions = 0  # compaction blocks sent
        self.port = port
        self.chunk_delay = chunk_delay
        self.delay = 0.0  # seconds before the response starts
        # signs thinking blocks; unknown to clients (a fixed key makes recordings repeatable byte for byte)
        self.key = key or secrets.token_bytes(16)
        self.requests: list[dict[str, Any]] = []
        self.rejections: list[str] = []
        self._sent: dict[str, set[str]] = {}  # content hash -> prefix hashes it answered
        self._faults: list[tuple[int, str, bool]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: tornado.ioloop.IOLoop | None = None
        self._ready = threading.Event()
        self.model_lists = 0  # GET /v1/models requests answered (a client that caches asks once)
        self.listed: tuple[str, ...] | None = None  # what the Models API lists when the script answers any model

    # -- control ---------------------------------------------------------------

    def use(self, script: Any) -> FakeMessagesAPI:
        """Answer from now on with `script`: a script name, a callable(request) -> Reply, a list of Reply, or a
        mapping of model names to any of these (then a model it does not name is unknown: a 404)."""
        if isinstance(script, Mapping):
            if not script or not all(isinstance(name, str) and name for name in script):
                raise ValueError("a script per model maps model names (non-empty strings) to scripts")
            per_model = {name: _script(s) for name, s in script.items()}
            self.models: frozenset[str] | None = frozenset(per_model)
            self.script = lambda request: per_model[request["model"]](request)
        else:
            self.models = None  # any model name is answered
            self.script = _script(script)
        return self

    def model_ids(self) -> list[str] | None:
        """What the Models API lists: the models of a per-model script, else `listed`; None: no Models API."""
        if self.models is not None:
            return sorted(self.models)
        return list(self.listed) if self.listed is not None else None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail_next(self, status: int = 529, times: int = 1, error_type: str | None = None, midstream: bool = False) -> None:
        """Make the next `times` requests fail with `status` (or a mid-stream error event)."""
        etype = error_type or {529: "overloaded_error", 429: "rate_limit_error", 400: "invalid_request_error"}.get(status, "api_error")
        with self._lock:
            self._faults.extend([(status, etype, midstream)] * times)

    def start(self) -> FakeMessagesAPI:
        sockets = tornado.netutil.bind_sockets(self.port, "127.0.0.1")
        self.port = sockets[0].getsockname()[1]

        def run() -> None:
            asyncio.set_event_loop(asyncio.new_event_loop())
            self._loop = tornado.ioloop.IOLoop.current()
            app = tornado.web.Application(
                [(r"/v1/messages", _MessagesHandler, {"api": self}), (r"/v1/models", _ModelsHandler, {"api": self}),
                 (r"/v1/models/([^/]+)", _ModelsHandler, {"api": self})], log_function=lambda handler: None
            )
            server = tornado.httpserver.HTTPServer(app)
            server.add_sockets(sockets)
            self._ready.set()
            self._loop.start()
            server.stop()
            self._loop.close(all_fds=True)

        self._thread = threading.Thread(target=run, name="fake-messages-api", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.add_callback(self._loop.stop)
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> FakeMessagesAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the API's rules -------------------------------------------------------

    def check(self, req: dict[str, Any], betas: tuple[str, ...] | None = None) -> str | None:
        """Why the real API would reject this request, or None (`betas`: the anthropic-beta header's values;
        None: the header is not checked)."""
        for field in ("model", "max_tokens", "messages"):
            if field not in req:
                return f"{field}: Field required"
        msgs = req["messages"]
        if not isinstance(msgs, list) or not msgs:
            return "messages: at least one message is required"
        problem = self._check_context(req, betas) or _check_tools(req.get("tools"), betas)
        if problem:
            return problem
        c = _compaction_at(msgs)
        chains: dict[int, list[str]] = {}
        thinking = req.get("thinking") or {}
        if thinking.get("type") == "enabled":
            budget = thinking.get("budget_tokens", 0)
            if budget < 1024 or budget >= req["max_tokens"]:
                return "thinking.budget_tokens: must be >= 1024 and less than max_tokens"
            if (req.get("tool_choice") or {}).get("type") in ("any", "tool"):
                return "Thinking may not be enabled when tool_choice forces tool use."
        for i, m in enumerate(msgs):
            if m.get("role") not in ("user", "assistant"):
                return f"messages.{i}.role: Input should be 'user' or 'assistant'"
            content = _content_list(m.get("content"))
            if not content:
                return f"messages.{i}: all messages must have non-empty content"
            if m["role"] != "assistant":
                continue
            for j, b in enumerate(content):
                if b.get("type") == "thinking" and not hmac_ok(self.key, b):
                    return f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
                if b.get("type") == "compaction" and j != 0:
                    return f"messages.{i}.content.{j}: a `compaction` block must be the first block of its message"
            h = hashlib.sha256(_canon(content).encode()).hexdigest()
            prefixes = self._sent.get(h)
            if prefixes is None:
                return (
                    f"messages.{i}.content: `thinking` or `redacted_thinking` blocks in the latest assistant "
                    "message cannot be modified. These blocks must remain as they were in the original response."
                    if any(b.get("type") in ("thinking", "redacted_thinking") for b in content)
                    else f"messages.{i}: this assistant turn is not one the model produced (it was altered)"
                )
            if c is None or i > c:  # a compaction's own turn is bound to nothing: what came before it is dropped
                start = 0 if c is None else c
                chain = chains.get(start) or chains.setdefault(start, _prefix_hashes(req, start))
                if chain[i - start] not in prefixes:
                    return f"messages.{i}.content.0: The block is bound to a different conversation (the prefix before it changed)"
            uses = [b["id"] for b in content if b.get("type") == "tool_use"]
            if uses:
                nxt = _content_list(msgs[i + 1]["content"]) if i + 1 < len(msgs) else []
                answered = {b.get("tool_use_id") for b in nxt if b.get("type") == "tool_result"}
                missing = [u for u in uses if u not in answered]
                if missing and i + 1 < len(msgs):
                    return f"messages.{i + 1}: tool_use ids were found without tool_result blocks immediately after: {', '.join(missing)}"
        return None

    def _check_context(self, req: dict[str, Any], betas: tuple[str, ...] | None) -> str | None:
        """The context window and the compaction rules."""
        cm = req.get("context_management")
        msgs = req["messages"]
        has_block = _compaction_at(msgs) is not None
        if (cm is not None or has_block) and not self.compaction:
            return ("context_management: Extra inputs are not permitted" if cm is not None
                    else "messages: `compaction` blocks are not supported by this endpoint")
        if cm is not None:
            edits = cm.get("edits") if isinstance(cm, dict) else None
            if not isinstance(edits, list):
                return "context_management.edits: Field required"
            for k, edit in enumerate(edits):
                if not isinstance(edit, dict) or edit.get("type") != "compact_20260112":
                    return f"context_management.edits.{k}.type: this server knows only 'compact_20260112'"
                if betas is not None and COMPACT_BETA not in betas:
                    return f"context_management.edits.{k}: compact_20260112 requires the beta header {COMPACT_BETA}"
                trigger = edit.get("trigger") or {"type": "input_tokens", "value": 150_000}
                value = trigger.get("value") if isinstance(trigger, dict) else None
                if (not isinstance(trigger, dict) or trigger.get("type") != "input_tokens" or isinstance(value, bool)
                        or not isinstance(value, int) or value < self.min_trigger):
                    return f"context_management.edits.{k}.trigger: input_tokens of at least {self.min_trigger} are required"
        elif has_block and betas is not None and COMPACT_BETA not in betas:
            return f"messages: `compaction` blocks require the beta header {COMPACT_BETA}"
        tokens = count_tokens(req)
        if tokens > self.context_window:
            return f"prompt is too long: {tokens} tokens > {self.context_window} maximum"
        return None

    def _trigger(self, req: dict[str, Any]) -> tuple[int, bool] | None:
        """(trigger, pause) of the request's compaction edit, if it has one."""
        for edit in (req.get("context_management") or {}).get("edits") or []:
            if edit.get("type") == "compact_20260112":
                return int((edit.get("trigger") or {}).get("value", 150_000)), bool(edit.get("pause_after_compaction"))
        return None

    def answer(self, req: dict[str, Any]) -> dict[str, Any]:
        """The scripted reply, signed with this server's key, remembered for later checks; with a compaction
        block first when the request is over its compaction trigger."""
        tokens = count_tokens(req)
        compact = self._trigger(req)
        compacting = compact is not None and tokens > compact[0]
        if compacting and compact is not None and compact[1]:
            message = Reply(text="").message(req, key=self.key)
            message.update(content=[], stop_reason="compaction")
        else:
            reply = self.script(req)
            if not isinstance(reply, Reply):
                raise TypeError("a script must return a Reply")
            message = reply.message(req, key=self.key)
        if compacting:
            with self._lock:
                self.compactions += 1
                n = self.compactions
            summary = (f"Summary {n}: the conversation so far ({len(req['messages'])} messages, about {tokens} tokens) "
                       f"was compacted. Key facts: {secrets.token_hex(8)}.")
            block = {"type": "compaction", "content": summary}
            message["content"] = [block, *message["content"]]
            tokens = count_tokens({**req, "messages": [{"role": "assistant", "content": [block]}]})
        message["usage"] = {**message.get("usage", {}), "input_tokens": tokens}
        h = hashlib.sha256(_canon(message["content"]).encode()).hexdigest()
        c = _compaction_at(req["messages"])
        bound = _prefix_hashes(req, c or 0)[-1]
        with self._lock:
            self._sent.setdefault(h, set()).add(bound)
        return message

    def take_fault(self) -> tuple[int, str, bool] | None:
        with self._lock:
            return self._faults.pop(0) if self._faults else None


def _check_tools(tools: Any, betas: tuple[str, ...] | None) -> str | None:
    """Why the real API would refuse these tool declarations, or None."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        return "tools: Input should be a valid list"
    for k, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            return f"tools.{k}: a tool is an object with a name"
        kind = tool.get("type")
        if kind in (None, "custom"):
            if not isinstance(tool.get("input_schema"), dict):
                return f"tools.{k}.input_schema: Field required"
            continue
        if kind != MEMORY_TOOL:
            return f"tools.{k}.type: this server knows custom tools and {MEMORY_TOOL!r}, not {str(kind)[:40]!r}"
        if tool["name"] != "memory":
            return f"tools.{k}.name: Input should be 'memory'"
        extra = sorted(set(tool) - MEMORY_PARAM)
        if extra:
            return f"tools.{k}.{extra[0][:40]}: Extra inputs are not permitted"
        if betas is not None and MEMORY_BETA not in betas:
            return f"tools.{k}: {MEMORY_TOOL} requires the beta header {MEMORY_BETA}"
    return None


def _script(script: Any) -> Any:
    if isinstance(script, str):
        return BUILTIN_SCRIPTS[script]
    if isinstance(script, list):
        return steps_script(script)
    if not callable(script):
        raise TypeError(f"a script is a name, a list of Reply or a callable, not {type(script).__name__}")
    return script


def hmac_ok(key: bytes, block: dict[str, Any]) -> bool:
    from ..brain.models.scripted import sign

    return block.get("signature") == sign(block.get("thinking", ""), key)


class _Handler(tornado.web.RequestHandler):
    def initialize(self, api: FakeMessagesAPI) -> None:
        self.api = api

    def _error(self, status: int, etype: str, message: str) -> None:
        self.set_status(status)
        self.set_header("content-type", "application/json")
        self.set_header("request-id", "req_fake")
        self.finish({"type": "error", "error": {"type": etype, "message": message}})

    def _unauthenticated(self) -> bool:
        if self.request.headers.get("x-api-key") or self.request.headers.get("authorization"):
            return False
        self._error(401, "authentication_error", "x-api-key header is required")
        return True


def _model_info(model_id: str) -> dict[str, Any]:
    return {"type": "model", "id": model_id, "display_name": model_id.replace("-", " ").title(),
            "created_at": "2026-01-01T00:00:00Z"}


class _ModelsHandler(_Handler):
    """The Models API: a page of the models (newest first in the real API; here in name order), or one model."""

    async def get(self, model_id: str | None = None) -> None:
        if self._unauthenticated():
            return
        ids = self.api.model_ids()
        if ids is None:
            return self._error(404, "not_found_error", "this server has no Models API")
        if model_id is not None:
            if model_id not in ids:
                return self._error(404, "not_found_error", f"model: {model_id[:200]}")
            self.finish(_model_info(model_id))
            return
        with self.api._lock:
            self.api.model_lists += 1
        if self.api.delay:  # counted first: a test knows the listing started
            await asyncio.sleep(self.api.delay)
        try:
            limit = min(max(int(self.get_query_argument("limit", "20")), 1), 1000)
        except ValueError:
            return self._error(400, "invalid_request_error", "limit: must be an integer")
        after = self.get_query_argument("after_id", None)
        start = ids.index(after) + 1 if after in ids else 0
        page = ids[start:start + limit]
        self.finish({"data": [_model_info(i) for i in page], "has_more": start + limit < len(ids),
                     "first_id": page[0] if page else None, "last_id": page[-1] if page else None})


class _MessagesHandler(_Handler):

    async def post(self) -> None:
        if self._unauthenticated():
            return
        try:
            req = json.loads(self.request.body)
        except ValueError:
            return self._error(400, "invalid_request_error", "the body is not valid JSON")
        self.api.requests.append(req)
        if self.api.delay:
            await asyncio.sleep(self.api.delay)
        fault = self.api.take_fault()
        if fault and not fault[2]:
            if fault[0] == 429:
                self.set_header("retry-after", "0")
            return self._error(fault[0], fault[1], f"injected {fault[1]}")
        header = self.request.headers.get("anthropic-beta") or ""
        problem = self.api.check(req, tuple(v.strip() for v in header.split(",") if v.strip()))
        if problem:
            self.api.rejections.append(problem)
            return self._error(400, "invalid_request_error", problem)
        if self.api.models is not None and not (isinstance(req["model"], str) and req["model"] in self.api.models):
            problem = f"model: {str(req['model'])[:200]}"  # the real API's words for a model it does not have
            self.api.rejections.append(problem)
            return self._error(404, "not_found_error", problem)
        message = self.api.answer(req)
        if not req.get("stream"):
            self.set_header("content-type", "application/json")
            self.finish(message)
            return
        self.set_header("content-type", "text/event-stream")
        self.set_header("cache-control", "no-cache")
        events = message_events(message)
        if fault:  # a mid-stream error after the first events, as the real API may send
            events = events[:2] + [{"type": "error", "error": {"type": fault[1], "message": f"injected {fault[1]}"}}]
        for n, ev in enumerate(events):
            if n == 1:
                self.write("event: ping\ndata: {\"type\": \"ping\"}\n\n")
            self.write(f"event: {ev['type']}\ndata: {json.dumps(ev)}\n\n")
            await self.flush()
            if self.api.chunk_delay:
                await asyncio.sleep(self.api.chunk_delay)
        self.finish()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="A fake Anthropic Messages API on 127.0.0.1.")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--script", default="default", choices=sorted(BUILTIN_SCRIPTS))
    p.add_argument("--delay", type=float, default=0.0, help="seconds before each response starts")
    args = p.parse_args(argv)
    api = FakeMessagesAPI(args.script, port=args.port)
    api.delay = args.delay
    api.start()
    print(f"ANTHROPIC_BASE_URL={api.url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        api.stop()


if __name__ == "__main__":
    main()
