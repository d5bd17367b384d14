"""Finding secrets in what would become a memory: the vault's own values, and likely secrets.

A memory reaches every later session's prompt and every later dream, so a
credential in one leaks everywhere. Two checks, each naming what it found and
never the value itself (the reason goes back to a model, into the log):

- the egress vault's values, in every spelling the vault masks (reversed, hex,
  URL-encoded, base64: workbench/egress/redact.py), through the vault's own
  redactor;
- detect-secrets' plugins: the detectors of known token formats (GitHub, AWS,
  Slack, Stripe, private keys, JWTs, passwords in URLs, `password = "..."`),
  with detect-secrets' own false-positive filters; its entropy plugins only
  look at quoted strings, so a bare word in prose is also tested with their
  entropy measure: a word of 20+ characters mixing upper case, lower case and
  digits above 4.5 bits a character, or a hex word of 32+ characters on a line
  that names a token, key, secret or password (a bare commit hash is not one).
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

# detect-secrets is imported where it is used: it takes a third of a second (more on a loaded machine), which
# every `workbench` command and server start would pay for, most of them never checking a memory

# entropy plugins at detect-secrets' defaults; IPPublicDetector flags any public address, which memories name freely
ENTROPY_LIMIT_BASE64 = 4.5
ENTROPY_LIMIT_HEX = 3.0
SKIPPED = frozenset({"IPPublicDetector"})
WORD = re.compile(r"[A-Za-z0-9+/=_\-.~]{20,}")
HEX_WORD = re.compile(r"\b[0-9a-fA-F]{32,}\b")
NAMES_A_SECRET = re.compile(r"token|secret|passw(or)?d|api[_-]?key|auth|bearer|credential", re.IGNORECASE)
MAX_SCAN_CHARS = 200_000  # the longest memory field is 10,000 characters; past this, what is scanned is cut

# detect-secrets keeps its settings in one global: scans take turns
_lock = threading.Lock()


@functools.cache
def _entropy() -> tuple[Any, Any]:
    """detect-secrets' base64 and hex entropy plugins, at our limits."""
    from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString, HexHighEntropyString

    return Base64HighEntropyString(limit=ENTROPY_LIMIT_BASE64), HexHighEntropyString(limit=ENTROPY_LIMIT_HEX)


def _plugins() -> list[dict[str, object]]:
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

    classes: list[type] = list(get_mapping_from_secret_type_to_class().values())
    names = sorted(c.__name__ for c in classes)
    out: list[dict[str, object]] = [{"name": n} for n in names if n not in SKIPPED]
    for p in out:
        if p["name"] == "Base64HighEntropyString":
            p["limit"] = ENTROPY_LIMIT_BASE64
        elif p["name"] == "HexHighEntropyString":
            p["limit"] = ENTROPY_LIMIT_HEX
    return out


def _lines(text: str) -> list[str]:
    return text[:MAX_SCAN_CHARS].splitlines()


def _detected(lines: list[str]) -> Iterator[tuple[int, str, str]]:
    """(line index, kind, value) of each likely secret detect-secrets' plugins and filters find in lines."""
    from detect_secrets.core.scan import _process_line_based_plugins
    from detect_secrets.filters.heuristic import is_sequential_string
    from detect_secrets.settings import default_settings, transient_settings

    base64, hex_ = _entropy()
    numbered = [(i + 1, line) for i, line in enumerate(lines)]
    with _lock, default_settings(), transient_settings({"plugins_used": _plugins()}):
        found = [(s.line_number - 1, s.type, s.secret_value or "") for s in _process_line_based_plugins(numbered, "memory")]
    yield from found
    for i, line in enumerate(lines):
        for m in WORD.finditer(line):
            word = m.group().strip("=.-_~")
            if (len(word) >= 20 and re.search("[a-z]", word) and re.search("[A-Z]", word) and re.search("[0-9]", word)
                    and not is_sequential_string(word) and base64.calculate_shannon_entropy(word) > ENTROPY_LIMIT_BASE64):
                yield i, "High Entropy String", word
        if NAMES_A_SECRET.search(line):
            for m in HEX_WORD.finditer(line):
                if hex_.calculate_shannon_entropy(m.group()) > ENTROPY_LIMIT_HEX:
                    yield i, "Hex High Entropy String", m.group()


class SecretScanner:
    """What in a text looks like a secret: the vault's values (through its redactor) and detect-secrets' findings."""

    def __init__(self, vault_redact: Callable[[str], str] | None = None):
        self.vault_redact = vault_redact

    def problems(self, text: str, what: str) -> list[str]:
        """One line per kind of secret found in text (empty: none), naming the kind, never the value."""
        return self.problems_of([(what, text)])

    def problems_of(self, fields: Iterable[tuple[str, str]]) -> list[str]:
        """The problems of many (what, text) fields, in their order, each line naming its field: one scan over
        the lines of every distinct text (detect-secrets costs milliseconds a call, and a text many fields hold,
        an actor or a session id, is read once, under the first field that holds it)."""
        first: dict[str, str] = {}
        for what, text in fields:
            first.setdefault(text, what)
        lines: list[str] = []
        owner: list[str] = []
        for text in first:
            for line in _lines(text):
                lines.append(line)
                owner.append(text)
        kinds: dict[str, set[str]] = {}
        for i, kind, _ in _detected(lines):
            kinds.setdefault(owner[i], set()).add(kind)
        out = []
        for text, what in first.items():
            if self.vault_redact is not None and (masked := self.vault_redact(text)) != text:
                names = sorted(set(re.findall(r"\[secret ([^\]]+)\]", masked))) or ["credential"]
                out.append(f"{what} holds the value of vault credential {', '.join(names)} (or an encoding of it)")
            if text in kinds:
                out.append(f"{what} holds what looks like a secret ({', '.join(sorted(kinds[text]))})")
        return out

    def values(self, text: str) -> list[str]:
        """The likely secrets detect-secrets finds in text, longest first (what a redaction scrubs besides the text)."""
        return sorted({v for _, _, v in _detected(_lines(text)) if len(v) >= 8}, key=lambda v: (-len(v), v))
