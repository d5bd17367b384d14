"""The installed package (pip install . / -e .) gives JupyterLab both workbench extensions, enabled."""

from __future__ import annotations

import os
import re
import subprocess
import sys


def jupyter(tmp_path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    # Only what the install put into the environment counts, not a user's own Jupyter dirs.
    env.update(HOME=str(tmp_path), JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_DATA_DIR=str(tmp_path / "data"))
    run = subprocess.run([sys.executable, "-m", "jupyter", *args], env=env, capture_output=True, text=True, timeout=120)
    return re.sub(r"\x1b\[[0-9;]*m", "", run.stdout + run.stderr)


def test_lab_and_server_extensions_are_installed_and_enabled(tmp_path):
    labext = jupyter(tmp_path, "labextension", "list")
    assert re.search(r"jupyter-workbench-lab v\S+ enabled\s+OK", labext), (
        f"the JupyterLab extension is not installed: run `pip install -e .` (it builds extension/):\n{labext}"
    )
    serverext = jupyter(tmp_path, "server", "extension", "list")
    assert re.search(r"^\s*workbench enabled", serverext, re.M), serverext
    assert re.search(r"workbench\s+OK", serverext), serverext
