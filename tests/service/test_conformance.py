"""One conformance suite for the service's two transports: the same operations, in-process over a Host and
over the REST API of a real Jupyter server, give the same results and the same errors (status and words).

Each scenario runs whole on each transport, on databases of their own, and the two records are compared;
a few absolute checks make sure the scenario did what it says (two empty records would agree too).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import pytest

from workbench.errors import RequestRefused, WorkbenchError
from workbench.service import Message

pytestmark = pytest.mark.timeout(600)

ROW_KEYS = ("id", "title", "model", "kind", "state", "events", "last_seq", "last_type", "archived", "running", "parent_id")


def row_of(row: dict[str, Any]) -> dict[str, Any]:
    """What of a session's row does not depend on when it was written."""
    return {k: row.get(k) for k in ROW_KEYS}


async def refusal(call: Awaitable[Any]) -> tuple[int, str, str]:
    """(HTTP status, words, the local error's class) of a refused call: a RequestRefused over REST stands for the
    in-process transport's error."""
    try:
        await call
    except RequestRefused as e:
        local = e.as_local()
        return e.status, e.message, type(local).__name__
    except WorkbenchError as e:
        return e.http_status, str(e), type(e).__name__
    raise AssertionError("the call was not refused")


def comparable(record: dict[str, Any]) -> dict[str, Any]:
    """A record with each refusal as its status and words (the error classes of the two transports may differ:
    over REST, the class the status stands for; in-process, a subclass of it)."""
    return {k: v[:2] if isinstance(v, tuple) and len(v) == 3 and isinstance(v[0], int) else v for k, v in record.items()}


def heard_text(heard: list[Message]) -> str:
    return "".join((m.data or {}).get("delta", {}).get("text", "") for m in heard if m.kind == "delta")


async def sessions_scenario(wb: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    heard: list[Message] = []
    out["created"] = row_of(await wb.create_session(id="s1", title="first", model="scripted"))
    out["stop"] = await wb.run_turn("s1", "hello there", heard.append)
    out["heard"] = [m.event.type for m in heard if m.kind == "event"]
    out["said"] = heard_text(heard)
    out["row"] = row_of(await wb.session("s1"))

    untitled = await wb.create_session(model="scripted", first_message="name me after this")
    seq = await wb.send(untitled["id"], "name me after this")
    async with wb.stream(untitled["id"], after=0, timeout=120) as messages:
        streamed = []
        async for m in messages:
            if m.kind == "event":
                streamed.append((m.event.seq, m.event.type))
                if m.event.type == "turn_ended":
                    break
    out["streamed"] = streamed
    out["sent_seq"] = seq
    out["untitled"] = {k: v for k, v in row_of(await wb.session(untitled["id"])).items() if k != "id"}

    out["events"] = [(e.seq, e.type) for e in await wb.events("s1")]
    out["events_page"] = [e.seq for e in await wb.events("s1", after=2, limit=2)]
    out["listed"] = sorted(r["title"] for r in (await wb.sessions())["sessions"])
    page = await wb.sessions(limit=1, order="-created")
    out["first_page"] = [r["title"] for r in page["sessions"]]
    out["second_page"] = [r["title"] for r in (await wb.sessions(limit=1, order="-created", cursor=page["next"]))["sessions"]]
    nb = await wb.notebook("s1")
    out["notebook"] = (nb["nbformat"], len(nb["cells"]))
    usage = await wb.usage("s1")
    out["usage"] = (usage["session_id"], usage["total"]["calls"], usage["priced"])
    out["renamed"] = row_of(await wb.rename("s1", "Quarterly ✓"))
    out["archived"] = (await wb.archive("s1"))["archived"]
    out["hidden"] = [r["title"] for r in (await wb.sessions(archived=False))["sessions"]]
    out["unarchived"] = (await wb.archive("s1", False))["archived"]
    hits = (await wb.search("QUARTERLY"))["hits"]
    out["search"] = [(h["id"], h["seq"], h["type"]) for h in hits]
    out["search_said"] = [(h["id"], h["type"]) for h in (await wb.search("hello there"))["hits"]]
    out["fork"] = row_of(await wb.fork("s1", 1, new_id="f1", title="from the start"))
    out["forked_from"] = (await wb.events("f1"))[0].payload["forked_from"]
    out["deleted"] = await wb.delete("f1")
    models = await wb.models()
    out["models"] = (models["default"], [m["name"] for m in models["models"]])
    out["event_count"] = len(await wb.events("s1"))
    out["query"] = await wb.query("SELECT count(*) AS n FROM events WHERE session_id = ?", ["s1"])
    out["interrupt"] = await wb.interrupt("s1")
    out["resume"] = await wb.resume("s1")
    out["resume_turn"] = await wb.resume_turn("s1", heard.append)
    out["hands"] = (await wb.hands("s1"))["state"]
    status = await wb.status()
    out["status"] = (status["default_model"], status["plugins"], status["sandbox"]["sandbox"]["mode"])
    return out


async def errors_scenario(wb: Any) -> dict[str, Any]:
    await wb.create_session(id="e1", model="scripted")
    return {
        "no session": await refusal(wb.session("nope")),
        "no events": await refusal(wb.events("nope")),
        "rename nobody": await refusal(wb.rename("nope", "x")),
        "delete nobody": await refusal(wb.delete("nope")),
        "fork nobody": await refusal(wb.fork("nope")),
        "usage nobody": await refusal(wb.usage("nope")),
        "resume nobody": await refusal(wb.resume_turn("nope", lambda m: None)),
        "unknown model": await refusal(wb.create_session(model="gpt-17")),
        "unknown tool": await refusal(wb.create_session(model="scripted", tools=["python", "no_such_tool"])),
        "tool twice": await refusal(wb.create_session(model="scripted", tools=["python", "python"])),
        "unknown config": await refusal(wb.create_session(model="scripted", config={"nope": 1})),
        "bad config": await refusal(wb.create_session(model="scripted", config={"thinking": "sometimes"})),
        "exists": await refusal(wb.create_session(id="e1", model="scripted")),
        "bad cursor": await refusal(wb.sessions(limit=1, cursor="garbage")),
        "bad fork seq": await refusal(wb.fork("e1", 99, new_id="f2")),
        "bad sql": await refusal(wb.query("DELETE FROM events")),
        "no file": await refusal(wb.read_file("e1", "nothing.txt")),
        "no part": await refusal(_part(wb, "no-such-plugin")),
        # last: the message starts a turn in e1
        "sent once": await wb.send("e1", "once", key="k-1") == await wb.send("e1", "once", key="k-1"),
        "key reused": await refusal(wb.send("e1", "another", key="k-1")),
    }


async def _part(wb: Any, name: str) -> None:
    wb.part(name, object)


async def test_sessions_and_turns_are_the_same_over_both_transports(both):
    local, rest = both
    here, there = await sessions_scenario(local), await sessions_scenario(rest)
    assert here == there
    assert here["stop"] == "end_turn" and "You said: hello there" in here["said"]
    assert here["heard"][0] == "user_message" and here["heard"][-1] == "turn_ended"
    assert here["row"]["state"] == "ended" and here["row"]["running"] is False and here["row"]["title"] == "first"
    assert here["untitled"]["title"] == "name me after this" and here["streamed"][-1][1] == "turn_ended"
    assert (here["sent_seq"], "user_message") in here["streamed"]
    assert [s for s, _ in here["streamed"]] == list(range(1, len(here["streamed"]) + 1))
    assert here["events_page"] == [3, 4] and here["listed"] == ["first", "name me after this"]
    assert here["first_page"] == ["name me after this"] and here["second_page"] == ["first"]
    assert here["renamed"]["title"] == "Quarterly ✓" and here["archived"] is True and here["hidden"] == ["name me after this"]
    assert here["search"] == [("s1", 0, None)] and ("s1", "user_message") in here["search_said"]
    assert here["fork"]["events"] == 1 and here["forked_from"] == {"session_id": "s1", "seq": 1}
    assert here["deleted"] == {"deleted": "f1", "events": 1}
    assert here["query"]["rows"] == [[here["event_count"]]] and here["query"]["columns"] == ["n"]
    assert (here["interrupt"], here["resume"], here["resume_turn"]) == (False, False, None)
    assert here["hands"] == "not started" and here["models"][0] == "scripted"


async def test_errors_are_the_same_over_both_transports(both):
    local, rest = both
    here, there = await errors_scenario(local), await errors_scenario(rest)
    # the REST transport's refusal stands for the same error: the same status and words; a few in-process errors
    # are subclasses of what the server's status says (an unknown model is a ModelError, a 400 as any ConfigError)
    assert comparable(here) == comparable(there)
    assert here["no session"] == (404, "no session 'nope'", "UnknownSession") == there["no session"]
    assert here["exists"][0] == 409 and there["exists"][2] == "SessionExists"
    assert here["unknown model"][0] == 400 and "gpt-17" in here["unknown model"][1]
    assert here["no part"][0] == 400 and "not loaded" in here["no part"][1]
    assert here["sent once"] is True and here["key reused"][0] == 422 and there["key reused"][2] == "KeyReused"


async def hands_scenario(wb: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    await wb.create_session(id="h1", model="scripted")
    heard: list[Message] = []
    out["stop"] = await wb.run_turn("h1", "```python\nopen('made.txt', 'w').write('42')\nprint(6 * 7)\n```", heard.append)
    out["heard"] = [m.event.type for m in heard if m.kind == "event"]
    out["said"] = "42" in heard_text(heard)
    out["hands"] = {k: v for k, v in (await wb.hands("h1")).items() if k in ("state", "generation", "running", "session_id")}
    out["attached"] = {k: v for k, v in (await wb.put_file("h1", "data/in.csv", b"a,b\n1,2\n", name="in.csv",
                                                                 kind="file")).items()}
    listing = await wb.files("h1")
    out["files"] = ([(f["path"], f["type"], f["bytes"]) for f in listing["files"]], listing["truncated"], listing["workspace"])
    out["read"] = await wb.read_file("h1", "made.txt")
    out["too big"] = await refusal(wb.read_file("h1", "data/in.csv", max_bytes=3))
    out["bad path"] = await refusal(wb.put_file("h1", "../escape.txt", b"x"))
    out["restarted"] = (await wb.restart_hands("h1"))["generation"]
    closed = await wb.close_hands("h1")
    out["closed"] = (closed["closed"], closed["state"])
    out["closed again"] = (await wb.close_hands("h1"))["closed"]
    return out


async def test_hands_and_workspace_files_are_the_same_over_both_transports(both):
    local, rest = both
    here, there = await hands_scenario(local), await hands_scenario(rest)
    assert comparable(here) == comparable(there)
    assert here["stop"] == "end_turn" and "tool_result" in here["heard"] and here["said"]
    assert here["hands"]["state"] == "idle" and here["hands"]["running"] is False
    assert here["attached"]["path"] == "data/in.csv" and here["attached"]["bytes"] == 8 and here["attached"]["seq"] > 0
    assert ("made.txt", "file", 2) in here["files"][0] and here["files"][2] is True
    assert here["read"] == b"42" and here["too big"][0] == 413 and here["bad path"][0] == 400
    assert here["closed"][0] is True and here["closed again"] is False


FIX = [{"kind": "cells", "path": "work/analysis.ipynb", "cells": [{
    "index": 1, "id": "c2", "cell_type": "code", "source": "<script>alert(1)</script>\n1/0",
    "outputs": [{"type": "error", "ename": "ZeroDivisionError", "evalue": "division by zero",
                 "traceback": ["\x1b[0;31mZeroDivisionError\x1b[0m: division by zero"]}]}]}]


async def attachments_scenario(wb: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    await wb.create_session(id="a1", model="scripted")
    bad = {
        "not a list": "cells",
        "non-string source": [{**FIX[0], "cells": [{**FIX[0]["cells"][0], "source": 42}]}],
        "nested": [{**FIX[0], "cells": [{**FIX[0]["cells"][0], "outputs": [{"type": "note", "text": {"a": [[["b"]]]}}]}]}],
        "too many": FIX * 9,
        "oversized": [{**FIX[0], "cells": [{**FIX[0]["cells"][0], "source": "x" * 150_000}] * 7}],
        "unknown field": [{**FIX[0], "html": "<b>"}],
    }
    for name, value in bad.items():
        out[name] = await refusal(wb.send("a1", "look", attachments=value))
    out["written after refusals"] = len(await wb.events("a1"))
    heard: list[Message] = []
    out["stop"] = await wb.run_turn("a1", "Fix this error", heard.append, attachments=FIX)
    # over REST the message carries an idempotency key of the transport's own
    out["stored"] = [{k: v for k, v in e.payload.items() if k != "idempotency_key"}
                     for e in await wb.events("a1") if e.type == "user_message"]
    return out


async def test_attachments_are_the_same_over_both_transports(both):
    local, rest = both
    here, there = await attachments_scenario(local), await attachments_scenario(rest)
    assert comparable(here) == comparable(there)
    assert here["written after refusals"] == 1  # session_created: a refused message writes nothing
    for name in ("not a list", "non-string source", "nested", "too many", "oversized", "unknown field"):
        assert here[name][0] == 400, (name, here[name])
    assert "attachments[0].cells[0].source" in here["non-string source"][1]
    assert "at most 1,000,000" in here["oversized"][1]
    [stored] = here["stored"]
    assert stored["text"] == "Fix this error" and stored["attachments"][0]["cells"][0]["outputs"][0]["traceback"] == [
        "ZeroDivisionError: division by zero"]
