"""The cluster's shared content cache: remote sources' bodies in Redis, under each replica's own cache.

A replica's ContentCache stays in front: only its misses reach `SharedContent.load`, which answers from Redis, or
loads (one replica at a time with `single_flight`) and stores what may be shared. Redis failing never fails a read:
the replica loads by itself, logs the outage once, and tries Redis again a little later.

Layout (every name under the deployment's prefix, `{fp}` the source's fingerprint as a Redis Cluster hash tag; no
URL, path or secret ever appears in a name: paths and queries are hashed):
  content:{fp}:f:<sha(fp,path)> hash: a field per read variant (mime type, decompress, size limit)
  content:{fp}:q               hash: a field per query (sql, parameters, format, size limit)
  content:{fp}:gen             bumped by every `forget`: a load that started before it does not store its body
  lock:{fp}:<hash>:<field>     single-flight lock (redis-py Lock: token-checked release, expiry)
With `server.cluster.secret` each value is sealed for its hash and field (cluster/seal.py); one that is not is
rejected and deleted like any unreadable value.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from aggregator.cluster.link import RedisLink, source_fingerprint
from aggregator.content import Content
from aggregator.manifest.model import SourceSpec

if TYPE_CHECKING:
    from aggregator.sources import Source

__all__ = ["SharedContent", "SharedItem", "shareable"]

logger = logging.getLogger("aggregator.cluster.shared_cache")

Loaded = tuple[Content, str | None]
"""Content and its version (what the local cache keeps for revalidation)."""
Load = Callable[[], Awaitable[Loaded]]
"""The replica's own load: the content and its version."""

MAGIC = b"aggregator-content/1\n"
"""First bytes of every stored value: anything else under our names is foreign and ignored."""
LOCK_MARGIN = 2.0
"""Seconds a single-flight lock outlives the source's timeout: a leader that dies frees it by then."""
LOCK_SLEEP = 0.015
"""Seconds between a waiting replica's attempts to take the lock."""
RETRY_AFTER = 2.0
"""Seconds a replica leaves Redis alone after a failed call, so an outage costs each read nothing."""
GEN_KEPT_MS = 7 * 24 * 3600 * 1000
MAX_OWED_KEYS = 10_000
"""Forgets Redis could not take are kept by key up to this many a source; past it the source owes one forget of
everything it stored (a Redis outage under a busy folder must not grow memory without end)."""
SCAN_BATCH = 1000
"""A fingerprint's forget counter is kept this long after its last forget (it only has to outlive a load)."""

# Store only if no forget happened since the load began (the generation is still what it was then).
_STORE = """
local gen = redis.call('GET', KEYS[2])
if (gen or '') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""


def _digest(*parts: object, size: int = 32) -> str:
    return hashlib.sha256(json.dumps(parts, separators=(",", ":"), default=repr).encode()).hexdigest()[:size]


def _where(item: SharedItem) -> str:
    """What a stored body's seal binds it to: its hash and field."""
    return f"{item.key}\0{item.field}"


def _path_digest(fingerprint: str, path: str) -> str:
    # Salted with the source: a common name (README.md) hashes differently in every source, so names cannot be
    # matched across sources or looked up in a table of hashed names.
    return _digest(fingerprint, path)


@dataclass(frozen=True, slots=True)
class SharedItem:
    """Where one body lives in Redis and how long it may stay there."""

    key: str
    """The hash holding the body (one per file, one per source's queries)."""
    field: str
    gen: str
    """The source's forget counter."""
    lock: str
    ttl: float
    """Seconds the body may be kept (the source's ttl)."""
    wait: float
    """Seconds a single-flight lock is held at most, and waited for at most (the source's timeout + margin)."""


class SharedContent:
    """Bodies of remote sources kept in Redis, keyed by the source's fingerprint (never its id in one manifest).

    Counters (read by /metrics): hits, misses, stores, skipped (private, too large or not to be kept), rejected
    (corrupt or foreign values, deleted), errors (failed Redis calls)."""

    def __init__(self, link: RedisLink) -> None:
        from redis.exceptions import RedisError  # the cluster extra; only imported with server.cluster

        self.link = link
        self.max_bytes = link.settings.shared_max_bytes
        self.single_flight = link.settings.single_flight
        self._failures: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)
        self._store_script = link.client.register_script(_STORE)
        self._down = False
        self._retry_at = 0.0
        self._owed: dict[str, set[str]] = {}
        """Forgets Redis has not taken yet, by the forget counter of their source: the keys to drop. Each is done
        before this replica reads that source from Redis again (at most MAX_OWED_KEYS a source)."""
        self._owed_all: set[str] = set()
        """Forget counters of sources past MAX_OWED_KEYS: everything they stored is owed."""
        self.hits = self.misses = self.stores = self.skipped = self.rejected = self.errors = 0

    def counts(self) -> dict[str, int]:
        """The counters by result label, for /metrics."""
        return {"hit": self.hits, "miss": self.misses, "store": self.stores, "skipped": self.skipped,
                "rejected": self.rejected, "error": self.errors}

    @property
    def available(self) -> bool:
        """False during an outage (until the next retry finds Redis again)."""
        return not self._down

    # --- names ---------------------------------------------------------------------------------------------

    def file_item(self, spec: SourceSpec, path: str, mime_type: str | None, decompress: bool, max_bytes: int,
                  ttl: float, convert: object = None) -> SharedItem:
        """Where a file read as (mime_type, decompress) within `max_bytes`, converted with `convert` (its limits)
        or not, is shared."""
        fingerprint = source_fingerprint(spec)
        variant = (mime_type, decompress, max_bytes) if convert is None else (mime_type, decompress, max_bytes, convert)
        return self._item(fingerprint, ("f", _path_digest(fingerprint, path)), _digest(*variant, size=16), ttl,
                          spec.timeout)

    def query_item(self, spec: SourceSpec, sql: str, params: object, fmt: str, max_bytes: int,
                   ttl: float) -> SharedItem:
        """Where a query's result with these parameters, in this format, is shared."""
        return self._item(source_fingerprint(spec), ("q",), _digest(sql, params, fmt, max_bytes), ttl, spec.timeout)

    def _item(self, fingerprint: str, name: tuple[str, ...], field: str, ttl: float, timeout: float) -> SharedItem:
        tag = "{" + fingerprint + "}"  # one hash slot per source: the store script touches two of its keys
        return SharedItem(self.link.key("content", tag, *name), field, self.link.key("content", tag, "gen"),
                          self.link.key("lock", tag, *name, field), ttl, timeout + LOCK_MARGIN)

    # --- reads -------------------------------------------------------------------------------------------------

    async def load(self, item: SharedItem, load: Load) -> Loaded:
        """The content from Redis, else from `load` (stored for the other replicas when it may be shared). With
        single-flight one replica loads a cold body while the others wait for the lock, then read what it stored.
        Each call counts one hit or one miss."""
        found, gen = await self._get(item)
        if found is not None:
            self.hits += 1
            return found
        if not self.single_flight or gen is None:
            return await self._load_and_store(item, load, gen)
        lock = self.link.client.lock(item.lock, timeout=item.wait, sleep=LOCK_SLEEP, blocking_timeout=item.wait)
        try:
            held = await lock.acquire()
        except self._failures as exc:
            self._failed(exc)
            return await self._load_and_store(item, load, None)
        if not held:  # the leader took too long: load alone rather than wait any longer
            return await self._load_and_store(item, load, gen)
        try:
            # Whoever held the lock before may have stored it meanwhile (else it failed, was private or too big).
            found, gen = await self._get(item)
            if found is not None:
                self.hits += 1
                return found
            return await self._load_and_store(item, load, gen)
        finally:
            with anyio.CancelScope(shield=True):  # a cancelled read still frees the lock (each call is bounded)
                try:
                    await lock.release()
                except self._failures as exc:  # expired (a slow load) or Redis gone: nothing to give back
                    logger.debug("single-flight lock not released: %s", exc)

    async def _get(self, item: SharedItem) -> tuple[Loaded | None, str | None]:
        """The stored content (None: absent, expired, unreadable or Redis unusable) and the source's forget
        counter now (None when Redis could not be asked: nothing will be stored)."""
        if not self._usable():
            return None, None
        # A body this replica was told changed while Redis could not be told to forget it is still there.
        if (item.gen in self._owed or item.gen in self._owed_all) and not await self._settle(item.gen):
            return None, None
        try:
            async with self.link.client.pipeline(transaction=False) as pipe:
                pipe.hget(item.key, item.field)
                pipe.get(item.gen)
                raw, gen = await pipe.execute()
        except self._failures as exc:
            self._failed(exc)
            return None, None
        self._recovered()
        found = self._decode(raw, _where(item)) if raw is not None else None
        if raw is not None and found is None:
            await self._drop(item)
        return found, gen.decode() if isinstance(gen, bytes) else ""

    async def _load_and_store(self, item: SharedItem, load: Load, gen: str | None) -> Loaded:
        self.misses += 1
        content, version = await load()
        if gen is not None:
            await self._store(item, content, version, gen)
        return content, version

    async def _store(self, item: SharedItem, content: Content, version: str | None, gen: str) -> None:
        ttl = item.ttl if content.max_age is None else min(item.ttl, content.max_age)
        body = content.text.encode() if content.text is not None else (content.blob or b"")
        if content.private or ttl <= 0 or len(body) > self.max_bytes:
            self.skipped += 1
            return
        header = {"mime": content.mime_type, "text": content.text is not None, "version": version,
                  "maxAge": content.max_age, "expires": time.time() + ttl, "size": len(body)}
        value = self.link.seal.close(_where(item), MAGIC + json.dumps(header, separators=(",", ":")).encode()
                                     + b"\n" + body)
        try:
            stored = await self._store_script(keys=[item.key, item.gen],
                                              args=[gen, item.field, value, max(1, int(ttl * 1000))])
        except self._failures as exc:
            self._failed(exc)
            return
        if stored:
            self.stores += 1
        else:
            self.skipped += 1  # forgotten while it loaded: it may be the old body

    def _decode(self, raw: object, where: str) -> Loaded | None:
        """A stored value as Content with its remaining lifetime as max_age; None when expired or not ours (with
        `server.cluster.secret`: not sealed with it)."""
        try:
            if isinstance(raw, bytes):
                raw = self.link.seal.open(where, raw, "content")
            if not isinstance(raw, bytes) or not raw.startswith(MAGIC):
                raise ValueError("not a shared content value")
            line, _, body = raw[len(MAGIC):].partition(b"\n")
            header = json.loads(line)
            mime, is_text, version, max_age, expires, size = (
                header["mime"], header["text"], header["version"], header["maxAge"], header["expires"],
                header["size"])
            if not (isinstance(mime, str) and isinstance(is_text, bool) and isinstance(version, (str, type(None)))
                    and isinstance(max_age, (int, float, type(None))) and isinstance(expires, (int, float))
                    and size == len(body)):
                raise ValueError("bad header")
            text = body.decode("utf-8") if is_text else None
        # UnicodeDecodeError and JSON errors are ValueErrors; a header nested past the parser's limit raises
        # RecursionError (any process that reaches Redis can write one).
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            self.rejected += 1
            if math.log2(self.rejected).is_integer():  # the 1st, 2nd, 4th...: a flood of them is no flood of logs
                logger.warning("ignoring an unreadable shared cache value: %s (%d so far)", exc, self.rejected)
            return None
        remaining = expires - time.time()
        if remaining <= 0:
            return None
        # The local copy lives no longer than the shared one: a forget elsewhere is never outlived by more than that.
        keep = remaining if max_age is None else min(float(max_age), remaining)
        return Content(mime, text=text, blob=None if is_text else body, max_age=keep), version

    async def _drop(self, item: SharedItem) -> None:
        try:
            await self.link.client.hdel(item.key, item.field)
        except self._failures as exc:
            self._failed(exc)

    # --- changes -----------------------------------------------------------------------------------------------

    async def forget(self, fingerprint: str, paths: Collection[str], data: bool) -> None:
        """Drop what is kept of these files of the source `fingerprint` (and, with `data`, its query results), and
        keep loads already under way from storing what they read. Redis failing is logged and counted, not raised:
        the forget is owed, and done before this replica reads that source from Redis again."""
        tag = "{" + fingerprint + "}"
        keys = [self.link.key("content", tag, "f", _path_digest(fingerprint, path)) for path in paths]
        if data:
            keys.append(self.link.key("content", tag, "q"))
        if not keys:
            return
        gen = self.link.key("content", tag, "gen")
        if gen not in self._owed_all:
            owed = self._owed.setdefault(gen, set())
            owed.update(keys)
            if len(owed) > MAX_OWED_KEYS:
                del self._owed[gen]
                self._owed_all.add(gen)
        await self._settle(gen)

    def owed(self) -> tuple[int, int]:
        """Forgets Redis has not taken yet: keys owed, and sources owing everything they stored."""
        return sum(len(keys) for keys in self._owed.values()), len(self._owed_all)

    async def settle(self) -> None:
        """Do every owed forget Redis takes now (when it is back after an outage)."""
        for gen in [*self._owed_all, *self._owed]:
            if not await self._settle(gen):
                return

    async def _settle(self, gen: str) -> bool:
        """Do the forgets owed for the source whose forget counter is `gen`; False if Redis failed (still owed)."""
        if gen in self._owed_all:
            return await self._forget_all(gen)
        keys = self._owed.get(gen)
        if not keys:
            return True
        doing = sorted(keys)
        try:
            async with self.link.client.pipeline(transaction=True) as pipe:
                pipe.incr(gen)
                pipe.pexpire(gen, GEN_KEPT_MS)
                pipe.delete(*doing)
                await pipe.execute()
        except self._failures as exc:
            self._failed(exc)
            return False
        self._recovered()
        keys.difference_update(doing)  # owed meanwhile: still owed
        if not keys and self._owed.get(gen) is keys:
            del self._owed[gen]
        return True

    async def _forget_all(self, gen: str) -> bool:
        """Drop everything the source whose forget counter is `gen` stored (its keys share the counter's hash tag),
        after bumping the counter so no load under way stores; False if Redis failed (still owed)."""
        pattern = _glob_escaped(gen.removesuffix(":gen")) + ":*"
        try:
            async with self.link.client.pipeline(transaction=True) as pipe:
                pipe.incr(gen)
                pipe.pexpire(gen, GEN_KEPT_MS)
                await pipe.execute()
            batch: list[Any] = []
            async for key in self.link.client.scan_iter(match=pattern, count=SCAN_BATCH):
                if key not in (gen, gen.encode()):
                    batch.append(key)
                if len(batch) >= SCAN_BATCH:
                    await self.link.client.delete(*batch)
                    batch.clear()
            if batch:
                await self.link.client.delete(*batch)
        except self._failures as exc:
            self._failed(exc)
            return False
        self._recovered()
        self._owed_all.discard(gen)
        return True

    # --- outages -------------------------------------------------------------------------------------------------

    def _usable(self) -> bool:
        return not self._down or time.monotonic() >= self._retry_at

    def _failed(self, exc: BaseException) -> None:
        self.errors += 1
        self._retry_at = time.monotonic() + RETRY_AFTER
        if not self._down:
            self._down = True
            logger.warning("shared cache: Redis at %s failed (%s); reading from sources directly until it is back",
                           self.link.describe(), type(exc).__name__)

    def _recovered(self) -> None:
        if self._down:
            self._down = False
            logger.info("shared cache: Redis at %s is back", self.link.describe())


def _glob_escaped(text: str) -> str:
    """`text` matched literally by a SCAN pattern (the deployment's prefix may hold glob characters)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def shareable(source: Source) -> bool:
    """Whether a source's bodies go to the shared cache: remote ones only (each replica has its own copy of a local
    folder), and not those whose backend pushes its changes to each replica's own connection."""
    return source.watch_root() is None and not source.pushes_changes
