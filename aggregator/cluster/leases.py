"""Poll leases and interests: one replica polls each remote source, over what every replica's subscribers want.

The holder keeps the versions it last saw in Redis too: a replica that takes the lease over compares with them, so
a change made while the old holder was dying is still seen. A lease is a key holding its holder's replica id with an expiry of a few poll intervals: taken with SET NX PX,
renewed only by its holder (one Lua script, so a lease that expired and was taken by another is never extended),
and lost by a replica that stops renewing it. Interests are one set per replica and source with the same kind of
expiry, so a replica that went away stops being polled for.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection, Mapping

import anyio

from aggregator.cluster.link import RedisLink
from aggregator.cluster.seal import Unsealed
from aggregator.paths import UnsafePath, safe_relpath

__all__ = ["DATA", "MAX_POLLED_PATHS", "PollLeases", "pollable"]

logger = logging.getLogger("aggregator.cluster.leases")

DATA = "\0data"
"""The interest entry for a source's query results (no file path holds a NUL)."""
LEASE_INTERVALS = 1.5
"""A lease outlives its last renewal by this many poll intervals (plus LEASE_MARGIN): the holder renews it every
interval, and the others try every quarter interval, so one takes over within 2 intervals of the holder's death."""
LEASE_MARGIN = 0.25
"""Seconds added to a lease for a holder whose renewal runs late (a busy event loop, a slow Redis call)."""
RETRY_FRACTION = 0.25
"""Replicas without the lease try to take it this often, as a fraction of the poll interval."""
INTEREST_INTERVALS = 3.0
VERSIONS_SECONDS = 600.0
"""How long the last polled versions outlive the last poll: a holder that takes over compares with them."""
MAX_POLLED_PATHS = 10_000
"""Paths one poll of a source checks for the cluster (the union of every replica's interests)."""
MAX_INTEREST_KEYS = 1000
"""Replicas' interest sets read per source (a bound on the SCAN, not on replicas expected)."""

# Take the lease if it is free, extend it if it is ours; 1 when held by us afterwards.
_ACQUIRE = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class PollLeases:
    """This replica's poll leases and interest sets, by source fingerprint."""

    def __init__(self, link: RedisLink) -> None:
        self.link = link
        self.held: dict[str, float] = {}
        """Fingerprints whose lease this replica held at its last try, with when that lease lapses unless renewed
        (monotonic clock): a lease nobody renews any more (its poller ended or hangs) stops counting."""

    def holds(self, fingerprint: str) -> bool:
        """Whether this replica holds the source's lease now, as far as it knows."""
        deadline = self.held.get(fingerprint)
        return deadline is not None and time.monotonic() < deadline

    def count(self) -> int:
        """Leases this replica holds now (for /healthz and /metrics)."""
        now = time.monotonic()
        return sum(deadline > now for deadline in self.held.values())

    def _lease_key(self, fingerprint: str) -> str:
        return self.link.key("lease", fingerprint)

    async def hold(self, fingerprint: str, interval: float) -> bool:
        """Take or renew the poll lease of the source `fingerprint`; True if this replica holds it. Redis errors
        pass through (the caller falls back to polling alone)."""
        ttl = max(1, int((interval * LEASE_INTERVALS + LEASE_MARGIN) * 1000))
        asked = time.monotonic()  # the lease lapses no later than ttl after the script ran, so after this
        with anyio.fail_after(self.link.settings.timeout * 2):
            ours = await self.link.client.eval(_ACQUIRE, 1, self._lease_key(fingerprint), self.link.replica, ttl)
        if ours == 1:
            if not self.holds(fingerprint):
                logger.info("cluster: replica %s now polls source %s", self.link.replica, fingerprint)
            self.held[fingerprint] = asked + ttl / 1000
            return True
        self.held.pop(fingerprint, None)
        return False

    async def release(self, fingerprint: str) -> None:
        """Give the lease back if this replica holds it (at shutdown, so another takes over at once)."""
        self.held.pop(fingerprint, None)
        with anyio.fail_after(self.link.settings.timeout * 2):
            await self.link.client.eval(_RELEASE, 1, self._lease_key(fingerprint), self.link.replica)

    async def release_all(self) -> None:
        for fingerprint in list(self.held):
            try:
                await self.release(fingerprint)
            except Exception:  # the lease expires by itself
                logger.debug("releasing the lease of %s failed", fingerprint, exc_info=True)

    async def want(self, fingerprint: str, paths: Collection[str], interval: float) -> None:
        """Record the paths (and `DATA`) this replica's subscribers want of the source, for a few intervals."""
        key = self.link.key("interest", fingerprint, self.link.replica)
        ttl = max(1, int(interval * INTEREST_INTERVALS * 1000))
        with anyio.fail_after(self.link.settings.timeout * 2):
            async with self.link.client.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                if paths:
                    pipe.sadd(key, *paths)
                    pipe.pexpire(key, ttl)
                await pipe.execute()

    async def wanted(self, fingerprint: str) -> set[str]:
        """The union of every replica's interests in the source (bounded: MAX_INTEREST_KEYS sets)."""
        pattern = self.link.key("interest", fingerprint, "*")
        keys: list[bytes] = []
        with anyio.fail_after(self.link.settings.timeout * 4):
            async for key in self.link.client.scan_iter(match=pattern, count=200):
                keys.append(key)
                if len(keys) >= MAX_INTEREST_KEYS:
                    logger.warning("cluster: more than %d interest sets for source %s; polling for the first ones",
                                   MAX_INTEREST_KEYS, fingerprint)
                    break
            if not keys:
                return set()
            members = await self.link.client.sunion(keys)
        return {m.decode(errors="replace") if isinstance(m, bytes) else str(m) for m in members}

    async def seen(self, fingerprint: str) -> dict[str | None, str | None]:
        """The versions the source's last poll saw, by path (None: its query results); {} if none is kept."""
        key = self.link.key("versions", fingerprint)
        with anyio.fail_after(self.link.settings.timeout * 2):
            kept = await self.link.client.hgetall(key)
        found: dict[str | None, str | None] = {}
        for raw_path, raw_version in kept.items():
            path = raw_path.decode(errors="replace") if isinstance(raw_path, bytes) else str(raw_path)
            if (version := self._opened(key, path, raw_version)) is not _UNREADABLE:
                found[None if path == DATA else path] = version  # type: ignore[assignment]
        return found

    async def seen_of(self, fingerprint: str, paths: Collection[str | None]) -> dict[str | None, str | None]:
        """The kept versions of these paths only (those kept and readable)."""
        key = self.link.key("versions", fingerprint)
        fields = [DATA if path is None else path for path in paths]
        if not fields:
            return {}
        with anyio.fail_after(self.link.settings.timeout * 2):
            kept = await self.link.client.hmget(key, fields)
        found: dict[str | None, str | None] = {}
        for field, raw in zip(fields, kept):
            if raw is not None and (version := self._opened(key, field, raw)) is not _UNREADABLE:
                found[None if field == DATA else field] = version  # type: ignore[assignment]
        return found

    async def baseline(self, fingerprint: str, versions: Mapping[str | None, str | None]) -> None:
        """Keep these versions for the paths no poll kept one of yet (a new subscription's): the holder's next
        poll compares with them. A version kept meanwhile is not overwritten."""
        key = self.link.key("versions", fingerprint)
        with anyio.fail_after(self.link.settings.timeout * 2):
            async with self.link.client.pipeline(transaction=True) as pipe:
                for path, version in versions.items():
                    field = DATA if path is None else path
                    pipe.hsetnx(key, field, self.link.seal.close(f"{key}\0{field}", json.dumps(version).encode()))
                pipe.pexpire(key, int(VERSIONS_SECONDS * 1000))
                await pipe.execute()

    def _opened(self, key: str, field: str, raw: object) -> object:
        """A kept version as written by `record`, or _UNREADABLE (not ours, or not a version)."""
        try:
            data = raw if isinstance(raw, bytes) else str(raw).encode()
            version = json.loads(self.link.seal.open(f"{key}\0{field}", data, "versions", _warn_unsealed))
        # Not ours (Unsealed is a ValueError; a value nested past the parser's stack raises RecursionError):
        # skipped, the next poll writes it again.
        except (ValueError, TypeError, RecursionError):
            return _UNREADABLE
        return version if isinstance(version, str) or version is None else _UNREADABLE

    async def record(self, fingerprint: str, versions: Mapping[str | None, str | None]) -> None:
        """Keep the versions this poll saw for the next holder (the whole set: paths nobody wants are dropped)."""
        key = self.link.key("versions", fingerprint)
        with anyio.fail_after(self.link.settings.timeout * 2):
            async with self.link.client.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                if versions:
                    fields = {DATA if path is None else path: json.dumps(version).encode()
                              for path, version in versions.items()}
                    pipe.hset(key, mapping={field: self.link.seal.close(f"{key}\0{field}", value)
                                            for field, value in fields.items()})
                    pipe.pexpire(key, int(VERSIONS_SECONDS * 1000))
                await pipe.execute()


_UNREADABLE = object()


def _warn_unsealed(reason: str, count: int) -> None:
    logger.warning("cluster: ignoring a kept poll version: %s (%d so far)", reason, count)


def pollable(interests: set[str]) -> set[str | None]:
    """The paths to poll among what Redis says replicas want (None: query results): whoever else writes Redis is
    not trusted, so paths that could leave the source are dropped and the count is capped."""
    found: set[str | None] = set()
    for path in sorted(interests):
        if len(found) >= MAX_POLLED_PATHS:
            logger.warning("cluster: replicas want more than %d paths of one source; polling the first ones",
                           MAX_POLLED_PATHS)
            break
        if path == DATA:
            found.add(None)
            continue
        try:
            found.add(safe_relpath(path))
        except UnsafePath:
            logger.debug("cluster: not polling the unsafe path %r", path)
    return found
