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
- every `tool_use` must be answered by a `tool_result` in the next message.

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
from typing import Any

import tornado.httpserver
import tornado.ioloop
import tornado.netutil
import tornado.web

from ..brain.models.base import message_events
from ..brain.models.scripted import BUILTIN_SCRIPTS, Reply, steps_script


def _canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _prefix_hash(request: dict[str, Any], upto: int) -> str:
    prefix = {"system": request.get("system"), "tools": request.get("tools"), "messages": request["messages"][:upto]}
    return hashlib.sha256(_canon(prefix).encode()).hexdigest()


def _content_list(content: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


class FakeMessagesAPI:
    """A Messages API on 127.0.0.1 that answers from a script and checks what it is sent."""

    def __init__(self, script: Any = "default", *, port: int = 0, chunk_delay: float = 0.0):
        self.use(script)
        self.port = port
        self.chunk_delay = chunk_delay
        self.delay = 0.0  # seconds before the response starts
        self.key = secrets.token_bytes(16)  # signs thinking blocks; unknown to clients
        self.requests: list[dict[str, Any]] = []
        self.rejections: list[str] = []
        self._sent: dict[str, set[str]] = {}  # content hash -> prefix hashes it answered
        self._faults: list[tuple[int, str, bool]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: tornado.ioloop.IOLoop | None = None
        self._ready = threading.Event()

    # -- control ---------------------------------------------------------------

    def use(self, script: Any) -> FakeMessagesAPI:
        """Answer from now on with `script`: a script name, a callable(request) -> Reply, or a list of Reply."""
        if isinstance(script, str):
            script = BUILTIN_SCRIPTS[script]
        elif isinstance(script, list):
            script = steps_script(script)
        self.script = script
        return self

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
                [(r"/v1/messages", _MessagesHandler, {"api": self})], log_function=lambda handler: None
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

    def check(self, req: dict[str, Any]) -> str | None:
        """Why the real API would reject this request, or None."""
        for field in ("model", "max_tokens", "messages"):
            if field not in req:
                return f"{field}: Field required"
        msgs = req["messages"]
        if not isinstance(msgs, list) or not msgs:
            return "messages: at least one message is required"
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
            h = hashlib.sha256(_canon(content).encode()).hexdigest()
            prefixes = self._sent.get(h)
            if prefixes is None:
                return (
                    f"messages.{i}.content: `thinking` or `redacted_thinking` blocks in the latest assistant "
                    "message cannot be modified. These blocks must remain as they were in the original response."
                    if any(b.get("type") in ("thinking", "redacted_thinking") for b in content)
                    else f"messages.{i}: this assistant turn is not one the model produced (it was altered)"
                )
            if _prefix_hash(req, i) not in prefixes:
                return f"messages.{i}.content.0: The block is bound to a different conversation (the prefix before it changed)"
            uses = [b["id"] for b in content if b.get("type") == "tool_use"]
            if uses:
                nxt = _content_list(msgs[i + 1]["content"]) if i + 1 < len(msgs) else []
                answered = {b.get("tool_use_id") for b in nxt if b.get("type") == "tool_result"}
                missing = [u for u in uses if u not in answered]
                if missing and i + 1 < len(msgs):
                    return f"messages.{i + 1}: tool_use ids were found without tool_result blocks immediately after: {', '.join(missing)}"
        return None

    def answer(self, req: dict[str, Any]) -> dict[str, Any]:
        """The scripted reply, signed with this server's key, remembered for later checks."""
        reply = self.script(req)
        if not isinstance(reply, Reply):
            raise TypeError("a script must return a Reply")
        message = reply.message(req, key=self.key)
        h = hashlib.sha256(_canon(message["content"]).encode()).hexdigest()
        with self._lock:
            self._sent.setdefault(h, set()).add(_prefix_hash(req, len(req["messages"])))
        return message

    def take_fault(self) -> tuple[int, str, bool] | None:
        with self._lock:
            return self._faults.pop(0) if self._faults else None


def hmac_ok(key: bytes, block: dict[str, Any]) -> bool:
    from ..brain.models.scripted import sign

    return block.get("signature") == sign(block.get("thinking", ""), key)


class _MessagesHandler(tornado.web.RequestHandler):
    def initialize(self, api: FakeMessagesAPI) -> None:
        self.api = api

    def _error(self, status: int, etype: str, message: str) -> None:
        self.set_status(status)
        self.set_header("content-type", "application/json")
        self.set_header("request-id", "req_fake")
        self.finish({"type": "error", "error": {"type": etype, "message": message}})

    async def post(self) -> None:
        if not self.request.headers.get("x-api-key") and not self.request.headers.get("authorization"):
            return self._error(401, "authentication_error", "x-api-key header is required")
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
        problem = self.api.check(req)
        if problem:
            self.api.rejections.append(problem)
            return self._error(400, "invalid_request_error", problem)
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
