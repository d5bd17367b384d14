"""The Jupyter server extension: the brain lives in the server process.

One `Workbench` app per server builds one Host (the session log with its one
DuckDB writer, the plugins, the hands factory and the brain) and serves the
API over it (runtime.py, handlers.py, plus the plugins' routes). Settings are
traitlets: `c.Workbench.db = ...` in jupyter_server_config.py or
`--Workbench.db=...` on the command line.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Dict, Unicode

from .routes import API, ROUTES, pattern


def all_handlers(plugins: Any = None) -> list[tuple[str, type]]:
    """Every (path, handler class) the extension serves, in docs/api.md's notation: core routes, then plugins'."""
    from ..host import load_plugins

    plugins = load_plugins() if plugins is None else plugins
    return list(ROUTES) + [r for p in plugins for r in p.routes()]


class Workbench(ExtensionApp):
    """The workbench server extension: session log, brain, hands, plugins and the API."""

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
        help="The model of sessions created without one. Default: $WORKBENCH_MODEL, "
        "else claude-opus-5-5 with ANTHROPIC_API_KEY, else scripted.",
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

    files = Dict(
        {}, config=True, help="FilesSettings overrides, e.g. {'max_upload_mb': 64}; fields as in docs/settings.md (Files)."
    )

    runtime: Any = None  # None when the session log could not be opened
    host: Any = None

    def initialize_settings(self) -> None:
        """Build the host (open the log, load plugins, make the brain and hands); nothing runs yet."""
        from dataclasses import replace

        from ..brain import BrainSettings
        from ..config import from_env, settings_from
        from ..errors import LogError
        from ..hands.factory import HandsSettings
        from ..hands.files import FilesSettings
        from ..host import Host, HostSettings, load_plugins
        from .runtime import Runtime

        settings = from_env(HostSettings)
        settings = replace(settings, db=self.db or settings.db, model=self.default_model or settings.model,
                           reap_on_start=self.reap_on_start)
        brain = settings_from(BrainSettings, self.brain, where="Workbench.brain")
        hands = settings_from(HandsSettings, self.hands, prefix="WORKBENCH_HANDS_", where="Workbench.hands")
        files = settings_from(FilesSettings, self.files, prefix="WORKBENCH_FILES_", where="Workbench.files")
        self.plugins = load_plugins(settings)
        try:
            self.host = Host.build(settings=settings, brain_settings=brain, hands=hands, plugins=self.plugins)
        except LogError as e:
            # Serve the API anyway, answering 503 with this line, so that clients
            # learn why (e.g. a CLI run holds the file) instead of getting a bare 404.
            self.settings["workbench_error"] = str(e)
            self.log.error("workbench: the API is unavailable: %s", e)
            return
        self.runtime = Runtime(self.host, logger=self.log, files=files)
        self.settings["workbench_runtime"] = self.runtime
        sql = self.host.log.sql()  # a log with SQL tables has a file; the others live in memory
        self.log.info("workbench: session log %s", sql.path if sql is not None else "(in memory)")

    def initialize_handlers(self) -> None:
        from .handlers import NotFoundHandler

        self.handlers.extend((pattern(path), cls) for path, cls in all_handlers(getattr(self, "plugins", None)))
        self.handlers.append((rf"{API}(?:/.*)?$", NotFoundHandler))  # last: any other path is a JSON 404

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        """After the loop runs: start the host (reap orphans, warm the pool, plugins), wake cut-off turns."""
        if self.runtime is None:
            return
        # Nothing is imported ahead of need (the Anthropic SDK took 10-20 s of a loaded machine's CPU in a
        # thread at start): a turn or a resume makes its model, and so imports its SDK, in a thread of its own.
        await self.runtime.ready()
        if self.resume_on_start:
            resumed = await self.runtime.service.wake()
            if resumed:
                self.log.info("workbench: resuming %d cut-off turn(s): %s", len(resumed), ", ".join(resumed))

    async def stop_extension(self) -> None:
        """Refuse new requests (503) and let those in flight finish, then interrupt running turns,
        stop every kernel and close the log (the host, in order)."""
        if self.runtime is None:
            return
        runtime, self.runtime = self.runtime, None
        # the runtime stays in the web app's settings: handlers ask it, and it answers 503 from now on
        await runtime.close()
        await self.host.close()
