"""Fixtures for the egress unit tests: a real proxy on a real unix socket, real TCP servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest_asyncio

from workbench.egress import EgressPolicy, EgressProxy, EgressSettings, Listener, Vault


class Echo:
    """A TCP server on 127.0.0.1 that echoes what it gets; counts connections."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


@pytest_asyncio.fixture
async def echo():
    e = Echo()
    e.server = await asyncio.start_server(e._handle, "127.0.0.1", 0)
    e.port = e.server.sockets[0].getsockname()[1]
    try:
        yield e
    finally:
        e.server.close()


class Running:
    """A proxy listening on a socket, and the events it wrote."""

    def __init__(self, proxy: EgressProxy, listener: Listener, events: list):
        self.proxy, self.listener, self.events = proxy, listener, events
        self.path = str(listener.path)

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if len(os.fsencode(self.path)) <= 107:
            return await asyncio.open_unix_connection(self.path)
        # a path over the kernel's limit (a deep temporary directory): through the directory's descriptor
        fd = os.open(Path(self.path).parent, os.O_PATH | os.O_DIRECTORY)
        try:
            return await asyncio.open_unix_connection(f"/proc/self/fd/{fd}/{Path(self.path).name}")
        finally:
            os.close(fd)

    async def send(self, raw: bytes) -> bytes:
        """One request on a fresh connection; the whole reply."""
        r, w = await self.connect()
        w.write(raw)
        try:
            return await asyncio.wait_for(r.read(), 60)
        finally:
            w.close()

    def denials(self) -> int:
        """Denials the log accounts for: each event, plus the ones it says were not written."""
        return sum(1 + p["suppressed"] for t, p in self.events if t == "egress_denied")


@pytest_asyncio.fixture
async def start_proxy(tmp_path: Path):
    """start(egress_config, vault=None, **settings) -> Running; every listener is closed afterwards."""
    running: list[Running] = []

    async def start(config: dict | None = None, vault: Vault | None = None, where: Path | None = None,
                    **settings) -> Running:
        events: list = []

        async def sink(type: str, payload: dict) -> None:
            events.append((type, payload))

        s = EgressSettings(**settings)
        proxy = EgressProxy(EgressPolicy.from_config(config, s), vault, sink, s)
        listener = await proxy.listen((where or tmp_path) / f"egress-{len(running)}.sock")
        running.append(Running(proxy, listener, events))
        return running[-1]

    try:
        yield start
    finally:
        for r in running:
            await r.listener.close()
