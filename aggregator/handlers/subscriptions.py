"""resources/subscribe and unsubscribe (legacy wire), subscriptions/listen (modern wire) and the legacy
`initialized` notification, over the `Notifier`. A caller subscribes to, and hears of, only URIs its scopes let it
read; hidden URIs are refused or dropped exactly as unknown ones are, so they cannot be probed for."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from aggregator.errors import ResourceNotFound
from aggregator.handlers.running import INVALID_PARAMS, run_handler, scopes_of
from aggregator.metrics import Metrics
from aggregator.notify import Notifier, TooManySubscriptions
from aggregator.sdk_compat import connection_of
from aggregator.service import ResourceService

__all__ = ["STATELESS_SUBSCRIBE", "add_subscriptions"]

STATELESS_SUBSCRIBE = ("resources/subscribe is not available: this server runs stateless (--stateless), so no "
                       "session outlives a request to deliver notifications/resources/updated on; use "
                       "subscriptions/listen on the 2026-07-28 wire, or a server without --stateless")


def add_subscriptions(server: Server[Any], service: ResourceService, notifier: Notifier,
                      metrics: Metrics | None, *, legacy: bool = True) -> None:
    """Register the subscription handlers on `server`; without `legacy` (stateless HTTP) subscribe is refused
    with the reason and no legacy connection is registered."""
    async def subscribe(ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams) -> types.EmptyResult:
        uri = str(params.uri)

        async def body() -> types.EmptyResult:
            if not legacy:
                # Accepting would be a promise never kept: the session is thrown away with this request.
                raise MCPError(types.METHOD_NOT_FOUND, STATELESS_SUBSCRIBE, data={"uri": uri})
            # Unknown or hidden URIs get the not-found error, not a silent subscription.
            scopes = scopes_of(ctx)
            service.allowed(uri, scopes)
            try:
                notifier.subscribe(connection_of(ctx), ctx.session, uri, _visible_to(service, scopes), scopes=scopes)
            except TooManySubscriptions as exc:
                raise MCPError(INVALID_PARAMS, str(exc), data={"uri": uri}) from None
            return types.EmptyResult()

        return await run_handler(ctx, uri, body, metrics)

    async def unsubscribe(ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        notifier.unsubscribe(connection_of(ctx), str(params.uri))
        return types.EmptyResult()

    async def listen(ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams) -> Any:
        scopes, uris = scopes_of(ctx), params.notifications.resource_subscriptions or []
        kept = [uri for uri in uris if scopes is None or _listenable(service, uri, scopes)]
        if len(kept) != len(uris):
            # Hidden URIs are dropped as silently as unknown ones are kept: a caller cannot probe for them.
            notifications = params.notifications.model_copy(update={"resource_subscriptions": kept})
            params = params.model_copy(update={"notifications": notifications})
        try:
            return await notifier.listen(ctx, params, scopes, _visible_to(service, scopes))
        except TooManySubscriptions as exc:
            raise MCPError(INVALID_PARAMS, str(exc)) from None

    async def initialized(ctx: ServerRequestContext[Any], params: types.NotificationParams) -> None:
        # A legacy connection: from now on it hears list_changed when its caller's listing changes.
        notifier.register(connection_of(ctx), ctx.session, scopes_of(ctx))

    server.add_request_handler("resources/subscribe", types.SubscribeRequestParams, subscribe)
    server.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, unsubscribe)
    server.add_request_handler("subscriptions/listen", types.SubscriptionsListenRequestParams, listen)
    if legacy:  # a stateless session is thrown away with its request: nothing to register
        server.add_notification_handler("notifications/initialized", types.NotificationParams, initialized)


def _readable(service: ResourceService, uri: str, scopes: frozenset[str]) -> bool:
    try:
        service.allowed(uri, scopes)
    except ResourceNotFound:
        return False
    return True


def _visible_to(service: ResourceService, scopes: frozenset[str] | None) -> Callable[[str], bool] | None:
    """Whether a caller may hear `updated` for a URI, asked when it is sent: a reload may have added `access` to
    it, or it may have appeared hidden. None for a trusted (stdio) caller, who hears everything."""
    if scopes is None:
        return None
    return lambda uri: _readable(service, uri, scopes)


def _listenable(service: ResourceService, uri: str, scopes: frozenset[str]) -> bool:
    """Unknown URIs may be listened to (they may appear); known ones only with the scopes they need."""
    if _readable(service, uri, scopes):
        return True
    try:
        service.catalog.resolve(uri)
    except ResourceNotFound:
        return True
    return False
