"""Fixtures of the service's conformance suite: the service in-process over a Host of the test's own, and over
REST against a real in-process Jupyter server with the extension (pytest-jupyter), each on its own database.

pytest-jupyter runs these async tests with its own runner (its hooks are imported below, scoped to this
directory, as in tests/server/conftest.py); do not mark them with pytest.mark.asyncio.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: E402,F403


@pytest.fixture
def jp_server_config(tmp_path: Path) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"workbench": True, "jupyter_server_terminals": False},
                      "allow_unauthenticated_access": False},
        "Workbench": {"db": str(tmp_path / "served.duckdb"), "hands": {"pool_size": 0}},
    }


def entered(loop: Any, cm: Any) -> Iterator[Any]:
    """An async context manager entered and left on pytest-jupyter's loop (it runs no async fixture itself)."""
    value = loop.run_until_complete(cm.__aenter__())
    try:
        yield value
    finally:
        loop.run_until_complete(cm.__aexit__(None, None, None))


@pytest.fixture
def local(tmp_path: Path, jp_asyncio_loop):
    """The service in-process, over a host on a database of its own (hands as a server makes them, no pool)."""
    from workbench.hands.factory import HandsSettings
    from workbench.service.local import Local

    yield from entered(jp_asyncio_loop, Local.open(tmp_path / "local.duckdb", hands=HandsSettings(pool_size=0)))


@pytest.fixture
def rest(jp_serverapp, http_server_client, jp_http_port, jp_base_url, jp_asyncio_loop):
    """The service over the REST API of a real in-process server (the extension's host, on a database of its own)."""
    # http_server_client: pytest-jupyter serves the app only for a test that asks for it
    from workbench.host import load_plugins
    from workbench.service.rest import Rest

    url = f"http://127.0.0.1:{jp_http_port}{jp_base_url.rstrip('/')}"
    yield from entered(jp_asyncio_loop, Rest(url, jp_serverapp.identity_provider.token, timeout=120, plugins=load_plugins()))


@pytest.fixture
def both(local, rest):
    """(in-process, REST): the same operations are run on each and their results compared."""
    return local, rest
