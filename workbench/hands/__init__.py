"""Hands: where the model's code runs (separate, replaceable kernels).

Hosts make hands with `workbench.hands.factory.HandsFactory`; the protocols (Hands, Launcher,
Kernel) are in `workbench.hands.base`. The rest is in three rooms, each with a face of its own:
`observing` (a call's outputs as a notebook and the model see them), `launching` (how kernels
start, talk and end) and `isolating` (what keeps them in their place); docs/architecture.md.
"""

from .base import Death, EventSink, Hands, Kernel, Launcher, Place
from .kernel import HandsConfig, KernelHands
from .launching import LocalLauncher, kernel_env
from .observing import Observation, failure

__all__ = [
    "Death", "EventSink", "Hands", "HandsConfig", "Kernel", "KernelHands", "Launcher", "LocalLauncher", "Observation",
    "Place", "failure", "kernel_env",
]  # fmt: skip
