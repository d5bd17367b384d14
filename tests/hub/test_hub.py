"""The workbench in the single-user servers a real JupyterHub spawns, reached through the hub's proxy.

Each user's REST, websocket and sidebar work; every workbench route (the route table the server registers,
so a new route is covered too) refuses bob, with his cookies and with his token, on alice's server, and
nothing of alice's changes; a review's actor is the hub's user name; each log lives in its user's home.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import websocket
from hubproc import PASSWORD, maintainer

from workbench.client import WorkbenchClient
from workbench.server.app import all_handlers
from workbench.server.routes import documented

REPO = Path(__file__).resolve().parents[2]
ROUTES = documented(all_handlers())
ALICE = "/user/alice"


@pytest.fixture(scope="module")
def people(hub) -> dict[str, Any]:
    """Each user's token and a client logged in through the hub's form (holding their cookies)."""
    out = {name: {"token": hub.token(name), "browser": hub.login(name)} for name in ("alice", "bob")}
    yield out
    for person in out.values():
        person["browser"].close()


def client(hub, people, name: str) -> WorkbenchClient:
    return WorkbenchClient(f"{hub.url}/user/{name}", people[name]["token"], timeout=60)


@pytest.fixture(scope="module")
def alice_session(hub, people) -> dict[str, Any]:
    """A session of alice's with a finished turn, a file in its workspace and a memory she accepted."""
    wb = client(hub, people, "alice")
    try:
        sid = wb.create_session(title="alice's analysis")["id"]
        events = list(wb.turn(sid, "note: the lab's plots use the viridis colormap", timeout=120))
        wb.put_file(sid, "alice-data.csv", b"x,y\n1,2\n")
        dream = wb.call("POST", "/dreams", {"sessions": [sid], "model": "scripted:dream"})
        with wb.stream(dream["dream_id"], timeout=120) as stream:
            next(m for m in stream if m["kind"] == "event" and m["event"]["type"] == "dream_read")
        proposals = wb.call("GET", f"/dreams/{dream['dream_id']}")["proposals"]
        assert proposals, "the scripted dream proposed nothing from alice's note"
        accepted = wb.call("PATCH", f"/memories/{proposals[0]['id']}", {"action": "accept"})
        return {"id": sid, "events": events, "dream": dream["dream_id"], "memory": accepted}
    finally:
        wb.close()


# -- each user's own workbench, through the proxy ---------------------------------------------------------------

def test_each_users_log_lives_in_the_home_the_spawner_gave_them(hub, people):
    for name in ("alice", "bob"):
        status = httpx.get(f"{hub.url}/user/{name}/workbench/api/status", timeout=60,
                           headers={"Authorization": f"token {people[name]['token']}"}).json()
        assert Path(status["db"]) == hub.home(name) / ".local" / "share" / "jupyter" / "workbench" / "workbench.duckdb"
        assert Path(status["db"]).is_file()


def test_rest_and_websocket_through_the_proxy_run_a_turn(hub, people, alice_session):
    types = [m["event"]["type"] for m in alice_session["events"] if m["kind"] == "event"]
    assert "assistant_turn" in types and types[-1] == "turn_ended"
    wb = client(hub, people, "alice")
    try:
        assert alice_session["id"] in {s["id"] for s in wb.sessions()}
        # the websocket replays what was committed: the same turn, read back through the hub's proxy
        with wb.stream(alice_session["id"], timeout=60) as stream:
            seen: list[str] = []
            for m in stream:
                if m["kind"] == "event":
                    seen.append(m["event"]["type"])
                    if seen[-1] == "turn_ended":
                        break
        assert seen[0] == "session_created" and "assistant_turn" in seen
    finally:
        wb.close()
    bob = client(hub, people, "bob")
    try:  # bob's server has a log of its own: alice's session is not in it
        assert alice_session["id"] not in {s["id"] for s in bob.sessions()}
    finally:
        bob.close()


def test_a_reviews_actor_is_the_hub_users_name(hub, people, alice_session):
    assert alice_session["memory"]["status"] == "accepted"
    assert alice_session["memory"]["updated_by"] == "person:alice"
    wb = client(hub, people, "alice")
    try:
        memory = wb.call("GET", f"/memories/{alice_session['memory']['id']}")
    finally:
        wb.close()
    accept = memory["history"][-1]
    assert (accept["action"], accept["actor"]) == ("accept", "person:alice")
    assert memory["history"][0]["actor"].startswith("dream:")


def test_the_browser_cookie_reaches_the_users_own_server(hub, people):
    r = people["alice"]["browser"].get(f"{ALICE}/workbench/api/sessions")
    assert r.status_code == 200 and "sessions" in r.json()


# -- bob against alice's server ---------------------------------------------------------------------------------

def footprint(hub, people, session_id: str) -> dict[str, Any]:
    """What alice's server holds, as alice reads it: every table's row count, her session's files and events."""
    wb = client(hub, people, "alice")
    try:
        tables = [r[0] for r in wb.query("SELECT table_name FROM duckdb_tables() ORDER BY 1")["rows"]]
        counts = wb.query(" UNION ALL ".join(f"SELECT '{t}', count(*) FROM \"{t}\"" for t in tables))["rows"]
        return {"tables": sorted(map(tuple, counts)), "files": wb.files(session_id),
                "events": len(wb.events(session_id)), "session": wb.session(session_id)}
    finally:
        wb.close()


def concrete(path: str, ids: dict[str, str]) -> str:
    """A route's path with alice's own ids in it (her session, memory, dream), so that a refusal is not a 404 of
    an unknown id; an eval id nobody has."""
    for prefix, value in ids.items():
        if path.startswith(prefix):
            return path.replace("{id}", value)
    return path.replace("{id}", uuid.uuid4().hex[:12])


def attempts(hub, people, alice_session, who: str = "bob", routes: list[tuple[str, str]] = ROUTES
             ) -> list[tuple[str, str, str, int]]:
    """Each route x method with `who`'s cookies and with their token, against alice's server: (how, verb, path, status)."""
    api = "/workbench/api"
    ids = {f"{api}/sessions/": alice_session["id"], f"{api}/memories/": alice_session["memory"]["id"],
           f"{api}/dreams/": alice_session["dream"]}
    bob = people[who]
    xsrf = bob["browser"].cookies.get("_xsrf", path=f"/user/{who}/") or ""
    rows = []
    for verb, path in routes:
        url = f"{hub.url}{ALICE}{concrete(path, ids)}"
        for how in ("cookie", "token"):
            headers = {"Authorization": f"token {bob['token']}"} if how == "token" else {
                "Cookie": "; ".join(f"{c.name}={c.value}" for c in bob["browser"].cookies.jar), "X-XSRFToken": xsrf}
            if verb == "WEBSOCKET":
                ws_url = url.replace("http://", "ws://")
                try:
                    ws = websocket.create_connection(ws_url, header=[f"{k}: {v}" for k, v in headers.items()], timeout=30)
                    ws.close()
                    status = 101
                except websocket.WebSocketBadStatusException as e:
                    status = e.status_code
            else:
                body = b"{}" if verb in ("POST", "PUT", "PATCH") else None
                status = httpx.request(verb, url, content=body, headers={**headers, "Content-Type": "application/json"},
                                       timeout=60, follow_redirects=False).status_code
            rows.append((how, verb, path, status))
    return rows


def test_bob_is_refused_on_every_route_of_alices_server_and_nothing_of_hers_changes(hub, people, alice_session):
    before = footprint(hub, people, alice_session["id"])
    rows = attempts(hub, people, alice_session)
    table = "\n".join(f"| {verb} | `{path}` | {how} | {status} |" for how, verb, path, status in rows)
    out = REPO / "test-artifacts" / "hub"
    out.mkdir(parents=True, exist_ok=True)
    (out / "cross-user.md").write_text("| method | route | bob's | status |\n|---|---|---|---|\n" + table + "\n")
    assert len(rows) == 2 * len(ROUTES) and len(ROUTES) > 30
    let_through = [r for r in rows if r[3] not in (403, 404)]
    assert let_through == [], f"bob got through to alice's server: {let_through}"
    assert footprint(hub, people, alice_session["id"]) == before
    # the same requests with alice's own cookies and token go through: the refusals above are bob's
    mine = attempts(hub, people, alice_session, "alice", [("GET", "/workbench/api/sessions/{id}"),
                                                          ("WEBSOCKET", "/workbench/api/sessions/{id}/stream")])
    assert [r[3] for r in mine] == [200, 200, 101, 101]


def test_bob_cannot_get_a_cookie_for_alices_server(hub, people):
    """The hub's OAuth refuses to give bob's browser a login to alice's server."""
    r = people["bob"]["browser"].get(f"{ALICE}/lab")
    assert r.status_code == 403
    assert not any(c.name == "jupyterhub-user-alice" for c in people["bob"]["browser"].cookies.jar)
    r = people["bob"]["browser"].get(f"{ALICE}/workbench/api/sessions")
    assert r.status_code == 403


# -- the sidebar, logged in through the hub's form ---------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    """The system's Chromium, headless, through Playwright; nothing but loopback resolves."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("needs the Debian package chromium (scripts/test.sh installs it)")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium,
                               args=["--no-sandbox", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"])
        try:
            yield b
        finally:
            b.close()


@pytest.mark.parametrize("name", ["alice", "bob"])
def test_the_sidebar_runs_a_turn_for_a_user_who_logged_in_through_the_hub(hub, browser, name):
    context = browser.new_context(viewport={"width": 1360, "height": 860})
    try:
        page = context.new_page()
        page.goto(f"{hub.url}/hub/login")
        page.fill("input[name=username]", name)
        page.fill("input[name=password]", PASSWORD)
        page.locator("input[type=submit], button[type=submit]").first.click()
        page.wait_for_url(re.compile(rf"/user/{name}/lab"), timeout=120_000)
        tab = page.locator('.jp-SideBar.jp-mod-left [data-id="jp-workbench"]')
        tab.wait_for(timeout=120_000)
        page.locator("#jupyterlab-splash").wait_for(state="detached", timeout=120_000)
        panel = page.locator("#jp-workbench")
        if not panel.locator(".jp-wb-composer").is_visible():
            tab.click()
        panel.locator(".jp-wb-composer").wait_for()
        panel.get_by_role("button", name="+ New session").click()
        panel.locator(".jp-wb-session.jp-mod-selected").wait_for(timeout=60_000)
        panel.locator(".jp-wb-input").fill("```python\nprint('through the hub', 6*7)\n```")
        panel.get_by_role("button", name="Send").click()
        # the scripted model runs the code in the user's hands: the call's output comes back over the websocket
        panel.locator(".jp-wb-stdout").filter(has_text="through the hub 42").wait_for(timeout=120_000)
        page.wait_for_function("(b => b.textContent === 'Send' && !b.disabled)"
                               "(document.querySelector('#jp-workbench .jp-wb-composer button'))", timeout=120_000)
        out = REPO / "test-artifacts" / "hub"
        out.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out / f"sidebar-{name}.png"))
    finally:
        context.close()


# -- the team store: published by its maintainer, read by both, written by neither --------------------------------

def maintainer_cli(hub, *args: str) -> str:
    """`workbench ...` as the team store's maintainer, on the maintainer's own log (no server holds it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "WORKBENCH_"))}
    env.update(WORKBENCH_DB=str(hub.root / "maintainer" / "workbench.duckdb"), WORKBENCH_HANDS_POOL_SIZE="0")
    (hub.root / "maintainer").mkdir(exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "workbench", *args], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_team_store_its_maintainer_publishes_reaches_both_users_and_neither_can_write_it(hub, people, alice_session):
    shared = hub.root / "shared" / "team.json"
    shared.parent.mkdir(exist_ok=True)
    # the maintainer dreams over their own session into store `team`, accepts the proposal, and publishes the store
    maintainer_cli(hub, "run", "note: the lab's figures are saved as SVG files")
    maintainer_cli(hub, "dream", "--store", "team", "--model", "scripted:dream")
    proposed = [json.loads(line) for line in maintainer_cli(hub, "memories", "--store", "team", "--json").splitlines()]
    assert len(proposed) == 1
    maintainer_cli(hub, "memory", proposed[0]["id"], "--action", "accept")
    maintainer_cli(hub, "memories", "export", "--store", "team", "-o", str(shared))
    for name in ("alice", "bob"):
        wb = client(hub, people, name)
        try:
            # a new session reads the published file: it is told the accepted memory, and recall finds it
            sid = wb.create_session(title=f"{name}'s figures")["id"]
            injected = [e for e in wb.events(sid) if e["type"] == "memories_injected"]
            assert injected and proposed[0]["id"] in [m["id"] for m in injected[0]["payload"]["memories"]]
            assert {"store": "team", "access": "read_only"} in injected[0]["payload"]["stores"]
            team = wb.call("GET", "/memories", params={"store": "team"})["memories"]
            assert [(m["id"], m["status"]) for m in team] == [(proposed[0]["id"], "accepted")]
            # neither REST nor an import nor a dream writes it: each refusal names the store, its file and maintainer
            refusals = []
            for method, path, body, params in (
                    ("PATCH", f"memories/{team[0]['id']}", {"action": "retire"}, None),
                    ("PATCH", f"memories/{team[0]['id']}", {"action": "edit", "text": "use PNG"}, None),
                    ("POST", "dreams", {"sessions": [sid], "model": "scripted:dream", "store": "team"}, None),
                    ("POST", "memories/import", None, {"store": "team"})):
                content = shared.read_bytes() if path.endswith("import") else json.dumps(body).encode()
                r = httpx.request(method, f"{hub.url}/user/{name}/workbench/api/{path}", params=params, content=content,
                                  headers={"Authorization": f"token {people[name]['token']}",
                                           "Content-Type": "application/json"}, timeout=60)
                refusals.append((r.status_code, r.json()["error"]))
            assert all(status == 403 and "store 'team' is shared" in error and str(shared) in error
                       and f"maintainer {maintainer()}" in error for status, error in refusals), refusals
            assert [(m["id"], m["version"]) for m in wb.call("GET", "/memories", params={"store": "team"})["memories"]] == \
                [(team[0]["id"], team[0]["version"])]
        finally:
            wb.close()
