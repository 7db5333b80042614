"""The catalog compiler: lists a manifest's collections and stats its files (I/O), then builds the `Catalog` value.

URI collisions and unlistable sources come back as located manifest errors. A reload passes the collections it
knows to be current (`reuse`), so a watched folder that did not change is not listed again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

import anyio

from aggregator.catalog import RENDERED_TYPE, Catalog, Entry, TemplateEntry
from aggregator.catalog_rows import NO_SIZE, NO_TIME, Rows, RowsBuilder, duplicates
from aggregator.entry_builder import EntryBuilder
from aggregator.content import file_mime_type
from aggregator.documents.formats import CONVERTED_MIME_TYPES, converted
from aggregator.manifest.model import (CollectionSpec, Display, Location, Manifest, ManifestError, ManifestIssue,
                                       ResourceSpec, SourceSpec, TemplateSpec)
from aggregator.paths import url_start
from aggregator.sources import FileInfo, Source, SourceError, SourceNotFound
from aggregator.sources.base import Published, PublishedResource
from aggregator.sources.unopened import SKIPPED, Unopened
from aggregator.templates import TemplateSyntaxError, UriTemplate
from aggregator.tracing import span

__all__ = ["EntryBuilder", "build_templates", "catalog_of", "collection_key", "compile_catalog", "resource_entry",
           "resource_key", "upstream_entry", "uri_collision"]

logger = logging.getLogger("aggregator.catalog")


async def _resource_entry(spec: ResourceSpec, sources: Mapping[str, Source]) -> Entry:
    if spec.text is not None or spec.render is not None:
        return resource_entry(spec, None)
    assert spec.source is not None and spec.path is not None
    info: FileInfo | None = None
    try:
        info = await sources[spec.source].stat(spec.path)
    except SourceNotFound:
        logger.warning("%s: %s: file %r not found in source %r; listed without size", spec.where, spec.key,
                       spec.path, spec.source)
    except SourceError as exc:
        logger.warning("%s: %s: cannot stat %r: %s", spec.where, spec.key, spec.path, exc)
    return resource_entry(spec, info)


def resource_entry(spec: ResourceSpec, info: FileInfo | None) -> Entry:
    """The entry a manifest resource lists; a file's size and mtime come from `info` (None: not found)."""
    display = spec.display
    if spec.text is not None:
        size: int | None = spec.size if spec.size is not None else len(spec.text.encode("utf-8"))
        return Entry(spec.uri, spec.name, display, display.title, display.mime_type or "text/plain", size,
                     text=spec.text, access=spec.access)
    if spec.render is not None:
        return Entry(spec.uri, spec.name, display, display.title, display.mime_type or RENDERED_TYPE, spec.size,
                     access=spec.access, render=spec.render)
    assert spec.source is not None and spec.path is not None
    size = spec.size if spec.size is not None else (info.size if info else None)
    convert = converted(spec.path, spec.decompress, spec.convert)
    mime = CONVERTED_MIME_TYPES[convert.to] if convert else file_mime_type(spec.path, display.mime_type, spec.decompress)
    return Entry(spec.uri, spec.name, display, display.title, mime, None if convert else size,
                 info.mtime if info else None, source=spec.source, path=spec.path, access=spec.access,
                 decompress=spec.decompress, convert=convert)


async def _list_collection(spec: CollectionSpec, source: Source) -> tuple[RowsBuilder, int]:
    """A collection's rows in the order the source lists its files, and how many files the source listed."""
    builder = EntryBuilder(spec)
    rows = RowsBuilder(builder)
    refused: list[str] = []
    compact_uri, file_entry, explicit_row = builder.compact_uri, builder.file_entry, rows.explicit_row
    add_uri, add_which, add_size, add_mtime = rows.uris.append, rows.which.append, rows.sizes.append, rows.mtimes.append
    declared = spec.display.mime_type is not None

    def accept(path: str, size: int | None, mtime: float | None, mime: str | None = None) -> None:
        # Called for every file, in the source's thread: the compact case is a regex match and four appends.
        if mime is None or declared:
            uri = compact_uri(path)
            if uri is not None:
                add_uri(uri)
                add_which(1)
                add_size(NO_SIZE if size is None else size)
                add_mtime(NO_TIME if mtime is None else mtime)
                return
        entry = file_entry(path, size, mtime, mime)
        if entry is None:
            refused.append(path)
        else:
            explicit_row(entry)

    await source.scan(spec.glob, spec.exclude, spec.hidden, accept)
    if refused and _first_warning((spec.where, spec.key, spec.source, tuple(refused))):
        _say_refused(spec, refused)
    return rows, len(rows) + len(refused)


def _say_refused(spec: CollectionSpec, refused: Sequence[str]) -> None:
    """Why a collection's files were not listed (whole URIs: another server's, under no prefix)."""
    examples = ", ".join(repr(p) for p in refused[:3])
    scheme = url_start(refused[0])
    if scheme:
        logger.warning("%s: %s: %d name(s) of source %r not listed: they are whole URIs, e.g. %s, and a collection's "
                       "paths are relative: give the source a prefix (prefix: \"%s\")", spec.where, spec.key,
                       len(refused), spec.source, examples, scheme)
        return
    logger.warning("%s: %s: %d file(s) of source %r not listed: their names cannot be served (control characters, "
                   "backslashes, encoded separators ...), e.g. %s", spec.where, spec.key, len(refused), spec.source,
                   examples)


_warned: dict[object, None] = {}


def _first_warning(key: object) -> bool:
    """True the first time `key` is seen (bounded): a relisting after every file change does not warn again."""
    if key in _warned:
        return False
    if len(_warned) >= 1024:
        _warned.pop(next(iter(_warned)))
    _warned[key] = None
    return True


def collection_key(spec: CollectionSpec) -> CollectionSpec:
    """What makes two collections list the same entries: everything but where the manifest wrote them."""
    return replace(spec, where=_NOWHERE, key="")


def resource_key(spec: ResourceSpec) -> ResourceSpec:
    """What makes two resources list the same entry: everything but where the manifest wrote them."""
    return replace(spec, where=_NOWHERE, key="")


_NOWHERE = Location("", 0, 0)


async def compile_catalog(manifest: Manifest, sources: Mapping[str, Source], generation: int = 1,
                          reuse: Mapping[CollectionSpec, Collection[Entry]] | None = None,
                          reused_at: Mapping[CollectionSpec, float] | None = None,
                          previous: Catalog | None = None) -> Catalog:
    """Build the catalog a manifest describes; ManifestError (located) for URI collisions or unlistable sources.

    `reuse` maps collections (by `collection_key`) to entries still known to be current (their folder is
    watched), so a reload does not list and build them again. A source that tells of its own changes (an MCP
    upstream) and cannot be listed now is no error: what `previous` listed of it is kept while younger than its
    `staleIfError`, else it lists nothing, until it is back and says so. Nor is a source marked `optional` that
    cannot be listed: its collections are empty (and not `listed_at`, so a reload lists them again).
    """
    issues: list[ManifestIssue] = []
    resource_entries: list[Entry | None] = [None] * len(manifest.resources)
    built: list[Rows] = [_NO_ROWS] * len(manifest.collections)
    listings: dict[int, RowsBuilder] = {}  # collections listed now, in the order their source gave the files
    reuse = reuse or {}
    started = time.monotonic()
    stale_at: dict[CollectionSpec | str, float] = {}  # what was kept from `previous`, and when it was listed
    skipped: set[CollectionSpec] = set()  # collections of optional sources that could not be listed

    def down(sid: str, key: CollectionSpec | str, listed_at: Mapping[Any, float] | None, what: str,
             exc: SourceError) -> bool:
        """Whether to keep `previous`'s listing of an unreachable pushing source (logged either way)."""
        spec = manifest.sources[sid]
        at = (listed_at or {}).get(key)
        keep = at is not None and started - at <= spec.stale_if_error
        logger.warning("%s: %s: source %r cannot be listed (%s); %s", spec.where, spec.key, sid, exc,
                       f"serving its last {what} (staleIfError)" if keep else f"its {what} is empty until it is back")
        if keep:
            assert at is not None
            stale_at[key] = at
        return keep

    async def build_resource(i: int, spec: ResourceSpec) -> None:
        resource_entries[i] = await _resource_entry(spec, sources)

    async def list_collection(i: int, spec: CollectionSpec) -> None:
        known = reuse.get(collection_key(spec))
        if known is not None:
            built[i] = _as_rows(known)
            return
        try:
            with span("aggregator.source.list", source_id=spec.source, source_kind=manifest.sources[spec.source].kind,
                      glob=spec.glob) as traced:
                listing, count = await _list_collection(spec, sources[spec.source])
                traced.set(files=count)
        except SourceError as exc:
            if sources[spec.source].pushes_changes:
                key = collection_key(spec)
                old = previous.collections.get(key) if previous is not None else None
                if down(spec.source, key, previous.listed_at if previous else None, "listing", exc) and old:
                    built[i] = _as_rows(old)
                return
            if manifest.sources[spec.source].optional:
                skipped.add(collection_key(spec))  # never listed: a reload lists it again
                if not isinstance(sources[spec.source], Unopened):  # which said why when it failed to open
                    logger.warning("%s: %s: cannot list source %r: %s; " + SKIPPED + ": the collection is empty "
                                   "until it is listed again", spec.where, spec.key, spec.source, exc)
                return
            issues.append(_issue(spec.where, spec.key, f"cannot list source {spec.source!r}: {exc}"))
            return
        listings[i] = listing
        built[i] = listing.rows()

    published: dict[str, Published] = {}

    async def publish(spec: SourceSpec) -> None:
        try:
            published[spec.id] = await sources[spec.id].published()
        except SourceError as exc:
            if not sources[spec.id].pushes_changes:
                issues.append(_issue(spec.where, spec.key, f"cannot list source {spec.id!r}: {exc}"))
            elif previous is not None and spec.id in previous.published and down(
                    spec.id, spec.id, previous.published_at, "published resources", exc):
                published[spec.id] = previous.published[spec.id]
            else:
                down(spec.id, spec.id, None, "published resources", exc)

    async with anyio.create_task_group() as tg:
        for i, rspec in enumerate(manifest.resources):
            tg.start_soon(build_resource, i, rspec)
        for i, cspec in enumerate(manifest.collections):
            tg.start_soon(list_collection, i, cspec)
        for sspec in manifest.sources.values():
            if sspec.id in sources and sources[sspec.id].publishes:
                tg.start_soon(publish, sspec)

    upstream = _upstream_rows(manifest, published) if published else []
    resources = [e for e in resource_entries if e is not None]  # the task group built every resource or raised
    parts = [part for part in (Rows.of(resources), *built, *upstream) if len(part)]
    rows = Rows.merged(parts) if parts else _NO_ROWS
    twice = duplicates(rows.uris)
    if twice:  # a URI produced twice: named in the order compile_catalog claims URIs (rare: worth a second pass)
        issues += _collisions(manifest, twice, resources, [listings.get(i, b) for i, b in enumerate(built)],
                              published)

    templates = build_templates(manifest, published, issues)
    if issues:
        raise ManifestError(issues)
    catalog = catalog_of(rows, templates, generation, sources, manifest)
    now = time.monotonic()
    catalog.collections = {collection_key(c): b for c, b in zip(manifest.collections, built, strict=True)}
    catalog.listed_at = {key: stale_at[key] if key in stale_at else (reused_at or {}).get(key, now)
                         if key in reuse else now for key in catalog.collections if key not in skipped}
    catalog.published = published
    catalog.published_at = {sid: stale_at.get(sid, now) for sid in published}
    catalog.stated_at = {resource_key(r): now for r in manifest.resources if r.source is not None}
    return catalog


def upstream_entry(spec: SourceSpec, res: PublishedResource) -> Entry:
    """The entry of a resource source `spec` publishes itself (an upstream's, under its namespace)."""
    from aggregator.upstream_rows import published_entry  # an upstream's: a folder-only server never imports it

    return published_entry(res, spec.id, spec.access)


def _upstream_rows(manifest: Manifest, published: Mapping[str, Any]) -> list[Rows]:
    """The rows of what sources publish themselves (upstreams): imported only where a source publishes, so a
    folder-only server never loads the upstream client (tests/test_start_imports.py)."""
    from aggregator.upstream_rows import published_rows

    return [published_rows(offered.resources, sid, manifest.sources[sid].access) for sid, offered in published.items()]


def catalog_of(entries: Sequence[Entry], templates: Sequence[TemplateEntry], generation: int,
               sources: Mapping[str, Source], manifest: Manifest | None = None) -> Catalog:
    """The Catalog of `entries` (Rows, or entries made into rows) and `templates`, resolving paths as `sources`
    name them (URL paths, bytes, URIs), and unlisted URIs under a source's forwarded prefix with the access
    `manifest` gives that source."""
    forwards = {prefix: (sid, manifest.sources[sid].access) for sid, src in sources.items()
                if manifest is not None and sid in manifest.sources and (prefix := src.forwarded_prefix)}
    return Catalog(entries, templates, generation, {sid: src.url_paths for sid, src in sources.items()},
                   frozenset(sid for sid, src in sources.items() if src.byte_names),
                   frozenset(sid for sid, src in sources.items() if src.uri_paths), forwards)


def build_templates(manifest: Manifest, published: Mapping[str, Published], issues: list[ManifestIssue]
                    ) -> list[TemplateEntry]:
    """The templates upstreams `published` and the manifest declares; a template declared twice is an issue
    (appended to `issues`), located at the manifest's."""
    templates: list[TemplateEntry] = []
    seen_templates: dict[str, TemplateSpec] = {}
    for sid, offered in published.items():
        sspec = manifest.sources[sid]
        for pub in offered.templates:
            try:
                parsed = UriTemplate.parse(pub.uri_template)
            except TemplateSyntaxError as exc:  # one we cannot match URIs against: left out, said once
                if _first_warning((sid, pub.uri_template)):
                    logger.warning("%s: %s: upstream template %r not published: %s", sspec.where, sspec.key,
                                   pub.uri_template, exc)
                continue
            tspec = TemplateSpec(pub.uri_template, pub.name, sid, pub.path,
                                 Display(pub.title, pub.description, pub.mime_type), sspec.where, sspec.key,
                                 access=sspec.access)
            seen_templates[pub.uri_template] = tspec
            templates.append(TemplateEntry(parsed, tspec))
    for tspec in manifest.templates:
        if tspec.uri_template in seen_templates:
            first = seen_templates[tspec.uri_template]
            issues.append(_issue(tspec.where, tspec.key,
                                 f"uriTemplate {tspec.uri_template!r} is also declared by {first.key} ({first.where})"))
            continue
        seen_templates[tspec.uri_template] = tspec
        templates.append(TemplateEntry(UriTemplate.parse(tspec.uri_template), tspec))
    return templates


def _as_rows(entries: Collection[Entry]) -> Rows:
    """A collection's entries as rows (a catalog built before keeps them as rows already)."""
    return entries if isinstance(entries, Rows) else Rows.of(entries)


_NO_ROWS = Rows.of(())


def _collisions(manifest: Manifest, twice: set[str], resources: list[Entry], listed: list[Rows | RowsBuilder],
                published: Mapping[str, Published]) -> list[ManifestIssue]:
    """The issues of the URIs in `twice`: the first producer of each claims it (resources, then collections in
    manifest order, each in the order its source listed the files, then upstreams) and every later one is told."""
    issues: list[ManifestIssue] = []
    owners: dict[str, tuple[str, Location]] = {}

    def claim(uri: str, key: str, where: Location) -> None:
        first = owners.get(uri)
        if first is None:
            owners[uri] = (key, where)
        else:
            issues.append(uri_collision(uri, (key, where), first))

    for rspec, entry in zip(manifest.resources, resources, strict=True):
        if entry.uri in twice:
            claim(entry.uri, rspec.key, rspec.where)
    for cspec, part in zip(manifest.collections, listed, strict=True):
        for entry in part.entries_of(twice):
            claim(entry.uri, f"{cspec.key} (file {entry.path!r})", cspec.where)
    for sid, offered in published.items():
        sspec = manifest.sources[sid]
        for uri, path in offered.locations():
            if uri in twice:
                claim(uri, f"{sspec.key} (upstream resource {path!r})", sspec.where)
    return issues


def uri_collision(uri: str, later: tuple[str, Location], first: tuple[str, Location]) -> ManifestIssue:
    """The issue of two producers of one URI, located at the one claiming it later (resources, then collections in
    manifest order, then upstreams); each is (what the manifest calls it, where)."""
    return _issue(later[1], later[0], f"URI {uri!r} is also produced by {first[0]} ({first[1]})")


def _issue(where: Location, key: str, message: str) -> ManifestIssue:
    return ManifestIssue(where.file, where.line, where.col, key, message)
