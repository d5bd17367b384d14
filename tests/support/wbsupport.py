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


# a cell that prints `tick i t` (t: the kernel's clock) n times, dt seconds apart: what the live-output tests stream
LOOP = "```python\nimport time\nfor i in range({n}):\n    print(f'tick {{i}} {{time.time():.3f}}', flush=True)\n    time.sleep({dt})\n```"


def ticks(text: str) -> dict[int, float]:
    """{i: the kernel's time.time()} of each whole `tick i t` line in text."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "tick":
            out[int(parts[1])] = float(parts[2])
    return out

