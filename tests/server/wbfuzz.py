"""A seeded fuzzer of the workbench API, a raw HTTP/1.1 client for it, and the log's consistency checks.

Used by tests/server/test_fuzz.py and test_faults.py (bounded, in CI) and bench/soak.py (longer).

- `RawClient` sends exactly the bytes it is given (request target, headers, body) over a keep-alive
  connection, so that hostile paths, query strings and bodies reach the server unchanged. It never sends a
  request twice: a reused connection the server closed without saying `Connection: close` loses the request,
  and that is a failure (naming the request before it on the connection). An upgraded websocket asked for
  every event has its first message read (the backlog's first event) before it is closed.
- `Fuzzer(seed)` makes request number i from `random.Random(f"{seed}:{i}")`: every route, core and
  memory, every verb, valid and unknown ids, valid bodies and hostile ones (wrong types, extra fields,
  deep nesting, huge strings and arrays, lone surrogates, NaN, 1e309 and 5,000-digit numbers, bytes that are
  not UTF-8, hostile query strings and path ids). Messages carry idempotency keys (reused, so the same key
  with another text is a 422) and are sent again (answered with the first's seq, recorded once); sessions of
  `scripted:delegate` get ```json blocks of `delegate` input (children that run no code); eval runs of
  rubric-graded tasks and memory imports are made valid now and then (no kernel either way). Request i is the same in every run with that seed (the ids it
  picks from the pool of created ones aside), and a failure prints the seed, i and the request.
- Routes with a generator of their own (SPECIFIC) get meaningful bodies and grow the id pool; every other
  route the server serves (`served_routes()`: `all_handlers` with the plugins as the server loads them,
  so also routes added later) is the generic generator's (`generic_table()`): its path filled with pool,
  hostile and random ids, its handler's verbs and others, a body guessed from the pydantic model its
  handler's source names, the same hostile variations, hostile query arguments of its `args` model;
  uploads stay small (a few just over the upload limit, when that is small). tests/server/test_fuzz_routes.py
  (fast tier) fails when a served route is one no request reaches.
- `note_success` counts the writes it understands (a message answered twice with one seq once, and only if
  both times it was the same text); a 2xx to a write of a generic route it does not
  (a delete, a fork...) is listed in `Tally.opaque`, and the checks leave out only the sessions it named.
- `judge` says what is wrong with a response: a 5xx, no answer, or an error whose body is not JSON
  with an `error` string.
- `check_log` says what is wrong with a log: seqs not 1..N, two open turns, a turn_ended without a
  turn, an unfinished turn with nothing running, a tool call not answered exactly once.

Generated text never contains a backtick: the offline scripted model runs the ```python fences it is
sent, and fuzz messages must not start kernels. For the same reason `hands/restart` of a real session
only ever gets a body it refuses.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

API = "/workbench/api"
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
# characters of generated text: no backtick (see above), some of everything else
ALPHABET = ("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"\\/{}[]()<>=+-*&^%$#@~|_"
            "\t\n\r\x00\x01\x1f\x7f é ü ß 中文 日本 한국 Ωπ \u2028\u2029\u200b\ufeff \U0001f600\U0001f4a9 \u202e")
HOSTILE_IDS = ("x" * 1500, "%00", "%FF", "%ED%A0%80", "%D9%A1", "..", "%2E%2E", "a%2Fb", "a%0Ab", "%E4%B8%AD",
               "nope", "0" * 12, "%25", "%20", "a%09b", "m" + "0" * 10, "%C3%28", "%F0%9F%98%80")
HOSTILE_DIGITS = ("+1", "%201", "1%20", "1_0", "%D9%A1", "-1", "9" * 25, "", "1.0", "0x10", "%FF", "1e3", "%EF%BC%91",
                  "%00", "00000000000000000001", "%E0%A5%A7")


@dataclass
class Request:
    method: str
    target: str  # path and query, already percent-encoded ASCII
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    auth: str = "token"  # token | none | bad
    route: str = ""
    note: str = ""

    def show(self, n: int = 400) -> str:
        body = self.body[:n] + (b"...(%d bytes)" % len(self.body) if len(self.body) > n else b"")
        return f"{self.method} {self.target[:n]} auth={self.auth} headers={list(self.headers)} body={body!r} ({self.note})"


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    frame: bytes | None = None  # an upgraded websocket's first message (its backlog's first event)

    def json(self) -> Any:
        return json.loads(self.body)


class WebSocketClosed(ConnectionResetError):
    """The server closed a websocket before its first message (a close frame: its code and reason)."""

    def __init__(self, code: int | None, reason: str):
        super().__init__(f"websocket closed by the server with code {code}: {reason}")
        self.code = code


class RawClient:
    """One keep-alive HTTP/1.1 connection that sends bytes as given; reconnects when the server closes it."""

    def __init__(self, host: str, port: int, token: str, timeout: float = 60.0):
        self.host, self.port, self.token, self.timeout = host, port, token, timeout
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.previous = ""  # the last request answered on this connection, and its status

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except (OSError, ConnectionError):
                pass
        self.reader = self.writer = None

    async def send(self, req: Request) -> Response:
        """The response, or OSError / asyncio.TimeoutError / asyncio.IncompleteReadError when there is none.

        Never sent twice: a server that closes a kept-alive connection must say `Connection: close` in its
        last response, so a reset on a reused connection is a lost request (`previous` names the request
        before it on the same connection, what most likely made the server close it).
        """
        return await asyncio.wait_for(self._send(req), self.timeout)

    async def _send(self, req: Request) -> Response:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 22)
            self.previous = ""
        head = [f"{req.method} {req.target} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        if req.auth == "token":
            head.append(f"Authorization: token {self.token}")
        elif req.auth == "bad":
            head.append("Authorization: token wrong-" + self.token[::-1])
        head += [f"{k}: {v}" for k, v in req.headers]
        if req.body or req.method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {len(req.body)}")
        try:
            self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + req.body)
            await self.writer.drain()
            resp = await self._read(req.method)
        except BaseException:
            await self.close()
            raise
        self.previous = f"{resp.status} to {req.show(200)}"
        if resp.status == 101:  # a websocket: from the start, its first message (the backlog comes at once); goodbye
            try:
                if from_the_start(req.target):
                    resp.frame = await self._frame()
            finally:
                await self.close()
        elif resp.headers.get("connection", "").lower() == "close":
            await self.close()  # a connection the server said it closes is not reused
        return resp

    async def _frame(self) -> bytes:
        """One whole websocket message from the server (unmasked, as RFC 6455 says a server's are)."""
        assert self.reader is not None
        b0, b1 = await self.reader.readexactly(2)
        if b0 == 0x88 and not b1 & 0x80 and (b1 & 0x7F) < 126:  # a whole close frame: the server ended the stream
            payload = await self.reader.readexactly(b1 & 0x7F)
            code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else None
            raise WebSocketClosed(code, payload[2:].decode("utf-8", "replace"))
        if b1 & 0x80 or not b0 & 0x80 or b0 & 0x0F not in (1, 2):
            raise ValueError(f"not a whole, unmasked data frame: {b0:#x} {b1:#x}")
        n = b1 & 0x7F
        if n >= 126:
            n = int.from_bytes(await self.reader.readexactly(2 if n == 126 else 8), "big")
        return await self.reader.readexactly(n)

    async def _read(self, method: str) -> Response:
        assert self.reader is not None
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if method == "HEAD" or status in (101, 204, 304) or status < 200:
            return Response(status, headers, b"")
        if "content-length" in headers:
            return Response(status, headers, await self.reader.readexactly(int(headers["content-length"])))
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                body += await self.reader.readexactly(size + 2)
                if not size:
                    return Response(status, headers, body[:-2])
                body = body[:-2]
        return Response(status, headers, await self.reader.read())


def from_the_start(target: str) -> bool:
    """Whether a stream request asks for every event (no `after`, or 0): its socket then sends at least one at once."""
    query = target.partition("?")[2]
    return all(not p.startswith("after=") or p == "after=0" for p in query.split("&"))


def judge(req: Request, resp: Response | None, error: str = "", stopping: bool = False) -> str | None:
    """What is wrong with this response to this request, or None (`stopping`: the server was told to stop,
    so a 503 with a JSON error is the right answer)."""
    if resp is None:
        return f"no response ({error})"
    if resp.status >= 500 and not (stopping and resp.status == 503):
        return f"HTTP {resp.status}: {resp.body[:300]!r}"
    if resp.status == 101 and from_the_start(req.target):
        try:
            message = json.loads(resp.frame or b"")
        except ValueError:
            return f"websocket: a first message that is not JSON: {(resp.frame or b'')[:200]!r}"
        if not (isinstance(message, dict) and message.get("kind") == "event" and message["event"].get("seq", 0) >= 1):
            return f"websocket: a first message that is not an event: {(resp.frame or b'')[:200]!r}"
        return None
    if resp.status in (101, 204) or req.method == "HEAD" or (req.method == "OPTIONS" and not resp.body):
        return None  # no body to judge (OPTIONS: Jupyter's CORS preflight answers 200 with none)
    if resp.status < 300 and resp.headers.get("content-type", "").split(";")[0].strip() == "application/octet-stream":
        return None  # a download (files/content): bytes, as its Content-Type says; only errors must be JSON
    try:
        data = resp.json()
    except ValueError:
        return f"HTTP {resp.status} with a body that is not JSON: {resp.body[:200]!r}"
    if resp.status >= 300:
        if not (isinstance(data, dict) and isinstance(data.get("error"), str) and data["error"]):
            return f"HTTP {resp.status} without an error string: {resp.body[:200]!r}"
        if "\n" in data["error"]:
            return f"HTTP {resp.status}: the error is not one line: {data['error'][:200]!r}"
    return None


# -- generating requests ---------------------------------------------------------------------------------


@dataclass
class Pool:
    """Ids the fuzzer has seen created: sessions, dreams, memories."""

    sessions: list[str] = field(default_factory=list)
    dreams: list[str] = field(default_factory=list)
    memories: list[str] = field(default_factory=list)
    others: list[str] = field(default_factory=list)  # ids generic routes' 2xx answers named (eval runs, ...)
    delegators: list[str] = field(default_factory=list)  # sessions of scripted:delegate with the delegate tool
    sent: list[tuple[str, bytes]] = field(default_factory=list)  # (session, body) of 202'd messages with a key


def text(rng: random.Random, n: int | None = None, blank_ok: bool = True) -> str:
    n = rng.choice((0, 1, 5, 20, 80, 300)) if n is None else n
    out = "".join(rng.choice(ALPHABET) for _ in range(n))
    return out if blank_ok or out.strip() else "hello " + out


def hostile_value(rng: random.Random, depth: int = 0) -> Any:
    """Any JSON value, often one a route does not expect."""
    kind = rng.randrange(12 if depth < 3 else 9)
    return [
        lambda: rng.choice((0, 1, -1, 7, 2**31, 2**53, 2**63, -2**63 - 1, 10**30, -10**30)),
        lambda: rng.choice((0.5, -0.0, 1e-300, 1e308, -1e308, 3.14)),
        lambda: rng.choice((True, False)),
        lambda: None,
        lambda: text(rng),
        lambda: "",
        lambda: "1",
        lambda: text(rng, rng.choice((1000, 5000))),
        lambda: rng.choice(("python", "scripted", "accept", "proposed", "a.b:443")),
        lambda: [hostile_value(rng, depth + 1) for _ in range(rng.randrange(4))],
        lambda: {text(rng, 5): hostile_value(rng, depth + 1) for _ in range(rng.randrange(4))},
        lambda: [rng.choice(("python", "x", 1))] * rng.choice((2, 33, 1000)),
    ][kind]()


def nested(rng: random.Random, depth: int) -> str:
    if rng.random() < 0.5:
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


class Fuzzer:
    """Request number i of a seeded run: `Fuzzer(seed).request(i, pool)`."""

    def __init__(self, seed: int | str, *, big: bool = True, upload_mb: int | None = None):
        self.seed, self.big = seed, big
        self.upload_mb = upload_limit_mb() if upload_mb is None else upload_mb

    def request(self, i: int, pool: Pool) -> Request:
        rng = random.Random(f"{self.seed}:{i}")
        table = generic_table()
        # each route without a generator of its own gets about the share of one that has one
        slot = rng.randrange(len(ROUTES) + len(table))
        req = ROUTES[slot](self, rng, pool) if slot < len(ROUTES) else self.generic(rng, pool, table[slot - len(ROUTES)])
        if rng.random() < 0.08:  # another verb on the same path
            req.method = rng.choice(METHODS)
            req.note += " other verb"
        r = rng.random()
        if r < 0.02:
            req.auth = "none"
        elif r < 0.03:
            req.auth = "bad"
        if rng.random() < 0.03:  # Jupyter's token as a query argument
            sep = "&" if "?" in req.target else "?"
            req.target += sep + "token=" + rng.choice(("x", "%FF", ""))
        return req

    # -- ids and query strings ---------------------------------------------------------------------------

    def sid(self, rng: random.Random, pool: Pool) -> str:
        r = rng.random()
        if r < 0.8 and pool.sessions:
            return rng.choice(pool.sessions)
        if r < 0.88 and pool.dreams:
            return rng.choice(pool.dreams)
        return rng.choice(HOSTILE_IDS) if r < 0.95 else "%08x" % rng.getrandbits(48)

    def mid(self, rng: random.Random, pool: Pool) -> str:
        if rng.random() < 0.85 and pool.memories:
            return rng.choice(pool.memories)
        return rng.choice(HOSTILE_IDS)

    def digits(self, rng: random.Random) -> str:
        return rng.choice(HOSTILE_DIGITS) if rng.random() < 0.4 else str(rng.choice((0, 1, 2, 5, 10, 1000, 10**17)))

    def extra_args(self, rng: random.Random, target: str) -> str:
        if rng.random() < 0.1:
            sep = "&" if "?" in target else "?"
            target += sep + rng.choice(("foo=1", "after=1&after=2", "%FF=1", "limit", "status=accepted", "=", "a=%ED%A0%80",
                                        "1796069398248", "1796069398248=1", "%D9%A1"))
        return target

    # -- bodies ------------------------------------------------------------------------------------------

    def body(self, rng: random.Random, valid: dict[str, Any], *, max_bytes: int = 1 << 20, big: bool | None = None) -> tuple[bytes, str]:
        """A body of this shape: the valid one, or one of many hostile variations of it (bytes, what)."""
        big = self.big if big is None else big
        r = rng.random()
        if r < 0.45:
            return dumps(rng, valid), "valid"
        if r < 0.6 and valid:  # one field of the wrong type or value
            key = rng.choice(list(valid))
            return dumps(rng, {**valid, key: hostile_value(rng)}), f"hostile {key}"
        if r < 0.67:
            return dumps(rng, {**valid, rng.choice(("extra", "titel", "with", "action", "token", "")): hostile_value(rng)}), "extra field"
        if r < 0.72:
            return dumps(rng, hostile_value(rng)), "any value"
        if r < 0.76:
            return nested(rng, rng.choice((33, 64, 500, 1023, 1025, 3000))).encode(), "deep"
        if r < 0.80 and valid:  # a raw token JSON has no place for, spliced in
            key = rng.choice(list(valid))
            bad = rng.choice(("NaN", "Infinity", "-Infinity", "1e309", "-1e400", '"\\ud800"', '"a\\udfffb"', '"\\ud83d"',
                              "undefined", "0x10", "01", "'x'", '"\\x41"', "1.", ".5", "+1", "9" * 5000, "-" + "9" * 5000,
                              "1" * 4000, "1E99999999999999999999", "-0", "-0.0", "1e-400", "0." + "1" * 5000))
            return dumps(rng, {**valid, key: "@@"}).replace(b'"@@"', bad.encode()), f"bad token in {key}"
        if r < 0.84:
            raw = dumps(rng, valid)
            return rng.choice((b"\xff\xfe" + raw, b"\xef\xbb\xbf" + raw, raw[:-1], raw + b"x", raw.replace(b"{", b"{\xff", 1),
                               b"\xed\xa0\x80", b"\x00", b"", b"  \n ", b"null", b"[]", b'"s"', b"123", b"{}{}",
                               raw.replace(b'"', b"'"))), "raw bytes"
        if r < 0.88 and valid:  # a duplicated key, last one hostile
            key = rng.choice(list(valid))
            raw = dumps(rng, valid)
            return raw[:-1] + (b", " if len(raw) > 2 else b"") + json.dumps(key).encode() + b": " + dumps(rng, hostile_value(rng)) + b"}", "duplicate key"
        if r < 0.94 and valid:  # long strings and lists in a field
            key = rng.choice(list(valid))
            long = rng.choice(("x" * rng.choice((201, 1001, 10_001, 100_001)), ["python"] * rng.choice((33, 257, 1001)),
                               [text(rng, 10)] * 300, {f"K{j}": "v" for j in range(rng.choice((257, 2000)))}))
            return dumps(rng, {**valid, key: long}), f"long {key}"
        if big and r < 0.945:  # over the body limit, or just under it
            key = rng.choice(list(valid)) if valid else "x"
            size = rng.choice((max_bytes + 1, max_bytes + 1000, max_bytes - 100, 3 * max_bytes))
            return dumps(rng, {**valid, key: "y" * size}), f"big {key}"
        if big and r < 0.9455:  # 20 MB of tool names, the finding of the review
            return b'{"tools": [' + b'"python",' * 2_000_000 + b'"python"]}', "20 MB of tool names"
        return dumps(rng, valid), "valid"

    # -- routes ------------------------------------------------------------------------------------------

    def sessions(self, rng: random.Random, pool: Pool) -> Request:
        if rng.random() < 0.3:
            return Request("GET", self.extra_args(rng, f"{API}/sessions"), route="sessions")
        valid: dict[str, Any] = {"model": "scripted"}
        for key, make in (("title", lambda: text(rng, 30)), ("system", lambda: text(rng, 50)), ("tools", lambda: ["python"]),
                          ("config", lambda: rng.choice(({"max_tokens": 100}, {"thinking": "disabled"}, {"effort": "low"},
                                                         {"hands": {"timeout": 5, "env": {"A": "b"}}}, {"egress": {"allow": ["example.org:443"], "max_requests": 3}},
                                                         {"effort": None}, {}))),
                          ("model", lambda: rng.choice(("scripted", "scripted:nope", "claude-x", "anthropic:", "", " ", "x" * 300)))):
            if rng.random() < 0.3:
                valid[key] = make()
        if rng.random() < 0.15:  # hostile config values, one level down
            valid["config"] = {rng.choice(("max_tokens", "thinking", "effort", "hands", "egress", "nope")): hostile_value(rng)}
        if rng.random() < 0.1:
            valid["config"] = {"hands": {rng.choice(("timeout", "output_limit", "env", "workdir", "replay", "gpu")): hostile_value(rng)}}
        if rng.random() < 0.1:
            valid["config"] = {"egress": {rng.choice(("allow", "credentials", "max_requests", "x")): hostile_value(rng)}}
        if rng.random() < 0.1:  # a session whose model delegates (its messages' ```json blocks: see `message`)
            valid = {"model": "scripted:delegate", "tools": ["python", "delegate"]}
        body, what = self.body(rng, valid)
        return Request("POST", self.extra_args(rng, f"{API}/sessions"), body, route="create session", note=what)

    def session(self, rng: random.Random, pool: Pool) -> Request:
        return Request("GET", self.extra_args(rng, f"{API}/sessions/{self.sid(rng, pool)}"), route="session")

    def message(self, rng: random.Random, pool: Pool) -> Request:
        if rng.random() < 0.08 and pool.sent:  # a client sending a message again (its answer was lost): body and key
            sid, body = rng.choice(pool.sent)
            return Request("POST", f"{API}/sessions/{sid}/messages", body, route="message", note="sent again")
        sid = rng.choice(pool.delegators) if pool.delegators and rng.random() < 0.08 else self.sid(rng, pool)
        valid: dict[str, Any] = {"text": delegation(rng) if sid in pool.delegators and rng.random() < 0.7
                                 else text(rng, rng.choice((1, 10, 100)), blank_ok=False)}
        if rng.random() < 0.5:  # keys repeat within a run: the same key with another text is a 422
            valid["idempotency_key"] = rng.choice((f"k{rng.randrange(40)}", "%032x" % rng.getrandbits(128)))
        body, what = self.body(rng, valid, max_bytes=4 << 20, big=self.big and rng.random() < 0.3)
        return Request("POST", f"{API}/sessions/{sid}/messages", body, route="message", note=what)

    def events(self, rng: random.Random, pool: Pool) -> Request:
        args = []
        if rng.random() < 0.7:
            args.append("after=" + self.digits(rng))
        if rng.random() < 0.4:
            args.append("limit=" + self.digits(rng))
        target = f"{API}/sessions/{self.sid(rng, pool)}/events" + ("?" + "&".join(args) if args else "")
        return Request("GET", self.extra_args(rng, target), route="events")

    def stream(self, rng: random.Random, pool: Pool) -> Request:
        target = f"{API}/sessions/{self.sid(rng, pool)}/stream"
        if rng.random() < 0.6:
            target += "?after=" + self.digits(rng)
        headers = [("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
                   ("Sec-WebSocket-Version", "13")]
        r = rng.random()
        if r < 0.3:
            headers = headers[: rng.randrange(4)]
        elif r < 0.4:
            headers[3] = ("Sec-WebSocket-Version", rng.choice(("8", "", "x")))
        elif r < 0.5:
            headers.append(("Origin", rng.choice(("http://evil.example", "null", "%FF"))))
        return Request("GET", self.extra_args(rng, target), headers=tuple(headers), route="stream")

    def no_body_post(self, rng: random.Random, pool: Pool, what: str) -> Request:
        body, note = self.body(rng, {}, big=False)
        return Request("POST", self.extra_args(rng, f"{API}/sessions/{self.sid(rng, pool)}/{what}"), body, route=what, note=note)

    def interrupt(self, rng: random.Random, pool: Pool) -> Request:
        return self.no_body_post(rng, pool, "interrupt")

    def resume(self, rng: random.Random, pool: Pool) -> Request:
        return self.no_body_post(rng, pool, "resume")

    def hands(self, rng: random.Random, pool: Pool) -> Request:
        if rng.random() < 0.5:
            return Request("GET", self.extra_args(rng, f"{API}/sessions/{self.sid(rng, pool)}/hands"), route="hands")
        # a restart that succeeds would start a kernel: a real session only ever gets a refused body
        sid = self.sid(rng, pool)
        known = sid in pool.sessions or sid in pool.dreams
        body = dumps(rng, {rng.choice(("x", "force", "by")): hostile_value(rng)}) if known or rng.random() < 0.5 \
            else rng.choice((b"[]", b"null", b"{", b'{"a": NaN}'))
        return Request("POST", f"{API}/sessions/{sid}/hands/restart", body, route="hands restart")

    def query(self, rng: random.Random, pool: Pool) -> Request:
        sql = rng.choice(("SELECT count(*) AS n FROM events", "SELECT type, count(*) FROM events GROUP BY ALL ORDER BY 1",
                          "SELECT ? AS x", "SELECT * FROM sessions WHERE id = ?", "DELETE FROM events", "SELECT 1; DROP TABLE events",
                          "SELECT * FROM read_csv('x')", "SELECT nextval('x')", "SELECT 1 FROM no_such", "", " ", "SELECT",
                          "SELECT id, title FROM memories LIMIT 5"))
        params = [rng.choice(pool.sessions)] if pool.sessions and "?" in sql else []
        if rng.random() < 0.3:
            params = [hostile_value(rng) for _ in range(rng.choice((1, 2, 101)))]
        body, what = self.body(rng, {"sql": sql, "params": params})
        return Request("POST", f"{API}/query", body, route="query", note=what)

    def status(self, rng: random.Random, pool: Pool) -> Request:
        return Request("GET", self.extra_args(rng, f"{API}/status"), route="status")

    def memories(self, rng: random.Random, pool: Pool) -> Request:
        args = []
        for key, values in (("status", ("proposed", "accepted", "nope", "", "%FF", "%ED%A0%80")),
                            ("tag", ("preference", "x" * 100, "%00", "%E4%B8%AD")), ("dream", ("x", "%FF")),
                            ("search", ("a", "%25", "_", "x" * 2000, "%ED%A0%80", "%C3%A9"))):
            if rng.random() < 0.3:
                args.append(f"{key}={rng.choice(values)}")
        return Request("GET", self.extra_args(rng, f"{API}/memories" + ("?" + "&".join(args) if args else "")), route="memories")

    def memory(self, rng: random.Random, pool: Pool) -> Request:
        mid = self.mid(rng, pool)
        if rng.random() < 0.35:
            return Request("GET", self.extra_args(rng, f"{API}/memories/{mid}"), route="memory")
        from workbench.memory.store import REVIEW_ACTIONS  # the store's actions, also ones added later

        action = rng.choice((*REVIEW_ACTIONS, "delete", ""))
        valid: dict[str, Any] = {"action": action}
        for key, make in (("title", lambda: text(rng, 20, blank_ok=False)), ("text", lambda: text(rng, 60, blank_ok=False)),
                          ("tags", lambda: [text(rng, 5, blank_ok=False)]), ("note", lambda: text(rng, 20)),
                          ("reason", lambda: text(rng, 10, blank_ok=False)),
                          ("with", lambda: rng.sample(pool.memories, min(2, len(pool.memories)))),
                          ("by", lambda: self.mid(rng, pool)), ("allow_secret", lambda: rng.random() < 0.5)):
            if rng.random() < 0.25:
                valid[key] = make()
        body, what = self.body(rng, valid)
        return Request("PATCH", f"{API}/memories/{mid}", body, route="review", note=what)

    def dreams(self, rng: random.Random, pool: Pool) -> Request:
        if rng.random() < 0.5:
            return Request("GET", self.extra_args(rng, f"{API}/dreams"), route="dreams")
        valid: dict[str, Any] = {"model": "scripted:dream"}
        if rng.random() < 0.5 and pool.sessions:
            valid["sessions"] = rng.sample(pool.sessions, min(len(pool.sessions), rng.choice((1, 3))))
        if rng.random() < 0.3:
            valid["instructions"] = text(rng, 40, blank_ok=False)
        if rng.random() < 0.2:
            valid["model"] = rng.choice(("scripted", "nope", "", "claude-x"))
        body, what = self.body(rng, valid)
        return Request("POST", f"{API}/dreams", body, route="start dream", note=what)

    def dream(self, rng: random.Random, pool: Pool) -> Request:
        did = rng.choice(pool.dreams) if pool.dreams and rng.random() < 0.7 else self.sid(rng, pool)
        return Request("GET", self.extra_args(rng, f"{API}/dreams/{did}"), route="dream")

    def evals(self, rng: random.Random, pool: Pool) -> Request:
        """An eval run of rubric-graded tasks: no kernel (no code, no python verifier), a few attempts; few of them
        valid (a run's attempts are turns and gradings: they cost the server more than any other request)."""
        if rng.random() < 0.5:
            return Request("GET", self.extra_args(rng, f"{API}/evals"), route="evals")
        tasks = [{"id": f"t{j}", "prompt": text(rng, 20, blank_ok=False),
                  "verifier": {"kind": "rubric", "rubric": f'the answer says "{rng.choice(ALPHABET.split())}"'}}
                 for j in range(rng.choice((1, 1, 2)))]
        valid: dict[str, Any] = {"tasks": tasks, "models": [rng.choice(("scripted:eval", "scripted"))]}
        if rng.random() < 0.8:  # a run the server refuses whole: an unknown model, a task without a verifier
            valid = rng.choice(({**valid, "models": ["nope"]}, {**valid, "tasks": [{"id": "t", "prompt": "p"}]},
                                {**valid, "epochs": 0}))
        if rng.random() < 0.3:
            valid["parallel"] = rng.choice((1, 2))
        body, what = self.body(rng, valid)
        return Request("POST", self.extra_args(rng, f"{API}/evals"), body, route="start eval", note=what)

    def memory_import(self, rng: random.Random, pool: Pool) -> Request:
        """An export to import: a valid one (new ids, into a store of the run's own) or one of the hostile variations."""
        ts = "2026-11-30T10:00:00+00:00"
        version = {"version": 1, "ts": ts, "actor": "person:fuzz", "action": "create", "title": text(rng, 20, blank_ok=False),
                   "text": text(rng, 60, blank_ok=False), "tags": ["fuzz"], "status": "proposed",
                   "provenance": [{"session_id": rng.choice(pool.sessions or ["s0"]), "seq": 1}], "note": None}
        memory = {"id": "m%010x" % rng.getrandbits(40), "created_at": ts, "created_by": "person:fuzz", "proposal": "create",
                  "targets": [], "dream_id": None, "versions": [version], "redactions": []}
        valid = {"format": "workbench-memory-store", "format_version": 1, "store": "fuzz", "exported_at": ts,
                 "exported_by": "person:fuzz", "memories": [memory], "links": []}
        if rng.random() < 0.6:  # refused whole (a valid import is scanned for secrets: it costs the server)
            valid = rng.choice(({**valid, "format_version": 2}, {**valid, "memories": [{**memory, "id": "x"}]},
                                {**valid, "store": "Bad Store"}))
        body, what = self.body(rng, valid)
        args = [f"store={rng.choice(('fuzz', 'fuzz-b', 'default', 'Bad%20Store', '%FF', ''))}"] if rng.random() < 0.5 else []
        args += [f"{k}={rng.choice(('true', 'false', 'maybe'))}" for k in ("review", "allow_secret") if rng.random() < 0.2]
        target = f"{API}/memories/import" + ("?" + "&".join(args) if args else "")
        return Request("POST", self.extra_args(rng, target), body, route="memory import", note=what)

    def unknown(self, rng: random.Random, pool: Pool) -> Request:
        path = rng.choice(("nosuch", "sessions/x/y/z", "sessions//messages", "memories/a/b", "", "dreams/x/y", "query/x",
                           "%FF", "sessions/%2F/events"))
        return Request(rng.choice(METHODS), f"{API}/{path}", route="unknown path")


    # -- every other route, from the live route table --------------------------------------------------

    def generic(self, rng: random.Random, pool: Pool, route: "Route") -> Request:
        """A request to a served route no generator above knows: its path filled with pool, hostile and random
        ids, one of the verbs its handler answers (or another), a body guessed from its body model (or none
        known) with the hostile variations of `body`, hostile query arguments."""
        target = self.fill(rng, pool, route.path)
        # the handler's query model: its keys, with plausible and hostile values
        if route.args and rng.random() < (0.9 if route.raw_body or "path" in route.args else 0.6):
            pairs = [f"{quote(k)}={self.arg_value(rng, k, a)}" for k, a in route.args.items() if rng.random() < 0.7]
            if pairs:
                target += "?" + "&".join(pairs)
        target = self.extra_args(rng, target)
        verbs = [v for v in route.verbs if v != "WEBSOCKET"] or ["GET"]
        method = rng.choice(verbs) if rng.random() < 0.8 else rng.choice(METHODS)
        headers: tuple[tuple[str, str], ...] = ()
        if "WEBSOCKET" in route.verbs and rng.random() < 0.5:
            headers = (("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
                       ("Sec-WebSocket-Version", rng.choice(("13", "8", ""))))
        body, what = b"", "no body"
        if route.raw_body and method in ("POST", "PUT"):
            body, what = self.raw_upload(rng)
        elif method not in ("GET", "HEAD", "OPTIONS") or rng.random() < 0.05:
            valid = sample_body(rng, route.body) if route.body is not None else {}
            body, what = self.body(rng, valid, big=self.big and rng.random() < 0.3 and not route.raw_body)
        return Request(method, target, body, headers=headers, route=f"{route.path.removeprefix(API)} (generic)", note=what)

    def fill(self, rng: random.Random, pool: Pool, path: str) -> str:
        """A documented path with each `{name}` (or regex group) filled, by what the path names."""
        def one(m: Any) -> str:
            before = path[:m.start()]
            if before.endswith("/sessions/"):
                return self.sid(rng, pool)
            if before.endswith("/memories/"):
                return self.mid(rng, pool)
            if before.endswith("/dreams/") and pool.dreams and rng.random() < 0.7:
                return rng.choice(pool.dreams)
            r = rng.random()
            if r < 0.4 and pool.others:
                return rng.choice(pool.others)
            if r < 0.55 and pool.sessions:
                return rng.choice(pool.sessions)
            return rng.choice(HOSTILE_IDS) if r < 0.8 else "%08x" % rng.getrandbits(48)
        return re.sub(r"\{\w+\}|\((?:[^()]|\([^()]*\))*\)", one, path).removesuffix("$").replace("/?", "")

    def arg_value(self, rng: random.Random, key: str, annotation: Any) -> str:
        if key == "path" and rng.random() < 0.7:  # a few names, so that uploads overwrite instead of piling up
            return quote(rng.choice(("a.txt", "data/b.csv", "x", "a b.txt", "中.txt")) if rng.random() < 0.6 else
                         rng.choice(("dir/", ".hidden", "../x", "/etc/passwd", "a/../../b", "./a.txt", "a" * 300, "CON", "a\\b",
                                     "a\x00b", "\ud800", "x/" * 100)), safe="", errors="surrogatepass")
        value = sample_value(rng, annotation, key)
        if rng.random() < 0.4:
            return rng.choice(("", "%FF", "%ED%A0%80", "%00", "x" * 5000, "..%2F..%2Fetc%2Fpasswd", "%2F", "-1", "1e309",
                               "NaN", "a%0Ab", "%E4%B8%AD"))
        return quote(json.dumps(value) if not isinstance(value, str) else value, safe="")

    def raw_upload(self, rng: random.Random) -> tuple[bytes, str]:
        """A raw body for an upload: small (the fuzz must not fill the disk), now and then just over the limit."""
        limit = self.upload_mb << 20
        r = rng.random()
        if self.big and r < 0.01 and limit <= 16 << 20:
            return b"z" * (limit + 1), "upload just over the limit"
        if self.big and r < 0.02 and limit <= 16 << 20:
            return b"z" * limit, "upload at the limit"
        return rng.choice((b"", b"hello\n", bytes(rng.getrandbits(8) for _ in range(rng.choice((1, 100, 4000)))),
                           b"\xff\xfe\xed\xa0\x80", b"\x00" * 1000, dumps(rng, hostile_value(rng)),
                           text(rng).encode("utf-8", "surrogatepass"), b"a" * 70_000)), "raw upload"


@dataclass(frozen=True)
class Route:
    """A served route as the generic generator sees it: its documented path, verbs, body and query models."""

    path: str
    verbs: tuple[str, ...]
    body: Any = None  # a pydantic model of its JSON body, when one is discoverable
    args: dict[str, Any] = field(default_factory=dict)  # query argument -> annotation
    raw_body: bool = False  # takes a raw body (an upload), not JSON


def served_routes() -> list[tuple[str, type]]:
    """Every (path, handler class) the server serves: `all_handlers` with the plugins loaded as the server loads them."""
    from workbench.host import load_plugins
    from workbench.server.app import all_handlers

    return all_handlers(load_plugins())


def upload_limit_mb() -> int:
    from workbench.config import from_env
    from workbench.hands.files import FilesSettings

    return int(from_env(FilesSettings, prefix="WORKBENCH_FILES_").max_upload_mb)


_TABLE: list[Route] | None = None


def generic_table(routes: list[tuple[str, type]] | None = None) -> list[Route]:
    """The routes the generic generator covers: every served route no specific generator makes requests for
    (SPECIFIC), in the server's order. Built from the live route table, so a route added later is covered."""
    global _TABLE
    if routes is None and _TABLE is not None:
        return _TABLE
    from workbench.server.routes import verbs

    table = [Route(path, tuple(verbs(cls)), body_model(cls), args_of(cls), raw_body=takes_raw_body(cls))
             for path, cls in (served_routes() if routes is None else routes) if path.removeprefix(API) not in SPECIFIC]
    if routes is None:
        _TABLE = table
    return table


def _models_in(fn: Any, seen: set[Any]) -> list[Any]:
    """Pydantic models a function's source names (its module's or workbench.server.bodies'), and those of the
    `bodies.*_body` helpers it calls."""
    import inspect
    import sys

    from pydantic import BaseModel

    from workbench.server import bodies

    if fn in seen:
        return []
    seen.add(fn)
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return []
    scopes = [vars(sys.modules[fn.__module__]), vars(bodies)]
    found = []
    for name in re.findall(r"\b(?:bodies\.)?([A-Z]\w*)\b", src):
        for scope in scopes:
            obj = scope.get(name)
            if isinstance(obj, type) and issubclass(obj, BaseModel) and obj not in found and not name.endswith("Args"):
                found.append(obj)
                break
    for name in re.findall(r"\bbodies\.(\w+_body)\(", src):
        if name != "empty_body":
            found += [m for m in _models_in(getattr(bodies, name, None), seen) if m not in found]
    return found


def body_model(cls: type) -> Any:
    """The pydantic model of a handler's JSON body, when its verbs' source names one (else None: bodies are guessed)."""
    seen: set[Any] = set()
    for verb in ("post", "put", "patch", "delete"):
        fn = next((c.__dict__[verb] for c in cls.__mro__ if verb in c.__dict__), None)
        if fn is not None and getattr(fn, "__module__", "").startswith("workbench"):
            models = _models_in(fn, seen)
            if models:
                return models[0]
    return None


def args_of(cls: type) -> dict[str, Any]:
    """A handler's query arguments (its `args` model, docs/api.md) -> their annotations."""
    from pydantic import BaseModel

    models = [getattr(cls, "args", None), *_arg_models(cls)]  # a class attribute, or set per verb in its source
    return {f.alias or k: f.annotation for m in models if isinstance(m, type) and issubclass(m, BaseModel)
            for k, f in m.model_fields.items()}


def _arg_models(cls: type) -> list[Any]:
    import inspect

    from workbench.server import bodies

    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return []
    return [getattr(bodies, n) for n in re.findall(r"bodies\.(\w+Args)\b", src) if hasattr(getattr(bodies, n), "model_fields")]


def takes_raw_body(cls: type) -> bool:
    """Whether a handler reads its body raw (an upload streamed to a spool), not as JSON."""
    return "data_received" in cls.__dict__


def sample_value(rng: random.Random, annotation: Any, key: str = "", depth: int = 0) -> Any:
    """A plausible value of a pydantic field's annotation (no backtick, see the module's docstring)."""
    import typing

    from pydantic import BaseModel

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        patterns = [m.pattern for m in args[1:] if isinstance(getattr(m, "pattern", None), str)]
        if patterns and rng.random() < 0.8:  # a value its pattern takes, when one of a few kinds does
            fits = [c for c in (str(rng.choice((0, 1, 5, 100, 10**17))), text(rng, 8, blank_ok=False), "a", "x-1")
                    if all(re.fullmatch(p, c) for p in patterns)]
            if fits:
                return fits[0]
        return sample_value(rng, args[0], key, depth)
    if origin is typing.Literal:
        return rng.choice(args)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        options = [a for a in args if a is not type(None)]
        return sample_value(rng, rng.choice(options), key, depth) if options and rng.random() < 0.9 else None
    if origin in (list, tuple, set, frozenset) or annotation in (list, tuple):
        item = args[0] if args else str
        return [sample_value(rng, item, key, depth + 1) for _ in range(rng.choice((0, 1, 2)))] if depth < 3 else []
    if origin is dict or annotation is dict:
        return {text(rng, 5, blank_ok=False): hostile_value(rng, 2) for _ in range(rng.choice((0, 1, 2)))} if depth < 3 else {}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return sample_body(rng, annotation, depth + 1) if depth < 3 else {}
    if annotation is bool:
        return rng.random() < 0.5
    if annotation is int:
        return rng.choice((0, 1, 2, 3, 10, 100))
    if annotation is float:
        return rng.choice((0.0, 0.5, 1.0, 30.0))
    if annotation is str:
        return text(rng, rng.choice((1, 8, 30)), blank_ok=False)
    return hostile_value(rng, 2)


def sample_body(rng: random.Random, model: Any, depth: int = 0) -> dict[str, Any]:
    """A valid-looking body of a pydantic model: its required fields and some optional ones."""
    out = {}
    for name, f in model.model_fields.items():
        if f.is_required() or rng.random() < 0.5:
            out[f.alias or name] = sample_value(rng, f.annotation, name, depth)
    return out


def delegation(rng: random.Random) -> str:
    """A message for a scripted:delegate session: one ```json block of `delegate` input (children that run no code: no
    `check`, no `files`, prompts without a fence), valid or with a hostile field."""
    tasks = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        task: dict[str, Any] = {"prompt": text(rng, 20, blank_ok=False)}
        if rng.random() < 0.8:
            task["model"] = rng.choice(("scripted:worker", "scripted:worker", "scripted", "nope"))
        for key, values in (("max_turns", (1, 3, 0, -1, 1.5, "x", 10**30)), ("timeout", (30, 0.001, -1, 1e308, None)),
                            ("title", (text(rng, 10, blank_ok=False), "", 5)), ("tools", (["python"], ["delegate"], ["nope"], "x")),
                            ("max_tokens", (100_000, 1, 0)), ("extra", (1,))):
            if rng.random() < 0.1:
                task[key] = rng.choice(values)
        tasks.append(task)
    spec: Any = rng.choice(({"tasks": tasks},) * 8 + ({"tasks": []}, {"tasks": "x"}, {"tasks": tasks * 9}, [tasks]))
    return "Please delegate this:\n```json\n" + json.dumps(spec) + "\n```\n"


def dumps(rng: random.Random, value: Any) -> bytes:
    """JSON as a client might send it: ASCII-escaped or raw UTF-8, compact or not."""
    return json.dumps(value, ensure_ascii=rng.random() < 0.5, separators=rng.choice(((",", ":"), (", ", ": ")))).encode("utf-8", "surrogatepass")


# the routes, weighted: messages and sessions most, since they write
ROUTES = (
    Fuzzer.sessions, Fuzzer.sessions, Fuzzer.sessions, Fuzzer.session, Fuzzer.message, Fuzzer.message, Fuzzer.message,
    Fuzzer.message, Fuzzer.events, Fuzzer.events, Fuzzer.stream, Fuzzer.interrupt, Fuzzer.interrupt, Fuzzer.resume,
    Fuzzer.hands, Fuzzer.query, Fuzzer.status, Fuzzer.memories, Fuzzer.memory, Fuzzer.memory, Fuzzer.dreams,
    Fuzzer.dream, Fuzzer.unknown, Fuzzer.evals, Fuzzer.memory_import,
)

# the documented paths (docs/api.md) the generators above make requests for; every other served route
# is the generic generator's (generic_table), and tests/server/test_fuzz_routes.py checks the two cover them all
SPECIFIC = frozenset({
    "/sessions", "/sessions/{id}", "/sessions/{id}/messages", "/sessions/{id}/events", "/sessions/{id}/stream",
    "/sessions/{id}/interrupt", "/sessions/{id}/resume", "/sessions/{id}/hands", "/sessions/{id}/hands/restart",
    "/query", "/status", "/memories", "/memories/{id}", "/dreams", "/dreams/{id}", "/evals", "/memories/import",
})


# -- running ---------------------------------------------------------------------------------------------


@dataclass
class Tally:
    """What a run did: requests, statuses per route, failures (with what reproduces them), writes promised."""

    requests: int = 0
    statuses: Counter = field(default_factory=Counter)
    routes: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    sessions_created: int = 0  # 201 to POST /sessions, 202 to POST /dreams
    messages_accepted: int = 0  # 202 to messages, 202 to POST /dreams (its user message)
    interrupts_true: int = 0
    dropped: int = 0  # requests with no response because the server was killed (fault injection only)
    by_route: Counter = field(default_factory=Counter)  # (route, status) -> requests
    messages: Counter = field(default_factory=Counter)  # session id -> user messages promised (a dream's: 1)
    sent: dict = field(default_factory=dict)  # (session id, seq) of each 202'd message -> its text
    resent: int = 0  # 202s to a message sent again with its key (the seq of the first)
    eval_runs: list = field(default_factory=list)  # runs a POST /evals started
    accepted: list = field(default_factory=list)  # (session id, seq, request target) of each 202 to a message
    # 2xx answers to writes of routes note_success does not understand (generic ones: a future delete, fork,
    # eval run...): what they may have changed is not counted; the checks leave out only the sessions they name
    opaque: list[str] = field(default_factory=list)
    touched: set = field(default_factory=set)  # session ids in the paths of those writes (maybe changed or removed)
    announced: set = field(default_factory=set)  # ids their answers named (maybe sessions they made)

    def add(self, other: "Tally") -> None:
        for f in ("requests", "sessions_created", "messages_accepted", "interrupts_true", "dropped", "resent"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        for f in ("statuses", "routes", "by_route", "messages"):
            getattr(self, f).update(getattr(other, f))
        self.failures += other.failures
        self.accepted += other.accepted
        self.sent.update(other.sent)
        self.eval_runs += other.eval_runs
        self.opaque += other.opaque
        self.touched |= other.touched
        self.announced |= other.announced

    def table(self) -> str:
        """Requests and statuses per route, one line each (what a run prints)."""
        lines = []
        for route, n in sorted(self.routes.items(), key=lambda kv: -kv[1]):
            st = sorted(((s, c) for (r, s), c in self.by_route.items() if r == route), key=lambda sc: str(sc[0]))
            lines.append(f"  {n:6d}  {route:45s} " + " ".join(f"{s}:{c}" for s, c in st))
        return "\n".join(lines)


# generic routes' writes whose 2xx note_success understands: they neither make nor remove sessions or user messages
UNDERSTOOD = frozenset({("POST", "/sessions/{id}/hands/close"), ("POST", "/sessions/{id}/files"),
                        ("POST", "/evals/{id}/interrupt")})


def note_success(req: Request, resp: Response, pool: Pool, tally: Tally) -> None:
    """Grow the id pool and count the writes a successful response promises (by what was sent, not meant)."""
    if resp.status >= 300 or req.method in ("HEAD", "GET", "OPTIONS"):
        return
    try:
        data = resp.json() if resp.body else None
    except ValueError:
        data = None
    if req.route.endswith("(generic)"):
        note_generic(req, resp, data, pool, tally)
        return
    if not isinstance(data, dict):
        return
    path = req.target.split("?")[0].removeprefix(API).rstrip("/")
    parts = path.split("/")[1:]
    if req.method == "POST" and parts == ["sessions"] and resp.status == 201:
        pool.sessions.append(data["id"])
        tally.sessions_created += 1
        if b"scripted:delegate" in req.body and b'"delegate"' in req.body:
            pool.delegators.append(data["id"])
    elif req.method == "POST" and parts == ["dreams"] and resp.status == 202:
        pool.dreams.append(data["dream_id"])
        tally.sessions_created += 1
        tally.messages_accepted += 1  # its instructions are its first user message
        tally.messages[data["dream_id"]] += 1
    elif req.method == "POST" and parts[:1] == ["sessions"] and parts[2:] == ["messages"] and resp.status == 202:
        sid, body = unquote(parts[1]), json.loads(req.body)
        first = tally.sent.get((sid, data.get("seq")))
        if first is not None:  # a message sent again with its key: answered as the first was, recorded once
            if first != body["text"]:
                tally.failures.append(f"a 202 to {req.show(200)} names seq {data.get('seq')}, which holds another message")
            tally.resent += 1
            return
        tally.sent[sid, data.get("seq")] = body["text"]
        if "idempotency_key" in body:
            pool.sent.append((sid, req.body))
        tally.messages_accepted += 1
        tally.messages[sid] += 1
        tally.accepted.append((sid, data.get("seq"), data.get("session_id"), req.target[:200]))
    elif req.method == "POST" and parts == ["evals"] and resp.status == 202:
        tally.eval_runs.append(data["run"])
    elif req.method == "POST" and parts[:1] == ["sessions"] and parts[2:] == ["interrupt"] and data.get("interrupted") is True:
        tally.interrupts_true += 1
    elif req.method == "PATCH" and parts[:1] == ["memories"] and data.get("id") and data["id"] not in pool.memories:
        pool.memories.append(data["id"])
    elif req.method in ("PATCH", "DELETE", "PUT") and parts[:1] == ["sessions"] and len(parts) == 2:
        # another verb on a session's path: a rename, an archive or a delete (docs/api.md) that this
        # generator does not model; what it may have changed is noted as a generic route's write is
        note_generic(req, resp, data, pool, tally)


def note_generic(req: Request, resp: Response, data: Any, pool: Pool, tally: Tally) -> None:
    """A 2xx to a write of a generic route: understood ones change nothing counted; any other is opaque (its
    path's session ids may be changed or gone, the ids its answer names may be new sessions) and its ids join
    the pool, so that later requests act on what it made."""
    route = req.route.removesuffix(" (generic)")
    if (req.method, route) in UNDERSTOOD:
        return
    tally.opaque.append(f"{resp.status} to {req.method} {req.target[:200]}")
    tally.touched |= {unquote(p) for p in req.target.split("?")[0].split("/")} & {*pool.sessions, *pool.dreams}
    found = set(ids_in(data))
    tally.announced |= found
    pool.others += sorted(i for i in found if i not in pool.others)


def ids_in(data: Any, depth: int = 0) -> list[str]:
    """The string values of id-like keys (id, run, session, *_id) in a JSON answer."""
    out: list[str] = []
    if depth > 4:
        return out
    if isinstance(data, dict):
        for k, v in data.items():
            if isinstance(v, str) and (k in ("id", "run", "session") or k.endswith("_id")):
                out.append(v)
            else:
                out += ids_in(v, depth + 1)
    elif isinstance(data, list):
        for v in data[:1000]:
            out += ids_in(v, depth + 1)
    return out


async def run(host: str, port: int, token: str, *, seed: int | str, start: int, count: int, pool: Pool,
              workers: int = 4, big: bool = True, stop: asyncio.Event | None = None, dying: bool = False,
              stopping: asyncio.Event | None = None, timeout: float = 60.0, upload_mb: int | None = None,
              tally: Tally | None = None) -> Tally:
    """Send requests start..start+count-1 with `workers` connections; `stop` ends the run early.

    `dying`: the server may be killed at any moment, so a request without a response is counted
    as dropped instead of a failure (and the run ends at the first refused connection).
    `stopping`: once set, the server is shutting down and a JSON 503 is a right answer.
    `tally`: counted into as the run goes (the caller can watch it), returned at the end.
    """
    fuzzer, next_i = Fuzzer(seed, big=big, upload_mb=upload_mb), iter(range(start, start + count))
    tally = Tally() if tally is None else tally

    async def worker() -> None:
        client = RawClient(host, port, token, timeout=timeout)
        try:
            for i in next_i:
                if stop is not None and stop.is_set():
                    return
                req = fuzzer.request(i, pool)
                resp, error, refused, previous = None, "", False, client.previous
                try:
                    resp = await client.send(req)
                except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError, IndexError) as e:
                    error, refused = f"{type(e).__name__}: {e}"[:200], isinstance(e, ConnectionRefusedError)
                    if previous:
                        error += f"; the request before it on this kept-alive connection got {previous}"
                tally.requests += 1
                tally.routes[req.route] += 1
                if resp is None and dying:
                    tally.dropped += 1
                    tally.by_route[req.route, "dropped"] += 1
                    if refused:  # the server is gone: nothing more to send
                        return
                    continue
                tally.statuses[resp.status if resp is not None else "none"] += 1
                tally.by_route[req.route, resp.status if resp is not None else "none"] += 1
                problem = judge(req, resp, error, stopping=stopping is not None and stopping.is_set())
                if problem:
                    tally.failures.append(f"seed={seed!r} request #{i}: {problem}\n    {req.show()}")
                elif resp is not None:
                    note_success(req, resp, pool, tally)
        finally:
            await client.close()

    await asyncio.gather(*(worker() for _ in range(workers)))
    return tally


# -- the log's consistency -------------------------------------------------------------------------------


def check_log(session_id: str, events: list[dict[str, Any]], running: bool = False) -> list[str]:
    """What is inconsistent in one session's events (dicts with seq, type, payload); [] when nothing is."""
    problems = []
    where = f"session {session_id}"
    seqs = [e["seq"] for e in events]
    if seqs != list(range(1, len(seqs) + 1)):
        gaps = [s for a, s in zip(range(1, len(seqs) + 1), seqs) if a != s][:3]
        problems.append(f"{where}: seqs are not 1..{len(seqs)} (first off: {gaps})")
    if events and events[0]["type"] != "session_created":
        problems.append(f"{where}: seq 1 is {events[0]['type']}, not session_created")
    open_turn = False
    for e in events:
        t, at = e["type"], f"{where}#{e['seq']}"
        if t == "user_message":
            if open_turn:
                problems.append(f"{at}: a user_message while a turn is open (two open turns)")
            open_turn = True
        elif t in ("resumed", "interrupted", "turn_failed") and not open_turn:
            problems.append(f"{at}: {t} outside a turn")
        elif t == "turn_ended":
            if not open_turn:
                problems.append(f"{at}: turn_ended with no open turn (a second turn_ended)")
            open_turn = False
    if open_turn and not running:
        problems.append(f"{where}: a turn is unfinished and nothing runs it")
    if not running:
        # turn by turn: a scripted model's ids come from its request, and a dream's chunk turns send only
        # their own messages, so two identical turns may reuse ids; within a turn each call is answered once
        turns: list[list[dict[str, Any]]] = [[]]
        for e in events:
            if e["type"] == "user_message":
                turns.append([])
            turns[-1].append(e)
        for turn in turns:
            uses = [b["id"] for e in turn if e["type"] == "assistant_turn"
                    for b in e["payload"]["message"].get("content", []) if b.get("type") == "tool_use"]
            results = Counter(e["payload"].get("tool_use_id") for e in turn if e["type"] == "tool_result")
            started = Counter(e["payload"].get("tool_use_id") for e in turn if e["type"] == "tool_started")
            for u in uses:
                if results[u] != 1:
                    problems.append(f"{where}: tool call {u} answered {results[u]} times")
                if started[u] > 1:
                    problems.append(f"{where}: tool call {u} started {started[u]} times")
            for r in set(results) - set(uses):
                problems.append(f"{where}: a tool_result for {r}, which no assistant turn of its turn called")
    return problems


def check_db(path: Any, cut: bool = False, gone: Any = ()) -> tuple[list[str], dict[str, Any]]:
    """check_log over every session of a DuckDB log file nobody holds; (problems, counts).

    Nothing is half there: every event and summary row belongs to a session of the sessions table, and a
    session in `gone` (one a route removed: the caller knows which) has no row left in any of them.
    `cut`: the last server was killed, so turns may be open (the next server resumes them)."""
    from workbench.log import DuckDBLog

    log = DuckDBLog(path, read_only=True)
    try:
        problems, counts = [], Counter()
        known = {s["id"] for s in log.sessions()}
        for table in ("events", "session_summary"):
            rows = log.cursor().execute(f"SELECT DISTINCT session_id FROM {table}").fetchall()
            orphans = sorted({r[0] for r in rows} - known)
            if orphans:
                problems.append(f"{table} has rows of {len(orphans)} session(s) not in the sessions table: {orphans[:5]}")
        for sid in sorted(set(gone) & known):
            problems.append(f"session {sid} was removed, yet the sessions table still has it")
        for s in log.sessions():
            events = [e.to_json() for e in log.events(s["id"])]
            problems += check_log(s["id"], events, running=cut)
            counts["sessions"] += 1
            counts["events"] += len(events)
            # a fork's log starts with a copy of its origin's (interrupts included): those are counted apart, so
            # that the interrupts counted are the ones that happened
            forked = bool(events) and isinstance(events[0]["payload"].get("forked_from"), dict)
            for e in events:
                counts[e["type"]] += 1
                if e["type"] == "interrupted":
                    counts[("interrupted in a fork by " if forked else "interrupted by ") + str(e["payload"].get("by"))] += 1
            counts["state " + s["state"]] += 1
        return problems, dict(counts)
    finally:
        log.close()


def seed_memories(path: Any, n: int = 6) -> list[str]:
    """A log file with n proposed memories in it (the store's own API), for the review routes to act on."""
    from workbench.log import DuckDBLog
    from workbench.memory.store import MemoryStore

    log = DuckDBLog(path)
    try:
        store = MemoryStore(log)
        return [store.create(title=f"memory {i}", text=f"remember thing {i}", actor="api:fuzz", provenance=[],
                             tags=["fuzz"]) for i in range(n)]
    finally:
        log.close()


def terminate(server: Any, timeout: float = 60.0) -> None:
    """Stop a server the way a service manager does, SIGTERM: Jupyter's clean shutdown, the extension's
    included. (SIGINT, what `stop()` sends, skips it when stdin is not a terminal: the process just exits.)"""
    import signal

    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(timeout)
    assert code == 0, f"the server exited with {code} after SIGTERM: {server.log_tail()}"
    server.stop()  # whatever is left in its process group


def first_traceback(server_log: str) -> str:
    """The first traceback in a server's output, with what led to it ("" when there is none)."""
    at = server_log.find("Traceback")
    return "" if at < 0 else server_log[max(0, at - 600):at + 3000]


def wait_idle(client: Any, timeout: float = 120.0) -> None:
    """Wait until the server runs no turn and no session is unfinished: every turn in the log has ended.

    A server that just started resumes cut-off turns in the background (its start hook goes through them
    one by one, after it already answers), so "nothing running" alone is not "settled"; a session that
    stays unfinished with nothing running for `timeout` seconds is what the checks must catch.
    """
    deadline = time.monotonic() + timeout
    while True:
        sessions = client.sessions()
        running = [s["id"] for s in sessions if s["running"]]
        unfinished = [s["id"] for s in sessions if s["state"] == "unfinished" and not s["running"]]
        if not running and not unfinished:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"after {timeout:.0f} s, turns still running in {running[:5]}, "
                                 f"and unfinished with nothing running in {unfinished[:5]}\n"
                                 + "\n".join(describe(client, sid) for sid in (running + unfinished)[:3]))
        time.sleep(0.2)


def describe(client: Any, session_id: str, last: int = 25) -> str:
    """A session's kind and its last events (type and a short payload): what a failed check needs to be read."""
    s = client.session(session_id)
    lines = [f"session {session_id}: kind {s.get('kind')}, state {s.get('state')}, running {s.get('running')}"]
    for e in client.events(session_id)[-last:]:
        payload = json.dumps(e["payload"], ensure_ascii=True)
        lines.append(f"  #{e['seq']} {e['type']} {payload[:160]}")
    return "\n".join(lines)
