"""A session's IPython history is a file in its own workspace: `%history` reads every kernel the session had, and
no other session's code; `%pip` keeps IPython's note that a restart may be needed."""

from __future__ import annotations

import pytest

from workbench.hands.launching.history import HISTORY_FILE

pytestmark = pytest.mark.asyncio


@pytest.mark.timeout(300)
async def test_each_session_keeps_its_ipython_history_in_its_workspace(hands):
    a, b = hands("history-a", {}, None), hands("history-b", {}, None)
    assert (await a.execute("marker_a = 'only in a'")).ok
    assert (await b.execute("marker_b = 'only in b'")).ok
    workspace = await a.workspace()
    assert workspace is not None and (workspace / HISTORY_FILE).is_file()
    await a.restart()  # a fresh kernel reads what the earlier one ran, as a notebook's kernel does after a restart
    obs = await a.execute("%history -g marker_")
    assert "only in a" in obs.stdout and "only in b" not in obs.stdout, obs.to_json()
    obs = await b.execute("print(get_ipython().history_manager.hist_file)")
    assert obs.stdout.strip().endswith(HISTORY_FILE) and "only in a" not in (await b.execute("%history -g marker_")).stdout
    # the names for this kernel's history follow the file's manager
    obs = await a.execute("print(len(In) > 1, In is get_ipython().history_manager.input_hist_parsed)")
    assert obs.stdout.split() == ["True", "True"], obs.to_json()


@pytest.mark.timeout(300)
async def test_pip_keeps_ipythons_restart_note(hands):
    h = hands("pip-note", {}, None)
    obs = await h.execute("%pip --version", timeout=120)
    assert obs.ok and obs.stdout.rstrip().endswith("Note: you may need to restart the kernel to use updated packages."), \
        obs.to_json()
