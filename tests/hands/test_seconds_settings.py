"""The hands' seconds settings (idle_timeout, spare_after, gateway_probe), the per-kernel limits and the per-session
`spare` switch refuse hostile values with a ConfigError that names the setting, before any kernel starts."""

from __future__ import annotations

import math

import pytest

from workbench.errors import ConfigError
from workbench.hands.factory import HandsFactory, HandsSettings, hands_config

HOSTILE = [math.nan, math.inf, -math.inf, -1, -0.001, True, "5", None, [5], 1e400]


@pytest.mark.parametrize("name", ["idle_timeout", "spare_after", "gateway_probe"])
@pytest.mark.parametrize("value", HOSTILE, ids=repr)
def test_a_hostile_number_of_seconds_is_refused_by_name(tmp_path, name, value):
    settings = HandsSettings(backend="gateway" if name == "gateway_probe" else "local", gateway_url="http://127.0.0.1:9",
                             registry_dir=str(tmp_path), pool_size=0, **{name: value})
    with pytest.raises(ConfigError, match=f"^{name} must be a number of seconds, 0 or more"):
        HandsFactory(settings)


@pytest.mark.parametrize("value", [0, 0.5, 5, 3600.0])
def test_zero_and_plain_seconds_are_taken(tmp_path, value):
    HandsFactory(HandsSettings(backend="local", registry_dir=str(tmp_path), pool_size=0, spare_after=value))


@pytest.mark.parametrize("name", ["memory_mb", "max_processes", "max_open_files", "max_file_mb", "cpu_seconds"])
@pytest.mark.parametrize("value", [-1, -5, 1.5, math.nan, True, "512", None, 1 << 41], ids=repr)
def test_a_hostile_kernel_limit_is_refused_by_name(tmp_path, name, value):
    """A negative limit was passed to the launch wrapper, which made it a nonsense one (memory -5 MiB: an address
    space of 1019 MiB) or, since the wrapper reads whole numbers only, a kernel that never starts."""
    settings = HandsSettings(backend="local", registry_dir=str(tmp_path), pool_size=0, **{name: value})
    with pytest.raises(ConfigError, match=f"^{name} must be a whole number from 0 \\(no limit\\)"):
        HandsFactory(settings)


@pytest.mark.parametrize("value", ["no", 0, 1, None, [], {"on": True}])
def test_the_per_session_spare_switch_is_true_or_false(value):
    with pytest.raises(ConfigError, match="hands setting spare has an invalid value"):
        hands_config({"hands": {"spare": value}})
    assert hands_config({"hands": {"spare": False}}).spare is False
