"""An upstream listed again (its list_changed, a reconnect): the next catalog with what that one source lists now,
spliced in place of what it listed, without listing or building the rest of the catalog again.

`apply_upstream` gives the catalog `compile_catalog` would build when only `source` lists otherwise now (same
entries, order, lookups, pages, scope views, templates; a URI or template collision is the same ManifestError),
doing work in proportion to the source's listing: its collections' files go through catalog_delta, what it
publishes itself (resources under its namespace) is compared resource by resource, and its templates are indexed
again only when they changed.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace

from aggregator.catalog import Catalog
from aggregator.catalog_delta import Delta, file_changes, next_catalog
from aggregator.compiler import build_templates, upstream_entry
from aggregator.manifest.model import Manifest, ManifestError, ManifestIssue
from aggregator.sources import FileInfo
from aggregator.sources.base import Published, PublishedResource

__all__ = ["PublishedChanges", "apply_upstream", "published_changes"]


PublishedChanges = tuple[Iterable[str], list[PublishedResource]]
"""What `published_changes` finds: the URIs gone or changed, and the resources new or changed."""


def apply_upstream(catalog: Catalog, manifest: Manifest, source: str, upserted: Iterable[FileInfo],
                   removed: Collection[str], stated: Mapping[str, FileInfo | None], published: Published | None,
                   now: float | None = None, changed: PublishedChanges | None = None) -> Delta:
    """Apply to `catalog` (compiled from `manifest`) what `source` lists now: files of its collections (`upserted`
    and `removed`, as `catalog_delta.apply_files` takes them), the stat of the files manifest resources name in it
    (`stated`; None: not found), and what it publishes itself (`published`; None: nothing, as for a source that
    cannot be listed past its staleIfError); `changed`: `published_changes` of this catalog, if taken already.

    The Delta's `listing` covers the templates too. ManifestError (the issues compile_catalog reports) if a
    new URI or template collides, NeedsRelist if a collection of `source` was never listed; `catalog` is unchanged.
    """
    at = time.monotonic() if now is None else now
    changes = file_changes(catalog, manifest, source, upserted, removed, stated)
    before = catalog.published.get(source)
    gone, came = published_changes(catalog, source, published) if changed is None else changed
    for uri in gone:  # those that went or read otherwise: out (their URI may come back just below)
        if (entry := catalog.get(uri)) is not None:
            changes.out[uri] = entry
    sspec = manifest.sources[source]
    changes.incoming += [(sspec, upstream_entry(sspec, res)) for res in came]
    offered = dict(catalog.published)
    if published is None:
        offered.pop(source, None)
    else:
        offered[source] = published
    templates, issues = None, list[ManifestIssue]()
    if (before.templates if before is not None else ()) != (published.templates if published is not None else ()):
        templates = build_templates(manifest, offered, issues)
    try:
        delta = next_catalog(catalog, manifest, changes, at)
    except ManifestError as exc:
        raise ManifestError([*exc.issues, *issues]) from None
    if issues:
        raise ManifestError(issues)
    successor = delta.catalog  # not served yet: what it holds of the source is set here
    successor.published = offered
    if published is None:
        successor.published_at.pop(source, None)
    else:
        successor.published_at[source] = at
    if templates is None:
        return delta
    successor.with_templates(templates)
    return replace(delta, listing=delta.listing | catalog.templates_change(successor))


def published_changes(catalog: Catalog, source: str, published: Published | None) -> PublishedChanges:
    """What `source` publishes otherwise than `catalog` lists of it (None: nothing): one walk of both listings
    (none when their digests are equal)."""
    before = catalog.published.get(source)
    return _changed(before.resources if before is not None else (), published.resources if published is not None
                    else ())


def _changed(before: Sequence[PublishedResource], now: Sequence[PublishedResource]
             ) -> tuple[Iterable[str], list[PublishedResource]]:
    """The URIs of `before` gone or changed in `now`, and the resources of `now` new or changed. Records (an mcp
    source's columns) compare by digest, then in one walk of their URIs: no resource built but those that changed."""
    from aggregator.upstream.records import PublishedRecords  # an upstream's: never imported by a folder-only server

    if isinstance(before, PublishedRecords) and isinstance(now, PublishedRecords) and before.start == now.start:
        return ((), []) if before == now else now.changed(before)
    old = {res.uri: res for res in before}
    new = {res.uri: res for res in now}
    return [uri for uri, res in old.items() if new.get(uri) != res], [
        res for uri, res in new.items() if old.get(uri) != res]
