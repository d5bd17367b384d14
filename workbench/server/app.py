"""The Jupyter server extension: the brain lives in the server process.

One `Workbench` app per server owns the session log (one DuckDB writer), one
Brain, one hands factory, and each session's running turn as an asyncio task
(see runtime.py). Settings are traitlets: `c.Workbench.db = ...` in
jupyter_server_config.py or `--Workbench.db=...` on the command line.
"""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Dict, Unicode

from .routes import ROUTES, pattern


def all_handlers() -> list[tuple[str, type]]:
    """Every (path, handler class) the extension serves, in docs/api.md's notation."""
    from . import memory_handlers

    return list(ROUTES) + list(memory_handlers.HANDLERS)


class Workbench(ExtensionApp):
    """The workbench server extension: session log, brain, hands and the API."""

    name = "workbench"
    load_other_extensions = True

    db = Unicode(
        "",
        config=True,
        help="The DuckDB session log. Default: $WORKBENCH_DB, else workbench/workbench.duckdb in the Jupyter data dir.",
    )
    default_model = Unicode(
        "",
        config=True,
        help="The model of sessions created without one. Default: $WORKBENCH_MODEL, else claude-opus-5-5 with ANTHROPIC_API_KEY, else scripted.",
    )
    resume_on_start = Bool(
        True, config=True, help="At start, resume (in the background) every session whose turn a dead server cut off."
    )
    reap_on_start = Bool(True, config=True, help="At start, stop hands kernels left behind by a server that died.")
    brain = Dict(
        {}, config=True, help="BrainSettings overrides, e.g. {'max_retries': 2}; fields as in docs/settings.md (Brain)."
    )
    hands = Dict(
        {}, config=True, help="HandsSettings overrides, e.g. {'pool_size': 0}; fields as in docs/settings.md (host hands settings)."
    )

    runtime: Any = None  # None when the session log could not be opened
    hands_factory: Any = None

    def initialize_settings(self) -> None:
        """Open the log and make the brain and hands factory; nothing runs yet."""
        from ..brain import Brain, BrainSettings
        from ..config import from_env
        from ..errors import ConfigError, LogError
        from ..log import SessionLog, default_db_path
        from .runtime import Runtime

        for name, cls in (("brain", BrainSettings),):
            unknown = set(getattr(self, name)) - set(cls.__dataclass_fields__)
            if unknown:
                raise ConfigError(f"unknown Workbench.{name} settings: {', '.join(sorted(unknown))}")
        settings = from_env(BrainSettings, **self.brain)
        path = Path(self.db).expanduser() if self.db else default_db_path()
        try:
            self.session_log = SessionLog(path)
        except LogError as e:
            # Serve the API anyway, answering 503 with this line, so that clients
            # learn why (e.g. a CLI run holds the file) instead of getting a bare 404.
            self.settings["workbench_error"] = str(e)
            self.log.error("workbench: the API is unavailable: %s", e)
            return
        self.hands_factory = self._make_hands_factory()
        brain = Brain(self.session_log, settings=settings, hands_factory=self.hands_factory,
                      redact=getattr(self.hands_factory, "redact", None))
        self.runtime = Runtime(self.session_log, brain, default_model=self.default_model or None, logger=self.log)
        self.settings["workbench_runtime"] = self.runtime
        from . import memory_handlers

        memory_handlers.setup(self.runtime)  # attach the memory store (and the dream scheduler, if set)
        self.log.info("workbench: session log %s", path)

    def _make_hands_factory(self) -> Any:
        from ..config import from_env
        from ..hands.factory import HandsFactory, HandsSettings
        from ..errors import ConfigError

        unknown = set(self.hands) - set(HandsSettings.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown Workbench.hands settings: {', '.join(sorted(unknown))}")
        return HandsFactory(from_env(HandsSettings, prefix="WORKBENCH_HANDS_", **self.hands))

    def initialize_handlers(self) -> None:
        self.handlers.extend((pattern(path), cls) for path, cls in all_handlers())

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        """After the loop runs: reap orphaned kernels, warm the pool, wake cut-off turns."""
        if self.runtime is None:
            return
        self.runtime.bind(asyncio.get_running_loop())
        # The Anthropic SDK takes seconds to import: do it now, in a thread, so the
        # first turn (and the event loop, which would do it inline) does not pay for it.
        self._warm = asyncio.get_running_loop().run_in_executor(None, importlib.import_module, "anthropic")
        if self.reap_on_start:
            await self.reap()
        start = getattr(self.hands_factory, "start", None)
        if start is not None:
            await start()
        if self.resume_on_start:
            resumed = await self.runtime.wake()
            if resumed:
                self.log.info("workbench: resuming %d cut-off turn(s): %s", len(resumed), ", ".join(resumed))

    async def reap(self) -> list[dict[str, Any]]:
        """Stop the hands kernels of dead servers (the registry the hands factory keeps)."""
        try:
            from ..hands.reaper import reap_orphans
        except ImportError:
            return []
        registry = getattr(getattr(self.hands_factory, "registry", None), "dir", None)
        reaped = await asyncio.to_thread(reap_orphans, registry)
        if reaped:
            self.log.info("workbench: reaped %d orphaned hands kernel(s)", len(reaped))
        return reaped

    def status(self) -> dict[str, Any]:
        """What `GET /workbench/api/status` returns."""
        from ..cli import _version

        factory_status = getattr(self.hands_factory, "status", None)
        return {
            "version": _version(),
            "db": str(self.session_log.path),
            "sandbox": factory_status() if callable(factory_status) else {"backend": "local"},
            "default_model": self.runtime.default_model_name(),
            "sessions_running": sum(1 for sid in list(self.runtime.tasks) if self.runtime.running(sid)),
            "resume_on_start": self.resume_on_start,
        }

    async def stop_extension(self) -> None:
        """Interrupt running turns, stop every kernel, close the log."""
        runtime = getattr(self, "runtime", None)
        if runtime is None:
            return
        await runtime.close()
        close = getattr(self.hands_factory, "close", None)
        if close is not None:
            await close()
        await _drain_worker_threads()
        await asyncio.to_thread(self.session_log.close)


async def _drain_worker_threads(timeout: float = 10.0) -> None:
    """Wait for fire-and-forget `asyncio.to_thread` tasks: they may be reading the log.

    Closing the DuckDB connection while a reader's cursor is mid-query fails
    ("connection is busy"); e.g. the memory routes commit finished dreams this way.
    """
    me = asyncio.current_task()
    pending = [
        t for t in asyncio.all_tasks()
        if t is not me and not t.done() and getattr(t.get_coro(), "__qualname__", "") == "to_thread"
    ]
    if pending:
        await asyncio.wait(pending, timeout=timeout)
