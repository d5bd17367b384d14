"""A seeded fuzzer of the workbench API, a raw HTTP/1.1 client for it, and the log's consistency checks.

Used by tests/server/test_fuzz.py and test_faults.py (bounded, in CI) and bench/soak.py (longer).

- `RawClient` sends exactly the bytes it is given (request target, headers, body) over a keep-alive
  connection, so that hostile paths, query strings and bodies reach the server unchanged.
- `Fuzzer(seed)` makes request number i from `random.Random(f"{seed}:{i}")`: every route, core and
  memory, every verb, valid and unknown ids, valid bodies and hostile ones (wrong types, extra fields,
  deep nesting, huge strings and arrays, lone surrogates, NaN and 1e309, bytes that are not UTF-8,
  hostile query strings and path ids). Request i is the same in every run with that seed (the ids it
  picks from the pool of created ones aside), and a failure prints the seed, i and the request.
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
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

API = "/workbench/api"
ACTIONS = ("accept", "reject", "edit", "merge", "retire", "redact")
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

    def json(self) -> Any:
        return json.loads(self.body)


class RawClient:
    """One keep-alive HTTP/1.1 connection that sends bytes as given; reconnects when the server closes it."""

    def __init__(self, host: str, port: int, token: str, timeout: float = 60.0):
        self.host, self.port, self.token, self.timeout = host, port, token, timeout
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

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

        A server may close a kept-alive connection after any response (tornado does after refusing a
        request whose body it did not read): a request that finds its reused connection closed before
        a byte of an answer is sent once more on a new one, as HTTP clients do.
        """
        reused = self.writer is not None
        try:
            return await asyncio.wait_for(self._send(req), self.timeout)
        except (ConnectionResetError, BrokenPipeError, asyncio.IncompleteReadError) as e:
            if not reused or (isinstance(e, asyncio.IncompleteReadError) and e.partial):
                raise
            return await asyncio.wait_for(self._send(req), self.timeout)

    async def _send(self, req: Request) -> Response:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 22)
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
        if resp.status == 101 or resp.headers.get("connection", "").lower() == "close":
            await self.close()  # an upgraded or closed connection is not reused
        return resp

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


def judge(req: Request, resp: Response | None, error: str = "", stopping: bool = False) -> str | None:
    """What is wrong with this response to this request, or None (`stopping`: the server was told to stop,
    so a 503 with a JSON error is the right answer)."""
    if resp is None:
        return f"no response ({error})"
    if resp.status >= 500 and not (stopping and resp.status == 503):
        return f"HTTP {resp.status}: {resp.body[:300]!r}"
    if resp.status in (101, 204) or req.method == "HEAD" or (req.method == "OPTIONS" and not resp.body):
        return None  # no body to judge (OPTIONS: Jupyter's CORS preflight answers 200 with none)
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

    def __init__(self, seed: int | str, *, big: bool = True):
        self.seed, self.big = seed, big

    def request(self, i: int, pool: Pool) -> Request:
        rng = random.Random(f"{self.seed}:{i}")
        route = rng.choice(ROUTES)
        req = route(self, rng, pool)
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
                              "undefined", "0x10", "01", "'x'", '"\\x41"', "1.", ".5", "+1"))
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
        body, what = self.body(rng, valid)
        return Request("POST", self.extra_args(rng, f"{API}/sessions"), body, route="create session", note=what)

    def session(self, rng: random.Random, pool: Pool) -> Request:
        return Request("GET", self.extra_args(rng, f"{API}/sessions/{self.sid(rng, pool)}"), route="session")

    def message(self, rng: random.Random, pool: Pool) -> Request:
        body, what = self.body(rng, {"text": text(rng, rng.choice((1, 10, 100)), blank_ok=False)}, max_bytes=4 << 20,
                               big=self.big and rng.random() < 0.3)
        return Request("POST", f"{API}/sessions/{self.sid(rng, pool)}/messages", body, route="message", note=what)

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
        action = rng.choice(ACTIONS + ("delete", ""))
        valid: dict[str, Any] = {"action": action}
        for key, make in (("title", lambda: text(rng, 20, blank_ok=False)), ("text", lambda: text(rng, 60, blank_ok=False)),
                          ("tags", lambda: [text(rng, 5, blank_ok=False)]), ("note", lambda: text(rng, 20)),
                          ("reason", lambda: text(rng, 10, blank_ok=False)),
                          ("with", lambda: rng.sample(pool.memories, min(2, len(pool.memories)))),
                          ("actor", lambda: rng.choice(("api:fuzz", "person:x", "nobody", "dream:" + "x" * 300)))):
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

    def unknown(self, rng: random.Random, pool: Pool) -> Request:
        path = rng.choice(("nosuch", "sessions/x/y/z", "sessions//messages", "memories/a/b", "", "dreams/x/y", "query/x",
                           "%FF", "sessions/%2F/events"))
        return Request(rng.choice(METHODS), f"{API}/{path}", route="unknown path")


def dumps(rng: random.Random, value: Any) -> bytes:
    """JSON as a client might send it: ASCII-escaped or raw UTF-8, compact or not."""
    return json.dumps(value, ensure_ascii=rng.random() < 0.5, separators=rng.choice(((",", ":"), (", ", ": ")))).encode("utf-8", "surrogatepass")


# the routes, weighted: messages and sessions most, since they write
ROUTES = (
    Fuzzer.sessions, Fuzzer.sessions, Fuzzer.sessions, Fuzzer.session, Fuzzer.message, Fuzzer.message, Fuzzer.message,
    Fuzzer.message, Fuzzer.events, Fuzzer.events, Fuzzer.stream, Fuzzer.interrupt, Fuzzer.interrupt, Fuzzer.resume,
    Fuzzer.hands, Fuzzer.query, Fuzzer.status, Fuzzer.memories, Fuzzer.memory, Fuzzer.memory, Fuzzer.dreams,
    Fuzzer.dream, Fuzzer.unknown,
)


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

    def add(self, other: "Tally") -> None:
        for f in ("requests", "sessions_created", "messages_accepted", "interrupts_true", "dropped"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.statuses.update(other.statuses)
        self.routes.update(other.routes)
        self.failures += other.failures


def note_success(req: Request, resp: Response, pool: Pool, tally: Tally) -> None:
    """Grow the id pool and count the writes a successful response promises (by what was sent, not meant)."""
    if resp.status >= 300 or req.method == "HEAD" or not resp.body:
        return
    try:
        data = resp.json()
    except ValueError:
        return
    path = req.target.split("?")[0].removeprefix(API).rstrip("/")
    parts = path.split("/")[1:]
    if req.method == "POST" and parts == ["sessions"] and resp.status == 201:
        pool.sessions.append(data["id"])
        tally.sessions_created += 1
    elif req.method == "POST" and parts == ["dreams"] and resp.status == 202:
        pool.dreams.append(data["dream_id"])
        tally.sessions_created += 1
        tally.messages_accepted += 1  # its instructions are its first user message
    elif req.method == "POST" and parts[:1] == ["sessions"] and parts[2:] == ["messages"] and resp.status == 202:
        tally.messages_accepted += 1
    elif req.method == "POST" and parts[:1] == ["sessions"] and parts[2:] == ["interrupt"] and data.get("interrupted") is True:
        tally.interrupts_true += 1
    elif req.method == "PATCH" and parts[:1] == ["memories"] and data.get("id") and data["id"] not in pool.memories:
        pool.memories.append(data["id"])


async def run(host: str, port: int, token: str, *, seed: int | str, start: int, count: int, pool: Pool,
              workers: int = 4, big: bool = True, stop: asyncio.Event | None = None, dying: bool = False,
              stopping: asyncio.Event | None = None, timeout: float = 60.0) -> Tally:
    """Send requests start..start+count-1 with `workers` connections; `stop` ends the run early.

    `dying`: the server may be killed at any moment, so a request without a response is counted
    as dropped instead of a failure (and the run ends at the first refused connection).
    `stopping`: once set, the server is shutting down and a JSON 503 is a right answer.
    """
    fuzzer, tally, next_i = Fuzzer(seed, big=big), Tally(), iter(range(start, start + count))

    async def worker() -> None:
        client = RawClient(host, port, token, timeout=timeout)
        try:
            for i in next_i:
                if stop is not None and stop.is_set():
                    return
                req = fuzzer.request(i, pool)
                resp, error, refused = None, "", False
                try:
                    resp = await client.send(req)
                except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError, IndexError) as e:
                    error, refused = f"{type(e).__name__}: {e}"[:200], isinstance(e, ConnectionRefusedError)
                tally.requests += 1
                tally.routes[req.route] += 1
                if resp is None and dying:
                    tally.dropped += 1
                    if refused:  # the server is gone: nothing more to send
                        return
                    continue
                tally.statuses[resp.status if resp is not None else "none"] += 1
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
        uses = [b["id"] for e in events if e["type"] == "assistant_turn"
                for b in e["payload"]["message"].get("content", []) if b.get("type") == "tool_use"]
        results = Counter(e["payload"].get("tool_use_id") for e in events if e["type"] == "tool_result")
        started = Counter(e["payload"].get("tool_use_id") for e in events if e["type"] == "tool_started")
        for u in uses:
            if results[u] != 1:
                problems.append(f"{where}: tool call {u} answered {results[u]} times")
            if started[u] > 1:
                problems.append(f"{where}: tool call {u} started {started[u]} times")
        for r in set(results) - set(uses):
            problems.append(f"{where}: a tool_result for {r}, which no assistant turn called")
    return problems


def check_db(path: Any, cut: bool = False) -> tuple[list[str], dict[str, Any]]:
    """check_log over every session of a DuckDB log file nobody holds; (problems, counts).

    `cut`: the last server was killed, so turns may be open (the next server resumes them)."""
    from workbench.log import DuckDBLog

    log = DuckDBLog(path, read_only=True)
    try:
        problems, counts = [], Counter()
        for s in log.sessions():
            events = [e.to_json() for e in log.events(s["id"])]
            problems += check_log(s["id"], events, running=cut)
            counts["sessions"] += 1
            counts["events"] += len(events)
            for e in events:
                counts[e["type"]] += 1
                if e["type"] == "interrupted":
                    counts["interrupted by " + str(e["payload"].get("by"))] += 1
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
                                 f"and unfinished with nothing running in {unfinished[:5]}")
        time.sleep(0.2)
