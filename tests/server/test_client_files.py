"""Data between a notebook and the agent, against a real `jupyter server` subprocess: `%%agent --with`
in a notebook run by nbclient, and wb.attach / files / get / load with their refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import numpy as np
import pandas as pd
import pytest
from nbclient import NotebookClient
from wbsrv import ServerProcess

from workbench.client import connect
from workbench.client.data import loads, pack_value
from workbench.errors import RequestRefused, WorkbenchError


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("files")
    s = ServerProcess(home / "home", home / "wb.duckdb",
                      env={"WORKBENCH_MODEL": "scripted", "ANTHROPIC_API_KEY": "", "WORKBENCH_FILES_MAX_UPLOAD_MB": "1"})
    try:
        yield s.start()
    finally:
        s.stop()


def test_agent_with_copies_a_dataframe_and_a_file_and_the_agents_code_reads_them(server, tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(server.home / "runtime"))
    monkeypatch.delenv("WORKBENCH_URL", raising=False)
    (tmp_path / "sales.csv").write_text("region,total\nnorth,5\nsouth,7\n")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext workbench\nimport pandas as pd\n"
                                  "df = pd.DataFrame({'region': ['north', 'south', 'north'], 'amount': [1.5, 2.0, 4.0]})"),
        nbformat.v4.new_code_cell(
            "%%agent --with df,sales.csv\n```python\nimport pandas as pd\nd = pd.read_parquet('df.parquet')\n"
            "s = pd.read_csv('sales.csv')\nprint('SUM', d.amount.sum(), s.total.sum())\n"
            "d.groupby('region').amount.sum().to_frame().to_parquet('by_region.parquet')\n```"),
        nbformat.v4.new_code_cell(
            "import workbench\nwb = workbench.connect()\n"
            "back = wb.load('by_region.parquet')\nprint('BACK', back.amount.to_dict())\n"
            "print('FILES', sorted(f['path'] for f in wb.files()))\nprint('RAW', wb.get(wb.session_id, 'sales.csv')[:6])"),
        nbformat.v4.new_code_cell("%agent --with no_such_thing"),
    ]
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    out = ["".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in c.outputs) for c in nb.cells]
    assert "agent: attached df as df.parquet" in out[1] and "agent: attached sales.csv as sales.csv" in out[1]
    assert "SUM 7.5 12" in out[1]
    assert "BACK {'north': 5.5, 'south': 2.0}" in out[2]
    assert "'by_region.parquet', 'df.parquet', 'sales.csv'" in out[2] and "RAW b'region'" in out[2]
    assert "agent: 'no_such_thing' is neither a variable of this notebook nor a file" in out[3]
    c = connect(server.url, server.token)
    sid = next(s["id"] for s in c.sessions() if s["title"].startswith("```python"))
    events = c.events(sid)
    attached = [e["payload"] for e in events if e["type"] == "file_attached"]
    assert [(a["name"], a["path"], a["kind"]) for a in attached] == [("df", "df.parquet", "dataframe"),
                                                                      ("sales.csv", "sales.csv", "file")]
    # the agent was told, before the person's text, what is where
    text = next(e["payload"]["text"] for e in events if e["type"] == "user_message")
    assert text.startswith("[Files attached to your workspace") and "pd.read_parquet('df.parquet')" in text
    assert text.index("sales.csv") < text.index("```python")


def test_client_refusals_are_clear(server, tmp_path):
    c = connect(server.url, server.token)
    sid = c.create_session(title="refusals", model="scripted")["id"]
    with pytest.raises(RequestRefused) as e:
        c.put_file(sid, "big.bin", b"\0" * ((1 << 20) + 10))
    assert e.value.status == 413 and "max_upload_mb" in str(e.value) and "nothing was written" in str(e.value)
    assert c.files(sid) == []
    with pytest.raises(RequestRefused) as e:
        c.put_file(sid, "../x", b"x")
    assert e.value.status == 400 and "not inside the workspace" in str(e.value)
    with pytest.raises(RequestRefused) as e:
        c.put_file("no-such-session", "x", b"x")
    assert e.value.status == 404
    c.put_file(sid, "obj.pkl", pack_value("obj", {1, 2, 3}).stream.read(), kind="pickle")
    with pytest.raises(WorkbenchError, match="allow_pickle=True"):
        c.load(sid, "obj.pkl")
    assert c.load(sid, "obj.pkl", allow_pickle=True) == {1, 2, 3}
    c.put_file(sid, "notes.txt", "héllo".encode())
    with pytest.raises(RequestRefused) as e:
        c.get(sid, "notes.txt", max_bytes=3)
    assert e.value.status == 413
    assert c.load(sid, "notes.txt") == "héllo"
    with pytest.raises(RequestRefused) as e:
        c.get(sid, "nothing-here.txt")
    assert e.value.status == 404
    with pytest.raises(RequestRefused) as e:
        c.attach(sid, "not_a_var", namespace={})
    assert e.value.status == 400
    with pytest.raises(RequestRefused) as e:
        c.attach(sid, "small", "huge", namespace={"small": [1, 2], "huge": b"\0" * ((1 << 20) + 1)})
    assert e.value.status == 413 and "cannot attach 'huge' as 'huge.bin'" in str(e.value)
    assert "attached before it: small.json" in str(e.value)


WITHOUT_PYARROW = """
import sys
sys.modules["pyarrow"] = None  # a Python without pyarrow: its import fails, for pandas too
import pandas as pd
from workbench.client.data import pack_value
p = pack_value("frame", pd.DataFrame({"a": [1, 2]}))
print(p.path, p.kind)
print(p.warning)
"""


def test_a_dataframe_sent_as_a_pickle_says_why():
    """Without pyarrow (or with columns it cannot store) a DataFrame still goes, as a pickle, and the person is told."""
    mixed = pack_value("mixed", pd.DataFrame({"m": [1, "two"]}))
    assert mixed.path == "mixed.pkl" and "pyarrow cannot store it" in mixed.warning, mixed.warning
    assert pack_value("frame", pd.DataFrame({"a": [1]})).warning == ""
    run = subprocess.run([sys.executable, "-c", WITHOUT_PYARROW], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    where, warning = run.stdout.splitlines()
    assert where == "frame.pkl dataframe"
    assert warning.startswith("sent as a pickle, not Parquet: pyarrow is not installed"), warning


def test_values_are_written_by_type_and_read_back():
    frame = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    cases = {
        "frame": (frame, "frame.parquet", "dataframe"),
        "mixed": (pd.DataFrame({"m": [1, "two"]}), "mixed.pkl", "dataframe"),  # pyarrow cannot store mixed objects
        "arr": (np.arange(6).reshape(2, 3), "arr.npy", "array"),
        "text": ("naïve ✓", "text.txt", "text"),
        "raw": (b"\x00\xff", "raw.bin", "file"),
        "conf": ({"k": [1, 2.5, None, True]}, "conf.json", "json"),
        "nan": ({"k": float("nan")}, "nan.pkl", "pickle"),  # not JSON: a pickle keeps it
        "objs": (np.array([{"a": 1}], dtype=object), "objs.pkl", "pickle"),
    }
    for name, (value, path, kind) in cases.items():
        p = pack_value(name, value)
        assert (p.path, p.kind) == (path, kind), name
        data = p.stream.read()
        assert len(data) == p.bytes
        if path.endswith(".pkl"):
            with pytest.raises(WorkbenchError, match="allow_pickle"):
                loads(path, data)
            continue
        back = loads(path, data)
        if isinstance(value, pd.DataFrame):
            pd.testing.assert_frame_equal(back, value)
        elif isinstance(value, np.ndarray):
            assert (back == value).all()
        else:
            assert back == (value if not isinstance(value, bytes) else value)
    assert json.loads(pack_value("n", None).stream.read()) is None
    assert list(loads("t.csv", b"a,b\n1,2\n").columns) == ["a", "b"]
    assert loads("t.bin", b"\xff") == b"\xff" and loads("t.txt", b"\xff") == b"\xff"


def test_cli_files_get_put_through_the_server(server, tmp_path):
    import subprocess
    import sys

    c = connect(server.url, server.token)
    sid = c.create_session(title="cli files", model="scripted")["id"]
    exe = [sys.executable, "-m", "workbench", ]
    auth = ["--url", server.url, "--token", server.token]

    def wb(*argv: str, cwd=tmp_path) -> subprocess.CompletedProcess:
        return subprocess.run([*exe, *argv], capture_output=True, text=True, cwd=cwd, timeout=120)

    src = tmp_path / "report.md"
    src.write_text("# Q3\nup 4%\n")
    put = wb("put", sid, str(src), "--path", "in/report.md", "--json", *auth)
    assert put.returncode == 0, put.stderr
    rec = json.loads(put.stdout)
    assert rec["path"] == "in/report.md" and rec["bytes"] == 11 and rec["kind"] == "file"
    listed = wb("files", sid, *auth)
    assert listed.returncode == 0 and "in/report.md" in listed.stdout and "in/" in listed.stdout
    out = tmp_path / "back"
    out.mkdir()
    got = wb("get", sid, "in/report.md", *auth, cwd=out)
    assert got.returncode == 0 and (out / "report.md").read_text() == "# Q3\nup 4%\n"
    again = wb("get", sid, "in/report.md", *auth, cwd=out)
    assert again.returncode == 2 and "--force" in again.stderr
    assert wb("get", sid, "in/report.md", "-o", "-", *auth).stdout == "# Q3\nup 4%\n"
    for argv, words in [(("get", sid, "../etc/passwd"), "not inside the workspace"),
                        (("get", sid, "in/report.md", "--max-bytes", "3", "-o", "x"), "max_bytes=3"),
                        (("get", "no-such", "x"), "no session"),
                        (("put", sid, str(tmp_path / "missing.bin")), "cannot read")]:
        r = wb(*argv, *auth)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, (argv, r.stderr)
    big = tmp_path / "big.bin"
    big.write_bytes(b"\0" * ((1 << 20) + 1))
    r = wb("put", sid, str(big), *auth)
    assert r.returncode == 2 and "max_upload_mb" in r.stderr and "nothing was written" in r.stderr
    assert [f["path"] for f in c.files(sid)] == ["in", "in/report.md"]
