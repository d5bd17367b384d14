"""LogSettings: every field documented under "Session log", nonsense refused, read from WORKBENCH_LOG_*."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest

from workbench.config import from_env
from workbench.errors import ConfigError
from workbench.log import LogSettings

DOCS = Path(__file__).resolve().parents[2] / "docs"


def section(doc: str, title: str) -> str:
    text = (DOCS / doc).read_text()
    m = re.search(rf"^## {re.escape(title)}.*?(?=^## |\Z)", text, re.M | re.S)
    assert m, f"docs/{doc} has no section {title!r}"
    return m.group(0)


def test_every_log_setting_is_documented_in_its_section():
    text = section("settings.md", "Session log (`LogSettings`)")
    fields = [f.name for f in dataclasses.fields(LogSettings)]
    assert [f for f in fields if f"`{f}`" not in text] == []
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", text, re.M))
    assert documented == set(fields), "the table documents fields LogSettings does not have"


def test_the_query_section_names_the_query_limits():
    text = section("api.md", "Querying the log")
    for name in ("query_timeout", "query_max_rows", "query_max_sql_chars", "query_max_params", "query_max_param_chars", "truncated"):
        assert name in text


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(LogSettings)])
@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, True, "10", None])
def test_nonsense_settings_are_refused(field, value):
    with pytest.raises(ConfigError, match=field):
        LogSettings(**{field: value})


def test_max_depth_stays_within_what_can_be_written():
    assert LogSettings(max_depth=250).max_depth == 250
    with pytest.raises(ConfigError, match="at most 250"):
        LogSettings(max_depth=251)


def test_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("WORKBENCH_LOG_QUERY_TIMEOUT", "2.5")
    monkeypatch.setenv("WORKBENCH_LOG_MAX_DEPTH", "10")
    s = from_env(LogSettings, prefix="WORKBENCH_LOG_")
    assert (s.query_timeout, s.max_depth, s.query_max_rows) == (2.5, 10, LogSettings().query_max_rows)
    monkeypatch.setenv("WORKBENCH_LOG_MAX_DEPTH", "-3")
    with pytest.raises(ConfigError, match="max_depth"):
        from_env(LogSettings, prefix="WORKBENCH_LOG_")


def test_a_callers_defaults_give_way_to_the_environment_and_are_checked(monkeypatch):
    """`defaults` stand in for the class's (the CLI's run: no pool refill), the environment wins over them, and
    `overrides` over both; a default is checked as an override is."""
    monkeypatch.delenv("WORKBENCH_LOG_MAX_DEPTH", raising=False)
    assert from_env(LogSettings, prefix="WORKBENCH_LOG_", defaults={"max_depth": 7}).max_depth == 7
    monkeypatch.setenv("WORKBENCH_LOG_MAX_DEPTH", "10")
    assert from_env(LogSettings, prefix="WORKBENCH_LOG_", defaults={"max_depth": 7}).max_depth == 10
    assert from_env(LogSettings, prefix="WORKBENCH_LOG_", defaults={"max_depth": 7}, max_depth=3).max_depth == 3
    for bad in ({"max_depth": math.nan}, {"max_depth": "7"}, {"max_depth": True}, {"no_such_field": 1}):
        with pytest.raises(ConfigError, match="max_depth|no_such_field"):
            from_env(LogSettings, prefix="WORKBENCH_LOG_", defaults=bad)
