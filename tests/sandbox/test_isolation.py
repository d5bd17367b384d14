"""From kernel code: no network, no DNS, no host processes, no host secrets, no writes outside the workspace."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from jupyter_core.paths import jupyter_runtime_dir

from workbench.hands.isolating.bubblewrap import SandboxSettings, python_trees
from workbench.log import DuckDBLog

from .conftest import needs_sandbox, run

pytestmark = [needs_sandbox, pytest.mark.asyncio]

NETWORK = """
import json, socket
out = {}
for host, port in [("127.0.0.1", PORT), ("10.0.0.1", 80), ("1.1.1.1", 443), ("169.254.169.254", 80)]:
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect((host, port)); out[f"{host}:{port}"] = "connected"
    except OSError as e:
        out[f"{host}:{port}"] = type(e).__name__
    finally:
        s.close()
try:
    socket.getaddrinfo("example.com", 443); out["dns"] = "resolved"
except socket.gaierror as e:
    out["dns"] = "gaierror"
import os
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
out["procs"] = {p: open(f"/proc/{p}/cmdline", "rb").read().split(b"\\0")[0].decode() for p in pids}
out["uid"] = os.getuid()
out["ifaces"] = [n for _, n in socket.if_nameindex()]
print(json.dumps(out))
"""


async def test_no_network_no_dns_only_own_processes(make_hands, upstream):
    hands, _ = await make_hands()
    out = json.loads(await run(hands, NETWORK.replace("PORT", str(upstream.port))))
    assert all(v != "connected" for k, v in out.items() if ":" in k), out
    assert out["dns"] == "gaierror"
    assert upstream.connections == 0
    assert out["ifaces"] == ["lo"]
    # bwrap's init, the shell exec'd into the kernel, socat (and its fork per connection): nothing of the host
    names = {os.path.basename(c) for c in out["procs"].values()}
    assert names <= {"bwrap", "python", "python3", "python3.11", "socat", "setpriv", "sh"}, out["procs"]
    assert len(out["procs"]) <= 4, out["procs"]
    if os.geteuid() == 0:  # a uid of its own, from the range (identity.py)
        first, count = SandboxSettings().sandbox_uid, SandboxSettings().sandbox_ids
        assert out["uid"] == hands.workspace_owner()[0] and first <= out["uid"] < first + count


async def test_host_files_unreadable_and_writes_confined(make_hands, tmp_path, vault_file):
    db = tmp_path / "sessions.duckdb"
    DuckDBLog(db).close()
    canary = tmp_path / "canary-secret.txt"
    canary.write_text("canary")
    runtime = Path(jupyter_runtime_dir())
    runtime.mkdir(parents=True, exist_ok=True)
    (runtime / "jpserver-1.json").write_text('{"token": "canary"}')
    (runtime / "canary-secret.txt").write_text("canary")
    hands, _ = await make_hands()
    code = textwrap.dedent(f"""
        import json, os
        out = {{}}
        for p in {[str(db), str(canary), str(runtime / "jpserver-1.json"), str(runtime / "canary-secret.txt"), str(vault_file), "/etc/shadow", "/etc/pip.conf", "/root/.bashrc"]!r}:
            try:
                open(p).read(); out[p] = "read"
            except OSError as e:
                out[p] = type(e).__name__
        for d in {[str(tmp_path), str(runtime), "/root"]!r}:
            try:
                out["ls " + d] = os.listdir(d)
            except OSError as e:
                out["ls " + d] = type(e).__name__
        for p in ["/usr/evil", "/etc/evil", "/evil", {str(Path(os.__file__).parent / "evil")!r}, {str(tmp_path / "evil")!r}]:
            try:
                open(p, "w").write("x"); out["write " + p] = "wrote"
            except OSError as e:
                out["write " + p] = type(e).__name__
        open("in-workspace.txt", "w").write("hello")
        open("/tmp/sandbox-tmp-file", "w").write("x")
        print(json.dumps(out))
    """)
    out = json.loads(await run(hands, code))
    assert not [k for k, v in out.items() if v in ("read", "wrote")], out
    assert out["ls " + str(tmp_path)] == "FileNotFoundError" or not {"sessions.duckdb", "canary-secret.txt"} & set(out["ls " + str(tmp_path)])
    assert out["ls " + str(runtime)] == "FileNotFoundError"
    # of /root, at most the way down to the kernel's Python interpreter is there
    needed = {t.relative_to("/root").parts[0] for t in python_trees("") if t.is_relative_to("/root")}
    assert out["ls /root"] == "FileNotFoundError" or set(out["ls /root"]) <= needed
    workspace = Path(hands.config.workdir)
    assert (workspace / "in-workspace.txt").read_text() == "hello"
    assert not Path("/tmp/sandbox-tmp-file").exists()
    for p in ["/usr/evil", "/etc/evil", "/evil", str(tmp_path / "evil")]:
        assert not Path(p).exists()


PROCESSES = """
import concurrent.futures as cf, json, multiprocessing as mp, os, stat
out = {}
with mp.Pool(2) as pool:
    out["pool"] = pool.map(abs, [-1, -2, -3])
q = mp.Queue()
q.put("through a queue")
out["queue"] = q.get(timeout=30)
with cf.ProcessPoolExecutor(2) as ex:
    out["executor"] = list(ex.map(abs, [-4, -5]))
st = os.stat("/dev/shm")
out["shm"] = [oct(stat.S_IMODE(st.st_mode)), os.statvfs("/dev/shm").f_fsid != os.statvfs("/tmp").f_fsid]
print(json.dumps(out))
"""


async def test_multiprocessing_works_with_a_private_dev_shm(make_hands):
    """Pools, queues and process executors need POSIX semaphores, which live in a writable /dev/shm."""
    hands, _ = await make_hands()
    out = json.loads(await run(hands, PROCESSES))
    assert out == {"pool": [1, 2, 3], "queue": "through a queue", "executor": [4, 5], "shm": ["0o1777", True]}
