"""Settings and numbers for plugins: a settings dataclass read from the environment, strict numbers (no NaN,
no infinities, no bools), the egress settings and secret vault, and model prices."""

from __future__ import annotations

from ..config import from_env
from ..egress import EgressSettings, Vault
from ..strictnum import NumberRefused, argument, number, parse_constant, parse_float, parse_int
from ..usage import Prices

__all__ = ["EgressSettings", "NumberRefused", "Prices", "Vault", "argument", "from_env", "number", "parse_constant",
           "parse_float", "parse_int"]
