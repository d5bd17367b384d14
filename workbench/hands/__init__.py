"""Hands: where the model's code runs (separate, replaceable kernels).

Hosts make hands with `workbench.hands.factory.HandsFactory`; the protocols (Hands, Launcher,
Kernel) are in `workbench.hands.base`. The rest is in three rooms, each with a face of its own:
`observing` (a call's outputs as a notebook and the model see them), `launching` (how kernels
start, talk and end) and `isolating` (what keeps them in their place); docs/architecture.md.
"""

from typing import TYPE_CHECKING, Any

from .base import Death, EventSink, Hands, Kernel, Launcher, Place
from .isolating import discard as discard_kept_workspace
from .kernel import HandsConfig, KernelHands
from .observing import Observation, failure

if TYPE_CHECKING:
    from .launching.local import LocalLauncher, kernel_env


def __getattr__(name: str) -> Any:  # the local launcher at first use, as the launching room gives it
    if name in ("LocalLauncher", "kernel_env"):
        from . import launching

        return getattr(launching, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "Death", "EventSink", "Hands", "HandsConfig", "Kernel", "KernelHands", "Launcher", "LocalLauncher", "Observation",
    "Place", "discard_kept_workspace", "failure", "kernel_env",
]  # fmt: skip
