"""One real JupyterHub per module: its proxy, two users (alice and bob) and each one's single-user server."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the tests import their helpers from hubproc.py

from hubproc import Hub, maintainer  # noqa: E402

USERS = ("alice", "bob")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    """A running hub with alice's and bob's servers spawned. Both mount the lab's team store read-only from
    `<hub>/shared/team.json`, which only its maintainer (the OS user running the tests, whose `workbench memories
    export` names them) publishes."""
    root = tmp_path_factory.mktemp("hub")
    env = {"WORKBENCH_MEMORY_SHARED_STORES": f"team={root / 'shared' / 'team.json'}",
           "WORKBENCH_MEMORY_SHARED_MAINTAINER": maintainer()}
    h = Hub(root, USERS, env=env)
    try:
        h.start()
        with ThreadPoolExecutor(len(USERS)) as pool:  # the two spawns overlap: each waits mostly on its server's start
            list(pool.map(h.start_server, USERS))
        yield h
    finally:
        h.stop()
