"""workbench: a Jupyter-native agent workbench.

The brain (model + harness loop) lives in the Jupyter server, its memory is
an append-only session log in DuckDB, its hands are separate kernels.
`import workbench` stays cheap: every part is imported when first used.
"""

from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """The Jupyter server extension (enabled on install by jupyter-config/)."""
    from .server.app import Workbench

    return [{"module": "workbench.server.app", "app": Workbench}]


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext workbench`: the %agent / %%agent magics in a notebook."""
    from .client.magics import load_ipython_extension as load

    load(ipython)


def connect(url: str | None = None, token: str | None = None) -> Any:
    """A client of the workbench server this kernel belongs to (or of `url`)."""
    from .client import connect as _connect

    return _connect(url, token)
