"""The memory evaluation's rules, as pure functions: when a memory matches a gold fact, which proposal
counts for which fact, what is a duplicate, and the scripted reader that answers from its system prompt.

Matching rule (one line for a reviewer): a memory (its title and text) **matches** a gold fact when it
contains every one of the fact's keys (case and whitespace ignored) and at least 60 % of the content
words (words of 2+ characters, English stop words dropped) of the fact's text or of one of its other
wordings (`also`). Secret facts have no keys and match nothing: they are checked by their value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from bm25s.stopwords import STOPWORDS_EN

from workbench.brain.models.scripted import Reply, position

WORD = re.compile(r"\w\w+")
STOP = frozenset(STOPWORDS_EN)
MATCH_SHARE = 0.6
CONTENT_KINDS = ("create", "edit", "merge")  # proposals that state something; a retire proposal only removes


def norm(s: str) -> str:
    """Whitespace collapsed, case folded."""
    return re.sub(r"\s+", " ", s).strip().casefold()


def tokens(s: str) -> set[str]:
    """Content words: 2+ characters, no English stop words, a plural "s" dropped."""
    out = set()
    for w in WORD.findall(s.casefold()):
        if w in STOP:
            continue
        out.add(w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w)
    return out


def match(memory: str, fact: dict[str, Any]) -> float | None:
    """How much of the fact the memory says (0.6 to 1.0), or None when it does not match it."""
    keys = fact.get("keys") or []
    if not keys or not all(norm(k) in norm(memory) for k in keys):
        return None
    have = tokens(memory)
    best = max(len(tokens(w) & have) / max(len(tokens(w)), 1) for w in [fact["text"], *fact.get("also", [])])
    return best if best >= MATCH_SHARE else None


def replaced_by(proposals: list[dict[str, Any]]) -> dict[str, set[str]]:
    """For each proposal, every memory it replaces, directly or through the memories those replaced."""
    direct = {p["id"]: set(p["targets"]) for p in proposals}
    out: dict[str, set[str]] = {}
    for pid in direct:
        seen: set[str] = set()
        todo = list(direct[pid])
        while todo:
            t = todo.pop()
            if t not in seen:
                seen.add(t)
                todo += list(direct.get(t, ()))
        out[pid] = seen
    return out


def assign(proposals: list[dict[str, Any]], facts: list[dict[str, Any]],
           evidence: dict[str, set[tuple[str, int]]]) -> dict[str, str | None]:
    """Each content proposal's gold fact (or None): among the facts it matches, the one whose evidence it
    cites, then the best matched; proposals in the order they were made."""
    out: dict[str, str | None] = {}
    for p in proposals:
        cited = {(c["session_id"], c["seq"]) for c in p["provenance"] if isinstance(c, dict)}
        found = []
        for i, f in enumerate(facts):
            share = match(p["title"] + "\n" + p["text"], f)
            if share is not None:
                found.append((bool(cited & evidence.get(f["id"], set())), share, -i, f["id"]))
        out[p["id"]] = max(found)[3] if found else None
    return out


def duplicates(proposals: list[dict[str, Any]], assigned: dict[str, str | None]) -> list[str]:
    """The proposals that say again what an earlier proposal says (the same gold fact) without replacing it."""
    chain = replaced_by(proposals)
    first: dict[str, list[str]] = {}
    out = []
    for p in proposals:
        fact = assigned.get(p["id"])
        if fact is None:
            continue
        earlier = first.setdefault(fact, [])
        if any(q not in chain[p["id"]] for q in earlier):
            out.append(p["id"])
        earlier.append(p["id"])
    return out


def strings(value: Any) -> Iterable[str]:
    """Every string in a JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


# -- the scripted reader -----------------------------------------------------------------------------

MEMORIES = "# Memories"
NO_ANSWER = "I do not know: nothing in my system prompt says."


def memory_blocks(system: str) -> list[tuple[str, str]]:
    """(title, text) of each memory in a system prompt's `# Memories` section."""
    if MEMORIES not in system:
        return []
    section = system[system.index(MEMORIES):]
    out = []
    for block in section.split("\n## ")[1:]:
        head, _, text = block.partition("\n")
        title = re.sub(r"\s*\(m\w+, .*\)$", "", head.strip())
        out.append((title, text.strip()))
    return out


def read_answer(system: str, question: str) -> str:
    """The answer a reader that knows only its system prompt gives: the memory sharing most content words
    with the question (the first of equals, i.e. the best ranked), or that it does not know."""
    asked = tokens(question)
    best, score = None, 0
    for title, text in memory_blocks(system):
        s = len(asked & tokens(title + " " + text))
        if s > score:
            best, score = (title, text), s
    if best is None:
        return NO_ANSWER
    return f"From memory ({best[0]}): {best[1].splitlines()[0] if best[1] else ''}"


def reader_script(request: dict[str, Any]) -> Reply:
    """`scripted:reader`: answers the turn's question from the system prompt alone."""
    system = request.get("system")
    text = system if isinstance(system, str) else "\n".join(b.get("text", "") for b in system or [] if isinstance(b, dict))
    return Reply(text=read_answer(text, position(request)[2]))
