"""A session's IPython history is a file of its own, in the hands' state directory beside its workspace and never in
it: `%history` reads every kernel the session had (the one a cell killed included), no other session's code, and
nothing of it is in the workspace; `%pip` keeps IPython's note that a restart may be needed."""

from __future__ import annotations

import pytest

from workbench.hands.isolating.bubblewrap import STATE
from workbench.hands.launching.state import HISTORY_FILE

pytestmark = pytest.mark.asyncio


def started(events: list[tuple[str, dict]]) -> list[dict]:
    return [p for t, p in events if t == "hands_started"]


@pytest.mark.timeout(300)
async def test_each_session_keeps_its_ipython_history_beside_its_workspace(hands, recorder):
    events, sink = recorder
    a, b = hands("history-a", {}, sink), hands("history-b", {}, None)
    assert (await a.execute("marker_a = 'only in a'")).ok
    assert (await b.execute("marker_b = 'only in b'")).ok
    workspace, state = await a.workspace(), a.place.state
    assert workspace is not None and state is not None and (state / HISTORY_FILE).is_file()
    assert not state.is_relative_to(workspace) and not workspace.is_relative_to(state)
    assert [p.name for p in workspace.iterdir() if p.name != "lost+found"] == []  # the model's files only
    obs = await a.execute("print(get_ipython().history_manager.hist_file)")
    assert obs.stdout.strip() == f"{STATE}/{HISTORY_FILE}", obs.to_json()  # a fixed path, not the host's
    await a.restart()  # a fresh kernel reads what the earlier one ran, as a notebook's kernel does after a restart
    obs = await a.execute("%history -g marker_")
    assert "only in a" in obs.stdout and "only in b" not in obs.stdout, obs.to_json()
    assert "only in a" in (await a.execute("%history ~1/")).stdout
    assert "only in a" not in (await b.execute("%history -g marker_")).stdout
    # a cell that kills its kernel is written before it runs: the next kernel's history has it
    assert (await a.execute("import os, signal; os.kill(os.getpid(), signal.SIGKILL)  # the killer")).error
    assert "# the killer" in (await a.execute("%history ~1/")).stdout
    # the names for this kernel's history follow the session's manager
    obs = await a.execute("print(len(In) > 1, In is get_ipython().history_manager.input_hist_parsed)")
    assert obs.stdout.split() == ["True", "True"], obs.to_json()
    assert [p["history"] for p in started(events)] == ["session"] * 3
    await a.shutdown()  # the state goes with the workspace
    assert not state.exists() and a.place.history == ":memory:"


@pytest.mark.timeout(300)
async def test_a_pooled_kernel_takes_the_sessions_history(factory, recorder):
    events, sink = recorder
    h = factory("history-pooled", {}, sink)
    assert (await h.execute("marker = 'from the pooled kernel'")).ok
    assert started(events)[0]["pooled"] and started(events)[0]["history"] == "session"
    assert h.place.state is not None
    obs = await h.execute("print(get_ipython().history_manager.hist_file)")
    assert obs.stdout.strip() == str(h.place.state / HISTORY_FILE), obs.to_json()
    await h.restart()
    assert "from the pooled kernel" in (await h.execute("%history -g marker")).stdout
    # no saving thread: IPython's would count against the kernel's process limit
    obs = await h.execute("import threading; print(sorted(t.name for t in threading.enumerate()))")
    assert "IPythonHistorySavingThread" not in obs.stdout, obs.to_json()
    await h.shutdown()


@pytest.mark.timeout(300)
async def test_pip_keeps_ipythons_restart_note(hands):
    h = hands("pip-note", {}, None)
    obs = await h.execute("%pip --version", timeout=120)
    assert obs.ok and obs.stdout.rstrip().endswith("Note: you may need to restart the kernel to use updated packages."), \
        obs.to_json()


@pytest.mark.timeout(300)
async def test_a_history_file_the_kernel_spoiled_keeps_no_later_kernel_from_starting(factory):
    h = factory("history-spoiled", {}, None)
    spoil = ("import glob\nfor f in glob.glob(str(get_ipython().history_manager.hist_file) + '*'):\n"
             "    open(f, 'wb').write(b'\\0' * 4096)")
    assert (await h.execute(spoil)).ok
    obs = await h.execute("marker = 'written into a spoiled file'")
    assert obs.ok and "could not be written" in obs.stderr and "keeps it in memory" in obs.stderr, obs.to_json()
    await h.restart()  # IPython moves a file that is not a database aside and starts a new one
    assert (await h.execute("marker = 'after'")).ok
    await h.restart()
    obs = await h.execute("%history -g marker")
    assert obs.ok and "after" in obs.stdout and not obs.stderr, obs.to_json()
    await h.shutdown()
