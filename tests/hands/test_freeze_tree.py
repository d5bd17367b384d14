"""freeze.tree: the processes under a kernel, read down from it, are those the whole machine's parents say."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from workbench.hands.isolating import freeze

# a process whose children come from its main thread and from another thread (a child's parent is the thread that
# forked it: its pid is on that thread's list only), one of them with a child of its own
TREE = """
import subprocess, sys, threading, time
kids = [subprocess.Popen([sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"])]
started = threading.Event()
def other():  # alive while the test looks: its child is on its own list, not the main thread's
    kids.append(subprocess.Popen(["sleep", "60"]))
    started.set()
    time.sleep(60)
threading.Thread(target=other, daemon=True).start()
started.wait()
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def forest():
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this test started, by its leader's pid
        proc.wait()


def _settled(root: int) -> set[int]:
    """The tree by the machine's parents, once it holds the 3 processes TREE makes (the grandchild may still start)."""
    deadline = time.monotonic() + 60
    while len(under := freeze.descendants(root, freeze.parents())) < 3:
        assert time.monotonic() < deadline, under
        time.sleep(0.02)
    return under


def test_the_tree_read_down_from_the_root_is_the_tree_the_machines_parents_give(forest):
    expected = _settled(forest)
    assert freeze.tree(forest) == expected
    assert forest not in freeze.tree(forest)


def test_where_the_kernel_keeps_no_children_lists_the_tree_comes_from_every_process(forest, monkeypatch):
    expected = _settled(forest)
    monkeypatch.setattr(freeze, "_children", lambda pid: None)
    assert freeze.tree(forest) == expected


def test_a_root_that_is_gone_has_nothing_under_it():
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert freeze.tree(proc.pid) == set()
