"""Can this host sandbox the hands? If not, refuse model code, out loud.

`preflight()` runs a trivial command in a real bubblewrap sandbox with the
namespaces and uid drop the kernels get. When it fails, the hands refuse to
run model code (each refused call is a `hands_refused` event and an error
observation saying why and how to fix it) unless the host opted into the
unsafe, unsandboxed mode; either way the log, the CLI's stderr and the
status the UI shows say so. Never a silent downgrade.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Any

from ..config import from_env
from ..egress import EgressSettings, Vault
from .base import EventSink, Observation, failure
from .live import LocalLauncher
from .sandbox import SandboxLauncher, SandboxSettings, base_args, setpriv_args

log = logging.getLogger("workbench.hands")

UNSAFE_SETTING = "WORKBENCH_HANDS_UNSAFE_UNSANDBOXED=1"
FIX = (
    "install bubblewrap and socat (Debian: apt-get install bubblewrap socat) and allow user namespaces "
    "(sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0); "
    f"or, only if you accept running model code unsandboxed with your files and secrets, set {UNSAFE_SETTING}"
)


@dataclass
class Preflight:
    """Whether sandboxed hands work here, and if not, why and how to fix it."""

    ok: bool
    reason: str = ""
    fix: str = ""
    bwrap: str | None = None
    isolation: str = ""  # "setpriv to uid N" (server is root) or "user namespace, same uid"
    egress: bool = False  # socat found: the egress proxy can be bridged in
    egress_note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_cache: dict[tuple, Preflight] = {}


def preflight(settings: SandboxSettings | None = None, *, refresh: bool = False) -> Preflight:
    """Check that bubblewrap is installed and a sandbox like the kernels' actually starts."""
    s = settings or SandboxSettings()
    key = (s.bwrap, s.socat, s.sandbox_uid, s.sandbox_gid, os.geteuid())
    if refresh or key not in _cache:
        _cache[key] = _check(s)
    return _cache[key]


def _check(s: SandboxSettings) -> Preflight:
    owner = (s.sandbox_uid, s.sandbox_gid) if os.geteuid() == 0 else None
    mode = f"bwrap, then setpriv to uid {s.sandbox_uid}" if owner else "bwrap in a user namespace, same uid"
    socat = shutil.which(s.socat, path="/usr/bin:/bin:/usr/local/bin")
    note = "" if socat else f"socat ({s.socat}) is not installed: kernels get no network at all, not even through the egress proxy"
    bwrap = shutil.which(s.bwrap)
    if bwrap is None:
        return Preflight(False, f"bubblewrap is not installed (no {s.bwrap!r} found)", FIX, None, mode, bool(socat), note)
    cmd = [bwrap, *base_args(owner), "--", *(setpriv_args(owner) if owner else []), "/bin/true"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=20, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as e:
        return Preflight(False, f"bubblewrap ({bwrap}) could not run: {e}", FIX, bwrap, mode, bool(socat), note)
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
        return Preflight(False, f"a test sandbox failed to start: {why}", FIX, bwrap, mode, bool(socat), note)
    return Preflight(True, "", "", bwrap, mode, bool(socat), note)


def announce(result: Preflight, unsafe: bool) -> str:
    """Log (and return) what the hands will do about a failed preflight; one loud line."""
    if result.ok:
        if result.egress_note:
            log.warning("sandboxed hands: %s", result.egress_note)
        return ""
    if unsafe:
        msg = (
            f"UNSAFE: the hands are NOT sandboxed ({result.reason}); model code runs with this user's files, "
            f"network and environment because {UNSAFE_SETTING.split('=')[0]} is on. Fix: {result.fix.split('; or,')[0]}"
        )
    else:
        msg = f"sandbox unavailable: {result.reason}; model code will be refused. Fix: {result.fix}"
    log.warning(msg)
    return msg


class RefusedHands:
    """Hands that run nothing, because no sandbox is available and the unsafe setting is off."""

    def __init__(self, result: Preflight, on_event: EventSink | None = None):
        self.result, self.on_event = result, on_event

    async def execute(self, code: str, timeout: float | None = None) -> Observation:
        """Refuse: a `hands_refused` event, and an error observation the model can pass on."""
        if self.on_event is not None:
            await self.on_event("hands_refused", {"reason": self.result.reason, "fix": self.result.fix})
        return failure(
            f"model code was not run: no sandbox is available on this host ({self.result.reason}). "
            f"Tell the user; to fix it: {self.result.fix}",
            ename="SandboxUnavailable",
        )

    async def restart(self) -> None:
        """Nothing to restart."""

    async def interrupt(self) -> None:
        """Nothing runs."""

    async def shutdown(self) -> None:
        """Nothing to stop."""

    def status(self) -> dict[str, Any]:
        return {"backend": "sandbox", "state": "refused", "generation": 0, "pid": None, "sandbox": self.result.to_json()}


class SandboxBackend:
    """What a hands factory needs for the sandbox backend: the preflight, a launcher per session, redaction."""

    def __init__(
        self,
        unsafe: bool = False,
        settings: SandboxSettings | None = None,
        egress_settings: EgressSettings | None = None,
        vault: Vault | None = None,
    ):
        self.settings = settings or from_env(SandboxSettings)
        self.egress_settings = egress_settings or from_env(EgressSettings)
        self.vault = vault if vault is not None else Vault.load(self.egress_settings.vault)
        self.unsafe = unsafe
        self.preflight = preflight(self.settings)
        self.message = announce(self.preflight, unsafe)

    @property
    def mode(self) -> str:
        """`sandbox`, `unsafe` (no sandbox, model code runs anyway) or `refused`."""
        return "sandbox" if self.preflight.ok else "unsafe" if self.unsafe else "refused"

    def launcher(self, session_config: dict[str, Any] | None = None, sink: EventSink | None = None) -> Any:
        """A launcher for one session (its egress policy and event sink); None when model code is refused."""
        if self.mode == "sandbox":
            egress = (session_config or {}).get("egress")
            return SandboxLauncher(self.settings, egress=egress, vault=self.vault, egress_settings=self.egress_settings, on_event=sink)
        if self.mode == "unsafe":
            launcher = LocalLauncher()
            launcher.name = "unsafe-local"  # shows in every hands_started event
            return launcher
        return None

    def refused(self, sink: EventSink | None = None) -> RefusedHands:
        return RefusedHands(self.preflight, sink)

    def redact(self, text: str) -> str:
        """Mask the vault's secret values (pass as `Brain(redact=...)`)."""
        return self.vault.redact(text)

    def status(self) -> dict[str, Any]:
        """For the UI and `/workbench/api/status`: the mode, and why when it is not `sandbox`."""
        return {"mode": self.mode, "message": self.message, "credentials": sorted(self.vault.credentials), **self.preflight.to_json()}
