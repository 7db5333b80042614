"""The indexer: keeps the full-text index of `index: true` collections in step with one service's catalog, and
answers the full-text part of a search for one caller.

A background task (`run`) fills the index within `server.search.indexBytes` and follows
`ResourceService.change_listeners` (files invalidated, catalog swapped). It reads files directly, past the content
cache (which indexing would flush), and keys documents by their listed version (mtime:size), so a file index
survives restarts without rereading. Visibility is decided by the current catalog, never by the index.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from aggregator.catalog import Catalog, Entry, FileTarget
from aggregator.content import decode_body, gunzip, is_text_mime
from aggregator.manifest.model import SearchSettings
from aggregator.reads.documents import indexed_text
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
        self.indexed_generation = 0
        """The catalog generation the index last caught up with (0: never): for tests and /healthz-style checks."""
        self.not_indexed = 0
        service.change_listeners.append(self._changed)

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
            self._known = {}
            await anyio.to_thread.run_sync(index.close)

    async def index_once(self) -> None:
        """One pass: index new and changed text files of `index: true` collections within the byte budget, and
        drop what is gone."""
        catalog = self.service.catalog
        wanted = {e.uri: e for key, built in catalog.collections.items() if key.index for e in built}
        if not wanted and self._index is None:
            self.indexed_generation = catalog.generation
            return
        index = await self._open()
        dirty, self._dirty = self._dirty, set()
        gone = [uri for uri in self._known if uri not in wanted]
        if gone:
            await anyio.to_thread.run_sync(index.delete, gone)
            for uri in gone:
                del self._known[uri]
        budget = self.settings.index_bytes
        used = sum(size for _, size in self._known.values())
        plan: list[tuple[Entry, str]] = []
        for uri in sorted(wanted):
            entry = wanted[uri]
            version = f"{entry.mtime}:{entry.size}"
            known = self._known.get(uri)
            if known is not None and known[0] == version and (entry.source, entry.path) not in dirty:
                continue
            plan.append((entry, version))
        skipped = 0
        limiter = anyio.CapacityLimiter(READ_CONCURRENCY)
        for i in range(0, len(plan), BATCH_DOCS):
            batch = plan[i : i + BATCH_DOCS]
            texts: list[str | None] = [None] * len(batch)

            async def read(j: int, entry: Entry) -> None:
                async with limiter:
                    texts[j] = await self._read_text(catalog, entry)

            async with anyio.create_task_group() as tg:
                for j, (entry, _) in enumerate(batch):
                    if _binary(entry):
                        texts[j] = ""  # kept as known (and empty), so it is not looked at again
                    elif entry.size is None or used - self._known.get(entry.uri, ("", 0))[1] + entry.size <= budget:
                        tg.start_soon(read, j, entry)  # otherwise over the budget whatever it holds: not read
            docs: list[tuple[str, str, str, int]] = []
            for (entry, version), text in zip(batch, texts, strict=True):
                old = self._known.get(entry.uri, ("", 0))[1]
                size = -1 if text is None else len(text.encode("utf-8"))
                if text is None or used - old + size > budget:
                    skipped += 1  # unreadable now, or past the budget: tried again on the next change
                    continue
                used += size - old
                docs.append((entry.uri, version, text, size))
                self._known[entry.uri] = (version, size)
            if docs:
                await anyio.to_thread.run_sync(index.put, docs)
        if skipped and skipped != self.not_indexed:
            logger.warning("search index: %d file(s) of index: true collections are not indexed (unreadable or past "
                           "server.search.indexBytes = %d bytes); they are found by their metadata only",
                           skipped, budget)
        self.not_indexed = skipped
        self.indexed_generation = catalog.generation

    async def _open(self) -> FullTextIndex:
        if self._index is None:
            from aggregator.search_index import FullTextIndex  # (sqlite3) only once there is something to index

            self._index = await anyio.to_thread.run_sync(FullTextIndex, self.settings.index_file)
            self._known = await anyio.to_thread.run_sync(self._index.known)
        return self._index

    async def _read_text(self, catalog: Catalog, entry: Entry) -> str | None:
        """The text of a listed file as resources/read serves it, read past the content cache (indexing every file
        must not evict what clients read); "" for binary content, None when it cannot be read now."""
        snapshot = self.service.snapshot
        source = snapshot.sources.get(entry.source or "")
        if source is None or entry.path is None:
            return None
        max_bytes = snapshot.limits[entry.source or ""].max_bytes  # the source's maxBytes, else the default
        try:
            target = catalog.resolve(entry.uri)
            convert = target.convert if isinstance(target, FileTarget) else None
            if convert is not None:
                max_bytes = convert.max_input_bytes  # as a read: the Markdown is what is served and indexed
            blob = await source.read(entry.path, max_bytes)
            data = blob.data
            if isinstance(target, FileTarget) and target.decompress and data.startswith(b"\x1f\x8b"):
                data = gunzip(data, max_bytes)
        except Exception as exc:  # a file that cannot be read now is tried again on its next change
            logger.debug("search index: cannot read %s: %s", entry.uri, exc)
            return None
        if isinstance(target, FileTarget) and convert is not None:
            return await indexed_text(target, convert, data, self.service.documents)
        content = decode_body(data, target.mime_type)
        return content.text if content.text is not None else ""

    async def wait_indexed(self, generation: int | None = None) -> None:
        """Until a pass has caught up with `generation` (default: the current one) and no change is pending."""
        while True:
            want = generation or self.service.catalog.generation
            if self.indexed_generation >= want and not self._dirty and not self._wake.is_set():
                return
            await anyio.sleep(0.02)


def _binary(entry: Entry) -> bool:
    """Listed with a type that is not text: never read for the index."""
    return entry.mime_type is not None and not is_text_mime(entry.mime_type)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
