"""The `workbench` command: core commands here, more from plugins (docs/cli.md)."""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
