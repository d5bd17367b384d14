"""What `scripted:dream` does with what the user said about existing memories: edit, supersede, merge, retire,
leave a repeat out; the pure planning rule first, then real dreams over real sessions (DuckDB, scripted models)."""

from __future__ import annotations

import asyncio

from wbforget import chat, dream, model_factory

from workbench.host import Host
from workbench.memory import MemorySettings
from workbench.memory.dream_statements import parse_memories, plan, statements
from workbench.memory.plugin import MemoryPlugin


def said(text: str, sid: str = "s1", seq: int = 3) -> list:
    return statements(sid, "a session", seq, text)


def memory(mid: str, text: str, status: str = "accepted", label: str = "Note") -> dict:
    return {"id": mid, "status": status, "title": f"{label}: {text[:60]}", "text": f"{text}\n(the user, in session \"x\")"}


PORT = memory("m1", "Remember: the staging database listens on port 5432.")


def test_an_update_edits_the_memory_it_is_about_without_the_old_value():
    [(tool, inp)] = plan(said("Update: the staging database now listens on port 5433 instead of 5432."), [PORT])
    assert tool == "propose_edit" and inp["memory_id"] == "m1"
    assert "5433" in inp["text"] and "5432" not in inp["text"] + inp["title"]  # what replaced it goes in the reason only
    assert "5432" in inp["reason"]
    assert inp["provenance"] == [{"session_id": "s1", "seq": 3, "quote": "Update: the staging database now listens on port "
                                                                          "5433 instead of 5432."}]


def test_the_other_way_round_supersedes_an_accepted_memory_and_edits_a_proposed_one():
    old = memory("m2", "I prefer pandas for quick plots.", label="Preference")
    [(tool, inp)] = plan(said("Never use pandas for quick plots."), [old])
    assert tool == "propose_memory" and inp["supersedes"] == ["m2"]
    [(tool, inp)] = plan(said("Never use pandas for quick plots."), [dict(old, status="proposed")])
    assert tool == "propose_edit" and inp["memory_id"] == "m2"


def test_a_statement_covering_two_memories_merges_them():
    a = memory("ma", "Always use polars for dataframes in this project.", label="Preference")
    b = memory("mb", "I prefer duckdb for SQL queries.", label="Preference")
    [(tool, inp)] = plan(said("Remember: polars for dataframes and duckdb for SQL queries, in every project."), [a, b])
    assert tool == "propose_merge" and inp["memory_ids"] == ["ma", "mb"] and inp["provenance"]


def test_forget_retires_the_memory_it_is_about_and_nothing_else():
    friday = memory("mf", "Deploys are frozen on Fridays: never deploy on a Friday.", label="Preference")
    calls = plan(said("Forget the Friday rule: deploys are no longer frozen."), [PORT, friday])
    assert calls == [("propose_retire", {"memory_id": "mf", "reason": "the user said: Forget the Friday rule: deploys are no "
                                                                       "longer frozen.", "provenance": calls[0][1]["provenance"]})]
    assert plan(said("Forget the Friday rule: deploys are no longer frozen."), [PORT]) == []  # nothing it is about


def test_repeats_and_paraphrases_that_share_a_name_are_left_out():
    owner = memory("mo", "Remember: the billing service owner is Dana Whitfield.")
    assert plan(said("Remember: the billing service owner is Dana Whitfield."), [owner]) == []
    assert plan(said("Remember: billing belongs to Dana."), [owner]) == []


def test_a_paraphrase_in_other_words_is_proposed_again_the_rule_is_lexical():
    owner = memory("mo", "Remember: the billing service owner is Dana Whitfield.")
    [(tool, _)] = plan(said("Remember: the person who runs invoicing is the one to ask."), [owner])
    assert tool == "propose_memory"  # docs/benchmarks.md says so: no shared name, too few shared words


def test_the_same_words_around_other_values_are_another_fact():
    sort_a = memory("ms", "Always keep the 5051c1cc column sorted by b1.", label="Preference")
    [(tool, inp)] = plan(said("Always keep the 0a097c97 column sorted by ab."), [sort_a])
    assert tool == "propose_memory" and "0a097c97" in inp["text"]


def test_within_one_chunk_a_repeat_adds_evidence_and_a_later_update_wins():
    calls = plan(said("Remember: the eval set lives in /data/eval/v1.", "a", 1)
                 + said("Note: the eval set lives in /data/eval/v1.", "b", 5), [])
    [(tool, inp)] = calls
    assert tool == "propose_memory" and [c["session_id"] for c in inp["provenance"]] == ["a", "b"]
    calls = plan(said("Always set the random seed to 1234 in experiments.", "a", 1)
                 + said("Update: the random seed for experiments is now 4321 instead of 1234.", "b", 2), [])
    [(tool, inp)] = calls
    assert "4321" in inp["text"] and "1234" not in inp["text"]


def test_questions_and_sentences_without_a_marker_are_not_statements():
    assert said("Do we always need to run the full test suite? The build is green today.") == []


def test_memories_are_read_from_a_read_memories_result_and_nothing_else():
    text = ("[m1] (accepted) Note: a\n  tags: x, y\n  first line\n  second\n\n"
            "[m2] (proposed) P\n  tags: \n  t\n\n(3 older memories not shown)")
    assert parse_memories(text) == [{"id": "m1", "status": "accepted", "title": "Note: a", "text": "first line\nsecond"},
                                    {"id": "m2", "status": "proposed", "title": "P", "text": "t"}]
    for junk in ("", "interrupted; state unknown", "no memories match", "[", "[x] y"):
        assert parse_memories(junk) == []


# -- real dreams ----------------------------------------------------------------------------------------------


def accept_all(store) -> None:
    for m in store.list(status="proposed"):
        store.review(m["id"], "accept", "person:ann")


def test_real_dreams_edit_supersede_merge_and_retire_what_later_sessions_change(db_path):
    # oldest first: a chunk gives the dream its sessions in the order they were said, so the later statement wins
    plugin = MemoryPlugin(settings=MemorySettings(dream_order="oldest"))
    host = Host.build(db_path, hands=False, plugins=[plugin], model_factory=model_factory)
    store = host.plugin("memory").store
    try:
        first = [chat(host, "capture", t) for t in (
            "Remember: the staging database listens on port 5432.",
            "I prefer pandas for quick plots. Deploys are frozen on Fridays: never deploy on a Friday.",
            "Always use polars for dataframes in this project. I prefer duckdb for SQL queries.")]
        _, result = dream(host, first)
        assert len(result["proposed"]) == 5
        accept_all(store)
        before = {m["title"]: m["id"] for m in store.list(status="accepted")}
        later = [chat(host, "capture", t) for t in (
            "Update: the staging database now listens on port 5433 instead of 5432.",
            "Never use pandas for quick plots. Forget the Friday rule: deploys are no longer frozen.",
            "Remember: polars for dataframes and duckdb for SQL queries, in every project.",
            "Remember: the staging database listens on port 5433.")]  # said again in the same chunk as its update
        dream_id, result = dream(host, later)
        proposals = store.list(dream=dream_id)
        made = {m["proposal"]: m for m in proposals}
        assert len(proposals) == len(result["proposed"]) == 4  # the port said again after its update: evidence, not a memory
        assert len(made["edit"]["provenance"]) == 2
        assert sorted(made) == ["create", "edit", "merge", "retire"], [(m["proposal"], m["title"]) for m in made.values()]
        assert made["edit"]["targets"] == [before["Note: The staging database listens on port 5432."]]
        assert made["create"]["targets"] == [before["Preference: I prefer pandas for quick plots."]]
        assert made["retire"]["targets"] == [before["Preference: Deploys are frozen on Fridays: never deploy on a Friday."]]
        assert sorted(made["merge"]["targets"]) == sorted([before["Preference: Always use polars for dataframes in this project."],
                                                            before["Preference: I prefer duckdb for SQL queries."]])
        accept_all(store)
        now = store.list(status="accepted")
        assert len(now) == 3, [m["title"] for m in now]
        text, _, _, _ = store.injection("staging database port, pandas plots, Friday deploys")
        assert "5433" in text and "5432" not in text and "Friday" not in text and "I prefer pandas" not in text
        assert "polars for dataframes and duckdb" in text
    finally:
        asyncio.run(host.close())


# -- the script takes any tool result --------------------------------------------------------------------------


def request(*exchanges) -> dict:
    """A dream's request: the chunk's message, then (tool name, input, result content, is_error) exchanges, one step each."""
    msgs = [{"role": "user", "content": "Dream.\n- read_events {\"session_id\": \"s1\", \"after\": 0, \"until\": 9}"}]
    for i, (name, inp, content, err) in enumerate(exchanges):
        msgs.append({"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": name, "input": inp}]})
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": content,
                                                  "is_error": err}]})
    return {"messages": msgs}


EVENTS = ('== session s1 "a session": events #1..#3 of 3 ==\n#1 session_created\n  title: a session\n'
          "#2 user_message\n  Update: the staging database now listens on port 5433 instead of 5432.\n#3 assistant_turn\n  ok")


def test_the_script_proposes_from_what_it_read_whatever_shape_the_memories_came_in():
    from workbench.memory.dream_script import dream_script

    known = ("[m1] (accepted) Note: The staging database listens on port 5432.\n  tags: \n"
             "  Remember: the staging database listens on port 5432.")
    for memories, err in ((known, False), ([{"type": "text", "text": known}], False), (None, False), ("interrupted; state unknown", True),
                          ([{"type": "image", "source": {}}], False)):
        reply = dream_script(request(("read_memories", {}, memories, err), ("read_events", {"session_id": "s1"}, EVENTS, False)))
        [(tool, inp)] = reply.tool_calls
        if memories in (known, [{"type": "text", "text": known}]):
            assert tool == "propose_edit" and inp["memory_id"] == "m1"
        else:  # the memories could not be read: the update is a new memory, never a crash
            assert tool == "propose_memory" and "5433" in inp["text"]


def test_the_script_ends_its_turn_after_proposing_whatever_the_tools_answered():
    from workbench.memory.dream_script import dream_script

    read = (("read_memories", {}, "no memories match", False), ("read_events", {"session_id": "s1"}, EVENTS, False))
    for content, err in (("staged m1 (edit of m0): it is proposed for review when this chunk ends\nit contradicts memory m9 "
                          "(accepted) 'x': y", False), ("not proposed:\n- memory m0 is retired", True), (None, True),
                         ([{"type": "image"}], False), ("x" * 100_000, False), ("", True)):
        reply = dream_script(request(*read, ("propose_edit", {"memory_id": "m0"}, content, err)))
        assert reply.tool_calls == [] and reply.text.startswith("Dream done:"), reply.text
    flagged = dream_script(request(*read, ("propose_memory", {"title": "t"}, "staged m1 (new memory)\nit contradicts memory m9", False)))
    assert "- t: proposed (contradicts m9: for the reviewer)" in flagged.text
