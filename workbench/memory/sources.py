"""Which sentences of its source events a memory came from: what a redaction removes besides the memory's words.

A memory's text is the dream's (or a person's) wording; its provenance cites the events it came from, each with
a quote. Removing only the memory's words leaves the source sentence in the log whenever the memory says it in
other words. So for each citation, the strings of the cited event are split into sentences, and a sentence goes
when

- the quote is in it word for word (the sentence it sits in, all of it, and the quote itself when it is at least
  MIN_QUOTE characters long), or
- the quote was reworded too: the sentence names at least MIN_SHARED of the quote's stemmed content words and
  at least SHARE of them (the best such sentence of the event, and any other that does as well).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..plugins.errors import UnknownSession
from .relevance import stemmer, subject

MIN_SHARED = 2  # content words a reworded quote and a sentence share at least
SHARE = 0.6  # of the quote's content words, in the sentence
MIN_QUOTE = 16  # a quote this long goes as well, wherever it is (a dream's tool call repeats it); a shorter one
# may be a common word or line, and goes only with its sentence
MAX_CITATIONS = 200  # citations read per redaction (a merge's provenance is the union of its parts')
SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def sentences(payload: Any) -> list[str]:
    """The sentences (and lines) of every string in an event's payload, stripped, without empties."""
    return [s.strip() for text in _strings(payload) for s in SENTENCE.split(text) if s.strip()]


def _words(text: str) -> frozenset[str]:
    return frozenset(stemmer().stemWords(sorted(subject(text))))


def quoted(quote: str, payload: Any) -> list[str]:
    """The sentences of a payload a quote comes from: those holding it word for word, else the best reworded."""
    quote = quote.strip()
    if not quote:
        return []
    said = sentences(payload)
    verbatim = [s for s in said if quote in s]
    if verbatim:
        return [quote, *verbatim] if len(quote) >= MIN_QUOTE else verbatim
    mine = _words(quote)
    if len(mine) < MIN_SHARED:
        return []
    scored = [(len(mine & _words(s)), s) for s in said]
    best = max((n for n, _ in scored), default=0)
    if best < MIN_SHARED or best < SHARE * len(mine):
        return []
    return [s for n, s in scored if n == best]


def fragments(texts: Sequence[str], sources: Sequence[str]) -> list[str]:
    """The parts of texts (a line, a title after its "Label:" head) that copy part of a source sentence, at least
    MIN_QUOTE characters: another memory of the same source may hold the sentence cut short (a title)."""
    out: dict[str, None] = {}
    for text in texts:
        for line in text.splitlines():
            for part in (line.strip(), line.split(":", 1)[-1].strip()):
                if len(part) >= MIN_QUOTE and any(part in s for s in sources):
                    out[part] = None
    return list(out)


def cited_sentences(citations: Sequence[dict[str, Any]], events: Callable[[str, int], list[Any]]) -> list[str]:
    """The source sentences of citations ({session_id, seq, quote}); `events(session_id, seq)`: the payloads of
    that event (none when it is not there). A citation of an unknown session or without a quote adds nothing."""
    out: dict[str, None] = {}
    seen: set[tuple[str, int, str]] = set()
    for c in citations[:MAX_CITATIONS]:
        sid, seq, quote = c.get("session_id"), c.get("seq"), c.get("quote")
        if not isinstance(sid, str) or isinstance(seq, bool) or not isinstance(seq, int) or seq < 1 \
                or not isinstance(quote, str) or (sid, seq, quote) in seen:
            continue
        seen.add((sid, seq, quote))
        try:
            payloads = events(sid, seq)
        except UnknownSession:
            continue
        for p in payloads:
            out.update(dict.fromkeys(quoted(quote, p)))
    return list(out)
