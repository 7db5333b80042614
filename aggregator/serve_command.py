"""`aggregator serve`: stops heard from the start (a stop during start-up is a clean one), the manifest opened (a
stop gives the opening up), the cluster's Redis link, the server wired and served over stdio or Streamable HTTP, in
one process or `--workers N` forks on a shared socket.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio

from aggregator.event_loop import backend_options, chosen, running_loop
from aggregator.exits import EXIT_INVALID, EXIT_OK, EXIT_USAGE, report
from aggregator.manifest.model import ManifestError
from aggregator.startup import collect_again
from aggregator.stopping import Stop, listen

if TYPE_CHECKING:  # the serving modules are imported when `serve` runs: the other commands start faster without
    from aggregator.cluster.link import RedisLink
    from aggregator.manifest.model import ClusterSettings

__all__ = ["cmd_serve"]

logger = logging.getLogger("aggregator")


@asynccontextmanager
async def _opened(path: str, stop: Stop) -> AsyncIterator[Any]:
    """The ResourceService for a manifest, closed on the way out; a stop during the opening (minutes for a million
    files, or a slow upstream) gives it up, what it opened closed: _Stopped (after it, a stop is noted, and
    `serve_*` do not serve). The cyclic collector stays paused: serve resumes it once it has frozen start-up's
    objects."""
    from aggregator.service import ResourceService
    from aggregator.stopping import stop_signals

    service: ResourceService | None = None
    try:
        async with anyio.create_task_group() as opening:
            await opening.start(stop_signals, stop, opening.cancel_scope.cancel, lambda: None,
                                "giving up the manifest's opening")
            service = await ResourceService.open(path)
            opening.cancel_scope.cancel()
    except BaseExceptionGroup as group:  # the opening's own failure (the watcher raises none): as it was raised
        raise group.exceptions[0] from None
    if service is None:
        raise _Stopped
    try:
        yield service
    finally:
        await service.aclose()


@asynccontextmanager
async def _cluster(service: Any) -> AsyncIterator[RedisLink | None]:
    """With `server.cluster`: this replica's Redis link (None without), and the shared content cache under the
    service's own when `sharedCache` is on; the link is closed on the way out (_NoRedis without redis-py)."""
    settings = service.manifest.server.cluster
    link = _cluster_link(settings)
    if link is None:
        yield None
        return
    from aggregator.cluster.shared_cache import SharedContent

    if settings.shared_cache:
        service.shared = SharedContent(link)
    try:
        yield link
    finally:
        service.shared = None
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            await link.aclose()


def cmd_serve(args: argparse.Namespace) -> int:
    # Heard since aggregator.launch (from here when main() is called directly). Until the server opens anything (the
    # manifest's sources, the workers) a stop ends the process at once: its imports alone are a second of CPU, which
    # a loaded machine stretches past a supervisor's stop timeout. Later, one before the server is ready is honoured
    # once it is, by not serving (serve_http, serve_stdio).
    stop = listen()
    stop.at_once = True
    try:
        if stop.requested:
            return EXIT_OK
        return _serve(args, stop)
    finally:
        stop.at_once = False


def _serve(args: argparse.Namespace, stop: Stop) -> int:
    """`serve`, with stops ending it at once (`stop.at_once`) until it opens the manifest or forks the workers."""
    try:
        loop = chosen(args.loop)
    except ValueError as exc:
        print(f"aggregator: --loop: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not args.http and sys.stdin is not None and sys.stdin.isatty():  # a person, not a client: never on stdout
        from aggregator.terminal_hint import stdio_hint

        print(stdio_hint(args.manifest), end="", file=sys.stderr, flush=True)
    from aggregator.supervisor import Supervisor
    from aggregator.metrics import Metrics
    from aggregator.notify import Notifier
    from aggregator.search import Discovery
    from aggregator.serve_http import CannotListen, host_port, http_address, serve_http
    from aggregator.server import build_server, initialization_options, wire_summary
    from aggregator.stdio import serve_stdio
    from aggregator.tracing import setup_tracing

    # One line per request is what an HTTP operator expects; over stdio the one caller is the local user and the
    # line would cost about a sixth of a cached read, so there it is asked for with --access-log.
    access_log = args.access_log if args.access_log is not None else bool(args.http)
    if not access_log:
        logging.getLogger("aggregator.access").setLevel(logging.WARNING)

    async def run(sock: Any = None, shared_metrics: str | None = None) -> int:
        started = time.perf_counter()
        logging.getLogger("aggregator").debug("event loop: %s", running_loop())
        setup_tracing()  # in each worker: a fork does not carry the exporter's thread
        try:
            async with _opened(args.manifest, stop) as service, _cluster(service) as link:
                notifier = Notifier(max_subscriptions=args.max_subscriptions or
                                    service.manifest.server.max_subscriptions)
                if link is not None:
                    from aggregator.cluster.bus import ChangeBus
                live = Supervisor(service, notifier, reload=not args.no_reload,
                                  cluster=ChangeBus(link) if link is not None else None)
                # Over stdio nothing scrapes /metrics, so without the access log there is nothing to observe.
                metrics = Metrics(live, shared_metrics) if args.http or access_log else None
                # Stateless HTTP keeps no session past its request: legacy notifications could never arrive.
                discovery = Discovery(service, tools=service.manifest.server.tools)
                server = build_server(service, notifier, metrics,
                                      legacy_notifications=not (args.http and args.stateless), discovery=discovery)
                catalog = service.catalog
                # Paused since main: start-up's hundreds of thousands of long-lived objects (the SDK's modules, the
                # catalog) are frozen out of the collector's way before it runs again.
                gc.freeze()
                collect_again()
                transport = f"HTTP on http://{http_address(*host_port(args.http))}/mcp" if args.http else "stdio"

                def ready() -> None:
                    # Once stops are heard as stops of a server in service (stop_signals), not a step before: who
                    # stops the server once this is logged sees requests in flight finished, not a start-up's stop.
                    # Over HTTP, also once the port accepts: who waits for this line may connect at once.
                    logger.info(
                        "serving %r from %s: %d sources, %d resources, %d templates; %s; %s; hot reload %s; "
                        "ready in %.0f ms", service.manifest.server.name, args.manifest, len(service.sources),
                        len(catalog), len(catalog.templates), wire_summary(), transport,
                        "off" if args.no_reload else "on", (time.perf_counter() - started) * 1000,
                    )

                unbound: CannotListen | None = None
                async with anyio.create_task_group() as tg:
                    tg.start_soon(live.run)
                    tg.start_soon(discovery.run)
                    if metrics is not None:
                        tg.start_soon(metrics.run)
                    if args.http:
                        assert metrics is not None  # --http always keeps them, for /metrics
                        try:
                            await serve_http(server, live, metrics, args, sock, discovery, stop, ready)
                        except CannotListen as exc:  # caught here: the task group would wrap it in a group
                            unbound = exc
                    else:
                        await serve_stdio(server, initialization_options(server), stop=stop, ready=ready)
                    live.stop()
                    discovery.stop()
                    if metrics is not None:
                        metrics.stop()
                if unbound is not None:
                    raise unbound
        except CannotListen as exc:  # bad usage, whatever stop came meanwhile (nothing was served)
            print(f"aggregator: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except _NoRedis as exc:
            print(f"aggregator: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except ManifestError as exc:
            report(exc)
            return EXIT_INVALID
        except _Stopped:
            pass  # the stop was logged as it came; nothing was served
        return stop.code  # 0, or 128 + the signal of a second stop (it did not wait for what was in flight)

    if args.workers == 1:
        stop.at_once = False
        return anyio.run(run, backend_options=backend_options(loop))
    return _serve_workers(args, run, stop, loop)


class _Stopped(Exception):
    """A stop came while the manifest was being opened: nothing is served."""


class _NoRedis(Exception):
    """server.cluster is set but redis-py is not installed."""


def _cluster_link(settings: ClusterSettings | None) -> RedisLink | None:
    """The Redis link of `server.cluster` (None when it is not set); _NoRedis names the extra to install."""
    if settings is None:
        return None
    from aggregator.cluster.link import RedisLink

    try:
        return RedisLink(settings)
    except RuntimeError as exc:  # redis-py missing: the message names `pip install 'mcp-aggregator[cluster]'`
        raise _NoRedis(str(exc)) from None


def _serve_workers(args: argparse.Namespace, run: Any, stop: Stop, loop: str) -> int:
    """`--workers N`: check the manifest once, bind once, then fork N servers on the shared socket (or none if
    `stop` heard SIGTERM/SIGINT by then: exit 0)."""
    from aggregator.manifest import load_manifest
    from aggregator.metrics_multiprocess import private_folder, process_ended
    from aggregator.serve_http import CannotListen, host_port
    from aggregator.workers import listening_socket, run_workers

    if args.workers < 1 or not args.http or not args.stateless:
        print("aggregator: --workers N needs --http and --stateless (legacy sessions live in one process)",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        load_manifest(args.manifest)  # one report of a bad manifest rather than one per worker
    except ManifestError as exc:
        stop.at_once = False  # a failure to report: a stop meanwhile must not make it a clean exit
        report(exc)
        return EXIT_INVALID
    host, port = host_port(args.http)
    try:
        sock = listening_socket(host, port)
    except OSError as exc:  # said as one process says it (serve_http, where uvicorn binds)
        stop.at_once = False  # a failure to report: a stop meanwhile must not make it a clean exit
        print(f"aggregator: {CannotListen(host, port, exc)}", file=sys.stderr)
        return EXIT_USAGE
    # Before forking (the workers resume collecting): the collector leaves the modules imported alone, so a
    # worker's collections keep the pages it shares with us unwritten, and our exit does not walk them (a third of
    # our CPU, which a loaded machine stretches to seconds after the workers have stopped).
    gc.freeze()
    stop.at_once = False  # a folder to remove and workers to stop from here: run_workers hears the stops
    # One scrape of /metrics covers every worker: each writes its figures to files in a folder of this run only.
    with private_folder() as shared:
        return run_workers(args.workers, lambda index: anyio.run(run, sock, shared,
                                                                  backend_options=backend_options(loop)),
                           ended=lambda pid: process_ended(shared, pid), stop=stop)
