"""What `validate` checks beyond loading a manifest: what would break or surprise once serving.

Each finding is located at the manifest entry it is about. Errors are what a client would meet as a failure
(an unreachable source, a file an explicit resource names that is not there, a render that cannot render);
warnings are what serves but is likely a mistake (a collection that lists nothing, a source nothing uses).
A source marked `optional: true` turns its errors into warnings.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from aggregator.compiler import collection_key
from aggregator.errors import RequestError
from aggregator.manifest.model import (CollectionSpec, Location, Manifest, ManifestIssue, ResourceSpec, SourceSpec,
                                       TemplateSpec)
from aggregator.sources import SourceError, SourceNotFound
from aggregator.sources.registry import source_kinds
from aggregator.sources.unopened import SKIPPED, Unopened

if TYPE_CHECKING:
    from aggregator.service import ResourceService

__all__ = ["Finding", "check_manifest", "check_serving", "quiet_open_warnings"]

Severity = Literal["error", "warning"]


@dataclass(frozen=True, slots=True)
class Finding:
    issue: ManifestIssue
    severity: Severity

    def __str__(self) -> str:
        if self.severity == "error":
            return str(self.issue)
        i = self.issue
        return f"{i.file}:{i.line}:{i.col}: {i.key or '<root>'}: warning: {i.message}"


def _at(where: Location, key: str, message: str, severity: Severity) -> Finding:
    return Finding(ManifestIssue(where.file, where.line, where.col, key, message), severity)


def _severity(spec: SourceSpec | None) -> Severity:
    return "warning" if spec is not None and spec.optional else "error"


def check_manifest(manifest: Manifest) -> list[Finding]:
    """What the manifest alone shows (also offline): sources no resource, collection or template uses, and that
    list nothing of their own; `convert:` entries on an installation without the documents extra."""
    kinds = source_kinds()
    used = ({r.source for r in manifest.resources} | {c.source for c in manifest.collections}
            | {t.source for t in manifest.templates}
            | {sid for sid, spec in manifest.sources.items()  # its own entries (an mcp source's namespace)
               if spec.kind in kinds and kinds[spec.kind].publishes(spec.settings)})
    return [_at(spec.where, spec.key, f"source {sid!r} is used by no resource, collection or template", "warning")
            for sid, spec in manifest.sources.items() if sid not in used] + _documents_extra(manifest)


async def _matches_unlisted(service: ResourceService, spec: CollectionSpec) -> bool:
    """Whether an empty collection's glob did match files that were not listed (the compiler said why, e.g. whole
    URIs under no prefix): then "matches no file" would be wrong."""
    try:
        return bool(await service.sources[spec.source].list(spec.glob, spec.exclude, hidden=spec.hidden))
    except (SourceError, KeyError):
        return False


def _documents_extra(manifest: Manifest) -> list[Finding]:
    from aggregator.documents.formats import install_hint, missing_libraries

    entries: list[ResourceSpec | CollectionSpec | TemplateSpec] = [*manifest.resources, *manifest.collections,
                                                                   *manifest.templates]
    converting = [e for e in entries if e.convert]
    missing = missing_libraries() if converting else []
    return [_at(e.where, e.key + ".convert", f"converting documents needs the documents extra (missing: "
                f"{', '.join(missing)}): {install_hint()}", "error") for e in converting] if missing else []


async def check_serving(service: ResourceService) -> list[Finding]:
    """What opening the sources shows: empty collections, unreachable sources, missing files, failing renders."""
    manifest, catalog = service.manifest, service.catalog
    findings: list[Finding] = []
    unreachable = await _probe_sources(service, findings)
    for spec in manifest.collections:
        if spec.source not in unreachable and not catalog.collections.get(collection_key(spec)) \
                and not await _matches_unlisted(service, spec):
            findings.append(_at(spec.where, spec.key, f"glob {spec.glob!r} matches no file in source {spec.source!r}",
                                "warning"))
    for rspec in manifest.resources:
        if rspec.source is None or rspec.path is None or rspec.source in unreachable:
            continue
        sspec = manifest.sources.get(rspec.source)
        try:
            await service.sources[rspec.source].stat(rspec.path)
        except SourceNotFound:
            findings.append(_at(rspec.where, rspec.key, f"file {rspec.path!r} not found in source {rspec.source!r}",
                                _severity(sspec)))
        except SourceError as exc:
            findings.append(_at(rspec.where, rspec.key, f"cannot stat {rspec.path!r} in source {rspec.source!r}: "
                                                        f"{exc}", _severity(sspec)))
    for rspec in manifest.resources:
        if rspec.render is None:
            continue
        try:
            with _quiet("aggregator", "render %s failed", "read %s from %s failed"):
                await service.read(rspec.uri)
        except RequestError as exc:
            findings.append(_at(rspec.where, rspec.key, f"render failed: {exc.reason or exc.message}", "error"))
    return findings


async def _probe_sources(service: ResourceService, findings: list[Finding]) -> set[str]:
    """Reach every source that can be probed (remote ones); the ids of those that could not be reached."""
    unreachable: set[str] = set()
    for sid, source in service.sources.items():
        spec = service.manifest.sources[sid]
        try:
            await source.probe()
        except SourceError as exc:
            unreachable.add(sid)
            label, reason = source.describe(), str(exc)
            reason = reason.removeprefix(f"{label}: ")  # timeouts name the source already
            what = "open" if isinstance(source, Unopened) else "reach"
            skipped = f"; {SKIPPED}: the other sources serve without it" if spec.optional else ""
            findings.append(_at(spec.where, spec.key, f"cannot {what} {label}: {reason}{skipped}", _severity(spec)))
    return unreachable


class _Drop(logging.Filter):
    """Drops records a finding already says."""

    def __init__(self, says: tuple[str, ...]) -> None:
        super().__init__()
        self.says = says

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and any(part in record.msg for part in self.says))


@contextmanager
def _quiet(logger: str, *says: str) -> Iterator[None]:
    target, drop = logging.getLogger(logger), _Drop(says)
    target.addFilter(drop)
    try:
        yield
    finally:
        target.removeFilter(drop)


@contextmanager
def quiet_open_warnings() -> Iterator[None]:
    """While validating opens the manifest: the warnings about explicit resources that cannot be stat'ed and
    optional sources that cannot be opened or listed are left out (validate reports each one, located)."""
    with _quiet("aggregator.catalog", "listed without size", ": cannot stat ", SKIPPED), \
            _quiet("aggregator.sources", SKIPPED):
        yield
