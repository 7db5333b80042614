"""The catalog of a changed manifest built on the catalog it replaces: what did not change keeps its entries.

Collections the reload may reuse (their source kept, their listing current), resources whose settings and source did
not change (stat'ed less than the source's ttl ago, or kept current by a watcher) and upstreams' published lists
(kept sources that push their changes) keep their entries as they are; only the others are listed, by
`compile_catalog` over just them. The catalog is then edited in proportion to what changed (C-level copies of the
rest), and what that changed is said, so neither the reload nor the swap compares whole catalogs. What it cannot
build so (a URI claimed twice, a collection declared twice, a source that cannot be listed) it leaves to a full
`compile_catalog`, which reports it located.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from aggregator.catalog import Catalog, Entry, TemplateEntry
from aggregator.catalog_delta import edit_sorted
from aggregator.compiler import build_templates, catalog_of, collection_key, compile_catalog, resource_key
from aggregator.entry import entries_change
from aggregator.entry_spans import Differing, whole
from aggregator.listing_change import ListingChange
from aggregator.manifest.model import CollectionSpec, Manifest, ManifestError, ManifestIssue, ResourceSpec
from aggregator.rows_change import reads
from aggregator.sources import Source

__all__ = ["Recompiled", "recompile"]

_CARRIED_VIEWS = 8
"""Scope views (the newest) kept up to date across a reload; older ones are filtered again when next asked."""


@dataclass(frozen=True, slots=True)
class Recompiled:
    """The next catalog and what changed against the one it replaces."""

    catalog: Catalog
    gone: frozenset[tuple[str, str]]
    """(source, path) of files no longer listed: their cached content must not outlive the swap."""
    listing: ListingChange
    """Whose resources/list or resources/templates/list shows something else now (entries and templates that came,
    went, show otherwise, or need other scopes)."""
    content_changed: frozenset[str]
    """URIs listed before and after whose content now comes from elsewhere (other text, file or source)."""
    differing: Differing
    """The entries taken out and those put in: every other entry is the same in both catalogs."""


@dataclass(slots=True)
class _Plan:
    """What the next catalog takes from the previous one, and what must be listed."""

    reused: set[CollectionSpec]
    to_list: tuple[CollectionSpec, ...]
    kept_resources: dict[ResourceSpec, float]
    """Keys of resources whose entries are kept, with when they were stat'ed."""
    to_stat: tuple[ResourceSpec, ...]
    republished: set[str]
    """Publishing sources whose published lists are kept."""
    out: dict[str, Entry]
    """Entries of the previous catalog that leave it (their producer changed or went), by URI."""


async def recompile(previous: Catalog, old: Manifest, manifest: Manifest, sources: Mapping[str, Source],
                    kept: Collection[str], current: Collection[str], ttl: Mapping[str, float],
                    reuse: Mapping[CollectionSpec, Collection[Entry]], generation: int) -> Recompiled | None:
    """The catalog `manifest` describes over `sources`, built on `previous` (compiled from `old`): `kept` names the
    sources whose Source objects carried over, `current` those of them whose listings stay current by themselves
    (watched, pushing), `ttl` the kept sources' ttl and `reuse` the collections (by `collection_key`) whose entries
    need no listing. None when a full `compile_catalog` must build it (and report what is wrong, located)."""
    plan = _plan(previous, old, manifest, sources, kept, current, ttl, reuse)
    if plan is None:
        return None
    needed = ({c.source for c in plan.to_list} | {r.source for r in plan.to_stat if r.source is not None}
              | {sid for sid in manifest.sources if sid in sources and sources[sid].publishes
                 and sid not in plan.republished})
    part = replace(manifest, resources=plan.to_stat, collections=plan.to_list, templates=())
    try:
        listed = await compile_catalog(part, {sid: sources[sid] for sid in needed}, generation, previous=previous)
    except ManifestError:
        return None  # an unlistable source or a collision among what changed: the full compile says where
    incoming = list(listed.entries)
    if any(e.uri not in plan.out and previous.get(e.uri) is not None for e in incoming):
        return None  # a new entry claims a URI something kept holds
    published = {**{sid: previous.published[sid] for sid in plan.republished}, **listed.published}
    issues: list[ManifestIssue] = []
    templates = build_templates(manifest, published, issues)
    if issues:
        return None
    catalog = _assemble(previous, manifest, sources, plan, listed, templates, generation)
    catalog.published = published
    catalog.published_at = {**{sid: previous.published_at[sid] for sid in plan.republished
                               if sid in previous.published_at}, **listed.published_at}
    fresh = {e.uri: e for e in incoming}
    both = fresh.keys() & plan.out.keys()
    listing = entries_change(plan.out, fresh) | previous.templates_change(catalog)
    if not listing.listing_changed and "listing_signature" in previous.__dict__:
        catalog.__dict__["listing_signature"] = previous.listing_signature
    return Recompiled(catalog, _gone(plan.out.values(), incoming), listing,
                      frozenset(uri for uri in both if reads(plan.out[uri]) != reads(fresh[uri])
                                or fresh[uri].source not in (None, *kept)), whole(list(plan.out.values()), incoming))


def _plan(previous: Catalog, old: Manifest, manifest: Manifest, sources: Mapping[str, Source],
          kept: Collection[str], current: Collection[str], ttl: Mapping[str, float],
          reuse: Mapping[CollectionSpec, Collection[Entry]]) -> _Plan | None:
    """Which producers keep their entries and which are listed; None if collections are declared twice (they
    collide on every file, which the full compile reports)."""
    keys = [collection_key(c) for c in manifest.collections]
    old_keys = [collection_key(c) for c in old.collections]
    if len(set(keys)) < len(keys) or len(set(old_keys)) < len(old_keys):
        return None
    reused = {key for key in keys if key in reuse}
    out: dict[str, Entry] = {}
    for key in old_keys:
        if key not in reused:
            out.update((e.uri, e) for e in previous.collections.get(key, ()))
    # Resources by what they are: a resource the manifest now spells twice keeps one entry, and the other collides.
    before: dict[ResourceSpec, list[Entry]] = {}
    for rspec in old.resources:
        if (entry := previous.get(rspec.uri)) is not None:
            before.setdefault(resource_key(rspec), []).append(entry)
    kept_resources: dict[ResourceSpec, float] = {}
    to_stat: list[ResourceSpec] = []
    now = time.monotonic()
    for rspec in manifest.resources:
        rkey, sid = resource_key(rspec), rspec.source
        stated = previous.stated_at.get(rkey, 0.0)
        recent = sid is None or (sid in kept and (sid in current or now - stated < ttl[sid]))
        if recent and before.get(rkey):
            before[rkey].pop()
            if sid is not None:
                kept_resources[rkey] = stated
        else:
            to_stat.append(rspec)
    out.update((e.uri, e) for entries in before.values() for e in entries)
    needed = {c.source for c, key in zip(manifest.collections, keys, strict=True) if key not in reused}
    needed |= {r.source for r in to_stat if r.source is not None}
    # A kept upstream's list stays current by itself; one a changed collection or resource lists anyway is taken
    # from that listing.
    republished = {sid for sid in manifest.sources if sid in sources and sources[sid].publishes and sid in kept
                   and sid in current and sid in previous.published and sid not in needed}
    for sid, offered in previous.published.items():
        if sid not in republished:
            out.update((e.uri, e) for uri, _ in offered.locations()
                       if (e := previous.get(uri)) is not None and e.source == sid)
    return _Plan(reused, tuple(c for c, key in zip(manifest.collections, keys, strict=True) if key not in reused),
                 kept_resources, tuple(to_stat), republished, out)


def _assemble(previous: Catalog, manifest: Manifest, sources: Mapping[str, Source], plan: _Plan, listed: Catalog,
              templates: Sequence[TemplateEntry], generation: int) -> Catalog:
    """`previous` without `plan.out`, with what was `listed`, serving `templates` (built like compile_catalog's)."""
    incoming = list(listed.entries)
    access = (previous.access_count - sum(1 for e in plan.out.values() if e.access)
              + sum(1 for e in incoming if e.access))
    # The listing's rows as they are (compact rows stay compact), not the entries built from them.
    entries, uris = edit_sorted(previous.entries, previous._uris, plan.out.keys(), listed.entries)  # noqa: SLF001
    catalog = catalog_of((), templates, generation, sources, manifest).successor(entries, uris, generation, access)
    for scopes, (visible, visible_uris) in list(previous._views.items())[-_CARRIED_VIEWS:]:  # noqa: SLF001
        catalog._views[scopes] = edit_sorted(visible, visible_uris, plan.out.keys(),  # noqa: SLF001
                                             [e for e in incoming if e.access <= scopes])
    now = time.monotonic()
    keys = [collection_key(c) for c in manifest.collections]
    catalog.collections = {key: previous.collections[key] if key in plan.reused else listed.collections[key]
                           for key in keys}
    catalog.listed_at = {key: previous.listed_at.get(key, now) if key in plan.reused else listed.listed_at[key]
                         for key in keys if key in plan.reused or key in listed.listed_at}
    catalog._by_path = {key: paths for key, paths in previous._by_path.items()  # noqa: SLF001
                        if key in plan.reused}
    catalog.stated_at = {**plan.kept_resources, **listed.stated_at}
    return catalog


def _gone(out: Collection[Entry], incoming: Sequence[Entry]) -> frozenset[tuple[str, str]]:
    """Files the leaving entries read that no new entry reads."""
    files = {(e.source, e.path) for e in out if e.source is not None and e.path is not None}
    return frozenset(files - {(e.source, e.path) for e in incoming if e.source is not None and e.path is not None})
