"""Every `workbench` command of the core and of every built-in plugin works beside a running server:
it has a `remote` form (workbench/cli/remote.py) or does not need the database (`needs_db=False`).
A command added without either fails here, before a person finds "database in use" (issue 12)."""

from __future__ import annotations

from workbench.cli.main import commands
from workbench.host import load_plugins
from workbench.plugins import Command


def without_remote(cmds: list[Command]) -> list[str]:
    """The names of commands that need the database file and have no way through a server."""
    return [c.name for c in cmds if c.needs_db and c.remote is None]


def test_every_built_in_command_has_a_remote_form_or_needs_no_database():
    plugins = load_plugins()
    assert {"memory", "evals"} <= {p.name for p in plugins}  # the built-in plugins are the ones checked
    cmds = commands(plugins)
    assert {"run", "sessions", "dream", "eval", "evals"} <= {c.name for c in cmds}
    assert without_remote(cmds) == []


def test_a_command_without_a_remote_form_is_caught():
    bare = Command("bare", "needs the file and has no way through a server", lambda p: None, lambda a, c: 0)
    offline = Command("offline", "needs no database", lambda p: None, lambda a, c: 0, needs_db=False)
    assert without_remote([*commands(load_plugins()), bare, offline]) == ["bare"]
