"""The hands factory: one per host, it makes each session's hands.

A host (the CLI, the server extension, a test) creates one HandsFactory,
calls `await factory.start()` to pre-warm its pool in the background, passes
it to `Brain(hands_factory=factory)`, and `await factory.close()` when it
stops. The factory owns what outlives one session: the warm pool, the
kernel registry (for reaping orphans) and the choice of backend.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .base import EventSink, Hands
from .kernel import HandsConfig, KernelHands, LocalLauncher
from .limits import Limits
from .pool import KernelPool
from .reaper import KernelRegistry, default_registry_dir

BACKENDS = ("local", "sandbox", "gateway")


@dataclass
class HandsSettings:
    """Host-level hands settings (env: WORKBENCH_HANDS_<FIELD>); documented in docs/settings.md."""

    backend: str = "sandbox"  # sandbox | local | gateway
    unsafe_unsandboxed: bool = False  # UNSAFE: when no sandbox works here, run model code in plain local kernels
    pool_size: int = 1  # kernels kept started and ready, per host
    gateway_url: str = ""  # e.g. http://127.0.0.1:8888 (backend "gateway")
    gateway_token: str = ""  # sent as `Authorization: token ...`
    memory_mb: int = 4096  # per kernel: cgroup memory limit where writable, else RLIMIT_AS (see docs)
    max_processes: int = 512  # per kernel: cgroup pids.max where writable, RLIMIT_NPROC for a dedicated uid
    max_open_files: int = 1024  # RLIMIT_NOFILE
    max_file_mb: int = 4096  # RLIMIT_FSIZE: the largest file a kernel may write
    cpu_seconds: int = 0  # RLIMIT_CPU per kernel process; 0 = unlimited
    registry_dir: str = ""  # where kernel pids are recorded for reaping (default: Jupyter runtime dir)

    def limits(self) -> Limits:
        """The per-kernel resource limits these settings ask for."""
        return Limits(
            memory_mb=self.memory_mb,
            max_processes=self.max_processes,
            max_open_files=self.max_open_files,
            max_file_mb=self.max_file_mb,
            cpu_seconds=self.cpu_seconds,
        )


def hands_config(session_config: dict[str, Any]) -> HandsConfig:
    """The HandsConfig of a session from its frozen config (`config.hands`)."""
    hc = (session_config or {}).get("hands") or {}
    unknown = set(hc) - set(HandsConfig.__dataclass_fields__)
    if unknown:
        raise ConfigError(f"unknown hands settings: {', '.join(sorted(unknown))}")
    return HandsConfig(**hc)


def make_launcher(settings: HandsSettings, session_id: str | None, session_config: dict[str, Any] | None, sink: EventSink | None,
                  sandbox: Any = None) -> Any:
    """The kernel launcher for a backend: the one place a backend is chosen."""
    if settings.backend == "local":
        return LocalLauncher()
    if settings.backend == "sandbox":
        # after the preflight: a SandboxLauncher, an unsafe local one, or None (model code is refused)
        return sandbox.launcher(session_config, sink)
    raise ConfigError(f"backend {settings.backend!r} has no kernel launcher; choose one of {', '.join(BACKENDS)}")


class HandsFactory:
    """Makes hands for sessions; owns the warm pool and the kernel registry."""

    def __init__(self, settings: HandsSettings | None = None):
        self.settings = settings or HandsSettings()
        if self.settings.backend not in BACKENDS:
            raise ConfigError(f"unknown hands backend {self.settings.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.settings.backend == "gateway" and not self.settings.gateway_url:
            raise ConfigError("the gateway backend needs a URL: set WORKBENCH_HANDS_GATEWAY_URL")
        self.registry = KernelRegistry(Path(self.settings.registry_dir or default_registry_dir()))
        self.limits = self.settings.limits()
        self.sandbox = None
        if self.settings.backend == "sandbox":
            from .preflight import SandboxBackend

            self.sandbox = SandboxBackend(self.settings.unsafe_unsandboxed)  # runs the preflight; warns if it fails
        self.redact = self.sandbox.redact if self.sandbox else None  # for Brain(redact=...): masks vault secrets
        self.pool: KernelPool | None = None
        if self.settings.backend != "gateway" and self.settings.pool_size > 0 and getattr(self.sandbox, "mode", "") != "refused":
            launcher = make_launcher(self.settings, None, None, None, self.sandbox)
            if getattr(launcher, "poolable", False):
                self.pool = KernelPool(launcher, self.settings.pool_size, limits=self.limits, registry=self.registry)
        self._hands: list[Hands] = []
        self._closed = False

    def __call__(self, session_id: str, session_config: dict[str, Any], sink: EventSink | None,
                 replay: Any = None) -> Hands:
        """This session's hands (the kernel starts lazily or comes from the pool).

        `replay` returns the session's earlier replayable calls (the brain reads them from
        the log; hands never do): used after a kernel death when `config.hands.replay` is on.
        """
        if self._closed:
            raise ConfigError("the hands factory is closed")
        config = hands_config(session_config)
        if self.settings.backend == "gateway":
            from .gateway import GatewayHands

            hands: Hands = GatewayHands(
                config, url=self.settings.gateway_url, token=self.settings.gateway_token, on_event=sink
            )
            hands.replay_source = replay
        elif self.sandbox is not None and self.sandbox.mode == "refused":
            hands = self.sandbox.refused(sink)
        else:
            launcher = make_launcher(self.settings, session_id, session_config, sink, self.sandbox)
            pool = self.pool if self.pool is not None and self.pool.fits(launcher) else None
            hands = KernelHands(config, launcher=launcher, on_event=sink, pool=pool, limits=self.limits, registry=self.registry)
            hands.replay_source = replay
        self._hands.append(hands)
        return hands

    async def start(self) -> None:
        """Start filling the warm pool in the background; returns at once."""
        if self.pool is not None:
            self.pool.fill()

    async def close(self) -> None:
        """Stop every kernel this factory started: the pool's and every session's."""
        self._closed = True
        hands, self._hands = self._hands, []
        await asyncio.gather(*(h.shutdown() for h in hands), return_exceptions=True)
        if self.pool is not None:
            await self.pool.close()

    def status(self) -> dict[str, Any]:
        """Settings (without the token) and the pool's state, JSON-ready."""
        s = asdict(self.settings)
        s["gateway_token"] = "***" if s["gateway_token"] else ""
        return {"settings": s, "pool": self.pool.status() if self.pool else None, "hands": len(self._hands),
                "sandbox": self.sandbox.status() if self.sandbox else {"mode": self.settings.backend}}
