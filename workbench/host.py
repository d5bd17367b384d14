"""The host: one object that builds the workbench's parts, wires them and closes them in order.

    async with Host.open(db) as host:
        sid = host.brain.create_session(model="scripted")["id"]
        await host.brain.run_turn(sid, "hello")

The server extension, every CLI command, the demo, dreams and the benchmarks
use it. It opens the session log, loads the plugins, makes the hands factory
and the brain (with the plugins' tools, models and prompt contributions),
then starts the plugins; `close()` undoes it in reverse: plugins, turns and
hands, background jobs, the hands factory, the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .brain import Brain, BrainSettings
from .brain.models import Cassette, ModelCatalog
from .brain.models.base import EFFORTS, THINKING
from .brain.tools import BUILTIN_TOOLS, Tool
from .config import from_env
from .errors import PluginError
from .hands import HandsConfig
from .hands.factory import HandsFactory, HandsSettings
from .log import EVENT_TYPES, DuckDBLog, LogSettings, ManagedLog, default_db_path
from .plugins import Plugin
from .plugins.loading import BUILTIN_PLUGINS, PluginSettings, load_plugins
from .usage import Prices

log = logging.getLogger("workbench.host")

@dataclass
class HostSettings(PluginSettings):
    """What one host is (env: WORKBENCH_<FIELD>); documented in docs/settings.md. Which plugins it loads
    (`plugins`, `disable_plugins`) are the fields of PluginSettings, which the notebook client reads too."""

    db: str = ""  # the DuckDB session log; empty: workbench/workbench.duckdb in the Jupyter data dir
    model: str = ""  # the model of sessions created without one; empty: claude-opus-5-5 with a key, else scripted
    reap_on_start: bool = True  # at start, stop hands kernels left behind by a host that died
    cassette: str = ""  # a cassette file every model call is replayed from or recorded into; empty: none
    cassette_mode: str = "replay"  # replay, record or record-missing (see docs/cassettes.md)
    models: str = ""  # the models offered when a session is created, comma-separated; empty: the default and scripted
    prices: str = ""  # NAME=IN/OUT dollars per million input/output tokens, comma-separated; NAME may end in *


def version() -> str:
    """The installed package's version."""
    try:
        from importlib.metadata import version as _v

        return _v("jupyter-workbench")
    except Exception:
        return "unknown"


def settings_classes(plugins: Iterable[Plugin] = ()) -> list[type]:
    """Every config class whose fields docs/settings.md documents: the core's and the plugins'."""
    from .egress import EgressSettings
    from .hands.files import FilesSettings
    from .hands.isolating import SandboxSettings, SeccompSettings, WorkspaceSettings

    classes: list[type] = [HostSettings, LogSettings, BrainSettings, HandsConfig, HandsSettings, SandboxSettings,
                           SeccompSettings, WorkspaceSettings, EgressSettings, FilesSettings]
    for p in plugins:
        classes += list(p.settings_classes())
    return classes


def _merge(kind: str, parts: Iterable[tuple[str, Mapping[str, Any]]], base: Mapping[str, Any]) -> dict[str, Any]:
    """Contributions of plugins by name, refusing a name two of them (or a built-in) claim."""
    out = dict(base)
    for plugin, items in parts:
        for name, value in items.items():
            if name in out:
                raise PluginError(f"plugin {plugin!r} adds {kind} {name!r}, which exists already")
            out[name] = value
    return out


class Host:
    """The log, the plugins, the hands factory and the brain of one process, built and closed in order."""

    def __init__(self, *, log: ManagedLog, settings: HostSettings, plugins: Sequence[Plugin], hands: HandsFactory | None,
                 brain_settings: BrainSettings | None = None, model_factory: Any = None):
        self.log = log
        self.settings = settings
        self.plugins = list(plugins)
        self.hands = hands
        self._jobs: set[asyncio.Task] = set()
        self._started = self._closed = False
        for p in self.plugins:
            p.attach(self)
        self.tools: Mapping[str, Tool] = _merge("tool", ((p.name, {t.name: t for t in p.tools()}) for p in self.plugins),
                                               BUILTIN_TOOLS)
        self.models = ModelCatalog(
            scripts=_merge("scripted model script", ((p.name, p.scripts()) for p in self.plugins), {}),
            providers=_merge("model", ((p.name, p.models()) for p in self.plugins), {}),
            default=settings.model or None,
            cassette=Cassette(settings.cassette, settings.cassette_mode) if settings.cassette else None,
        )
        self.resumers = _merge("resumer of sessions of kind", ((p.name, p.resumers()) for p in self.plugins), {})
        self.brain = Brain(
            log,
            hands_factory=hands,
            settings=brain_settings or from_env(BrainSettings),
            model_factory=model_factory or self.models.make,
            tools=self.tools,
            prompt_hooks=[p.system_prompt for p in self.plugins],
            redact=hands.redact if hands is not None else None,
            drivers=[p.driving for p in self.plugins],
        )

    # -- building ------------------------------------------------------------------

    @classmethod
    def build(cls, db: str | Path | None = None, *, settings: HostSettings | None = None, read_only: bool = False,
              hands: HandsFactory | HandsSettings | bool = True, brain_settings: BrainSettings | None = None,
              plugins: Sequence[Plugin] | None = None, log: ManagedLog | None = None, model_factory: Any = None) -> Host:
        """Open the log and make every part; nothing runs until `start()`.

        `hands`: True for a factory from WORKBENCH_HANDS_* settings, HandsSettings or a factory of
        one's own, False for a host that runs no code (read-only commands). `plugins`: exactly
        these (None: the built-in, installed and configured ones). `log`: a log of one's own
        (e.g. the in-memory twin) instead of the DuckDB file.
        """
        s = settings or from_env(HostSettings)
        chosen = load_plugins(s) if plugins is None else list(plugins)
        extra_types = _merge("event type", ((p.name, p.event_types()) for p in chosen), EVENT_TYPES)
        if log is None:
            path = Path(db).expanduser() if db else (Path(s.db).expanduser() if s.db else default_db_path())
            log = DuckDBLog(path, read_only=read_only, event_types=extra_types,
                            settings=from_env(LogSettings, prefix="WORKBENCH_LOG_"))
        try:
            factory: HandsFactory | None
            if hands is True:
                factory = HandsFactory(from_env(HandsSettings, prefix="WORKBENCH_HANDS_"))
            elif isinstance(hands, HandsSettings):
                factory = HandsFactory(hands)
            else:
                factory = hands or None
            return cls(log=log, settings=s, plugins=chosen, hands=factory, brain_settings=brain_settings,
                       model_factory=model_factory)
        except BaseException:
            log.close()
            raise

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, db: str | Path | None = None, **kw: Any) -> AsyncIterator[Host]:
        """`build`, `start`, and `close` when the block ends (also on errors and cancellation)."""
        host = cls.build(db, **kw)
        try:
            await host.start()
            yield host
        finally:
            await host.close()

    # -- running -------------------------------------------------------------------

    async def start(self) -> None:
        """Reap orphaned kernels, warm the hands pool, start the plugins."""
        self._started = True
        if self.hands is not None:
            if self.settings.reap_on_start:
                from .hands.launching import reap_orphans

                reaped = await asyncio.to_thread(reap_orphans, self.hands.registry.dir)
                if reaped:
                    log.info("workbench: reaped %d orphaned hands kernel(s)", len(reaped))
            await self.hands.start(reap=self.settings.reap_on_start)
        for p in self.plugins:
            await p.startup()

    def plugin(self, name: str) -> Plugin:
        """The loaded plugin called `name`; PluginError when it is not loaded."""
        for p in self.plugins:
            if p.name == name:
                return p
        raise PluginError(f"the {name!r} plugin is not loaded here (loaded: {', '.join(p.name for p in self.plugins) or 'none'})")

    async def resumed_by_plugin(self, session_id: str) -> bool:
        """Whether a plugin resumes this session's kind as a whole (a dream), instead of the brain's turn resume."""
        return (await self.log.asession(session_id))["kind"] in self.resumers

    async def resume(self, session_id: str) -> Any:
        """Resume a session: its kind's plugin resumer if it has one (a dream: all of it), else its cut-off turn."""
        kind = (await self.log.asession(session_id))["kind"]
        fn = self.resumers.get(kind)
        if fn is None:
            return await self.brain.resume(session_id)
        result = await fn(session_id)
        return result.get("stop_reason") if isinstance(result, dict) else result

    def background(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run a side job (not a turn) that `close()` waits for before it closes the log."""
        task = asyncio.get_running_loop().create_task(coro)
        self._jobs.add(task)

        def done(t: asyncio.Task) -> None:
            self._jobs.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("workbench: a background job failed", exc_info=t.exception())

        task.add_done_callback(done)
        return task

    async def jobs_done(self, timeout: float = 30.0) -> None:
        """Wait for the background jobs running now."""
        if self._jobs:
            await asyncio.wait(list(self._jobs), timeout=timeout)

    @functools.cached_property
    def prices(self) -> Prices:
        """The price table of the `prices` setting (ConfigError when it is malformed)."""
        return Prices.parse(self.settings.prices)

    def model_choices(self) -> list[dict[str, Any]]:
        """The models offered when a session is created (setting `models`, then those the API key can use), the
        default first, with their settings."""
        default = self.models.default_name()
        names = [n.strip() for n in self.settings.models.split(",") if n.strip()] or ["scripted"]
        out: list[dict[str, Any]] = []
        for name in dict.fromkeys([default, *names, *(self.models.available() or ())]):
            claude = name.startswith(("claude", "anthropic:"))
            out.append({
                "name": name, "default": name == default,
                # what a session of it may set in its config (POST /sessions): Anthropic models think and take an effort
                "thinking": list(THINKING) if claude else [], "efforts": list(EFFORTS) if claude else [],
                "priced": self.prices.priced(name),
            })
        return out

    def status(self) -> dict[str, Any]:
        """What the host is: version, database, hands and sandbox, default model, running turns, plugins."""
        return {
            "version": version(),
            "db": str(sql.path) if (sql := self.log.sql()) is not None else "",
            "sandbox": self.hands.status() if self.hands is not None else {"backend": "none"},
            "default_model": self.models.default_name(),
            "sessions_running": len(self.brain.running_sessions()),
            "plugins": [p.name for p in self.plugins],
        }

    async def close(self, timeout: float = 30.0) -> None:
        """Stop the plugins, the turns and every kernel, wait for background jobs, close the log; safe twice."""
        if self._closed:
            return
        self._closed = True
        for p in reversed(self.plugins):
            if self._started:
                try:
                    await p.shutdown()
                except Exception:
                    log.exception("workbench: plugin %s failed to shut down", p.name)
        try:
            await self.brain.close(timeout)
            await self.jobs_done(timeout)
            if self.hands is not None:
                await self.hands.close()
        finally:
            await asyncio.to_thread(self.log.close)


__all__ = ["BUILTIN_PLUGINS", "Host", "HostSettings", "load_plugins", "settings_classes", "version"]
