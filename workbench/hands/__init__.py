"""Hands: where the model's code runs (separate, replaceable kernels).

Hosts make hands with `workbench.hands.factory.HandsFactory`; the protocols (Hands,
Launcher, Kernel) are in `workbench.hands.base`.
"""

from .base import Death, EventSink, Hands, Kernel, Launcher, Observation, Place, failure
from .kernel import HandsConfig, KernelHands
from .launching.local import LocalLauncher, kernel_env

__all__ = [
    "Death", "EventSink", "Hands", "HandsConfig", "Kernel", "KernelHands", "Launcher", "LocalLauncher", "Observation",
    "Place", "failure", "kernel_env",
]  # fmt: skip
