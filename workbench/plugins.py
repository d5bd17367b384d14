"""The plugin surface: how features beyond the core join a host.

A plugin is an object with named hooks; every hook has a default that adds
nothing, so a plugin defines only what it contributes. The host loads its
built-in plugins (memory and dreaming, evals, delegation) and third-party ones the same way: by
a dotted path or the `workbench.plugins` entry point group. See
docs/plugins.md for a worked example.

Hooks a host calls without a running host (to build the CLI parser, the
server's routes, the docs checks):

    settings_classes()   config dataclasses whose fields docs/settings.md documents
    event_types()        extra event types (name -> one-line meaning) the log may store
    commands()           `workbench` subcommands (Command)
    routes()             (path, tornado handler class) pairs served under the API
    config_checks()      per-session config keys -> a check that raises ConfigError
    service()            its own operations on the service, over either transport (ServicePart)

Hooks of a plugin bound to a host (`attach(host)` is called once the log
exists, before the brain is made):

    tools()              Tools the brain can give sessions, by name
    models()             model prefixes -> a maker (`PREFIX:ARG` -> Model)
    scripts()            scripts of the scripted model (`scripted:NAME`)
    system_prompt(s)     a contribution to a new session's frozen system prompt
    resumers()           session kinds this plugin resumes itself (kind -> async fn(session id) -> stop reason)
    startup() / shutdown()   once the host runs / before it closes
    wake()               a server start: go on with what this plugin's sessions left unfinished
    driving(session_id)  whether it goes on with the session now, between its turns (it counts as running)
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .brain.sessions import NewSession, PromptPart

__all__ = ["Command", "CommandContext", "NewSession", "Plugin", "PromptPart"]

if TYPE_CHECKING:  # types only: plugins must not import the host at run time
    from .brain.models import ModelMaker
    from .brain.models.scripted import Script
    from .brain.tools import Tool
    from .host import Host
    from .service.parts import ServicePart


class CommandContext(Protocol):
    """What the `workbench` command gives a plugin's command."""

    def build_host(self, args: argparse.Namespace, *, read_only: bool = False, hands: bool = True) -> Host:
        """A Host for the command's --db, built, not started (`await host.start()`; close it when done)."""
        ...

    def open_host(self, args: argparse.Namespace, *, read_only: bool = False, hands: bool = True) -> Any:
        """An async context manager of a Host for the command's --db (hands: whether it may run code)."""
        ...

    def run(self, coro_fn: Callable[[], Awaitable[Any]]) -> Any:
        """Run the command's coroutine; SIGTERM and Ctrl-C interrupt it (KeyboardInterrupt), kernels are stopped."""
        ...

    def follow(self, host: Host, session_id: str, *, thinking: bool = False) -> Callable[[], None]:
        """Print a session's turn as it happens (text live, tool calls and results); returns a stop function."""
        ...


@dataclass(frozen=True)
class Command:
    """A `workbench` subcommand: its name, its one-line help, its arguments and what it does (an exit code)."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, CommandContext], int]
    needs_db: bool = True  # takes --db
    # the same command through the REST API of the workbench server that holds the database (see
    # workbench/cli/remote.py: it gets a Remote, with the server's client); None: the command needs the file itself
    remote: Callable[[argparse.Namespace, Any], int] | None = None


@dataclass
class Plugin:
    """Base class of plugins: every hook contributes nothing until a subclass says otherwise."""

    name: str = ""
    host: Host | None = field(default=None, repr=False)

    # -- without a host --------------------------------------------------------

    def settings_classes(self) -> Sequence[type]:
        return ()

    def event_types(self) -> Mapping[str, str]:
        return {}

    def commands(self) -> Sequence[Command]:
        return ()

    def routes(self) -> Sequence[tuple[str, type]]:
        return ()

    def config_checks(self) -> Mapping[str, Callable[[Any], None]]:
        return {}

    def service(self) -> ServicePart | None:
        """The operations this plugin adds to the service (memories, dreams, eval runs), over either transport."""
        return None

    # -- bound to a host -------------------------------------------------------

    def attach(self, host: Host) -> None:
        """Called once the host's log exists (the brain does not yet): keep the host, open stores."""
        self.host = host

    def tools(self) -> Sequence[Tool]:
        return ()

    def models(self) -> Mapping[str, ModelMaker]:
        return {}

    def scripts(self) -> Mapping[str, Script]:
        return {}

    def system_prompt(self, session: NewSession) -> PromptPart | None:
        return None

    def resumers(self) -> Mapping[str, Callable[[str], Awaitable[Any]]]:
        """Session kinds whose `resume` (CLI, REST, a server start) this plugin runs instead of the brain's."""
        return {}

    async def wake(self) -> list[str]:
        """A server start (after `startup`): go on with this plugin's unfinished work; the session ids."""
        return []

    def driving(self, session_id: str) -> bool:
        """Whether this plugin goes on with the session now, also between its turns (a dream between two
        chunks, an eval attempt being graded before its next turn): such a session counts as running."""
        return False

    async def startup(self) -> None:
        """The host runs (its event loop, brain and hands exist)."""

    async def shutdown(self) -> None:
        """The host is closing: turns are still running; stop what this plugin started."""
