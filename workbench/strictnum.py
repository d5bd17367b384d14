"""Numbers from outside, bounded before they are parsed: one leaf every edge uses.

Python reads a decimal literal of any length as an int, slowly, and refuses one of over 4,300 digits with
a plain ValueError (`json.loads` raised it, not a JSONDecodeError, from a memory import: a 500); it reads a
float literal too big for a double as inf, JSON's NaN and Infinity as floats, and `int()` takes "1_000" and
other scripts' digits ("١٢"). Here a number is refused with NumberRefused (a ValueError whose one line names
the literal, shortened) before int() or float() sees it: an integer of more digits than any value kept
(the log keeps integers of 64 bits), a float literal longer than any double needs or too big for one,
NaN and Infinity, and text that is not plain ASCII.

- JSON: `json.loads(text, parse_int=parse_int, parse_float=parse_float, parse_constant=parse_constant)`.
- Text (an environment variable, a CLI argument): `number(text, int)`; `argument(int)` is argparse's `type=`.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import Any

MAX_INT_DIGITS = 20  # 2**64 - 1 has 20 digits
MAX_FLOAT_CHARS = 1000  # the exact decimal of the smallest double has 767 significant digits
INT_MIN, INT_MAX = -(2**63), 2**64 - 1  # what the log stores

_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


class NumberRefused(ValueError):
    """A number from outside that is not read: too long, not finite, or not plain ASCII."""


def shown(text: str, most: int = 24) -> str:
    """A literal as a message shows it: at most `most` characters, with how many there were."""
    return repr(text) if len(text) <= most else f"{text[:most]!r}... ({len(text):,} characters)"


def parse_int(text: str) -> int:
    """A JSON integer literal as an int; NumberRefused over MAX_INT_DIGITS digits."""
    digits = len(text) - (text[:1] in "+-")
    if digits > MAX_INT_DIGITS:
        raise NumberRefused(f"the integer {shown(text)} has {digits:,} digits; at most {MAX_INT_DIGITS} are read")
    return int(text)


def parse_float(text: str) -> float:
    """A JSON number literal with a fraction or exponent as a float; NumberRefused if too long or not finite."""
    if len(text) > MAX_FLOAT_CHARS:
        raise NumberRefused(f"the number {shown(text)} is longer than {MAX_FLOAT_CHARS:,} characters")
    value = float(text)
    if not math.isfinite(value):
        raise NumberRefused(f"the number {shown(text)} is too big for a double")
    return value


def parse_constant(name: str) -> Any:
    """JSON has no NaN or Infinity: json.loads takes them unless this refuses them."""
    raise NumberRefused(f"{name} is not a JSON number")


def number(text: str, kind: type[int] | type[float]) -> int | float:
    """A number given as text (spaces around it aside): plain ASCII digits, finite, an integer within 64 bits."""
    t = text.strip()
    if kind is int:
        if not _INT.fullmatch(t):
            raise NumberRefused(f"{shown(text)} is not an integer (plain ASCII digits, maybe a sign)")
        value = parse_int(t)
        if not INT_MIN <= value <= INT_MAX:
            raise NumberRefused(f"{shown(text)} is outside the integers of 64 bits")
        return value
    if not _FLOAT.fullmatch(t):
        raise NumberRefused(f"{shown(text)} is not a number (plain ASCII digits, a point, an exponent)")
    return parse_float(t)


def argument(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """argparse's `type=` for a number: a refusal says what is wrong, not the whole text it was given."""

    def parse(text: str) -> int | float:
        try:
            return number(text, kind)
        except NumberRefused as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = kind.__name__
    return parse
