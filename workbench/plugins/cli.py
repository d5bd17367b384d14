"""The CLI part a plugin contributes (`Plugin.commands()`): the console that prints a session's events as the
core's commands do, and an event as the REST transport gives it back."""

from __future__ import annotations

from ..cli.console import Printer
from ..cli.remote import event_of

__all__ = ["Printer", "event_of"]
