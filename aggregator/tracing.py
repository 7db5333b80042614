"""OpenTelemetry traces, off unless the standard OTEL_* variables ask for them (docs/tracing.md).

`span(name, **attributes)` is what the read path calls: while tracing is off it returns one shared no-op object
after a single flag check, and nothing of OpenTelemetry is imported for it. `setup_tracing()` (run once per serving
process by `serve`) turns tracing on when the environment asks and the `otel` extra is installed; the SDK's own
request spans then go to the same exporter, and ours nest beneath them (the current span is a contextvar, which
anyio tasks inherit).
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import sys
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import Any

__all__ = ["NO_SPAN", "SDK_SCOPE", "Span", "cache_event", "disable", "enable", "enabled", "scrubbed", "setup_tracing",
           "shutdown_tracing", "span", "wanted"]

logger = logging.getLogger("aggregator.tracing")

SDK_SCOPE = "mcp-python-sdk"
"""The instrumentation scope of the MCP SDK's own spans."""
SHUTDOWN_SECONDS = 5.0
"""How long exit waits for the last spans to be exported."""

_tracer: Any = None
"""The aggregator's tracer while tracing is on; None is the one flag the hot path checks."""
_provider: Any = None


class _Off:
    """The span while tracing is off: a no-op context manager and attribute sink, one shared instance."""

    __slots__ = ()

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        return None

    def set(self, **attributes: object) -> None:
        """Add attributes (named as for `span`)."""


_OFF = _Off()
Span = _Off
"""What `span` returns: a context manager with `set(**attributes)`."""
NO_SPAN: Span = _OFF
"""What `span` returns while tracing is off: for a hot path that builds a span's attributes only when `enabled()`."""


class _Live(_Off):
    """A started span, current for the `with` block; a failure sets status ERROR and `error.type`, never the
    message (an upstream's error text may quote its response body or a URL with credentials)."""

    __slots__ = ("_manager", "_span")

    def __init__(self, name: str, attributes: Mapping[str, object]) -> None:
        self._manager = _tracer.start_as_current_span(name, attributes=_named(attributes), record_exception=False,
                                                      set_status_on_exception=False)
        self._span: Any = None

    def __enter__(self) -> _Live:
        self._span = self._manager.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None and isinstance(exc, Exception):
            from opentelemetry.trace import StatusCode

            error = type(exc).__qualname__
            self._span.set_attribute("error.type", error)
            self._span.add_event("exception", {"exception.type": error})
            self._span.set_status(StatusCode.ERROR, error)
        self._manager.__exit__(kind, exc, tb)

    def set(self, **attributes: object) -> None:
        self._span.set_attributes(_named(attributes))


def span(name: str, **attributes: object) -> Span:
    """A span named `name`, child of the current one, for a `with` block; attributes are named `aggregator.` +
    the keyword with `_` as `.` (source_id -> aggregator.source.id); None values are left out."""
    if _tracer is None:
        return _OFF
    return _Live(name, attributes)


def cache_event(outcome: str, key: object = None) -> None:
    """Record a cache lookup's outcome (hit | miss | revalidated | stale) on the current span as an
    `aggregator.cache` event, with the key's `source` and `path` when it has them (a query's SQL and parameters
    stay out)."""
    if _tracer is None:
        return
    from opentelemetry.trace import get_current_span

    named = _named({"source_id": getattr(key, "source", None), "path": getattr(key, "path", None)})
    get_current_span().add_event("aggregator.cache", {"aggregator.cache.outcome": outcome, **named})


def enabled() -> bool:
    return _tracer is not None


def _named(attributes: Mapping[str, object]) -> dict[str, Any]:
    return {"aggregator." + key.replace("_", "."): value for key, value in attributes.items() if value is not None}


# --- turning it on -------------------------------------------------------------------------------------------


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the standard variables ask for traces: an exporter other than `none`, or an OTLP endpoint;
    OTEL_SDK_DISABLED=true wins over both."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = _exporter_names(environ)
    if exporters:
        return exporters != ["none"]
    return bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _exporter_names(environ: Mapping[str, str]) -> list[str]:
    return [name.strip().lower() for name in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if name.strip()]


def setup_tracing(environ: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on if the environment asks for it (see `wanted`) and the `otel` extra is installed; True if
    on. Spans are batched to the exporters OTEL_TRACES_EXPORTER names (default otlp: http/protobuf, configured by
    its own OTEL_EXPORTER_OTLP_* variables; console), and flushed at exit within SHUTDOWN_SECONDS."""
    environ = os.environ if environ is None else environ
    if _tracer is not None or not wanted(environ):
        return _tracer is not None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        logger.warning("OTEL_* variables ask for traces but the OpenTelemetry SDK is not installed: install "
                       "mcp-aggregator[otel]; serving without traces")
        return False
    exporters = [exporter for name in (_exporter_names(environ) or ["otlp"]) if name != "none"
                 for exporter in [_exporter(name, environ)] if exporter is not None]
    if not exporters:
        return False
    provider = TracerProvider(resource=Resource.create(_resource_defaults(environ)), shutdown_on_exit=False)
    for exporter in exporters:
        provider.add_span_processor(scrubbed(BatchSpanProcessor(exporter)))
    enable(provider)
    atexit.register(shutdown_tracing)
    logger.info("tracing on: exporting spans to %s", ", ".join(type(e).__name__ for e in exporters))
    return True


def _exporter(name: str, environ: Mapping[str, str]) -> Any:
    """The span exporter `name` stands for, or None (logged) if unknown or not installed."""
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(out=sys.stderr)  # stdout may be the MCP wire
    if name != "otlp":
        logger.warning("OTEL_TRACES_EXPORTER=%s is not supported (otlp, console or none); ignored", name)
        return None
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip().lower()
    try:
        if protocol == "grpc":
            # Not in the extra (it pulls in grpcio); used when installed.
            return importlib.import_module("opentelemetry.exporter.otlp.proto.grpc.trace_exporter").OTLPSpanExporter()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        if protocol != "http/protobuf":
            logger.warning("OTLP protocol %r is not supported; using http/protobuf", protocol)
        return OTLPSpanExporter()  # reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, HEADERS, TIMEOUT... itself
    except ImportError:
        logger.warning("the OTLP %s span exporter is not installed: install mcp-aggregator[otel]%s; serving "
                       "without it", protocol, " and opentelemetry-exporter-otlp-proto-grpc" if protocol == "grpc"
                       else "")
        return None


def _resource_defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """service.name "aggregator" and service.version, unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES name
    them (Resource.create reads both variables; attributes passed to it would win over them)."""
    from aggregator import __version__

    given = environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    keys = {item.split("=", 1)[0].strip() for item in given.split(",") if "=" in item}
    defaults = {}
    if not environ.get("OTEL_SERVICE_NAME") and "service.name" not in keys:
        defaults["service.name"] = "aggregator"
    if "service.version" not in keys:
        defaults["service.version"] = __version__
    return defaults


def scrubbed(processor: Any) -> Any:
    """`processor` (an SDK SpanProcessor) fed the SDK's spans without error texts: a CLIENT span's status
    description is the upstream MCP server's error message, and an exception's message and stack trace (in its
    event and the status) may quote anything; the JSON-RPC code (`error.type`) and the exception's type stay."""
    from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
    from opentelemetry.trace import SpanKind, Status

    def scrub(span: ReadableSpan) -> ReadableSpan:
        scope = span.instrumentation_scope
        if scope is None or scope.name != SDK_SCOPE:
            return span  # ours: never carry a message in the first place
        raised = [e for e in span.events if e.name == "exception"]
        loud = [e for e in raised if len(e.attributes or {}) > 1]
        # A recorded exception's span took its status text from the exception's message.
        quiet = span.status.description is not None and (span.kind is SpanKind.CLIENT or bool(raised))
        if not quiet and not loud:
            return span
        events = [Event(e.name, {k: v for k, v in (e.attributes or {}).items() if k == "exception.type"},
                        e.timestamp) if e in loud else e for e in span.events]
        error_type = (raised[0].attributes or {}).get("exception.type") if raised else None
        status = Status(span.status.status_code, str(error_type) if error_type else None) if quiet else span.status
        return ReadableSpan(name=span.name, context=span.context, parent=span.parent, resource=span.resource,
                            attributes=span.attributes, events=events, links=span.links, kind=span.kind,
                            status=status, start_time=span.start_time, end_time=span.end_time,
                            instrumentation_scope=scope)

    class Scrubbed(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            processor.on_start(span, parent_context=parent_context)

        def on_end(self, span: ReadableSpan) -> None:
            processor.on_end(scrub(span))

        def shutdown(self) -> None:
            processor.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(processor.force_flush(timeout_millis))

    return Scrubbed()


def enable(provider: Any) -> None:
    """Send spans (ours and the SDK's) to `provider`, an SDK TracerProvider; tests pass one with an in-memory
    exporter. The global provider can be set once per process: a later call only moves our own spans."""
    from opentelemetry import trace

    global _tracer, _provider
    if not isinstance(trace.get_tracer_provider(), type(provider)):
        trace.set_tracer_provider(provider)
    _provider = provider
    _tracer = provider.get_tracer("aggregator")


def disable() -> None:
    """Stop making our spans (the global provider, once set, stays)."""
    global _tracer, _provider
    _tracer = _provider = None


def shutdown_tracing(timeout: float = SHUTDOWN_SECONDS) -> None:
    """Export what is batched and stop, waiting at most `timeout` seconds (a collector that is down must not
    hold the exit)."""
    provider = _provider
    if provider is None:
        return
    disable()
    worker = threading.Thread(target=provider.shutdown, name="aggregator-tracing-shutdown", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        logger.warning("spans not exported within %gs at exit; dropped", timeout)
