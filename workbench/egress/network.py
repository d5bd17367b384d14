"""The egress proxy over the network, for kernels on another machine (hands on a gateway).

A kernel on a gateway cannot reach a Unix socket of the brain's host, so the host listens on a TCP
address instead (`gateway_egress`), one listener for every such kernel. Each kernel gets a lease: a
token of its own, in the proxy URL it is given as HTTP(S)_PROXY (`http://kernel:TOKEN@HOST:PORT`).
Its client sends the token as `Proxy-Authorization: Basic`, and the request is then served by the
policy, credentials, budgets and log of that kernel's session, as a sandboxed kernel's socket is. A
connection without a token the listener knows gets 407 and is closed, and is no session's event; the
token never goes upstream (Proxy-Authorization is hop-by-hop), and a lease ends with its kernel.

It is a way out for the kernel, not the only one: a gateway's kernel reaches the network as its
gateway lets it. What the proxy adds is what only it can: the session's credentials on the way out
(the kernel never sees them), the record of each request (`egress_allowed`, `egress_denied`), and the
session's allowlist and budgets for what goes through it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import secrets
from urllib.parse import urlsplit

from ..errors import ConfigError
from .policy import EgressSettings, split_hostport
from .proxy import MAX_HEAD, Denied, EgressProxy, answer, connection, end, read_head

MAX_PENDING = 64  # connections at once that have not yet shown a token; more are closed at once
USER = "kernel"  # the user name of a lease's proxy URL (only its password, the token, counts)


class Lease:
    """One kernel's way in to its session's proxy through a `NetworkEgress`: its token and proxy URL."""

    def __init__(self, egress: NetworkEgress, token: str, proxy: EgressProxy):
        self.egress, self.token, self.proxy = egress, token, proxy
        self.tasks: set[asyncio.Task] = set()
        self.closing = False

    @property
    def url(self) -> str:
        """The proxy URL the kernel is given (it holds the token: the kernel's, for its own session only)."""
        return f"http://{USER}:{self.token}@{self.egress.address}"

    async def close(self) -> None:
        """End the lease: its token is refused from now on, its open connections end, its held denials are written."""
        self.egress.leases.pop(self.token, None)
        await end(self)


class NetworkEgress:
    """A TCP listener for the egress proxies of kernels on other machines; each kernel by its lease's token.

    `listen` is the address to bind (`HOST:PORT`; port 0 picks a free one), `advertise` the `HOST:PORT` the
    kernels are told to use (where the brain's host is from where they run); by default the bound address."""

    def __init__(self, listen: str, advertise: str = "", settings: EgressSettings | None = None):
        self.host, self.port = split_hostport(listen, "gateway_egress", "0.0.0.0:3128, or 127.0.0.1:0 for a free port",
                                              any_port=True)
        self.advertise = advertise.strip()
        if self.advertise:  # a ConfigError now, not a kernel lost later
            split_hostport(self.advertise, "gateway_egress_advertise", "brain.example.internal:3128")
        self.settings = settings or EgressSettings()
        self.leases: dict[str, Lease] = {}
        self.server: asyncio.AbstractServer | None = None
        self.pending = 0
        self.refused = 0  # connections that showed no known token (a count: they are no session's event)

    @property
    def address(self) -> str:
        """HOST:PORT as the kernels are to use it."""
        if self.advertise:
            return self.advertise
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    async def start(self) -> None:
        """Listen (once; later calls do nothing)."""
        if self.server is not None:
            return
        try:
            self.server = await asyncio.start_server(self._handle, self.host, self.port, limit=MAX_HEAD,
                                                     backlog=MAX_PENDING)
        except OSError as e:
            raise ConfigError(f"the egress proxy for gateway kernels cannot listen on {self.host}:{self.port} "
                              f"(gateway_egress): {e.strerror or e}") from None
        self.port = self.server.sockets[0].getsockname()[1]

    def lease(self, proxy: EgressProxy) -> Lease:
        """A new kernel's way in to `proxy` (its session's; a pooled kernel's is handed over with `lease.proxy`)."""
        if self.server is None:
            raise RuntimeError("the egress listener is not started")
        token = secrets.token_urlsafe(32)
        self.leases[token] = lease = Lease(self, token, proxy)
        return lease

    async def close(self) -> None:
        """Stop listening and end every lease."""
        for lease in list(self.leases.values()):
            await lease.close()
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await self.server.wait_closed()
            self.server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self.pending >= MAX_PENDING:  # a flood of connections that show no token: closed unread
                return
            self.pending += 1
            try:
                head = await read_head(reader, self.settings)
            except Denied as d:
                return await answer(writer, d)
            except (ConnectionError, asyncio.IncompleteReadError):
                return
            finally:
                self.pending -= 1
            lease = self.leases.get(token_of(head) or "")
            if lease is None:  # none, a wrong one, or a stopped kernel's (its lease left the table)
                self.refused += 1
                return await answer(writer, Denied(407, "this egress proxy serves workbench kernels only: send the "
                                                        "proxy URL's token (HTTP_PROXY) as Proxy-Authorization"),
                                    ('Proxy-Authenticate: Basic realm="workbench egress"',))
            await connection(lease, reader, writer, head)
        finally:
            writer.close()


def token_of(head: bytes) -> str | None:
    """The token of a request's `Proxy-Authorization: Basic` header (its password), or None."""
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() != "proxy-authorization":
            continue
        scheme, _, credentials = value.strip().partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2] or None
    return None


def proxy_env(url: str) -> dict[str, str]:
    """The variables that send a kernel's HTTP clients (urllib, requests, httpx, pip, curl) through `url`."""
    u = urlsplit(url)
    assert u.scheme == "http" and u.hostname, url
    return {name: url for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")} | {"NO_PROXY": "", "no_proxy": ""}
