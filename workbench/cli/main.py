"""The `workbench` parser and entry point: the core commands, then every plugin's."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ..errors import DatabaseLocked, PluginError, WorkbenchError
from ..host import load_plugins, version
from ..plugins import Command, Plugin
from .commands import CORE_COMMANDS
from .console import EXIT_ERROR, EXIT_OK, Console
from .files import FILE_COMMANDS
from .manage import MANAGE_COMMANDS
from .remote import run_remote


def commands(plugins: Sequence[Plugin]) -> list[Command]:
    """The core commands and the plugins' ones; a plugin may not take a name already taken."""
    out = [*CORE_COMMANDS, *FILE_COMMANDS, *MANAGE_COMMANDS]
    for p in plugins:
        for c in p.commands():
            if any(c.name == o.name for o in out):
                raise PluginError(f"plugin {p.name!r} adds the command {c.name!r}, which exists already")
            out.append(c)
    return out


def build_parser(plugins: Sequence[Plugin] | None = None) -> argparse.ArgumentParser:
    """The whole `workbench` parser (plugins: the loaded ones by default)."""
    plugins = load_plugins() if plugins is None else plugins
    p = argparse.ArgumentParser(prog="workbench", description="A Jupyter-native agent workbench.")
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", default=None, help="the DuckDB session log (default: $WORKBENCH_DB or the Jupyter data dir)")
    for c in commands(plugins):
        r = sub.add_parser(c.name, parents=[db] if c.needs_db else [], help=c.help)
        c.configure(r)
        r.set_defaults(run=c.run)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one `workbench` command; its exit code (2 with one line on stderr for any error of ours)."""
    try:
        plugins = load_plugins()
    except WorkbenchError as e:
        print(f"workbench: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    parser = build_parser(plugins)
    args = parser.parse_args(argv)
    if args.command is None:  # bare `workbench`: what it can do, not a usage error
        parser.print_help()
        return EXIT_OK
    try:
        try:
            return args.run(args, Console(plugins))
        except DatabaseLocked as locked:  # a workbench server holds the file: go through its API
            command = next(c for c in commands(plugins) if c.name == args.command)
            return run_remote(args, list(plugins), command, locked)
    except WorkbenchError as e:
        print(f"workbench: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
