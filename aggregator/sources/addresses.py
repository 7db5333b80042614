"""Which IP addresses an HTTP source may reach: public ones, in every spelling, plus the networks a manifest allows.

An IPv6 address can carry an IPv4 address that decides where packets go: IPv4-mapped (`::ffff:a.b.c.d`),
IPv4-translated (`::ffff:0:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`), 6to4
(`2002:AABB:CCDD::/48`), Teredo (server and inverted client in `2001::/32`) and ISATAP (`...:0:5efe:a.b.c.d`).
Every embedded IPv4 address must pass the IPv4 rules and the outer address the IPv6 rules. Python's
`is_global` alone is not enough: it calls NAT64, 6to4 and IPv4-compatible addresses global whatever they carry,
and (before 3.13) misses a few newer special-purpose blocks, listed here.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

__all__ = ["AddressPolicy", "embedded_ipv4"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
_COMPATIBLE = ipaddress.IPv6Network("::/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")
_TEREDO = ipaddress.IPv6Network("2001::/32")
_LOW32 = 0xFFFFFFFF

# The address *is* the IPv4 address it carries: only the IPv4 rules apply.
_IPV4_IN_IPV6 = (_MAPPED, _TRANSLATED, _COMPATIBLE)
# Tunnels and translators reach the IPv4 addresses they carry: those decide (IANA calls them "N/A" or global).
_TUNNELS = (_NAT64, _SIX_TO_FOUR, _TEREDO)

# Special-purpose blocks (IANA registries) that Python's is_global lets through on some versions.
_NOT_GLOBAL = tuple(ipaddress.ip_network(n) for n in (
    "64:ff9b:1::/48",   # local-use IPv4/IPv6 translation (RFC 8215): an operator's own NAT64, any IPv4 behind it
    "fec0::/10",        # site-local (deprecated, still routed inside sites)
    "3fff::/20",        # documentation (RFC 9637)
    "5f00::/16",        # SRv6 SIDs (RFC 9602)
    "100:0:0:1::/64",   # dummy prefix (RFC 9780)
    "100.64.0.0/10",    # shared address space (CGNAT)
    "192.0.0.0/24",     # IETF protocol assignments
    "198.18.0.0/15",    # benchmarking
))


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses `ip` carries, in any of the forms above; [] for a plain IPv6 address."""
    value = int(ip)
    if ip in _COMPATIBLE and value <= 1:
        return []  # :: and ::1 are IPv6's own unspecified and loopback addresses
    if any(ip in net for net in (*_IPV4_IN_IPV6, _NAT64)):
        return [ipaddress.IPv4Address(value & _LOW32)]
    if ip in _SIX_TO_FOUR:
        return [ipaddress.IPv4Address((value >> 80) & _LOW32)]
    if ip in _TEREDO:
        return [ipaddress.IPv4Address((value >> 64) & _LOW32), ipaddress.IPv4Address(~value & _LOW32)]
    if (value >> 32) & 0xFCFFFFFF == 0x5EFE:
        # ISATAP interface identifier (RFC 5214), u/g bits either way: on-link packets go to that IPv4 address.
        return [ipaddress.IPv4Address(value & _LOW32)]
    return []


def _public(ip: IPAddress) -> bool:
    """The rules for one address of its own family, ignoring what it may carry."""
    if ip.is_multicast or any(ip in net for net in _NOT_GLOBAL if net.version == ip.version):
        return False
    return ip.is_global or (isinstance(ip, ipaddress.IPv6Address) and any(ip in net for net in _TUNNELS))


class AddressPolicy:
    """Which addresses requests may reach: public ones, plus any private network the manifest allows."""

    def __init__(self, allow: bool | Sequence[str] = False) -> None:
        self.allow_all = allow is True
        self.networks: list[Network] = (
            [ipaddress.ip_network(n, strict=False) for n in allow] if isinstance(allow, (list, tuple)) else [])

    def allows(self, address: str) -> bool:
        """True if a connection to `address` (an IP literal, IPv6 zone allowed) may be made."""
        return self.refusal(address) is None

    def refusal(self, address: str) -> str | None:
        """Why `address` is refused (a short phrase for logs and manifest errors), or None if it is allowed."""
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return f"{address!r} is not an IP address"
        if self.allow_all:
            return None
        inner = embedded_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else []
        if inner and any(ip in net for net in _IPV4_IN_IPV6):
            # The address is the IPv4 address it spells: only the IPv4 rules (and IPv4 networks listed) apply.
            return None if self._passes(inner[0]) else f"{ip} is {inner[0]} ({_kind(inner[0])}), not a public address"
        if not self._passes(ip):
            return f"{ip} is {_kind(ip)}, not a public address"
        for carried in inner:
            if not self._passes(carried):
                return f"{ip} carries {carried} ({_kind(carried)}), not a public address"
        return None

    def _passes(self, ip: IPAddress) -> bool:
        """One address against its own family's rules or the listed networks, ignoring what it may carry."""
        return _public(ip) or any(ip in net for net in self.networks if net.version == ip.version)


def _kind(ip: IPAddress) -> str:
    for name in ("loopback", "link_local", "unspecified", "multicast", "private", "site_local"):
        if getattr(ip, f"is_{name}", False):
            return name.replace("_", "-")
    if any(ip in net for net in _NOT_GLOBAL if net.version == ip.version):
        return "special-purpose"
    return "reserved" if ip.is_reserved else "not globally reachable"
