"""Which memories matter now: BM25 relevance with recency, and contradictions between memories.

Ranking uses bm25s (Okapi BM25 over sparse matrices, English stop words, words
stemmed by PyStemmer's Snowball English stemmer, so "dataframe" finds "dataframes";
no network model): a memory's title, text and tags form its
document; the query is a session's first message (or its title), or what the
`recall` tool is asked. Relevant memories come first, by score, then newest;
memories the query does not touch follow, newest first.

The contradiction detector is meant to be explained in one line to a
reviewer: two memories contradict when they are about the same subject (the
same title once polarity words are dropped, or at least half of the smaller
one's subject words shared) and one says it the other way round (a negation
such as "never", "not", "avoid" in one and not in the other).
"""

from __future__ import annotations

import functools
import importlib.util
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

WORD = re.compile(r"(?u)\b\w\w+\b")
# words that turn a statement around; "no" and "not" are in bm25s's stop words, so they are checked first
NEGATIONS = frozenset({
    "never", "not", "no", "don", "dont", "doesn", "isn", "aren", "shouldn", "mustn", "won", "cannot", "avoid", "avoided",
    "stop", "stopped", "disable", "disabled", "without", "forbid", "forbidden", "deprecated", "nor", "neither", "instead",
})
# words that only say how strongly (prefer/use/always): not part of a statement's subject
STANCE = frozenset({"prefer", "preferred", "use", "used", "using", "always", "should", "must", "do", "does", "please",
                    "recommend", "recommended", "enable", "enabled", "allow", "allowed", "ok", "okay"})
OVERLAP = 0.5  # share of the smaller subject that both memories must name
MAX_CONFLICTS = 5  # contradictions shown per memory (a listing stays bounded)


def document(m: dict[str, Any]) -> str:
    """What a memory is searched by: its title, text and tags."""
    return f"{m['title']}\n{m['text']}\n{' '.join(m.get('tags') or [])}"


# bm25s is imported where it is used: it brings numpy and scipy (half a second and more on a loaded machine),
# which every `workbench` command and server start would pay for, most of them never ranking a memory


@functools.cache
def _stop() -> frozenset[str]:
    """bm25s's English stop words, from its word-list module alone: `import bm25s.stopwords` runs the package's
    `__init__` first (numpy and scipy), which every `workbench memories` listing then paid for, to annotate its
    rows' contradictions with one list of words."""
    package = importlib.util.find_spec("bm25s")  # finds the package (a dependency), does not import it
    assert package is not None and package.origin is not None, "bm25s is a dependency of the workbench"
    spec = importlib.util.spec_from_file_location("bm25s.stopwords", Path(package.origin).parent / "stopwords.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # a tuple of words, no import; not registered: bm25s imports its own as usual
    return frozenset(module.STOPWORDS_EN)


@functools.cache
def stemmer() -> Any:
    """The Snowball English stemmer (PyStemmer), made once."""
    import Stemmer

    return Stemmer.Stemmer("english")


def _tokens(texts: Sequence[str]) -> list[list[str]]:
    import bm25s

    out = bm25s.tokenize(list(texts), stopwords="en", stemmer=stemmer(), return_ids=False, show_progress=False)
    assert isinstance(out, list), "return_ids=False gives lists of tokens"
    return out


def scores(docs: Sequence[str], query: str) -> list[float]:
    """The BM25 score of each document for the query (0.0 where nothing matches)."""
    if not docs or not query.strip():
        return [0.0] * len(docs)
    corpus = _tokens(docs)
    if not any(corpus):  # bm25s cannot index a corpus of stop words only
        return [0.0] * len(docs)
    import bm25s

    retriever = bm25s.BM25()
    retriever.index(corpus, show_progress=False)
    vocab = retriever.vocab_dict
    words = [w for w in _tokens([query])[0] if w in vocab]
    if not words:
        return [0.0] * len(docs)
    return [float(s) for s in retriever.get_scores(words)]


def rank(memories: Sequence[dict[str, Any]], query: str | None) -> list[tuple[dict[str, Any], float]]:
    """(memory, score) pairs, most relevant first, then newest (by `updated_at`); score 0.0: not relevant."""
    found = scores([document(m) for m in memories], query or "")
    pairs = list(zip(memories, found, strict=True))
    pairs.sort(key=lambda p: p[0]["updated_at"], reverse=True)  # stable: newest first among equal scores
    pairs.sort(key=lambda p: p[1], reverse=True)
    return pairs


# -- contradictions -----------------------------------------------------------------------------


def _words(text: str) -> list[str]:
    return [w.replace("'", "") for w in WORD.findall(text.casefold())]


def _statement(m: dict[str, Any]) -> str:
    """The title and the first sentence of the text: where a memory says what it says."""
    first = re.split(r"(?<=[.!?;])\s|\n", m["text"].strip(), maxsplit=1)[0]
    return f"{m['title']}\n{first}"


def subject(text: str) -> frozenset[str]:
    """The content words of a statement: no stop words, negations or stance words."""
    return frozenset(w for w in _words(text) if w not in _stop() and w not in NEGATIONS and w not in STANCE)


def negated(text: str) -> list[str]:
    """The negation words in a statement (its polarity is negative when there are any)."""
    return sorted({w for w in _words(text) if w in NEGATIONS})


def _facts(m: dict[str, Any]) -> tuple[list[str], frozenset[str], frozenset[str]]:
    """(negation words, subject of the title, subject of the statement) of a memory."""
    statement = _statement(m)
    return negated(statement), subject(m["title"]), subject(statement)


def contradiction(a: dict[str, Any], b: dict[str, Any], facts: dict[str, Any] | None = None) -> str | None:
    """Why memories a and b look contradictory (one line), or None. `facts`: a cache by memory id."""
    cache = facts if facts is not None else {}
    (na, ta, wa), (nb, tb, wb) = (cache.get(m["id"]) or cache.setdefault(m["id"], _facts(m)) for m in (a, b))
    if bool(na) == bool(nb):
        return None  # the same polarity: a duplicate or a refinement, not a contradiction
    if ta and ta == tb:
        same = f"the same subject in the title ({', '.join(sorted(ta))})"
    else:
        shared = wa & wb
        if not shared or len(shared) < OVERLAP * min(len(wa), len(wb)):
            return None
        same = f"the same subject ({', '.join(sorted(shared)[:6])})"
    which = "the first" if na else "the second"
    return f"{same}, said the other way round: {which} says {', '.join(repr(w) for w in (na or nb))}"


def contradictions_among(rows: Sequence[dict[str, Any]], others: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """`contradictions` of each row against others, by id: only pairs that share a subject word and differ
    in polarity are compared (an index of others by subject word), so a long listing stays cheap."""
    facts: dict[str, Any] = {}
    index: dict[tuple[bool, str], list[dict[str, Any]]] = {}
    for o in others:
        negs, _, words = facts.setdefault(o["id"], _facts(o))
        for w in words:
            index.setdefault((bool(negs), w), []).append(o)
    order = {o["id"]: i for i, o in enumerate(others)}
    out = {}
    for m in rows:
        negs, _, words = facts.setdefault(m["id"], _facts(m))
        seen: dict[str, dict[str, Any]] = {}
        for w in words:
            for o in index.get((not negs, w), ()):
                seen.setdefault(o["id"], o)
        # in the order of others, as `contradictions` gives them
        out[m["id"]] = contradictions(m, sorted(seen.values(), key=lambda o: order[o["id"]]), facts)
    return out


def contradictions(m: dict[str, Any], others: Sequence[dict[str, Any]],
                   facts: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The memories among others (not m itself) that m contradicts, each {id, title, text, status, updated_at, why};
    at most MAX_CONFLICTS, the first in the order of others."""
    out: list[dict[str, Any]] = []
    for o in others:
        if o["id"] == m["id"]:
            continue
        if len(out) == MAX_CONFLICTS:
            break
        why = contradiction(m, o, facts)
        if why:
            out.append({"id": o["id"], "title": o["title"], "text": o["text"], "status": o["status"],
                        "updated_at": o["updated_at"], "why": why})
    return out
