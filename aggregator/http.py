"""Streamable HTTP extras: transport security for any bind address, and /healthz."""

from __future__ import annotations

from typing import Any

from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from aggregator.manifest.model import HttpSettings

__all__ = ["health_route", "transport_security"]

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


def health_route(live: Any) -> Route:
    """GET /healthz: the catalog generation, its size and the last reload error (if the last reload failed)."""

    async def healthz(request: Request) -> JSONResponse:
        catalog = live.aggregator.catalog
        return JSONResponse({"status": "ok", "generation": catalog.generation, "resources": len(catalog),
                             "templates": len(catalog.templates), "reloads": live.reloads,
                             "lastReloadError": live.last_error})

    return Route("/healthz", healthz, methods=["GET"])
