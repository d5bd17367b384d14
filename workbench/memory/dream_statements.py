"""What `scripted:dream` makes of what the user said: statements, and what each does to the memories.

Lexical and deterministic, so that a reviewer can check it in a line:

- a sentence of a user message (12+ characters, not a question) is a statement when it says
  "forget ..." / "no longer ..." (a retirement), "update: ..." / "... instead of ..." /
  "... rather than ..." (an update), "remember ..." / "note: ..." / "fyi ..." (a note), or
  "always", "prefer", "never" (a preference);
- a statement is **about** a memory when they share at least two subject words and either at least
  60 % of the larger one's or a name (a capitalised word inside a sentence, or a word with a digit,
  slash, dot, dash or underscore), and, unless it is an update, name the same values (words with a digit)
  (subject words: relevance.subject, a plural "s" dropped; a memory's are those of its title and
  the first line of its text); it **covers** a memory when it has at least 80 % of the memory's;
- it says it **the other way round** when one of the two has a negation ("never", "not", "avoid",
  ...) and the other none (relevance.negated).

Then, against the memories that are accepted or proposed: an update edits the memory it is about;
a statement the other way round supersedes it; a statement that covers two or more memories
merges them; a retirement retires the one it is most about; a statement about one memory the
same way round is a repeat or a paraphrase, left out; anything else is a new memory. Paraphrases in
other words (no two shared subject words) are missed: the rule is lexical.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .relevance import negated, subject

FORGET = re.compile(r"^(?:please\s+)?(?:forget|disregard)\b|\bno longer\b", re.I)
UPDATE = re.compile(r"^(?:update|correction|change of plan)\s*[:,-]|\binstead of\b|\brather than\b", re.I)
UPDATE_HEAD = re.compile(r"^(?:update|correction|change of plan)\s*[:,-]\s*", re.I)
UPDATE_TAIL = re.compile(r",?\s*\b(?:instead of|rather than)\b[^.;:!]*", re.I)
NOTE = re.compile(r"^(?:remember|note|fyi|for the record|for future reference)\b[:,]?\s*(?:that\s+)?", re.I)
PREFERENCE = re.compile(r"\b(always|prefer|never)\b", re.I)
SENTENCE = re.compile(r"(?<=[.!?])\s+|\n")
# words of the machinery around a statement, not of what it is about
MARKERS = frozenset({"user", "said", "session", "note", "preference", "update", "updated", "correction", "remember",
                     "forget", "disregard", "fyi", "record", "reference", "longer", "instead", "rather", "please", "now",
                     # pronouns bm25s's English stop words keep
                     "we", "us", "our", "ours", "me", "my", "mine", "you", "your", "yours", "they", "them", "their"})
SHARED_MIN = 2
SHARED_SHARE = 0.6  # of the larger set of subject words: about the same thing
COVER_SHARE = 0.8  # of a memory's subject words: a statement that says all of it


@dataclass
class Statement:
    """One thing the user said that may become, change or retire a memory."""

    kind: str  # preference, note, update, forget
    said: str  # the sentence as said (what citations quote)
    text: str  # what the memory states (an update without its "instead of ..." clause)
    session_id: str
    seq: int
    title: str  # the session's title
    citations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def tags(self) -> list[str]:
        return ["preference" if self.kind == "preference" else "note"]

    @property
    def memory_title(self) -> str:
        label = "Preference" if self.kind == "preference" or PREFERENCE.search(self.text) else "Note"
        return f"{label}: {self.text[:60]}"

    def memory_text(self) -> str:
        # the statement alone on its first line, as said (an update: without what it replaced), so that a
        # redaction of the memory, which scrubs each line of its text from the log, also scrubs where it came from
        first = self.text if self.kind == "update" else self.said
        return f'{first}\n(the user, in session "{self.title}")'


def words(text: str) -> frozenset[str]:
    """The subject words of a text, a plural "s" dropped, without the machinery's own words."""
    out = set()
    for w in subject(text):
        w = w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w
        if w not in MARKERS:
            out.add(w)
    return frozenset(out)


def _values(ws: frozenset[str]) -> frozenset[str]:
    return frozenset(w for w in ws if any(c.isdigit() for c in w))


NAME = re.compile(r"[\w][\w./-]*[\w]")


def names(text: str) -> frozenset[str]:
    """The names in a text: capitalised words inside a sentence, and words with a digit, slash, dot, dash or underscore."""
    out = set()
    for sentence in SENTENCE.split(text):
        for i, m in enumerate(NAME.finditer(sentence)):
            w = m.group()
            if len(w) >= 3 and (any(c.isdigit() or c in "./-_" for c in w) or (i > 0 and w[0].isupper())):
                out.add(w.casefold())
    return frozenset(out)


def related(a: frozenset[str], b: frozenset[str], update: bool = False, same_name: bool = False) -> int:
    """How many subject words a and b share when they are about the same thing, else 0 (`same_name`: they share a name)."""
    shared = len(a & b)
    if not update and _values(a) != _values(b) and _values(a) and _values(b):
        return 0  # the same words around other values: another fact ("sort column a" is not "sort column b")
    return shared if shared >= SHARED_MIN and (same_name or shared >= SHARED_SHARE * max(len(a), len(b))) else 0


def covers(a: frozenset[str], m: frozenset[str]) -> bool:
    """Whether a statement with subject words a says everything a memory with words m says."""
    shared = len(a & m)
    return shared >= SHARED_MIN and shared >= COVER_SHARE * len(m) and _values(m) <= a


def statements(sid: str, title: str, seq: int, body: str) -> list[Statement]:
    """The statements in one user message."""
    out = []
    for sentence in SENTENCE.split(body):
        s = sentence.strip()
        if len(s) < 12 or s.endswith("?"):
            continue
        if FORGET.search(s):
            kind, text = "forget", s
        elif UPDATE.search(s):
            kind, text = "update", UPDATE_TAIL.sub("", UPDATE_HEAD.sub("", s)).strip()
        elif NOTE.match(s):
            kind, text = "note", NOTE.sub("", s, count=1).strip()
        elif PREFERENCE.search(s):
            kind, text = "preference", s
        else:
            continue
        if len(text) < 8:
            continue
        text = text[0].upper() + text[1:]
        out.append(Statement(kind, s, text, sid, seq, title, [{"session_id": sid, "seq": seq, "quote": s[:200]}]))
    return out


def _memory_statement(m: dict[str, Any]) -> str:
    title = m["title"].split(":", 1)[1] if ":" in m["title"][:12] else m["title"]
    first = (m.get("text") or "").strip().splitlines()[:1]
    return title + "\n" + (first[0] if first else "")


def _negative(text: str) -> bool:
    return bool(negated(text))


def inp_text(inp: dict[str, Any]) -> str:
    """What a proposal states (a retirement: nothing)."""
    return str(inp.get("text") or "")


def _statement_of(m: dict[str, Any]) -> str:
    first = (m.get("text") or "").strip().splitlines()[:1]
    return m["title"] + " " + (first[0] if first else "")


def plan(found: list[Statement], known: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The proposals (tool name, input) the statements make, against the live memories `known`
    ({id, status, title, text}); statements in the order the dream read them (its chunk's, `dream_order`:
    with `oldest`, the order they were said), the later winning."""
    live = [m for m in known if m.get("status") in ("accepted", "proposed")]
    mwords = {m["id"]: words(_memory_statement(m)) for m in live}
    mnames = {m["id"]: names(_memory_statement(m)) for m in live}
    changed: set[str] = set()  # a memory gets at most one proposal from a dream's chunk
    made: list[tuple[Statement, dict[str, Any]]] = []  # the statements that changed memories, and their proposals
    new: list[Statement] = []
    calls: list[tuple[str, dict[str, Any]]] = []
    for st in found:
        sw, sn = words(st.text), names(st.said)
        update = st.kind in ("update", "forget")
        scored = sorted(((related(sw, mwords[m["id"]], update, bool(sn & mnames[m["id"]])), i, m)
                         for i, m in enumerate(live) if m["id"] not in changed),
                        key=lambda x: (-x[0], x[1]))
        about = [(n, m) for n, _, m in scored if n]
        reason = f"the user said: {st.said[:300]}"
        again = next((inp for before, inp in made if related(sw, words(before.text), update, bool(sn & names(before.said)))), None)
        if again is not None:  # about what this chunk already changes: more evidence, or the later statement wins
            if _negative(st.text) == _negative(inp_text(again)) and st.kind != "update":
                again["provenance"] = [*again.get("provenance", []), *st.citations][:5]
            elif "text" in again:
                again.update(title=st.memory_title, text=st.memory_text(), provenance=st.citations)
            continue
        if st.kind == "forget":
            if about:
                target = about[0][1]
                changed.add(target["id"])
                calls.append(("propose_retire", {"memory_id": target["id"], "reason": reason, "provenance": st.citations}))
                made.append((st, calls[-1][1]))
            else:  # a statement earlier in this chunk that is now to be forgotten
                new = [n for n in new if not related(sw, words(n.text), True)]
            continue
        other_way = [m for _, m in about if _negative(_statement_of(m)) != _negative(st.text)]
        if (st.kind == "update" and about) or other_way:
            target = (other_way or [about[0][1]])[0]
            changed.add(target["id"])
            fields = {"title": st.memory_title, "text": st.memory_text(), "tags": st.tags, "provenance": st.citations}
            if st.kind != "update" and target["status"] == "accepted":  # a correction of an accepted memory
                calls.append(("propose_memory", {**fields, "supersedes": [target["id"]]}))
            else:
                calls.append(("propose_edit", {**fields, "memory_id": target["id"], "reason": reason}))
            made.append((st, calls[-1][1]))
            continue
        covered = [m for m in live if m["id"] not in changed and covers(sw, mwords[m["id"]])]
        if len(covered) >= 2:
            ids = [m["id"] for m in covered]
            changed.update(ids)
            calls.append(("propose_merge", {"memory_ids": ids, "title": st.memory_title, "text": st.memory_text(),
                                            "tags": st.tags, "provenance": st.citations,
                                            "reason": f"one memory for {len(ids)} overlapping ones; {reason}"}))
            made.append((st, calls[-1][1]))
            continue
        if about:
            continue  # a repeat or a paraphrase of what a memory says already
        earlier = next((n for n in new if related(sw, words(n.text), update, bool(sn & names(n.said)))), None)
        if earlier is not None and _negative(earlier.text) == _negative(st.text) and st.kind != "update":
            earlier.citations.append(st.citations[0])  # said again in this chunk: more evidence, one memory
            continue
        if earlier is not None:
            new.remove(earlier)  # changed or contradicted later in this chunk: the later statement wins
        new.append(st)
    for st in new:
        calls.append(("propose_memory", {"title": st.memory_title, "text": st.memory_text(), "tags": st.tags,
                                         "provenance": st.citations[:5]}))
    return calls


MEMORY = re.compile(r"^\[(\S+)\] \((\w+)\) (.*)$")


def parse_memories(text: str) -> list[dict[str, Any]]:
    """The memories a read_memories result shows ({id, status, title, text}); nothing from anything else."""
    out = []
    for block in text.split("\n\n"):
        lines = block.splitlines()
        head = MEMORY.match(lines[0]) if lines else None
        if not head:
            continue
        body = [x[2:] if x.startswith("  ") else x for x in lines[1:]]
        if body and body[0].startswith("tags:"):
            body = body[1:]
        out.append({"id": head.group(1), "status": head.group(2), "title": head.group(3), "text": "\n".join(body)})
    return out
