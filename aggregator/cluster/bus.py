"""The cluster's change bus: what one replica saw change in a remote source, told to every other replica.

Events travel as JSON on Redis pub/sub (at most once, no replay: a replica that was cut off drops its remote
sources' cache entries and closes its listen streams when it is back, see `on_reconnect`). Inbound events are
untrusted: too big, malformed or mistyped ones are counted and ignored, and a replica ignores its own. With
`server.cluster.secret` every event is sealed for the channel, and one that is not is ignored (cluster/seal.py).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from aggregator.cluster.leases import DATA
from aggregator.cluster.link import RedisLink
from aggregator.cluster.seal import Unsealed

__all__ = ["ChangeBus", "ChangeEvent", "MAX_EVENT_BYTES"]

logger = logging.getLogger("aggregator.cluster.bus")

MAX_EVENT_BYTES = 256 * 1024
"""Largest event accepted (and published: a bigger change is sent as several events)."""
MAX_PATH_CHARS = 4096
HEARTBEAT_SECONDS = 1.0
"""How often the subscriber checks that Redis still answers (a paused Redis leaves the socket open)."""
BACKOFF_SECONDS = (0.1, 0.25, 0.5, 1.0, 2.0)
Kind = Literal["updated", "listing"]


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """Files (`paths`) or query results (`data`) of the source whose fingerprint is `source` changed (`updated`),
    or what it lists did (`listing`); `origin` is the publishing replica, `digest` its manifest's sha256.
    `versions` holds the version the publisher polled of each path (None: of the query results), so a replica
    whose listeners were already told of it (by its own poll while Redis was out) does not tell them again."""

    origin: str
    digest: str
    source: str
    paths: tuple[str, ...] = ()
    data: bool = False
    kind: Kind = "updated"
    versions: Mapping[str | None, str | None] = field(default_factory=dict)

    def encode(self) -> bytes:
        facts: dict[str, object] = {"origin": self.origin, "digest": self.digest, "source": self.source,
                                    "paths": list(self.paths), "data": self.data, "kind": self.kind}
        if self.versions:
            facts["versions"] = {DATA if path is None else path: v for path, v in self.versions.items()}
        return json.dumps(facts, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | str) -> ChangeEvent:
        """The event in `raw`; ValueError for anything else (the sender is not trusted)."""
        if len(raw) > MAX_EVENT_BYTES:
            raise ValueError("event too large")
        try:
            facts: Any = json.loads(raw)
        except RecursionError:  # `[[[[...` nests deeper than the parser's stack
            raise ValueError("nested too deeply") from None
        if not isinstance(facts, dict) or set(facts) - {"versions"} != _KEYS:
            raise ValueError("not an event object")
        text = (facts["origin"], facts["digest"], facts["source"])
        if not all(isinstance(t, str) and 0 < len(t) <= 256 for t in text[::2]) or not isinstance(text[1], str):
            raise ValueError("bad origin, digest or source")
        paths = facts["paths"]
        if not isinstance(paths, list) or not all(isinstance(p, str) and 0 < len(p) <= MAX_PATH_CHARS for p in paths):
            raise ValueError("bad paths")
        if not isinstance(facts["data"], bool) or facts["kind"] not in ("updated", "listing"):
            raise ValueError("bad data or kind")
        return cls(facts["origin"], facts["digest"][:128], facts["source"], tuple(paths), facts["data"],
                   facts["kind"], _versions(facts.get("versions", {}), paths, facts["data"]))


_KEYS = {"origin", "digest", "source", "paths", "data", "kind"}


def _versions(raw: object, paths: list[str], data: bool) -> dict[str | None, str | None]:
    """An event's versions: one per path it names (and its query results), each a string or null."""
    if not isinstance(raw, dict):
        raise ValueError("bad versions")
    named = set(paths) | ({DATA} if data else set())
    found: dict[str | None, str | None] = {}
    for path, version in raw.items():
        if path not in named or not (version is None or isinstance(version, str) and len(version) <= MAX_PATH_CHARS):
            raise ValueError("bad versions")
        found[None if path == DATA else path] = version
    return found


class ChangeBus:
    """Publish change events and deliver the other replicas' ones to `listeners`, with a supervised subscriber.

    `connected` is True while the subscription is up and Redis answers; losing it and getting it back are each
    logged once, and getting it back runs the `on_reconnect` callbacks (events sent meanwhile were lost).
    """

    def __init__(self, link: RedisLink) -> None:
        self.link = link
        self.channel = link.key("changes")
        self.connected = False
        self.published = 0
        self.publish_errors = 0
        self.received = 0
        self.rejected = 0
        self.restarts = 0
        """Times the subscriber started again after its connection failed."""
        self.losses = 0
        """Times the bus went from connected to not: a publisher compares it before and after, since an event sent
        across a loss may have reached no other replica (theirs were cut off too, and back after it)."""
        self.listeners: list[Callable[[ChangeEvent], None]] = []
        """Called with each accepted event, in the subscriber's task: they only take note (queue the work)."""
        self.on_reconnect: list[Callable[[], Awaitable[None]]] = []
        self._lost = False  # connected before, and then not: the next connection is a recovery
        self._stop = anyio.Event()

    # --- publishing ------------------------------------------------------------------------------------

    async def publish(self, event: ChangeEvent) -> bool:
        """Send `event` to the other replicas (split when too big); False if Redis failed. Never raises.

        The Redis timeout bounds each part's publish, as it bounds any one Redis call: a change of 30,000 paths is
        a dozen parts, and splitting and sealing them is CPU work that a loaded replica does slower, not a sign
        that Redis is gone."""
        try:
            for part in _split(event):
                message = self.link.seal.close(self.channel, part.encode())
                with anyio.fail_after(self.link.settings.timeout * 2):
                    await self.link.client.publish(self.channel, message)
                self.published += 1
        except Exception as exc:  # any Redis or socket failure: the replica goes on alone
            self.publish_errors += 1
            self._mark_down(f"publishing failed ({type(exc).__name__})")
            return False
        return True

    # --- subscribing -----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Subscribe until `stop()`, starting again with backoff whenever the connection fails."""
        failures = 0
        while not self._stop.is_set():
            try:
                await self._subscribe()
                failures = 0
            except Exception as exc:  # the subscriber must never stop silently: count, log once, retry
                self.restarts += 1
                self._mark_down(f"the subscription failed ({type(exc).__name__}: {exc})")
                delay = BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)]
                failures += 1
                with anyio.move_on_after(delay):
                    await self._stop.wait()

    def stop(self) -> None:
        self._stop.set()

    async def _subscribe(self) -> None:
        pubsub = self.link.client.pubsub(ignore_subscribe_messages=True)
        try:
            with anyio.fail_after(self.link.settings.timeout * 2):
                await pubsub.subscribe(self.channel)
                await self.link.client.ping()
            await self._mark_up()
            checked = anyio.current_time()
            while not self._stop.is_set():
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=HEARTBEAT_SECONDS / 2)
                if message is not None and message.get("type") == "message":
                    self._deliver(message.get("data"))
                if anyio.current_time() - checked >= HEARTBEAT_SECONDS:
                    checked = anyio.current_time()
                    with anyio.fail_after(self.link.settings.timeout * 2):
                        await self.link.client.ping()
                    await self._mark_up()  # a failed publish marked it down while the subscription held
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.link.settings.timeout):
                try:
                    await pubsub.aclose()
                except Exception:  # a dead connection may fail to close; it is dropped either way
                    logger.debug("closing the pub/sub connection failed", exc_info=True)

    def _deliver(self, raw: object) -> None:
        try:
            if not isinstance(raw, (bytes, str)):
                raise ValueError("not a text message")
            event = ChangeEvent.decode(self.link.seal.open(
                self.channel, raw if isinstance(raw, bytes) else raw.encode(errors="surrogateescape"), "event",
                self._warn_unsealed))
        except Unsealed:
            self.rejected += 1
            return
        except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors too
            self.rejected += 1
            if self.rejected == 1 or math.log2(self.rejected).is_integer():
                logger.warning("ignoring a malformed change event on %s (%s; %d so far)", self.channel, exc,
                               self.rejected)
            return
        if event.origin == self.link.replica:
            return
        self.received += 1
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("a change event listener failed")

    def _warn_unsealed(self, reason: str, count: int) -> None:
        logger.warning("ignoring a change event on %s: %s (%d so far)", self.channel, reason, count)

    # --- state -----------------------------------------------------------------------------------------

    def uninterrupted(self, losses: int) -> bool:
        """Connected, and not lost since `losses` was read from `self.losses`."""
        return self.connected and self.losses == losses

    def _mark_down(self, why: str) -> None:
        if self.connected or not self._lost:
            logger.warning("cluster Redis at %s unavailable: %s; serving from this replica's cache with local "
                           "change detection until it is back", self.link.describe(), why)
        if self.connected:
            self.connected = False
            self.losses += 1
        self._lost = True

    async def _mark_up(self) -> None:
        if self.connected:
            return
        self.connected = True
        if not self._lost:
            logger.info("cluster: replica %s joined the change bus at %s", self.link.replica, self.link.describe())
            return
        self._lost = False
        logger.warning("cluster Redis at %s is back: dropping remote sources' cached content and closing listen "
                       "streams (events sent meanwhile were lost)", self.link.describe())
        for callback in self.on_reconnect:
            try:
                await callback()
            except Exception:
                logger.exception("a cluster reconnect callback failed")


def _split(event: ChangeEvent) -> list[ChangeEvent]:
    """`event` as parts that each encode under MAX_EVENT_BYTES (paths are capped, so each part holds some)."""
    if len(event.encode()) <= MAX_EVENT_BYTES:
        return [event]
    parts: list[ChangeEvent] = []
    chunk: list[str] = []
    size = 0
    budget = MAX_EVENT_BYTES // 2
    versions = event.versions

    def part(paths: list[str], data: bool) -> ChangeEvent:
        named = [*paths, None] if data else paths
        return ChangeEvent(event.origin, event.digest, event.source, tuple(paths), data, event.kind,
                           {path: versions[path] for path in named if path in versions})

    for path in event.paths:
        cost = len(json.dumps(path)) + 1 + (len(json.dumps([path, versions[path]])) if path in versions else 0)
        if chunk and size + cost > budget:
            parts.append(part(chunk, False))
            chunk, size = [], 0
        chunk.append(path)
        size += cost
    parts.append(part(chunk, event.data))
    return parts
