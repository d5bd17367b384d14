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
    client()             methods of the notebook client (`wb.NAME(...)`), functions of the client

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
import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..brain.sessions import NewSession, PromptPart

__all__ = ["Command", "CommandContext", "NewSession", "Plugin", "PluginBrain", "PluginHands", "PluginHost", "PromptPart"]

if TYPE_CHECKING:  # types only: the surface's parts are imported from its modules (tools, models, log, ...)
    from ..brain.models import Model, ModelMaker
    from ..brain.models.scripted import Script
    from ..brain.tools import Tool
    from ..egress import Vault
    from ..hands import Hands
    from ..log import Event, SessionLog
    from ..service.parts import ServicePart
    from ..usage import Prices


class PluginBrain(Protocol):
    """What a plugin may ask of the brain: sessions it creates and drives, their events, hands and models."""

    def create_session(self, session_id: str | None = None, *, title: str | None = None, model: str,
                       system: str | None = None, tools: list[str] | None = None,
                       config: dict[str, Any] | None = None, kind: str = "chat", parent_id: str | None = None,
                       origin: dict[str, Any] | None = None, message: str | None = None,
                       then: Sequence[tuple[str, dict[str, Any]]] = ()) -> dict[str, Any]:
        """Create a session (its first events with it, atomically); its row."""
        ...

    async def events(self, session_id: str) -> list[Event]:
        """The session's events (the brain's cache: no read of the log when it holds them)."""
        ...

    async def hands(self, session_id: str) -> Hands:
        """The session's hands (started on first use)."""
        ...

    def model(self, name: str) -> Model:
        """The model of that name (`anthropic:...`, `scripted:...`, a plugin's prefix)."""
        ...

    async def run_turn(self, session_id: str, text: str, *, interrupted_by: str = "user") -> str:
        """Run one turn to its end; its stop reason."""
        ...

    async def start_turn(self, session_id: str, text: str, *, name_untitled: bool = False,
                         key: str | None = None) -> Event:
        """Append the user's message and start the turn in the background; the committed event."""
        ...

    async def start_resume(self, session_id: str, *, close_by: str | None = None) -> bool:
        """Resume a cut-off turn in the background; False when there is none (close_by: only close it, as
        interrupted by `close_by`: no model call)."""
        ...

    def turn_task(self, session_id: str) -> asyncio.Task | None:
        """The session's running turn (to wait for or watch), None when none runs."""
        ...

    async def resume(self, session_id: str, *, interrupted_by: str = "user", close_by: str | None = None) -> str | None:
        """Finish a turn a crash cut off; its stop reason (None: nothing to finish; close_by: as for start_resume)."""
        ...

    async def wait_turn(self, session_id: str) -> str | None:
        """Wait for the session's running turn, if any; its stop reason (None: none was running)."""
        ...

    async def interrupt(self, session_id: str, by: str = "user") -> bool:
        """Interrupt the session's running turn; whether one ran."""
        ...

    def running(self, session_id: str) -> bool:
        """Whether a turn of the session runs in this brain now."""
        ...

    def running_sessions(self) -> list[str]:
        """The sessions whose turn runs in this brain now."""
        ...

    async def close_session(self, session_id: str) -> None:
        """Stop the session's hands (its log and workspace stay)."""
        ...


class PluginModels(Protocol):
    """The host's models as a plugin sees them: the default name and a check of a name."""

    def default_name(self) -> str:
        ...

    def check(self, name: str) -> None:
        """ConfigError naming the models there are, when `name` cannot be made."""
        ...


class PluginHands(Protocol):
    """The host's hands factory as a plugin sees it: fresh hands of a plugin's own (a verifier's), and the vault
    whose secrets the hands mask in what they return."""

    vault: Vault | None

    def __call__(self, session_id: str, session_config: dict[str, Any], sink: Any,
                 replay: Any = None) -> Hands:
        ...


class PluginHost(Protocol):
    """The few services a plugin gets from the host it is attached to (`Plugin.host`); docs/plugins.md."""

    # read-only to a plugin (properties: a plugin reads them, never sets them)
    @property
    def log(self) -> SessionLog:
        """The session log (its `sql()`: the tables a plugin keeps beside the events, when the log has SQL)."""
        ...

    @property
    def brain(self) -> PluginBrain:
        ...

    @property
    def models(self) -> PluginModels:
        ...

    @property
    def hands(self) -> PluginHands | None:
        """The hands factory (None: this host runs no code)."""
        ...

    @property
    def tools(self) -> Mapping[str, Tool]:
        """Every tool of the host, the core's and the plugins', by name."""
        ...

    @property
    def prices(self) -> Prices:
        """The prices that turn usage into dollars (the host's setting)."""
        ...

    def plugin(self, name: str) -> Plugin:
        """Another plugin of this host, by name (PluginError when there is none)."""
        ...

    def background(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run a coroutine in the host's background (stopped when the host closes; its failure logged)."""
        ...

    async def start(self) -> None:
        """Start the host (its brain, hands and plugins' startup)."""
        ...

    async def close(self, timeout: float = 30.0) -> None:
        """Stop turns, hands and plugins; close the log."""
        ...


class CommandContext(Protocol):
    """What the `workbench` command gives a plugin's command."""

    def build_host(self, args: argparse.Namespace, *, read_only: bool = False, hands: bool = True) -> PluginHost:
        """A Host for the command's --db, built, not started (`await host.start()`; close it when done)."""
        ...

    def open_host(self, args: argparse.Namespace, *, read_only: bool = False, hands: bool = True) -> Any:
        """An async context manager of a Host for the command's --db (hands: whether it may run code)."""
        ...

    def run(self, coro_fn: Callable[[], Awaitable[Any]]) -> Any:
        """Run the command's coroutine; SIGTERM and Ctrl-C interrupt it (KeyboardInterrupt), kernels are stopped."""
        ...

    def follow(self, host: PluginHost, session_id: str, *, thinking: bool = False) -> Callable[[], None]:
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
    host: PluginHost | None = field(default=None, repr=False)

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

    def client(self) -> Mapping[str, Callable[..., Any]]:
        """Methods of the notebook client (`wb.NAME(...)`): functions called with the client first, which reach
        the plugin's routes with `client.call(method, path, body)`."""
        return {}

    def service(self) -> ServicePart | None:
        """The operations this plugin adds to the service (memories, dreams, eval runs), over either transport."""
        return None

    # -- bound to a host -------------------------------------------------------

    def attach(self, host: PluginHost) -> None:
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
