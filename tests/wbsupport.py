"""Helpers for tests that run the `workbench` command as a subprocess."""

from __future__ import annotations

import os
import sys

WORKBENCH = [sys.executable, "-m", "workbench.cli"]


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for a `workbench` subprocess: no key or settings of the developer's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "WORKBENCH_"))}
    env.update(extra)
    return env
