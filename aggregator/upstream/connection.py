"""One connection to one upstream MCP server, kept alive: calls with timeouts and a concurrency cap, reconnection with
capped exponential backoff, change events relayed from whichever wire the official client negotiated.

The connection lives in a background task (started by the first call, or `connect()`; ended by `aclose()`), because
the SDK's client must be entered and left in one task while any task may call. A call waits while a connection is
being made, fails at once while the upstream is down (state `failed`, between attempts), and is sent again once when
the connection was lost under it (a restarted child, an HTTP server that forgot our session).

Errors are `aggregator.sources.base` errors whose text is for the operator: an upstream's own error messages are
quoted there (escaped, truncated), and never reach a client, since the read path maps SourceError to a fixed message.
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import math
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import anyio
import mcp_types as types
from mcp import Client
from mcp.client.subscriptions import ResourcesListChanged, ResourceUpdated, SubscriptionLost
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from aggregator.sources.base import SourceError, SourceNotFound, SourceTooLarge, SourceUnsupported
from aggregator.upstream.backoff import Backoff
from aggregator.upstream.http_session import SessionWatch, keep_session
from aggregator.upstream.transports import HttpTarget, Target

__all__ = ["ListChanged", "Listing", "Upstream", "UpstreamContent", "UpstreamEvent", "UpstreamRead",
           "UpstreamStatus", "Updated"]

logger = logging.getLogger("aggregator.upstream")

T = TypeVar("T")
State = Literal["idle", "connecting", "connected", "failed", "closed"]

RESOURCE_NOT_FOUND = -32002  # 2025-11-25's code; the modern wire says -32602 with data.uri
_LOST = {types.CONNECTION_CLOSED}
MAX_COMPLETIONS = 100
STREAM_GRACE = 3.0
"""Seconds a legacy HTTP session's dropped event stream may take to come back (the SDK retries once, after 1 s)."""
LISTEN_OVERLAP = 1.0
"""Seconds a replaced listen stream stays open after its successor's acknowledgment: an event published before the
successor subscribed may still be on its way on the old stream (the server writes the new ack first)."""


@dataclass(frozen=True, slots=True)
class ListChanged:
    """The upstream's resource listing may have changed: list again."""


@dataclass(frozen=True, slots=True)
class Updated:
    """The upstream resource `uri` may have changed: read it again."""

    uri: str


UpstreamEvent = ListChanged | Updated
EventCallback = Callable[[UpstreamEvent], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Listing:
    """Every entry of a paginated listing, with the caching hints of its pages (modern wire only)."""

    items: list[Any]
    ttl_ms: int | None = None
    """The smallest ttlMs any page gave."""
    cache_scope: str | None = None
    """`private` if any page said so, else `public` if one did."""
    truncated: bool = False
    """The listing went past the page or entry cap (or its cursors looped): `items` is a prefix."""


@dataclass(frozen=True, slots=True)
class UpstreamContent:
    uri: str
    mime_type: str | None
    data: bytes
    is_text: bool


@dataclass(frozen=True, slots=True)
class UpstreamRead:
    """A read's contents (the one for the URI asked first), with the upstream's caching hints when it gave them."""

    contents: list[UpstreamContent]
    ttl_ms: int | None = None
    cache_scope: str | None = None

    @property
    def first(self) -> UpstreamContent:
        return self.contents[0]


@dataclass(frozen=True, slots=True)
class UpstreamStatus:
    """What `/healthz` and `/metrics` show for one upstream."""

    state: State
    reconnects: int
    last_error: str | None
    """Operator detail only (it may quote the upstream)."""
    protocol_version: str | None


@dataclass(eq=False)
class _Connection:
    client: Client
    session: SessionWatch | None = None
    """A 2025-11-25 HTTP session's traffic as our transport saw it (None for stdio)."""
    lost: anyio.Event = field(default_factory=anyio.Event)
    reason: str | None = None
    subscribed: set[str] = field(default_factory=set)

    def mark_lost(self, reason: str) -> None:
        """The connection is unusable: the runner closes it and connects again (the first reason is kept)."""
        if self.reason is None:
            self.reason = reason
        self.lost.set()


class Upstream:
    """A kept-alive client of one upstream MCP server (see the module docstring)."""

    def __init__(self, name: str, target: Target, *, timeout: float = 30.0, connect_timeout: float | None = None,
                 max_concurrency: int = 8, mode: str = "auto", max_pages: int = 100, max_entries: int = 10_000,
                 list_timeout: float | None = None, max_message_bytes: int = 64 * 1024 * 1024,
                 backoff: tuple[float, float] = (0.5, 30.0), health_interval: float = 15.0) -> None:
        self.name = name
        self.target = target
        self.timeout = timeout
        self.connect_timeout = connect_timeout if connect_timeout is not None else timeout
        self.list_timeout = list_timeout if list_timeout is not None else timeout * 4
        self.max_pages = max_pages
        self.max_entries = max_entries
        self.max_message_bytes = max_message_bytes
        self.mode = mode
        self.backoff = backoff
        self._backoff = Backoff(*backoff)
        self.health_interval = health_interval
        self._limiter = anyio.CapacityLimiter(max_concurrency)
        self._state: State = "idle"
        self._reconnects = 0
        self._last_error: str | None = None
        self._conn: _Connection | None = None
        self._changed = anyio.Event()
        self._runner: Any = None
        self._runner_scope: anyio.CancelScope | None = None
        self._callback: EventCallback | None = None
        self._wanted: frozenset[str] = frozenset()
        self._wanted_changed = anyio.Event()
        self._ever_connected = False
        self._was_up = False
        self._missed = False
        """Changes may have gone unheard (no listener, no stream, no connection): tell the listener once it hears."""
        self._closing = False

    # ---- state ----

    def describe(self) -> str:
        return self.target.describe()

    @property
    def status(self) -> UpstreamStatus:
        conn = self._conn
        version = conn.client.protocol_version if conn is not None and self._state == "connected" else None
        return UpstreamStatus(self._state, self._reconnects, self._last_error, version)

    def _set_state(self, state: State, error: str | None = None) -> None:
        self._state = state
        if error is not None:
            self._last_error = error
        self._changed.set()
        self._changed = anyio.Event()

    async def connect(self) -> None:
        """Start the connection if needed and wait until it is up; SourceError if it cannot be made."""
        await self._ready()

    async def aclose(self) -> None:
        """Close the connection (the child is stopped, the HTTP session ended); later calls fail."""
        runner, self._runner = self._runner, None
        self._closing = True
        self._set_state("closed")
        if self._runner_scope is not None:
            self._runner_scope.cancel()
        if runner is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await runner
                except BaseException:  # noqa: BLE001 - the runner logs its own failures; cancelled is expected
                    pass

    def _ensure_started(self) -> None:
        if self._runner is None and self._state == "idle":
            import asyncio

            self._set_state("connecting")
            # Detached on purpose: the client must live in one task, callers come from many (see module docstring).
            self._runner = asyncio.get_running_loop().create_task(self._run(), name=f"upstream-{self.name}")

    async def _ready(self) -> _Connection:
        hurried = False  # a call waits for at most one attempt it brought forward
        while True:
            self._ensure_started()
            conn = self._conn
            if self._state == "connected" and conn is not None and not conn.lost.is_set():
                return conn
            if self._state == "failed":
                if hurried or not self._backoff.hurry():
                    raise SourceError(f"{self.describe()} is unavailable ({self._last_error})")
                hurried = True
            if self._state == "closed":
                raise SourceError(f"{self.describe()} is closed")
            await self._changed.wait()

    # ---- the connection's task ----

    async def _run(self) -> None:
        with anyio.CancelScope() as scope:
            self._runner_scope = scope
            while not self._closing:
                self._set_state("connecting")
                self._was_up = False
                try:
                    reason = await self._session()
                except Exception as exc:  # noqa: BLE001 - any failure of one connection is logged and retried
                    reason = _describe_failure(exc)
                finally:
                    self._conn = None
                if self._closing:
                    break
                self._last_error = reason
                if self._was_up:
                    # A connection that was up and got lost (a restart, a crash): try again at once, and let the
                    # listener look (it keeps or drops what it listed per its own rules while we are down).
                    logger.warning("%s (%s): connection lost: %s", self.describe(), self.name, reason)
                    self._backoff.reset(recovering=True)
                    await self._emit(ListChanged())
                    continue
                logger.warning("%s (%s): cannot connect: %s", self.describe(), self.name, reason)
                self._set_state("failed")
                await self._backoff.wait()

    async def _session(self) -> str:
        """One connection, from connect until it is lost, and why it was (`_was_up` says whether it was made)."""
        def lost(reason: str) -> None:
            if self._conn is not None:
                self._conn.mark_lost(reason)

        session = SessionWatch(lost) if isinstance(self.target, HttpTarget) else None
        transport = self.target.open(self.name, lambda: lost("the upstream closed the connection"),
                                     self.max_message_bytes, self.timeout, session)
        client = Client(transport, mode=self.mode, cache=None, read_timeout_seconds=self.timeout,
                        message_handler=self._on_message,
                        client_info=types.Implementation(name="aggregator", version=_version()))
        with anyio.CancelScope(deadline=anyio.current_time() + self.connect_timeout) as connecting:
            async with client:
                connecting.deadline = math.inf
                conn = _Connection(client, session)
                self._conn = conn
                first = not self._ever_connected
                # A first connection after failed attempts: whoever listed meanwhile got nothing, so tell them too
                # (once events flow: see _watch).
                self._missed |= not first or self._last_error is not None
                self._ever_connected = self._was_up = True
                if not first:
                    self._reconnects += 1
                self._backoff.reset(recovering=False)
                self._set_state("connected")
                logger.info("%s (%s): connected (%s)", self.describe(), self.name, client.protocol_version)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._watch, conn)
                    await conn.lost.wait()
                    tg.cancel_scope.cancel()
        if connecting.cancelled_caught and not self._was_up:
            raise TimeoutError(f"no connection within {self.connect_timeout:g}s")
        return conn.reason or "connection lost"

    # ---- calls ----

    async def _call(self, what: str, fn: Callable[[Client], Awaitable[T]], timeout: float | None = None) -> T:
        """Run `fn` on a ready connection within the timeout and the concurrency cap; errors mapped to SourceError."""
        limit = self.timeout if timeout is None else timeout
        try:
            with anyio.fail_after(limit):
                async with self._limiter:
                    for attempt in (0, 1):
                        conn = await self._ready()
                        try:
                            return await fn(conn.client)
                        except MCPError as exc:
                            # Lost under the call: closed, the session forgotten (the transport saw the refusal and
                            # marked it), or failed while a session's event stream was down (the server went away).
                            if attempt == 0 and (exc.code in _LOST or conn.lost.is_set() or (
                                    conn.session is not None and conn.session.stream_down)):
                                conn.mark_lost(f"{what}: {_quote(exc)}")
                                continue
                            raise
                    raise AssertionError("unreachable")
        except TimeoutError:
            raise SourceError(f"{self.describe()}: no answer to {what} within {limit:g}s") from None
        except MCPError as exc:
            if _not_found(exc):
                raise SourceNotFound(f"{self.describe()}: {what}: {_quote(exc)}") from None
            if exc.code == types.METHOD_NOT_FOUND:  # the upstream has none of what was asked (no templates...)
                raise SourceUnsupported(f"{self.describe()}: {what}: {_quote(exc)}") from None
            raise SourceError(f"{self.describe()}: {what}: {_quote(exc)}") from None
        except ValidationError as exc:
            raise SourceError(f"{self.describe()}: {what}: malformed answer ({exc.error_count()} errors)") from None
        except (SourceError, anyio.get_cancelled_exc_class()):
            raise
        except Exception as exc:  # noqa: BLE001 - a transport failure under a call: the caller sees SourceError
            raise SourceError(f"{self.describe()}: {what}: {_describe_failure(exc)}") from None

    async def _paginate(self, what: str, page: Callable[[Client, str | None], Awaitable[Any]],
                        items: Callable[[Any], list[Any]]) -> Listing:
        async def walk(client: Client) -> Listing:
            found: list[Any] = []
            ttls: list[int] = []
            scopes: set[str] = set()
            seen: set[str] = set()
            cursor: str | None = None
            for _ in range(self.max_pages):
                result = await page(client, cursor)
                found.extend(items(result))
                ttl, scope = _hints(client, result)
                if ttl is not None:
                    ttls.append(ttl)
                if scope is not None:
                    scopes.add(scope)
                cursor = result.next_cursor
                if len(found) > self.max_entries or cursor is None:
                    break
                if cursor in seen:
                    logger.warning("%s: %s: the cursors loop; listing cut short", self.describe(), what)
                    break
                seen.add(cursor)
            truncated = cursor is not None or len(found) > self.max_entries
            if truncated:
                logger.warning("%s: %s cut at %d pages / %d entries", self.describe(), what, self.max_pages,
                               self.max_entries)
            scope = "private" if "private" in scopes else ("public" if scopes else None)
            return Listing(found[:self.max_entries], min(ttls) if ttls else None, scope, truncated)

        return await self._call(what, walk, self.list_timeout)

    async def list_resources(self) -> Listing:
        """Every resource the upstream lists (cursors followed, capped); items are `mcp_types.Resource`."""
        return await self._paginate(
            "resources/list", lambda c, cursor: c.list_resources(cursor=cursor, cache_mode="bypass"),
            lambda r: list(r.resources))

    async def list_templates(self) -> Listing:
        """Every resource template the upstream lists; items are `mcp_types.ResourceTemplate`."""
        return await self._paginate(
            "resources/templates/list", lambda c, cursor: c.list_resource_templates(cursor=cursor, cache_mode="bypass"),
            lambda r: list(r.resource_templates))

    async def read(self, uri: str, max_bytes: int) -> UpstreamRead:
        """The contents of `uri`; SourceNotFound if the upstream has none, SourceTooLarge past `max_bytes`."""
        async def read(client: Client) -> tuple[types.ReadResourceResult, tuple[int | None, str | None]]:
            result = await client.read_resource(uri, cache_mode="bypass")
            return result, _hints(client, result)

        result, hints = await self._call("resources/read", read)
        return _read_result(self.describe(), uri, result, max_bytes, *hints)

    async def complete(self, uri_template: str, name: str, value: str,
                       context: Mapping[str, str] | None = None) -> types.Completion:
        """Completion values for argument `name` of template `uri_template` (at most 100), as the upstream gives."""
        ref = types.ResourceTemplateReference(type="ref/resource", uri=uri_template)
        result = await self._call("completion/complete", lambda c: c.complete(
            ref, {"name": name, "value": value}, dict(context) if context else None))
        values = [v for v in result.completion.values[:MAX_COMPLETIONS] if isinstance(v, str)]
        return types.Completion(values=values, total=result.completion.total, has_more=result.completion.has_more)

    # ---- change events ----

    def on_change(self, callback: EventCallback | None) -> None:
        """Deliver the upstream's ListChanged and Updated events to `callback` (None: stop). It is also told
        ListChanged when the connection is lost, and ListChanged and Updated for every subscribed URI whenever changes
        may have gone unheard: once it first listens, after a reconnect (or a first connection after failed
        attempts), after a session's event stream opened again."""
        if callback is not None and self._callback is None and self._ever_connected:
            self._missed = True  # nothing listened (modern: no stream was open) since whoever set it last listed
        self._callback = callback
        self._wanted_changed.set()

    def subscribe(self, uris: Iterable[str]) -> None:
        """Ask for Updated events of exactly `uris` (legacy: resources/subscribe; modern: subscriptions/listen)."""
        wanted = frozenset(uris)
        if wanted != self._wanted:
            self._wanted = wanted
            self._wanted_changed.set()

    async def _emit(self, event: UpstreamEvent) -> None:
        callback = self._callback
        if callback is None:
            return
        try:
            await callback(event)
        except Exception:  # noqa: BLE001 - a failing listener must not end the connection
            logger.exception("%s: change callback failed", self.describe())

    async def _on_message(self, message: Any) -> None:
        """Legacy wire notifications (the modern wire's come through the listen stream)."""
        if isinstance(message, types.ResourceListChangedNotification):
            await self._emit(ListChanged())
        elif isinstance(message, types.ResourceUpdatedNotification):
            await self._emit(Updated(str(message.params.uri)))

    async def _tell_missed(self) -> None:
        """Changes may have gone unheard: the listener looks again (ListChanged, Updated for what it wants); with no
        listener yet, it is told once there is one."""
        self._missed = self._callback is None
        if not self._missed:
            await self._emit(ListChanged())
            for uri in sorted(self._wanted):
                await self._emit(Updated(uri))

    async def _watch(self, conn: _Connection) -> None:
        """Keep the upstream's subscriptions equal to what is wanted, for as long as the connection lives."""
        if conn.client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            await self._listen(conn)
        else:
            async with anyio.create_task_group() as tg:
                if conn.session is not None:
                    tg.start_soon(functools.partial(
                        keep_session, conn.session, ping=functools.partial(_ping, conn.client), lost=conn.mark_lost,
                        missed=self._tell_missed, listening=lambda: self._callback is not None,
                        interval=self.health_interval, timeout=self.timeout, grace=STREAM_GRACE))
                await self._sync_legacy(conn)

    async def _sync_legacy(self, conn: _Connection) -> None:
        caps = conn.client.server_capabilities.resources
        while True:
            changed = self._wanted_changed = anyio.Event()
            if caps is not None and caps.subscribe:
                wanted = set(self._wanted) if self._callback is not None else set()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # resources/subscribe is the legacy wire's way
                    for uri in sorted(wanted - conn.subscribed):
                        await self._quietly(conn, "resources/subscribe", conn.client.subscribe_resource, uri)
                        conn.subscribed.add(uri)
                    for uri in sorted(conn.subscribed - wanted):
                        await self._quietly(conn, "resources/unsubscribe", conn.client.unsubscribe_resource, uri)
                        conn.subscribed.discard(uri)
            if self._missed:
                await self._tell_missed()
            await changed.wait()

    async def _quietly(self, conn: _Connection, what: str, fn: Callable[[str], Awaitable[Any]], uri: str) -> None:
        try:
            with anyio.fail_after(self.timeout):
                await fn(uri)
        except MCPError as exc:
            if exc.code in _LOST:
                conn.mark_lost(f"{what}: {_quote(exc)}")
            logger.warning("%s: %s %s failed: %s", self.describe(), what, uri, _quote(exc))
        except TimeoutError:
            logger.warning("%s: %s %s: no answer within %gs", self.describe(), what, uri, self.timeout)

    async def _listen(self, conn: _Connection) -> None:
        """Modern wire: one listen stream with the wanted filter, opened again whenever the filter changes. The
        stream it replaces closes LISTEN_OVERLAP after the new one is acknowledged, so no event falls between the two;
        changes made while none was open are told once one is (the upstream replays nothing)."""
        async with anyio.create_task_group() as tg:
            current: anyio.CancelScope | None = None
            while True:
                # Reset before reading what is wanted: a change from here on wakes the wait below.
                changed = self._wanted_changed = anyio.Event()
                if self._callback is None:
                    if current is not None:
                        current.cancel()
                        current = None
                    await changed.wait()
                    continue
                try:
                    opened = await tg.start(self._stream, conn, sorted(self._wanted))
                except SubscriptionLost:
                    conn.mark_lost("the listen stream was lost")
                    return
                except (MCPError, TimeoutError) as exc:
                    if isinstance(exc, MCPError) and exc.code in _LOST:
                        conn.mark_lost(f"listen: {_quote(exc)}")
                        return
                    logger.warning("%s: subscriptions/listen refused: %s", self.describe(),
                                   _quote(exc) if isinstance(exc, MCPError) else "no acknowledgment in time")
                    await changed.wait()
                    continue
                if current is not None:
                    tg.start_soon(_close_later, current, LISTEN_OVERLAP)
                current = opened
                if self._missed:
                    await self._tell_missed()
                await changed.wait()

    async def _stream(self, conn: _Connection, uris: list[str], *, task_status: Any) -> None:
        """One listen stream: started (its cancel scope given) once acknowledged, then relayed until cancelled."""
        with anyio.CancelScope() as scope:
            async with conn.client.listen(resources_list_changed=True, resource_subscriptions=uris) as sub:
                task_status.started(scope)
                await self._relay(conn, sub)

    async def _relay(self, conn: _Connection, sub: Any) -> None:
        """Events of one listen stream to the callback; its end (graceful or not) means the upstream is going."""
        try:
            async for event in sub:
                if isinstance(event, ResourcesListChanged):
                    await self._emit(ListChanged())
                elif isinstance(event, ResourceUpdated):
                    await self._emit(Updated(str(event.uri)))
            conn.mark_lost("the upstream ended the listen stream")
        except SubscriptionLost:
            conn.mark_lost("the listen stream was lost")


def _hints(client: Client, result: Any) -> tuple[int | None, str | None]:
    """The ttlMs and cacheScope the upstream sent, or None: the SDK fills in 0 and private when it sent none (always on
    the 2025-11-25 wire, where they are no hints at all), and those defaults are not the upstream's word."""
    if client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return None, None
    sent = result.model_fields_set
    return (result.ttl_ms if "ttl_ms" in sent else None, result.cache_scope if "cache_scope" in sent else None)


def _read_result(label: str, uri: str, result: types.ReadResourceResult, max_bytes: int, ttl_ms: int | None = None,
                 cache_scope: str | None = None) -> UpstreamRead:
    if not result.contents:
        raise SourceNotFound(f"{label}: resources/read {uri}: no contents")
    contents: list[UpstreamContent] = []
    for item in result.contents:
        if isinstance(item, types.TextResourceContents):
            if len(item.text) > max_bytes:  # a character is at least one byte
                raise SourceTooLarge(len(item.text), max_bytes)
            data, is_text = item.text.encode("utf-8", "surrogatepass"), True
        else:
            if len(item.blob) // 4 * 3 > max_bytes + 3:
                raise SourceTooLarge(len(item.blob) // 4 * 3, max_bytes)
            try:
                data, is_text = base64.b64decode(item.blob, validate=True), False
            except (binascii.Error, ValueError):
                raise SourceError(f"{label}: resources/read {uri}: a blob that is not base64") from None
        if len(data) > max_bytes:
            raise SourceTooLarge(len(data), max_bytes)
        contents.append(UpstreamContent(str(item.uri), item.mime_type, data, is_text))
    # The content for the URI asked comes first; a read may return sub-resources beside it.
    contents.sort(key=lambda c: c.uri != uri)
    return UpstreamRead(contents, ttl_ms, cache_scope)


async def _close_later(scope: anyio.CancelScope, delay: float) -> None:
    await anyio.sleep(delay)
    scope.cancel()


async def _ping(client: Client) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ping is the legacy wire's, which is the only one pinged
        await client.send_ping()


def _not_found(exc: MCPError) -> bool:
    """The legacy wire's -32002, or the modern wire's -32602 naming the URI in its data."""
    data = exc.error.data
    return exc.code == RESOURCE_NOT_FOUND or (exc.code == types.INVALID_PARAMS and isinstance(data, dict)
                                              and "uri" in data)


def _quote(exc: MCPError) -> str:
    """An upstream error for the log: its code and its message escaped and cut short (never for a client)."""
    return f"error {exc.code}: {str(exc.error.message)[:200]!r}"


def _describe_failure(exc: BaseException) -> str:
    """A short operator-facing reason for a failed connection or call (an exception group's first leaf)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return _quote(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def _version() -> str:
    from aggregator import __version__

    return __version__
