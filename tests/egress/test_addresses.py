"""Address classification: every IPv6 form that carries IPv4 is judged by what it carries."""

from __future__ import annotations

import socket
from ipaddress import IPv6Address

import pytest

from workbench.egress import EgressPolicy, EgressSettings
from workbench.egress.addresses import _rfc6052, classify, embedded
from workbench.errors import ConfigError


def teredo(server: str, client: str, port: int = 40000) -> str:
    """A Teredo address as RFC 4380 builds it: server, flags, then port and client XORed with ones."""
    s, c = (int.from_bytes(socket.inet_aton(a), "big") for a in (server, client))
    n = (0x20010000 << 96) | (s << 64) | (0x8000 << 48) | ((port ^ 0xFFFF) << 32) | (c ^ 0xFFFFFFFF)
    return str(IPv6Address(n))


def rfc6052(prefix: str, length: int, v4: str) -> str:
    """An IPv4 address embedded under `prefix`/`length` the way RFC 6052 section 2.2 lays it out."""
    p, a = int(IPv6Address(prefix)), int.from_bytes(socket.inet_aton(v4), "big")
    if length == 96:
        return str(IPv6Address(p | a))
    bits = (p >> (128 - length) << 32 | a) << (120 - length - 32)  # 120 bits: everything but the u octet
    return str(IPv6Address((bits >> 56) << 64 | (bits & ((1 << 56) - 1))))


NOT_PUBLIC = {
    # form: (address, what the deny message must name)
    "mapped": ("::ffff:127.0.0.1", "IPv4-mapped address embedding 127.0.0.1, a loopback"),
    "compatible": ("::127.0.0.1", "IPv4-compatible address embedding 127.0.0.1, a loopback"),
    "compatible private": ("::10.0.0.1", "embedding 10.0.0.1, a private"),
    "SIIT": ("::ffff:0:7f00:1", "SIIT (IPv4-translated) address embedding 127.0.0.1, a loopback"),
    "SIIT metadata": ("::ffff:0:a9fe:a9fe", "embedding 169.254.169.254, a cloud metadata"),
    "NAT64": ("64:ff9b::7f00:1", "NAT64 address embedding 127.0.0.1, a loopback"),
    "NAT64 metadata": ("64:ff9b::169.254.169.254", "embedding 169.254.169.254, a cloud metadata"),
    "NAT64 local /96": ("64:ff9b:1::10.1.2.3", "NAT64 address embedding 10.1.2.3, a private"),
    "NAT64 local /48": (rfc6052("64:ff9b:1::", 48, "127.0.0.1"), "NAT64 address embedding"),
    "NAT64 local /56": (rfc6052("64:ff9b:1::", 56, "192.168.1.1"), "NAT64 address embedding"),
    "NAT64 local /64": (rfc6052("64:ff9b:1::", 64, "10.0.0.1"), "NAT64 address embedding"),
    "6to4": ("2002:7f00:1::1", "6to4 address embedding 127.0.0.1, a loopback"),
    "6to4 private": ("2002:c0a8:101::", "embedding 192.168.1.1, a private"),
    "Teredo server": (teredo("127.0.0.1", "8.8.8.8"), "Teredo address embedding 127.0.0.1, a loopback"),
    "Teredo client": (teredo("8.8.8.8", "10.9.8.7"), "Teredo address embedding 10.9.8.7, a private"),
    "ISATAP": ("2001:4860:0:1:200:5efe:a00:1", "ISATAP address embedding 10.0.0.1, a private"),
    "ISATAP link-local": ("fe80::5efe:808:808", "a link-local"),
    "site-local": ("fec0::1", "a site-local address"),
    "site-local high": ("feff:ffff::1", "a site-local address"),
    "zone id": ("fe80::1%eth0", "a link-local address"),
    "zone id on a mapped form": ("::ffff:10.0.0.1%lo", "embedding 10.0.0.1, a private"),
    "loopback v6": ("::1", "a loopback address"),
    "unspecified v6": ("::", "an unspecified address"),
    "unspecified v4": ("0.0.0.0", "an unspecified address"),
    "metadata": ("169.254.169.254", "a cloud metadata address"),
    "metadata v6": ("fd00:ec2::254", "a cloud metadata address"),
    "carrier-grade NAT": ("100.64.0.1", "a shared (carrier-grade NAT) address"),
    "multicast v4": ("224.0.0.1", "a multicast address"),
    "multicast v6": ("ff02::1", "a multicast address"),
    "documentation v6": ("3fff::1", "a documentation address"),
}
PUBLIC = {
    "v4": "8.8.8.8",
    "v6": "2606:4700:4700::1111",
    "mapped": "::ffff:8.8.8.8",
    "NAT64": "64:ff9b::8.8.8.8",
    "6to4": "2002:808:808::1",
    "Teredo": teredo("8.8.4.4", "8.8.8.8"),
    "SIIT": "::ffff:0:808:808",
    "ISATAP": "2001:4860:0:1:200:5efe:808:808",
}


@pytest.mark.parametrize("form", NOT_PUBLIC)
def test_non_public_forms_name_their_kind(form):
    addr, why = NOT_PUBLIC[form]
    got = classify(addr)
    assert got is not None and why in got, (addr, got)


@pytest.mark.parametrize("form", PUBLIC)
def test_a_form_carrying_a_public_address_is_public(form):
    assert classify(PUBLIC[form]) is None


def test_rfc6052_positions_match_the_rfc_examples():
    """RFC 6052 section 2.4: 192.0.2.33 under 2001:db8:122:344::/N, at each prefix length."""
    examples = {32: "2001:db8:c000:221::", 40: "2001:db8:1c0:2:21::", 48: "2001:db8:122:c000:2:2100::",
                56: "2001:db8:122:3c0:0:221::", 64: "2001:db8:122:344:c0:2:2100:0", 96: "2001:db8:122:344::c000:221"}  # fmt: skip
    for length, addr in examples.items():
        assert str(_rfc6052(int(IPv6Address(addr)), length)) == "192.0.2.33"
        assert rfc6052("2001:db8:122:344::", length, "192.0.2.33") == str(IPv6Address(addr))


def test_local_nat64_is_judged_at_every_place_an_address_can_be():
    """The local-use prefix length is unknown, so one non-public candidate is enough to refuse."""
    form, candidates = embedded(IPv6Address(rfc6052("64:ff9b:1::", 48, "8.8.8.8")))
    assert form == "NAT64" and "8.8.8.8" in map(str, candidates) and len(candidates) == 4
    assert classify(rfc6052("64:ff9b:1::", 48, "8.8.8.8")) is not None


def test_obfuscated_teredo_client_is_decoded():
    _, (server, client) = embedded(IPv6Address(teredo("65.54.227.120", "192.0.2.45")))
    assert (str(server), str(client)) == ("65.54.227.120", "192.0.2.45")


@pytest.mark.parametrize("spelling", ["2130706433", "0x7f000001", "0177.0.0.1", "127.1", "0x7f.1", "127.0.1", "0177.1"])
def test_resolver_spellings_of_ipv4_end_up_as_loopback(spelling):
    """The proxy classifies what the resolver returns, so every spelling it accepts is judged as 127.0.0.1."""
    infos = socket.getaddrinfo(spelling, 80, type=socket.SOCK_STREAM)
    assert {i[4][0] for i in infos} == {"127.0.0.1"}
    assert classify(infos[0][4][0]) == "a loopback address"


def test_garbage_is_a_value_error():
    for bad in ("", "not an address", "1.2.3.4.5", "::ffff::1", "%eth0", "\udcff"):
        with pytest.raises(ValueError):
            classify(bad)


def test_private_exceptions_are_addresses_and_match_every_spelling():
    s = EgressSettings(egress_allow_private="127.0.0.1:8080, [::1]:9090")
    p = EgressPolicy.from_config({}, s)
    assert p.private_ok("127.0.0.1", 8080) and p.private_ok("::ffff:127.0.0.1", 8080) and p.private_ok("0:0::1", 9090)
    assert not p.private_ok("127.0.0.1", 8081) and not p.private_ok("::127.0.0.1", 8080)
    with pytest.raises(ConfigError, match="must be an ip:port pair"):
        EgressSettings(egress_allow_private="localhost:8080")
    with pytest.raises(ConfigError, match="must be host:port"):
        EgressSettings(egress_allow_private="127.0.0.1")


@pytest.mark.parametrize("field", ["egress_max_connections", "egress_head_timeout", "egress_idle_timeout",
                                   "egress_denied_per_second", "egress_connect_timeout"])  # fmt: skip
@pytest.mark.parametrize("value", [0, -1, "5", True, None])
def test_budgets_must_be_positive_numbers(field, value):
    with pytest.raises(ConfigError, match=f"{field} must be a number above 0"):
        EgressSettings(**{field: value})


@pytest.mark.parametrize("config", [{"allow": [443]}, {"allow": "a:1"}, {"credentials": [{"x": 1}]},
                                    {"allow": ["a"]}, {"max_requests": -1}, {"max_requests": "3"}, {"max_requests": True}, {"other": 1}])  # fmt: skip
def test_malformed_session_policy_is_a_config_error(config):
    with pytest.raises(ConfigError):
        EgressPolicy.from_config(config)
