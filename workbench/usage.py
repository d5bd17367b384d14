"""Tokens and estimated cost, from the usage every `assistant_turn` logs, priced by one configurable table.

The price table is the host setting `prices` (WORKBENCH_PRICES): `NAME=IN/OUT,...` in dollars per
million input / output tokens, NAME exact or a prefix ending in `*`. Evals price attempts with the
same table unless their own `eval` setting gives one. A model the table does not name costs nothing
here and is reported as unpriced, never guessed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


@dataclass(frozen=True)
class Prices:
    """A price table: model name (or prefix ending in `*`) -> (input, output) dollars per million tokens."""

    table: Mapping[str, tuple[float, float]]

    @classmethod
    def parse(cls, text: str) -> Prices:
        """`NAME=IN/OUT,...` (dollars per million input / output tokens); ConfigError for a malformed entry."""
        table: dict[str, tuple[float, float]] = {}
        for entry in (e.strip() for e in (text or "").split(",")):
            if not entry:
                continue
            name, _, rate = entry.partition("=")
            i, _, o = rate.partition("/")
            try:
                pin, pout = float(i), float(o)
            except ValueError:
                pin = pout = math.nan
            if not name.strip() or not (math.isfinite(pin) and math.isfinite(pout)) or pin < 0 or pout < 0:
                raise ConfigError(f"price {entry[:80]!r} must be NAME=INPUT/OUTPUT in dollars per million tokens, "
                                  "e.g. claude-opus-5-5=5/25")
            table[name.strip()] = (pin, pout)
        return cls(table)

    def priced(self, model: str) -> bool:
        """Whether the table names this model (exactly or by a prefix)."""
        return model in self.table or any(k.endswith("*") and model.startswith(k[:-1]) for k in self.table)

    def rate(self, model: str) -> tuple[float, float]:
        if model in self.table:
            return self.table[model]
        prefixes = sorted((k for k in self.table if k.endswith("*") and model.startswith(k[:-1])), key=len, reverse=True)
        return self.table[prefixes[0]] if prefixes else (0.0, 0.0)

    def __call__(self, model: str, input_tokens: int, output_tokens: int) -> float:
        """Estimated dollars for these tokens (0 for a model the table does not name)."""
        pin, pout = self.rate(model)
        return (input_tokens * pin + output_tokens * pout) / 1e6


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _zero() -> dict[str, Any]:
    return {**dict.fromkeys(TOKEN_FIELDS, 0), "calls": 0, "cost": 0.0}


def _add(into: dict[str, Any], usage: Mapping[str, Any], model: str, prices: Prices) -> None:
    for f in TOKEN_FIELDS:
        into[f] += _count(usage.get(f))
    into["calls"] += 1
    # cache reads and writes are input tokens too; the table has one input rate
    ins = sum(_count(usage.get(f)) for f in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
    into["cost"] += prices(model, ins, _count(usage.get("output_tokens")))


def session_usage(events: Iterable[Any], prices: Prices, model: str | None = None) -> dict[str, Any]:
    """{"turns": [{"seq": the user_message's, tokens..., calls, cost}], "total": {...}, "priced": bool}.

    A turn is what follows a user_message (model calls before the first one count as turn seq 0).
    The model is each call's own (`message.model`), else the session's.
    """
    turns: list[dict[str, Any]] = []
    total = _zero()
    current: dict[str, Any] | None = None
    priced = True
    for e in events:
        if e.type == "session_created" and model is None:
            model = e.payload.get("model") if isinstance(e.payload.get("model"), str) else None
        elif e.type == "user_message":
            current = {"seq": e.seq, **_zero()}
            turns.append(current)
        elif e.type == "assistant_turn":
            message = e.payload.get("message") if isinstance(e.payload.get("message"), dict) else {}
            usage = e.payload.get("usage") or message.get("usage") or {}
            if not isinstance(usage, dict):
                continue
            given = message.get("model")
            name: str = given if isinstance(given, str) else (model or "")
            priced = priced and prices.priced(name)
            if current is None:
                current = {"seq": 0, **_zero()}
                turns.append(current)
            _add(current, usage, name, prices)
            _add(total, usage, name, prices)
    for row in [*turns, total]:
        row["cost"] = round(row["cost"], 6)
    return {"turns": turns, "total": total, "priced": priced}


def describe(total: Mapping[str, Any], priced: bool) -> str:
    """A session's use on one line: tokens in and out, and the cost when the table prices its model."""
    ins = sum(_count(total.get(f)) for f in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
    cost = f"${total.get('cost', 0):.4f}" if priced else "cost unknown (no price: setting prices)"
    return f"{ins:,} tokens in, {_count(total.get('output_tokens')):,} out, {_count(total.get('calls'))} model calls, {cost}"
