"""`%pip` in a session's kernels: the code that sets it up once a kernel serves the session (kernel_pip.py)."""

from __future__ import annotations

from pathlib import Path


def packages_code() -> str:
    """The code a kernel runs once it serves a session, in the session's working directory: `%pip` (kernel_pip.py)."""
    source = Path(__file__).with_name("kernel_pip.py").read_text()
    return "def _workbench_pip():\n" + "".join(f"    {line}\n" for line in source.splitlines()) + \
        "    install()\n_workbench_pip()\ndel _workbench_pip\n"
