"""Helpers of the UI tests: a real `jupyter lab` (or `jupyter server`) subprocess on 127.0.0.1
with the workbench extensions, its own temp dirs, database and token."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlparse

from playwright.sync_api import Error as PlaywrightError

from workbench.testing.jupyter import JupyterProcess as _Jupyter, free_port, loopback_client

HTTP = loopback_client()  # the helpers' calls

__all__ = ["ARTIFACTS", "CHROMIUM", "HOSTILE_EVAL", "LEGACY_SESSION", "LEGACY_TEXT", "REPO", "JupyterProcess", "artifact", "loopback_page",
           "axe_violations", "dream", "free_port", "lab_api", "new_session", "open_sidebar", "seed_hostile_eval", "seed_legacy_session",
           "send", "session_ids", "shot", "wait_idle"]

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "ui"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def artifact(name: str) -> Path:
    """Where a UI test writes `name` (a screenshot, an axe report): test-artifacts/ui/, made on first use,
    so any test may be the first (or the only) one to run."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / name


def shot(page: Any, name: str, full_page: bool = False) -> Path:
    """A screenshot of the page as the test left it, in test-artifacts/ui/NAME.png."""
    path = artifact(f"{name}.png")
    page.screenshot(path=str(path), full_page=full_page)
    return path

AXE = Path(__import__("axe_playwright_python").__file__).parent / "axe.min.js"


@contextmanager
def loopback_page(browser: Any) -> Iterator[Any]:
    """A page of a fresh browser context that may reach loopback only: `page.blocked` lists what it tried beyond,
    `page.said` what its scripts printed and threw and which requests the server refused or that failed (what
    tests/ui/conftest.py reports when its test fails)."""
    context = browser.new_context(viewport={"width": 1360, "height": 860})
    blocked: list[str] = []

    def only_loopback(route: Any) -> None:
        url = route.request.url
        loopback = url.startswith(("data:", "blob:")) or urlparse(url).hostname in ("127.0.0.1", "localhost")
        try:
            route.continue_() if loopback else route.abort()
        except PlaywrightError as e:
            # a page's route removed while this request was in it: the driver sent the request on by itself. Let
            # go, the error would be raised from the next call of whatever handler comes next and leave that
            # request unsent; one beyond loopback got out, which the test hears of
            if "already handled" not in str(e):
                raise
        if not loopback:
            blocked.append(url)

    context.route("**/*", only_loopback)
    page = context.new_page()
    page.blocked = blocked
    page.said = said = []
    page.on("console", lambda m: said.append(f"console.{m.type}: {m.text}"))
    page.on("pageerror", lambda e: said.append(f"pageerror: {e}"))
    page.on("requestfailed", lambda r: said.append(f"requestfailed: {r.method} {r.url} {r.failure}"))
    page.on("response", lambda r: r.status >= 400 and said.append(f"response: {r.status} {r.request.method} {r.url}"))
    try:
        yield page
    finally:
        context.close()


def axe_violations(page: Any, selector: str) -> list[dict]:
    """axe-core (from the installed package, no CDN) over `selector`: the serious and critical violations."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE))
    result = page.evaluate("(sel) => axe.run(document.querySelector(sel), {resultTypes: ['violations']})", selector)
    return [{"id": v["id"], "impact": v["impact"], "help": v["help"],
             "nodes": [n["html"][:160] for n in v["nodes"][:3]]}
            for v in result["violations"] if v["impact"] in ("serious", "critical")]


# JupyterLab settings for the test user: no news toast, no update check, a notebook's kernel
# started without asking, and every cell of a notebook rendered (not only those in view), so a
# test sees, and a planted script meets, them all.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none", "autoStartDefaultKernel": True},
}


OTHER_EXTENSIONS = ("jupyterlab", "jupyter_lsp", "notebook_shim", "jupyter_server_terminals", "panel.io.jupyter_server_extension")


class JupyterProcess(_Jupyter):
    """`jupyter lab` or `jupyter server` on a free loopback port, token auth, temp dirs."""

    def __init__(self, home: Path, app: str = "jupyterlab", root: Path | None = None, only_workbench: bool = False):
        db = home / "workbench.duckdb"
        super().__init__(
            home, app=app, root=root or home / "root", drop_env=("ANTHROPIC_", "WORKBENCH_", "JUPYTER"),
            env={"HOME": str(home), "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
                 "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"), "WORKBENCH_DB": str(db),
                 "WORKBENCH_HANDS_POOL_SIZE": "0"},
            # A server for API clients only: other installed extensions just slow its start.
            extensions={name: False for name in OTHER_EXTENSIONS} if only_workbench else None,
            # Tests drive JupyterLab's commands (e.g. the theme) through window.jupyterapp.
            args=["--LabApp.expose_app_in_browser=True"] if app == "jupyterlab" else [],
            token_prefix="wbui-")
        self.only_workbench, self.db = only_workbench, db
        self.store = "default"  # the memory store `dream` writes into (a module of the shared lab gets its own)

    def start(self, timeout: float = 60) -> JupyterProcess:
        self.reset_user()
        built = REPO / "extension" / "labextension"
        if built.is_dir():
            # The repository's build comes first, so a rebuilt extension is tested without reinstalling.
            link = self.home / "jupyter-path" / "labextensions" / "jupyter-workbench-lab"
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                link.symlink_to(built, target_is_directory=True)
            self.env["JUPYTER_PATH"] = str(self.home / "jupyter-path")
        super().start(timeout)
        return self

    def reset_user(self) -> None:
        """The test user's JupyterLab settings (LAB_SETTINGS, the light theme) and no saved workspace, as a fresh
        lab has them: a running lab reads both from these dirs at each request."""
        for d in ("settings", "workspaces"):
            shutil.rmtree(self.home / d, ignore_errors=True)
            (self.home / d).mkdir(parents=True)
        for name, value in LAB_SETTINGS.items():
            path = self.home / "settings" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(value))

    def as_new(self) -> set[str]:
        """Make the lab look as a fresh one does to the next test module, without a restart: the sessions
        the modules before it left are archived (the sidebar and its search list none of them), their live
        memories retired (no proposal waits, no memory is injected into a session's prompt), and the
        user's settings and workspaces reset. The module's dreams write into a store of its own, since a
        dream leaves out a title that any memory of its store has, retired or not. Returns the ids of
        every session there is, so that `stop_kernels` knows which ones the module made."""
        self.reset_user()
        self.store = f"ui-{uuid.uuid4().hex[:12]}"
        for sid in session_ids(self, archived="false"):
            lab_api(self, "PATCH", f"sessions/{sid}", {"archived": True})
        for m in lab_api(self, "GET", "memories")["memories"]:
            if m["status"] in ("accepted", "proposed"):
                lab_api(self, "PATCH", f"memories/{m['id']}", {"action": "retire"})
        return session_ids(self)

    def stop_kernels(self, before: set[str]) -> None:
        """Stop what a test module left running, as stopping its own lab did: the hands (kernel and spare) of
        each session made since `before`, and every notebook kernel."""
        def close(sid: str) -> None:
            lab_api(self, "POST", f"sessions/{sid}/hands/close", {})

        def shut_down(kernel: dict[str, Any]) -> None:
            HTTP.delete(f"{self.url}/api/kernels/{kernel['id']}", headers=self.headers, timeout=60).raise_for_status()

        kernels = HTTP.get(f"{self.url}/api/kernels", headers=self.headers, timeout=30)
        kernels.raise_for_status()
        with ThreadPoolExecutor(8) as pool:  # each waits for its kernel's shutdown: together, not one after another
            list(pool.map(close, sorted(session_ids(self) - before)))
            list(pool.map(shut_down, kernels.json()))


def lab_api(lab: _Jupyter, method: str, path: str, body: dict | None = None) -> Any:
    """Call the workbench REST API of a running server; raises on an error status."""
    r = HTTP.request(method, f"{lab.url}/workbench/api/{path}", json=body, headers=lab.headers, timeout=30)
    r.raise_for_status()
    return r.json()


def session_ids(lab: _Jupyter, **query: str) -> set[str]:
    """The ids of the server's sessions (every kind), `query` (e.g. archived="false") choosing which."""
    ids: set[str] = set()
    page = {"next": ""}
    while page["next"] is not None:
        more = {"cursor": page["next"]} if page["next"] else {}
        page = lab_api(lab, "GET", f"sessions?{urlencode({**query, 'limit': 1000, **more})}")
        ids.update(s["id"] for s in page["sessions"])
    return ids


# A session an older workbench recorded: its tool result's `result` is the text/plain of the value, a string
# (before observations had `outputs`). A lab's log holds it from the start, written before the server opens it.
LEGACY_SESSION = "legacy-session"
LEGACY_TEXT = "   x  y\n0  1  a\n1  2  b"


def seed_legacy_session(db: Path) -> None:
    """Write LEGACY_SESSION into the log at `db` (which no server holds open yet)."""
    from workbench.log.duckdb_log import DuckDBLog

    with DuckDBLog(db) as log:
        log.create_session(LEGACY_SESSION, title="an old session", model="scripted", payload={
            "title": "an old session", "model": "scripted", "system": "", "tools": [], "max_tokens": 1024,
            "thinking": None, "output_config": None, "context": None, "config": {}})
        log.append(LEGACY_SESSION, "user_message", {"text": "show the frame"})
        log.append(LEGACY_SESSION, "assistant_turn", {"message": {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_legacy", "name": "python", "input": {"code": "df"}}],
            "stop_reason": "tool_use"}})
        log.append(LEGACY_SESSION, "tool_result", {
            "tool_use_id": "toolu_legacy", "name": "python", "is_error": False,
            "content": [{"type": "text", "text": LEGACY_TEXT}],
            "observation": {"stdout": "", "stderr": "", "result": LEGACY_TEXT, "displays": [], "error": None}})
        log.append(LEGACY_SESSION, "turn_ended", {"stop_reason": "end_turn"})


# An eval run recorded elsewhere (the API and the task format refuse such names, a log from another tool need not):
# its run id, task and model carry markup, and so do its transcript's texts. Each payload sets `top.wbXss` if it runs.
HOSTILE_EVAL = {
    "run": """<svg onload="top.wbXss='run'">""",
    "task": """<img src=x onerror="top.wbXss='task'">""",
    "model": """</td><script>top.wbXss='model'</script>""",
    "prompt": """Say <img src=x onerror="top.wbXss='prompt'"> please""",
    "answer": """<iframe srcdoc="<script>top.wbXss='answer'</script>"></iframe> done""",
    "reason": """error: <b onmouseover="top.wbXss='reason'">boom</b>""",
}


def seed_hostile_eval(db: Path) -> str:
    """Write the HOSTILE_EVAL run's one attempt (ended as an error) into the log at `db` (no server holds it yet); its
    session id."""
    from workbench.evals.plugin import EVENT_TYPES as EVAL_EVENTS
    from workbench.log.duckdb_log import DuckDBLog
    from workbench.log.events import EVENT_TYPES

    h, sid = HOSTILE_EVAL, "ev-hostile-attempt"
    with DuckDBLog(db, event_types={**EVENT_TYPES, **EVAL_EVENTS}) as log:
        log.create_session(sid, title=h["task"], model=h["model"], kind="eval", payload={
            "title": h["task"], "model": h["model"], "system": "", "tools": [], "max_tokens": 1024, "thinking": None,
            "output_config": None, "context": None, "config": {}})
        log.append(sid, "eval_started", {"run": h["run"], "task": h["task"], "model": h["model"], "epoch": 1, "try": 1,
                                         "digest": "x", "verifier": "rubric", "limits": {"turns": 1}})
        log.append(sid, "user_message", {"text": h["prompt"]})
        log.append(sid, "assistant_turn", {"message": {"role": "assistant", "stop_reason": "end_turn", "content": [
            {"type": "text", "text": h["answer"]}]}, "usage": {"input_tokens": 7, "output_tokens": 3}})
        log.append(sid, "turn_ended", {"stop_reason": "end_turn"})
        log.append(sid, "eval_finished", {"outcome": "error", "passed": None, "score": None, "reason": h["reason"],
                                          "cost": 0.0})
    return sid


def dream(lab: JupyterProcess, sessions: list[str]) -> list[dict[str, Any]]:
    """Run the scripted dream over `sessions` on the server into `lab.store`, wait for its commit; returns its proposals."""
    from workbench.client import WorkbenchClient

    body = {"sessions": sessions, "model": "scripted:dream", "store": lab.store}
    dream_id = lab_api(lab, "POST", "dreams", body)["dream_id"]
    client = WorkbenchClient(lab.url, lab.token)
    try:
        # dream_read is committed after the dream's turn, in one transaction with its proposals.
        with client.stream(dream_id, timeout=60) as stream:
            next(m for m in stream if m["kind"] == "event" and m["event"]["type"] == "dream_read")
    finally:
        client.close()
    return lab_api(lab, "GET", f"dreams/{dream_id}")["proposals"]


# -- driving the sidebar ------------------------------------------------------

def open_sidebar(page, lab: _Jupyter):
    """JupyterLab in a fresh workspace with the workbench sidebar open; returns the sidebar."""
    # A workspace of its own: nothing an earlier test left open (a notebook asking for a kernel) comes back.
    page.goto(f"{lab.url}/lab/workspaces/w{uuid.uuid4().hex[:8]}?token={lab.token}")
    tab = page.locator('.jp-SideBar.jp-mod-left [data-id="jp-workbench"]')
    tab.wait_for(timeout=60_000)
    page.locator("#jupyterlab-splash").wait_for(state="detached", timeout=60_000)
    panel = page.locator("#jp-workbench")
    if not panel.locator(".jp-wb-composer").is_visible():
        tab.click()
    panel.locator(".jp-wb-composer").wait_for()
    news = page.get_by_role("button", name="No", exact=True)
    if news.count():
        news.first.click()
    return panel


def new_session(panel) -> str:
    """Start a session with + New session; returns its id once it is selected."""
    before = panel.locator(".jp-wb-session.jp-mod-selected").get_attribute("data-session-id") \
        if panel.locator(".jp-wb-session.jp-mod-selected").count() else None
    panel.get_by_role("button", name="+ New session").click()
    panel.page.wait_for_function(
        "(b) => { const s = document.querySelector('#jp-workbench .jp-wb-session.jp-mod-selected');"
        " return s && s.dataset.sessionId !== b; }", arg=before)
    return panel.locator(".jp-wb-session.jp-mod-selected").get_attribute("data-session-id")


def send(panel, text: str) -> None:
    """Type `text` into the composer and press Send."""
    panel.locator(".jp-wb-input").fill(text)
    panel.get_by_role("button", name="Send").click()


def wait_idle(page) -> None:
    """The turn is over: the composer's button is Send again."""
    page.wait_for_function("(b => b.textContent === 'Send' && !b.disabled)"
                           "(document.querySelector('#jp-workbench .jp-wb-composer button'))", timeout=60_000)
