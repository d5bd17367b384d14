"""The accepted memories of a mount set, indexed in the process: what injection and `recall` rank by.

Ranking 10,000 memories from scratch costs seconds (a listing, BM25 over every document, the contradiction
scan); a session is created in milliseconds. So each mount set (the stores a session mounts) keeps a
`MountIndex`: every accepted memory's BM25 term counts, its embedding row (semantic.Embeddings, once per
version) and its contradiction facts, with the first MAX_CONFLICTS memories it contradicts.

**Fresh by a cheap check, updated by what changed.** Before each use the index asks the store for its
change mark, one statement: how many versions there are, the newest version's time, and how many
redactions. Versions are only ever appended, so when the mark moved the index reads the versions from its
newest time on (`ts >= newest`), re-reads just those memories and updates its entries one by one. It
rebuilds from a full listing only when the count does not add up (a clock that went back) or a memory was
redacted (a redaction scrubs other memories' texts in place, with no new version). A write by another
store object or connection on the same file is seen the same way as this one's.

BM25 here is bm25s's Lucene variant (relevance.scores), kept incrementally: bm25s builds an index once
and cannot add to it; tests/memory/test_index.py checks the scores agree with bm25s's.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import heapq
import math
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .relevance import MAX_CONFLICTS, _facts, _tokens, contradiction, document
from .semantic import RELATED, Embeddings, embed

K1, B = 1.5, 0.75  # bm25s's defaults, which relevance.scores uses
MAX_INDEXES = 16  # mount sets kept per store object (the least recently used goes)


@dataclass
class Entry:
    """One accepted memory as the index holds it."""

    memory: dict[str, Any]
    digest: bytes  # of what it is searched and shown by: a change in place (a redaction) is a new entry
    terms: Counter[str]
    length: int
    facts: tuple[list[str], frozenset[str], frozenset[str]]
    block: str  # how the injection shows it
    order: tuple[str, str]  # (created_at, id): the listing's order, which the contradiction scan follows
    vector: Any  # its statement's embedding (semantic.Embeddings)
    partners: list[str] = field(default_factory=list)  # the first MAX_CONFLICTS it contradicts, in order


def _digest(m: dict[str, Any]) -> bytes:
    said = "\x00".join([document(m), m["updated_at"], m["updated_by"], str(m["version"]),
                        repr([(c.get("session_id"), c.get("seq")) for c in m["provenance"] if isinstance(c, dict)])])
    return hashlib.blake2b(said.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class MountIndex:
    """The accepted memories of some stores: BM25 postings, embeddings, contradictions, kept current."""

    def __init__(self, stores: Sequence[str], load: Callable[[list[str] | None], list[dict[str, Any]]],
                 mark: Callable[[], tuple[int, Any, int] | None],
                 since: Callable[[Any], tuple[list[tuple[str, Any]], int, int]],
                 embeddings: Embeddings, block: Callable[[dict[str, Any]], str]):
        self.stores = tuple(stores)
        self._load, self._mark, self._since, self._embeddings, self._block = load, mark, since, embeddings, block
        self._lock = threading.RLock()
        self._entries: dict[str, Entry] = {}
        self._postings: dict[str, dict[str, int]] = {}
        self._total = 0  # the sum of the documents' lengths
        self._subjects: dict[tuple[str, bool, str], list[tuple[tuple[str, str], str]]] = {}  # sorted by order
        self._cited_by: dict[str, set[str]] = {}  # id -> the entries whose partners name it
        self._known: tuple[int, Any, int] | None = None  # (versions, newest ts, redactions) as last read
        self._at_newest = 0  # versions with the newest ts, as last read
        self._views: dict[str, Any] = {}  # what is derived from the entries (arrays, the held back), until a change
        self.rebuilds = 0  # full loads so far (a test's and a benchmark's window into the index)

    @contextlib.contextmanager
    def fresh(self) -> Iterator[MountIndex]:
        """Hold the index, brought up to the store's last change, for a few reads that must agree."""
        with self._lock:
            self.refresh()
            yield self

    # -- keeping current -------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Bring the index up to the store's last change (a no-op when nothing changed)."""
        with self._lock:
            mark = self._mark()
            if mark == self._known and self._known is not None:
                return
            if mark is None:  # no memory table yet
                self._reset()
                self._known, self._at_newest = None, 0
                return
            if self._known is None or mark[2] != self._known[2] or self._known[1] is None:
                self._rebuild(mark)
                return
            rows, versions, redactions = self._since(self._known[1])
            if redactions != self._known[2] or self._known[0] - self._at_newest + len(rows) != versions:
                self._rebuild(mark)  # a version older than the newest known appeared, or a redaction landed
                return
            changed = list(dict.fromkeys(mid for mid, _ in rows))
            newest = max(ts for _, ts in rows)
            current = {m["id"]: m for m in self._load(changed)}
            for mid in changed:
                self._put(current.get(mid), mid)
            self._known, self._at_newest = (versions, newest, redactions), sum(ts == newest for _, ts in rows)
            self._views.clear()

    def _rebuild(self, mark: tuple[int, Any, int]) -> None:
        # the mark is read before the listing: a write in between is in the listing and read again next time
        rows = self._load(None)
        self._reset()
        tokens = _tokens([document(m) for m in rows]) if rows else []
        # in one batch: much cheaper than one by one; none without rows (numpy is not imported by a session made
        # where no memory exists yet: a tenth of a second of a CLI run's CPU)
        vectors = self._embeddings.of(rows)[1] if rows else []
        for m, toks, vec in sorted(zip(rows, tokens, vectors, strict=True), key=lambda p: (p[0]["created_at"], p[0]["id"])):
            self._add(m, toks, vec, link=False)
        for e in self._entries.values():  # then each one's first contradictions, as held_back scans them
            e.partners = self._first_partners(e)
            for o in e.partners:
                self._cited_by.setdefault(o, set()).add(e.memory["id"])
        self._known = mark
        newest = self._since(mark[1])[0] if mark[1] is not None else []
        self._at_newest = sum(ts == mark[1] for _, ts in newest)
        self._views.clear()
        self.rebuilds += 1

    def _reset(self) -> None:
        self._entries.clear()
        self._postings.clear()
        self._subjects.clear()
        self._cited_by.clear()
        self._total = 0
        self._views.clear()

    def _put(self, m: dict[str, Any] | None, mid: str) -> None:
        """The memory `mid` is now m (None: gone): accepted in a mounted store, or out of the index."""
        keep = m is not None and m["status"] == "accepted" and m["store"] in self.stores
        old = self._entries.get(mid)
        if old is not None and keep and m is not None and old.digest == _digest(m):
            return
        if old is not None:
            self._remove(mid)
        if keep and m is not None:
            self._add(m, _tokens([document(m)])[0])

    def _add(self, m: dict[str, Any], tokens: list[str], vector: Any = None, link: bool = True) -> None:
        negs, title, words = _facts(m)
        e = Entry(dict(m), _digest(m), Counter(tokens), len(tokens), (negs, title, words), self._block(m),
                  (m["created_at"], m["id"]), self._embeddings.of([m])[1][0] if vector is None else vector)
        self._entries[m["id"]] = e
        self._total += e.length
        for t, n in e.terms.items():
            self._postings.setdefault(t, {})[m["id"]] = n
        for w in words:
            bisect.insort(self._subjects.setdefault((m["store"], bool(negs), w), []), (e.order, m["id"]))
        if link:
            self._link(e)

    def _link(self, e: Entry) -> None:
        """Who e contradicts first, and whose first MAX_CONFLICTS contradictions e now is among."""
        mid = e.memory["id"]
        e.partners = self._first_partners(e)
        for o in e.partners:
            self._cited_by.setdefault(o, set()).add(mid)
        for oid in self._candidates(e):
            other = self._entries[oid]
            if (len(other.partners) < MAX_CONFLICTS or e.order < self._entries[other.partners[-1]].order) \
                    and self._contradicts(other, e):
                bisect.insort(other.partners, mid, key=lambda i: self._entries[i].order)
                self._cited_by.setdefault(mid, set()).add(oid)
                if len(other.partners) > MAX_CONFLICTS:
                    dropped = other.partners.pop()
                    self._cited_by.get(dropped, set()).discard(oid)

    def _remove(self, mid: str) -> None:
        e = self._entries.pop(mid)
        self._total -= e.length
        for t in e.terms:
            p = self._postings[t]
            del p[mid]
            if not p:
                del self._postings[t]
        negs, _, words = e.facts
        for w in words:
            lst = self._subjects[(e.memory["store"], bool(negs), w)]
            del lst[bisect.bisect_left(lst, (e.order, mid))]
        for o in e.partners:
            self._cited_by.get(o, set()).discard(mid)
        for oid in self._cited_by.pop(mid, set()):
            other = self._entries.get(oid)
            if other is None:
                continue
            full = len(other.partners) >= MAX_CONFLICTS
            other.partners.remove(mid)
            if full:  # one more may have been beyond the first MAX_CONFLICTS
                for o in other.partners:
                    self._cited_by.get(o, set()).discard(oid)
                other.partners = self._first_partners(other)
                for o in other.partners:
                    self._cited_by.setdefault(o, set()).add(oid)

    def _contradicts(self, a: Entry, b: Entry) -> bool:
        facts = {a.memory["id"]: a.facts, b.memory["id"]: b.facts}
        return contradiction(a.memory, b.memory, facts) is not None

    def _lists(self, e: Entry) -> list[list[tuple[tuple[str, str], str]]]:
        negs, _, words = e.facts
        return [self._subjects.get((e.memory["store"], not negs, w), []) for w in words]

    def _candidates(self, e: Entry) -> set[str]:
        """The entries of its store that share a subject word with e and say it the other way round."""
        return {i for lst in self._lists(e) for _, i in lst} - {e.memory["id"]}

    def _first_partners(self, e: Entry) -> list[str]:
        """The first MAX_CONFLICTS entries, in order, that e contradicts (the candidates merged in order)."""
        out: list[str] = []
        seen: set[str] = set()
        merged: Iterator[tuple[tuple[str, str], str]] = heapq.merge(*self._lists(e))
        for _, oid in merged:
            if oid in seen or oid == e.memory["id"]:
                continue
            seen.add(oid)
            if self._contradicts(e, self._entries[oid]):
                out.append(oid)
                if len(out) == MAX_CONFLICTS:
                    break
        return out

    # -- reading ----------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def _arrays(self) -> dict[str, Any]:
        """Entries in listing order, their embeddings, lengths and newness (computed once per change)."""
        if "ids" not in self._views:
            import numpy as np

            entries = sorted(self._entries.values(), key=lambda x: x.order)
            ids = [x.memory["id"] for x in entries]
            vectors = np.stack([x.vector for x in entries]) if entries else embed([])
            newest = sorted(range(len(entries)), key=lambda i: entries[i].memory["updated_at"], reverse=True)
            newness = np.empty(len(entries), dtype=np.int64)
            newness[newest] = np.arange(len(entries))  # 0: the newest; ties keep the listing's order
            self._views.update(ids=ids, slot={i: n for n, i in enumerate(ids)}, entries=entries, vectors=vectors,
                               lengths=np.array([x.length for x in entries], dtype=np.float64), newness=newness)
        return self._views

    def bm25(self, query: str) -> Any:
        """The BM25 score of each entry (listing order) for the query, as relevance.scores gives it."""
        import numpy as np

        v = self._arrays()
        out = np.zeros(len(v["ids"]), dtype=np.float64)
        if not v["ids"] or not query.strip() or not self._total:
            return out
        n, avg = len(v["ids"]), self._total / len(v["ids"])
        norm = K1 * (1 - B + B * v["lengths"] / avg)
        for t in _tokens([query])[0]:
            post = self._postings.get(t)
            if not post:
                continue
            key = "term:" + t
            if key not in self._views:
                self._views[key] = (np.array([v["slot"][i] for i in post], dtype=np.int64),
                                    np.array(list(post.values()), dtype=np.float64))
            slots, tf = self._views[key]
            idf = math.log(1 + (n - len(post) + 0.5) / (len(post) + 0.5))
            out[slots] += idf * tf / (tf + norm[slots])
        return out

    def shortest_block(self) -> int:
        """The length of the shortest entry's injection block (0: none)."""
        with self._lock:
            if "shortest" not in self._views:
                self._views["shortest"] = min((len(e.block) for e in self._entries.values()), default=0)
            return int(self._views["shortest"])

    def held_back(self) -> dict[str, dict[str, Any]]:
        """store.held_back of the entries: the accepted memories a newer one contradicts, by id."""
        with self._lock:
            if "held" not in self._views:
                out: dict[str, dict[str, Any]] = {}
                for e in self._arrays()["entries"]:  # in the listing's order, as held_back scans them
                    for oid in e.partners:
                        o = self._entries[oid]
                        a, b = e.memory, o.memory
                        older, newer = (a, b) if (a["updated_at"], a["id"]) <= (b["updated_at"], b["id"]) else (b, a)
                        if older["id"] not in out:
                            why = contradiction(e.memory, o.memory, {e.memory["id"]: e.facts, oid: o.facts})
                            out[older["id"]] = {"id": older["id"], "version": older["version"], "title": older["title"],
                                                "by": newer["id"], "why": why}
                self._views["held"] = out
            return dict(self._views["held"])

    def ranked(self, query: str | None) -> list[tuple[Entry, float]]:
        """relevance.rank over the entries that are not held back: the relevant by score, then the newest."""
        import numpy as np

        with self._lock:
            v = self._arrays()
            if "keep" not in v:
                held = self.held_back()
                v["keep"] = np.array([i not in held for i in v["ids"]], dtype=bool)
            found = self.bm25(query or "")
            order = np.lexsort((v["newness"], -found))
            order = order[v["keep"][order]]
            entries = v["entries"]
            return [(entries[i], s) for i, s in zip(order.tolist(), found[order].tolist(), strict=True)]

    def recall(self, query: str, limit: int) -> list[tuple[dict[str, Any], float]]:
        """semantic.recall_rank over the entries, the matches (score > 0) only, at most `limit`."""
        import numpy as np

        if not query.strip() or limit < 1:
            return []
        with self._lock:
            v = self._arrays()
            if not v["ids"]:
                return []
            lexical = self.bm25(query)
            # einsum, not `@`: a matrix-vector product through a threaded BLAS took 11 ms instead of 0.5 ms on a
            # loaded machine (its threads wait for cores); einsum's single-threaded loop takes about 0.4 ms
            meaning = np.einsum("ij,j->i", v["vectors"], embed([query])[0])
            best = float(lexical.max()) or 1.0
            score = lexical / best + np.where(meaning >= RELATED, meaning, 0.0)
            hits = np.nonzero(score > 0)[0]
            if len(hits) > limit:  # only those that can be among the first `limit` are sorted: ties at the cut stay in
                cut = np.partition(score[hits], len(hits) - limit)[len(hits) - limit]
                hits = hits[score[hits] >= cut]
            hits = hits[np.lexsort((v["newness"][hits], -score[hits]))][:limit]
            return [(dict(v["entries"][i].memory), float(score[i])) for i in hits]


class Indexes:
    """A store object's MountIndex per mount set (the most recently used MAX_INDEXES)."""

    def __init__(self, make: Callable[[tuple[str, ...]], MountIndex]):
        self._make = make
        self._by: dict[tuple[str, ...], MountIndex] = {}
        self._lock = threading.Lock()

    def of(self, stores: Sequence[str]) -> MountIndex:
        """The index of these stores (made on first use), not yet refreshed."""
        key = tuple(sorted(set(stores)))
        with self._lock:
            index = self._by.pop(key, None) or self._make(key)
            self._by[key] = index  # the most recently used last
            while len(self._by) > MAX_INDEXES:
                self._by.pop(next(iter(self._by)))
            return index
