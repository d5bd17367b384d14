"""Credentials: which secret goes to which hosts, in which header.

The vault is a JSON or TOML file that only the server user may read (it is
refused when its group or others have any access), or values taken from the
server's environment (`value_env`). Only the brain process and the egress
proxy read it; the hands never do. A file:

    {"credentials": {"example": {"value_env": "EXAMPLE_TOKEN",
                                 "hosts": ["api.example.com:443"],
                                 "header": "Authorization",
                                 "format": "Bearer {value}"}}}
"""

from __future__ import annotations

import json
import os
import re
import stat
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, VaultUnsafe
from .policy import split_hostport
from .redact import MIN_REDACT, key, patterns

__all__ = ["MIN_REDACT", "Credential", "Vault"]


@dataclass(frozen=True)
class Credential:
    """One secret and where it may go."""

    name: str
    value: str = field(repr=False)
    hosts: tuple[tuple[str, int], ...]
    header: str = "Authorization"
    format: str = "Bearer {value}"

    def header_value(self) -> str:
        return self.format.format(value=self.value)

    def matches(self, host: str, port: int) -> bool:
        return any(p == port and (h == host or (h.startswith("*.") and host.endswith(h[1:]))) for h, p in self.hosts)


class Vault:
    """Credentials by name, and a redactor for their values."""

    def __init__(self, credentials: dict[str, Credential] | None = None):
        self.credentials = dict(credentials or {})
        self._pattern: re.Pattern[str] | None = None
        self._names: dict[str, str] = {}  # key(spelling) -> credential name
        alts: dict[str, str] = {}  # pattern -> a text it matches
        for c in self.credentials.values():
            found = patterns(c.value)
            if len(c.header_value()) >= MIN_REDACT:
                found[re.escape(c.header_value())] = c.header_value()
            for p, text in found.items():
                alts.setdefault(p, text)
                self._names.setdefault(key(text), c.name)
        if alts:
            # longest first, so "Bearer abc" is masked whole before "abc"; no groups: they would cost 30x
            self._pattern = re.compile("|".join(sorted(alts, key=lambda p: -len(alts[p]))))

    @classmethod
    def load(cls, path: str | os.PathLike | None, environ: dict[str, str] | None = None) -> Vault:
        """Read a vault file; an empty path gives an empty vault."""
        if not path:
            return cls()
        p = Path(path)
        try:
            st = p.stat()
        except FileNotFoundError:
            raise ConfigError(f"the vault {p} does not exist; create it or unset WORKBENCH_VAULT") from None
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise VaultUnsafe(f"the vault {p} is readable by other users; run: chmod 600 {p}")
        text = p.read_text()
        try:
            data = tomllib.loads(text) if p.suffix == ".toml" else json.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"the vault {p} is not valid {'TOML' if p.suffix == '.toml' else 'JSON'}: {e}") from None
        return cls.from_dict(data, environ)

    @classmethod
    def from_dict(cls, data: dict[str, Any], environ: dict[str, str] | None = None) -> Vault:
        env = os.environ if environ is None else environ
        creds: dict[str, Credential] = {}
        for name, d in (data.get("credentials") or {}).items():
            if "value" in d:
                value = str(d["value"])
            elif d.get("value_env") in env:
                value = env[d["value_env"]]
            else:
                raise ConfigError(f"credential {name!r} needs a value or a value_env that is set in the server's environment")
            hosts = tuple(split_hostport(h) for h in d.get("hosts") or [])
            if not hosts:
                raise ConfigError(f"credential {name!r} names no hosts; add hosts = [\"host:port\", ...]")
            fmt = str(d.get("format", "Bearer {value}"))
            if "{value}" not in fmt:
                raise ConfigError(f"credential {name!r}: format must contain {{value}}")
            creds[name] = Credential(name, value, hosts, str(d.get("header", "Authorization")), fmt)
        return cls(creds)

    def get(self, name: str) -> Credential:
        if name not in self.credentials:
            known = ", ".join(sorted(self.credentials)) or "none"
            raise ConfigError(f"credential {name!r} is not in the vault (known: {known})")
        return self.credentials[name]

    def redact(self, text: str) -> str:
        """The text with every known secret value, and its simple encodings, replaced by `[secret NAME]`."""
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(lambda m: f"[secret {self._names.get(key(m.group()), 'credential')}]", text)
