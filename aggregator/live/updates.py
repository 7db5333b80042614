"""Apply a change to the catalog and tell the Notifier: the one step every side loop ends in.

The loops only say what changed (files of a source, a source's query data, URIs, a listing); this module
invalidates what it touches, relists when files came or went, and sends `updated` / `list_changed` to the
subscribers and sessions it concerns, on both wires with their scope filters.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING

from aggregator.cache_keys import Forget
from aggregator.catalog_delta import Delta
from aggregator.listing_change import ListingChange
from aggregator.live.delta import FullRelist, apply_changed_files
from aggregator.live.relisted import relist_source, relist_upstream
from aggregator.manifest.model import ManifestError
from aggregator.notify import Notifier
from aggregator.service import ResourceService
from aggregator.sources import SourceError
from aggregator.watch import Change

if TYPE_CHECKING:
    from aggregator.cluster.told import SourcePath

__all__ = ["CatalogUpdates", "SaidOnce"]

logger = logging.getLogger("aggregator.supervisor")  # one logger for every side loop


class SaidOnce:
    """The last error logged: the same broken manifest or colliding listing is tried again on every check, and
    said once (reloads and relisting share it; a successful reload forgets it)."""

    def __init__(self) -> None:
        self.last: str | None = None

    def first_time(self, message: str) -> bool:
        """True (and remembered) unless `message` is the one logged last."""
        if message == self.last:
            return False
        self.last = message
        return True

    def forget(self) -> None:
        self.last = None


class CatalogUpdates:
    """Applies changes to the ResourceService's catalog and cache, and notifies through a Notifier."""

    def __init__(self, service: ResourceService, notifier: Notifier) -> None:
        self.service = service
        self.notifier = notifier
        self.errors = SaidOnce()
        self.incremental_relists = 0
        """Changes of files applied to the catalog without listing it again (for /metrics and tests)."""
        self.full_relists = 0
        """Changes of files that needed the whole catalog listed again."""
        self._stale = False  # a relisting failed (or was cut short): the catalog may not follow the folders
        self._unlisted: set[str] = set()  # polled sources whose last listing failed

    def has_collection(self, source: str) -> bool:
        """Whether what `source` lists shows in the catalog: a collection over it, or its own published entries."""
        backend = self.service.sources.get(source)
        return (backend is not None and backend.publishes) or any(
            c.source == source for c in self.service.manifest.collections)

    async def files_changed(self, source: str, changes: set[tuple[Change, str]]) -> None:
        """Invalidate, send `updated` to subscribers, and apply the files to the catalog (of a local folder, or any
        source when files came or went): list_changed when listed entries came or went."""
        paths = {path for _, path in changes}
        self.service.invalidate(source, paths)
        subscribed = self.notifier.subscribed_uris()
        if subscribed:
            backed = self.service.uris_for(source, paths, subscribed | self.service.render_inputs())
            uris = (backed | self.service.rendered_dependents(backed)) & subscribed
            if uris:
                await self.notifier.updated(sorted(uris))
        if not self.has_collection(source):
            return
        backend = self.service.sources.get(source)
        local = backend is not None and backend.watch_root() is not None  # its stat is cheap: sizes stay current
        if local or any(change != Change.modified for change, _ in changes):
            await self.apply_files(source, paths, {path for change, path in changes if change == Change.modified})

    async def apply_files(self, source: str, paths: set[str], relooked: Collection[str] = ()) -> None:
        """Apply these files of `source` to the catalog in proportion to the change (`relooked`: as
        `catalog_delta.changed_files` says); list_changed when entries came or went, `updated` to subscribed renders
        over the listing. A full relist when that cannot be done."""
        delta = await self._in_place(lambda: apply_changed_files(self.service, source, paths, relooked),
                                     f"changes in source {source!r}")
        if delta is not None and (delta.added or delta.removed):
            await self._tell_listing_changed(delta.listing)

    async def _in_place(self, apply: Callable[[], Awaitable[Delta | None]], after: str) -> Delta | None:
        """Run `apply` (a change applied to the catalog in place) and count it; a full relist instead when it cannot
        be done, or the last relist failed (the catalog does not follow the sources then, only a relist can). The
        Delta applied, if any."""
        try:
            if self._stale:
                raise FullRelist("the last relisting failed")
            delta = await apply()
        except (FullRelist, ManifestError) as exc:
            # A collision is reported located by the relist (said once); the other reasons are said here.
            if not isinstance(exc, ManifestError):
                logger.info("full relist after %s: %s", after, exc)
            self.full_relists += 1
            await self.relist()
            return None
        if delta is not None:
            self.incremental_relists += 1
        return delta

    async def source_polled(self, source: str) -> Delta | None:
        """List the collections of `source` again (a poll) and apply what came, changed or went in place: the files
        that changed are forgotten (their subscribers hear of them from the versions polled, which cover every
        subscribed URI of the source), list_changed when entries came or went. A full relist when that cannot be
        done; the Delta applied, if any. A source that cannot be listed now keeps its listing (said once)."""
        backend = self.service.sources.get(source)
        if backend is not None and backend.publishes:  # its own list of resources: compiled whole, as ever
            await self.relist()
            return None
        try:
            if self._stale:  # the last relist failed: the catalog does not follow the sources, only a relist can
                raise FullRelist("the last relisting failed")
            delta = await relist_source(self.service, source)
        except SourceError as exc:
            if source not in self._unlisted:  # said once per outage
                self._unlisted.add(source)
                logger.warning("polling source %r: it cannot be listed (%s); its last listing is served", source, exc)
            return None
        except (FullRelist, ManifestError) as exc:
            if not isinstance(exc, ManifestError):
                logger.info("full relist after polling source %r: %s", source, exc)
            self.full_relists += 1
            await self.relist()
            return None
        if source in self._unlisted:
            self._unlisted.discard(source)
            logger.warning("polling source %r: it can be listed again", source)
        if delta is None:
            return None
        self.incremental_relists += 1
        if delta.updated:
            self.service.invalidate(source, delta.paths_of(delta.updated))
        if delta.added or delta.removed:
            await self._tell_listing_changed(delta.listing)
        return delta

    async def upstream_listed(self, source: str) -> None:
        """A source that tells of its own changes (an MCP upstream) says its listing may have changed: list that
        source again and apply what came, changed or went in place; list_changed (and `updated` to subscribed renders
        over the listing) to the callers whose listing shows something else (an entry that only moved between
        scopes changes some callers' listings), as a full relist tells. Entries listed otherwise may read otherwise:
        their cached content is dropped, as a poll's are. A full relist when that cannot be done."""
        delta = await self._in_place(lambda: relist_upstream(self.service, source),
                                     f"source {source!r}'s listing changed")
        if delta is None:
            return
        if delta.updated:
            # Their subscribers hear of them from the upstream's own `updated` (subscribed upstream: pushed.py);
            # telling them here too tells twice when an entry's listing catches up with a change already told.
            self.service.invalidate(source, delta.paths_of(delta.updated))
        if delta.listing.any:
            await self._tell_listing_changed(delta.listing)

    async def uris_changed(self, uris: list[str], subscribed: set[str]) -> None:
        """These URIs read differently now (a poll saw new versions): invalidate them and tell those `subscribed`
        to them or to renders that read them."""
        self.service.invalidate_uris(uris)
        told = {*uris, *self.service.rendered_dependents(uris)} & subscribed
        if told:
            await self.notifier.updated(sorted(told))

    async def apply_change(self, source: str, files: set[str], data: bool,
                           news: set[SourcePath] | None = None) -> None:
        """These files (and, with `data`, the query results) of `source` changed: invalidate them and send
        `updated` to this replica's subscribers on both wires (with their scope filters, as for any change); of
        `news` only (None: all), the others were told already."""
        told = files if news is None else files & news
        if files - told:
            self.service.invalidate(source, files - told)
        if told:
            await self.files_changed(source, {(Change.modified, path) for path in told})
        if data:
            self.service.cache.invalidate_where(Forget.of(queries={source}))
            if news is not None and None not in news:
                return
            subscribed = self.notifier.subscribed_uris()
            queries = {uri for uri, path in self.service.reads_of(
                source, subscribed | self.service.render_inputs(subscribed)).items() if path is None}
            told = (queries | self.service.rendered_dependents(queries)) & subscribed
            if told:
                await self.notifier.updated(sorted(told))

    async def relist(self) -> bool:
        """List collections again; list_changed to the callers whose listing changed (the two catalogs compared),
        and `updated` to subscribed renders that listed resources (they may read differently now). True if some
        caller's listing changed."""
        try:
            self._stale = True
            listing = await self.service.refresh_listing()
            self._stale = False
        except ManifestError as exc:  # the manifest's own entries collide over what a source lists now: said once
            if self.errors.first_time(str(exc)):
                logger.error("relisting failed; still serving generation %d:\n%s", self.service.catalog.generation, exc)
            return False
        if not listing.any:
            return False
        await self._tell_listing_changed(listing)
        return True

    async def _tell_listing_changed(self, listing: ListingChange) -> None:
        """list_changed to the callers whose listing changed, and `updated` to subscribed renders that listed
        resources (they may read differently)."""
        await self.notifier.list_changed(listing)
        uris = self.service.rendered_dependents((), listing_changed=True) & self.notifier.subscribed_uris()
        if uris:
            await self.notifier.updated(sorted(uris))

    async def reloaded(self, listing: ListingChange, content_changed: set[str]) -> None:
        """A reload swapped in a new snapshot: list_changed to the callers whose listing changed (one that changes
        only who may see what changes some callers' listings and not others'), and `updated` to subscribers of what
        reads differently (changed content, renders over it or over the listing)."""
        if listing.any:
            await self.notifier.list_changed(listing)
        dependents = self.service.rendered_dependents(content_changed, listing_changed=listing.any)
        subscribed = (content_changed | dependents) & self.notifier.subscribed_uris()
        if subscribed:
            await self.notifier.updated(sorted(subscribed))
