"""Delegation with real kernels: children in parallel, limits, files, crashes and interrupts."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime

import pytest
import pytest_asyncio

from workbench.delegate import DelegatePlugin, DelegateSettings
from workbench.host import Host
from workbench.memory.plugin import MemoryPlugin

pytestmark = pytest.mark.slow


def ask(*calls: dict, code: str = "") -> str:
    pre = f"```python\n{code}\n```\n" if code else ""
    return pre + "\n".join("```json\n" + json.dumps(c) + "\n```" for c in calls)


def worker(*blocks: str, **kw) -> dict:
    return {"prompt": "\n".join(f"```python\n{b}\n```" for b in blocks), "model": "scripted:worker", **kw}


def answered_once(log, sid) -> None:
    events = log.events(sid)
    uses = [b["id"] for e in events if e.type == "assistant_turn" for b in e.payload["message"]["content"] if b["type"] == "tool_use"]
    results = [e.payload["tool_use_id"] for e in events if e.type == "tool_result"]
    assert sorted(uses) == sorted(results) and len(set(results)) == len(results)


def code_windows(log, sid) -> list[tuple[datetime, datetime]]:
    """When each python call of a session ran: (tool_started ts, tool_result ts)."""
    starts = {e.payload["tool_use_id"]: e.ts for e in log.events(sid, types=["tool_started"])}
    return [(starts[e.payload["tool_use_id"]], e.ts) for e in log.events(sid, types=["tool_result"])]


@pytest_asyncio.fixture
async def host(tmp_path, hands):
    h = Host.build(tmp_path / "log.duckdb", hands=hands,
                   plugins=[MemoryPlugin(), DelegatePlugin(settings=DelegateSettings())])
    await h.start()
    yield h
    await h.close()


async def parent(host, text: str) -> tuple[str, list[dict]]:
    sid = host.brain.create_session(model="scripted:delegate", tools=["python", "delegate"])["id"]
    assert await host.brain.run_turn(sid, text) == "end_turn"
    answered_once(host.log, sid)
    return sid, [e.payload for e in host.log.events(sid, types=["tool_result"]) if e.payload["name"] == "delegate"]


def barrier(where, i: int, n: int) -> str:
    """A child's code that waits until n children have arrived: it can finish only if they run at the same time."""
    return (f"import os, time\nopen(os.path.join({str(where)!r}, '{i}'), 'w').close()\nend = time.time() + 240\n"
            f"while len(os.listdir({str(where)!r})) < {n} and time.time() < end:\n    time.sleep(0.05)\n"
            f"print('met' if len(os.listdir({str(where)!r})) >= {n} else 'alone', {i})")


@pytest_asyncio.fixture
async def local_host(tmp_path):
    """Local hands: the children's kernels share this test's directory, which a sandbox does not mount."""
    from workbench.hands.factory import HandsFactory, HandsSettings

    factory = HandsFactory(HandsSettings(backend="local", pool_size=0, registry_dir=str(tmp_path / "kernels")))
    h = Host.build(tmp_path / "log.duckdb", hands=factory, plugins=[DelegatePlugin(settings=DelegateSettings())])
    await h.start()
    yield h
    await h.close()


@pytest.mark.asyncio
async def test_four_children_run_at_the_same_time(local_host, tmp_path):
    meet = tmp_path / "meet"
    meet.mkdir()
    tasks = [worker(barrier(meet, i, 4)) for i in range(4)]
    sid, (result,) = await parent(local_host, ask({"tasks": tasks}))
    kids = result["children"]
    assert [c["status"] for c in kids] == ["done"] * 4
    assert [c["answer"] for c in kids] == [f"Final answer: met {i}" for i in range(4)]  # all four were running at once
    windows = [w for c in kids for w in code_windows(local_host.log, c["session_id"])]
    assert len(windows) == 4 and max(s for s, _ in windows) < min(e for _, e in windows)
    assert {s["id"] for s in local_host.log.sessions() if s["parent_id"] == sid} == {c["session_id"] for c in kids}
    for c in kids:
        answered_once(local_host.log, c["session_id"])


@pytest.mark.asyncio
async def test_two_delegate_calls_in_one_response_run_concurrently(local_host, tmp_path):
    meet = tmp_path / "meet"
    meet.mkdir()
    _, results = await parent(local_host, ask({"tasks": [worker(barrier(meet, 0, 2))]}, {"tasks": [worker(barrier(meet, 1, 2))]}))
    assert [r["children"][0]["answer"] for r in results] == ["Final answer: met 0", "Final answer: met 1"]  # the calls' order
    (a,), (b,) = (code_windows(local_host.log, r["children"][0]["session_id"]) for r in results)
    assert max(a[0], b[0]) < min(a[1], b[1])


@pytest.mark.asyncio
async def test_limits_interrupt_a_child_and_say_which(host):
    tasks = [worker("print(1)", "print(2)", "print(3)", max_turns=2), worker("import time; time.sleep(600)", timeout=4)]
    _, (result,) = await parent(host, ask({"tasks": tasks}))
    turns, slow = result["children"]
    assert turns["status"] == "interrupted" and "max_turns 2 reached" in turns["error"] and turns["turns"] == 2
    assert slow["status"] == "interrupted" and "timeout 4 s reached" in slow["error"]
    for c in (turns, slow):
        answered_once(host.log, c["session_id"])


@pytest.mark.asyncio
async def test_a_child_whose_kernel_dies_is_an_observation_and_the_others_finish(host):
    tasks = [worker("import os; os.kill(os.getpid(), 9)"), worker("print('fine')")]
    _, (result,) = await parent(host, ask({"tasks": tasks}))
    dead, fine = result["children"]
    assert dead["kernel_deaths"] == 1 and dead["status"] == "done" and "died" in dead["answer"].lower()
    assert fine["answer"] == "Final answer: fine"
    assert "its kernel died 1 time(s)" in result["content"][0]["text"]


@pytest.mark.asyncio
async def test_interrupting_the_parent_interrupts_its_children(host):
    sid = host.brain.create_session(model="scripted:delegate", tools=["delegate"])["id"]
    tasks = [worker("import time; time.sleep(600)") for _ in range(2)]
    await host.brain.start_turn(sid, ask({"tasks": tasks}))
    kids: list[str] = []
    for _ in range(600):
        kids = [s["id"] for s in host.log.sessions() if s["parent_id"] == sid]
        if len(kids) == 2 and all(host.log.events(k, types=["tool_started"]) for k in kids):
            break
        await asyncio.sleep(0.1)
    assert await host.brain.interrupt(sid)
    for k in kids:
        assert not host.brain.running(k)
        events = host.log.events(k)
        assert events[-1].type == "turn_ended" and events[-1].payload["stop_reason"] == "interrupted"
        (by,) = [e.payload["by"] for e in events if e.type == "interrupted"]
        assert by == f"parent {sid} interrupted"
        answered_once(host.log, k)
    answered_once(host.log, sid)
    assert host.plugin("delegate").running == set()  # the interrupted call gave its reservation back


@pytest.mark.asyncio
async def test_files_are_copied_from_the_parent_workspace_and_links_out_of_it_are_refused(host, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("do not pass me")
    make = ("import os\nos.makedirs('data', exist_ok=True)\nopen('data/nums.csv', 'w').write('1,2,3\\n')\n"
            f"os.symlink({str(secret)!r}, 'link.txt')\nos.symlink('/etc', 'etcdir')\nprint('made')")
    # the child owns what it was given: it may change it
    good = {"tasks": [{**worker("open('data/nums.csv', 'a').write('4\\n')\nprint(open('data/nums.csv').read().strip())"),
                       "files": ["data/nums.csv"]}]}
    linked = {"tasks": [{**worker("print(1)"), "files": ["link.txt"]}]}
    through = {"tasks": [{**worker("print(1)"), "files": ["etcdir/hostname"]}]}
    missing = {"tasks": [{**worker("print(1)"), "files": ["nope.txt"]}]}
    _, results = await parent(host, ask(good, linked, through, missing, code=make))
    assert results[0]["children"][0]["answer"] == "Final answer: 1,2,3\n4"
    assert all(r["is_error"] for r in results[1:])
    assert "cannot read 'link.txt'" in results[1]["content"][0]["text"]
    assert "cannot read 'etcdir/hostname'" in results[2]["content"][0]["text"]
    assert "cannot read 'nope.txt'" in results[3]["content"][0]["text"]
    assert "do not pass me" not in json.dumps([r["content"] for r in results])
    assert host.plugin("delegate").running == set()  # refused calls gave their reservations back


@pytest.mark.asyncio
async def test_files_over_the_limit_are_refused(tmp_path, hands):
    h = Host.build(tmp_path / "log.duckdb", hands=hands, plugins=[DelegatePlugin(settings=DelegateSettings(max_file_mb=0.01))])
    await h.start()
    try:
        big = {"tasks": [{**worker("print(1)"), "files": ["big.bin"]}]}
        _, (result,) = await parent(h, ask(big, code="open('big.bin', 'wb').write(b'x' * 20000)"))
        assert result["is_error"] and "big.bin" in result["content"][0]["text"]
        assert [s for s in h.log.sessions() if s["parent_id"]] == []
    finally:
        await h.close()



@pytest.mark.asyncio
async def test_a_check_runs_in_fresh_hands_on_a_copy_of_the_workspace_and_the_child_cannot_fool_it(host, tmp_path):
    secret = tmp_path / "outside.txt"
    secret.write_text("42")
    check = "assert open('answer.txt').read().strip() == '42', 'answer.txt does not say 42'\nexplanation = 'answer ok'"
    honest = {**worker("open('answer.txt', 'w').write('42')"), "check": check}
    wrong = {**worker("open('answer.txt', 'w').write('41')"), "check": check}
    # writes the wrong answer, then makes its own kernel lie about files: a check run in its kernel would pass
    cheat = {**worker("open('answer.txt', 'w').write('41')\nimport builtins, io\n"
                      "builtins.open = open = lambda *a, **k: io.StringIO('42')\nprint(open('answer.txt').read())"), "check": check}
    # a link to a file outside its workspace is not followed into the copy
    linker = {**worker(f"import os; os.symlink({str(secret)!r}, 'answer.txt')"), "check": check}
    nothing = {**worker("print('no files')"), "check": "import os\nexplanation = str(sorted(os.listdir('.')))"}
    _, (result,) = await parent(host, ask({"tasks": [honest, wrong, cheat, linker, nothing]}))
    verdicts = [c["check"] for c in result["children"]]
    assert [v["passed"] for v in verdicts] == [True, False, False, False, True]
    assert verdicts[0]["explanation"] == "answer ok" and verdicts[0]["score"] == 1.0
    assert "answer.txt does not say 42" in verdicts[1]["explanation"] and verdicts[1]["score"] == 0.0
    assert result["children"][2]["answer"] == "Final answer: 42"  # the cheat fooled its own kernel, not the check
    assert "answer.txt does not say 42" in verdicts[2]["explanation"]
    assert "FileNotFoundError" in verdicts[3]["explanation"]
    assert verdicts[3]["copy_notes"] == ["answer.txt: left out (a symbolic link)"]
    assert verdicts[4]["explanation"] == "[]" and verdicts[4]["copy_notes"] == []  # the copy holds its workspace only
    assert "check: passed: answer ok" in result["content"][0]["text"] and "check: FAILED" in result["content"][1]["text"]
    for c, v in zip(result["children"], verdicts, strict=True):
        events = host.log.events(c["session_id"])
        (recorded,) = [e.payload for e in events if e.type == "delegate_checked"]
        assert recorded == v
        assert events[-1].type == "hands_stopped"  # its kernel was stopped once it was done with


@pytest.mark.asyncio
async def test_a_child_cannot_pass_its_check_with_a_module_of_its_own(host):
    """The check of docs/delegate.md imports pandas: a `pandas.py` the child wrote beside a wrong answer must not be
    what it imports (the check runs as an eval verifier does: clean sys.path and working directory, a nonce)."""
    data = "import os\nos.makedirs('data', exist_ok=True)\nopen('data/x.csv', 'w').write('v\\n1\\n2\\n4\\n')\nprint('made')"
    check = ("import pandas as pd\n"
             "assert abs(float(open('answer.txt').read()) - pd.read_csv('data/x.csv').v.mean()) < 1e-9, 'wrong mean'")
    fake = ("class _Column:\n    def mean(self):\n        return float(open('answer.txt').read())\n"
            "class _Frame:\n    v = _Column()\n"
            "def read_csv(*a, **k):\n    return _Frame()\n")
    cheat = {**worker(f"open('answer.txt', 'w').write('3.5')\nopen('pandas.py', 'w').write({fake!r})\n"
                      "print(open('answer.txt').read())"), "files": ["data/x.csv"], "check": check}
    right = {**worker("import csv\nv = [float(r['v']) for r in csv.DictReader(open('data/x.csv'))]\n"
                      "open('answer.txt', 'w').write(repr(sum(v) / len(v)))\nprint(open('answer.txt').read())"),
             "files": ["data/x.csv"], "check": check}
    _, (result,) = await parent(host, ask({"tasks": [cheat, right]}, code=data))
    fooled, honest = (c["check"] for c in result["children"])
    assert not fooled["passed"] and fooled["explanation"] == "wrong mean", fooled
    assert honest["passed"] and honest["score"] == 1.0, honest


@pytest.mark.asyncio
async def test_concurrent_delegate_calls_never_start_more_children_than_max_running(tmp_path):
    """Three delegate calls with files in one response, at most 2 children running: exactly 2 ever run, the third
    call is refused. Each call reads its (big) file after passing the cap's check: a call that counted its children
    only once it had read their files let all three through (issue 22)."""
    from workbench.hands.factory import HandsFactory, HandsSettings

    plugin = DelegatePlugin(settings=DelegateSettings(max_running=2))
    factory = HandsFactory(HandsSettings(backend="local", pool_size=0, registry_dir=str(tmp_path / "kernels")))
    h = Host.build(tmp_path / "log.duckdb", hands=factory, plugins=[plugin])
    await h.start()
    try:
        make = "import os\nfor i in range(3):\n    open(f'big{i}.bin', 'wb').write(os.urandom(12 << 20))\nprint('made')"
        calls = [{"tasks": [{**worker(f"import os; print(os.path.getsize('big{i}.bin'))"), "files": [f"big{i}.bin"]}]}
                 for i in range(3)]
        sid, results = await parent(h, ask(*calls, code=make))
        children = [s["id"] for s in h.log.sessions() if s["parent_id"] == sid]
        refused = [r for r in results if r["is_error"]]
        assert len(children) == 2, f"{len(children)} children started with max_running 2"
        assert len(refused) == 1 and "at most 2 may" in refused[0]["content"][0]["text"]
        assert sorted(c["answer"] for r in results if not r["is_error"] for c in r["children"]) == [f"Final answer: {12 << 20}"] * 2
        assert plugin.running == set()  # every reservation was given back
    finally:
        await h.close()


@pytest.mark.asyncio
async def test_outcome_mode_with_a_python_check_passes_on_the_turn_that_fixed_the_work(host):
    """The child writes a wrong answer first and the right one when it tries again (its code counts its runs in a
    file): the check, run in fresh hands each turn, fails once and passes once; the workspace carries over."""
    code = ("import os\nn = int(open('runs').read()) + 1 if os.path.exists('runs') else 1\nopen('runs', 'w').write(str(n))\n"
            "open('answer.txt', 'w').write('42' if n >= 2 else '41')\nprint('run', n)")
    check = "assert open('answer.txt').read() == '42', 'answer.txt says ' + open('answer.txt').read()"
    _, (result,) = await parent(host, ask({"tasks": [{**worker(code), "check": check, "rounds": 3}]}))
    (child,) = result["children"]
    assert (child["rounds"], child["check"]["passed"], child["answer"]) == (2, True, "Final answer: run 2")
    cid = child["session_id"]
    verdicts = [e.payload for e in host.log.events(cid, types=["delegate_checked"])]
    assert [v["passed"] for v in verdicts] == [False, True] and "answer.txt says 41" in verdicts[0]["explanation"]
    told = [e.payload["text"] for e in host.log.events(cid, types=["user_message"])]
    assert told[1].startswith("A check of your work failed (turn 1 of 3)") and "answer.txt says 41" in told[1]
    assert "check: passed" in result["content"][0]["text"] and "(after 2 turns)" in result["content"][0]["text"]
    answered_once(host.log, cid)
