"""The spellings of a secret that redaction masks, besides the secret itself.

Kernel code never holds a credential, but an allowlisted host that echoes
headers hands one back, and code can re-encode it before printing it. So
besides the literal value we mask the simple encodings: reversed, hex (any
case), URL-encoded (escapes in any case, `+` or `%20` for a space), and
base64 (standard and URL-safe alphabets, padded or not, and inside longer
base64 text, where the value can start at any of three byte offsets). A
base64 spelling inside longer data is only the characters the value alone
decides; the one or two at each end also carry neighbouring bytes, so they
stay visible (at most 12 bits of the value).
"""

from __future__ import annotations

import base64
import re
from urllib.parse import quote, quote_plus

# Shorter values (and shorter spellings) would mask ordinary words in every observation.
MIN_REDACT = 6
_URLSAFE = str.maketrans("+/", "-_")


def patterns(value: str) -> dict[str, str]:
    """Regular expressions for every spelling of `value` (itself included), each with one text it matches."""
    if len(value) < MIN_REDACT:
        return {}
    raw = value.encode()
    exact = {value, value[::-1]}
    whole = base64.b64encode(raw).decode()
    for b64 in (whole, whole.rstrip("="), *(_base64_core(raw, offset) for offset in range(3))):
        exact |= {b64, b64.translate(_URLSAFE)}
    out = {re.escape(s): s for s in exact}
    out[_any_case(raw.hex(), _HEX)] = raw.hex()
    for q in {quote(value, safe=""), quote(value), quote_plus(value, safe=""), quote_plus(value)}:
        out[_any_case(q, _ESCAPED)] = q
    return {p: s for p, s in out.items() if len(s) >= MIN_REDACT}


def key(text: str) -> str:
    """What every text one pattern matches has in common: escapes in upper case, hex in lower case."""
    text = _PERCENT.sub(lambda m: m.group().upper(), text)
    return text.lower() if _ALL_HEX.fullmatch(text) else text


_HEX = re.compile("[a-f]")
_ESCAPED = re.compile("(?<=%)[A-F]|(?<=%[0-9A-F])[A-F]")
_PERCENT = re.compile("%[0-9a-fA-F]{2}")
_ALL_HEX = re.compile("[0-9a-fA-F]+")


def _any_case(text: str, letters: re.Pattern[str]) -> str:
    """`text` as a pattern in which the characters `letters` finds match in either case."""
    out, at = [], 0
    for m in letters.finditer(text):
        out += [re.escape(text[at : m.start()]), f"[{m.group().lower()}{m.group().upper()}]"]
        at = m.end()
    return "".join(out) + re.escape(text[at:])


def _base64_core(raw: bytes, offset: int) -> str:
    """The base64 characters fixed by `raw` alone when it starts `offset` bytes into the encoded data."""
    text = base64.b64encode(bytes(offset) + raw).decode()
    first = -(-offset * 8 // 6)  # the first 6-bit group that holds no bit of the bytes before
    last = (offset + len(raw)) * 8 // 6  # past the last group that holds no bit of the bytes after
    return text[first:last]
