"""The hands' own files for a session, beside its workspace and never in it: IPython's history.

The workspace is the model's files: whatever is in it is listed, copied to verifiers, counted against its quota
and read by the model as its own. What the hands keep for a session across its kernels goes in a directory of
its own (`Place.state`), made with the session's first kernel and removed with its workspace when its hands shut
down; a sandbox binds it at `bubblewrap.STATE`. Its kernels keep IPython's history there (kernel_history.py).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..base import Place
from .sent import sent

HISTORY_FILE = "ipython_history.sqlite"


def new_state() -> Path:
    """A new state directory, this process's user's alone."""
    return Path(tempfile.mkdtemp(prefix="workbench-state-"))


def give_state(place: Place, state: Path, inside: Path) -> None:
    """Make `state` the session's (seen by its kernels at `inside`): its kernels keep their history there."""
    place.state, place.history = state, str(inside / HISTORY_FILE)


def history_code(path: str) -> str:
    """The code a kernel runs once it serves a session: IPython's history in `path` (kernel_history.py)."""
    return sent("kernel_history.py", f"install({path!r})")
