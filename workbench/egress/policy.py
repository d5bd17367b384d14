"""Who may the hands reach: the host's egress settings and a session's policy.

Default deny. A session names the `host:port` pairs its kernel may reach (and
the credentials the proxy may add for them) in `config["egress"]`; the host
decides which non-public addresses may ever be reached (none by default), so
that kernel code cannot use the proxy to reach the Jupyter server, a
metadata service or anything else on the host's side of the sandbox.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError


@dataclass
class EgressSettings:
    """Host-level settings of the egress proxy and the credential vault."""

    vault: str = ""  # path of the credential vault (JSON or TOML, mode 0600); empty: no credentials
    egress_allow_private: str = ""  # comma-separated ip:port pairs that are not public but may be reached
    egress_connect_timeout: float = 10.0  # seconds to connect to an upstream host
    egress_ca_file: str = ""  # CA bundle the proxy trusts for TLS upstream (default: the system's)


def split_hostport(entry: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) as a normalised (host, port); raises ConfigError."""
    host, sep, port = entry.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"egress entry {entry!r} must be host:port, e.g. api.example.com:443")
    return normalise_host(host), int(port)


def normalise_host(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


def public(addr: str) -> bool:
    """Whether an address is globally routable (not loopback, private, link-local, metadata, ...)."""
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def address_kind(addr: str) -> str:
    """A word for a non-public address, for deny messages."""
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if str(ip) in ("169.254.169.254", "fd00:ec2::254"):
        return "cloud metadata"
    for kind in ("loopback", "link_local", "private", "multicast", "unspecified", "reserved"):
        if getattr(ip, f"is_{kind}"):
            return kind.replace("_", "-")
    return "non-public"


@dataclass
class EgressPolicy:
    """One session's egress rules: allowed host:port pairs, credentials by name, limits."""

    allow: list[tuple[str, int]] = field(default_factory=list)
    credentials: list[str] = field(default_factory=list)
    max_requests: int | None = None  # allowed requests per session, None: no limit
    private: set[tuple[str, int]] = field(default_factory=set)  # from the host's settings
    used: int = 0

    @classmethod
    def from_config(cls, config: dict[str, Any] | None, settings: EgressSettings | None = None) -> "EgressPolicy":
        """The policy of a session from its `config["egress"]` and the host's settings."""
        cfg = dict(config or {})
        unknown = set(cfg) - {"allow", "credentials", "max_requests"}
        if unknown:
            raise ConfigError(f"unknown egress settings: {', '.join(sorted(unknown))} (known: allow, credentials, max_requests)")
        allow, creds = cfg.get("allow") or [], cfg.get("credentials") or []
        if not isinstance(allow, list) or not isinstance(creds, list):
            raise ConfigError('egress "allow" and "credentials" must be lists of strings')
        limit = cfg.get("max_requests")
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise ConfigError('egress "max_requests" must be a non-negative integer')
        s = settings or EgressSettings()
        private = {split_hostport(e) for e in s.egress_allow_private.split(",") if e.strip()}
        return cls([split_hostport(e) for e in allow], [str(c) for c in creds], limit, private)

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
        return (normalise_host(addr), port) in self.private
