"""The web part a plugin contributes: routes served under the API (`Plugin.routes()`), written as the core's are.

A plugin's handler subclasses `Handler` (the server's handler: JSON errors from the error tree, the XSRF and
token checks of Jupyter, the host on `self.host`) and wraps each method in `@api`; its bodies and
query arguments are `Body` shapes checked by `parse` and `query_args`, with the limits the core's routes use.
Imported only by a plugin's routes module, which the server loads: the core never imports it.
"""

from __future__ import annotations

from ..checks import Body, Int, Items, Text, check_model, kind_of, parse
from ..server.bodies import MAX_ID_CHARS, MAX_MODEL_CHARS, Digits, EmptyBody, Flag, flag, query_args, within
from ..server.handlers import WorkbenchHandler, api
from ..server.routes import API
from . import PluginHost


class Handler(WorkbenchHandler):
    """A plugin's handler: the core's, with the server's host as a plugin sees it."""

    @property
    def host(self) -> PluginHost:
        """The host of this server (its log, brain, models, hands and plugins)."""
        return self.runtime.host


__all__ = ["API", "MAX_ID_CHARS", "MAX_MODEL_CHARS", "Body", "Digits", "EmptyBody", "Flag", "Handler", "Int", "Items",
           "Text", "api", "check_model", "flag", "kind_of", "parse", "query_args", "within"]
