"""MCP wiring: one low-level `Server` speaking both wires, its handlers (handlers/) translating protocol requests
into `ResourceService` calls and back.

The wire in use decides error codes (not-found is -32002 on the legacy wire, -32602 on the modern one:
handlers/running.py) and the modern wire's results carry `ttlMs`/`cacheScope`.
"""

from __future__ import annotations

from typing import Any

import mcp.types as types
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from aggregator import __version__
from aggregator.handlers.resources import ResourceHandlers
from aggregator.handlers.subscriptions import add_subscriptions
from aggregator.handlers.tools import add_tools
from aggregator.mcp_shapes import contents_dict, resource_dict, template_dict
from aggregator.metrics import Metrics
from aggregator.notify import Notifier
from aggregator.search import Discovery
from aggregator.service import ResourceService

# contents_dict, resource_dict and template_dict live in mcp_shapes.py; named here as they always were.
__all__ = ["build_server", "contents_dict", "initialization_options", "resource_dict", "template_dict", "wire_summary"]


def build_server(service: ResourceService, notifier: Notifier | None = None, metrics: Metrics | None = None, *,
                 legacy_notifications: bool = True, discovery: Discovery | None = None) -> Server[Any]:
    """A low-level MCP server answering resources/list, resources/templates/list and resources/read, and with a
    notifier, resources/subscribe and unsubscribe (legacy wire) and subscriptions/listen (modern wire).

    Over HTTP a caller sees and reads only entries whose `access` scopes its token holds; over stdio (no HTTP
    request) everything. Results that depend on the caller say `cacheScope: private`.
    `legacy_notifications=False` (stateless HTTP: no session outlives a request) makes the legacy wire advertise
    neither subscribe nor listChanged and refuse `resources/subscribe`; the modern wire's listen is unaffected.
    `discovery` answers search:// reads and the list/search tools (its indexer runs apart: `Discovery.run`).
    """
    if discovery is None:
        discovery = Discovery(service, tools=service.manifest.server.tools)
    resources = ResourceHandlers(service, discovery, metrics)
    settings = service.manifest.server
    server: Server[Any] = _Server(
        settings.name,
        version=settings.version or __version__,
        title=settings.title,
        instructions=settings.instructions,
        on_list_resources=resources.list_resources,  # dict results are part of HandlerResult
        on_list_resource_templates=resources.list_templates,
        on_read_resource=resources.read_resource,
        on_completion=resources.complete,
        legacy_notifications=legacy_notifications and notifier is not None,
    )
    if notifier is not None:
        add_subscriptions(server, service, notifier, metrics, legacy=legacy_notifications)
    if settings.tools:
        add_tools(server, service, discovery, metrics)
    return server


class _Server(Server[Any]):
    """The SDK's low-level Server, whose legacy-wire capabilities advertise subscribe and listChanged truthfully.

    `streamable_http_app()` builds its options with a bare `NotificationOptions()`; this default makes HTTP
    sessions advertise what stdio ones do. Without legacy notifications (stateless HTTP) the legacy wire
    advertises neither; the modern wire's flags follow `subscriptions/listen` as the SDK derives them.
    """

    def __init__(self, *args: Any, legacy_notifications: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.legacy_notifications = legacy_notifications

    def create_initialization_options(self, notification_options: NotificationOptions | None = None,
                                      *args: Any, **kwargs: Any) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(resources_changed=self.legacy_notifications), *args, **kwargs)

    def get_capabilities(self, *args: Any, protocol_version: str | None = None, **kwargs: Any
                         ) -> types.ServerCapabilities:
        capabilities = super().get_capabilities(*args, protocol_version=protocol_version, **kwargs)
        if (protocol_version not in MODERN_PROTOCOL_VERSIONS and not self.legacy_notifications
                and capabilities.resources is not None):
            # The subscribe handler stays registered (to refuse with a reason), so the SDK would say true.
            capabilities.resources = types.ResourcesCapability(subscribe=False, list_changed=False)
        return capabilities


def initialization_options(server: Server[Any]) -> InitializationOptions:
    # listChanged is true only when the server can send it (a notifier is wired); subscribe follows the handler.
    return server.create_initialization_options()


def wire_summary() -> str:
    modern = ", ".join(sorted(MODERN_PROTOCOL_VERSIONS))
    return f"wires: legacy (2024-11-05..2025-11-25) and modern ({modern})"
