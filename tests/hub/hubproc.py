"""A real JupyterHub for tests: the hub, its configurable-http-proxy, and single-user servers it spawns.

The hub listens on free loopback ports in a temp dir of its own (its sqlite database, cookie secret and
config there too); DummyAuthenticator lets the named users in with one shared password, and the
SimpleLocalProcessSpawner runs each user's single-user server (Jupyter server with the workbench and
JupyterLab) as this process's own user, with HOME at `<dir>/home/<name>`: the workbench's log then lives in
that home, where it lives for a researcher (the Jupyter data dir, `~/.local/share/jupyter/workbench/`).

configurable-http-proxy comes from npm: the one on PATH, else one installed once into the repository's
ignored build area (build/hub-proxy), so that a fresh clone with the npm registry in reach gets it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx

from workbench.testing.jupyter import free_port, loopback_client

REPO = Path(__file__).resolve().parents[2]
CHP_VERSION = "5.3.0"
CHP_DIR = REPO / "build" / "hub-proxy"
PASSWORD = "wb-hub-test-password"
HTTP = loopback_client()  # the helpers' calls, and the waits' polls
# JupyterLab settings each user starts with: no news toast, no update check (as the UI tests' lab)
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
}


def maintainer() -> str:
    """The team store's maintainer: whoever runs the tests (the actor `workbench memories export` records)."""
    import getpass

    return getpass.getuser()


def proxy_command() -> str:
    """configurable-http-proxy: on PATH, or installed from npm into build/hub-proxy once."""
    found = shutil.which("configurable-http-proxy")
    if found:
        return found
    exe = CHP_DIR / "node_modules" / ".bin" / "configurable-http-proxy"
    if not exe.exists():
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("the hub tests need npm (Node.js) to install configurable-http-proxy")
        CHP_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(CHP_DIR),
                        f"configurable-http-proxy@{CHP_VERSION}"], check=True, capture_output=True, timeout=600)
    return str(exe)


class Hub:
    """`start()`, `api()`, `start_server(name)`, `token(name)`, `login(name)`, `stop()`; `url` is the proxy's."""

    def __init__(self, root: Path, users: tuple[str, ...], env: dict[str, str] | None = None):
        self.root, self.users = root, users
        self.port, self.hub_port, self.api_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.service_token = os.urandom(16).hex()
        self.user_env = dict(env or {})
        self.logfile = root / "hub.log"
        self.proc: subprocess.Popen | None = None
        self.server_pids: list[int] = []  # the single-user servers this hub spawned (each in a session of its own)

    def home(self, name: str) -> Path:
        return self.root / "home" / name

    def config(self) -> str:
        """The hub's jupyterhub_config.py."""
        built = REPO / "extension" / "labextension"
        env = {"WORKBENCH_HANDS_POOL_SIZE": "0", "WORKBENCH_MODEL": "scripted", **self.user_env}
        if built.is_dir():  # the repository's build of the lab extension first, as the UI tests' lab has it
            link = self.root / "jupyter-path" / "labextensions" / "jupyter-workbench-lab"
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                link.symlink_to(built, target_is_directory=True)
            env["JUPYTER_PATH"] = str(self.root / "jupyter-path")
        return textwrap.dedent(f"""\
            c = get_config()  # noqa
            c.JupyterHub.ip = "127.0.0.1"
            c.JupyterHub.port = {self.port}
            c.JupyterHub.hub_ip = "127.0.0.1"
            c.JupyterHub.hub_port = {self.hub_port}
            c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{self.api_port}"
            c.ConfigurableHTTPProxy.command = [{proxy_command()!r}]
            c.ConfigurableHTTPProxy.pid_file = {str(self.root / "proxy.pid")!r}
            c.JupyterHub.db_url = {"sqlite:///" + str(self.root / "jupyterhub.sqlite")!r}
            c.JupyterHub.cookie_secret_file = {str(self.root / "cookie_secret")!r}
            c.JupyterHub.pid_file = {str(self.root / "hub.pid")!r}
            c.JupyterHub.authenticator_class = "dummy"
            c.DummyAuthenticator.password = {PASSWORD!r}
            c.Authenticator.allowed_users = {set(self.users)!r}
            c.JupyterHub.spawner_class = "simple"
            c.SimpleLocalProcessSpawner.home_dir_template = {str(self.root / "home" / "{username}")!r}
            c.Spawner.cmd = [{sys.executable!r}, "-m", "jupyterhub.singleuser"]
            c.Spawner.args = ["--ServerApp.allow_root=True"]
            c.Spawner.default_url = "/lab"
            c.Spawner.environment = {env!r}
            c.Spawner.start_timeout = 240
            c.Spawner.http_timeout = 240
            c.JupyterHub.services = [{{"name": "wbtest", "api_token": {self.service_token!r}}}]
            c.JupyterHub.load_roles = [{{"name": "admin", "services": ["wbtest"]}}]
            c.JupyterHub.cleanup_servers = True
            c.JupyterHub.cleanup_proxy = True
            """)

    def start(self, timeout: float = 120) -> Hub:
        self.root.mkdir(parents=True, exist_ok=True)
        for name in self.users:
            settings = self.home(name) / ".jupyter" / "lab" / "user-settings"
            for key, value in LAB_SETTINGS.items():
                path = settings / key
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(value))
        (self.root / "jupyterhub_config.py").write_text(self.config())
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "WORKBENCH_", "JUPYTER"))}
        with open(self.logfile, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(self.root / "jupyterhub_config.py")],
                                         cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait(lambda: HTTP.get(f"{self.url}/hub/api/", timeout=5).status_code == 200, timeout, "the hub to answer")
        return self

    def _wait(self, ready: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"jupyterhub exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if ready():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"waited {timeout:.0f} s for {what}: {self.log_tail()}")

    def log_tail(self, n: int = 6000) -> str:
        return self.logfile.read_text(errors="replace")[-n:] if self.logfile.exists() else ""

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """The hub's REST API as the test's admin service."""
        r = HTTP.request(method, f"{self.url}/hub/api/{path}", json=body, timeout=60,
                         headers={"Authorization": f"token {self.service_token}"})
        r.raise_for_status()
        return r.json() if r.content else None

    def start_server(self, name: str, timeout: float = 240) -> None:
        """Spawn `name`'s single-user server and wait until the hub says it is ready."""
        r = HTTP.post(f"{self.url}/hub/api/users/{name}/server", timeout=60,
                      headers={"Authorization": f"token {self.service_token}"})
        if r.status_code not in (201, 202, 400):  # 400: already running
            raise RuntimeError(f"spawning {name}: {r.status_code} {r.text}")
        self._wait(lambda: (self.api("GET", f"users/{name}")["servers"].get("") or {}).get("ready"), timeout,
                   f"{name}'s server")
        self.server_pids.append(int(self.api("GET", f"users/{name}")["servers"][""]["state"]["pid"]))

    def token(self, name: str) -> str:
        """A new API token of `name`'s, as `jupyterhub token` or the hub's token page makes one."""
        return self.api("POST", f"users/{name}/tokens", {"note": "workbench hub tests"})["token"]

    def login(self, name: str, password: str = PASSWORD) -> httpx.Client:
        """A browser-like client logged in through the hub's form, holding `name`'s cookies for the hub and
        (after the OAuth dance with it) for their own server."""
        client = httpx.Client(base_url=self.url, follow_redirects=True, timeout=60)
        client.get("/hub/login")
        r = client.post("/hub/login", data={"username": name, "password": password,
                                            "_xsrf": client.cookies.get("_xsrf", path="/hub/") or ""})
        r.raise_for_status()
        r = client.get(f"/user/{name}/api/status")  # through the single-user server's OAuth: its cookie is set
        r.raise_for_status()
        return client

    def stop(self) -> None:
        """Stop the users' servers (the hub's cleanup_servers), the proxy and the hub: SIGTERM, then the group."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        # the hub stops its users' servers as it shuts down (cleanup_servers); one it could not stop is killed
        # with its group (its kernels), by the pid the hub gave when it was spawned
        for pid in [self.proc.pid, *self.server_pids]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
