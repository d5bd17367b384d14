"""The notebook client against a real `jupyter server` subprocess: a notebook using %%agent
executed headless with nbclient, `workbench.connect()`, and the CLI next to a server that holds the DB."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient
from wbsrv import ServerProcess

from workbench.client import WorkbenchClient, connect
from workbench.errors import RequestRefused, ServerUnavailable


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("client")
    # a shared store whose maintainer has published nothing yet: this server mounts it read-only all the same
    s = ServerProcess(home / "home", home / "wb.duckdb", env={
        "WORKBENCH_MODEL": "scripted", "ANTHROPIC_API_KEY": "",
        "WORKBENCH_MEMORY_SHARED_STORES": f"team={home / 'shared' / 'team.json'}", "WORKBENCH_MEMORY_SHARED_MAINTAINER": "carol"})
    try:
        yield s.start()
    finally:
        s.stop()


def text_outputs(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out["text"])
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return "\n".join(parts)


def test_a_notebook_with_agent_cells_shows_the_replies(server, tmp_path, monkeypatch):
    # the kernel finds the server through the runtime dir the server wrote its info to
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(server.home / "runtime"))
    monkeypatch.delenv("WORKBENCH_URL", raising=False)
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext workbench"),
        nbformat.v4.new_code_cell("%%agent\nPlease run this:\n```python\nprint(21 * 2)\n```"),
        nbformat.v4.new_code_cell("%agent who are you"),
        nbformat.v4.new_code_cell(
            "import workbench\nc = workbench.connect()\na = c.ask('```python\\nprint(\"from a script\")\\n```')\nprint(a.stop_reason, a.text)"
        ),
        nbformat.v4.new_code_cell("%%agent --new --background\n```python\nprint('in the background')\n```"),
        nbformat.v4.new_code_cell(
            "import threading\nfor t in threading.enumerate():\n    if t.name.startswith('workbench-agent-'):\n        t.join(60)\nprint('joined')"
        ),
    ]
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    first, second, third, background, _ = (text_outputs(c) for c in nb.cells[1:])
    assert "you: Please run this" in first and "42" in first and "Here is what it printed" in first
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in nb.cells[1].outputs)
    assert "scripted model" in second and "who are you" in second
    assert "end_turn" in third and "from a script" in third
    assert "in the background" in background and "Here is what it printed" in background
    # both magic cells went to the notebook's one default session; the script made its own
    c = WorkbenchClient(server.url, server.token)
    mine = [s for s in c.sessions() if s["title"] and s["title"].startswith("Please run this")]
    assert len(mine) == 1 and mine[0]["events"] > 0
    users = [e for e in c.events(mine[0]["id"]) if e["type"] == "user_message"]
    assert [u["payload"]["text"] for u in users][1] == "who are you"


def test_client_operations_and_errors(server):
    c = connect(server.url, server.token)
    a = c.ask("hello there", model="scripted")
    assert a.stop_reason == "end_turn" and "You said: hello there" in a.text
    # the turn has ended (the automatic title, from the first message, may be written after its end)
    row = c.session(a.session_id)
    assert row["state"] == "ended" and row["title"] == "hello there", row
    assert c.hands(a.session_id)["state"] == "not started"
    assert c.interrupt(a.session_id) is False
    q = c.query("SELECT count(*) FROM events WHERE session_id = ?", [a.session_id])
    assert q["rows"][0][0] == len(c.events(a.session_id))
    with pytest.raises(RequestRefused) as e:
        c.create_session(model="nonsense")
    assert e.value.status == 400 and "unknown model" in str(e.value)
    with pytest.raises(RequestRefused) as e:
        connect(server.url, "wrong-token")
    assert e.value.status == 403 and "refused the token" in str(e.value)
    # a 403 of the workbench's own says why, not that the token was wrong
    from workbench.memory.client import import_memories

    empty = {"format": "workbench-memory-store", "format_version": 1, "store": "elsewhere", "memories": [], "links": []}
    with pytest.raises(RequestRefused) as e:
        import_memories(c, json.dumps(empty).encode(), store="team")
    assert e.value.status == 403 and "store 'team' is shared" in str(e.value) and "token" not in str(e.value), e.value


def test_client_manages_sessions(server):
    c = connect(server.url, server.token)
    a = c.ask("Summarise the **quarterly** numbers", model="scripted")
    row = c.session(a.session_id)
    assert row["title"] == "Summarise the quarterly numbers" and row["archived"] is False
    assert c.rename(a.session_id, "Quarterly ✓")["title"] == "Quarterly ✓"
    assert c.archive(a.session_id)["archived"] is True
    assert a.session_id not in [s["id"] for s in c.sessions(archived=False)]
    assert a.session_id in [s["id"] for s in c.sessions(archived=True)]
    c.archive(a.session_id, False)
    hits = c.search("QUARTERLY")["hits"]
    assert [h["id"] for h in hits] == [a.session_id] and hits[0]["seq"] == 0  # the title matched
    assert c.search("summarise")["hits"][0]["type"] == "user_message"
    usage = c.usage(a.session_id)
    assert usage["total"]["calls"] == 1 and usage["turns"][0]["output_tokens"] > 0
    assert c.models()[0]["default"] is True
    fork = c.fork(a.session_id, 1, title="from the start")
    assert fork["title"] == "from the start" and fork["events"] == 1
    assert c.events(fork["id"])[0]["payload"]["forked_from"] == {"session_id": a.session_id, "seq": 1}
    assert c.delete(fork["id"]) == {"deleted": fork["id"], "events": 1}
    for call in (lambda: c.session(fork["id"]), lambda: c.rename("no/such", "x"), lambda: c.delete("a b")):
        with pytest.raises(RequestRefused) as e:
            call()
        assert e.value.status == 404
    with pytest.raises(RequestRefused) as e:
        c.rename(a.session_id, "   ")
    assert e.value.status == 400


def test_the_cli_manages_sessions_through_the_server(server, tmp_path):
    c = connect(server.url, server.token)
    sid = c.ask("a session for the CLI", model="scripted").session_id
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "WORKBENCH_", "JUPYTER_"))}
    env.update(WORKBENCH_DB=str(server.db), JUPYTER_RUNTIME_DIR=server.env["JUPYTER_RUNTIME_DIR"])

    def wb(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True,
                              timeout=180, env=env, stdin=subprocess.DEVNULL)

    r = wb("rename", sid, "via", "the", "server")
    assert r.returncode == 0 and "going through its API" in r.stderr and "renamed session" in r.stdout, r.stderr
    assert c.session(sid)["title"] == "via the server"
    assert wb("archive", sid).returncode == 0 and c.session(sid)["archived"] is True
    assert wb("unarchive", sid).returncode == 0 and c.session(sid)["archived"] is False
    r = wb("fork", sid, "--new-id", "cli-fork", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["id"] == "cli-fork", r.stderr
    r = wb("delete", "cli-fork")
    assert r.returncode == 2 and "--yes" in r.stderr and c.session("cli-fork")
    r = wb("delete", "cli-fork", "--yes")
    assert r.returncode == 0 and "deleted session cli-fork" in r.stdout, r.stderr
    r = wb("delete", "cli-fork", "--yes")
    assert r.returncode == 2 and "no session 'cli-fork'" in r.stderr
    r = wb("rename", "nope", "x")
    assert r.returncode == 2 and "no session 'nope'" in r.stderr and "Traceback" not in r.stderr


def test_no_server_gives_one_line_that_says_how_to_fix_it(tmp_path, monkeypatch):
    from wbsrv import free_port

    with pytest.raises(ServerUnavailable) as e:
        connect(f"http://127.0.0.1:{free_port()}", "t")
    assert "jupyter server extension enable workbench" in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("WORKBENCH_URL", raising=False)
    with pytest.raises(ServerUnavailable) as e:
        connect()
    assert "connect(url=..., token=...)" in str(e.value)


def test_the_cli_says_clearly_when_a_process_it_cannot_find_holds_the_database(server, tmp_path):
    # no server file in this runtime dir: the holder cannot be reached (tests/server/test_cli_remote.py: when it can)
    env = {**os.environ, "WORKBENCH_DB": str(server.db), "JUPYTER_RUNTIME_DIR": str(tmp_path)}
    for args in (["sessions"], ["show", "x"], ["run", "hello", "--model", "scripted"]):
        r = subprocess.run([sys.executable, "-m", "workbench.cli", *args], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "in use by another process" in lines[0] and "use its API or stop it first" in lines[0], r.stderr


def test_a_kernel_started_by_the_server_finds_that_server(server):
    import json

    import httpx
    from jupyter_client import BlockingKernelClient

    # a decoy: a second live "server" in the same runtime dir, further up the process tree (this test
    # process started the server): the kernel must pick the nearest one, the server that started it
    decoy = server.home / "runtime" / f"jpserver-{os.getpid()}.json"
    decoy.write_text(json.dumps({"url": "http://127.0.0.1:9/", "token": "decoy", "pid": os.getpid(), "port": 9}))
    r = httpx.post(f"{server.url}/api/kernels", json={"name": "python3"}, headers=server.headers, timeout=60)
    kid = r.json()["id"]
    kc = BlockingKernelClient(connection_file=str(server.home / "runtime" / f"kernel-{kid}.json"))
    try:
        kc.load_connection_file()
        kc.start_channels(hb=False)  # without a manager, an early heartbeat check can report a live kernel dead
        kc.wait_for_ready(timeout=60)  # iopub is connected too, so no output is missed
        out: list[str] = []

        def hook(m: dict) -> None:
            c = m["content"]
            out.append(c.get("text") or (f"{c['ename']}: {c['evalue']}" if m["msg_type"] == "error" else ""))

        reply = kc.execute_interactive("import workbench\nprint(workbench.connect().url)", timeout=60, output_hook=hook)
        assert reply["content"]["status"] == "ok" and "".join(out).strip() == server.url.rstrip("/"), (reply["content"], out)
    finally:
        kc.stop_channels()
        httpx.delete(f"{server.url}/api/kernels/{kid}", headers=server.headers, timeout=60)
        decoy.unlink()


def test_interrupting_an_agent_cell_interrupts_the_turn(server, tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(server.home / "runtime"))
    monkeypatch.delenv("WORKBENCH_URL", raising=False)
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext workbench"),
        nbformat.v4.new_code_cell("%%agent --title stopme\n```python\nimport time\ntime.sleep(300)\n```"),
    ]
    # nbclient interrupts the kernel when the cell runs too long, as the stop button does
    NotebookClient(nb, timeout=15, interrupt_on_timeout=True, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert "interrupted" in text_outputs(nb.cells[1])
    c = WorkbenchClient(server.url, server.token)
    sid = next(s["id"] for s in c.sessions() if s["title"] == "stopme")
    events = c.events(sid)
    assert events[-1]["type"] == "turn_ended" and events[-1]["payload"]["stop_reason"] == "interrupted"
    assert c.session(sid)["running"] is False
