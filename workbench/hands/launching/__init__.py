"""Launching: how kernels start, talk and end: locally, sandboxed or on a gateway; pooled, prepared and reaped.

A launcher (local.py, sandbox.py, gateway.py: the `Launcher` protocol of base.py) starts a ready
kernel, a channel the execute loop talks through: a process behind the launch wrapper over ZMQ
(process.py, channel.py, launch.py, output.py) or a gateway's kernel over a websocket. The pool
keeps some ready (pool.py), the registry and the reaper make sure none outlives its host
(reaper.py), and pip.py makes `%pip` install into a session's own folder. What a sandbox keeps a
kernel from is the isolating room's.
"""

import importlib
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .gateway import GatewayLauncher
    from .local import LocalLauncher, kernel_env
    from .pip import packages_code
    from .pool import KernelPool
    from .process import ProcessKernel
    from .reaper import KernelRegistry, default_registry_dir, reap_orphans
    from .sandbox import SandboxLauncher

# each name from the module that has it, imported at first use: a process that starts no kernel (a CLI command
# that reads the log) does not pay for jupyter_client, zmq, tornado's websocket and httpx
_WHERE = MappingProxyType({
    "GatewayLauncher": "gateway", "LocalLauncher": "local", "kernel_env": "local", "packages_code": "pip",
    "KernelPool": "pool", "ProcessKernel": "process", "KernelRegistry": "reaper", "default_registry_dir": "reaper",
    "reap_orphans": "reaper", "SandboxLauncher": "sandbox",
})


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)


__all__ = ["GatewayLauncher", "KernelPool", "KernelRegistry", "LocalLauncher", "ProcessKernel", "SandboxLauncher",
           "default_registry_dir", "kernel_env", "packages_code", "reap_orphans"]
