"""The hands factory: one per host, it makes each session's hands.

A host (the CLI, the server extension, a test) makes one HandsFactory and uses it as an
async context manager (`async with HandsFactory(settings) as factory`: entering pre-warms
the pool in the background, leaving stops every kernel), or calls `start()` and `close()`.
It passes the factory to `Brain(hands_factory=factory)`, which calls
`factory(session_id, session_config, sink, replay)` once per session. The factory owns what
outlives one session, closed in this order: the sessions' hands, the warm pool, the launcher;
and it keeps the kernel registry (for reaping orphans) and, for the sandbox, the seccomp filter
(compiled once) and the preflight's result (run once, under that filter) when the factory is
made. `start()` removes the workspaces of hosts that died (after the host reaped their kernels).
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import from_env
from ..egress import EgressSettings, Vault
from ..errors import ConfigError
from .base import EventSink, Hands, Launcher
from .isolating import quota
from .isolating.bubblewrap import SandboxSettings
from .isolating.limits import FIELDS as LIMIT_FIELDS, Limits
from .isolating.preflight import Preflight, RefusedHands, announce, held_secrets, preflight
from .isolating.quota import WorkspaceSettings
from .isolating.seccomp import SeccompFilter, SeccompSettings, prepare
from .kernel import HandsConfig, KernelHands, ReplaySource
from .launching.reaper import KernelRegistry, default_registry_dir

if TYPE_CHECKING:
    from .launching.gateway import GatewayLauncher
    from .launching.pool import KernelPool

log = logging.getLogger("workbench.hands")

BACKENDS = ("local", "sandbox", "gateway")
MAX_LIMIT = 1 << 40  # the largest per-kernel limit taken (MiB, processes, files or seconds)


@dataclass
class HandsSettings:
    """Host-level hands settings (env: WORKBENCH_HANDS_<FIELD>); documented in docs/settings.md."""

    backend: str = "sandbox"  # sandbox | local | gateway
    unsafe_unsandboxed: bool = False  # UNSAFE: when no sandbox works here, run model code in plain local kernels
    # a disposable container that holds no secret (Binder): when no sandbox works here, the container is the hands'
    # sandbox (launcher "container"); refused while the host holds a model key or egress credentials
    container_sandbox: bool = False
    pool_size: int = 1  # kernels kept started and ready, per host (any backend)
    pool_refill: bool = True  # start a kernel in the place of each one taken (the CLI's run and resume: false)
    gateway_url: str = ""  # e.g. http://127.0.0.1:8888 (backend "gateway")
    gateway_token: str = ""  # sent as `Authorization: token ...`
    gateway_kernel: str = "python3"  # the kernelspec the gateway starts (on Kubernetes: deploy/kubernetes's)
    gateway_probe: float = 2.0  # seconds a gateway kernel that runs no cell may leave a request unanswered; 0 = off
    # HOST:PORT where this host's egress proxy listens for its gateway kernels (empty: none; port 0: a free one), and
    # the HOST:PORT the kernels are told to use (empty: the address it listens on)
    gateway_egress: str = ""
    gateway_egress_advertise: str = ""
    memory_mb: int = 4096  # per kernel: cgroup memory limit where writable, else RLIMIT_AS (see docs)
    max_processes: int = 512  # per kernel: cgroup pids.max where writable, RLIMIT_NPROC for a dedicated uid
    max_open_files: int = 1024  # RLIMIT_NOFILE
    max_file_mb: int = 4096  # RLIMIT_FSIZE: the largest file a kernel may write
    cpu_seconds: int = 0  # RLIMIT_CPU per kernel process; 0 = unlimited
    max_message_mb: int = 16  # the largest message the hands read from a kernel; bigger ones are dropped with a note
    registry_dir: str = ""  # where kernel pids are recorded for reaping (default: Jupyter runtime dir)
    spare: bool = True  # sandbox: keep a second kernel per session (once it ran code), in its workspace, for a death
    spare_after: float = 5.0  # seconds a session's kernel is idle after a call before its spare boots; 0 = at once
    idle_timeout: float = 1800.0  # seconds without a call after which a session's kernel (and spare) stop; 0 = never

    def limits(self) -> Limits:
        """The per-kernel resource limits these settings ask for."""
        return Limits(
            memory_mb=self.memory_mb,
            max_processes=self.max_processes,
            max_open_files=self.max_open_files,
            max_file_mb=self.max_file_mb,
            cpu_seconds=self.cpu_seconds,
        )


def hands_config(session_config: dict[str, Any] | None) -> HandsConfig:
    """The HandsConfig of a session from its frozen config (`config.hands`), checked field by field."""
    hc = (session_config or {}).get("hands") or {}
    if not isinstance(hc, dict):
        raise ConfigError("config.hands must be an object of hands settings, e.g. {\"timeout\": 120}")
    unknown = set(hc) - set(HandsConfig.__dataclass_fields__)
    if unknown:
        raise ConfigError(f"unknown hands settings: {', '.join(sorted(map(str, unknown)))}")
    for name, value in hc.items():
        default = HandsConfig.__dataclass_fields__[name].default
        if name in ("workdir", "keep_dir", "python"):
            ok = value is None or (isinstance(value, str) and value.strip() != "" and "\0" not in value)
        elif name == "env":
            ok = isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) and k and "=" not in k
                                                 and "\0" not in k + v for k, v in value.items())
        elif isinstance(default, bool):
            ok = isinstance(value, bool)
        else:  # a number of seconds or characters: positive and finite
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
                  and (isinstance(value, int) or not isinstance(default, int)))
        if not ok:
            raise ConfigError(f"hands setting {name} has an invalid value {str(value)[:60]!r}; see docs/settings.md")
    return HandsConfig(**hc)


def _seconds(name: str, value: Any, zero: str) -> None:
    """ConfigError unless `value` is a finite number of seconds, 0 or more (`zero`: what 0 means)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be a number of seconds, 0 or more (0: {zero}), not {value!r}")


class HandsFactory:
    """Makes hands for sessions; owns the launcher, the warm pool and the kernel registry."""

    def __init__(self, settings: HandsSettings | None = None, *, sandbox: SandboxSettings | None = None,
                 egress: EgressSettings | None = None, vault: Vault | None = None,
                 seccomp: SeccompSettings | SeccompFilter | None = None, workspaces: WorkspaceSettings | None = None):
        self.settings = s = settings or HandsSettings()
        if s.backend not in BACKENDS:
            raise ConfigError(f"unknown hands backend {s.backend!r}; choose one of {', '.join(BACKENDS)}")
        if s.backend == "gateway" and not s.gateway_url:
            raise ConfigError("the gateway backend needs a URL: set WORKBENCH_HANDS_GATEWAY_URL")
        _seconds("idle_timeout", s.idle_timeout, "never")
        _seconds("spare_after", s.spare_after, "at once")
        for name in LIMIT_FIELDS:  # the launch wrapper takes whole numbers only; a negative limit was a nonsense one
            value = getattr(s, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LIMIT:
                raise ConfigError(f"{name} must be a whole number from 0 (no limit) to {MAX_LIMIT}, not {value!r}")
        if isinstance(s.max_message_mb, bool) or not isinstance(s.max_message_mb, int) or not 1 <= s.max_message_mb <= 2048:
            raise ConfigError(f"max_message_mb must be a whole number of MiB from 1 to 2048, not {s.max_message_mb!r}")
        self.registry = KernelRegistry(Path(s.registry_dir or default_registry_dir()))
        self.limits: Limits = s.limits()
        self.max_message = s.max_message_mb * 1024 * 1024
        self.preflight: Preflight | None = None  # the sandbox's, run once here
        self.seccomp: SeccompFilter | None = None  # the sandbox's, compiled once here
        self.workspaces: WorkspaceSettings | None = None  # the sandbox's
        self.message = ""  # the loud line when the sandbox does not work here
        self.vault: Vault | None = None
        self.launcher: Launcher | None = None  # None: model code is refused
        self._gateway: GatewayLauncher | None = None  # the launcher, when it is a gateway's (it reaps there too)
        if s.backend == "local":
            from .launching.local import LocalLauncher  # here: a host that starts no kernel does not import them

            self.launcher = LocalLauncher(limits=self.limits, registry=self.registry, max_message=self.max_message)
        elif s.backend == "gateway":
            _seconds("gateway_probe", s.gateway_probe, "off")
            from .launching.gateway import GatewayLauncher

            if not isinstance(s.gateway_kernel, str) or not s.gateway_kernel.strip() or len(s.gateway_kernel) > 255:
                raise ConfigError(f"gateway_kernel must name a kernelspec of the gateway, not {str(s.gateway_kernel)[:60]!r}")
            network, out = None, None
            if s.gateway_egress:
                from ..egress.network import NetworkEgress

                out = egress or from_env(EgressSettings)
                self.vault = vault if vault is not None else Vault.load(out.vault)
                network = NetworkEgress(s.gateway_egress, s.gateway_egress_advertise, out)
            self._gateway = GatewayLauncher(s.gateway_url, s.gateway_token, s.gateway_kernel, max_message=self.max_message,
                                            limits=self.limits, probe=float(s.gateway_probe), registry=self.registry,
                                            egress=network, vault=self.vault, egress_settings=out)
            self.launcher = self._gateway
        else:
            self.seccomp = seccomp if isinstance(seccomp, SeccompFilter) else prepare(seccomp or from_env(SeccompSettings))
            self.workspaces = workspaces or from_env(WorkspaceSettings)
            self.launcher = self._sandbox(sandbox or from_env(SandboxSettings), egress or from_env(EgressSettings), vault)
        # for Brain(redact=...): masks the vault's secret values in what the hands return
        self.redact = self.vault.redact if self.vault is not None else None
        self.pool: KernelPool | None = None
        if self.launcher is not None and s.pool_size > 0:
            from .launching.pool import KernelPool

            self.pool = KernelPool(self.launcher, s.pool_size, refill=s.pool_refill)
        # every session's kernel hands this factory made and that were not shut down since (the brain shuts down
        # those it forgets): the idle reaper's rounds, and what close() stops (refused hands hold nothing)
        self._hands: set[KernelHands] = set()
        self._idle_task: asyncio.Task[None] | None = None
        self.idle_closed = 0  # how many times the idle reaper closed a session's hands
        self._closed = False

    def _sandbox(self, settings: SandboxSettings, egress: EgressSettings, vault: Vault | None) -> Launcher | None:
        """The sandbox launcher; after a failed preflight an unsafe local one (if asked for) or none."""
        self.vault = vault if vault is not None else Vault.load(egress.vault)
        self.preflight = preflight(settings, self.seccomp)
        held = held_secrets(sorted(self.vault.credentials)) if self.settings.container_sandbox else None
        if held and not self.preflight.ok:  # what a refused call says to do names the secret first
            self.preflight = replace(self.preflight, fix=f"remove {', '.join(held)} from this container (the container "
                                     f"is the hands' sandbox only while it holds no secret), or {self.preflight.fix}")
        self.message = announce(self.preflight, self.settings.unsafe_unsandboxed, held)
        if self.preflight.ok:
            if self.seccomp is not None and not self.seccomp.enforced:
                log.warning("sandboxed hands: the seccomp filter is %s", self.seccomp.how)
            from .launching.sandbox import SandboxLauncher

            return SandboxLauncher(settings, limits=self.limits, registry=self.registry, vault=self.vault,
                                   egress_settings=egress, seccomp=self.seccomp, workspaces=self.workspaces,
                                   max_message=self.max_message)
        if held is not None and not held:
            name = "container"
        elif self.settings.unsafe_unsandboxed:
            name = "unsafe-local"
        else:
            return None
        from .launching.local import LocalLauncher

        return LocalLauncher(limits=self.limits, registry=self.registry, name=name, max_message=self.max_message)

    @property
    def mode(self) -> str:
        """The backend, or for the sandbox: `sandbox`, `container` (the container is the sandbox), `unsafe` (model code
        runs unsandboxed) or `refused`."""
        if self.preflight is None:
            return self.settings.backend
        if self.preflight.ok:
            return "sandbox"
        return "refused" if self.launcher is None else "container" if self.launcher.name == "container" else "unsafe"

    def __call__(self, session_id: str, session_config: dict[str, Any], sink: EventSink | None,
                 replay: ReplaySource | None = None) -> Hands:
        """This session's hands (the kernel starts lazily or comes from the pool).

        `replay` returns the session's earlier replayable calls (the brain reads them from
        the log; hands never do): used after a kernel death when `config.hands.replay` is on.
        """
        if self._closed:
            raise ConfigError("the hands factory is closed")
        config = hands_config(session_config)
        if self.launcher is None:
            assert self.preflight is not None  # only a failed sandbox preflight leaves no launcher
            return RefusedHands(self.preflight, sink)
        hands = KernelHands(config, launcher=self.launcher, pool=self.pool, on_event=sink, replay=replay,
                            session_config=session_config, session_id=session_id,
                            spare=self.settings.spare and config.spare and self.launcher.name == "sandbox",
                            spare_after=float(self.settings.spare_after))
        self._hands = {h for h in self._hands if h.state != "stopped"}
        self._hands.add(hands)
        return hands

    async def start(self, *, reap: bool = True) -> None:
        """Remove the sandbox workspaces of hosts that died (`reap`), then start filling the warm pool in the background.

        A host calls it after `reaper.reap_orphans` (so the dead hosts' kernels are gone first);
        it is safe while other hosts share the workspace root: only a dead host's are removed.
        """
        if reap and self.workspaces is not None:
            root = self.workspaces.workspace_root or None
            reaped = await asyncio.to_thread(quota.reap, root)
            if reaped:
                log.info("workbench: removed %d workspace(s) left behind by a host that died", len(reaped))
        if reap and self._gateway is not None:
            deleted = await self._gateway.reap()
            if deleted:
                log.info("workbench: deleted %d kernel(s) on the gateway that a host which died left running", len(deleted))
        if self.pool is not None:
            self.pool.fill()
        if self.settings.idle_timeout > 0 and self._idle_task is None:
            self._idle_task = asyncio.get_running_loop().create_task(self._close_idle())

    async def _close_idle(self) -> None:
        """Every so often, close the hands of sessions that made no call for `idle_timeout` seconds."""
        while not self._closed:
            limit = float(self.settings.idle_timeout)  # read at each round: a host may change it
            await asyncio.sleep(min(max(limit / 4, 0.05), 1.0))
            if limit <= 0:
                continue
            due = [h for h in list(self._hands) if h.idle_for() >= limit]
            for h in due:
                try:
                    if await h.close("idle", if_idle=limit):
                        self.idle_closed += 1
                except Exception as e:  # one session's failure must not stop the reaper for the others
                    log.warning("workbench: closing idle hands of session %s failed: %s", h.place.session, e)

    async def close(self) -> None:
        """Stop every kernel this factory started, in order: the sessions', the pool's; then the launcher."""
        self._closed = True
        if self._idle_task is not None:
            self._idle_task.cancel()
            await asyncio.gather(self._idle_task, return_exceptions=True)
        hands, self._hands = list(self._hands), set()
        await asyncio.gather(*(h.shutdown() for h in hands), return_exceptions=True)
        if self.pool is not None:
            await self.pool.close()
        if self.launcher is not None:
            await self.launcher.aclose()

    async def __aenter__(self) -> HandsFactory:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def status(self) -> dict[str, Any]:
        """Settings (without the token), the pool's state and the sandbox's, JSON-ready."""
        s = asdict(self.settings)
        s["gateway_token"] = "***" if s["gateway_token"] else ""
        sandbox: dict[str, Any] = {"mode": self.mode}
        if self.preflight is not None:
            sandbox.update(message=self.message, credentials=sorted(self.vault.credentials if self.vault else ()),
                           **self.preflight.to_json())
        if self.workspaces is not None:
            sandbox["workspaces"] = {"workspace_mb": self.workspaces.workspace_mb,
                                     "workspace_root": self.workspaces.workspace_root or str(quota.default_root())}
        return {"settings": s, "pool": self.pool.status() if self.pool else None, "hands": len(self._hands),
                "idle_closed": self.idle_closed, "sandbox": sandbox}
