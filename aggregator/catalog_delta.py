"""Incremental relisting: the next catalog after files of one source came, changed or went, without listing it again.

`apply_files` gives the catalog `compile_catalog` would build over the new folder state (same entries, order,
lookups, pages and scope views; a URI collision is the same ManifestError), doing work in proportion to the change:
the successor shares the entries and path indexes the change did not touch (`chunked`: sorted entries in chunks,
path indexes as a base and the changes since). It also says what the change did to the listing, so the caller need
not compare whole listings to decide on `list_changed`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter

from aggregator.catalog import Catalog, Entry
from aggregator.catalog_rows import Rows
from aggregator.path_index import PathIndex
from aggregator.compiler import EntryBuilder, collection_key, resource_entry, uri_collision
from aggregator.entry import entries_change
from aggregator.listing_change import ListingChange
from aggregator.globs import path_filter
from aggregator.manifest.model import CollectionSpec, Location, Manifest, ManifestError, ManifestIssue, SourceSpec
from aggregator.manifest.placeholders import FILE_PLACEHOLDERS
from aggregator.paths import uri_path
from aggregator.sources import FileInfo, Source

__all__ = ["Changes", "Delta", "NeedsRelist", "Producer", "apply_files", "changed_files", "edit_sorted",
           "entries_of_files", "file_changes", "listed_under", "next_catalog", "stat_paths", "unlisted_files"]

_URI = attrgetter("uri")
_FILE_PLACEHOLDER = re.compile(r"\{(?:%s)\}" % "|".join(FILE_PLACEHOLDERS))
"""A placeholder a collection's URI pattern fills per file (any other brace is literal text)."""
_CARRIED_VIEWS = 8
"""Scope views (the newest) kept up to date across a change; older ones are filtered again when next asked."""


class NeedsRelist(Exception):
    """The change cannot be applied to this catalog (a collection of the source was never listed in it): list the
    catalog again with `compile_catalog`."""


@dataclass(frozen=True, slots=True)
class Delta:
    """A change applied: the next catalog and what changed in it."""

    catalog: Catalog
    added: frozenset[str]
    """URIs listed now and not before."""
    removed: frozenset[str]
    """URIs listed before and not now."""
    updated: frozenset[str]
    """URIs listed before and now whose entry changed (size, mtime ...): their content may differ."""
    gone: frozenset[tuple[str, str]]
    """(source, path) of files no longer listed: their cached content must not outlive the swap."""
    listing: ListingChange
    """Whose resources/list shows something else now (`listing_changed`: what `Catalog.listing_signature`
    compares)."""

    @property
    def listing_changed(self) -> bool:
        """Whether resources/list shows something else now to a caller who sees everything."""
        return self.listing.listing_changed

    def paths_of(self, uris: Iterable[str]) -> set[str]:
        """The files the next catalog's entries for `uris` read (URIs that name no file are left out)."""
        return {e.path for e in map(self.catalog.get, uris) if e is not None and e.path is not None}


def apply_files(catalog: Catalog, manifest: Manifest, source: str, upserted: Iterable[FileInfo],
                removed: Collection[str], now: float | None = None) -> Delta:
    """Apply to `catalog` (compiled from `manifest`, current until this change) files of `source` that exist now
    (`upserted`: their stat) and paths that no longer do (`removed`; a path in both counts as upserted).

    Every collection over `source` and every manifest resource naming one of the files is updated. Raises
    ManifestError (the issues `compile_catalog` reports) if a new URI collides, and NeedsRelist if `catalog` has
    not listed every collection of `source`; either way nothing changed, and since `catalog` no longer matches the
    folder the caller must relist with `compile_catalog` (which also reports the collision as a reload would).
    """
    return next_catalog(catalog, manifest, file_changes(catalog, manifest, source, upserted, removed), now)


Producer = CollectionSpec | SourceSpec | None
"""What makes an entry: a collection, a source publishing it (an upstream), or None: a manifest resource."""


@dataclass(slots=True)
class Changes:
    """What a change does to a catalog, gathered before the successor is built (`next_catalog`)."""

    out: dict[str, Entry]
    """Old entries leaving the listing or replaced, by URI."""
    incoming: list[tuple[Producer, Entry]]
    """New entries, each with what makes it (a collection, an upstream's source, None: a manifest resource)."""
    paths: dict[CollectionSpec, PathIndex]
    """Collections' new path indexes (every collection of the source listed again)."""


def file_changes(catalog: Catalog, manifest: Manifest, source: str, upserted: Iterable[FileInfo],
                 removed: Collection[str], stated: Mapping[str, FileInfo | None] | None = None) -> Changes:
    """What `apply_files` applies (NeedsRelist if a collection of `source` was never listed in `catalog`). With
    `stated`, the manifest resources naming files of `source` take their stat from it (None: not found), not from
    the files listed (a source whose listing does not show every file that reads: an upstream's templated URI)."""
    files = {info.path: info for info in upserted}
    gone_paths = set(removed) - files.keys()
    if stated is None:
        stated = {**dict.fromkeys(gone_paths), **files}
    found = Changes({}, [], {})
    for spec in manifest.collections:
        key = collection_key(spec)
        if spec.source != source or key in found.paths:
            continue
        if key not in catalog.listed_at:
            raise NeedsRelist(f"{spec.key} was not listed")
        found.paths[key] = _change_collection(spec, catalog.paths_of(key), files, gone_paths, found.out,
                                              found.incoming)
    for rspec in manifest.resources:
        path = rspec.path
        if (rspec.source == source and path is not None and path in stated
                and (old := catalog.get(rspec.uri)) is not None):
            entry = resource_entry(rspec, stated[path])
            if entry != old:
                found.out[old.uri] = old
                found.incoming.append((None, entry))
    return found


def next_catalog(catalog: Catalog, manifest: Manifest, changes: Changes, now: float | None = None) -> Delta:
    """The successor of `catalog` with `changes` applied, and what that changed; ManifestError (the issues
    `compile_catalog` reports) if a new URI collides."""
    issues = _collisions(catalog, manifest, changes.out, changes.incoming)
    if issues:
        raise ManifestError(issues)
    return _next(catalog, changes.out, [entry for _, entry in changes.incoming], changes.paths, now)


async def stat_paths(source: Source, paths: Iterable[str]) -> tuple[list[FileInfo], set[str]]:
    """What `apply_files` takes for paths a poll named: the stat of those that are files now, and the others
    (gone, not a regular file, or a name the source refuses: a listing would not show them either)."""
    return await source.stat_many(paths)


async def changed_files(catalog: Catalog, manifest: Manifest, source: str, backend: Source, paths: Iterable[str],
                        relooked: Collection[str] = ()) -> tuple[list[FileInfo], set[str]]:
    """What `apply_files` takes for paths a watcher named, folders included: the stat of each that is a file now
    and of every file under each that is a folder now (a folder moved in is named alone), and as gone the others
    with every path `catalog` lists under them (so is a folder moved out). Of `relooked` (paths said modified: a
    folder looked at again, `folder_watch.changed_since`), what `catalog` lists under one that is a folder now and
    is not there now is gone too (a folder that came is not looked through for what it listed before)."""
    paths = set(paths)
    found, missing = await backend.stat_many(paths, folders=True)
    named = {info.path for info in found}
    folders = paths.intersection(relooked) - missing - named
    gone = listed_under(catalog, manifest, source, missing | folders) - named
    return found, missing | gone


def listed_under(catalog: Catalog, manifest: Manifest, source: str, folders: Collection[str]) -> set[str]:
    """Paths of `source` that `catalog` lists (by a collection or a resource) under any of `folders`. A collection
    whose URI starts with `{path}` lists them in one run of its URIs, found by bisection; any other is scanned."""
    found: set[str] = set()
    if not folders:
        return found
    seen: set[CollectionSpec] = set()
    for spec in manifest.collections:
        key = collection_key(spec)
        if spec.source != source or key in seen:
            continue
        seen.add(key)
        listed = catalog.paths_of(key)
        unlisted = [folder for folder in folders if folder not in listed]  # a path listed as a file is no folder
        if not unlisted:
            continue
        literal, at_path = _uri_start(spec.uri)
        if at_path:
            for folder in unlisted:
                inside = folder + "/"
                found.update(path for e in catalog.under(literal + uri_path(inside))
                             if (path := e.path) is not None and path.startswith(inside) and listed.get(path) == e)
        else:
            prefixes = tuple(folder + "/" for folder in unlisted)
            found.update(path for path in listed if path.startswith(prefixes))
    prefixes = tuple(folder + "/" for folder in folders)
    found.update(r.path for r in manifest.resources if r.source == source and r.path and r.path.startswith(prefixes))
    return found


def entries_of_files(catalog: Catalog, manifest: Manifest, source: str, paths: Collection[str]) -> list[Entry]:
    """The entries `catalog` lists for these files of `source` (by collections, resources and what the source
    publishes), found through the collections' path indexes: O(paths x collections), not O(catalog)."""
    found: list[Entry] = []
    seen: set[CollectionSpec] = set()
    for spec in manifest.collections:
        key = collection_key(spec)
        if spec.source == source and key not in seen:
            seen.add(key)
            listed = catalog.paths_of(key)
            found += [entry for path in paths if (entry := listed.get(path)) is not None]
    for rspec in manifest.resources:
        if rspec.source == source and rspec.path in paths and (entry := catalog.get(rspec.uri)) is not None:
            found.append(entry)
    published = catalog.published.get(source)
    if published is not None:  # an upstream's own resources: as many as it publishes, not the catalog
        found += [entry for uri, _ in published.locations(paths)
                  if (entry := catalog.get(uri)) is not None and entry.source == source]
    return found


def unlisted_files(old: Catalog, new: Catalog) -> set[tuple[str, str]]:
    """Files `old` lists that `new` may no longer list, for two catalogs of one manifest (a relisting): the files of
    the URIs gone, and of the URIs kept that name another file now. A superset of `old.targets() - new.targets()` (a
    file also listed under another URI is named too: its cache is forgotten, no harm), at the cost of a C-level set
    difference of the URIs and a look at the explicit rows of both, not of a (source, path) pair per row: a compact
    row names the same file under both catalogs unless two collections' compact URIs can coincide (then the rows of
    those collections are looked at too)."""
    gone = set(old.entries.uris).difference(new.entries.uris)
    files = {file for uri in gone if (file := _file_of(old.get(uri))) is not None}
    kept = (old.entries.explicit.keys() | new.entries.explicit.keys()) - gone
    kept |= _shared_compact_uris(old, new)
    for uri in kept:
        before = _file_of(old.get(uri))
        if before is not None and before != _file_of(new.get(uri)):
            files.add(before)
    return files


def _file_of(entry: Entry | None) -> tuple[str, str] | None:
    if entry is None or entry.source is None or entry.path is None:
        return None
    return entry.source, entry.path


def _shared_compact_uris(old: Catalog, new: Catalog) -> set[str]:
    """URIs of `old`'s compact rows whose maker's space overlaps another space of either catalog (two collections'
    compact URIs that can coincide, as `f://{path}` over two sources): only there may a compact row kept name
    another file. None in the usual case, one compact pattern per URI prefix."""
    spaces = {space for maker in (*old.entries.makers, *new.entries.makers) if (space := maker.uri_space) is not None}
    shared = {a for a in spaces for b in spaces if a != b and _overlap(a, b)}
    if not shared:
        return set()
    kinds = {kind for kind, maker in enumerate(old.entries.makers, start=1) if maker.uri_space in shared}
    return {uri for uri, which in old.entries.kinds() if which in kinds}


def _overlap(a: tuple[str, str, str], b: tuple[str, str, str]) -> bool:
    """Whether one URI can be `prefix + path + suffix` of both spaces."""
    (_, p, s), (_, q, t) = a, b
    return (p.startswith(q) or q.startswith(p)) and (s.endswith(t) or t.endswith(s))


def _uri_start(pattern: str) -> tuple[str, bool]:
    """The literal text of a collection's URI pattern before its first placeholder, and whether that is `{path}`
    (then the URIs of the files under a folder all start with that text and the folder's encoded path)."""
    first = _FILE_PLACEHOLDER.search(pattern)
    if first is None:
        return pattern, False
    return pattern[: first.start()], first.group(0) == "{path}"


def _change_collection(spec: CollectionSpec, before: PathIndex, files: dict[str, FileInfo],
                       gone: set[str], out: dict[str, Entry], incoming: list[tuple[Producer, Entry]]
                       ) -> PathIndex:
    """One collection's path index after the change (`before` itself if nothing changed in it; else a copy sharing
    what did not change); records the entries it drops in `out` and the ones it makes in `incoming`."""
    wanted = path_filter(spec.glob, spec.exclude, spec.hidden)  # the test sources apply when they list
    build = EntryBuilder(spec).entry
    dropped: list[str] = []
    added: dict[str, Entry] = {}
    for path in gone:
        old = before.get(path)
        if old is not None:
            dropped.append(path)
            out[old.uri] = old
    for path, info in files.items():
        old = before.get(path)
        entry = build(info) if wanted(path) else None
        if entry == old:
            continue
        if old is not None:
            out[old.uri] = old
            if entry is None:
                dropped.append(path)
        if entry is not None:
            added[path] = entry
            incoming.append((spec, entry))
    return before.edited(dropped, added) if dropped or added else before


def _collisions(catalog: Catalog, manifest: Manifest, out: dict[str, Entry],
                incoming: list[tuple[Producer, Entry]]) -> list[ManifestIssue]:
    """The issues compile_catalog reports for the new entries' URIs: each may have one producer only."""
    issues: list[ManifestIssue] = []
    claimed: dict[str, tuple[int, int, str, Location]] = {}
    twins_of: dict[int, list[int]] = {}  # by id(spec): a folder moved in brings many entries of one collection
    for spec, entry in incoming:
        uri = entry.uri
        mine = _producer(manifest, spec, entry)
        first = claimed.get(uri)
        held = catalog.get(uri) if first is None and uri not in out else None
        if held is not None:
            first = _producer(manifest, _owner(catalog, manifest, held), held)
        if first is not None:
            early, late = sorted([first, mine])
            issues.append(uri_collision(uri, late[2:], early[2:]))
        elif isinstance(spec, CollectionSpec):
            # Collections listing exactly the same files (a copy in the manifest) collide on every file.
            twins = twins_of.get(id(spec))
            if twins is None:
                key = collection_key(spec)
                twins = twins_of[id(spec)] = [i for i, c in enumerate(manifest.collections) if collection_key(c) == key]
            for i in twins[1:]:
                issues.append(uri_collision(uri, _named(manifest.collections[i], i, entry)[2:], mine[2:]))
        claimed[uri] = mine
    return issues


def _owner(catalog: Catalog, manifest: Manifest, entry: Entry) -> CollectionSpec | None:
    """The (first) collection that listed `entry`; None for a resource's or an upstream's."""
    for spec in manifest.collections:
        if spec.source == entry.source and catalog.paths_of(collection_key(spec)).get(entry.path or "") == entry:
            return spec
    return None


def _producer(manifest: Manifest, spec: Producer, entry: Entry) -> tuple[int, int, str, Location]:
    """(claim rank, position, name, where) of what produced `entry`: compile_catalog claims resources, then
    collections in manifest order, then upstreams' (None: a resource if one has its URI, else its source's)."""
    if isinstance(spec, CollectionSpec):
        return _named(spec, next(i for i, c in enumerate(manifest.collections) if c is spec), entry)
    if spec is None:
        for i, rspec in enumerate(manifest.resources):
            if rspec.uri == entry.uri:
                return 0, i, rspec.key, rspec.where
    sspec = spec if spec is not None else manifest.sources[entry.source or ""]
    return 2, list(manifest.sources).index(sspec.id), f"{sspec.key} (upstream resource {entry.path!r})", sspec.where


def _named(spec: CollectionSpec, position: int, entry: Entry) -> tuple[int, int, str, Location]:
    return 1, position, f"{spec.key} (file {entry.path!r})", spec.where


def _next(catalog: Catalog, out: dict[str, Entry], new: list[Entry], paths: dict[CollectionSpec, PathIndex],
          now: float | None) -> Delta:
    """The successor catalog holding `new` instead of `out`, and what that changed."""
    new.sort(key=_URI)
    fresh = {e.uri: e for e in new}
    new_uris = fresh.keys()
    entries, uris = edit_sorted(catalog.entries, catalog._uris, out.keys(), new)
    access = catalog.access_count - sum(1 for e in out.values() if e.access) + sum(1 for e in new if e.access)
    successor = catalog.successor(entries, uris, catalog.generation + 1, access)
    for scopes, (visible, visible_uris) in list(catalog._views.items())[-_CARRIED_VIEWS:]:
        seen = [e for e in new if e.access <= scopes]
        successor._views[scopes] = edit_sorted(visible, visible_uris, out.keys(), seen)
    at = time.monotonic() if now is None else now
    for key, after in paths.items():
        successor._by_path[key] = after
        if after is not catalog.paths_of(key):
            successor.collections[key] = after.rows  # the path index's rows: no copy
        successor.listed_at[key] = at
    added, removed = frozenset(new_uris - out.keys()), frozenset(out.keys() - new_uris)
    updated = frozenset(e.uri for e in new if e.uri in out)
    listing = entries_change(out, fresh)
    if not listing.listing_changed and "listing_signature" in catalog.__dict__:
        successor.__dict__["listing_signature"] = catalog.listing_signature
    gone = {(e.source, e.path) for e in out.values() if e.source is not None and e.path is not None}
    gone -= {(e.source, e.path) for e in new if e.source is not None and e.path is not None}
    return Delta(successor, added, removed, updated, frozenset(gone), listing)


def edit_sorted(entries: Rows, uris: Sequence[str], drop: Collection[str], add: Sequence[Entry]
                ) -> tuple[Rows, Sequence[str]]:
    """Copies of sorted `entries` and their `uris` without the URIs in `drop` (those present) and with `add`
    (sorted, URIs not otherwise present) merged in (`Rows.edited`)."""
    rows = entries.edited(drop, add)
    return rows, rows.uris
