"""Vault.redact masks a secret's value and its simple encodings, and leaves ordinary text alone."""

from __future__ import annotations

import base64
import concurrent.futures
import random
import string
from urllib.parse import quote, quote_plus

import pytest

from workbench.egress import Vault
from workbench.egress.redact import MIN_REDACT, patterns

SECRET = "sk-live+Tok/en=42?&x y~"  # reserved URL characters, a space, base64 characters that differ by alphabet
RAW = SECRET.encode()


@pytest.fixture
def vault() -> Vault:
    return Vault.from_dict({"credentials": {"api": {"value": SECRET, "hosts": ["api.example.com:443"]}}})


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


ENCODINGS = {
    "literal": SECRET,
    "reversed": SECRET[::-1],
    "hex": RAW.hex(),
    "HEX": RAW.hex().upper(),
    "Hex mixed in a line": "digest=" + RAW.hex()[:10] + RAW.hex()[10:].upper(),
    "base64": b64(RAW),
    "base64 unpadded": b64(RAW).rstrip("="),
    "base64url": base64.urlsafe_b64encode(RAW).decode(),
    "base64url unpadded": base64.urlsafe_b64encode(RAW).decode().rstrip("="),
    "base64 at offset 1": b64(b"x" + RAW + b"tail"),
    "base64 at offset 2": b64(b"Bearer " + RAW),  # 7 bytes before: offset 1; see the parametrized test below
    "base64url inside JSON": base64.urlsafe_b64encode(b'{"token": "' + RAW + b'"}').decode(),
    "url-encoded": quote(SECRET, safe=""),
    "url-encoded keeping /": quote(SECRET),
    "url-encoded lower-case escapes": quote(SECRET, safe="").replace("%2B", "%2b").replace("%2F", "%2f"),
    "form-encoded": quote_plus(SECRET),
    "form-encoded, nothing safe": quote_plus(SECRET, safe=""),
}


@pytest.mark.parametrize("name", ENCODINGS)
def test_each_encoding_is_masked(vault, name):
    text = f"echoed back: {ENCODINGS[name]} (end)"
    out = vault.redact(text)
    assert "[secret api]" in out, (name, out)
    assert ENCODINGS[name] not in out


@pytest.mark.parametrize("before", range(0, 9))
@pytest.mark.parametrize("after", range(0, 4))
@pytest.mark.parametrize("urlsafe", [False, True])
def test_base64_inside_longer_data_at_every_alignment(vault, before, after, urlsafe):
    """Whatever precedes and follows the value, its base64 leaves at most a character or two at each end."""
    encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    text = encode(bytes(range(1, before + 1)) + RAW + b"\xff" * after).decode()
    out = vault.redact(text)
    assert "[secret api]" in out
    head, _, tail = out.partition("[secret api]")
    assert len(head) <= -(-before * 4 // 3) and len(tail) <= -(-after * 4 // 3) + 4, (before, after, out)


def test_the_header_value_is_masked_whole(vault):
    assert vault.redact(f"Authorization: Bearer {SECRET}") == "Authorization: [secret api]"


def test_short_values_and_ordinary_words_are_left_alone():
    v = Vault.from_dict({"credentials": {
        "short": {"value": "abc12", "hosts": ["a.example:443"]},
        "word": {"value": "password", "hosts": ["b.example:443"]},
    }})  # fmt: skip
    text = "abc12 is short; 616263 3231 YWJj cba21; the password field; passwo; drowssap"
    out = v.redact(text)
    assert "abc12" in out and "616263" in out and "cba21" in out and "passwo;" in out
    assert out.count("[secret word]") == 2  # the word itself and its reverse, nothing else
    assert all(len(s) >= MIN_REDACT for s in patterns("password").values()) and patterns("abc12") == {}


def test_hostile_text(vault):
    """Surrogates from undecodable output, megabytes, and adjacent or overlapping copies."""
    assert vault.redact("\udcff\udcfe" + SECRET + "\udcff") == "\udcff\udcfe[secret api]\udcff"
    big = ("x" * 999_983) + RAW.hex() + "y" * 1000
    assert vault.redact(big).count("[secret api]") == 1
    assert vault.redact(SECRET * 3) == "[secret api]" * 3
    assert vault.redact(SECRET[:-1] + SECRET) == SECRET[:-1] + "[secret api]"
    assert vault.redact("") == "" and Vault().redact(SECRET) == SECRET


def test_redaction_is_the_same_from_many_threads(vault):
    rnd = random.Random(7)
    texts = ["".join(rnd.choice(string.printable) for _ in range(2000)) + enc for enc in ENCODINGS.values()] * 20
    expected = [vault.redact(t) for t in texts]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(vault.redact, texts)) == expected


def test_two_credentials_one_inside_the_other():
    inner, outer = "tok-123456", "tok-123456-extended"
    v = Vault.from_dict({"credentials": {
        "inner": {"value": inner, "hosts": ["a.example:443"]},
        "outer": {"value": outer, "hosts": ["b.example:443"]},
    }})  # fmt: skip
    assert v.redact(f"{outer} {inner} {b64(outer.encode())}") == "[secret outer] [secret inner] [secret outer]"
