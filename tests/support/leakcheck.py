"""A pytest plugin: the test run fails if a process it started (a kernel, a sandbox, a server) outlives it.

Every kernel this run starts (directly, through a CLI or Jupyter server subprocess, a
gateway, nbclient) names a path under RUN_ROOT on its command line: its run directory or
connection file is made under TMPDIR (or the Jupyter runtime dir, under pytest's basetemp,
which lives there too), and every subprocess inherits TMPDIR. So a process whose command
line mentions RUN_ROOT is this run's, and no other process is ever judged or stopped: not a
user's JupyterLab kernels, not another test run's. Load it with `-p leakcheck` (the suite's
conftest does).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid

import psutil
import pytest

# A pytest-xdist worker inherits the TMPDIR its controller set, so its root lies inside the controller's: each
# worker judges the processes of its own tests, and the controller, last, anything any of them left. A worker's
# root has a short name: a kernel's ZMQ socket path under it must stay within the 107 bytes of a Unix socket path
# (an unprivileged run's TMPDIR is deeper than /tmp)
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
RUN_ROOT = tempfile.mkdtemp(prefix=f"{_WORKER}-" if _WORKER else f"wbtest-{uuid.uuid4().hex[:8]}-")


def pytest_configure(config):
    """Point every temporary file of this run (and of its subprocesses) under RUN_ROOT."""
    os.environ["TMPDIR"] = RUN_ROOT
    tempfile.tempdir = RUN_ROOT


def _roots(config: pytest.Config) -> list[str]:
    """RUN_ROOT, and in a pytest-xdist worker also its basetemp (tmp_path), which the controller made elsewhere."""
    basetemp = config.option.basetemp if hasattr(config, "workerinput") else None
    return [RUN_ROOT] + ([str(basetemp)] if basetemp else [])


def _names(arg: str, root: str) -> bool:
    """`arg` names `root` or a path under it (not a sibling whose name begins alike, as gw1 and gw10)."""
    return arg.endswith(root) or root + os.sep in arg


def _started_by_this_run(roots: list[str]) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid != os.getpid() and any(_names(a, r) for a in p.info["cmdline"] or [] for r in roots):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


LEAKS = pytest.StashKey[list[str]]()  # in the controller of pytest-xdist workers: what each worker's check stopped


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """(pytest-xdist's controller) keep what a worker's check found: a worker's own exit status is not the run's."""
    node.config.stash.setdefault(LEAKS, []).extend(getattr(node, "workeroutput", {}).get("leaks", []))


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if a process this run started (a kernel, a sandbox) is still alive at the end."""
    # a kernel whose host was killed leaves on its own once it notices (ipykernel polls its parent)
    _, alive = psutil.wait_procs(_started_by_this_run(_roots(session.config)), timeout=15)
    lines = []
    for p in alive:
        try:
            lines.append(f"  pid {p.pid}: {' '.join(p.cmdline())[:200]}")
            p.kill()
        except psutil.NoSuchProcess:
            continue
    if hasattr(session.config, "workerinput"):  # a worker tells its controller, which reports for the run
        session.config.workeroutput["leaks"] = lines
    else:
        lines = session.config.stash.get(LEAKS, []) + lines
    if lines:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = "processes this test run started outlived it (now killed):\n" + "\n".join(lines)
        if reporter is not None:
            reporter.write_line(text, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    else:
        shutil.rmtree(RUN_ROOT, ignore_errors=True)
