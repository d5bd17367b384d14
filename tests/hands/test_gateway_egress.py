"""The egress proxy for kernels on a gateway (`gateway_egress`): a real kernel gateway and a real Enterprise Gateway,
the same tests for both. The kernel's HTTP clients go through the workbench's proxy with a token of their own; the
session's allowlist, credentials and log apply; the kernel never sees a credential, and a stopped kernel's token
opens nothing."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import textwrap

import pytest
import pytest_asyncio

from workbench.egress import EgressSettings
from workbench.hands.factory import HandsFactory, HandsSettings

from upstream import FETCH, Upstream

from .conftest import GATEWAYS



@pytest.fixture
def upstream():
    with Upstream() as u:
        yield u


@pytest.fixture
def secret() -> str:
    return "sk-canary-" + secrets.token_hex(12)


@pytest.fixture(params=[f"{g}{p}" for g in GATEWAYS for p in ("", "+pool")])
def gateway_hands(request, tmp_path, upstream, secret):
    """make(egress_config) -> (hands, events), on a gateway with the workbench's egress proxy for its kernels."""
    name, _, pooled = request.param.partition("+")
    gw = request.getfixturevalue(GATEWAYS[name])
    vault = tmp_path / "vault.json"
    vault.write_text(json.dumps({"credentials": {"example": {
        "value": secret, "hosts": [f"127.0.0.1:{upstream.port}"], "header": "Authorization", "format": "Bearer {value}"}}}))
    vault.chmod(0o600)
    settings = HandsSettings(backend="gateway", gateway_url=gw.url, gateway_token=gw.token, pool_size=1 if pooled else 0,
                             registry_dir=str(tmp_path / "registry"), gateway_egress="127.0.0.1:0")
    egress = EgressSettings(vault=str(vault), egress_allow_private=f"127.0.0.1:{upstream.port}")
    return settings, egress


@pytest_asyncio.fixture
async def factory(gateway_hands):
    settings, egress = gateway_hands
    async with HandsFactory(settings, egress=egress) as f:
        yield f


def session(factory, name: str, egress: dict | None):
    events: list[tuple[str, dict]] = []

    async def sink(type: str, payload: dict) -> None:
        events.append((type, payload))

    config = {"hands": {"timeout": 60, "startup_timeout": 120}, **({"egress": egress} if egress is not None else {})}
    return factory(name, config, sink), events


async def run(hands, code: str):
    obs = await hands.execute(code)
    assert obs.ok, obs.text()
    return json.loads(obs.stdout)


@pytest.mark.asyncio
async def test_a_gateway_kernel_goes_out_through_its_sessions_proxy_and_never_sees_the_credential(factory, upstream, secret):
    allow = f"127.0.0.1:{upstream.port}"
    hands, events = session(factory, "allowed", {"allow": [allow], "credentials": ["example"]})
    out = await run(hands, FETCH + textwrap.dedent(f"""
        import os
        print(json.dumps({{"allowed": fetch("http://{allow}/data?x=1"), "denied": fetch("http://example.com/"),
                           "tunnel": fetch("https://example.com/"),
                           "seen": [k for k, v in os.environ.items() if {secret!r} in v],
                           "proxy": os.environ.get("HTTP_PROXY", "")}}))
    """))
    assert out["allowed"] == [200, "ok from upstream\n"], out
    (got,) = upstream.requests
    assert got["path"] == "/data?x=1" and got["headers"]["Authorization"] == f"Bearer {secret}"  # added on the way out
    assert not any(k.lower() == "proxy-authorization" for k in got["headers"])  # the kernel's token stays with the proxy
    assert out["seen"] == [] and secret not in json.dumps(out)  # the kernel never held it
    assert out["denied"][0] == 403 and "not on this session's egress allowlist" in out["denied"][1], out
    assert out["tunnel"][0] == 0 and "403" in out["tunnel"][1], out  # a CONNECT is judged the same way
    assert out["proxy"].startswith("http://kernel:") and out["proxy"].endswith(f"@{factory._gateway.egress.address}")
    kinds = [(t, p.get("host")) for t, p in events if t.startswith("egress_")]
    assert ("egress_allowed", "127.0.0.1") in kinds and ("egress_denied", "example.com") in kinds, kinds
    (started,) = [p for t, p in events if t == "hands_started"]
    assert "the workbench's egress proxy at 127.0.0.1:" in started["limits"]["egress"], started["limits"]
    await hands.shutdown()


@pytest.mark.asyncio
async def test_each_kernel_has_its_own_token_and_a_stopped_kernels_token_opens_nothing(factory, upstream):
    allow = f"127.0.0.1:{upstream.port}"
    mine, my_events = session(factory, "mine", {"allow": [allow]})
    theirs, their_events = session(factory, "theirs", None)  # deny-all
    token = (await run(mine, "import os, json; print(json.dumps(os.environ['HTTP_PROXY']))"))
    other = (await run(theirs, "import os, json; print(json.dumps(os.environ['HTTP_PROXY']))"))
    assert token != other
    # the other session's kernel, with the host's own address: its own policy, not this one's
    out = await run(theirs, FETCH + f"print(json.dumps(fetch('http://{allow}/theirs')))")
    assert out[0] == 403 and upstream.requests == []
    assert any(t == "egress_denied" for t, _ in their_events) and not any(t.startswith("egress_") for t, _ in my_events)

    # the first kernel stops (its session's hands restart it): its token is refused from then on
    await mine.restart()
    assert (await run(mine, FETCH + f"print(json.dumps(fetch('http://{allow}/again')))"))[0] == 200  # the new kernel's
    old = token.split("//", 1)[1].split("@", 1)[0]
    host, port = token.rsplit("@", 1)[1].rsplit(":", 1)
    r, w = await asyncio.open_connection(host, int(port))
    w.write(f"GET http://{allow}/stale HTTP/1.1\r\nHost: {allow}\r\nProxy-Authorization: Basic "
            f"{base64.b64encode(old.encode()).decode()}\r\n\r\n".encode())
    reply = await asyncio.wait_for(r.read(), 30)
    w.close()
    assert reply.startswith(b"HTTP/1.1 407 "), reply[:200]
    assert [q["path"] for q in upstream.requests] == ["/again"]
    await mine.shutdown()
    await theirs.shutdown()
