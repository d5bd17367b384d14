"""The egress proxy: the hands' only way out, owned by the brain's process.

An asyncio HTTP forward proxy (CONNECT tunnels and absolute-URI requests)
listening on a unix socket in a kernel's run directory; inside the sandbox
socat bridges it to 127.0.0.1:3128, the kernel's HTTP(S)_PROXY. Each request
is checked against the session's policy, its target name is resolved here
and every address is checked (never loopback, private, link-local or
metadata unless the host's settings name that ip:port), and the proxy then
connects to the address it checked, so a name cannot be re-pointed between
the check and the connection.

Credentials are added only to requests the proxy can see: plain-HTTP
requests (the gateway form). `http://api.example.com:443/...` makes the proxy
speak TLS to port 443 upstream and add the credential's header there. A
CONNECT tunnel is opaque, so it carries no credential; we do not intercept
TLS (that would need a CA inside the sandbox for little gain).

What kernel code can make the server spend is capped per session (see
budget.py): connections open at once (the excess is answered 503 and closed
before anything is read), seconds to send a request head, seconds of silence
on an open connection, and `egress_denied` events per second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import ssl
from pathlib import Path
from typing import Any, Protocol, overload
from urllib.parse import urlsplit

from ..errors import ConfigError
from .addresses import classify
from .budget import DenialLog, EventSink, Silence
from .policy import EgressPolicy, EgressSettings, normalise_host, split_hostport
from .vault import Credential, Vault

HOP_BY_HOP = frozenset({"connection", "proxy-connection", "keep-alive", "proxy-authorization", "te", "trailer", "upgrade", "host"})
MAX_HEAD = 64 * 1024
MAX_HOST = 253  # the longest DNS name
MAX_REASON = 1000
HOST_CHARS = re.compile(r"[a-z0-9._~%:\-]+")  # names (lowercased), IPv4 and IPv6 literals with a zone id
CHUNK = 65536
LINGER = 1.0  # seconds a refused connection waits for its client to close
log = logging.getLogger("workbench.egress")


class Denied(Exception):
    """A request the policy refuses; `status` and a reason the model can act on."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


class EgressProxy:
    """One session's egress: its policy, the vault's credentials for it, its events."""

    def __init__(
        self,
        policy: EgressPolicy,
        vault: Vault | None = None,
        on_event: EventSink | None = None,
        settings: EgressSettings | None = None,
    ):
        self.policy, self.vault, self.on_event = policy, vault or Vault(), on_event
        self.settings = settings or EgressSettings()
        # fail at once (a kernel that cannot start) rather than at the first request
        self.credentials: list[Credential] = [self.vault.get(n) for n in policy.credentials]
        self.open = 0  # connections open now, over every kernel of the session
        self.lingering = 0  # refused connections waiting for their client to close
        self.denials = DenialLog(self._emit, self.settings.egress_denied_per_second)

    async def listen(self, path: Path, uid: int | None = None, gid: int | None = None) -> Listener:
        """Serve on a unix socket at `path`, owned by uid:gid, mode 0600."""
        listener = Listener(self, Path(path))

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await connection(listener, reader, writer)

        # a backlog of the cap: a flood then waits in the operating system's listen queue, not as sockets accepted here
        backlog = self.settings.egress_max_connections
        listener.server = await _unix_server(handle, Path(path), limit=MAX_HEAD, backlog=backlog)
        os.chmod(path, 0o600)
        if uid is not None:
            os.chown(path, uid, gid if gid is not None else uid)
        return listener

    async def _emit(self, type: str, payload: dict[str, Any]) -> None:
        if self.on_event is not None:
            await self.on_event(type, payload)

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Too many connections at once: answer 503 without waiting for the request, and close."""
        cap = self.settings.egress_max_connections
        reason = (
            f"this session already has {cap} egress connections open (egress_max_connections); "
            "close connections you no longer need, or open fewer at once"
        )
        await self._deny(writer, None, None, None, Denied(503, reason), drain=False)
        if self.lingering >= cap:
            return  # a flood: close at once, even if the client then loses the answer
        # closing a socket with unread input resets it, and the client may lose the answer with it:
        # so read (and drop) what it sends, briefly, until it closes; at most `cap` such at a time
        self.lingering += 1
        try:
            writer.write_eof()
            async with asyncio.timeout(LINGER):
                dropped = 0
                while dropped < MAX_HEAD and (data := await reader.read(CHUNK)):
                    dropped += len(data)
        except (TimeoutError, OSError):
            pass
        finally:
            self.lingering -= 1

    # -- one connection ----------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes | None = None) -> None:
        """One connection: its request read (unless its head was read already: `head`), judged, and served."""
        if head is None:
            try:
                head = await read_head(reader, self.settings)
            except Denied as d:
                return await self._deny(writer, None, None, None, d)
        lines = head.decode("latin-1").split("\r\n")
        method, target = (lines[0].split(" ") + ["", ""])[:2]
        headers = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:] if line)]
        host, port, url = target, 0, None
        try:
            if any("\n" in line or "\r" in line for line in lines):
                raise Denied(400, "a request line or header contains a bare CR or LF")
            if method == "CONNECT":
                host, port = split_hostport(target)
            else:
                url = urlsplit(target)
                if url.scheme != "http" or not url.hostname:
                    raise Denied(
                        400,
                        "the egress proxy takes CONNECT (https) and absolute http:// URLs; to have this session's "
                        "credentials added for an https host, request http://HOST:443/PATH and the proxy speaks TLS upstream",
                    )
                host, port = normalise_host(url.hostname), url.port or 80
            if len(host) > MAX_HOST:
                raise Denied(400, f"the host name is {len(host)} characters long; a DNS name has at most {MAX_HOST}")
            if not HOST_CHARS.fullmatch(host):
                raise Denied(400, f"the host name {host!r} has characters no DNS name or IP address has; send its ASCII (punycode) form")
            up_r, up_w, cred = await self._open(method, host, port, tls=url is not None and port == 443)
        except (ConfigError, ValueError) as e:
            return await self._deny(writer, method, host, port, Denied(400, str(e)))
        except Denied as d:
            return await self._deny(writer, method, host, port, d)
        idle = self.settings.egress_idle_timeout
        try:
            async with Silence(idle) as watch:
                if url is None:
                    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    watch.answered = True
                    await writer.drain()
                    await asyncio.gather(_pipe(reader, up_w, watch), _pipe(up_r, writer, watch))
                else:
                    await self._forward(method, url, headers, cred, reader, writer, up_r, up_w, watch)
        except TimeoutError:
            if not watch.answered:
                gone = Denied(504, f"the upstream host sent nothing for {idle:g} s (egress_idle_timeout)")
                await self._deny(writer, method, host, port, gone, emit=False)
        finally:
            up_w.close()

    async def _forward(self, method, url, headers, cred, reader, writer, up_r, up_w, watch: Silence) -> None:
        """Send one request upstream (credential added, Host fixed) and relay the answer."""
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        out = [f"{method} {path} HTTP/1.1", f"Host: {url.netloc.rpartition('@')[2]}"]
        drop = HOP_BY_HOP | ({cred.header.lower()} if cred else set())
        out += [f"{k}: {v}" for k, v in headers if k.lower() not in drop]
        if cred is not None:
            out.append(f"{cred.header}: {cred.header_value()}")
        out.append("Connection: close")
        up_w.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
        body = asyncio.create_task(_pipe(reader, up_w, watch))
        try:
            resp = await up_r.readuntil(b"\r\n\r\n")
            watch.touch()
            lines = resp.decode("latin-1").split("\r\n")
            keep = [line for line in lines[1:] if line and line.partition(":")[0].strip().lower() not in HOP_BY_HOP]
            writer.write(("\r\n".join([lines[0], *keep, "Connection: close"]) + "\r\n\r\n").encode("latin-1"))
            watch.answered = True
            await _pipe(up_r, writer, watch)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
            why = ("closed the connection without answering" if isinstance(e, asyncio.IncompleteReadError)
                   else f"answered with headers over {MAX_HEAD // 1024} KiB")
            await self._deny(writer, method, url.hostname or "", url.port or 80, Denied(502, f"the upstream host {why}"), emit=False)
        finally:
            body.cancel()

    # -- the decision --------------------------------------------------------

    async def _open(self, method: str, host: str, port: int, *, tls: bool):
        """Check host:port against the policy, then connect to a checked address."""
        p = self.policy
        cred = None if method == "CONNECT" else next((c for c in self.credentials if c.matches(host, port)), None)
        listed = p.allows(host, port) or any(c.matches(host, port) for c in self.credentials)
        if not listed:
            raise Denied(
                403,
                f"host {host}:{port} is not on this session's egress allowlist; ask the user to add "
                f'"{host}:{port}" to the session\'s egress allow list',
            )
        if p.max_requests is not None and p.used >= p.max_requests:
            raise Denied(403, f"this session's egress limit of {p.max_requests} requests is used up; "
                              "ask the user to raise egress.max_requests")
        try:
            async with asyncio.timeout(self.settings.egress_connect_timeout):
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            raise Denied(502, f"host {host} does not resolve ({e.strerror})") from None
        except UnicodeError as e:  # the IDNA codec refuses it, e.g. a label over 63 characters
            raise Denied(400, f"host {host} is not a valid DNS name ({e})") from None
        except TimeoutError:
            raise Denied(504, f"host {host} did not resolve within {self.settings.egress_connect_timeout:g} s") from None
        # the resolver's answer is what counts: 2130706433, 0x7f.1 and ::ffff:127.0.0.1 all come back as addresses
        addrs = list(dict.fromkeys(str(i[4][0]) for i in infos))  # an IPv4 or IPv6 sockaddr starts with the address text
        for a in addrs:
            why = classify(a)
            if why is not None and not p.private_ok(a, port):
                raise Denied(
                    403,
                    f"host {host} resolves to {a}, {why}; the egress proxy never connects "
                    "to loopback, private, link-local or metadata addresses",
                )
        p.used += 1
        await self._emit("egress_allowed", {"host": host, "port": port, "method": method, "credential": cred.name if cred else None})
        ctx = ssl.create_default_context(cafile=self.settings.egress_ca_file or None) if tls else None
        try:
            r, w = await asyncio.wait_for(
                asyncio.open_connection(addrs[0], port, ssl=ctx, server_hostname=host if tls else None),
                self.settings.egress_connect_timeout,
            )
        except (TimeoutError, OSError, ssl.SSLError) as e:
            raise Denied(502, f"could not connect to {host}:{port} ({e.__class__.__name__}: {e})") from None
        return r, w, cred

    async def _deny(self, writer: asyncio.StreamWriter, method: str | None, host: str | None, port: int | None, d: Denied,
                    emit: bool = True, drain: bool = True) -> None:  # fmt: skip
        # the request's own words are kernel input: escaped and cut to size before they reach the log or the reply
        reason = _clean(d.reason, MAX_REASON)
        if emit:
            await self.denials.deny({"host": _clean(host, MAX_HOST), "port": port, "method": _clean(method, 32), "reason": reason})
        await answer(writer, Denied(d.status, reason), drain=drain)


async def read_head(reader: asyncio.StreamReader, settings: EgressSettings) -> bytes:
    """A connection's request line and headers, within `egress_head_timeout` and MAX_HEAD; else Denied."""
    try:
        async with asyncio.timeout(settings.egress_head_timeout):
            return await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise Denied(431, f"the request line and headers are over {MAX_HEAD // 1024} KiB") from None
    except TimeoutError:
        raise Denied(408, f"no request line and headers within {settings.egress_head_timeout:g} s "
                          "(egress_head_timeout)") from None


async def answer(writer: asyncio.StreamWriter, d: Denied, headers: tuple[str, ...] = (), drain: bool = True) -> None:
    """Refuse a request: its status, and its reason (already fit for the client) in the status line and body."""
    body = (d.reason + "\n").encode()
    # the reason is in the status line too: for CONNECT, clients show only that line
    phrase = "".join(c if " " <= c <= "~" else "?" for c in d.reason[:400])
    extra = "".join(f"{h}\r\n" for h in headers)
    writer.write(
        f"HTTP/1.1 {d.status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n{extra}"
        f"Content-Length: {len(body)}\r\nX-Workbench-Egress: denied\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    if drain:
        with contextlib.suppress(ConnectionError):
            await writer.drain()


class Listener:
    """One kernel's socket on a proxy; closing it also ends its open connections."""

    def __init__(self, proxy: EgressProxy, path: Path):
        self.proxy, self.path = proxy, path
        self.server: asyncio.AbstractServer | None = None
        self.tasks: set[asyncio.Task] = set()
        self.closing = False

    async def close(self) -> None:
        """Stop listening, end open connections and write the session's held-back denials."""
        self.closing = True
        if self.server is not None:
            self.server.close()
        await end(self)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class Way(Protocol):
    """A kernel's way in to its session's proxy: a `Listener` (a Unix socket) or a `Lease` (network.py)."""

    proxy: EgressProxy
    tasks: set[asyncio.Task]
    closing: bool


async def end(way: Way) -> None:
    """End a way in: its open connections end, and its session's held-back denials are written."""
    way.closing = True
    pending = list(way.tasks)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    try:
        await way.proxy.denials.flush()
    except Exception:  # the log may be closing too; the count must not vanish without a word
        log.warning("egress: %d denials were not written to the log", way.proxy.denials.pending, exc_info=True)


async def connection(way: Way, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     head: bytes | None = None) -> None:
    """Serve one connection of a kernel's way in by its proxy, within the session's cap of connections open at
    once; `head` if it was read already."""
    # the way's proxy at this moment: a pooled kernel is handed to a session's proxy
    proxy: EgressProxy = way.proxy
    task = asyncio.current_task()
    assert task is not None, "asyncio runs each connection's handler as a task"
    way.tasks.add(task)
    admitted = proxy.open < proxy.settings.egress_max_connections
    if admitted:
        proxy.open += 1
    try:
        if admitted:
            await proxy._serve(reader, writer, head)
        else:
            await proxy._refuse(reader, writer)
    except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
        pass
    except asyncio.CancelledError:
        # closing the way ends us; on Python 3.11 a cancelled handler is logged as an error by asyncio
        if not way.closing:
            raise
    finally:
        if admitted:
            proxy.open -= 1
        way.tasks.discard(task)
        writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, watch: Silence) -> None:
    """Copy bytes until EOF, then half-close the other side; every chunk resets the silence."""
    try:
        while data := await reader.read(CHUNK):
            watch.touch()
            writer.write(data)
            await writer.drain()
            watch.touch()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


@overload
def _clean(text: str, limit: int) -> str: ...
@overload
def _clean(text: str | None, limit: int) -> str | None: ...
def _clean(text: str | None, limit: int) -> str | None:
    """Kernel-supplied text fit for the log: control characters escaped, at most `limit` characters."""
    if text is None:
        return None
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[: limit + 1])
    return text if len(text) <= limit else text[: limit - 1] + "…"


SUN_PATH_MAX = 107  # bytes of a socket's path (sockaddr_un.sun_path, NUL-terminated, on Linux)


async def _unix_server(handle: Any, path: Path, **kw: Any) -> asyncio.AbstractServer:
    """A Unix socket server at `path`, however long its directory's name: a path over the kernel's limit
    (a deep TMPDIR) is bound through /proc/self/fd of the directory, a short path to the same place."""
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        return await asyncio.start_unix_server(handle, path=str(path), **kw)
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        return await asyncio.start_unix_server(handle, path=f"/proc/self/fd/{fd}/{path.name}", **kw)
    finally:
        os.close(fd)

