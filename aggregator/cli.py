"""Command line: serve | list | read | validate | init | diff | schema.

Logs and diagnostics go to stderr; stdout carries only the command's output (the protocol, for `serve`).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio

from aggregator import __version__
from aggregator.event_loop import CHOICES, ENV, backend_options, chosen, running_loop
from aggregator.logs import setup_logging
from aggregator.manifest.model import ManifestError
from aggregator.startup import collect_again, defer_sdk_package_inits, pause_collection
from aggregator.stopping import Stop, listen, release

if TYPE_CHECKING:  # the serving modules are imported when `serve` runs: the other commands start faster without
    from aggregator.cluster.link import RedisLink
    from aggregator.manifest.model import ClusterSettings

__all__ = ["main"]

logger = logging.getLogger("aggregator")

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2


def _report(error: ManifestError, fmt: str = "text") -> None:
    if fmt == "json":
        print(json.dumps({"valid": False, "errors": [i.to_dict() for i in error.issues]}, indent=2))
    else:
        for issue in error.issues:
            print(issue, file=sys.stderr)


@asynccontextmanager
async def _opened(path: str, collect: bool = True, stop: Stop | None = None) -> AsyncIterator[Any]:
    """The ResourceService for a manifest (imported lazily so `schema` stays instant), closed on the way out; the
    cyclic collector runs again once it is open unless not `collect` (serve resumes it itself). With `stop`, a stop
    during the opening (minutes for a million files, or a slow upstream) gives it up, what it opened closed:
    _Stopped (after it, a stop is noted, and `serve_*` do not serve)."""
    from aggregator.service import ResourceService
    from aggregator.stopping import stop_signals

    service: ResourceService | None = None
    if stop is None:
        service = await ResourceService.open(path)
    else:
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
    if collect:
        collect_again()
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
    from aggregator.serve_http import host_port, serve_http
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
            async with _opened(args.manifest, collect=False, stop=stop) as service, _cluster(service) as link:
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
                transport = "HTTP on http://{}:{}/mcp".format(*host_port(args.http)) if args.http else "stdio"
                logger.info(
                    "serving %r from %s: %d sources, %d resources, %d templates; %s; %s; hot reload %s; "
                    "ready in %.0f ms", service.manifest.server.name, args.manifest, len(service.sources),
                    len(catalog), len(catalog.templates), wire_summary(), transport,
                    "off" if args.no_reload else "on", (time.perf_counter() - started) * 1000,
                )
                async with anyio.create_task_group() as tg:
                    tg.start_soon(live.run)
                    tg.start_soon(discovery.run)
                    if metrics is not None:
                        tg.start_soon(metrics.run)
                    if args.http:
                        assert metrics is not None  # --http always keeps them, for /metrics
                        await serve_http(server, live, metrics, args, sock, discovery, stop)
                    else:
                        await serve_stdio(server, initialization_options(server), stop=stop)
                    live.stop()
                    discovery.stop()
                    if metrics is not None:
                        metrics.stop()
        except ManifestError as exc:
            _report(exc)
            return EXIT_INVALID
        except _NoRedis as exc:
            print(f"aggregator: {exc}", file=sys.stderr)
            return EXIT_USAGE
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
    from aggregator.serve_http import host_port
    from aggregator.workers import listening_socket, run_workers

    if args.workers < 1 or not args.http or not args.stateless:
        print("aggregator: --workers N needs --http and --stateless (legacy sessions live in one process)",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        load_manifest(args.manifest)  # one report of a bad manifest rather than one per worker
    except ManifestError as exc:
        stop.at_once = False  # a failure to report: a stop meanwhile must not make it a clean exit
        _report(exc)
        return EXIT_INVALID
    sock = listening_socket(*host_port(args.http))
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


def cmd_list(args: argparse.Namespace) -> int:
    from aggregator.mcp_shapes import resource_dict, template_dict

    async def run() -> int:
        try:
            async with _opened(args.manifest) as service:
                catalog = service.catalog
        except ManifestError as exc:
            _report(exc)
            return EXIT_INVALID
        if args.json:
            out: dict[str, Any] = {
                "resources": [resource_dict(e) for e in catalog.entries],
                "resourceTemplates": [template_dict(t) for t in catalog.templates],
            }
            print(json.dumps(out, indent=2))
        else:
            for entry in catalog.entries:
                size = "-" if entry.size is None else str(entry.size)
                print(f"{entry.uri}\t{entry.mime_type or '-'}\t{size}\t{entry.name}")
            for template in catalog.templates:
                print(f"{template.uri_template}\t{template.spec.display.mime_type or '-'}\ttemplate\t{template.spec.name}")
        return EXIT_OK

    return anyio.run(run)


def cmd_read(args: argparse.Namespace) -> int:
    from aggregator.errors import RequestError

    async def run() -> int:
        try:
            async with _opened(args.manifest) as service:
                content = (await service.read(args.uri)).content
        except ManifestError as exc:
            _report(exc)
            return EXIT_INVALID
        except RequestError as exc:
            print(f"aggregator: {exc.message}", file=sys.stderr)
            return EXIT_INVALID
        if content.text is not None:
            sys.stdout.write(content.text)
        else:
            sys.stdout.buffer.write(content.blob or b"")
        sys.stdout.flush()
        return EXIT_OK

    return anyio.run(run)


def cmd_validate(args: argparse.Namespace) -> int:
    from aggregator.preflight import check_manifest, check_serving, quiet_open_warnings

    async def run() -> int:
        try:
            if args.offline:
                from aggregator.manifest import load_manifest

                manifest = load_manifest(args.manifest)
                collect_again()
                counts = (len(manifest.resources), len(manifest.templates), len(manifest.sources))
                digest = manifest.digest
                findings = check_manifest(manifest)
            else:
                from aggregator.service import ResourceService

                with quiet_open_warnings():  # each of those becomes a located finding below
                    service = await ResourceService.open(args.manifest)
                collect_again()
                try:
                    counts = (len(service.catalog), len(service.catalog.templates), len(service.sources))
                    digest = service.manifest.digest
                    findings = check_manifest(service.manifest) + await check_serving(service)
                finally:
                    await service.aclose()
        except ManifestError as exc:
            _report(exc, args.format)
            return EXIT_INVALID
        findings.sort(key=lambda f: (f.issue.file, f.issue.line, f.issue.col, f.issue.key))
        errors = [f.issue for f in findings if f.severity == "error"]
        warnings = [f.issue for f in findings if f.severity == "warning"]
        summary = {"valid": not errors, "resources": counts[0], "templates": counts[1], "sources": counts[2],
                   "sourcesChecked": not args.offline, "errors": [i.to_dict() for i in errors],
                   "warnings": [i.to_dict() for i in warnings], "manifest": {"sha256": digest}}
        if args.format == "json":
            print(json.dumps(summary, indent=2))
        else:
            for finding in findings:
                print(finding, file=sys.stderr)
            listed = "listed resources" if args.offline else "resources"
            note = " (offline: sources not opened, collections not listed)" if args.offline else ""
            verdict = f"invalid: {len(errors)} error(s)" if errors else "valid"
            also = f", {len(warnings)} warning(s)" if warnings else ""
            print(f"{args.manifest}: {verdict}{also} ({summary['sources']} sources, {summary['resources']} {listed}, "
                  f"{summary['templates']} templates){note}")
        if errors or (warnings and args.strict):
            return EXIT_INVALID
        return EXIT_OK

    return anyio.run(run)


def cmd_init(args: argparse.Namespace) -> int:
    from pathlib import Path

    from aggregator.manifest import load_manifest
    from aggregator.scaffold import starter_manifest

    folder, output = Path(args.folder), Path(args.output)
    if not folder.is_dir():
        print(f"aggregator: {folder}: not a folder", file=sys.stderr)
        return EXIT_USAGE
    if output.exists() and not args.force:
        print(f"aggregator: {output} exists; pass --force to overwrite it", file=sys.stderr)
        return EXIT_INVALID
    output.write_text(starter_manifest(folder, output, args.name), encoding="utf-8")
    try:
        manifest = load_manifest(output)
    except ManifestError as exc:  # a bug of ours, not the user's: say so plainly
        _report(exc)
        return EXIT_INVALID
    print(f"wrote {output}: serves {folder} ({manifest.collections[0].glob}); next: aggregator serve {output}",
          file=sys.stderr)
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    from aggregator.diff import diff_catalogs, diff_sources

    async def run() -> int:
        try:
            async with _opened(args.old) as old, _opened(args.new) as new:
                found = diff_catalogs(old.catalog, new.catalog)
                found.sources = diff_sources(old.manifest, new.manifest)
        except ManifestError as exc:
            _report(exc, args.format)
            return EXIT_USAGE
        if args.format == "json":
            print(json.dumps(found.to_dict(), indent=2))
        else:
            for line in found.lines():
                print(line)
        return EXIT_INVALID if found else EXIT_OK

    return anyio.run(run)


def cmd_schema(args: argparse.Namespace) -> int:
    from aggregator.manifest import schema_text

    sys.stdout.write(schema_text())
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aggregator", description="Serve a YAML manifest as an MCP resources server.")
    parser.add_argument("--version", action="version", version=f"aggregator {__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (logs go to stderr)")
    parser.add_argument("--log-format", choices=("text", "json"), default="text",
                        help="json: one object per line (with the access log's caller, method, uri, outcome, ms)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="serve a manifest over stdio, or Streamable HTTP with --http")
    p.add_argument("manifest")
    p.add_argument("--no-reload", action="store_true", help="do not reload the manifest when it is saved")
    p.add_argument("--http", metavar="[HOST:]PORT", help="serve Streamable HTTP at /mcp instead of stdio "
                                                        "(host 127.0.0.1 unless given)")
    p.add_argument("--stateless", action="store_true",
                   help="HTTP: no sessions (the legacy wire offers no subscriptions; modern listen works)")
    p.add_argument("--json-response", action="store_true", help="HTTP: answer with JSON instead of SSE streams")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="HTTP with --stateless: N server processes sharing the port (each its own catalog and cache)")
    p.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=None,
                   help="log every request (caller, method, uri, outcome, ms) on the aggregator.access logger "
                        "(default: on over HTTP, off over stdio)")
    p.add_argument("--loop", choices=CHOICES, default=None,
                   help=f"the event loop: uvloop if installed (auto, the default; or {ENV}), or asyncio's own")
    p.add_argument("--max-subscriptions", type=int, default=None, metavar="N",
                   help="resource subscriptions one connection may hold (default: server.maxSubscriptions, 1000)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("list", help="print every listed resource and template")
    p.add_argument("manifest")
    p.add_argument("--json", action="store_true", help="print MCP Resource and ResourceTemplate objects as JSON")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("read", help="print one resource's content (binary bodies as raw bytes)")
    p.add_argument("manifest")
    p.add_argument("uri")
    p.set_defaults(func=cmd_read)

    p = sub.add_parser("validate", help="check a manifest, open its sources, list its collections and render its "
                                        "renders once; exit 0 valid, 1 invalid (or warnings with --strict), "
                                        "2 unreadable")
    p.add_argument("manifest")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 on warnings too (a collection matching nothing, an unused or optional source "
                        "that is unreachable): for CI")
    p.add_argument("--offline", action="store_true",
                   help="check the manifest only: do not open sources or list collections (URI collisions with "
                        "collections and unreachable sources go unchecked)")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("init", help="write a commented starter manifest for a folder")
    p.add_argument("folder")
    p.add_argument("-o", "--output", default="aggregator.yaml", help="where to write it (default aggregator.yaml)")
    p.add_argument("--name", help="server name and URI scheme (default: the folder's name)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("diff", help="what a reload from OLD to NEW would change: exit 0 same, 1 different, 2 error")
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("schema", help="print the manifest JSON Schema")
    p.set_defaults(func=cmd_schema)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    defer_sdk_package_inits()  # before anything imports the SDK: its package __init__ files run only if needed
    pause_collection()  # until the command's modules are imported and its manifest is open (aggregator.startup)
    try:
        return _run(argv)
    finally:
        collect_again()


def _run(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    if args.command != "serve":  # `aggregator list M | head` stops quietly; serve's stdout is the protocol's
        from aggregator.stdout import tolerate_reader_leaving

        tolerate_reader_leaving()
    try:
        if args.command != "serve":
            release()  # nothing to finish: SIGTERM and Ctrl-C stop the other commands as they stop any program
        return int(args.func(args))
    except OSError as exc:  # the manifest itself: missing, a folder, a FIFO, unreadable
        reason = "no such file" if isinstance(exc, FileNotFoundError) else exc.strerror or str(exc)
        reason = reason[:1].lower() + reason[1:]
        print(f"aggregator: {exc.filename or exc}: {reason}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
