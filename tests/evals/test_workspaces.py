"""An eval attempt's workspace has the host's quota and a sandbox identity of its own, and outlives its host.

Before, an attempt's workspace was a plain directory beside the log (`<db>.evals/...`): an attempt wrote
192 MiB past a 128 MiB `workspace_mb`, on the disk that holds the session log.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from workbench.evals import Task, TaskLimits, Verifier
from workbench.hands.factory import HandsSettings
from workbench.hands.isolating import preflight
from workbench.host import Host
from workbench.render import result_blocks

pytestmark = [pytest.mark.slow, pytest.mark.asyncio,
              pytest.mark.skipif(not preflight().ok, reason="no working bubblewrap here")]

FILL = Task(
    "fill",
    "Write as much as you can into big.bin, then say how it ended.",
    Verifier.python("assert 'ENOSPC' in answer or 'EDQUOT' in answer, answer"),
    limits=TaskLimits(turns=1),
    scripted=({"code": [
        "import errno, json, os\n"
        "written, err = 0, None\n"
        "open('note.txt', 'w').write('kept')\n"
        "with open('big.bin', 'wb') as f:\n"
        "    try:\n"
        "        for _ in range(64):\n"
        "            written += f.write(b'x' * (1 << 20))\n"
        "            f.flush(); os.fsync(f.fileno())\n"
        "    except OSError as e:\n"
        "        err = errno.errorcode.get(e.errno)\n"
        "print(json.dumps({'written': written, 'error': err, 'uid': os.getuid()}))",
    ], "answer": "{output}"},),
)


def open_host(tmp_path: Path):
    return Host.open(tmp_path / "wb.duckdb", hands=HandsSettings(pool_size=0, registry_dir=str(tmp_path / "kernels")))


async def test_an_attempt_fills_its_own_workspace_and_no_more_and_finds_it_again_on_the_next_host(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_WORKSPACE_MB", "16")
    monkeypatch.setenv("WORKBENCH_WORKSPACE_ROOT", str(tmp_path / "workspaces"))
    async with open_host(tmp_path) as host:
        if host.hands.mode != "sandbox":
            pytest.skip(f"the hands are not sandboxed here: {host.hands.message}")
        df = await host.plugin("evals").make_run([FILL], ["scripted:eval"], run_id="quota").run()
        row = df.iloc[0]
        events = host.log.events(row.session_id)
        out = json.loads(next(result_blocks(e.payload)[0]["text"] for e in events if e.type == "tool_result"))
        started = next(e.payload for e in events if e.type == "hands_started")
    assert bool(row.passed), row.reason
    assert out["error"] in ("ENOSPC", "EDQUOT") and out["written"] <= 16 << 20, out
    assert started["limits"]["workspace"].startswith("16 MiB: ")
    kept = tmp_path / "wb.duckdb.evals" / "quota" / row.session_id
    assert (kept / "workspace.img").is_file() and not (kept / "work" / "note.txt").exists()  # unmounted with its host
    # the next host mounts it again for the attempt's session, files and all, under that host's identity for it
    async with open_host(tmp_path) as host:
        hands = await host.brain.hands(row.session_id)
        root = await hands.workspace(create=True)
        assert root == kept / "work" and (root / "note.txt").read_text() == "kept"
        owner = hands.workspace_owner()
        if os.geteuid() == 0:
            assert owner is not None and (root / "note.txt").stat().st_uid == owner[0] and owner[0] != 0
        await host.brain.close_session(row.session_id)
        await hands.shutdown()
    assert not (kept / "work" / "note.txt").exists() and (kept / "workspace.img").is_file()
