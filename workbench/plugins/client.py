"""The notebook client a plugin's views use to reach a running server (a panel served over REST)."""

from __future__ import annotations

from ..client import WorkbenchClient, connect

__all__ = ["WorkbenchClient", "connect"]
