"""How the notebook client and the CLI find running Jupyter servers: the runtime directory's `jpserver-*.json`
files, read without importing the server, each hostile one passed over and none of them removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from workbench.client.api import running_servers


def test_only_the_info_of_a_running_server_is_used_and_nothing_is_removed(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that was ours and is no more
    live = {"url": "http://127.0.0.1:8888/", "token": "t", "pid": os.getpid()}
    files = {
        "jpserver-1.json": json.dumps(live).encode(),
        "jpserver-2.json": json.dumps({**live, "pid": gone.pid}).encode(),  # its server is gone
        "jpserver-3.json": b'{"url": "http://127.0.0.1:1/", "pid": ',  # being written
        "jpserver-4.json": b"\xff\xfe not UTF-8",
        "jpserver-5.json": b"[1, 2]",  # not an object
        "jpserver-6.json": json.dumps({"pid": os.getpid()}).encode(),  # no url
        "jpserver-7.json": json.dumps({**live, "pid": "1"}).encode(),  # a pid that is not a number
        "jpserver-8.json": json.dumps({**live, "pid": True}).encode(),
        "jpserver-9.json": json.dumps({**live, "pid": 2**80}).encode(),
        "jpserver-10.json": json.dumps({**live, "pid": -1}).encode(),  # kill(-1, 0) would ask about every process
        "jpserver-11.json": b"[" * 100_000 + b"]" * 100_000,  # nested past the parser's limit
        "kernel-1.json": json.dumps(live).encode(),  # a kernel's connection file, not a server's
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "jpserver-12.json").mkdir()  # not a file

    assert running_servers(tmp_path) == [live]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*files, "jpserver-12.json"])


def test_no_runtime_directory_is_no_server(tmp_path):
    assert running_servers(tmp_path / "absent") == []
