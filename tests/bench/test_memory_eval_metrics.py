"""The memory evaluation's rules (bench/memory_eval_metrics.py) on small cases, each way round."""

from __future__ import annotations

from bench.memory_eval_metrics import NO_ANSWER, assign, duplicates, match, read_answer

PORT_OLD = {"id": "old", "text": "The staging database listens on port 5432.", "keys": ["5432"]}
PORT_NEW = {"id": "new", "text": "The staging database now listens on port 5433.", "keys": ["5433"]}
OWNER = {"id": "owner", "text": "The billing service owner is Dana Whitfield.", "also": ["Billing belongs to Dana."], "keys": ["dana"]}
SECRET = {"id": "token", "text": "The CI token is ghp_x.", "secret": "ghp_x"}


def proposal(pid: str, text: str, cites=(), targets=()) -> dict:
    return {"id": pid, "title": "Note", "text": text, "targets": list(targets),
            "provenance": [{"session_id": s, "seq": q, "quote": "..."} for s, q in cites]}


def test_a_memory_matches_a_fact_with_its_keys_and_most_of_its_words():
    assert match("Note: the staging database listens on port 5432.", PORT_OLD) == 1.0
    assert match("Note: the staging database listens on port 5433.", PORT_OLD) is None  # the key decides
    assert match("5432 is a number", PORT_OLD) is None  # the key alone is not enough
    assert match("Remember: billing belongs to Dana.", OWNER) == 1.0  # another wording of the fact
    assert match("Dana", OWNER) is None
    assert match("The CI token is ghp_x.", SECRET) is None  # secrets match nothing: they are checked by value


def test_each_proposal_counts_for_the_fact_whose_evidence_it_cites():
    both = "Port 5433 now; it used to be 5432. The staging database listens on that port."
    got = assign([proposal("p", both, cites=[("s2", 3)])], [PORT_OLD, PORT_NEW], {"old": {("s1", 3)}, "new": {("s2", 3)}})
    assert got == {"p": "new"}
    got = assign([proposal("p", both, cites=[("s1", 3)])], [PORT_OLD, PORT_NEW], {"old": {("s1", 3)}, "new": {("s2", 3)}})
    assert got == {"p": "old"}
    assert assign([proposal("p", "I never got round to lunch.")], [PORT_OLD], {}) == {"p": None}


def test_a_duplicate_says_a_fact_again_without_replacing_what_said_it():
    a, b = proposal("a", "x"), proposal("b", "y")
    assert duplicates([a, b], {"a": "owner", "b": "owner"}) == ["b"]
    edit = proposal("b", "y", targets=["a"])
    assert duplicates([a, edit], {"a": "owner", "b": "owner"}) == []  # an edit replaces
    chained = [a, proposal("b", "y", targets=["a"]), proposal("c", "z", targets=["b"])]
    assert duplicates(chained, {"a": "owner", "b": "owner", "c": "owner"}) == []  # through the chain
    assert duplicates([a, b], {"a": "owner", "b": None}) == []


def test_the_reader_answers_only_from_the_memories_in_its_system_prompt():
    system = ("You are an agent.\nThe staging database listens on port 9999.\n\n# Memories\n\nAccepted memories ...\n\n"
              "## Note: the staging database listens on port 5433. (m1a2b3c4d5e, accepted 2026-12-01 by person:x; "
              "from session s)\nRemember: the staging database listens on port 5433.\n(the user, in session \"t\")\n\n"
              "## Preference: polars (m2, accepted 2026-12-01 by person:x)\nAlways use polars.")
    answer = read_answer(system, "Which port does the staging database listen on?")
    assert "5433" in answer and "9999" not in answer
    assert read_answer(system.split("# Memories")[0], "Which port does the staging database listen on?") == NO_ANSWER
    assert read_answer(system, "What is the weather like?") == NO_ANSWER
