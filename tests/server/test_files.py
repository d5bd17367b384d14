"""Files in a session's workspace over REST: upload (recorded as `file_attached`), list, fetch; hostile input."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError
from wbsrv import API, read_until, turn_ended

from workbench.render import result_blocks


@pytest.fixture
def small_workspace(monkeypatch):
    """Sessions' workspaces of 16 MiB (set before the server starts)."""
    monkeypatch.setenv("WORKBENCH_WORKSPACE_MB", "16")


async def upload(wb: Any, sid: str, path: str | bytes, data: bytes, **params: str) -> tuple[int, Any]:
    """POST the raw bytes; (status, decoded JSON)."""
    query = {"path": path, **params}
    try:
        r = await wb.fetch(*API, "sessions", sid, "files", method="POST", body=data, params=query,
                           headers={"Content-Type": "application/octet-stream"}, request_timeout=300)
        return r.code, json.loads(r.body)
    except HTTPClientError as e:
        return e.code, json.loads(e.response.body) if e.response is not None and e.response.body else None


async def fetch(wb: Any, sid: str, path: str) -> tuple[int, bytes, dict[str, str]]:
    try:
        r = await wb.fetch(*API, "sessions", sid, "files", "content", method="GET", params={"path": path})
        return r.code, r.body, dict(r.headers)
    except HTTPClientError as e:
        return e.code, e.response.body if e.response is not None else b"", {}


async def workspace_of(wb: Any, sid: str, serverapp: Any) -> Path:
    """The session's workspace directory on the host, once the agent's code has run there (its cwd, which the
    sandbox shows the kernel as /workspace)."""
    ws = await wb.stream(sid)
    await wb.send(sid, "```python\nimport os; print(os.getcwd())\n```")
    events = await read_until(ws, turn_ended)
    ws.close()
    result = next(e for e in events if e["type"] == "tool_result")
    assert result_blocks(result["payload"])[0]["text"].strip() == "/workspace"
    hands = await serverapp.web_app.settings["workbench_runtime"].brain.hands(sid)
    return Path(await hands.workspace())


async def test_an_upload_before_any_code_lands_in_the_workspace_the_agent_then_reads(wb):
    sid = await wb.session(model="scripted")
    data = b"region,sales\nnorth,10\nsouth,32\n"
    code, rec = await upload(wb, sid, "data/sales.csv", data, name="sales.csv")
    assert code == 201, rec
    assert rec["path"] == "data/sales.csv" and rec["bytes"] == len(data) and rec["kind"] == "file"
    assert rec["sha256"] == hashlib.sha256(data).hexdigest() and rec["name"] == "sales.csv"
    _, page = await wb.call("GET", "sessions", sid, "events", expect=200)
    attached = [e for e in page["events"] if e["type"] == "file_attached"]
    assert [e["payload"] for e in attached] == [{k: v for k, v in rec.items() if k != "seq"}]
    assert attached[0]["seq"] == rec["seq"]
    # the kernel starts later, in the same workspace, and reads the file
    ws = await wb.stream(sid)
    # ... and may change it, and write beside it (the files and directories are the kernel user's)
    await wb.send(sid, "```python\nimport pandas as pd\nprint(pd.read_csv('data/sales.csv').sales.sum())\n"
                       "open('data/sales.csv', 'a').write('east,1\\n'); open('data/more.txt', 'w').write('ok')\n```")
    events = await read_until(ws, turn_ended)
    ws.close()
    result = next(e for e in events if e["type"] == "tool_result")
    assert "42" in result_blocks(result["payload"])[0]["text"] and not result["payload"]["is_error"], result
    _, hands = await wb.call("GET", "sessions", sid, "hands", expect=200)
    assert hands["backend"] in ("sandbox", "local", "unsafe-local"), hands
    _, listing = await wb.call("GET", "sessions", sid, "files", expect=200)
    assert listing["workspace"] is True
    assert {"path": "data/sales.csv", "type": "file", "bytes": len(data) + 7}.items() <= \
        next(f for f in listing["files"] if f["path"] == "data/sales.csv").items()
    code, body, headers = await fetch(wb, sid, "data/sales.csv")
    assert code == 200 and body == data + b"east,1\n"
    assert headers["Content-Type"] == "application/octet-stream" and "attachment" in headers["Content-Disposition"]


async def test_a_file_the_agent_wrote_comes_back_and_a_fresh_session_lists_nothing(wb):
    sid = await wb.session(model="scripted")
    _, listing = await wb.call("GET", "sessions", sid, "files", expect=200)
    assert listing == {"files": [], "truncated": False, "workspace": False}
    code, err, _ = await fetch(wb, sid, "out.json")
    assert code == 404 and b"no workspace yet" in err
    ws = await wb.stream(sid)
    await wb.send(sid, "```python\nimport json\njson.dump({'answer': 42}, open('out.json', 'w'))\n```")
    await read_until(ws, turn_ended)
    ws.close()
    code, body, _ = await fetch(wb, sid, "out.json")
    assert code == 200 and json.loads(body) == {"answer": 42}
    code, err, _ = await fetch(wb, sid, "missing.json")
    assert code == 404 and json.loads(err)["error"]


async def test_hostile_paths_are_refused_and_nothing_escapes_the_workspace(wb, tmp_path, jp_serverapp):
    sid = await wb.session(model="scripted")
    root = await workspace_of(wb, sid, jp_serverapp)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOPSECRET")
    os.symlink(outside, root / "link")  # what the model's code could plant
    os.symlink(outside / "secret.txt", root / "secret-link.txt")
    for path in ["../escape.txt", "/etc/passwd", "a/../../escape.txt", "a\x00b", "", "   ", ".", "./", "x" * 2000,
                 "link/new.txt", "link/secret.txt", "\\evil", "a\nb", "y" * 300]:
        code, err = await upload(wb, sid, path, b"pwned")
        assert code == 400, (path, code, err)
        assert err["error"] and "\n" not in err["error"]
        code, body, _ = await fetch(wb, sid, path)
        assert code in (400, 404), (path, code, body)
        assert b"TOPSECRET" not in body and b"root:" not in body
    # a link at the name itself is replaced by the file, never written through
    code, rec = await upload(wb, sid, "secret-link.txt", b"mine")
    assert code == 201, rec
    assert (outside / "secret.txt").read_text() == "TOPSECRET" and not (root / "secret-link.txt").is_symlink()
    assert (root / "secret-link.txt").read_bytes() == b"mine"
    os.symlink(outside / "secret.txt", root / "again.txt")
    code, body, _ = await fetch(wb, sid, "again.txt")
    assert code == 400 and b"TOPSECRET" not in body
    code, body, _ = await fetch(wb, sid, "link/secret.txt")
    assert code == 400 and b"TOPSECRET" not in body
    # non-UTF-8 in the query: a 400, not a 500
    from tornado.httpclient import AsyncHTTPClient

    base = jp_serverapp.connection_url.rstrip("/") + f"/workbench/api/sessions/{sid}/files"
    auth = {"Authorization": f"token {jp_serverapp.identity_provider.token}"}
    for raw in ("%ff%fe.txt", "a%00b", "%c0%ae%c0%ae/x", "%ED%A0%80", "x&path=y"):
        for method, url, body in (("POST", f"{base}?path={raw}", b"x"), ("GET", f"{base}/content?path={raw}", None)):
            r = await AsyncHTTPClient().fetch(url, method=method, body=body, headers=auth, raise_error=False)
            assert r.code == 400, (raw, method, r.code, r.body)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    _, listing = await wb.call("GET", "sessions", sid, "files", expect=200)
    kinds = {f["path"]: f["type"] for f in listing["files"]}
    assert kinds["link"] == "link" and kinds["again.txt"] == "link"  # listed, never followed
    assert not any(f["path"].startswith("link/") for f in listing["files"])
    assert not any(".wb-upload-" in f["path"] for f in listing["files"])


async def test_an_upload_over_the_limit_is_a_413_and_writes_nothing(wb, jp_serverapp):
    sid = await wb.session(model="scripted")
    runtime = jp_serverapp.web_app.settings["workbench_runtime"]
    runtime.files_settings.max_upload_mb = 1
    try:
        code, err = await upload(wb, sid, "big.bin", b"\0" * ((1 << 20) + 1))
        assert code == 413 and "max_upload_mb" in err["error"] and "nothing was written" in err["error"]
        code, rec = await upload(wb, sid, "fits.bin", b"\1" * (1 << 20))
        assert code == 201 and rec["bytes"] == 1 << 20
    finally:
        runtime.files_settings.max_upload_mb = 256
    _, listing = await wb.call("GET", "sessions", sid, "files", expect=200)
    assert [f["path"] for f in listing["files"]] == ["fits.bin"]
    _, page = await wb.call("GET", "sessions", sid, "events", expect=200)
    assert [e["payload"]["path"] for e in page["events"] if e["type"] == "file_attached"] == ["fits.bin"]
    runtime.files_settings.max_download_mb = 0
    try:
        code, body, _ = await fetch(wb, sid, "fits.bin")
        assert code == 413 and b"max_download_mb" in body
    finally:
        runtime.files_settings.max_download_mb = 256


async def test_unknown_sessions_bad_arguments_and_directories_are_clear_4xx(wb):
    code, err = await upload(wb, "nope", "a.txt", b"x")
    assert code == 404 and "nope" in err["error"]
    code, body, _ = await fetch(wb, "nope", "a.txt")
    assert code == 404
    code, _ = await wb.call("GET", "sessions", "nope", "files")
    assert code == 404
    sid = await wb.session(model="scripted")
    code, err = await upload(wb, sid, "a.txt", b"x", kind="virus")
    assert code == 400 and "kind" in err["error"]
    code, err = await upload(wb, sid, "a.txt", b"x", color="red")
    assert code == 400 and "unknown query argument" in err["error"]
    code, _ = await wb.call("GET", "sessions", sid, "files", params={"path": "x"})
    assert code == 400
    assert (await upload(wb, sid, "d/inner.txt", b"x"))[0] == 201
    code, err = await upload(wb, sid, "d", b"x")
    assert code == 400 and "directory" in err["error"]
    code, err = await upload(wb, sid, "d/inner.txt/deeper", b"x")
    assert code == 400
    code, body, _ = await fetch(wb, sid, "d")
    assert code == 400
    code, _ = await wb.call("GET", "sessions", sid, "files", "content")
    assert code == 400


async def test_concurrent_uploads_each_land_whole(wb):
    sid = await wb.session(model="scripted")
    blobs = {f"f{i}.bin": bytes([i]) * (200_000 + i) for i in range(6)}
    same = [bytes([65 + i]) * 300_000 for i in range(4)]
    results = await asyncio.gather(*[upload(wb, sid, p, d) for p, d in blobs.items()],
                                   *[upload(wb, sid, "same.bin", d) for d in same])
    assert all(code == 201 for code, _ in results), results
    for p, d in blobs.items():
        code, body, _ = await fetch(wb, sid, p)
        assert code == 200 and body == d
    code, body, _ = await fetch(wb, sid, "same.bin")
    assert body in same  # one whole upload, not a mix
    _, page = await wb.call("GET", "sessions", sid, "events", expect=200)
    assert len([e for e in page["events"] if e["type"] == "file_attached"]) == 10


async def test_names_on_disk_that_are_not_utf8_are_listed_readably_and_refused_cleanly(wb, jp_serverapp):
    sid = await wb.session(model="scripted")
    root = await workspace_of(wb, sid, jp_serverapp)
    fd = os.open(os.fsencode(root) + b"/bad\xff\xfe.txt", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"x")
    os.close(fd)
    _, listing = await wb.call("GET", "sessions", sid, "files", expect=200)
    shown = [f["path"] for f in listing["files"]]
    assert "bad\ufffd\ufffd.txt" in shown, shown
    json.dumps(listing, ensure_ascii=False).encode("utf-8")  # valid UTF-8 all through
    code, body, _ = await fetch(wb, sid, "bad\ufffd\ufffd.txt")
    assert code == 404 and json.loads(body)["error"]


async def test_hands_whose_files_are_elsewhere_have_no_workspace_here():
    from workbench.hands.files import NoWorkspace
    from workbench.hands.kernel import KernelHands
    from workbench.hands.launching import GatewayLauncher

    # a gateway's launcher (nothing is asked of the gateway: no kernel starts)
    hands = KernelHands(launcher=GatewayLauncher("http://127.0.0.1:9"))
    assert await hands.workspace() is None
    try:
        await hands.workspace(create=True)
        raise AssertionError("a workspace was made for remote hands")
    except NoWorkspace as e:
        assert e.http_status == 409 and "gateway" in str(e)


async def test_a_full_workspace_refuses_the_file_and_keeps_nothing_of_it(small_workspace, wb, jp_serverapp):
    sid = await wb.session(model="scripted")
    root = await workspace_of(wb, sid, jp_serverapp)
    _, hands = await wb.call("GET", "sessions", sid, "hands", expect=200)
    if "loop-mounted" not in str(hands["limits"].get("workspace")):
        pytest.skip(f"no workspace quota on this machine: {hands['limits'].get('workspace')}")
    code, err = await upload(wb, sid, "huge.bin", b"\1" * (24 << 20))
    assert code == 413 and "no room" in err["error"], (code, err)
    assert not [p for p in os.listdir(root) if p.startswith(".wb-upload-") or p == "huge.bin"]
    assert (await upload(wb, sid, "small.bin", b"ok"))[0] == 201  # room for what fits
    _, page = await wb.call("GET", "sessions", sid, "events", expect=200)
    assert [e["payload"]["path"] for e in page["events"] if e["type"] == "file_attached"] == ["small.bin"]


async def test_unicode_names_empty_files_and_replacing_a_file(wb):
    sid = await wb.session(model="scripted")
    name = "données/été ✓ \"quoted\"; x.csv"
    code, rec = await upload(wb, sid, name, "a,b\n1,2\n".encode())
    assert code == 201 and rec["path"] == name
    code, body, headers = await fetch(wb, sid, name)
    assert code == 200 and body == b"a,b\n1,2\n"
    assert headers["Content-Disposition"].startswith("attachment; filename*=UTF-8''") and '"' not in headers["Content-Disposition"]
    code, rec = await upload(wb, sid, "empty.txt", b"")
    assert code == 201 and rec["bytes"] == 0 and rec["sha256"] == hashlib.sha256(b"").hexdigest()
    code, body, headers = await fetch(wb, sid, "empty.txt")
    # an empty download is still a download (the API handler's finish made it application/json; found by the fuzzer)
    assert code == 200 and body == b"" and headers["Content-Type"] == "application/octet-stream", headers
    assert (await upload(wb, sid, "empty.txt", b"now full"))[0] == 201
    code, body, _ = await fetch(wb, sid, "empty.txt")
    assert body == b"now full"


async def test_an_unauthenticated_upload_is_a_403_and_writes_nothing(wb, jp_serverapp, monkeypatch):
    import tempfile

    from tornado.httpclient import AsyncHTTPClient

    spooled = []
    real = tempfile.SpooledTemporaryFile
    monkeypatch.setattr(tempfile, "SpooledTemporaryFile", lambda *a, **kw: spooled.append(1) or real(*a, **kw))
    sid = await wb.session(model="scripted")
    url = jp_serverapp.connection_url.rstrip("/") + f"/workbench/api/sessions/{sid}/files?path=x.bin"
    for headers in ({}, {"Authorization": "token wrong"}):
        r = await AsyncHTTPClient().fetch(url, method="POST", body=b"\0" * (2 << 20), headers=headers, raise_error=False)
        assert r.code == 403, (r.code, r.body)
    assert spooled == []  # a stranger's body is not even spooled to disk
    _, listing = await wb.call("GET", "sessions", sid, "files", expect=200)
    assert listing["files"] == []
    assert (await upload(wb, sid, "x.bin", b"1"))[0] == 201 and spooled == [1]
