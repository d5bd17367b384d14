"""Helpers of the UI tests: a real `jupyter lab` (or `jupyter server`) subprocess on 127.0.0.1
with the workbench extensions, its own temp dirs, database and token."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "ui"

# JupyterLab settings for the test user: no news toast, no update check.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
}


OTHER_EXTENSIONS = ("jupyterlab", "jupyter_lsp", "notebook_shim", "jupyter_server_terminals", "panel.io.jupyter_server_extension")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterProcess:
    """`jupyter lab` or `jupyter server` on a free loopback port, token auth, temp dirs."""

    def __init__(self, home: Path, app: str = "jupyterlab", root: Path | None = None, only_workbench: bool = False):
        self.home, self.app, self.port = home, app, free_port()
        self.only_workbench = only_workbench
        self.root = root or home / "root"
        self.token = "wbui-" + os.urandom(8).hex()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = home / "workbench.duckdb"
        self.logfile = home / "server.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "WORKBENCH_", "JUPYTER"))}
        self.env = {
            **env,
            "HOME": str(home),
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "JUPYTER_DATA_DIR": str(home / "data"),
            "JUPYTER_CONFIG_DIR": str(home / "config"),
            "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
            "WORKBENCH_DB": str(self.db),
            "WORKBENCH_HANDS_POOL_SIZE": "0",
        }
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> "JupyterProcess":
        for d in ("runtime", "data", "config", "settings", "workspaces"):
            (self.home / d).mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        built = REPO / "extension" / "labextension"
        if built.is_dir():
            # The repository's build comes first, so a rebuilt extension is tested without reinstalling.
            link = self.home / "jupyter-path" / "labextensions" / "jupyter-workbench-lab"
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                link.symlink_to(built, target_is_directory=True)
            self.env["JUPYTER_PATH"] = str(self.home / "jupyter-path")
        if self.only_workbench:
            # A server for API clients only: other installed extensions just slow its start.
            (self.home / "config" / "jupyter_server_config.json").write_text(json.dumps(
                {"ServerApp": {"jpserver_extensions": {name: False for name in OTHER_EXTENSIONS}}}))
        for name, value in LAB_SETTINGS.items():
            path = self.home / "settings" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(value))
        cmd = [
            sys.executable, "-m", self.app, "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
            "--port-retries=0", f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
            "--ServerApp.allow_root=True",
            # Tests drive JupyterLab's commands (e.g. the theme) through window.jupyterapp.
            *(["--LabApp.expose_app_in_browser=True"] if self.app == "jupyterlab" else []),
        ]
        with open(self.logfile, "ab") as log:
            # Own process group: stop() can take the kernels down with the server.
            self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.app} exited: {self.log_tail()}")
            try:
                r = httpx.get(f"{self.url}/workbench/api/status", headers=self.headers, timeout=2)
                if r.status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.app} did not answer in {timeout} s: {self.log_tail()}")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def log_tail(self, n: int = 4000) -> str:
        return self.logfile.read_text(errors="replace")[-n:] if self.logfile.exists() else ""

    def stop(self) -> None:
        """SIGINT (Jupyter shuts its kernels down), then SIGKILL whatever is left in the group."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
