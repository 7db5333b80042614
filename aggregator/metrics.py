"""Operations figures: Prometheus metrics for /metrics and the access log.

Handlers report each request once (`Metrics.observe`); cache, source-error and reload figures are read at scrape
time from the objects that already keep them, so nothing on the read path pays for metrics it does not need.
With `--workers N` (Metrics(shared=folder)) every worker writes its figures to files in that folder and a scrape
sums them (aggregator.metrics_multiprocess): the live figures are written each second and before each scrape.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from aggregator import __version__
from aggregator.sources.progress import LISTINGS

if TYPE_CHECKING:
    from mcp.server.transport_security import TransportSecurityMiddleware

    from aggregator.cluster.bus import ChangeBus
    from aggregator.documents.pool import DocumentPool
    from aggregator.notify import Notifier
    from aggregator.service import ResourceService

__all__ = ["Figures", "Metrics", "metrics_route"]

access_log = logging.getLogger("aggregator.access")
logger = logging.getLogger("aggregator.metrics")

# Seconds; cached reads take well under a millisecond, cold remote reads up to the source timeout.
READ_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Figures(Protocol):
    """What a scrape reads from the supervisor (aggregator.supervisor.Supervisor): the service being served
    (its cache, source errors and catalog) and the reload counts."""

    @property
    def service(self) -> ResourceService: ...

    @property
    def reloads(self) -> int: ...

    @property
    def reload_errors(self) -> int: ...

    @property
    def file_changes(self) -> dict[str, int]: ...

    @property
    def cluster(self) -> ChangeBus | None: ...

    @property
    def notifier(self) -> Notifier: ...

    def cluster_health(self) -> dict[str, object] | None: ...


class Metrics:
    """Request counts by method and outcome, read latency, and the live catalog's own counters.

    `live` is read at scrape time (see Figures). `shared`: the folder of `--workers N` (one scrape covers every
    worker; run() must then run to keep this worker's live figures there). Without prometheus-client (the
    `metrics` extra) only the access log works.
    """

    def __init__(self, live: Figures, shared: str | None = None) -> None:
        self.live = live
        self.registry: Any = None
        self._snapshot: Any = None
        self._stopping = False
        self._stopped: anyio.Event | None = None
        try:
            from prometheus_client import CollectorRegistry, Counter, Histogram
        except ImportError:
            return
        # auto_describe would collect (read every worker's files) just to register the multiprocess collector.
        self.registry = CollectorRegistry(auto_describe=shared is None)
        own = self.registry
        if shared is not None:
            from prometheus_client.multiprocess import MultiProcessCollector

            from aggregator.metrics_multiprocess import Snapshot, use_files

            use_files()
            own = None  # each worker's counts go to its files; a scrape reads all of them
            MultiProcessCollector(self.registry, path=shared)
            self._snapshot = Snapshot(_LiveCollector(live), shared, MULTIPROCESS_MODES)
        self._requests = Counter("aggregator_requests", "MCP requests handled, by method and outcome.",
                                 ["method", "outcome"], registry=own)
        self._read_seconds = Histogram("aggregator_read_seconds", "Time to answer resources/read.",
                                       buckets=READ_BUCKETS, registry=own)
        if shared is None:
            self.registry.register(_LiveCollector(live))

    def observe(self, method: str, uri: str | None, outcome: str, seconds: float, caller: str) -> None:
        """Count one handled request and write its access-log line."""
        if self.registry is not None:
            self._requests.labels(method, outcome).inc()
            if method == "resources/read":
                self._read_seconds.observe(seconds)
        if access_log.isEnabledFor(logging.INFO):
            access_log.info("%s %s %s %s %.1fms", caller, method, uri or "-", outcome, seconds * 1000,
                            extra={"caller": caller, "method": method, "uri": uri, "outcome": outcome,
                                   "ms": round(seconds * 1000, 3)})

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        if self._snapshot is not None:
            self._write()  # this worker's figures as of now; the others' are at most a second old
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    async def run(self) -> None:
        """With `shared`: write this worker's live figures each second until stop(), then once more."""
        if self._snapshot is None:
            return
        self._stopped = stopped = anyio.Event()
        while True:
            self._write()
            if self._stopping:
                return
            with anyio.move_on_after(SNAPSHOT_SECONDS):
                await stopped.wait()

    def _write(self) -> None:
        try:
            self._snapshot.write()
        except Exception:  # a full disk must not stop serving or scraping; the next write may succeed
            logger.exception("writing this worker's figures for /metrics failed")

    def stop(self) -> None:
        self._stopping = True
        if self._stopped is not None:
            self._stopped.set()


SNAPSHOT_SECONDS = 1.0
"""How often a worker writes its live figures for the others' scrapes (`--workers N`)."""

MULTIPROCESS_MODES = {
    # How a gauge of the live collector combines over workers with --workers N (default livesum: the sum over
    # live workers). Each worker keeps its own catalog, so those are the same figure seen N times, not parts.
    "aggregator_catalog_generation": "livemax",
    "aggregator_catalog_resources": "livemax",
    "aggregator_upstream_connected": "livemin",  # 1 when every worker's connection is up
    "aggregator_cluster_connected": "livemin",
    "aggregator_manifest_info": "livemax",  # two digests at 1 while workers disagree (one reloaded, one not yet)
    "aggregator_build_info": "livemax",
}


class _LiveCollector:
    """Figures kept elsewhere, read when scraped."""

    def __init__(self, live: Figures) -> None:
        self.live = live

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        service = self.live.service
        cache = service.cache
        yield _counter(CounterMetricFamily, "aggregator_cache_hits", "Reads answered from the content cache.",
                       cache.hits)
        yield _counter(CounterMetricFamily, "aggregator_cache_misses", "Reads that went to a source.", cache.misses)
        yield GaugeMetricFamily("aggregator_cache_bytes", "Bytes held by the content cache.",
                                value=cache.current_bytes)
        yield GaugeMetricFamily("aggregator_cache_entries", "Entries held by the content cache.", value=len(cache))
        if service.shared is not None:
            shared = CounterMetricFamily("aggregator_shared_cache", "Local cache misses the cluster's shared cache "
                                         "answered (hit), did not (miss), bodies it stored or skipped (private, too "
                                         "large), unreadable values it deleted (rejected), failed Redis calls (error).",
                                         labels=["result"])
            for result, count in service.shared.counts().items():
                shared.add_metric([result], count)
            yield shared
        errors = CounterMetricFamily("aggregator_source_errors", "Failed source calls, by source id.",
                                     labels=["source"])
        for source, count in sorted(service.source_errors.items()):
            errors.add_metric([source], count)
        yield errors
        listings = CounterMetricFamily("aggregator_source_listings", "Listings of folders, object stores and MCP "
                                       "upstreams (walks, paged listings) by source id: what reloads, polls and "
                                       "list_changed list again.", labels=["source"])
        for source, count in sorted(LISTINGS.items()):
            listings.add_metric([source], count)
        yield listings
        reloads = CounterMetricFamily("aggregator_reloads", "Manifest reloads, by outcome.", labels=["outcome"])
        reloads.add_metric(["ok"], self.live.reloads)
        reloads.add_metric(["error"], self.live.reload_errors)
        yield reloads
        applied = CounterMetricFamily("aggregator_file_changes", "Watched file changes and polls applied to the "
                                      "catalog, by how: incremental, or a full relist.", labels=["how"])
        for how, count in self.live.file_changes.items():
            applied.add_metric([how], count)
        yield applied
        up = GaugeMetricFamily("aggregator_upstream_connected", "1 while the source's upstream connection is up, by "
                               "source id (MCP upstreams).", labels=["source"])
        reconnects = CounterMetricFamily("aggregator_upstream_reconnects", "Times the source's upstream connection "
                                         "was made again after it was lost, by source id.", labels=["source"])
        for source, health in sorted(service.health().items()):
            up.add_metric([source], 1.0 if health.get("state") == "connected" else 0.0)
            times = health.get("reconnects")
            reconnects.add_metric([source], float(times) if isinstance(times, int) else 0.0)
        yield up
        yield reconnects
        yield from _document_figures(service.documents)
        yield GaugeMetricFamily("aggregator_catalog_generation", "Generation of the catalog being served.",
                                value=service.catalog.generation)
        notifier = self.live.notifier
        yield GaugeMetricFamily("aggregator_listen_streams", "Open subscriptions/listen streams (modern wire).",
                                value=notifier.listen_streams)
        yield GaugeMetricFamily("aggregator_legacy_sessions", "Legacy sessions that hear list_changed and updated.",
                                value=notifier.legacy_sessions)
        yield GaugeMetricFamily("aggregator_catalog_resources", "Resources listed by the catalog.",
                                value=len(service.catalog))
        manifest = GaugeMetricFamily("aggregator_manifest_info", "1, labelled with the sha256 of the manifest's "
                                     "files (equal on replicas serving the same manifest).", labels=["sha256"])
        manifest.add_metric([service.manifest.digest], 1.0)
        yield manifest
        build = GaugeMetricFamily("aggregator_build_info", "1, labelled with the aggregator's version.",
                                  labels=["version"])
        build.add_metric([__version__], 1.0)
        yield build
        yield from _cluster_figures(self.live)


def _document_figures(pool: DocumentPool) -> Iterator[Any]:
    """The `convert:` worker pool: conversions by outcome (a cached copy is no conversion), workers alive now."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    conversions = CounterMetricFamily("aggregator_document_conversions", "Documents converted by a worker (ok) or "
                                      "not (failed: a limit, a corrupt file, a killed worker).", labels=["outcome"])
    conversions.add_metric(["ok"], pool.converted)
    conversions.add_metric(["failed"], pool.failed)
    yield conversions
    yield GaugeMetricFamily("aggregator_document_workers", "Conversion worker processes alive, idle or converting.",
                            value=pool.workers)
    yield CounterMetricFamily("aggregator_document_workers_killed", "Conversion workers killed for overrunning "
                              "convert.timeout, or found dead.", value=pool.killed)
    yield CounterMetricFamily("aggregator_document_rechecks", "Documents a parser gave up on, converted again in a "
                              "fresh worker with twice convert.maxMemory to tell a corrupt file from one over the "
                              "limit.", value=pool.rechecked)
    yield GaugeMetricFamily("aggregator_document_worker_peak_bytes", "The most address space a conversion worker "
                            "reached (its libraries included), against convert.maxMemory.", value=pool.peak)


def _cluster_figures(live: Figures) -> Iterator[Any]:
    """The change bus of `server.cluster` (nothing without it)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    bus, health = live.cluster, live.cluster_health()
    if bus is None or health is None:
        return
    yield GaugeMetricFamily("aggregator_cluster_connected", "1 while this replica is on the cluster's change bus.",
                            value=1.0 if bus.connected else 0.0)
    yield CounterMetricFamily("aggregator_cluster_subscriber_restarts", "Times the change bus subscriber started "
                              "again after its Redis connection failed.", value=bus.restarts)
    events = CounterMetricFamily("aggregator_cluster_events", "Change events published to and received from the "
                                 "other replicas, and received ones rejected as malformed.", labels=["direction"])
    events.add_metric(["published"], bus.published)
    events.add_metric(["received"], bus.received)
    events.add_metric(["rejected"], bus.rejected)
    yield events
    refused = CounterMetricFamily("aggregator_cluster_unauthenticated", "Change events, shared cache values and kept "
                                  "poll versions read from Redis that were not sealed with server.cluster.secret (or "
                                  "were, and this replica has none): ignored.", labels=["kind"])
    for kind in ("event", "content", "versions"):
        refused.add_metric([kind], bus.link.seal.refused.get(kind, 0))
    yield refused
    leases = health.get("leases")
    yield GaugeMetricFamily("aggregator_cluster_leases_held", "Remote sources this replica polls for the cluster.",
                            value=float(leases) if isinstance(leases, int) else 0.0)


def _counter(family: Callable[..., Any], name: str, doc: str, value: float) -> Any:
    return family(name, doc, value=value)


def metrics_route(metrics: Metrics, guard: TransportSecurityMiddleware | None = None) -> Route:
    """GET /metrics in the Prometheus text format (404 with a hint when prometheus-client is not installed).

    `guard` (the SDK's TransportSecurityMiddleware) checks Host and Origin first, as for /mcp: the figures name
    source ids and must not be readable by a DNS-rebinding page.
    """

    async def endpoint(request: Request) -> Response:
        refused = await guard.validate_request(request) if guard is not None else None
        if refused is not None:
            return refused
        if metrics.registry is None:
            return Response("metrics need the 'metrics' extra: pip install 'mcp-aggregator[metrics]' "
                            "(in a checkout: pip install -e '.[metrics]')\n", 404,
                            media_type="text/plain")
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    return Route("/metrics", endpoint, methods=["GET"])


def timer() -> Callable[[], float]:
    """A stopwatch: call the result to get seconds since `timer()` was called."""
    start = time.perf_counter()
    return lambda: time.perf_counter() - start
