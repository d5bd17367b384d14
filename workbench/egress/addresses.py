"""Which addresses the egress proxy may connect to: public ones only.

An address is public when it is globally routable. IPv6 has several forms
that carry an IPv4 address inside them (mapped, compatible, SIIT, NAT64,
6to4, Teredo, ISATAP); connecting to one of them can reach the embedded IPv4
address (the host's own stack, a translator or a relay does it), so such an
address is public only if every IPv4 address it may embed is. Python's
`is_global` alone would call most of them global, and its answers differ
between Python versions, so the forms and the few ranges it misses are
spelled out here.
"""

from __future__ import annotations

import ipaddress
from ipaddress import IPv4Address, IPv6Address, IPv6Network
from types import MappingProxyType

Address = IPv4Address | IPv6Address

# Reachable only from inside a cloud, and what an SSRF goes for first (Azure's wireserver is a public address).
METADATA = frozenset(ipaddress.ip_address(a)
                     for a in ("169.254.169.254", "169.254.170.2", "100.100.100.200", "168.63.129.16", "fd00:ec2::254"))
NAT64 = IPv6Network("64:ff9b::/96")  # the well-known prefix: always /96
NAT64_LOCAL = IPv6Network("64:ff9b:1::/48")  # local use (RFC 8215): the operator picks a prefix length of 48 to 96
SIIT = IPv6Network("::ffff:0:0:0/96")  # IPv4-translated (RFC 2765)
COMPATIBLE = IPv6Network("::/96")  # IPv4-compatible (deprecated), less :: and ::1
SHARED = ipaddress.IPv4Network("100.64.0.0/10")  # carrier-grade NAT
FORMS = MappingProxyType({
    "IPv4-mapped": "an IPv4-mapped", "IPv4-compatible": "an IPv4-compatible", "SIIT": "a SIIT (IPv4-translated)",
    "NAT64": "a NAT64", "6to4": "a 6to4", "Teredo": "a Teredo", "ISATAP": "an ISATAP",
})  # fmt: skip
# In this order: the first that applies names the address in a deny message.
KINDS = (
    ("loopback", "a loopback"), ("link_local", "a link-local"), ("unspecified", "an unspecified"),
    ("multicast", "a multicast"), ("site_local", "a site-local"), ("reserved", "a reserved"), ("private", "a private"),
)  # fmt: skip
# Not globally reachable, but some Python versions call them global.
V6_NOT_GLOBAL = MappingProxyType({
    IPv6Network("fec0::/10"): "site-local",
    IPv6Network("3fff::/20"): "documentation",
    IPv6Network("5f00::/16"): "SRv6 segment identifier",
})


def classify(addr: str | Address) -> str | None:
    """None when `addr` is public; else why not, e.g. `a loopback address`."""
    ip = parse(addr)
    if isinstance(ip, IPv6Address):
        form, inner = embedded(ip)
        for v4 in inner:
            why = _plain(v4)
            if why is not None:
                return f"{FORMS[form]} address embedding {v4}, {why}"
        # these ranges exist only to carry IPv4: their embedded addresses decide; ISATAP's prefix counts too
        return None if form and form != "ISATAP" else _plain(ip)
    return _plain(ip)


def parse(addr: str | Address) -> Address:
    """An address without its zone id (`fe80::1%eth0` is fe80::1); raises ValueError."""
    if isinstance(addr, (IPv4Address, IPv6Address)):
        return addr
    return ipaddress.ip_address(addr.partition("%")[0])


def embedded(ip: IPv6Address) -> tuple[str, list[IPv4Address]]:
    """The IPv4 addresses an IPv6 address may carry, with the name of its form ("" if none)."""
    n = int(ip)
    if ip.ipv4_mapped is not None:
        return "IPv4-mapped", [ip.ipv4_mapped]
    if ip in COMPATIBLE and n > 1:
        return "IPv4-compatible", [IPv4Address(n)]
    if ip in SIIT:
        return "SIIT", [IPv4Address(n & 0xFFFFFFFF)]
    if ip in NAT64:
        return "NAT64", [IPv4Address(n & 0xFFFFFFFF)]
    if ip in NAT64_LOCAL:
        # the prefix length is the operator's choice, so every place RFC 6052 allows is a candidate
        return "NAT64", [_rfc6052(n, length) for length in (96, 64, 56, 48)]
    if ip.sixtofour is not None:
        return "6to4", [ip.sixtofour]
    if ip.teredo is not None:
        return "Teredo", list(ip.teredo)  # (server, client), the client already de-obfuscated
    if (n >> 32) & 0xFCFFFFFF == 0x00005EFE:  # ISATAP interface id, any u/g bits
        return "ISATAP", [IPv4Address(n & 0xFFFFFFFF)]
    return "", []


def _rfc6052(n: int, length: int) -> IPv4Address:
    """The IPv4 address at the place RFC 6052 puts it for a prefix of `length` bits."""
    if length == 96:
        return IPv4Address(n & 0xFFFFFFFF)
    without_u = ((n >> 64) << 56) | (n & ((1 << 56) - 1))  # bits 64-71 (the "u" octet) are never part of it
    return IPv4Address((without_u >> (88 - length)) & 0xFFFFFFFF)


def _plain(ip: Address) -> str | None:
    """Why an address is not public, judged on its own (no embedded address); None if it is."""
    if ip in METADATA:
        return "a cloud metadata address"
    for kind, phrase in KINDS:
        if getattr(ip, f"is_{kind}", False):
            return f"{phrase} address"
    if isinstance(ip, IPv6Address):
        for net, kind in V6_NOT_GLOBAL.items():
            if ip in net:
                return f"a {kind} address"
    elif ip in SHARED:
        return "a shared (carrier-grade NAT) address"
    if not ip.is_global:
        return "a non-public address"
    return None
