"""The egress proxy: allowlisted hosts get the credential added; everything else gets a 403 that says why."""

from __future__ import annotations

import asyncio
import json
import os
import textwrap
import uuid

import pytest
import pytest_asyncio

from workbench.egress import EgressPolicy, EgressProxy, EgressSettings, Vault
from workbench.errors import ConfigError, VaultUnsafe
from workbench.hands import HandsConfig, KernelHands, Observation
from workbench.hands.launching import SandboxLauncher

from upstream import FETCH

from .conftest import needs_sandbox, no_process_left, run

pytestmark = needs_sandbox


SEARCH = """
import os
def search(needle, roots):
    hits = [k for k, v in os.environ.items() if needle in k or needle in v]
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        for f in ("environ", "cmdline"):
            try:
                if needle.encode() in open(f"/proc/{pid}/{f}", "rb").read():
                    hits.append(f"/proc/{pid}/{f}")
            except OSError:
                pass
    for root in roots:
        for d, _, files in os.walk(root):
            for f in files:
                try:
                    if needle.encode() in open(os.path.join(d, f), "rb").read():
                        hits.append(os.path.join(d, f))
                except OSError:
                    pass
    return hits
"""


@pytest.mark.asyncio
async def test_allowlisted_host_gets_the_credential_the_kernel_never_sees(make_hands, upstream, vault_file, secret):
    vault = Vault.load(vault_file)
    allow = f"127.0.0.1:{upstream.port}"
    hands, events = await make_hands(egress={"allow": [allow], "credentials": ["example"]}, vault=vault, allow_private=allow)
    code = FETCH + SEARCH + textwrap.dedent(f"""
        import socket, tempfile
        out = {{"allowed": fetch("http://{allow}/data?x=1"), "denied": fetch("http://example.com/"),
                "denied_tls": fetch("https://example.com/")}}
        # the request exactly as the kernel sends it, on a raw socket to the proxy
        raw = b"GET http://{allow}/raw HTTP/1.1\\r\\nHost: {allow}\\r\\n\\r\\n"
        s = socket.create_connection(("127.0.0.1", 3128)); s.sendall(raw)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
        out["raw_sent"], out["raw_reply"] = raw.decode(), reply.decode()
        # a CONNECT tunnel is opaque to the proxy: it carries no credential
        s = socket.create_connection(("127.0.0.1", 3128))
        s.sendall(b"CONNECT {allow} HTTP/1.1\\r\\nHost: {allow}\\r\\n\\r\\n")
        out["tunnel"] = s.recv(4096).decode()
        s.sendall(b"GET /tunnel HTTP/1.0\\r\\nHost: {allow}\\r\\n\\r\\n")
        out["tunnel_reply"] = b"".join(iter(lambda: s.recv(65536), b"")).decode()
        from ipykernel import get_connection_file
        run_dir = os.path.dirname(get_connection_file())
        # the needle is built here, so that this code (kept in the kernel's history) does not hold it
        out["hits"] = search({secret[::-1]!r}[::-1], [os.getcwd(), run_dir, os.environ["HOME"], "/etc", "/dev/shm"])
        print(json.dumps(out))
    """)
    out = json.loads(await run(hands, code))
    assert out["allowed"] == [200, "ok from upstream\n"]
    assert out["hits"] == []
    assert secret not in out["raw_sent"] and secret not in out["raw_reply"]
    got = [r for r in upstream.requests if r["path"] in ("/data?x=1", "/raw")]
    assert len(got) == 2 and all(r["headers"]["Authorization"] == f"Bearer {secret}" for r in got)
    assert out["tunnel"].startswith("HTTP/1.1 200") and "ok from upstream" in out["tunnel_reply"]
    assert [r["headers"].get("Authorization") for r in upstream.requests if r["path"] == "/tunnel"] == [None]
    assert out["denied"][0] == 403 and "example.com:80 is not on this session's egress allowlist" in out["denied"][1]
    assert "403" in out["denied_tls"][1] and "example.com:443" in out["denied_tls"][1]
    allowed = [p for t, p in events if t == "egress_allowed"]
    denied = [p for t, p in events if t == "egress_denied"]
    assert {"host": "127.0.0.1", "port": upstream.port, "method": "GET", "credential": "example"} in allowed
    assert {"host": "127.0.0.1", "port": upstream.port, "method": "CONNECT", "credential": None} in allowed
    assert {(d["host"], d["port"], d["method"]) for d in denied} == {("example.com", 80, "GET"), ("example.com", 443, "CONNECT")}
    assert secret not in json.dumps(events)


@pytest.mark.asyncio
async def test_proxy_refuses_loopback_and_private_targets(make_hands, upstream, bystander):
    # the session allowlists the bystander under every name, but the host never allowed its address
    j = bystander.port
    allow = [f"127.0.0.1:{j}", f"localhost:{j}", f"127.1:{j}", f"[::1]:{j}", f"0.0.0.0:{j}", "169.254.169.254:80", "10.1.2.3:80"]
    hands, events = await make_hands(egress={"allow": allow}, allow_private=f"127.0.0.1:{upstream.port}")
    code = FETCH + textwrap.dedent(f"""
        urls = ["http://127.0.0.1:{j}/api/contents", "http://localhost:{j}/", "http://127.1:{j}/", "http://[::1]:{j}/",
                "http://0.0.0.0:{j}/", "http://169.254.169.254/latest/meta-data/", "http://10.1.2.3/",
                "https://127.0.0.1:{j}/", "http://localhost:{upstream.port}/"]
        print(json.dumps({{u: fetch(u) for u in urls}}))
    """)
    out = json.loads(await run(hands, code))
    for url, (status, body) in out.items():
        assert status == 403 or "403" in body, (url, status, body)
    assert "loopback address" in out[f"http://127.0.0.1:{j}/api/contents"][1]
    assert "cloud metadata" in out["http://169.254.169.254/latest/meta-data/"][1]
    assert "private address" in out["http://10.1.2.3/"][1]
    assert "not on this session's egress allowlist" in out[f"http://localhost:{upstream.port}/"][1]
    assert bystander.connections == 0 and upstream.connections == 0
    assert await logged_denials(events, len(out)) == len(out)
    assert not [p for t, p in events if t == "egress_allowed"]


async def logged_denials(events: list, expected: int, within: float = 20.0) -> int:
    """The denials the log accounts for (events plus their `suppressed`), once they reach `expected` or time runs out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        n = sum(1 + p["suppressed"] for t, p in events if t == "egress_denied")
        if n >= expected or loop.time() > deadline:
            return n
        await asyncio.sleep(0.05)


@pytest_asyncio.fixture
async def make_session(tmp_path):
    """make(egress=, **EgressSettings fields) -> (hands, events, proxy): a sandboxed kernel with host egress settings."""
    made: list[tuple[KernelHands, str]] = []

    async def make(egress=None, **settings):
        events: list[tuple[str, dict]] = []

        async def sink(type: str, payload: dict) -> None:
            events.append((type, payload))

        mark = "wbmark" + uuid.uuid4().hex
        # the host's egress settings are the launcher's; the session's policy, and its proxy (budgets and all), its own
        launcher = SandboxLauncher(egress_settings=EgressSettings(**settings))
        work = tmp_path / f"session-{len(made)}"
        hands = KernelHands(HandsConfig(workdir=str(work), env={"WB_TEST_MARK": mark}), launcher=launcher, on_event=sink,
                            session_config={"egress": egress})
        made.append((hands, mark))
        return hands, events, launcher.proxy(hands.place)

    try:
        yield make
    finally:
        for hands, mark in made:
            await hands.shutdown()
            await no_process_left(mark)


@pytest.mark.asyncio
async def test_every_spelling_and_embedding_of_loopback_is_refused_from_the_kernel(make_session, bystander):
    """Decimal, hex, octal and short IPv4, and IPv6 forms carrying 127.0.0.1: refused, and the 403 names the form."""
    j = bystander.port
    hosts = {
        "2130706433": "resolves to 127.0.0.1, a loopback address", "0x7f000001": "resolves to 127.0.0.1, a loopback address",
        "0177.0.0.1": "resolves to 127.0.0.1, a loopback address", "127.0.1": "resolves to 127.0.0.1, a loopback address",
        "[::ffff:7f00:1]": "an IPv4-mapped address embedding 127.0.0.1", "[::127.0.0.1]": "an IPv4-compatible address embedding 127.0.0.1",
        "[64:ff9b::7f00:1]": "a NAT64 address embedding 127.0.0.1", "[2002:7f00:1::]": "a 6to4 address embedding 127.0.0.1",
        "[::ffff:0:7f00:1]": "a SIIT (IPv4-translated) address embedding 127.0.0.1", "[fec0::1]": "a site-local address",
    }  # fmt: skip
    hands, events, _ = await make_session({"allow": [f"{h}:{j}" for h in hosts]}, egress_denied_per_second=1000)
    urls = {f"http://{h}:{j}/": why for h, why in hosts.items()}
    out = json.loads(await run(hands, FETCH + f"print(json.dumps({{u: fetch(u) for u in {list(urls)!r}}}))"))
    for url, why in urls.items():
        status, body = out[url]
        assert status == 403 and why in body, (url, status, body)
    assert bystander.connections == 0
    assert [t for t, _ in events if t.startswith("egress")] == ["egress_denied"] * len(urls)


HOLD = """
import os, select, socket, time
from ipykernel import get_connection_file
SOCK = os.path.join(os.path.dirname(get_connection_file()), "egress.sock")
held = []
def hold(n):
    # open n connections straight to the proxy's socket, send nothing, keep them; what did the refused ones get?
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX)
        s.connect(SOCK)
        held.append(s)
    replies, waiting, deadline = {}, set(held), time.monotonic() + 60
    while waiting and time.monotonic() < deadline:
        ready, _, _ = select.select(list(waiting), [], [], 0.5)
        for s in ready:
            replies[s] = s.recv(4096).decode()
            waiting.discard(s)
        if not ready and len(replies) >= n - CAP:
            break
    lines = [r.split("\\r\\n")[0] for r in replies.values()]
    return [len(lines), sorted(set(lines))]
"""


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.asyncio
async def test_a_connection_flood_is_capped_and_other_sessions_keep_working(make_session, upstream):
    """Kernel code opens 400 connections to its egress socket: the server holds at most the cap."""
    cap, n = 8, 400
    flood, flood_events, proxy = await make_session(egress_max_connections=cap, egress_head_timeout=300)
    allow = f"127.0.0.1:{upstream.port}"
    other, other_events, _ = await make_session({"allow": [allow]}, egress_allow_private=allow)
    await run(flood, "1")
    await run(other, "1")
    before = open_fds()
    peak = [before]

    async def sample() -> None:
        while True:
            peak[0] = max(peak[0], open_fds())
            await asyncio.sleep(0.02)

    sampler = asyncio.get_running_loop().create_task(sample())
    try:
        refused, lines = json.loads(await run(flood, HOLD.replace("CAP", str(cap)) + f"import json; print(json.dumps(hold({n})))"))
    finally:
        sampler.cancel()
    during = open_fds()
    assert proxy.open == cap
    # the cap, as many refused ones waiting a moment for their client to close, and a handful for the kernels' bookkeeping
    assert during - before <= 2 * cap + 8, (before, during)
    # while the flood came in: those, and refusals accepted but not yet closed (a listen backlog of the cap at a time)
    assert peak[0] - before <= 10 * cap + 16, (before, peak)
    assert refused >= n - cap and len(lines) == 1 and lines[0].startswith("HTTP/1.1 503 this session already has 8 egress"), lines
    # the flooding kernel's ordinary requests are refused too, with a reason it can act on, once the
    # flood's refusals have stopped lingering (under a flood a refusal may close before the answer is read)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while proxy.lingering and loop.time() < deadline:
        await asyncio.sleep(0.05)
    busy = json.loads(await run(flood, FETCH + f"print(json.dumps(fetch('http://{allow}/')))"))
    assert busy[0] == 503 and "egress_max_connections" in busy[1], busy
    # ... while another session's egress works as before
    assert json.loads(await run(other, FETCH + f"print(json.dumps(fetch('http://{allow}/ok')))")) == [200, "ok from upstream\n"]
    await run(flood, "for s in held: s.close()\nheld.clear()")
    deadline = loop.time() + 30
    while proxy.open and loop.time() < deadline:
        await asyncio.sleep(0.05)
    assert proxy.open == 0
    assert len([p for t, p in flood_events if t == "egress_denied"]) <= 40  # the refusals are rate-limited too


@pytest.mark.asyncio
async def test_a_denial_flood_writes_a_bounded_number_of_events_that_account_for_every_denial(make_session):
    hands, events, proxy = await make_session(egress_denied_per_second=5)
    code = textwrap.dedent("""
        import socket
        statuses = []
        for i in range(300):
            s = socket.create_connection(("127.0.0.1", 3128))
            s.sendall(b"CONNECT blocked-%d.example.com:443 HTTP/1.1\\r\\n\\r\\n" % i)
            statuses.append(s.recv(4096).split(b" ")[1].decode())
            s.close()
        print(sorted(set(statuses)))
    """)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert (await run(hands, code)).strip() == "['403']"
    elapsed = loop.time() - t0
    written = sum(1 for t, _ in events if t == "egress_denied")
    assert written <= 5 + 5 * elapsed + 2, (written, elapsed)
    assert await logged_denials(events, 300) == 300 and proxy.denials.denied == 300
    assert len(events) <= 5 + 5 * (loop.time() - t0) + 2


@pytest.mark.asyncio
async def test_through_the_brain_the_log_gets_few_denials_and_no_encoded_secret(log, tmp_path, monkeypatch, secret, vault_file):
    """A real DuckDB log: 300 denials are a handful of events that add up, and re-encoded secrets are masked."""
    from workbench.brain import Brain
    from workbench.brain.models import ScriptedModel
    from workbench.brain.models.scripted import Reply
    from workbench.hands.factory import HandsFactory, HandsSettings

    monkeypatch.setenv("WORKBENCH_VAULT", str(vault_file))
    monkeypatch.setenv("WORKBENCH_EGRESS_DENIED_PER_SECOND", "3")
    work = tmp_path / "work"
    work.mkdir()
    (work / "echoed.txt").write_text(secret)  # as an allowlisted host that echoes headers would hand it back
    (work / "echoed.txt").chmod(0o644)
    flood = textwrap.dedent("""
        import socket
        for i in range(300):
            s = socket.create_connection(("127.0.0.1", 3128))
            s.sendall(b"CONNECT blocked-%d.example.com:443 HTTP/1.1\\r\\n\\r\\n" % i)
            assert s.recv(4096).startswith(b"HTTP/1.1 403")
            s.close()
    """)
    encode = textwrap.dedent("""
        import base64, urllib.parse
        v = open("echoed.txt").read()
        print(v[::-1], v.encode().hex(), v.encode().hex().upper(), base64.b64encode(v.encode()).decode(),
              base64.urlsafe_b64encode(b"{\\"k\\": \\"" + v.encode()).decode().rstrip("="), urllib.parse.quote(v, safe=""))
    """)
    factory = HandsFactory(HandsSettings(backend="sandbox", pool_size=0, registry_dir=str(tmp_path / "reg")))
    model = ScriptedModel([Reply(code=[flood, encode]), Reply(text="done")])
    brain = Brain(log, model_factory=lambda name: model, hands_factory=factory, redact=factory.redact)
    sid = brain.create_session(model="scripted", config={"hands": {"workdir": str(work)}})["id"]
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        await brain.run_turn(sid, "go")
    finally:
        await brain.close()  # closing the hands writes the denials still held back
        await factory.close()
    elapsed = loop.time() - t0
    events = log.events(sid)
    denied = [e.payload for e in events if e.type == "egress_denied"]
    assert len(denied) <= 3 + 3 * elapsed + 2, (len(denied), elapsed)
    assert sum(1 + d["suppressed"] for d in denied) == 300
    results = [e.payload for e in events if e.type == "tool_result"]
    assert [r["is_error"] for r in results] == [False, False]
    stdout = Observation.from_json(results[1]["observation"]).stdout
    assert stdout.count("[secret example]") == 6, stdout
    logged = json.dumps([e.payload for e in events])
    for spelling in (secret, secret[::-1], secret.encode().hex(), secret.encode().hex().upper()):
        assert spelling not in logged


@pytest.mark.asyncio
async def test_request_limit(make_hands, upstream):
    allow = f"127.0.0.1:{upstream.port}"
    hands, events = await make_hands(egress={"allow": [allow], "max_requests": 1}, allow_private=allow)
    out = json.loads(await run(hands, FETCH + f"print(json.dumps([fetch('http://{allow}/a'), fetch('http://{allow}/b')]))"))
    assert out[0][0] == 200 and out[1][0] == 403 and "limit of 1 requests is used up" in out[1][1]
    assert [t for t, _ in events if t.startswith("egress")] == ["egress_allowed", "egress_denied"]


def test_vault_must_be_private(tmp_path, secret):
    p = tmp_path / "vault.toml"
    p.write_text(f'[credentials.example]\nvalue = "{secret}"\nhosts = ["api.example.com:443"]\n')
    p.chmod(0o640)
    with pytest.raises(VaultUnsafe, match="chmod 600"):
        Vault.load(p)
    p.chmod(0o600)
    vault = Vault.load(p)
    assert vault.get("example").header_value() == f"Bearer {secret}"
    assert vault.redact(f"token={secret}!") == "token=[secret example]!"
    with pytest.raises(ConfigError, match="not in the vault"):
        vault.get("other")


@pytest.mark.asyncio
async def test_unknown_credential_is_an_observation(make_hands):
    hands, _ = await make_hands(egress={"credentials": ["nope"]}, vault=Vault())
    obs = await hands.execute("print(1)")
    assert not obs.ok and "credential 'nope' is not in the vault" in obs.text()


@pytest.mark.asyncio
async def test_proxy_rewrites_what_the_kernel_sends(tmp_path, upstream, secret):
    """Host comes from the URL, the kernel's own credential header and proxy headers are dropped."""
    allow = f"127.0.0.1:{upstream.port}"
    vault = Vault.from_dict({"credentials": {"example": {"value": secret, "hosts": [allow]}}})
    events: list = []

    async def sink(type: str, payload: dict) -> None:
        events.append((type, payload))

    policy = EgressPolicy.from_config({"credentials": ["example"]}, EgressSettings(egress_allow_private=allow))
    listener = await EgressProxy(policy, vault, sink).listen(tmp_path / "egress.sock")

    async def send(raw: bytes) -> bytes:
        # through /proc/self/fd of its directory: a deep TMPDIR (a worker's, an unprivileged run's) passes the
        # kernel's 107 bytes for a socket path, as the proxy itself allows for (egress/proxy.py)
        dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            r, w = await asyncio.open_unix_connection(f"/proc/self/fd/{dfd}/egress.sock")
        finally:
            os.close(dfd)
        w.write(raw)
        reply = await r.read()
        w.close()
        return reply

    try:
        reply = await send(
            f"GET http://{allow}/x HTTP/1.1\r\nHost: other.example\r\nAuthorization: Bearer mine\r\n"
            "Proxy-Authorization: Basic eA==\r\nConnection: keep-alive\r\n\r\n".encode()
        )
        smuggled = await send(f"GET http://{allow}/y HTTP/1.1\r\nX-A: 1\nGET /z HTTP/1.1\r\n\r\n".encode())
    finally:
        await listener.close()
    assert reply.startswith(b"HTTP/1.0 200") and b"Connection: close" in reply
    (got,) = upstream.requests
    assert got["headers"]["Host"] == allow and got["headers"]["Authorization"] == f"Bearer {secret}"
    assert "Proxy-Authorization" not in got["headers"] and got["headers"]["Connection"] == "close"
    assert smuggled.startswith(b"HTTP/1.1 400") and b"bare CR or LF" in smuggled
    assert [t for t, _ in events] == ["egress_allowed", "egress_denied"]
    assert not (tmp_path / "egress.sock").exists()


@pytest.fixture
def tls_upstream(tmp_path):
    """A TLS server on 127.0.0.1:443 with a throwaway CA, recording requests (skipped if 443 is taken)."""
    import shutil
    import ssl
    import subprocess

    from upstream import Upstream

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    try:
        u = Upstream(port=443)
    except OSError as e:
        pytest.skip(f"cannot listen on 127.0.0.1:443: {e}")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    u.server.socket = ctx.wrap_socket(u.server.socket, server_side=True)
    with u:
        yield u, cert


@pytest.mark.asyncio
async def test_gateway_form_speaks_tls_upstream_and_adds_the_credential(tmp_path, tls_upstream, secret):
    """http://host:443/... from the kernel: the proxy connects with TLS and adds the header there."""
    upstream, ca = tls_upstream
    vault = Vault.from_dict({"credentials": {"example": {"value": secret, "hosts": ["127.0.0.1:443"]}}})
    settings = EgressSettings(egress_allow_private="127.0.0.1:443", egress_ca_file=str(ca))
    listener = await EgressProxy(EgressPolicy.from_config({"credentials": ["example"]}, settings), vault, None, settings).listen(
        tmp_path / "egress.sock"
    )
    try:
        r, w = await asyncio.open_unix_connection(str(tmp_path / "egress.sock"))
        w.write(b"GET http://127.0.0.1:443/over-tls HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        reply = await r.read()
        w.close()
    finally:
        await listener.close()
    assert reply.startswith(b"HTTP/1.0 200") and reply.endswith(b"ok from upstream\n")
    assert [(q["path"], q["headers"]["Authorization"]) for q in upstream.requests] == [("/over-tls", f"Bearer {secret}")]
