"""The CLI on the service: a command is written once, against a `Workbench` (workbench/service), and runs over
either transport: in-process over a host of the command's --db, or over the REST API of the workbench server
that holds the file (cli/remote.py finds it). `on_service` gives a command its two entry points.

The service runs on a loop in a thread of its own (service.Blocking): the main thread stays free for the
terminal (a prompt, Ctrl-C), and a refusal of the server is the error a local run raises, in its words.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, cast

from ..errors import RequestRefused, UnknownSession
from ..host import Host
from ..plugins import CommandContext
from ..service import Blocking, Message, Watch, Workbench
from .console import Printer

Service = Blocking[Workbench]
Body = Callable[[argparse.Namespace, Service], int]
Build = Callable[[argparse.Namespace, CommandContext], Host]


def local_error(e: BaseException) -> BaseException:
    """What an error of the service is for the CLI: a refusal of the server is the local error, same words."""
    return e.as_local() if isinstance(e, RequestRefused) else e


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM is Ctrl-C while a command runs (KeyboardInterrupt: a running turn is interrupted and recorded)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def run(opener: Callable[[], contextlib.AbstractAsyncContextManager[Workbench]], body: Callable[[Service], int]) -> int:
    """body(the service opened by `opener`), the service closed after."""
    with _sigterm_interrupts(), Blocking(opener, errors=local_error) as wb:
        return body(wb)


def on_file(host: Host) -> Callable[[], contextlib.AbstractAsyncContextManager[Workbench]]:
    """The in-process transport over `host` (built, not started: bad input is refused before a kernel starts)."""
    from ..service.local import Local

    @contextlib.asynccontextmanager
    async def opened() -> AsyncIterator[Workbench]:
        try:
            yield Local(host)
        finally:
            await host.close()

    return opened


def on_server(url: str, token: str, plugins: list[Any]) -> Callable[[], contextlib.AbstractAsyncContextManager[Workbench]]:
    """The REST transport to the server at `url`."""
    from ..service.rest import Rest

    return lambda: Rest(url, token, timeout=60.0, plugins=plugins)


def on_service(body: Body, *, read_only: bool = False, hands: bool = False,
               build: Build | None = None) -> dict[str, Any]:
    """A command's `run` and `remote` (workbench.plugins.Command) for one body: on a host of its --db (read_only,
    hands: what the host may do; `build`: a host of its own making), or through the server that holds the file."""

    def on_db(args: argparse.Namespace, ctx: CommandContext) -> int:
        # built here, in the main thread: DatabaseLocked reaches cli/main.py, which goes to the server instead
        # the CLI's own console makes the host: a Host, not just the plugins' view of one (PluginHost)
        host = build(args, ctx) if build is not None else cast(Host, ctx.build_host(args, read_only=read_only, hands=hands))
        return run(on_file(host), lambda wb: body(args, wb))

    def remote(args: argparse.Namespace, r: Any) -> int:
        return run(on_server(r.client.url, r.client.token, r.plugins), lambda wb: body(args, wb))

    return {"run": on_db, "remote": remote}


def row_or_none(wb: Service, session_id: str | None) -> dict[str, Any] | None:
    """The session's row, None if there is no such session (or no id)."""
    if not session_id:
        return None
    try:
        return wb.run(lambda s: s.session(session_id))
    except UnknownSession:
        return None


def printed(printer: Printer, extra: Callable[[Any], None] | None = None) -> Watch:
    """What hears a turn for the terminal: its events (and `extra` first), deltas and live output, printed."""

    def watch(m: Message) -> None:
        if m.kind == "event":
            if extra is not None:
                extra(m.event)
            printer.event(m.event)
        elif m.kind == "delta":
            printer.delta(m.session_id, dict(m.data or {}))
        else:
            printer.output(m.session_id, dict(m.data or {}))

    return watch


__all__ = ["Service", "local_error", "on_file", "on_server", "on_service", "printed", "row_or_none", "run"]
