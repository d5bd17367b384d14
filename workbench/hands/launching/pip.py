"""`%pip` in a session's kernels: the code that sets it up once a kernel serves the session (kernel_pip.py)."""

from __future__ import annotations

from .sent import sent


def packages_code() -> str:
    """The code a kernel runs once it serves a session, in the session's working directory: `%pip` (kernel_pip.py)."""
    return sent("kernel_pip.py", "install()")
