"""Isolating: what keeps a kernel in its place, and what the host checks before it runs any.

bubblewrap.py is what a sandboxed kernel sees and who it is; seccomp.py the system calls it
cannot make; quota.py its workspace's size; identity.py a host uid of its own per live sandbox;
limits.py its memory, processes, files and CPU (applied by the launch wrapper, loaded by path);
freeze.py stops all its processes while its workspace is copied; preflight.py runs a sandbox once
per host and, when it fails, hands that refuse to run code. Nothing here starts a kernel.
"""

from .bubblewrap import WORKSPACE, SandboxSettings
from .limits import Limits
from .preflight import Preflight, RefusedHands, announce, preflight
from .quota import WorkspaceSettings, discard
from .seccomp import SeccompFilter, SeccompSettings

__all__ = ["WORKSPACE", "Limits", "Preflight", "RefusedHands", "SandboxSettings", "SeccompFilter", "SeccompSettings",
           "WorkspaceSettings", "announce", "discard", "preflight"]  # WORKSPACE: where a sandboxed kernel sees its workspace
