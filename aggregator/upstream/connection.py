"""One connection to one upstream MCP server, kept alive: calls with timeouts and a concurrency cap, reconnection with
capped exponential backoff; its listings (paging.py), reads (answers.py) and change events (events.py).

The connection lives in a background task (started by the first call, or `connect()`; ended by `aclose()`), because
the SDK's client must be entered and left in one task while any task may call. A call waits while a connection is
being made, fails at once while the upstream is down (state `failed`, between attempts), and is sent again once when
the connection was lost under it (a restarted child, an HTTP server that forgot our session).

Errors are `aggregator.sources.base` errors whose text is for the operator: an upstream's own error messages are
quoted there (escaped, truncated), and never reach a client, since the read path maps SourceError to a fixed message.
"""

from __future__ import annotations

import logging
import math
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import anyio
import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from aggregator import tracing
from aggregator.sources.base import SourceError, SourceNotFound, SourceUnsupported
from aggregator.upstream.answers import (Listing, Make, UpstreamContent, UpstreamRead, hints, listed, read_answer,
                                         read_result, upstream_read)
from aggregator.upstream.backoff import Backoff
from aggregator.upstream.events import ChangeRelay, EventCallback, ListChanged, Updated, UpstreamEvent
from aggregator.upstream.failures import LOST, TOO_BIG, describe_failure, not_found, past_cap, quote, too_big
from aggregator.upstream.http_session import SessionWatch
from aggregator.upstream.lane import Lane, result_of
from aggregator.upstream.link import Link
from aggregator.upstream.pages import Page, model_page, parsed_page
from aggregator.upstream.paging import MAX_ENTRIES, CutNotice, pages_for, paginate
from aggregator.upstream.relaying import Route
from aggregator.upstream.transports import HttpTarget, Target

__all__ = ["ListChanged", "Listing", "Upstream", "UpstreamContent", "UpstreamEvent", "UpstreamRead",
           "UpstreamStatus", "Updated"]

logger = logging.getLogger("aggregator.upstream")

T = TypeVar("T")
R = TypeVar("R")
State = Literal["idle", "connecting", "connected", "failed", "closed"]

MAX_COMPLETIONS = 100
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The default cap on one message from the upstream (the manifest's `maxMessageBytes`)."""
MAX_FRAMES = 5
"""Frames of a traceback logged when the connection's task dies (where it failed, never what it held)."""


@dataclass(frozen=True, slots=True)
class UpstreamStatus:
    """What `/healthz` and `/metrics` show for one upstream."""

    state: State
    reconnects: int
    last_error: str | None
    """Operator detail only (it may quote the upstream)."""
    protocol_version: str | None
    connected_at: float | None = None
    """When (time.time()) the last connection was made; None: never."""
    retry_in: float | None = None
    """Seconds until the next attempt to connect while failed; None: none is waiting."""


class Upstream:
    """A kept-alive client of one upstream MCP server (see the module docstring)."""

    def __init__(self, name: str, target: Target, *, timeout: float = 30.0, connect_timeout: float | None = None,
                 max_concurrency: int = 8, mode: str = "auto", max_pages: int | None = None,
                 max_entries: int = MAX_ENTRIES, list_timeout: float | None = None,
                 max_message_bytes: int = MAX_MESSAGE_BYTES,
                 backoff: tuple[float, float] = (0.5, 30.0), health_interval: float = 15.0) -> None:
        self.name = name
        self.target = target
        self._described = target.describe()  # named in every read's errors: made once
        self.timeout = timeout
        self.connect_timeout = connect_timeout if connect_timeout is not None else timeout
        self.list_timeout = list_timeout if list_timeout is not None else timeout * 4
        self.max_pages = max_pages if max_pages is not None else pages_for(max_entries)
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
        self._connected_at: float | None = None
        self._conn: Link | None = None
        self._changed = anyio.Event()
        self._runner: Any = None
        self._runner_scope: anyio.CancelScope | None = None
        self._events = ChangeRelay(self.describe(), timeout, health_interval)
        self._cuts = CutNotice(f"{self.describe()} ({name})")
        self._was_up = False
        self._closing = False

    # ---- state ----

    def describe(self) -> str:
        return self._described

    @property
    def status(self) -> UpstreamStatus:
        conn = self._conn
        version = conn.client.protocol_version if conn is not None and self._state == "connected" else None
        return UpstreamStatus(self._state, self._reconnects, self._last_error, version, self._connected_at,
                              self._retry_in())

    def _retry_in(self) -> float | None:
        due = self._backoff.due
        if due is None or self._state != "failed":
            return None
        try:
            return max(0.0, due - anyio.current_time())
        except RuntimeError:  # asked outside the event loop: the wait is under way, its end unknown here
            return None

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
            self._runner.add_done_callback(self._runner_ended)

    def _runner_ended(self, task: Any) -> None:
        """The connection's task ended. Cancelled or closing is expected; an exception is a defect of ours, which a
        detached task would keep to itself: logged (its type, its message cut short, the frames where it happened;
        no locals) and the upstream marked failed, so calls fail at once instead of waiting for a task that is gone."""
        if task.cancelled() or (exc := task.exception()) is None:
            return
        reason = describe_failure(exc)
        where = "".join(traceback.format_tb(exc.__traceback__)[-MAX_FRAMES:]).rstrip()
        logger.error("%s (%s): the connection's task ended: %s\n%s", self.describe(), self.name, reason, where)
        if not self._closing:
            self._set_state("failed", f"the connection's task ended: {reason}")

    async def _ready(self) -> Link:
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
                    reason = describe_failure(exc)
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
                    await self._events.emit(ListChanged())
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
        lanes: list[Lane] = []
        transport = self.target.open(self.name, lost, self.max_message_bytes, self.timeout, session, lanes.append)
        # The SDK's own timeout bounds each request, the handshake's too (a legacy initialize is a request): no
        # shorter than connect_timeout, which the scope below enforces for the whole handshake, nor than a listing's
        # page may take. Every call after the handshake is bounded by its own limit (`_call`).
        client = Client(transport, mode=self.mode, cache=None,
                        read_timeout_seconds=max(self.timeout, self.connect_timeout, self.list_timeout),
                        message_handler=self._events.on_message,
                        client_info=types.Implementation(name="aggregator", version=_version()))
        with anyio.CancelScope(deadline=anyio.current_time() + self.connect_timeout) as connecting:
            async with client:
                connecting.deadline = math.inf
                conn = Link(client, session)
                if lanes:
                    conn.lane = lanes[-1]
                    conn.lane.negotiated(client.protocol_version, {"name": "aggregator", "version": _version()})
                self._conn = conn
                first = not self._events.ever_connected
                # A first connection after failed attempts: whoever listed meanwhile got nothing, so tell them too
                # (once events flow: see ChangeRelay.watch).
                self._events.missed |= not first or self._last_error is not None
                self._events.ever_connected = self._was_up = True
                if not first:
                    self._reconnects += 1
                async with anyio.create_task_group() as tg:
                    # Calls wait until its events are heard (modern: the listen stream acknowledged): a listing
                    # made from then on misses none, so a listener that comes after it need not list again.
                    await tg.start(self._events.watch, conn)
                    self._backoff.reset(recovering=False)
                    self._connected_at = time.time()
                    self._set_state("connected")
                    logger.info("%s (%s): connected (%s)", self.describe(), self.name, client.protocol_version)
                    await conn.lost.wait()
                    tg.cancel_scope.cancel()
        if connecting.cancelled_caught and not self._was_up:
            raise TimeoutError(f"no connection within {self.connect_timeout:g}s")
        return conn.reason or "connection lost"

    # ---- calls ----

    async def _call(self, what: str, fn: Callable[[Client], Awaitable[T]], timeout: float | None = None,
                    retried: bool = False) -> T:
        """Run `fn` on a ready connection within the timeout and the concurrency cap; errors mapped to SourceError.
        `retried`: this is already the call's second attempt (it is not sent again)."""
        limit = self.timeout if timeout is None else timeout
        try:
            with anyio.fail_after(limit):
                async with self._limiter:
                    for attempt in (1,) if retried else (0, 1):
                        conn = await self._ready()
                        try:
                            return await fn(conn.client)
                        except MCPError as exc:
                            if attempt == 0 and self._again(what, conn, exc):
                                continue
                            raise
                    raise AssertionError("unreachable")
        except Exception as exc:  # noqa: BLE001 - every failure is mapped (cancellation is no Exception)
            failure = self._failure(what, exc, limit)
            if failure is exc:
                raise
            raise failure from None

    def _again(self, what: str, conn: Link, exc: MCPError) -> bool:
        """Whether a call that failed with `exc` on `conn` goes to the next connection (this one is marked lost); a
        call whose answer was past the cap fails here (sending it again would bring the same message)."""
        if past_cap(exc) or (conn.reason is not None and conn.reason.endswith(TOO_BIG)):
            # This call fails, and only this one unless the connection ended for it (a message that named no call).
            raise SourceError(f"{self.describe()} ({self.name}): {what}: {too_big(self.max_message_bytes)}") from None
        # Lost under the call: closed, the session forgotten (the transport saw the refusal and marked it), or failed
        # while a session's event stream was down (the server went away).
        if exc.code in LOST or conn.lost.is_set() or (conn.session is not None and conn.session.stream_down):
            conn.mark_lost(f"{what}: {quote(exc)}")
            return True
        return False

    def _failure(self, what: str, exc: Exception, limit: float) -> Exception:
        """What a call's caller sees of `exc`: a SourceError (not found, unsupported, or neither), `exc` itself when
        it is one already."""
        if isinstance(exc, TimeoutError):
            return SourceError(f"{self.describe()}: no answer to {what} within {limit:g}s")
        if isinstance(exc, MCPError):
            if not_found(exc):
                return SourceNotFound(f"{self.describe()}: {what}: {quote(exc)}")
            if exc.code == types.METHOD_NOT_FOUND:  # the upstream has none of what was asked (no templates...)
                return SourceUnsupported(f"{self.describe()}: {what}: {quote(exc)}")
            return SourceError(f"{self.describe()}: {what}: {quote(exc)}")
        if isinstance(exc, ValidationError):
            return SourceError(f"{self.describe()}: {what}: malformed answer ({exc.error_count()} errors)")
        if isinstance(exc, SourceError):
            return exc
        # A transport failure under a call: the caller sees SourceError.
        return SourceError(f"{self.describe()}: {what}: {describe_failure(exc)}")

    async def _paginate(self, what: str, page: Callable[[Client, str | None, int], Awaitable[Page]]) -> Listing:
        settles = answered = False

        def pages(client: Client) -> Awaitable[Listing]:
            nonlocal settles
            settles = self._events.listing()  # sent now, on a connection that is up
            return paginate(what, lambda cursor, room: page(client, cursor, room), self.max_pages, self.max_entries)

        try:
            listing = await self._call(what, pages, self.list_timeout)
            answered = True
        finally:
            self._events.listed_all(answered, settles)
        self._cuts.heard(what, listing)
        return listing

    async def list_resources(self) -> Listing:
        """Every resource the upstream lists (cursors followed, capped); items are `ListedResource` records. Over
        stdio its pages come on the lean lane as dicts (`pages.resource_page`), but with tracing on (the SDK's span)."""
        async def page(client: Client, cursor: str | None, room: int) -> Page:
            lane = self._conn.lane if self._conn is not None and self._conn.client is client else None
            if lane is not None and lane.ready and not tracing.enabled():
                return await parsed_page(await lane.list_resources(cursor), client.protocol_version or _LEGACY, room)
            result = await client.list_resources(cursor=cursor, cache_mode="bypass")
            return model_page(client, result, result.resources, room, listed)

        return await self._paginate("resources/list", page)

    async def list_templates(self) -> Listing:
        """Every resource template the upstream lists; items are `mcp_types.ResourceTemplate`."""
        async def page(client: Client, cursor: str | None, room: int) -> Page:
            result = await client.list_resource_templates(cursor=cursor, cache_mode="bypass")
            return model_page(client, result, result.resource_templates, room)

        return await self._paginate("resources/templates/list", page)

    async def read(self, uri: str, max_bytes: int) -> UpstreamRead:
        """The contents of `uri`; SourceNotFound if the upstream has none, SourceTooLarge past `max_bytes`.

        Over stdio, a read on a connection that is up while the cap has room is sent at once on the lean lane, its
        timeout the lane's own: no cancel scope, no wait for a slot, no task hop. Any other read waits as `_call`
        says (a slot, a connection), and one the lane lost goes to the next connection that way."""
        conn, borrower = self._conn, object()
        lane = self._free_lane(borrower)
        if conn is not None and lane is not None:
            answer: dict[str, Any] | None | Exception
            try:
                answer = await lane.ask(uri, self.timeout)
            except Exception as exc:  # noqa: BLE001 - mapped as `_call` maps it (cancellation is no Exception)
                answer = exc
            finally:
                self._limiter.release_on_behalf_of(borrower)
            if (settled := self._settled(conn, lane, uri, max_bytes, answer, upstream_read)) is not None:
                return settled

        async def read(client: Client) -> UpstreamRead:
            lane = self._conn.lane if self._conn is not None and self._conn.client is client else None
            # With tracing on, a read keeps the SDK client's span and sends its trace context upstream.
            if lane is not None and lane.ready and not tracing.enabled():
                return self._answer(uri, await lane.read(uri), max_bytes, lane.modern)
            result = await client.read_resource(uri, cache_mode="bypass")
            return read_result(self.describe(), uri, result, max_bytes, *hints(client, result))

        return await self._call(_READ, read, retried=conn is not None and lane is not None)

    def route(self, uri: str, max_bytes: int, make: Make[R]) -> Route:
        """Reads of `uri` sent on the lean lane without a task, their outcomes what `read` returns (made by `make` of
        a read's contents and hints: see `answers.read_result`) or raises (see `relaying.Route`)."""
        return Route(self, uri, max_bytes, make)

    def _settled(self, conn: Link, lane: Lane, uri: str, max_bytes: int, answer: dict[str, Any] | None | BaseException,
                 make: Make[R]) -> R | None:
        """A lane read's outcome: its answer (the message, None when the connection ended) checked and made by `make`
        (`answers.read_result`), or the failure its caller sees (raised); None when the connection was lost under it
        (the read goes to the next connection)."""
        try:
            if isinstance(answer, BaseException):
                raise answer
            result = result_of(answer)
            made = read_answer(self._described, uri, result, max_bytes, lane.modern, make)  # `_answer`, one call less
            return made if made is not None else self._modelled(uri, result, max_bytes, lane.modern, make)
        except MCPError as exc:
            if not self._again(_READ, conn, exc):
                raise self._failure(_READ, exc, self.timeout) from None
            return None
        except Exception as exc:  # noqa: BLE001 - mapped as `_call` maps it
            failure = self._failure(_READ, exc, self.timeout)
            if failure is exc:
                raise
            raise failure from None

    def _free_lane(self, borrower: object) -> Lane | None:
        """The lean lane of the connection that is up, with a slot of the cap taken for the read on behalf of
        `borrower` (the caller releases it: one borrower a read, so no lookup of the current task); None (no slot
        taken) when the read must wait (no connection up, no lane, the cap full) or keep the SDK's span."""
        conn = self._conn
        lane = conn.lane if conn is not None else None
        if (lane is None or not lane.ready or self._state != "connected" or conn is None or conn.lost.is_set()
                or tracing.enabled()):
            return None
        try:
            self._limiter.acquire_on_behalf_of_nowait(borrower)
        except anyio.WouldBlock:  # full: `_call` waits
            return None
        return lane

    def _answer(self, uri: str, answer: dict[str, Any], max_bytes: int, modern: bool) -> UpstreamRead:
        """A read's answer from the lane, checked as the SDK's model checks it (ValidationError when it fails)."""
        return (read_answer(self._described, uri, answer, max_bytes, modern)
                or self._modelled(uri, answer, max_bytes, modern, upstream_read))

    def _modelled(self, uri: str, answer: dict[str, Any], max_bytes: int, modern: bool,
                  make: Make[R]) -> R:
        """`_answer` of a result `read_answer` leaves to the SDK's model, made by `make`."""
        result = types.ReadResourceResult.model_validate(answer, by_name=False)
        sent = result.model_fields_set
        given = ((result.ttl_ms if "ttl_ms" in sent else None, result.cache_scope if "cache_scope" in sent else None)
                 if modern else (None, None))
        return read_result(self.describe(), uri, result, max_bytes, *given, make)

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
        may have gone unheard: an event came while nobody listened (or after a listener stopped), after a reconnect
        (or a first connection after failed attempts), when an event stream opened after a listing (a legacy HTTP
        session's; modern: one refused at first). A listener that starts after a listing, with nothing told
        meanwhile, is told nothing: calls wait until events are heard (modern: a listen stream is open from before
        the first call, whether anyone listens or not). Nor is one told ListChanged again before it sent a listing
        (a reconnect after the loss told it): unless that listing fails, in which case it is told after all."""
        self._events.on_change(callback)

    def subscribe(self, uris: Iterable[str]) -> None:
        """Ask for Updated events of exactly `uris` (legacy: resources/subscribe; modern: subscriptions/listen)."""
        self._events.subscribe(uris)


_READ = "resources/read"
_LEGACY = "2025-11-25"
"""The wire the SDK's client checks results against before a handshake told it one."""


def _version() -> str:
    from aggregator import __version__

    return __version__
