"""Hands: where the model's code runs (separate, replaceable kernels)."""

from .base import EventSink, Hands, Observation, failure
from .kernel import HandsConfig, KernelHands
from .live import LocalLauncher, kernel_env

__all__ = ["EventSink", "Hands", "HandsConfig", "KernelHands", "LocalLauncher", "Observation", "failure", "kernel_env"]
