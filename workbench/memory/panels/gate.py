"""A per-launch token in front of every route of a served app (the review app of `workbench review`).

The first visit carries the token in the URL (`?token=...`). The answer sets an
HttpOnly, SameSite=Strict cookie and redirects to the same URL without the token,
so it leaves the address bar, the history and the page. Every later request
(the page, static files, the websocket) is let through with that cookie or with
the token in its query; anything else gets a plain 403 before any handler of
the app runs.

Cookies are shared by every port of a host, so the cookie's name carries the
port: two review servers on one machine never accept each other's cookie.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from tornado.httputil import HTTPServerRequest
from tornado.routing import Matcher, Rule
from tornado.web import Application, RequestHandler

REFUSED = "403: this app needs the token it was started with; open the URL with ?token= that `workbench review` printed\n"


def new_token() -> str:
    """A random token for one launch (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def cookie_name(port: int) -> str:
    """The cookie that holds the token for the server on `port`."""
    return f"workbench-review-{port}"


def _same(given: bytes | str, token: str) -> bool:
    if isinstance(given, str):
        given = given.encode("utf-8", "surrogateescape")
    return hmac.compare_digest(given, token.encode())


def _query_token(request: HTTPServerRequest, token: str) -> bool:
    return any(_same(v, token) for v in request.query_arguments.get("token", []))


def _cookie_token(request: HTTPServerRequest, token: str, cookie: str) -> bool:
    # tornado parses a malformed Cookie header as no cookies, never an error
    morsel = request.cookies.get(cookie)
    return morsel is not None and _same(morsel.value, token)


class _When(Matcher):
    """Matches the requests for which `test` is true (a rule's handler then answers them)."""

    def __init__(self, test: Callable[[HTTPServerRequest], bool]):
        self.test = test

    def match(self, request: HTTPServerRequest) -> dict[str, Any] | None:
        return {} if self.test(request) else None


class _Refuse(RequestHandler):
    def prepare(self) -> None:
        self.set_status(403)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(REFUSED)


class _SetCookie(RequestHandler):
    def initialize(self, token: str, cookie: str) -> None:
        self.token, self.cookie = token, cookie

    def get(self) -> None:
        self.set_cookie(self.cookie, self.token, path="/", httponly=True, samesite="Strict")
        self.set_header("Cache-Control", "no-store")
        rest = [(k, v) for k, vs in self.request.query_arguments.items() if k != "token" for v in vs]
        # "//host" or "/\\host" would be read as another host: keep the redirect on this server
        path = "/" + self.request.path.lstrip("/\\")
        self.redirect(path + ("?" + urlencode(rest) if rest else ""))

    head = get


def require_token(app: Application, token: str, cookie: str) -> None:
    """Refuse (403) every request to `app` without `token` in its query or `cookie`; a page GET with it sets the cookie."""
    if len(token) < 16:
        raise ValueError("the token must be at least 16 characters: use new_token()")

    def refused(r: HTTPServerRequest) -> bool:
        return not (_cookie_token(r, token, cookie) or _query_token(r, token))

    def first_visit(r: HTTPServerRequest) -> bool:
        upgrade = r.headers.get("Upgrade", "").lower() == "websocket"
        return r.method in ("GET", "HEAD") and not upgrade and _query_token(r, token) and not _cookie_token(r, token, cookie)

    app.add_handlers(r".*", [Rule(_When(refused), _Refuse), Rule(_When(first_visit), _SetCookie, {"token": token, "cookie": cookie})])
    # add_handlers appends its host rule after any added before: the gate must be asked first
    rules = app.default_router.rules
    rules.insert(0, rules.pop(-2))
