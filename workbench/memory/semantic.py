"""Which memories say the same thing: subsets, supersets and paraphrases in other words, offline.

A memory's **statement** is its title (without a short "Label:" head) and the first line of its text. A
statement **overlaps** another when both say it the same way round (relevance.negated) and either

- **containment**: the subject words (relevance.subject, stemmed, without the dream's own words) of one
  are all among the other's, at least MIN_WORDS of them: a subset, a superset, or the same; or
- **paraphrase**: their embeddings are at least PARAPHRASE similar (cosine), they do not name different
  values (each names some, e.g. a number or a capitalised name, dream_statements.names, and none of them
  is the other's), and one is not the other with a word or two swapped.

The same words with one or two of them swapped for as many others are other values of one frame
("Libraries used: numpy" and "Libraries used: yaml", "use pandas for X" and "use polars for X"): other
facts, never merged, however similar their embeddings (a library is near another library). A paraphrase
that swaps a synonym or two is the lexical rules' (tools._duplicate, dream_statements).

Embeddings are WordLlama's (256 dimensions; its weights and tokenizer ship inside its wheel and are
loaded with downloads disabled: never the network), computed once per memory version and kept by
`Embeddings`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .dream_statements import MARKERS, names
from .relevance import STANCE, document, negated, scores, stemmer, subject

DIM = 256
MIN_WORDS = 2  # a statement of one subject word ("pandas") is contained in too much to merge by
MAX_SWAP = 2  # words swapped for as many others: the same frame around other values (see above)
PARAPHRASE = 0.6  # cosine of two statements' embeddings that say the same in other words
RELATED = 0.5  # cosine of a recall query's embedding and a memory's that counts, with no word shared
MAX_STATEMENT = 2000  # characters of a statement embedded (a title and a first line; longer adds nothing)


@functools.cache
def model() -> Any:
    """WordLlama's 256-dimension model, loaded once from the files its wheel ships."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        import wordllama
        from wordllama import WordLlama
    finally:  # it calls logging.basicConfig when imported: the host's logging is not a library's to set up
        for h in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(h)
        root.setLevel(level)

    # the package's own directory as the cache: its wheel holds the weights and the tokenizer, but WordLlama
    # looks for the tokenizer in a directory the wheel does not have and would download it; with downloads
    # disabled it finds both here and never reaches for the network
    return WordLlama.load(dim=DIM, cache_dir=Path(wordllama.__file__).parent, disable_download=True)


def embed(texts: Sequence[str]) -> Any:
    """Unit vectors (numpy, one row a text) of texts; a text with no known token is the zero vector."""
    import numpy as np

    if not texts:
        return np.zeros((0, DIM), dtype=np.float32)
    # the tokenizer takes only text that encodes (a lone surrogate from a JSON escape does not)
    clean = [t[:MAX_STATEMENT].encode("utf-8", "replace").decode("utf-8") for t in texts]
    vectors = model().embed(clean, norm=True)
    return np.nan_to_num(np.asarray(vectors, dtype=np.float32).reshape(len(texts), DIM))


@functools.cache
def _markers() -> frozenset[str]:
    # stemmed too: "uses" is not a stance word until it is "use"
    return MARKERS | frozenset(stemmer().stemWords(sorted(MARKERS | STANCE)))


# An HTML or XML tag in a memory's words: markup, not what it states. Two memories that quote the same tag (a
# planted <img onerror=...> in an error and in a preference) share its words and most of their embedding, and are
# still two facts.
TAG = re.compile(r"</?[A-Za-z][^<>]*>")


def statement_text(m: dict[str, Any]) -> str:
    """What a memory states: its title without a short "Label:" head, and the first line of its text, without
    markup tags."""
    title = str(m.get("title") or "")
    if ":" in title[:12]:
        title = title.split(":", 1)[1]
    first = str(m.get("text") or "").strip().splitlines()[:1]
    return TAG.sub(" ", f"{title.strip()}\n{first[0] if first else ''}").strip()


@dataclass(frozen=True)
class Statement:
    """A statement's stemmed subject words, the values it names, and its polarity."""

    words: frozenset[str]
    values: frozenset[str]
    negative: bool

    @classmethod
    def of(cls, text: str) -> Statement:
        ws = frozenset(stemmer().stemWords(sorted(subject(text)))) - _markers()
        return cls(ws, names(text), bool(negated(text)))


def relation(a: Statement, b: Statement, similarity: float) -> str | None:
    """How statement a stands to b: "same", "subset" (a says part of b), "superset", "paraphrase", or None."""
    if a.negative != b.negative:
        return None  # said the other way round: a contradiction (relevance.contradiction), not a duplicate
    shared = a.words & b.words
    smaller = a.words if len(a.words) <= len(b.words) else b.words
    if len(smaller) >= MIN_WORDS and shared == smaller:
        return "same" if a.words == b.words else "subset" if a.words < b.words else "superset"
    if not smaller or other_values(a, b):
        return None
    return "paraphrase" if similarity >= PARAPHRASE else None


def other_values(a: Statement, b: Statement) -> bool:
    """Whether a and b are one frame around other values: each names values and none of the other's, or they
    are the same words with one or two swapped for as many others."""
    if a.values and b.values and not a.values & b.values:
        return True
    shared = a.words & b.words
    return bool(shared) and 0 < len(a.words - shared) == len(b.words - shared) <= MAX_SWAP


def other_facts(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """`other_values` of two memories' statements (title, text): however alike their words, not one fact."""
    return other_values(Statement.of(statement_text(a)), Statement.of(statement_text(b)))


class Embeddings:
    """Each memory's statement and embedding, computed once per version of it and kept by memory id
    (with a digest of the statement: a redaction changes a text in place, without a new version)."""

    def __init__(self) -> None:
        self._items: dict[str, tuple[bytes, Statement, Any]] = {}
        self._lock = threading.Lock()  # the dream tools and recall run in worker threads

    def __len__(self) -> int:
        return len(self._items)

    def of(self, memories: Sequence[dict[str, Any]]) -> tuple[list[Statement], Any]:
        """The statements of memories and their embeddings (one row each), computing only what is new."""
        import numpy as np

        texts = [statement_text(m) for m in memories]
        digests = [hashlib.blake2b(t.encode(), digest_size=16).digest() for t in texts]
        with self._lock:
            missing = [i for i, m in enumerate(memories) if self._items.get(m["id"], (b"",))[0] != digests[i]]
        if missing:
            vectors = embed([texts[i] for i in missing])
            with self._lock:
                for row, i in enumerate(missing):
                    self._items[memories[i]["id"]] = (digests[i], Statement.of(texts[i]), vectors[row])
        with self._lock:
            items = [self._items[m["id"]] for m in memories]
        return [s for _, s, _ in items], (np.stack([v for _, _, v in items]) if items else embed([]))


@dataclass(frozen=True)
class Overlap:
    """A memory a proposal overlaps: how the proposal stands to it, and how similar they are."""

    memory: dict[str, Any]
    how: str  # same, subset (the proposal says part of the memory), superset, paraphrase
    similarity: float


def overlaps(title: str, text: str, memories: Sequence[dict[str, Any]], cache: Embeddings) -> list[Overlap]:
    """The memories a proposal (title, text) overlaps, the most similar first."""
    if not memories:
        return []
    said = statement_text({"title": title, "text": text})
    mine = Statement.of(said)
    statements, vectors = cache.of(memories)
    similarities = vectors @ embed([said])[0]
    found = []
    for m, s, sim in zip(memories, statements, similarities, strict=True):
        how = relation(mine, s, float(sim))
        if how:
            found.append(Overlap(m, how, float(sim)))
    return sorted(found, key=lambda o: -o.similarity)


def recall_rank(memories: Sequence[dict[str, Any]], query: str, cache: Embeddings) -> list[tuple[dict[str, Any], float]]:
    """What the `recall` tool ranks by: (memory, score), the best first, then newest; score 0.0: not relevant.
    A score is the memory's stemmed BM25 score over the best one's (0 to 1), plus the similarity of the query's
    embedding and its statement's when that is at least RELATED (words the query shares, or a meaning it does)."""
    if not memories or not query.strip():
        return [(m, 0.0) for m in memories]
    lexical = scores([document(m) for m in memories], query)
    best = max(lexical) or 1.0
    _, vectors = cache.of(memories)
    meaning = vectors @ embed([query])[0]
    pairs = [(m, b / best + (float(s) if s >= RELATED else 0.0)) for m, b, s in zip(memories, lexical, meaning, strict=True)]
    pairs.sort(key=lambda p: p[0]["updated_at"], reverse=True)  # stable: newest first among equal scores
    pairs.sort(key=lambda p: p[1], reverse=True)
    return pairs


def absorbed(found: Sequence[Overlap], title: str, text: str, tags: list[str],
             provenance: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What a proposal that overlaps the memories `found` becomes: an edit of the one memory, or a merge of
    several, whose text keeps each part (the memories, then the proposal) that no other part contains,
    with the union of their provenance; None when it cites no event they do not cite already."""
    seen = {(c["session_id"], c["seq"]) for o in found for c in o.memory["provenance"]}
    evidence = [c for c in provenance if (c["session_id"], c["seq"]) not in seen]
    if not evidence:
        return None  # the same evidence read again (a recalled memory, a repeat), however it is worded
    # a memory says it all already; a paraphrase keeps both wordings (nothing is lost; the reviewer may trim)
    said = any(o.how in ("same", "subset") for o in found)
    parts = [(o.memory["title"], o.memory["text"]) for o in found if o.how != "superset"]
    parts += [] if said else [(title, text)]
    union = [c for o in found for c in o.memory["provenance"]] + evidence
    how = {"same": "says the same as", "subset": "says part of", "superset": "says all of, and more than",
           "paraphrase": "says in other words"}
    note = "; ".join(f"it {how[o.how]} memory {o.memory['id']} (similarity {o.similarity:.2f})" for o in found)
    return {
        "kind": "edit" if len(found) == 1 else "merge", "targets": [o.memory["id"] for o in found],
        "title": parts[0][0], "text": "\n\n".join(t for _, t in parts),
        "tags": sorted({*tags, *(t for o in found for t in o.memory["tags"])}),
        "provenance": union,
        "note": f"merged, not a new memory: {note}; "
                + ("this version adds the new evidence" if said else "this version says what each says"),
    }
