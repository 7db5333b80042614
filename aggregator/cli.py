"""Command line: serve | list | read | validate | init | diff | schema.

Logs and diagnostics go to stderr; stdout carries only the command's output (the protocol, for `serve`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio

from aggregator import __version__
from aggregator.event_loop import CHOICES, ENV
from aggregator.exits import EXIT_INVALID, EXIT_OK, EXIT_USAGE, report
from aggregator.logs import setup_logging
from aggregator.manifest.model import ManifestError
from aggregator.serve_command import cmd_serve
from aggregator.startup import collect_again, defer_sdk_package_inits, pause_collection
from aggregator.stopping import release

__all__ = ["main"]


@asynccontextmanager
async def _opened(path: str) -> AsyncIterator[Any]:
    """The ResourceService for a manifest (imported lazily so `schema` stays instant), closed on the way out; the
    cyclic collector runs again once it is open (`serve` opens its own: aggregator.serve_command)."""
    from aggregator.service import ResourceService

    service = await ResourceService.open(path)
    collect_again()
    try:
        yield service
    finally:
        await service.aclose()


def cmd_list(args: argparse.Namespace) -> int:
    from aggregator.mcp_shapes import resource_dict, template_dict

    async def run() -> int:
        try:
            async with _opened(args.manifest) as service:
                catalog = service.catalog
        except ManifestError as exc:
            report(exc)
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
            report(exc)
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
            report(exc, args.format)
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
        report(exc)
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
            report(exc, args.format)
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
