"""Can this host sandbox the hands? If not, refuse model code, out loud.

`preflight()` runs a trivial command in a real bubblewrap sandbox with the
namespaces, uid drop and seccomp filter the kernels get; a hands factory runs it once, when
it is made, and keeps the result. When it fails, the hands refuse to
run model code (each refused call is a `hands_refused` event and an error
observation saying why and how to fix it) unless the host opted into the
unsafe, unsandboxed mode; either way the log, the CLI's stderr and the
status the UI shows say so. Never a silent downgrade.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ...errors import ConfigError, WorkbenchError
from ..base import EventSink, Hands
from ..files import NoWorkspace
from ..observing import Observation, failure
from .bubblewrap import SandboxSettings, base_args, inside_args, setpriv_args
from .identity import Identities
from .seccomp import SeccompFilter

log = logging.getLogger("workbench.hands")

UNSAFE_SETTING = "WORKBENCH_HANDS_UNSAFE_UNSANDBOXED=1"
FIX = (
    "install bubblewrap and socat (Debian: apt-get install bubblewrap socat) and allow user namespaces "
    "(sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0); "
    f"or, only if you accept running model code unsandboxed with your files and secrets, set {UNSAFE_SETTING}"
)

CONTAINER_SETTING = "WORKBENCH_HANDS_CONTAINER_SANDBOX=1"
# what a workbench host may hold in its environment that kernel code running beside it (same container, same user:
# /proc/<server>/environ) could read: the model's key; the egress vault's credentials are checked apart
HOST_SECRETS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")

SECCOMP_FIX = ("a filter that stops the sandbox from starting is a bug: report it; meanwhile WORKBENCH_SECCOMP_ALLOW "
               "can leave the call it needs allowed, or WORKBENCH_SECCOMP=0 turns the filter off")


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
    seccomp: str = ""  # how system calls are filtered in the sandbox (SeccompFilter.how)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def preflight(settings: SandboxSettings | None = None, seccomp: SeccompFilter | None = None) -> Preflight:
    """Check that bubblewrap is installed and a sandbox like the kernels' (with `seccomp`, the host's filter)
    actually starts; each call runs it."""
    s = settings or SandboxSettings()
    how = seccomp.how if seccomp is not None else "not checked"
    try:
        ids = Identities(s.sandbox_uid, s.sandbox_gid, s.sandbox_ids)
    except ConfigError as e:
        return Preflight(False, f"the sandbox's identity settings are wrong: {e}", "fix sandbox_uid, sandbox_gid or "
                         "sandbox_ids (docs/settings.md)", None, "", False, "", seccomp.how if seccomp else "not checked")
    mode = (f"bwrap, then setpriv to a uid of its own per sandbox ({s.sandbox_uid}-{s.sandbox_uid + s.sandbox_ids - 1})"
            if ids.root else "bwrap in a user namespace of its own per sandbox, same uid, per-user counts capped inside")
    socat = shutil.which(s.socat, path="/usr/bin:/bin:/usr/local/bin")
    note = "" if socat else f"socat ({s.socat}) is not installed: kernels get no network at all, not even through the egress proxy"
    bwrap = shutil.which(s.bwrap)
    if bwrap is None:
        return Preflight(False, f"bubblewrap is not installed (no {s.bwrap!r} found)", FIX, None, mode, bool(socat), note,
                         how)
    try:
        identity = ids.lease()
    except WorkbenchError as e:
        return Preflight(False, str(e), "raise sandbox_ids or free uids of its range", bwrap, mode, bool(socat), note, how)
    try:
        owner = identity.owner
        cmd = [bwrap, *base_args(owner), "--", *(setpriv_args(owner) if owner else inside_args(ids.shares, 0)), "/bin/true"]
        if seccomp is not None:
            cmd = seccomp.wrap(cmd)
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20,
                           env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as e:
        return Preflight(False, f"bubblewrap ({bwrap}) could not run: {e}", FIX, bwrap, mode, bool(socat), note, how)
    finally:
        identity.release()
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
        if seccomp is not None and seccomp.enforced:
            return Preflight(False, f"a test sandbox failed to start under the seccomp filter {seccomp.path}: {why}",
                             SECCOMP_FIX, bwrap, mode, bool(socat), note, how)
        return Preflight(False, f"a test sandbox failed to start: {why}", FIX, bwrap, mode, bool(socat), note, how)
    return Preflight(True, "", "", bwrap, mode, bool(socat), note, how)


def held_secrets(credentials: list[str]) -> list[str]:
    """What this host holds that code beside it could read: the model keys in its environment, the vault's credentials."""
    return [name for name in HOST_SECRETS if os.environ.get(name)] + [f"the egress credential {c!r}" for c in credentials]


def announce(result: Preflight, unsafe: bool, container: list[str] | None = None) -> str:
    """Log (and return) what the hands will do about a failed preflight; one loud line.

    `container`: the secrets held when the container setting is on (empty: the container is the hands' sandbox;
    not empty: it cannot be, and model code is refused); None when the setting is off.
    """
    if result.ok:
        if result.egress_note:
            log.warning("sandboxed hands: %s", result.egress_note)
        return ""
    if container is not None and not container:
        msg = (
            f"the hands are not sandboxed ({result.reason}): this container is their sandbox because "
            f"{CONTAINER_SETTING.split('=')[0]} is on. Model code runs as this container's user, with its files, "
            "its network and this Jupyter server's API; only a disposable container that holds no secret may run "
            "that way (Binder)"
        )
    elif unsafe:
        msg = (
            f"UNSAFE: the hands are NOT sandboxed ({result.reason}); model code runs with this user's files, "
            f"network and environment because {UNSAFE_SETTING.split('=')[0]} is on. Fix: {result.fix.split('; or,')[0]}"
        )
    elif container:
        msg = (
            f"sandbox unavailable: {result.reason}; {CONTAINER_SETTING.split('=')[0]} is on, but this container "
            f"holds a secret ({', '.join(container)}) that model code beside it could read, so model code will be "
            f"refused. Fix: remove the secret from the container, or {result.fix.split('; or,')[0]}"
        )
    else:
        msg = f"sandbox unavailable: {result.reason}; model code will be refused. Fix: {result.fix}"
    log.warning(msg)
    return msg


class RefusedHands(Hands):
    """Hands that run nothing, because no sandbox is available and the unsafe setting is off."""

    def __init__(self, result: Preflight, on_event: EventSink | None = None):
        self.result, self.on_event = result, on_event

    async def execute(self, code: str, timeout: float | None = None, on_output: Any = None) -> Observation:
        """Refuse: a `hands_refused` event, and an error observation the model can pass on."""
        if self.on_event is not None:
            await self.on_event("hands_refused", {"reason": self.result.reason, "fix": self.result.fix})
        return failure(
            f"model code was not run: no sandbox is available on this host ({self.result.reason}). "
            f"Tell the user; to fix it: {self.result.fix}",
            ename="SandboxUnavailable",
        )

    async def __aenter__(self) -> RefusedHands:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.shutdown()

    async def restart(self) -> None:
        """Nothing to restart."""

    async def interrupt(self) -> None:
        """Nothing runs."""

    async def close(self, reason: str = "closed", *, if_idle: float | None = None) -> bool:
        """Nothing runs here, so nothing is stopped."""
        return False

    async def shutdown(self) -> None:
        """Nothing to stop."""

    async def workspace(self, create: bool = False) -> Path | None:
        """No workspace: nothing runs here."""
        if create:
            raise NoWorkspace(f"this host runs no model code, so a session has no workspace ({self.result.reason})")
        return None

    def workspace_owner(self) -> tuple[int, int] | None:
        """Nothing is written for a kernel here."""
        return None

    @contextlib.asynccontextmanager
    async def frozen(self) -> AsyncIterator[list[str]]:
        """Nothing runs here, so nothing is stopped."""
        yield []

    def status(self) -> dict[str, Any]:
        return {"backend": "sandbox", "state": "refused", "generation": 0, "pid": None, "sandbox": self.result.to_json()}
