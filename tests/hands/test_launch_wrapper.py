"""The launch wrapper in front of every kernel (hands/launching/launch.py): the command lines it reads, those it
refuses (exit 2 and why, never a traceback), the limits it sets, and what it imports (it runs before every kernel)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.hands.isolating import limits
from workbench.hands.launching import launch

WRAPPER = Path(launch.__file__).resolve()


def wrapper(*args: str | bytes, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-S", str(WRAPPER), *args], capture_output=True, timeout=timeout)


def test_it_runs_the_command_after_the_options_in_both_spellings():
    me = str(os.getpid())
    for args in (["--parent", me], [f"--parent={me}"], ["--supervise", "--parent", me]):
        r = wrapper(*args, "--", sys.executable, "-c", "print('ran', flush=True)")
        assert (r.returncode, r.stdout, r.stderr) == (0, b"ran\n", b""), args


def test_it_knows_every_limit_there_is():
    """The wrapper names the limits itself (it runs before it loads limits.py, and only loads it when one is set)."""
    assert launch.LIMITS == limits.FIELDS


def test_a_parent_that_is_not_its_parent_ends_it_before_the_command():
    r = wrapper("--parent", "1", "--", sys.executable, "-c", "print('ran')")
    assert r.returncode == launch.PARENT_GONE and b"ran" not in r.stdout


def test_it_sets_the_limits_and_reports_how(tmp_path):
    report = tmp_path / "limits.json"
    r = wrapper("--parent", str(os.getpid()), "--max-open-files", "100", "--max-file-mb=7", "--report", str(report),
                "--", sys.executable, "-c", "import resource as r; print(r.getrlimit(r.RLIMIT_NOFILE), "
                "r.getrlimit(r.RLIMIT_FSIZE))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().split() == ["(100,", "100)", f"({7 << 20},", f"{7 << 20})"]
    assert json.loads(report.read_text()) == {"open_files": "rlimit 100", "file_size": f"rlimit {7 << 20}"}


HOSTILE = [
    ["--", "true"],  # no parent
    ["--parent", "abc", "--", "true"],
    ["--parent", "-1", "--", "true"],
    ["--parent", "１２", "--", "true"],  # digits, but not ASCII ones
    ["--parent", "9" * 40, "--", "true"],
    ["--parent=", "--", "true"],
    ["--parent"],
    ["--parent", "1", "--memory-mb", "1e3", "--", "true"],
    ["--parent", "1", "--memory-mb", "nan", "--", "true"],
    ["--parent", "1", "--cpu-seconds"],
    ["--parent", "1", "--processes-by", "root", "--", "true"],
    ["--parent", "1", "--bogus", "--", "true"],
    ["--parent", "1", "true"],  # the command must follow --
    ["--parent", "1", "--"],  # and there must be one
    ["--parent", "1"],
    ["--parent", b"\xff\xfe", "--", "true"],  # not UTF-8
    ["--parent", "1", "--cgroup", "x", "--report"],
]


@pytest.mark.parametrize("args", HOSTILE, ids=repr)
def test_a_command_line_it_cannot_read_exits_2_and_says_why(args):
    r = wrapper(*args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert b"launch.py: error: " in r.stderr and b"usage: launch.py --parent PID" in r.stderr
    assert b"Traceback" not in r.stderr and r.stdout == b""


def test_it_imports_little(tmp_path):
    """It runs before every kernel: argparse, pathlib, typing, dataclasses and json (without a report) cost 20 to 30 ms
    of CPU per kernel start, and importing nothing of them is the point of reading its options by hand."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-I", "-S", str(WRAPPER), "--parent", str(os.getpid()),
                        "--max-open-files", "512", "--", sys.executable, "-c", "pass"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "ctypes" in imported  # it read what it imported
    assert not imported & {"argparse", "pathlib", "typing", "dataclasses", "inspect", "json", "re"}, imported
