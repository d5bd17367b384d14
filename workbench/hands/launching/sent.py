"""Code the hands send to a kernel once it serves a session: the source of a `kernel_*.py` file of this folder.

The file runs as the body of a function that is called once and deleted, so none of its names stay in the
user's namespace.
"""

from __future__ import annotations

from pathlib import Path


def sent(filename: str, call: str) -> str:
    """The source of `filename` (beside this module) as a function's body that ends with `call`, run once."""
    source = (Path(__file__).parent / filename).read_text()
    return "def _workbench_sent():\n" + "".join(f"    {line}\n" for line in source.splitlines()) + \
        f"    {call}\n_workbench_sent()\ndel _workbench_sent\n"
