"""The service on a log without SQL (the in-memory twin): what needs SQL is refused in words, the rest works."""

from __future__ import annotations

import pytest

from workbench.errors import ConfigError
from workbench.host import Host, HostSettings
from workbench.log import MemoryLog
from workbench.service.local import Local


async def test_query_on_a_log_without_sql_is_a_clear_error_and_the_rest_works():
    host = Host.build(settings=HostSettings(), hands=False, plugins=[], log=MemoryLog())
    await host.start()
    try:
        service = Local(host)
        with pytest.raises(ConfigError, match="keeps no SQL tables"):
            await service.query("SELECT 1")
        row = await service.create_session(title="kept", model="scripted")
        assert (await service.rename(row["id"], "renamed"))["title"] == "renamed"
        assert host.status()["db"] == ""  # no file: the status says none, without probing the log's attributes
    finally:
        await host.close()
