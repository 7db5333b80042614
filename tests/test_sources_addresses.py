"""AddressPolicy: which addresses an HTTP source may reach, for every IPv6 spelling that embeds an IPv4 address."""

from __future__ import annotations

import ipaddress
import socket

import anyio
import pytest

from aggregator.sources.http import AddressPolicy, _GuardedResolver, _Refused

# The embedded IPv4 addresses every form is tried with, and whether the IPv4 rules let each through.
IPV4 = {
    "loopback": ("127.0.0.1", False),
    "loopback-other": ("127.8.9.10", False),
    "private-10": ("10.1.2.3", False),
    "private-172": ("172.16.5.4", False),
    "private-192": ("192.168.1.1", False),
    "link-local": ("169.254.1.1", False),
    "metadata": ("169.254.169.254", False),
    "cgnat": ("100.64.0.1", False),
    "unspecified": ("0.0.0.0", False),
    "this-network": ("0.1.2.3", False),
    "benchmarking": ("198.18.0.1", False),
    "reserved": ("240.0.0.1", False),
    "broadcast": ("255.255.255.255", False),
    "multicast": ("224.0.0.1", False),
    "public": ("8.8.8.8", True),
    "public-2": ("93.184.216.34", True),
}


def _hex32(v4: str) -> str:
    value = int(ipaddress.IPv4Address(v4))
    return f"{value >> 16:x}:{value & 0xFFFF:x}"


def _teredo(client: str, server: str = "65.54.227.120") -> str:
    inverted = int(ipaddress.IPv4Address(client)) ^ 0xFFFFFFFF
    return f"2001:0:{_hex32(server)}:8000:63bf:{inverted >> 16:x}:{inverted & 0xFFFF:x}"


def _rfc6052_48(prefix: str, v4: str) -> str:
    a, b, c, d = ipaddress.IPv4Address(v4).packed
    return f"{prefix}:{a:02x}{b:02x}:{c:x}:{d:02x}00::"  # RFC 6052 with a /48 prefix: bits 64-71 stay zero


# Each form: how it spells an IPv4 address, and whether its outer IPv6 address is refused whatever it embeds.
FORMS = {
    "ipv4": (lambda v4: v4, False),
    "ipv4-mapped": (lambda v4: f"::ffff:{v4}", False),
    "ipv4-mapped-hex": (lambda v4: f"::ffff:{_hex32(v4)}", False),
    "ipv4-translated": (lambda v4: f"::ffff:0:{v4}", False),
    "ipv4-compatible": (lambda v4: f"::{v4}", False),
    "nat64-well-known": (lambda v4: f"64:ff9b::{v4}", False),
    "nat64-well-known-hex": (lambda v4: f"64:ff9b::{_hex32(v4)}", False),
    "nat64-local-use": (lambda v4: f"64:ff9b:1::{v4}", True),
    "nat64-local-use-48": (lambda v4: _rfc6052_48("64:ff9b:1", v4), True),
    "6to4": (lambda v4: f"2002:{_hex32(v4)}::1", False),
    "6to4-subnet": (lambda v4: f"2002:{_hex32(v4)}:beef:1:2:3:4", False),
    "teredo-client": (lambda v4: _teredo(v4), False),
    "teredo-server": (lambda v4: _teredo("8.8.4.4", server=v4), False),
    "isatap": (lambda v4: f"2606:4700:1:2::5efe:{v4}", False),
    "isatap-global-bit": (lambda v4: f"2606:4700:1:2:200:5efe:{v4}", False),
}

ROWS = [pytest.param(form(v4), public and not outer_refused, id=f"{name}-{kind}")
        for name, (form, outer_refused) in FORMS.items() for kind, (v4, public) in IPV4.items()]

IPV6 = [
    ("::1", False), ("::", False), ("fe80::1", False), ("fe80::1%2", False), ("fc00::1", False), ("fd00::2", False),
    ("fec0::1", False), ("ff02::1", False), ("ff0e::1", False), ("2001:db8::1", False), ("3fff::1", False),
    ("100::1", False), ("5f00::1", False), ("2001:10::1", False), ("2001:4860:4860::8888", True),
    ("2606:4700:4700::1111", True), ("2a00:1450:4001:80b::200e", True), ("not an address", False),
]


@pytest.mark.parametrize(("address", "allowed"), ROWS)
def test_embedded_ipv4_is_judged_by_the_ipv4_rules(address: str, allowed: bool) -> None:
    assert AddressPolicy().allows(address) is allowed


@pytest.mark.parametrize(("address", "allowed"), IPV6)
def test_ipv6_rules(address: str, allowed: bool) -> None:
    assert AddressPolicy().allows(address) is allowed


@pytest.mark.parametrize(("networks", "address", "allowed"), [
    (["127.0.0.1/32"], "127.0.0.1", True),
    (["127.0.0.1/32"], "::ffff:127.0.0.1", True),
    (["127.0.0.1/32"], "64:ff9b::7f00:1", True),  # the embedded address is the one listed
    (["127.0.0.1/32"], "2002:7f00:1::1", True),
    (["127.0.0.1/32"], "127.0.0.2", False),
    (["127.0.0.1/32"], "64:ff9b::7f00:2", False),
    (["127.0.0.1/32"], "::127.0.0.2", False),
    (["127.0.0.1/32"], _teredo("127.0.0.2"), False),
    (["127.0.0.1/32"], "::1", False),
    (["10.0.0.0/8"], "2002:a00:1::1", True),
    (["10.0.0.0/8"], "2002:7f00:1::1", False),
    (["10.0.0.0/8"], "2606:4700:1:2::5efe:10.1.1.1", True),
    (["10.0.0.0/8"], "2606:4700:1:2::5efe:192.168.1.1", False),
    (["::1/128"], "::1", True),
    (["::1/128"], "::ffff:127.0.0.1", False),
    (["64:ff9b:1::/48"], "64:ff9b:1::7f00:1", True),  # the operator's own translator, listed by name
    (["fd00::/8"], "fd00::2", True),
    (["fd00::/8"], "fe80::1", False),
], ids=lambda value: str(value))
def test_listed_networks(networks: list[str], address: str, allowed: bool) -> None:
    assert AddressPolicy(networks).allows(address) is allowed


@pytest.mark.parametrize("address", ["127.0.0.1", "64:ff9b::7f00:1", "2002:a9fe:a9fe::1", "ff02::1", "fe80::1"])
def test_allow_all_allows_everything(address: str) -> None:
    assert AddressPolicy(True).allows(address)


@pytest.mark.parametrize("address", ["64:ff9b::7f00:1", "::127.0.0.1", "2002:7f00:1::1", "::ffff:0:127.0.0.1",
                                     _teredo("127.0.0.1"), "2606:4700:1:2::5efe:169.254.169.254"])
def test_the_resolver_path_applies_the_same_rules(address: str) -> None:
    """What the system resolver answers goes through the policy too (getaddrinfo echoes a numeric host)."""

    async def main() -> None:
        resolver = _GuardedResolver(AddressPolicy())
        try:
            with pytest.raises(_Refused):
                await resolver.resolve(address, 80, socket.AF_INET6)
            allowed = _GuardedResolver(AddressPolicy(True))
            answers = await allowed.resolve(address, 80, socket.AF_INET6)
            assert [ipaddress.ip_address(info["host"]) for info in answers] == [ipaddress.ip_address(address)]
            await allowed.close()
        finally:
            await resolver.close()

    anyio.run(main)
