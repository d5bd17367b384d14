"""The egress proxy over TCP (egress/network.py), for kernels on a gateway: one listener, each kernel by its token."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import urllib.error
import urllib.request

import pytest
import pytest_asyncio

from workbench.egress import EgressPolicy, EgressProxy, EgressSettings, Vault
from workbench.egress.network import MAX_PENDING, NetworkEgress, proxy_env, token_of
from workbench.errors import ConfigError

from upstream import Upstream


@pytest.fixture
def upstream():
    with Upstream() as u:
        yield u


@pytest_asyncio.fixture
async def egress():
    e = NetworkEgress("127.0.0.1:0", settings=EgressSettings(egress_head_timeout=5))
    await e.start()
    try:
        yield e
    finally:
        await e.close()


def session(config: dict | None, vault: Vault | None = None, **settings) -> tuple[EgressProxy, list]:
    """A session's proxy and the events it writes."""
    events: list = []

    async def sink(type: str, payload: dict) -> None:
        events.append((type, payload))

    s = EgressSettings(**settings)
    return EgressProxy(EgressPolicy.from_config(config, s), vault, sink, s), events


async def send(egress: NetworkEgress, raw: bytes) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", egress.port)
    w.write(raw)
    try:
        return await asyncio.wait_for(r.read(), 30)
    finally:
        w.close()


def auth(token: str, user: str = "kernel") -> str:
    return "Proxy-Authorization: Basic " + base64.b64encode(f"{user}:{token}".encode()).decode() + "\r\n"


def fetch(proxy_url: str, url: str) -> tuple[int, str]:
    """As kernel code fetches: urllib with the lease's URL as its proxy (it sends the token itself)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy_url, "https": proxy_url}))
    try:
        with opener.open(url, timeout=20) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.asyncio
async def test_a_kernels_token_gets_its_sessions_policy_and_credentials_and_never_goes_upstream(egress, upstream, tmp_path):
    secret = "sk-canary-" + secrets.token_hex(8)
    allow = f"127.0.0.1:{upstream.port}"
    vault_file = tmp_path / "vault.json"
    vault_file.write_text(json.dumps({"credentials": {"example": {"value": secret, "hosts": [allow], "header": "Authorization",
                                                                  "format": "Bearer {value}"}}}))
    vault_file.chmod(0o600)
    mine, my_events = session({"allow": [allow], "credentials": ["example"]}, Vault.load(vault_file), egress_allow_private=allow)
    theirs, their_events = session(None, egress_allow_private=allow)  # another session: deny-all
    a, b = egress.lease(mine), egress.lease(theirs)
    assert a.token != b.token and a.url.startswith("http://kernel:") and a.url.endswith(f"@127.0.0.1:{egress.port}")

    status, body = await asyncio.to_thread(fetch, a.url, f"http://{allow}/data?x=1")
    assert (status, body) == (200, "ok from upstream\n")
    (seen,) = upstream.requests
    assert seen["path"] == "/data?x=1" and seen["headers"]["Authorization"] == f"Bearer {secret}"
    assert not any(k.lower() == "proxy-authorization" for k in seen["headers"]), seen["headers"]  # the token stays here
    assert [(t, p["credential"]) for t, p in my_events] == [("egress_allowed", "example")]

    status, body = await asyncio.to_thread(fetch, b.url, f"http://{allow}/theirs")
    assert status == 403 and "not on this session's egress allowlist" in body
    assert len(upstream.requests) == 1 and [t for t, _ in their_events] == ["egress_denied"]
    assert len(my_events) == 1  # each kernel's requests are its own session's events


@pytest.mark.asyncio
async def test_no_token_a_wrong_one_or_an_ended_lease_gets_407_and_is_no_sessions_event(egress, upstream):
    allow = f"127.0.0.1:{upstream.port}"
    proxy, events = session({"allow": [allow]}, egress_allow_private=allow)
    lease = egress.lease(proxy)
    ended = egress.lease(proxy)
    await ended.close()
    request = f"GET http://{allow}/ HTTP/1.1\r\nHost: {allow}\r\n"
    hostile = [
        request + "\r\n",  # no token
        request + auth("not-a-token") + "\r\n",
        request + auth(ended.token) + "\r\n",  # a lease that ended (its kernel stopped)
        request + auth("") + "\r\n",
        request + "Proxy-Authorization: Basic !!!not base64\r\n\r\n",
        request + "Proxy-Authorization: Bearer " + lease.token + "\r\n\r\n",  # not the scheme a proxy URL sends
        request + "Proxy-Authorization: Basic " + base64.b64encode(b"\xff\xfe:" + lease.token.encode()).decode() + "\r\n\r\n",
        f"CONNECT {allow} HTTP/1.1\r\n\r\n",
    ]
    for raw in hostile:
        reply = await send(egress, raw.encode("latin-1"))
        assert reply.startswith(b"HTTP/1.1 407 "), (raw, reply[:200])
        assert b'Proxy-Authenticate: Basic realm="workbench egress"' in reply and b"Proxy-Authorization" in reply
    assert upstream.requests == [] and events == [] and egress.refused == len(hostile)
    # the kernel's own token, in any header case, and its user name does not matter
    reply = await send(egress, (request + auth(lease.token, user="anyone").replace("Proxy-Authorization", "proxy-AUTHORIZATION")
                                + "\r\n").encode())
    assert reply.split(b" ")[1] == b"200", reply[:200]
    assert len(upstream.requests) == 1 and [t for t, _ in events] == ["egress_allowed"]


@pytest.mark.asyncio
async def test_hostile_heads_are_answered(egress):
    assert (await send(egress, b"GET http://x/ HTTP/1.1\r\n" + b"X: " + b"a" * 70_000 + b"\r\n\r\n")).startswith(b"HTTP/1.1 431 ")
    fast = NetworkEgress("127.0.0.1:0", settings=EgressSettings(egress_head_timeout=1))
    await fast.start()
    try:
        assert (await send(fast, b"GET http://x/ HTTP/1.1\r\n")).startswith(b"HTTP/1.1 408 ")  # no end of head in time
    finally:
        await fast.close()


@pytest.mark.asyncio
async def test_a_tokenless_flood_is_capped_and_the_listener_keeps_serving(upstream):
    # a head timeout longer than the test, so no held connection frees its place while the flood opens (a loaded
    # machine took over a second to open them all, and a 1 s timeout let every one of them in)
    egress = NetworkEgress("127.0.0.1:0", settings=EgressSettings(egress_head_timeout=120))
    await egress.start()
    held = []
    try:
        # more silent connections than MAX_PENDING: the excess is closed unread, the first MAX_PENDING wait
        held = [await asyncio.open_connection("127.0.0.1", egress.port) for _ in range(MAX_PENDING + 8)]

        async def closed_unread(r: asyncio.StreamReader) -> bool:
            try:
                return await r.read() == b""
            except ConnectionError:
                return True

        reads = [asyncio.ensure_future(closed_unread(r)) for r, _ in held]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while sum(t.done() for t in reads) < 8 and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # a ninth closed would show here
        done = [t.result() for t in reads if t.done()]
        assert len(done) == 8 and all(done), done  # exactly the excess, and with no answer
        assert egress.pending == MAX_PENDING
        for t in reads:
            t.cancel()
        for _, w in held:
            w.close()
        held = []
        while egress.pending and loop.time() < deadline:  # the held ones end as their clients close
            await asyncio.sleep(0.05)
        assert egress.pending == 0
        allow = f"127.0.0.1:{upstream.port}"
        proxy, _ = session({"allow": [allow]}, egress_allow_private=allow)
        lease = egress.lease(proxy)
        status, _ = await asyncio.to_thread(fetch, lease.url, f"http://{allow}/after")
        assert status == 200  # a kernel is served after the flood
    finally:
        for _, w in held:
            w.close()
        await egress.close()


@pytest.mark.asyncio
async def test_a_pooled_kernels_lease_follows_the_session_it_is_handed_to(egress, upstream):
    allow = f"127.0.0.1:{upstream.port}"
    pool, pool_events = session(None, egress_allow_private=allow)
    lease = egress.lease(pool)
    assert (await asyncio.to_thread(fetch, lease.url, f"http://{allow}/"))[0] == 403
    mine, my_events = session({"allow": [allow]}, egress_allow_private=allow)
    lease.proxy = mine  # adopted: the same token, the session's policy and log from now on
    assert (await asyncio.to_thread(fetch, lease.url, f"http://{allow}/"))[0] == 200
    assert [t for t, _ in pool_events] == ["egress_denied"] and [t for t, _ in my_events] == ["egress_allowed"]


@pytest.mark.asyncio
async def test_bad_addresses_are_refused_by_name():
    for listen in ("nowhere", "127.0.0.1:99999", "127.0.0.1:-1", ":80x"):
        with pytest.raises(ConfigError):
            NetworkEgress(listen)
    with pytest.raises(ConfigError, match="advertise|port"):
        NetworkEgress("127.0.0.1:0", advertise="brain-host")
    taken = NetworkEgress("127.0.0.1:0")
    await taken.start()
    try:
        again = NetworkEgress(f"127.0.0.1:{taken.port}")
        with pytest.raises(ConfigError, match="cannot listen on 127.0.0.1"):
            await again.start()
    finally:
        await taken.close()
    assert NetworkEgress("0.0.0.0:3128", advertise="brain.lab.internal:3128").address == "brain.lab.internal:3128"


def test_the_token_is_read_from_basic_only_and_the_env_sends_every_client_through_the_proxy():
    assert token_of(b"GET http://x/ HTTP/1.1\r\n" + auth("t0k").encode() + b"\r\n") == "t0k"
    assert token_of(b"GET http://x/ HTTP/1.1\r\nProxy-Authorization: Basic " + base64.b64encode(b"nopassword") + b"\r\n\r\n") is None
    assert token_of(b"GET http://x/ HTTP/1.1\r\n\r\n") is None
    env = proxy_env("http://kernel:t@10.0.0.5:3128")
    assert env["HTTP_PROXY"] == env["https_proxy"] == "http://kernel:t@10.0.0.5:3128" and env["NO_PROXY"] == ""
