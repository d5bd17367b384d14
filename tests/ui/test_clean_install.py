"""What a new user and a Binder visitor get: the package's own dependencies, nothing of the test extras.

A virtualenv with what the README's `pip install -e .` installs (the package and its dependencies from
pyproject.toml; uv resolves the same requirements from its cache, which the suite's own install filled, in seconds
instead of pip's minutes, and compiles the bytecode as pip does: a sandbox's kernel cannot write it into the
read-only environment, and without it each compiled what it imports again; the JupyterLab extension is the one the repository's install built, `SKIP_JUPYTER_BUILDER`).
From it, a JupyterLab whose sandboxed hands run on that environment: asked for a plot, the agent's code plots
(issue 25: after the README's install the hands could not import matplotlib). And Binder: the server started
through binder/start (its environment as Binder sets it) on a machine where bubblewrap cannot start, so the
container is the hands' sandbox; every demo notebook runs there, and each says where the code runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from wbui import REPO, JupyterProcess, lab_api, new_session, open_sidebar, send, session_ids, shot, wait_idle

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the install and five notebooks; and it starts early

NOTEBOOKS = REPO / "notebooks"


@pytest.fixture(scope="module")
def clean_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a virtualenv made as the README's install makes it (see the module's docstring)."""
    venv = tmp_path_factory.mktemp("clean") / "venv"
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not installed beside this Python: scripts/test.sh installs it (pip install uv)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_", "PIP_"))}
    env["SKIP_JUPYTER_BUILDER"] = "1"  # the extension in extension/labextension, as built by the suite's install
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env, timeout=300)
    python = venv / "bin" / "python"
    run = subprocess.run([uv, "pip", "install", "-q", "--compile-bytecode", "--python", str(python), "-e", str(REPO)],
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"the README's install failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    # nothing of the test extras: what works below works with what a user installs
    probe = subprocess.run([str(python), "-c", "import importlib.util as u; print([m for m in "
                            "('pytest', 'nbval', 'playwright', 'sympy') if u.find_spec(m)])"],
                           capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "[]", probe.stdout + probe.stderr
    return python


class CleanJupyter(JupyterProcess):
    """The UI tests' Jupyter process, run by another environment's interpreter (and its `jupyter` commands)."""

    def __init__(self, home: Path, python: Path, **kw):
        super().__init__(home, **kw)
        self.python = python
        self.env["PATH"] = f"{python.parent}{os.pathsep}{self.env.get('PATH', '')}"

    def command(self) -> list[str]:
        return [str(self.python), *super().command()[1:]]


@pytest.fixture(scope="module")
def clean_lab(clean_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterProcess]:
    proc = CleanJupyter(tmp_path_factory.mktemp("cleanlab"), clean_python)
    try:
        yield proc.start(timeout=120)
    finally:
        proc.stop()


def test_after_the_readme_install_a_plot_request_draws_the_plot(page, clean_lab: JupyterProcess):
    status = lab_api(clean_lab, "GET", "status")
    assert status["sandbox"]["sandbox"]["mode"] == "sandbox", status["sandbox"]
    panel = open_sidebar(page, clean_lab)
    new_session(panel)
    send(panel, "Plot monthly revenue and tell me which month was best.\n\n```python\n"
                "import pandas as pd, pyarrow, matplotlib.pyplot as plt\n"
                "sales = pd.DataFrame({'month': ['Jan', 'Feb', 'Mar'], 'revenue': [120, 180, 150]})\n"
                "sales.plot.bar(x='month', y='revenue', figsize=(3, 2))\nplt.show()\n"
                "print('best:', sales.loc[sales.revenue.idxmax(), 'month'], '| pyarrow', pyarrow.__version__)\n```")
    panel.locator(".jp-wb-tool .jp-wb-output img").first.wait_for(timeout=120_000)
    panel.locator(".jp-wb-tool .jp-wb-output").filter(has_text="best: Feb | pyarrow").wait_for(timeout=60_000)
    wait_idle(page)
    assert panel.locator(".jp-wb-tool").filter(has_text="ModuleNotFoundError").count() == 0
    shot(page, "clean-install-plot")
    assert page.blocked == []


@pytest.fixture(scope="module")
def binder_server(clean_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterProcess]:
    """A server as Binder starts one: through binder/start, on a machine where no bubblewrap sandbox starts."""
    home = tmp_path_factory.mktemp("binder")
    proc = CleanJupyter(home, clean_python)  # JupyterLab: the sidebar says it too
    # what binder/start adds to the environment it is given, read by running it
    before = {"PATH": "/usr/bin:/bin"}
    out = subprocess.run(["bash", str(REPO / "binder" / "start"), "env", "-0"], env=before, capture_output=True,
                         check=True, timeout=60).stdout.decode()
    added = dict(kv.split("=", 1) for kv in out.split("\0") if kv and "=" in kv)
    added = {k: v for k, v in added.items() if before.get(k) != v and k not in ("PWD", "SHLVL", "_", "OLDPWD")}
    assert added == {"WORKBENCH_HANDS_CONTAINER_SANDBOX": "1"}, added
    proc.env.update(added, WORKBENCH_BWRAP=str(home / "no-bubblewrap-here"))
    try:
        yield proc.start(timeout=120)
    finally:
        proc.stop()


def test_binder_runs_every_demo_notebook_with_the_container_as_the_sandbox(binder_server: JupyterProcess, tmp_path,
                                                                           page):
    status = lab_api(binder_server, "GET", "status")["sandbox"]["sandbox"]
    assert status["mode"] == "container" and "bubblewrap is not installed" in status["message"], status
    env = {**binder_server.env, "WORKBENCH_URL": binder_server.url, "WORKBENCH_TOKEN": binder_server.token,
           "HOME": str(tmp_path), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "IPYTHONDIR": str(tmp_path / "ipy")}
    env.pop("WORKBENCH_DB", None)  # only the server opens its database
    python = binder_server.python  # type: ignore[attr-defined]
    runs = {}
    for nb in sorted(NOTEBOOKS.glob("*.ipynb")):  # at once, as several visitors' tabs would: each its own kernel
        runs[nb] = subprocess.Popen([str(python), "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                                     "--ExecutePreprocessor.timeout=300", "--output", str(tmp_path / nb.name), str(nb)],
                                    cwd=NOTEBOOKS, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for nb, proc in runs.items():
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"{nb.name} failed under Binder's configuration:\n{err[-4000:]}\n" \
                                     f"--- server ---\n{binder_server.log_tail()}"
        cells = json.loads((tmp_path / nb.name).read_text())["cells"]
        outputs = [o for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])]
        assert not [o for o in outputs if o["output_type"] == "error"], nb.name
        text = "".join("".join(o.get("text", "")) for o in outputs if o["output_type"] == "stream")
        if "workbench.connect()" in nb.read_text() or "%%agent" in nb.read_text():
            # said plainly where the person connects: the first connect's cell tells where model code runs
            assert "this container is their sandbox" in text, (nb.name, text[:2000])
    # the agent's code ran in the container's kernels, said in every kernel's hands_started
    launchers = set()
    for sid in session_ids(binder_server):
        events = lab_api(binder_server, "GET", f"sessions/{sid}/events")["events"]
        launchers |= {e["payload"]["launcher"] for e in events if e["type"] == "hands_started"}
        assert not [e for e in events if e["type"] == "hands_refused"], sid
    assert launchers == {"container"}, launchers
    # and the sidebar says it plainly: in the hands line, and when each kernel starts
    panel = open_sidebar(page, binder_server)
    new_session(panel)
    send(panel, "```python\nprint('where am I?')\n```")
    panel.locator(".jp-wb-note.jp-wb-warn").filter(has_text="not sandboxed: this container is their sandbox").wait_for(
        timeout=60_000)
    wait_idle(page)
    label = panel.locator(".jp-wb-hands-label.jp-wb-warn")
    label.filter(has_text="not sandboxed: this container is their sandbox").wait_for(timeout=30_000)
    shot(page, "binder-container-sandbox")
    assert page.blocked == []
