"""The routes of the workbench API, written the way docs/api.md names them.

Paths use `{name}` for a path argument; `pattern()` turns one into the
regular expression tornado routes on. These are the core's routes; plugins
add theirs through their `routes()` hook (the memory plugin's are in
workbench/memory/routes.py), and `app.all_handlers` serves them all.
"""

from __future__ import annotations

import re

from . import handlers as h, manage as m

API = "/workbench/api"

ROUTES: tuple[tuple[str, type], ...] = (
    (f"{API}/sessions", h.SessionsHandler),
    (f"{API}/sessions/{{id}}", m.SessionHandler),
    (f"{API}/sessions/{{id}}/fork", m.ForkHandler),
    (f"{API}/sessions/{{id}}/usage", m.UsageHandler),
    (f"{API}/search", m.SearchHandler),
    (f"{API}/models", m.ModelsHandler),
    (f"{API}/sessions/{{id}}/messages", h.MessagesHandler),
    (f"{API}/sessions/{{id}}/events", h.EventsHandler),
    (f"{API}/sessions/{{id}}/notebook", h.NotebookHandler),
    (f"{API}/sessions/{{id}}/stream", h.StreamHandler),
    (f"{API}/sessions/{{id}}/interrupt", h.InterruptHandler),
    (f"{API}/sessions/{{id}}/resume", h.ResumeHandler),
    (f"{API}/sessions/{{id}}/hands", h.HandsHandler),
    (f"{API}/sessions/{{id}}/hands/restart", h.HandsRestartHandler),
    (f"{API}/sessions/{{id}}/hands/close", h.HandsCloseHandler),
    (f"{API}/sessions/{{id}}/files", h.FilesHandler),
    (f"{API}/sessions/{{id}}/files/content", h.FileContentHandler),
    (f"{API}/query", h.QueryHandler),
    (f"{API}/status", h.StatusHandler),
)

VERBS = ("get", "post", "put", "patch", "delete")


def pattern(path: str) -> str:
    """A documented path (`/x/{id}/y`) as a tornado pattern with named groups; regexes pass through."""
    return re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", path) + ("" if path.endswith("$") else "/?$")


def verbs(cls: type) -> list[str]:
    """The HTTP verbs a handler class answers (WEBSOCKET for a websocket)."""
    from tornado.websocket import WebSocketHandler

    if issubclass(cls, WebSocketHandler):
        return ["WEBSOCKET"]
    return [v.upper() for v in VERBS if _defined(cls, v)]


def _defined(cls: type, verb: str) -> bool:
    from tornado.web import RequestHandler

    fn = getattr(cls, verb, None)
    return fn is not None and fn is not getattr(RequestHandler, verb)


def documented(routes: list[tuple[str, type]]) -> list[tuple[str, str]]:
    """(VERB, path) for every route, the way docs/api.md headings name them."""
    return [(verb, path) for path, cls in routes for verb in verbs(cls)]
