"""The indexer: keeps the full-text index of `index: true` collections in step with one service's catalog, and
answers the full-text part of a search for one caller.

A background task (`run`) fills the index within `server.search.indexBytes` and follows
`ResourceService.change_listeners` (files invalidated, catalog swapped). It reads files directly, past the content
cache (which indexing would flush), except `convert:` documents: their Markdown comes through the cache, so a
conversion serves the index and reads alike. It keys documents by their listed version (mtime:size), so a file index
survives restarts without rereading. Visibility is decided by the current catalog, never by the index.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence, Set as AbstractSet
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from aggregator.catalog import Catalog, Entry, FileTarget
from aggregator.content import decode_body, gunzip, is_text_mime
from aggregator.errors import ResourceNotConverted
from aggregator.manifest.model import CollectionSpec, SearchSettings
from aggregator.search_query import InvalidSearch

if TYPE_CHECKING:
    from aggregator.search_index import FullTextIndex
    from aggregator.service import ResourceService

__all__ = ["Indexer"]

logger = logging.getLogger("aggregator.search")

QUERY_THREADS = 2
"""Full-text queries waiting on the index at once; more wait on the event loop, not in threads."""
BATCH_DOCS = 64
"""Documents the indexer reads, then writes in one transaction: a query waits for at most one batch."""
READ_CONCURRENCY = 8
RETRY_SECONDS = 30
"""A pass that failed is tried again after this long even if nothing changes."""
MAX_DELTAS = 10_000
"""Incremental catalog changes remembered for the next pass; past them the pass looks at the whole catalog."""


class Indexer:
    """The full-text index of one service's `index: true` collections, opened on the first pass that has
    something to index (in memory, or `settings.index_file`), and the background task that keeps it current."""

    def __init__(self, service: ResourceService, settings: SearchSettings) -> None:
        self.service = service
        self.settings = settings
        self._index: FullTextIndex | None = None
        self._limiter = anyio.CapacityLimiter(QUERY_THREADS)
        self._wake = anyio.Event()
        self._stop = anyio.Event()
        self._dirty: set[tuple[str, str]] = set()
        self._known: dict[str, tuple[str, int]] = {}
        self._used = 0  # bytes of text the index holds (the sizes in `_known`)
        self._deltas: dict[int, frozenset[str]] = {}  # generation -> URIs changed in it (swapped in by catalog_delta)
        self._unreadable: set[str] = set()  # URIs not indexed as they could not be read: tried again on every pass
        self._over_budget: set[str] = set()  # URIs not indexed for the byte budget: tried again once bytes are freed
        self._over_budget_at = 0  # `_used` when they were passed over
        self.indexed_generation = 0
        """The catalog generation the index last caught up with (0: never): for tests and /healthz-style checks."""
        self.not_indexed = 0
        self.looked_at = 0
        """URIs the last pass looked at: the whole catalog's, or after catalog_delta's swaps those they changed."""
        service.change_listeners.append(self._changed)
        service.delta_listeners.append(self._delta)

    # --- the full-text part of a search ------------------------------------------------------------------------

    async def query(self, catalog: Catalog, terms: Sequence[tuple[str, bool]], scopes: frozenset[str] | None,
                    prefix: str, limit: int) -> list[tuple[str, str]]:
        """(uri, snippet) of the `limit` best text matches under `prefix` that this caller may see in `catalog`,
        best first; none before the index holds anything. InvalidSearch when the query takes too long or fails."""
        index = self._index
        if index is None or not self._known:
            return []
        if not _encodable(prefix):
            return []  # no URI starts with text that is not Unicode
        import sqlite3  # (imported by the index's module, which opened `index`)

        from aggregator.search_index import QueryTimeout, fts_expression

        match = fts_expression(terms)

        def visible(uri: str) -> bool:
            # The current catalog decides, as for resources/list: a URI the index still holds after it was
            # removed or hidden by a reload is never returned, nor is its snippet.
            entry = catalog.get(uri)
            return entry is not None and (scopes is None or entry.access <= scopes)

        # Only when the caller's view is narrower than the catalog does every match need a visibility test;
        # otherwise the few removed URIs the index may still hold are dropped after ranking (a margin covers them).
        narrowed = scopes is not None and catalog.restricted
        try:
            async with self._limiter:
                found = await anyio.to_thread.run_sync(index.query, match, limit if narrowed else limit + 16,
                                                       visible if narrowed else None, prefix)
        except QueryTimeout:
            raise InvalidSearch("the search took too long; use more specific words") from None
        except sqlite3.Error as exc:
            logger.warning("full-text query %r failed: %s", match, exc)
            raise InvalidSearch("the search could not be run; use plain words") from None
        return [(uri, snippet) for uri, snippet in found if visible(uri)][:limit]

    # --- keeping it current ------------------------------------------------------------------------------------

    def _changed(self, files: set[tuple[str, str]] | None) -> None:
        if files:
            self._dirty |= files
        self._wake.set()

    def _delta(self, generation: int, uris: frozenset[str]) -> None:
        if len(self._deltas) >= MAX_DELTAS:
            self._deltas.clear()  # a pass that long overdue looks at the whole catalog
        self._deltas[generation] = uris

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    async def run(self) -> None:
        """Keep the full-text index in step with the catalog until `stop()` (or cancelled): a pass at start, then
        one after every new catalog (reload, relisting) or file change; a pass that failed is tried again every 30 s."""
        try:
            async with anyio.create_task_group() as tg:

                async def stop_when_asked() -> None:
                    await self._stop.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(stop_when_asked)
                while True:
                    self._wake = anyio.Event()
                    try:
                        if self._dirty or self.indexed_generation != self.service.catalog.generation:
                            await self.index_once()
                    except Exception:  # the loop must outlive one pass: the next change tries again
                        logger.exception("updating the search index failed; trying again on the next change")
                    with anyio.move_on_after(RETRY_SECONDS):
                        await self._wake.wait()
        finally:
            with anyio.CancelScope(shield=True):
                await self.aclose()

    async def aclose(self) -> None:
        """Close the index (a file index keeps what it holds for the next start)."""
        if self._index is not None:
            index, self._index = self._index, None
            self._known, self._used = {}, 0
            await anyio.to_thread.run_sync(index.close)

    async def index_once(self) -> None:
        """One pass: index new and changed text files of `index: true` collections within the byte budget, and
        drop what is gone. After catalogs swapped in by catalog_delta only, it looks at the URIs they changed (and
        the files invalidated); otherwise at the whole catalog."""
        catalog = self.service.catalog
        changed = self._changed_since(catalog.generation)
        keys = [key for key in catalog.collections if key.index]
        if not keys and self._index is None:
            self.indexed_generation = catalog.generation
            return
        index = await self._open()
        dirty, self._dirty = self._dirty, set()
        if changed is None:
            wanted = {e.uri: e for key in keys for e in catalog.collections[key]}
            considered: AbstractSet[str] = self._known.keys() | wanted.keys()
            self._used = sum(size for _, size in self._known.values())
            self._unreadable.clear()
            self._over_budget.clear()
        else:
            considered = changed | _uris_of(catalog, keys, dirty) | self._unreadable
            if self._used < self._over_budget_at:
                considered |= self._over_budget  # bytes were freed since they were passed over
            wanted = {uri: entry for uri in considered if (entry := _indexed_entry(catalog, keys, uri)) is not None}
        self.looked_at = len(considered)
        gone = [uri for uri in considered if uri in self._known and uri not in wanted]
        if gone:
            await anyio.to_thread.run_sync(index.delete, gone)
            for uri in gone:
                self._used -= self._known.pop(uri)[1]
        self._unreadable -= considered
        self._over_budget -= considered
        plan: list[tuple[Entry, str]] = []
        for uri in sorted(wanted):
            entry = wanted[uri]
            version = f"{entry.mtime}:{entry.size}"
            known = self._known.get(uri)
            if known is not None and known[0] == version and (entry.source, entry.path) not in dirty:
                continue
            plan.append((entry, version))
        for i in range(0, len(plan), BATCH_DOCS):
            await self._index_batch(index, catalog, plan[i : i + BATCH_DOCS])
        skipped = len(self._unreadable) + len(self._over_budget)
        if skipped and skipped != self.not_indexed:
            logger.warning("search index: %d file(s) of index: true collections are not indexed (unreadable or past "
                           "server.search.indexBytes = %d bytes); they are found by their metadata only",
                           skipped, self.settings.index_bytes)
        self.not_indexed = skipped
        self.indexed_generation = catalog.generation

    def _changed_since(self, generation: int) -> frozenset[str] | None:
        """The URIs changed from the generation last indexed to `generation` when catalog_delta made every step
        between them; None when another swap did (or none was indexed yet): look at the whole catalog then."""
        deltas, self._deltas = self._deltas, {g: uris for g, uris in self._deltas.items() if g > generation}
        start = self.indexed_generation
        if start == 0 or any(g not in deltas for g in range(start + 1, generation + 1)):
            return None
        return frozenset().union(*(deltas[g] for g in range(start + 1, generation + 1)))

    async def _index_batch(self, index: FullTextIndex, catalog: Catalog, batch: list[tuple[Entry, str]]) -> None:
        """Read a batch of planned documents (those within the budget) and write them in one transaction; the
        others are noted to be tried again."""
        budget = self.settings.index_bytes
        texts: list[str | None] = [None] * len(batch)
        passed_over: set[int] = set()  # not read: past the budget whatever they hold
        limiter = anyio.CapacityLimiter(READ_CONCURRENCY)

        async def read(j: int, entry: Entry) -> None:
            async with limiter:
                texts[j] = await self._read_text(catalog, entry)

        async with anyio.create_task_group() as tg:
            for j, (entry, _) in enumerate(batch):
                if _binary(entry):
                    texts[j] = ""  # kept as known (and empty), so it is not looked at again
                elif entry.size is None or self._used - self._known.get(entry.uri, ("", 0))[1] + entry.size <= budget:
                    tg.start_soon(read, j, entry)
                else:
                    passed_over.add(j)
        docs: list[tuple[str, str, str, int]] = []
        for j, ((entry, version), text) in enumerate(zip(batch, texts, strict=True)):
            old = self._known.get(entry.uri, ("", 0))[1]
            size = -1 if text is None else len(text.encode("utf-8"))
            if j in passed_over or (text is not None and self._used - old + size > budget):
                self._over_budget.add(entry.uri)  # tried again once bytes are freed
                self._over_budget_at = self._used
                continue
            if text is None:
                self._unreadable.add(entry.uri)  # unreadable now: tried again on the next pass
                continue
            self._used += size - old
            docs.append((entry.uri, version, text, size))
            self._known[entry.uri] = (version, size)
        if docs:
            await anyio.to_thread.run_sync(index.put, docs)

    async def _open(self) -> FullTextIndex:
        if self._index is None:
            from aggregator.search_index import FullTextIndex  # (sqlite3) only once there is something to index

            self._index = await anyio.to_thread.run_sync(FullTextIndex, self.settings.index_file)
            self._known = await anyio.to_thread.run_sync(self._index.known)
            self._used = sum(size for _, size in self._known.values())
        return self._index

    async def _read_text(self, catalog: Catalog, entry: Entry) -> str | None:
        """The text of a listed file as resources/read serves it, read past the content cache (indexing every file
        must not evict what clients read) unless it is converted; "" for binary content, None when it cannot be
        read now."""
        snapshot = self.service.snapshot
        source = snapshot.sources.get(entry.source or "")
        if source is None or entry.path is None:
            return None
        max_bytes = snapshot.limits[entry.source or ""].max_bytes  # the source's maxBytes, else the default
        try:
            target = catalog.resolve(entry.uri)
            if isinstance(target, FileTarget) and target.convert is not None:
                return await self._converted(target)
            blob = await source.read(entry.path, max_bytes)
            data = blob.data
            if isinstance(target, FileTarget) and target.decompress and data.startswith(b"\x1f\x8b"):
                data = gunzip(data, max_bytes)
        except Exception as exc:  # a file that cannot be read now is tried again on its next change
            logger.debug("search index: cannot read %s: %s", entry.uri, exc)
            return None
        content = decode_body(data, target.mime_type)
        return content.text if content.text is not None else ""

    async def _converted(self, target: FileTarget) -> str | None:
        """The Markdown of a `convert:` file as reads get it: the content cache's, so a document is converted once
        for both (the cache forgets it when the file changes); "" when it does not convert (indexed empty until it
        changes), None when it cannot be read now (tried again on its next change)."""
        try:
            content = await self.service.read_indexed(target)
        except ResourceNotConverted as exc:
            logger.debug("search index: %s not converted: %s", target.uri, exc)
            return ""
        except Exception as exc:  # a converter not installed, a source down: tried again on the next change
            logger.debug("search index: cannot read %s: %s", target.uri, exc)
            return None
        return content.text if content.text is not None else ""

    async def wait_indexed(self, generation: int | None = None) -> None:
        """Until a pass has caught up with `generation` (default: the current one) and no change is pending."""
        while True:
            want = generation or self.service.catalog.generation
            if self.indexed_generation >= want and not self._dirty and not self._wake.is_set():
                return
            await anyio.sleep(0.02)


def _indexed_entry(catalog: Catalog, keys: list[CollectionSpec], uri: str) -> Entry | None:
    """The entry listed at `uri` if an `index: true` collection (of `keys`) lists it."""
    entry = catalog.get(uri)
    if entry is None or entry.path is None:
        return None
    found = any(k.source == entry.source and catalog.paths_of(k).get(entry.path) == entry for k in keys)
    return entry if found else None


def _uris_of(catalog: Catalog, keys: list[CollectionSpec], files: set[tuple[str, str]]) -> set[str]:
    """The URIs `index: true` collections (of `keys`) list for these (source, path) files."""
    return {entry.uri for key in keys for source, path in files
            if key.source == source and (entry := catalog.paths_of(key).get(path)) is not None}


def _binary(entry: Entry) -> bool:
    """Listed with a type that is not text: never read for the index."""
    return entry.mime_type is not None and not is_text_mime(entry.mime_type)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
