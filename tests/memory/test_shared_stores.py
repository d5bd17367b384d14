"""Shared stores (workbench/memory/shared.py): a store several servers mount read-only from the export file its
maintainer publishes. The mirror follows the file; every write there is refused; a bad file keeps the last mirror."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from workbench.brain.models import Reply, ScriptedModel
from workbench.errors import ConfigError, SharedStoreReadOnly
from workbench.memory.dream import create_dream
from workbench.memory.mounts import Mount, session_mounts
from workbench.memory.plugin import MemoryPlugin
from workbench.memory.shared import parse_shared
from workbench.memory.store import MemorySettings
from workbench.memory.transfer import MAX_FILE_BYTES, export_store, import_store
from wbmemory import build_host


@pytest.mark.parametrize("value", ["team", "team=", "Team=/x.json", "team=rel/x.json", "../x=/x.json", "team=/a,team=/b",
                                   "t" * 41 + "=/x.json", "te\x00am=/x.json", "=/x.json",
                                   ",".join(f"s{i}=/s{i}.json" for i in range(8))])
def test_a_bad_shared_stores_setting_is_refused_with_its_reason(value):
    with pytest.raises(ConfigError, match="WORKBENCH_MEMORY_SHARED_STORES"):
        parse_shared(value)


def test_shared_stores_are_mounted_read_only_by_every_session_whatever_its_config_says():
    assert parse_shared(" team=/srv/t.json , ,lab=/srv/l.json")[1].store == "lab"
    assert session_mounts(None, "chat", ["team"]) == (Mount("default"), Mount("team", "read_only"))
    assert session_mounts({"memory": {"stores": ["team", "default"]}}, "chat", ["team"]) == (
        Mount("team", "read_only"), Mount("default"))
    assert session_mounts({"dream": {"store": "x"}}, "dream", ["team"]) == (Mount("x"),)


@pytest.fixture
def lab(tmp_path):
    """(the maintainer's host, a reader's host mirroring store `team` from the maintainer's file, the file)."""
    path = tmp_path / "shared" / "team.json"
    path.parent.mkdir()
    maintainer = build_host(tmp_path / "carol.duckdb", tmp_path)
    reader = build_host(tmp_path / "alice.duckdb", tmp_path, plugins=[MemoryPlugin(settings=MemorySettings(
        shared_stores=f"team={path}", shared_maintainer="carol"))])
    yield maintainer, reader, path
    for h in (maintainer, reader):
        asyncio.run(h.close())


def publish(maintainer, path, by="person:carol", store="team") -> None:
    doc = export_store(maintainer.plugin("memory").store, store, by)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def accepted(store, title, text, name="team"):
    mid = store.create(title=title, text=text, actor="dream:d1", store=name,
                       provenance=[{"session_id": "sess-1", "seq": 4, "quote": "a quote of eight"}])
    return store.review(mid, "accept", "person:carol")


def team(host) -> list[tuple[str, str, str]]:
    return [(m["id"], m["status"], m["text"]) for m in host.plugin("memory").store.list(store="team")]


def test_the_mirror_follows_the_maintainers_file_and_sessions_are_told_it(lab):
    maintainer, reader, path = lab
    mine, theirs = maintainer.plugin("memory").store, reader.plugin("memory").store
    svg = accepted(mine, "Figures as SVG", "Save the lab's figures as SVG files.")
    seed = accepted(mine, "Seeds", "Fix the random seed at 42.")
    publish(maintainer, path)
    reader.plugin("memory").shared.refresh()
    assert sorted(team(reader)) == sorted([(svg["id"], "accepted", svg["text"]), (seed["id"], "accepted", seed["text"])])
    sid = reader.brain.create_session(title="plots", model="scripted")["id"]
    injected = reader.log.events(sid, types=["memories_injected"])[0].payload
    assert {m["id"] for m in injected["memories"]} == {svg["id"], seed["id"]}
    assert {"store": "team", "access": "read_only"} in injected["stores"]
    # the maintainer edits one and retires the other: the next session of the reader sees the file as it is now
    mine.review(svg["id"], "edit", "person:carol", text="Save the lab's figures as SVG, never PNG.")
    mine.review(seed["id"], "retire", "person:carol")
    publish(maintainer, path)
    sid = reader.brain.create_session(title="plots again", model="scripted")["id"]
    injected = reader.log.events(sid, types=["memories_injected"])[0].payload
    assert [m["id"] for m in injected["memories"]] == [svg["id"]]
    assert dict((i, (s, t)) for i, s, t in team(reader)) == {
        svg["id"]: ("accepted", "Save the lab's figures as SVG, never PNG."), seed["id"]: ("retired", seed["text"])}
    assert len(theirs.get(svg["id"])["history"]) == len(mine.get(svg["id"])["history"])


def test_no_write_reaches_a_shared_store_and_each_refusal_says_why(lab):
    maintainer, reader, path = lab
    svg = accepted(maintainer.plugin("memory").store, "Figures as SVG", "Save the lab's figures as SVG files.")
    publish(maintainer, path)
    plugin = reader.plugin("memory")
    plugin.shared.refresh()
    store = plugin.store
    attempts = [lambda: store.review(svg["id"], "retire", "person:alice"),
                lambda: store.review(svg["id"], "edit", "person:alice", text="PNG"),
                lambda: store.create(title="mine", text="mine now", actor="person:alice", provenance=[], store="team"),
                lambda: import_store(store, path.read_bytes(), "person:alice", "team"),
                lambda: create_dream(reader.brain, store, target="team")]
    for attempt in attempts:
        with pytest.raises(SharedStoreReadOnly, match=f"store 'team' is shared: .*{path}.*maintainer carol"):
            attempt()
    # the memory tool of a session: its writes under /memories/team are tool errors, its reads work
    calls = [("memory", {"command": "create", "path": "/memories/team/mine.md", "file_text": "Mine now."}),
             ("memory", {"command": "view", "path": "/memories/team"})]
    reader.brain.model_factory = lambda name: ScriptedModel([Reply(text="", tool_calls=[c]) for c in calls]
                                                            + [Reply(text="done")], name=name)
    sid = reader.brain.create_session(title="notes", model="writer", tools=["memory"])["id"]
    assert asyncio.run(reader.brain.run_turn(sid, "keep notes")) == "end_turn"
    create, view = [e.payload for e in reader.log.events(sid, types=["tool_result"])]
    assert create["is_error"] and "read-only" in create["content"][0]["text"]
    assert not view["is_error"] and "figures-as-svg" in view["content"][0]["text"]
    assert team(reader) == [(svg["id"], "accepted", svg["text"])]


@pytest.mark.parametrize("bad", ["not json", "not utf-8", "another store", "another maintainer", "too big", "gone"])
def test_a_bad_file_keeps_the_last_mirror_and_says_why(lab, bad):
    maintainer, reader, path = lab
    svg = accepted(maintainer.plugin("memory").store, "Figures as SVG", "Save the lab's figures as SVG files.")
    accepted(maintainer.plugin("memory").store, "Other", "Another store's memory.", name="default")
    publish(maintainer, path)
    shared = reader.plugin("memory").shared
    shared.refresh()
    if bad == "not json":
        path.write_text('{"format": "workbench-memory-store", NaN')
    elif bad == "not utf-8":
        path.write_bytes(b"\xff\xfe{}")
    elif bad == "another store":
        publish(maintainer, path, store="default")
    elif bad == "another maintainer":
        publish(maintainer, path, by="person:mallory")
    elif bad == "too big":
        with open(path, "r+b") as f:
            f.truncate(MAX_FILE_BYTES + 10)
    else:
        path.unlink()
    shared.refresh()
    assert team(reader) == [(svg["id"], "accepted", svg["text"])]
    why = shared.problems["team"]
    assert why and len(why.splitlines()) == 1
    assert {"another store": "not 'team'", "another maintainer": "mallory", "gone": "cannot read",
            "too big": "MiB"}.get(bad, "") in why
