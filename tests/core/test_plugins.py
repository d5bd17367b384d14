"""A third party adds a tool and a model through an entry point: the worked example of docs/plugins.md.

The example package (examples/echo_plugin) is made visible as an installed distribution by
writing its dist-info next to it on sys.path, the way pip would, without installing anything.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from workbench.errors import PluginError
from workbench.host import Host, HostSettings, load_plugins
from workbench.log import MemoryLog
from workbench.plugins import Plugin

from wbsupport import WORKBENCH, cli_env

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "echo_plugin"


@pytest.fixture
def installed(tmp_path, monkeypatch) -> Path:
    """The example plugin as an installed distribution on sys.path (its entry point included)."""
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(EXAMPLE / "echo_plugin.py", site)
    info = site / "workbench_echo_plugin-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: workbench-echo-plugin\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[workbench.plugins]\necho = echo_plugin:EchoPlugin\n")
    monkeypatch.syspath_prepend(str(site))
    return site


def test_the_example_declares_the_entry_point_it_is_tested_with():
    text = (EXAMPLE / "pyproject.toml").read_text()
    assert '[project.entry-points."workbench.plugins"]\necho = "echo_plugin:EchoPlugin"' in text


@pytest.mark.asyncio
async def test_an_installed_plugin_adds_its_tool_and_model(installed):
    names = [p.name for p in load_plugins(HostSettings())]
    assert names[:3] == ["memory", "evals", "delegate"] and "echo" in names  # the built-in ones first, then installed ones
    host = Host.build(log=MemoryLog(), hands=False)
    try:
        assert "word_count" in host.tools and "python" in host.tools
        sid = host.brain.create_session(model="echo:parrot", tools=["python", "word_count"])["id"]
        assert await host.brain.run_turn(sid, "one two three") == "end_turn"
        reply = host.log.events(sid, types=["assistant_turn"])[0].payload["message"]["content"][0]["text"]
        assert reply == "parrot: one two three"
        specs = {t["name"] for t in host.log.events(sid)[0].payload["tools"]}
        assert specs == {"python", "word_count"}
    finally:
        await host.close()


def test_plugins_can_be_disabled_and_clashes_are_refused(installed):
    assert "echo" not in [p.name for p in load_plugins(HostSettings(disable_plugins="echo"))]
    assert [p.name for p in load_plugins(HostSettings(disable_plugins="memory, evals, delegate, echo"))] == []

    class Clash(Plugin):
        def tools(self):
            from workbench.brain import BUILTIN_TOOLS

            return [BUILTIN_TOOLS["python"]]

    with pytest.raises(PluginError, match="adds tool 'python', which exists already"):
        Host.build(log=MemoryLog(), hands=False, plugins=[Clash(name="clash")])
    with pytest.raises(PluginError, match="cannot load plugin"):
        load_plugins(HostSettings(plugins="no_such_module:Plugin"))
    with pytest.raises(PluginError, match="is not a workbench plugin"):
        load_plugins(HostSettings(plugins="json:dumps"))


@pytest.mark.slow
def test_the_command_line_uses_an_installed_plugin(installed, tmp_path):
    env = cli_env(PYTHONPATH=f"{installed}:{Path(__file__).resolve().parents[2]}")
    db = str(tmp_path / "p.duckdb")
    run = subprocess.run([*WORKBENCH, "run", "count these four words", "--model", "echo", "--tool", "word_count",
                          "--db", db], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "echo: count these four words" in run.stdout
    events = [json.loads(line) for line in subprocess.run([*WORKBENCH, "export", "--db", db, _only_session(db, env)],
                                                            capture_output=True, text=True, env=env).stdout.splitlines()]
    assert {t["name"] for t in events[0]["payload"]["tools"]} == {"python", "word_count"}
    bad = subprocess.run([*WORKBENCH, "run", "hi", "--tool", "nope", "--db", db], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "unknown tool 'nope'" in bad.stderr


def _only_session(db: str, env: dict) -> str:
    out = subprocess.run([*WORKBENCH, "sessions", "--json", "--db", db], capture_output=True, text=True, env=env).stdout
    [row] = [json.loads(line) for line in out.splitlines()]
    return row["id"]
