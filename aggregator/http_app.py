"""The Streamable HTTP app: /mcp with transport security on any bind address and optional bearer auth, plus
/healthz, /metrics and the RFC 9728 protected-resource metadata."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from aggregator.http_fast import fast_http_reads
from aggregator.http_gone import json_gone
from aggregator.manifest.model import HttpSettings
from aggregator.metrics import Metrics, metrics_route

if TYPE_CHECKING:
    from mcp.server.lowlevel import Server
    from starlette.types import ASGIApp

    from aggregator.console.app import Console
    from aggregator.service import ResourceService

__all__ = ["health_route", "http_app", "transport_security"]

logger = logging.getLogger("aggregator.http")

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def transport_security(host: str, port: int, settings: HttpSettings) -> TransportSecuritySettings:
    """Host and Origin checks on every bind, loopback or not: the bind address, loopback names and the manifest's lists.

    Binding 0.0.0.0 accepts only the hosts the manifest names (plus loopback): a DNS-rebinding page cannot reach it.
    """
    hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
    origins = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
    if host not in _LOOPBACK and host not in ("0.0.0.0", "::"):
        bound = f"[{host}]" if ":" in host else host
        hosts.append(f"{bound}:{port}")
        origins += [f"http://{bound}:{port}", f"https://{bound}:{port}"]
    hosts += list(settings.allowed_hosts)
    origins += list(settings.allowed_origins)
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                     allowed_origins=origins)


class Health(Protocol):
    """What the app and /healthz read from the supervisor (aggregator.supervisor.Supervisor)."""

    @property
    def service(self) -> ResourceService: ...

    @property
    def reloads(self) -> int: ...

    @property
    def last_error(self) -> str | None: ...

    def cluster_health(self) -> dict[str, object] | None: ...


def health_route(live: Health) -> Route:
    """GET /healthz: the catalog generation, its size, the last reload error (if the last reload failed), the
    sha256 of the manifest being served (equal on replicas serving the same manifest), and the
    connection state of sources that keep one (MCP upstreams: how many are connected, reconnects; per source only
    in /metrics, since this route stays open to any Host and names no source); with `server.cluster`, whether the
    change bus is up, this replica's id and the poll leases it holds (never the Redis URL)."""

    async def healthz(request: Request) -> JSONResponse:
        catalog = live.service.catalog
        body: dict[str, Any] = {"status": "ok", "generation": catalog.generation, "resources": len(catalog),
                                "templates": len(catalog.templates), "reloads": live.reloads,
                                "lastReloadError": live.last_error,
                                "manifest": {"sha256": live.service.manifest.digest}}
        upstreams = live.service.health().values()
        if upstreams:
            body["upstreams"] = {
                "total": len(upstreams), "connected": sum(h.get("state") == "connected" for h in upstreams),
                "reconnects": sum(h["reconnects"] for h in upstreams if isinstance(h.get("reconnects"), int))}
        cluster = live.cluster_health()
        if cluster is not None:
            body["cluster"] = cluster
        return JSONResponse(body)

    return Route("/healthz", healthz, methods=["GET"])


def http_app(server: Server[Any], live: Health, metrics: Metrics, host: str, port: int, *,
             json_response: bool = False, stateless: bool = False, console: Console | None = None) -> ASGIApp:
    """The ASGI app `aggregator serve --http` runs: MCP at /mcp (behind bearer auth when `server.auth` is set), and
    with `console` the operator's console at /console (its data behind the same auth)."""
    settings = live.service.manifest.server
    auth = settings.auth
    security = transport_security(host, port, settings.http)
    # /healthz stays open to any Host so that probes addressing a pod by its IP work; it names no source or file.
    routes = [health_route(live), metrics_route(metrics, TransportSecurityMiddleware(security))]
    if console is not None:
        routes += console.routes(TransportSecurityMiddleware(security))
    resource = None
    if auth is not None:
        from aggregator.auth import metadata_routes

        bound = f"[{host}]" if ":" in host else host
        resource = auth.resource or f"http://{bound}:{port}/mcp"
        if auth.resource is None and host in ("0.0.0.0", "::"):
            logger.warning("server.auth.resource is not set: tokens must name %s as their audience; set it to the "
                           "URL clients use", resource)
        routes += metadata_routes(auth, resource)
    elif live.service.catalog.restricted:
        logger.warning("entries declare access scopes but server.auth is not set: HTTP callers see none of them")
    sdk_app = server.streamable_http_app(
        streamable_http_path="/mcp", json_response=json_response, stateless_http=stateless, host=host,
        transport_security=security,
        max_request_body_size=settings.http.max_body_bytes, custom_starlette_routes=routes)
    # Inside the auth guard (protect, below): the fast path sees only callers that passed it, as the SDK's app does.
    # With JSON answers, what the fast path hands on is watched for its client going away (the SDK's is not).
    handed_on = json_gone(sdk_app, max_body=settings.http.max_body_bytes, json_response=json_response)
    app = fast_http_reads(handed_on, server, security, max_body=settings.http.max_body_bytes, json_response=json_response,
                          stateless=stateless)
    if auth is None or resource is None:
        return app
    from aggregator.auth import protect, verifier_for

    return protect(app, verifier_for(auth, resource), prefixes=("/console/api/",) if console is not None else ())
