"""Every route the extension serves has a heading in docs/api.md, and every heading is served."""

from __future__ import annotations

import re
from pathlib import Path

from workbench.server.app import all_handlers
from workbench.server.routes import documented, pattern

API_MD = Path(__file__).resolve().parents[2] / "docs" / "api.md"
HEADING = re.compile(r"^###\s+(websocket\s+)?`(?:(GET|POST|PUT|PATCH|DELETE)\s+)?([^`?\s]+)", re.M)


def doc_routes() -> set[tuple[str, str]]:
    return {("WEBSOCKET" if ws else verb, path) for ws, verb, path in HEADING.findall(API_MD.read_text()) if path.startswith("/")}


def test_every_served_route_is_documented_and_every_documented_route_is_served():
    served = set(documented(all_handlers()))
    assert ("POST", "/workbench/api/sessions/{id}/messages") in served and ("WEBSOCKET", "/workbench/api/sessions/{id}/stream") in served
    assert served - doc_routes() == set(), "routes missing from docs/api.md"
    assert doc_routes() - served == set(), "docs/api.md documents routes that are not served"


def test_paths_become_patterns_with_named_groups():
    rx = re.compile(pattern("/workbench/api/sessions/{id}/hands/restart"))
    assert rx.match("/workbench/api/sessions/abc123/hands/restart").group("id") == "abc123"
    assert not rx.match("/workbench/api/sessions/a/b/hands/restart")
