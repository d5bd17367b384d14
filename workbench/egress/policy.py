"""Who may the hands reach: the host's egress settings and a session's policy.

Default deny. A session names the `host:port` pairs its kernel may reach (and
the credentials the proxy may add for them) in `config["egress"]`; the host
decides which non-public addresses may ever be reached (none by default), so
that kernel code cannot use the proxy to reach the Jupyter server, a
metadata service or anything else on the host's side of the sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from ipaddress import IPv6Address
from typing import Any

from ..errors import ConfigError
from .addresses import Address, parse


@dataclass
class EgressSettings:
    """Host-level settings of the egress proxy and the credential vault."""

    vault: str = ""  # path of the credential vault (JSON or TOML, mode 0600); empty: no credentials
    egress_allow_private: str = ""  # comma-separated ip:port pairs that are not public but may be reached
    egress_connect_timeout: float = 10.0  # seconds to connect to an upstream host
    egress_ca_file: str = ""  # CA bundle the proxy trusts for TLS upstream (default: the system's)
    egress_max_connections: int = 32  # connections open at once per session; the excess is refused at once
    egress_head_timeout: float = 30.0  # seconds a connection has to send its request line and headers
    egress_idle_timeout: float = 300.0  # seconds a tunnel or request may move no byte either way before it is closed
    egress_denied_per_second: int = 10  # egress_denied events per second per session; the rest are counted

    def __post_init__(self) -> None:
        for name in ("egress_connect_timeout", "egress_max_connections", "egress_head_timeout", "egress_idle_timeout",
                     "egress_denied_per_second"):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"{name} must be a number above 0, not {value!r} (WORKBENCH_{name.upper()})")
        self.private = private_addresses(self.egress_allow_private)


def private_addresses(spec: str) -> set[tuple[Address, int]]:
    """`egress_allow_private` as (address, port) pairs; raises ConfigError on a name or a malformed entry."""
    out = set()
    for entry in spec.split(","):
        if not entry.strip():
            continue
        host, port = split_hostport(entry)
        try:
            out.add((canonical(host), port))
        except ValueError:
            raise ConfigError(f"egress_allow_private entry {entry.strip()!r} must be an ip:port pair, "
                              "e.g. 127.0.0.1:8080 or [::1]:8080") from None
    return out


def canonical(addr: str | Address) -> Address:
    """An address as the proxy compares it: no zone id, an IPv4-mapped IPv6 address as its IPv4 address."""
    ip = parse(addr)
    return ip.ipv4_mapped or ip if isinstance(ip, IPv6Address) else ip


def split_hostport(entry: str, what: str = "egress entry", example: str = "api.example.com:443",
                   any_port: bool = False) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) as a normalised (host, port); port 0 only where `any_port` (a free one to
    listen on); raises ConfigError naming `what`."""
    host, sep, port = entry.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not (0 if any_port else 1) <= int(port) < 65536:
        raise ConfigError(f"{what} {entry!r} must be host:port, e.g. {example}")
    return normalise_host(host), int(port)


def normalise_host(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


@dataclass
class EgressPolicy:
    """One session's egress rules: allowed host:port pairs, credentials by name, limits."""

    allow: list[tuple[str, int]] = field(default_factory=list)
    credentials: list[str] = field(default_factory=list)
    max_requests: int | None = None  # allowed requests per session, None: no limit
    private: set[tuple[Address, int]] = field(default_factory=set)  # from the host's settings
    used: int = 0

    @classmethod
    def from_config(cls, config: dict[str, Any] | None, settings: EgressSettings | None = None) -> EgressPolicy:
        """The policy of a session from its `config["egress"]` and the host's settings."""
        cfg = dict(config or {})
        unknown = set(cfg) - {"allow", "credentials", "max_requests"}
        if unknown:
            raise ConfigError(f"unknown egress settings: {', '.join(sorted(unknown))} (known: allow, credentials, max_requests)")
        allow, creds = cfg.get("allow") or [], cfg.get("credentials") or []
        if not isinstance(allow, list) or not isinstance(creds, list):
            raise ConfigError('egress "allow" and "credentials" must be lists of strings')
        limit = cfg.get("max_requests")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
            raise ConfigError('egress "max_requests" must be a non-negative integer')
        if not all(isinstance(e, str) for e in [*allow, *creds]):
            raise ConfigError('egress "allow" and "credentials" must be lists of strings')
        s = settings or EgressSettings()
        return cls([split_hostport(e) for e in allow], creds, limit, set(s.private))

    def allows(self, host: str, port: int) -> bool:
        """Whether host:port is on the allowlist (`*.example.com` matches subdomains)."""
        for h, p in self.allow:
            if p != port:
                continue
            if h == host or (h.startswith("*.") and host.endswith(h[1:])):
                return True
        return False

    def private_ok(self, addr: str, port: int) -> bool:
        """Whether a non-public address was explicitly allowed by the host's settings."""
        return (canonical(addr), port) in self.private
