"""UI fixtures: JupyterLab and Jupyter server subprocesses, stopped by the fixtures."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the tests import their helpers from wbui.py

from wbui import JupyterProcess  # noqa: E402


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterProcess]:
    """A running JupyterLab with the workbench server and lab extensions."""
    proc = JupyterProcess(tmp_path_factory.mktemp("lab"))
    try:
        yield proc.start()
    finally:
        proc.stop()
