"""The demo notebooks under nbval: each runs against a real `jupyter server` with the workbench
extension (scripted models, offline) and its outputs must match the stored ones, after
notebooks/sanitize.cfg has replaced what changes from run to run (ids, timestamps, durations, pids)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from wbui import REPO, JupyterProcess

NOTEBOOKS = REPO / "notebooks"
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = JupyterProcess(tmp_path_factory.mktemp("nbserver"), app="jupyter_server", only_workbench=True)
    try:
        yield proc.start()
    finally:
        proc.stop()


def test_demo_notebooks_pass_nbval(server: JupyterProcess, tmp_path):
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")), "no notebooks found"
    env = {
        **server.env,
        # workbench.connect() in the notebooks' kernels finds the server through these.
        "WORKBENCH_URL": server.url,
        "WORKBENCH_TOKEN": server.token,
        "HOME": str(tmp_path),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "IPYTHONDIR": str(tmp_path / "ipython"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
    }
    env.pop("WORKBENCH_DB", None)  # only the server opens the database
    cmd = [
        sys.executable, "-m", "pytest", "--nbval", str(NOTEBOOKS), "--nbval-sanitize-with", str(NOTEBOOKS / "sanitize.cfg"),
        "--nbval-current-env", "--nbval-cell-timeout=300", "-p", "nbval_display", "-p", "no:cacheprovider", "-q", "-x",
    ]
    run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, f"nbval failed:\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}\n--- server log ---\n{server.log_tail()}"
