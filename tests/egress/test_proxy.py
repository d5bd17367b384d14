"""The proxy on a real unix socket, without a kernel: what it resolves, refuses, caps and closes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

SPELLINGS = ["2130706433", "0x7f000001", "0177.0.0.1", "127.1", "0x7f.0.1", "127.0.0.1.", "LOCALHOST"]
EMBEDDED = {
    "[::ffff:127.0.0.1]": "an IPv4-mapped address embedding 127.0.0.1, a loopback address",
    "[::127.0.0.1]": "an IPv4-compatible address embedding 127.0.0.1, a loopback address",
    "[64:ff9b::7f00:1]": "a NAT64 address embedding 127.0.0.1, a loopback address",
    "[2002:7f00:1::1]": "a 6to4 address embedding 127.0.0.1, a loopback address",
    "[::ffff:0:7f00:1]": "a SIIT (IPv4-translated) address embedding 127.0.0.1, a loopback address",
    "[fec0::1]": "a site-local address",
    "[fe80::1%lo]": "a link-local address",
}


@pytest.mark.asyncio
async def test_every_spelling_of_loopback_is_refused_after_resolving(start_proxy, echo):
    """The session allows each spelling; the resolver's answer (127.0.0.1, or the v6 form) is what is judged."""
    p = echo.port
    hosts = [*SPELLINGS, *EMBEDDED]
    run = await start_proxy({"allow": [f"{h}:{p}" for h in hosts]}, egress_denied_per_second=1000)
    for h in hosts:
        for raw in (f"GET http://{h}:{p}/ HTTP/1.1\r\n\r\n", f"CONNECT {h}:{p} HTTP/1.1\r\n\r\n"):
            reply = (await run.send(raw.encode())).decode()
            assert reply.startswith("HTTP/1.1 403 "), (raw, reply)
            assert EMBEDDED.get(h, "resolves to 127.0.0.1, a loopback address") in reply, (raw, reply)
    assert echo.connections == 0
    assert [t for t, _ in run.events] == ["egress_denied"] * run.denials() and run.denials() == 2 * len(hosts)


@pytest.mark.asyncio
async def test_hostile_request_heads_get_an_answer_and_leave_the_proxy_serving(start_proxy, echo):
    long_label = "c" * 64 + ".example.com:443"
    run = await start_proxy({"allow": [f"127.0.0.1:{echo.port}", long_label]}, egress_denied_per_second=1000)
    hostile = [
        b"CONNECT \xff\xfe.example.com:443 HTTP/1.1\r\n\r\n",  # not UTF-8
        b"CONNECT a\x00b.example.com:443 HTTP/1.1\r\n\r\n",
        b"CONNECT example.com:99999 HTTP/1.1\r\n\r\n",
        b"CONNECT :443 HTTP/1.1\r\n\r\n",
        b"GET /relative HTTP/1.1\r\n\r\n",
        b"GET http://[::1 HTTP/1.1\r\n\r\n",
        b"\r\n\r\n",
        b"GET http://" + b"a." * 40000 + b"com/ HTTP/1.1\r\n\r\n",  # a head over the limit
        b"GET http://x/ HTTP/1.1\r\n" + b"X: " + b"[" * 30000 + b"\r\n\r\n",
        b"CONNECT \x1b[31mred\x07.example.com:443 HTTP/1.1\r\n\r\n",  # a terminal escape for whoever reads the log
        b"CONNECT " + b"b" * 300 + b".example.com:443 HTTP/1.1\r\n\r\n",
        b"CONNECT " + b"c" * 64 + b".example.com:443 HTTP/1.1\r\n\r\n",  # a label over 63 characters
        b"G\x00T\x1b http://x/ HTTP/1.1\r\n\r\n",
    ]
    replies = await asyncio.gather(*(run.send(raw) for raw in hostile))
    for raw, reply in zip(hostile, replies):
        assert reply.split(b" ")[1] in (b"400", b"403", b"431"), (raw[:60], reply[:200])
        assert b"X-Workbench-Egress: denied" in reply
    assert b"431" in replies[7] and b"over 64 KiB" in replies[7]
    assert echo.connections == 0 and run.denials() == len(hostile)
    logged = [p for t, p in run.events if t == "egress_denied"]
    for p in logged:
        for v in (p["host"], p["method"], p["reason"]):
            assert v is None or (v.isprintable() and len(v) <= 1000), p
    assert any("\\x1b[31mred\\x07" in p["reason"] for p in logged)  # escaped, not raw
    assert any("300" not in p["reason"] and "at most 253" in p["reason"] for p in logged)
    assert any("is not a valid DNS name" in p["reason"] for p in logged)
    assert (await run.send(f"CONNECT 127.0.0.1:{echo.port} HTTP/1.1\r\n\r\n".encode())).startswith(b"HTTP/1.1 403")


@pytest.mark.asyncio
async def test_connections_over_the_cap_are_refused_at_once(start_proxy):
    run = await start_proxy(egress_max_connections=4, egress_head_timeout=120)
    held = [await run.connect() for _ in range(4)]  # silent: each holds a slot until the head timeout
    for _ in range(50):
        await asyncio.sleep(0.01)
        if run.proxy.open == 4:
            break
    # a refused client that sent its request still reads the whole answer (the proxy drops its input, then closes)
    refused = await run.send(b"CONNECT example.com:443 HTTP/1.1\r\nX-Pad: " + b"p" * 30000 + b"\r\n\r\n")
    assert refused.startswith(b"HTTP/1.1 503 ") and refused.endswith(b"or open fewer at once\n")
    extra = [await run.connect() for _ in range(30)]
    replies = await asyncio.gather(*(asyncio.wait_for(r.read(), 60) for r, _ in extra))
    for reply in replies:
        assert reply.startswith(b"HTTP/1.1 503 ") and b"already has 4 egress connections open (egress_max_connections)" in reply
    assert run.proxy.open == 4
    for _, w in held:
        w.close()
    for _ in range(500):
        if run.proxy.open == 0:
            break
        await asyncio.sleep(0.01)
    assert run.proxy.open == 0
    assert (await run.send(b"CONNECT example.com:443 HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 403")  # a slot again
    await run.listener.close()  # writes the denials held back
    assert run.denials() == 32
    refusals = [p for _, p in run.events if "egress_max_connections" in p["reason"]]
    assert refusals and all((p["host"], p["port"], p["method"]) == (None, None, None) for p in refusals)


@pytest.mark.asyncio
async def test_connections_opened_all_at_once_admit_exactly_the_cap(start_proxy):
    run = await start_proxy(egress_max_connections=4, egress_head_timeout=120)
    conns = await asyncio.gather(*(run.connect() for _ in range(4 + 12)))
    reads = [asyncio.ensure_future(r.read()) for r, _ in conns]
    try:
        for _ in range(6000):  # the refused are answered at once; the admitted wait for a head
            if sum(t.done() for t in reads) >= 12:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # time for a 13th answer, if one were coming
        refused = [t for t in reads if t.done()]
        # a refusal is a 503, or, once `cap` refused clients linger, a close that may lose the answer
        assert len(refused) == 12 and all(isinstance(t.exception(), OSError) or t.result().startswith(b"HTTP/1.1 503 ")
                                          for t in refused)
        assert run.proxy.open == 4
    finally:
        for t in reads:
            t.cancel()
        for _, w in conns:
            w.close()
    for _ in range(500):
        if run.proxy.open == 0:
            break
        await asyncio.sleep(0.01)
    assert run.proxy.open == 0  # every admitted connection gave its slot back


@pytest.mark.asyncio
async def test_a_connection_that_sends_nothing_is_answered_and_closed(start_proxy):
    run = await start_proxy(egress_head_timeout=0.5)
    r, w = await run.connect()
    w.write(b"GET http://exam")  # a head that never ends
    reply = await asyncio.wait_for(r.read(), 60)
    w.close()
    assert reply.startswith(b"HTTP/1.1 408 ") and b"egress_head_timeout" in reply
    assert run.proxy.open == 0


@pytest.mark.asyncio
async def test_a_silent_tunnel_is_closed_and_a_busy_one_is_not(start_proxy, echo):
    allow = f"127.0.0.1:{echo.port}"
    run = await start_proxy({"allow": [allow]}, egress_allow_private=allow, egress_idle_timeout=1.0)

    async def tunnel():
        r, w = await run.connect()
        w.write(f"CONNECT {allow} HTTP/1.1\r\n\r\n".encode())
        assert (await r.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        return r, w

    (sr, sw), (br, bw) = await tunnel(), await tunnel()
    got = b""
    for i in range(25):  # 2.5 s of one byte every 0.1 s: never silent for a second
        bw.write(b"%d" % (i % 10))
        got += await asyncio.wait_for(br.readexactly(1), 60)
    assert got == b"0123456789" * 2 + b"01234" and not br.at_eof()
    assert await asyncio.wait_for(sr.read(), 60) == b""  # the silent one was closed long ago
    bw.close()
    sw.close()


@pytest.mark.asyncio
async def test_a_denial_flood_writes_few_events_and_counts_every_denial(start_proxy):
    run = await start_proxy(egress_denied_per_second=5)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for i in range(200):
        assert (await run.send(f"CONNECT blocked-{i}.example.com:443 HTTP/1.1\r\n\r\n".encode())).startswith(b"HTTP/1.1 403")
    elapsed = loop.time() - t0
    written = len(run.events)
    assert written <= 5 + 5 * elapsed + 1, (written, elapsed)
    for _ in range(300):  # the held-back count is written as soon as the bucket allows
        if run.denials() == 200:
            break
        await asyncio.sleep(0.01)
    assert run.denials() == 200
    assert run.events[-1][1]["host"] == "blocked-199.example.com" and run.events[-1][1]["suppressed"] > 0
    assert run.proxy.denials.denied == 200


@pytest.mark.asyncio
async def test_an_upstream_that_never_answers_gets_a_504(start_proxy):
    async def mute(reader, writer):
        await reader.read()  # reads the request, answers nothing

    server = await asyncio.start_server(mute, "127.0.0.1", 0)
    allow = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        run = await start_proxy({"allow": [allow]}, egress_allow_private=allow, egress_idle_timeout=0.5)
        reply = await run.send(f"GET http://{allow}/slow HTTP/1.1\r\n\r\n".encode())
    finally:
        server.close()
    assert reply.startswith(b"HTTP/1.1 504 ") and b"sent nothing for 0.5 s (egress_idle_timeout)" in reply
    assert [t for t, _ in run.events] == ["egress_allowed"]


@pytest.mark.asyncio
async def test_closing_with_connections_open_ends_them_quietly(start_proxy, caplog):
    run = await start_proxy()
    held = [await run.connect() for _ in range(3)]
    for _ in range(500):
        if run.proxy.open == 3:
            break
        await asyncio.sleep(0.01)
    await run.listener.close()
    assert [await asyncio.wait_for(r.read(), 60) for r, _ in held] == [b""] * 3
    assert run.proxy.open == 0
    await asyncio.sleep(0.1)  # asyncio reports a handler's end on the next turns of the loop
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


@pytest.mark.asyncio
async def test_a_socket_path_over_the_kernels_limit_still_serves(start_proxy, echo, tmp_path):
    """A session's run directory deep in a long TMPDIR: its socket's path is over the 107 bytes a Unix socket
    address holds, and the proxy listens there all the same (and removes it when closed)."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    run = await start_proxy({"allow": [f"127.0.0.1:{echo.port}"]}, where=deep)
    assert len(run.path) > 107 and Path(run.path).is_socket()
    reply = (await run.send(f"CONNECT 127.0.0.1:{echo.port} HTTP/1.1\r\n\r\n".encode())).decode()
    assert reply.startswith("HTTP/1.1 403 ") and "loopback" in reply, reply
    await run.listener.close()
    assert not Path(run.path).exists()

