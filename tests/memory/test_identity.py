"""Who reviews is who is authenticated (issue 15): the REST routes against a real in-process Jupyter server,
the CLI as a subprocess. No request body, no command-line flag, names the actor."""

from __future__ import annotations

import asyncio
import getpass
import json
import subprocess
import sys
from pathlib import Path

import pytest
from wbforget import TOKEN, call, chat, copies, make_host


@pytest.fixture
def memories(db_path) -> dict[str, str]:
    """Before the server opens db_path: an accepted memory holding a token, two proposals, a session that saw it."""
    host = make_host(db_path)
    store = host.plugin("memory").store
    try:
        ids = {
            "secret": store.create(title=f"Token {TOKEN[:30]}", text=f"Deploy with {TOKEN}.", actor="person:ann",
                                   provenance=[], status="accepted"),
            "a": store.create(title="Ratios", text="Print ratios with two decimals.", actor="dream:d1", provenance=[]),
            "b": store.create(title="Queries", text="Prefer duckdb for queries.", actor="dream:d1", provenance=[]),
        }
        ids["session"] = chat(host, "capture", "hello")
    finally:
        asyncio.run(host.close())
    return ids


@pytest.mark.parametrize("claimed", ["person:mallory", "dream:nonexistent", "auto-accept", "api", "", None])
async def test_a_review_cannot_name_its_actor(memories, jp_fetch, claimed):
    before = (await call(jp_fetch, "GET", "memories", memories["a"]))[1]
    code, err = await call(jp_fetch, "PATCH", "memories", memories["a"], body={"action": "accept", "actor": claimed})
    assert code == 400 and "authenticated user" in err["error"]
    assert (await call(jp_fetch, "GET", "memories", memories["a"]))[1] == before  # nothing written
    code, m = await call(jp_fetch, "PATCH", "memories", memories["a"], body={"action": "accept"})
    assert code == 200 and m["status"] == "accepted"
    actor = m["history"][-1]["actor"]
    # the identity provider's user: with a bare token, the anonymous user Jupyter makes for the request
    assert actor.startswith("person:") and len(actor) > len("person:") and actor not in (claimed, f"person:{claimed}")


async def test_a_person_writing_a_secret_gets_a_400_and_can_confirm(memories, jp_fetch):
    before = (await call(jp_fetch, "GET", "memories", memories["b"]))[1]
    for body in ({"action": "edit", "text": f"Use {TOKEN} for queries."},
                 {"action": "accept", "title": f"key {TOKEN}"},
                 {"action": "merge", "with": [memories["a"]], "text": f"Both, with {TOKEN}."}):
        code, err = await call(jp_fetch, "PATCH", "memories", memories["b"], body=body)
        assert code == 400 and "looks like a secret (GitHub Token" in err["error"] and "allow_secret" in err["error"], err
        assert TOKEN not in err["error"]
    assert (await call(jp_fetch, "GET", "memories", memories["b"]))[1] == before
    code, err = await call(jp_fetch, "PATCH", "memories", memories["b"], body={"action": "edit", "text": "x", "allow_secret": "yes"})
    assert code == 400
    code, m = await call(jp_fetch, "PATCH", "memories", memories["b"],
                         body={"action": "edit", "text": f"Use {TOKEN} for queries.", "allow_secret": True})
    assert code == 200 and TOKEN in m["text"]


async def test_redaction_through_the_server_leaves_no_copy_in_the_file(memories, jp_fetch, db_path):
    code, events = await call(jp_fetch, "GET", "sessions", memories["session"], "events")
    assert TOKEN in events["events"][0]["payload"]["system"]
    code, m = await call(jp_fetch, "PATCH", "memories", memories["secret"],
                         body={"action": "redact", "reason": "leaked", "actor": "person:mallory"})
    assert code == 400
    code, m = await call(jp_fetch, "PATCH", "memories", memories["secret"], body={"action": "redact", "reason": "leaked"})
    assert code == 200 and m["status"] == "redacted" and m["title"] == "[redacted]"
    assert m["redactions"][0]["actor"] == m["history"][-1]["actor"] != "person:mallory"
    code, events = await call(jp_fetch, "GET", "sessions", memories["session"], "events")
    assert TOKEN not in json.dumps(events) and events["events"][-1]["type"] == "redacted"
    code, s = await call(jp_fetch, "POST", "sessions", body={"model": "scripted"})
    code, events = await call(jp_fetch, "GET", "sessions", s["id"], "events")
    assert TOKEN not in json.dumps(events) and "memories_injected" not in [e["type"] for e in events["events"]]
    assert copies(Path(db_path), TOKEN) == 0 and copies(Path(db_path), TOKEN[:30]) == 0


def wb(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True, timeout=300)


def test_the_cli_reviews_as_the_os_user_and_changes_titles(memories, db_path):
    db = ["--db", str(db_path)]
    r = wb("memory", memories["a"], "--action", "accept", "--actor", "dream:nonexistent", *db)
    assert r.returncode == 2 and "unrecognized arguments: --actor" in r.stderr
    r = wb("memory", memories["a"], "--action", "edit", "--title", "Two decimals for ratios", "--json", *db)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    assert m["title"] == "Two decimals for ratios" and m["text"] == "Print ratios with two decimals."
    assert m["history"][-1] == dict(m["history"][-1], action="edit", actor=f"person:{getpass.getuser()}")
    r = wb("memory", memories["a"], "--action", "edit", "--text", f"Ratios, then {TOKEN}", *db)
    assert r.returncode == 2 and "looks like a secret" in r.stderr and "--allow-secret" in r.stderr and TOKEN not in r.stderr
    r = wb("memory", memories["a"], "--title", "No action", *db)
    assert r.returncode == 2 and "--title cannot go with no --action" in r.stderr
    r = wb("memory", memories["a"], "--action", "reject", "--text", "x", *db)
    assert r.returncode == 2 and "--text cannot go with --action reject" in r.stderr
    r = wb("memory", memories["secret"], "--action", "redact", "--note", "leaked", "--title", "A token (removed)", "--json", *db)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    assert m["title"] == "A token (removed)" and m["status"] == "redacted" and TOKEN[:20] not in r.stdout
    assert copies(Path(db_path), TOKEN) == 0 and copies(Path(db_path), TOKEN[:30]) == 0
