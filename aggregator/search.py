"""Discovery: list and search the catalog (the `list_resources` and `search_resources` tools and the
`search://{?q,prefix,limit}` resource), over the full-text index of collections that say `index: true`.

Everything here answers for one caller: it sees exactly what resources/list shows it (its `access` scopes), and
a full-text hit, snippet included, comes only from a resource it may read. Metadata (URI, name, title,
description) is scanned in memory (search_meta.py); text goes into an SQLite FTS5 index (search_index.py) that
a background task fills within `server.search.indexBytes` and keeps current as files change and the manifest
reloads (search_indexer.py). Arguments are parsed in search_query.py, filtered listing is search_list.py.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aggregator.catalog import Catalog, Entry, Page, prefix_range
from aggregator.manifest.model import SearchSettings
from aggregator.search_indexer import Indexer
from aggregator.search_list import list_page
from aggregator.search_meta import MetadataSearch, MetadataTimeout
from aggregator.search_query import (DEFAULT_LIMIT, SEARCH_SCHEME, SEARCH_TEMPLATE, InvalidSearch, parse_limit,
                                     parse_search_uri, query_terms)

if TYPE_CHECKING:
    from aggregator.service import ResourceService

# The names importers have always taken from here, wherever they now live.
__all__ = ["SEARCH_TEMPLATE", "Discovery", "Hit", "InvalidSearch", "parse_limit", "query_terms"]

logger = logging.getLogger("aggregator.search")

_RRF_K = 60
"""Reciprocal rank fusion's constant: metadata and full-text rankings are merged by 1 / (K + rank)."""


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result: a listed entry the caller may see, and where its text matched (if it did)."""

    entry: Entry
    snippet: str | None = None


class Discovery:
    """Listing with filters and search for one service, and the indexer that keeps the full-text index current.

    `tools` is whether the server offers the tools (fixed at start); the search:// template is offered when
    tools are on or a collection says `index: true`, unless the manifest itself serves `search:` URIs.
    """

    def __init__(self, service: ResourceService, tools: bool = False, settings: SearchSettings | None = None) -> None:
        self.service = service
        self.tools = tools
        self.settings = settings or service.manifest.server.search
        self._indexer = Indexer(service, self.settings)
        self._metadata = MetadataSearch()
        self._owns_scheme: tuple[Catalog, bool] | None = None

    # --- what is offered -------------------------------------------------------------------------------------

    @property
    def indexing(self) -> bool:
        return any(c.index for c in self.service.manifest.collections)

    def template_offered(self) -> bool:
        """Whether resources/templates/list shows search:// and reads of search:// URIs are answered here."""
        if not (self.tools or self.indexing):
            return False
        catalog = self.service.catalog
        if self._owns_scheme is None or self._owns_scheme[0] is not catalog:
            _, uris = catalog.visible(None)
            start, end = prefix_range(uris, SEARCH_SCHEME)
            owned = end > start or any(t.uri_template.lower().startswith(SEARCH_SCHEME) for t in catalog.templates)
            if owned and (self._owns_scheme is None or not self._owns_scheme[1]):  # said once, not per relisting
                logger.warning("the manifest serves search: URIs itself, so the built-in %s template is not offered "
                               "(the search_resources tool still is, with server.tools)", SEARCH_TEMPLATE)
            self._owns_scheme = (catalog, owned)
        return not self._owns_scheme[1]

    def is_search_uri(self, uri: str) -> bool:
        return uri[: len(SEARCH_SCHEME)].lower() == SEARCH_SCHEME and self.template_offered()

    # --- listing and search ------------------------------------------------------------------------------------

    def list_page(self, cursor: str | None, scopes: frozenset[str] | None, *, prefix: str = "",
                  mime_type: str | None = None, name: str | None = None, limit: int | None = None) -> Page:
        """A page of what resources/list shows this caller, narrowed by prefix, MIME type and name glob (see
        `search_list.list_page`); `limit` defaults to the server's page size."""
        return list_page(self.service.catalog, cursor, scopes, limit or self.service.page_size, prefix=prefix,
                         mime_type=mime_type, name=name)

    async def search(self, query: str, scopes: frozenset[str] | None, *, prefix: str = "",
                     limit: int = DEFAULT_LIMIT) -> list[Hit]:
        """The `limit` best entries this caller may see for `query`: metadata matches and (for indexed
        collections) full-text matches merged by reciprocal rank. Without words: the first entries under `prefix`.
        InvalidSearch for unusable arguments, and when the full-text part takes too long."""
        terms = query_terms(query)
        catalog = self.service.catalog
        entries, uris = catalog.visible(scopes)
        start, end = prefix_range(uris, prefix)
        if not terms:
            return [Hit(e) for e in entries[start : min(end, start + limit)]]
        meta = await self._meta(catalog, terms, scopes, prefix, limit)
        text = await self._indexer.query(catalog, terms, scopes, prefix, limit)
        fused: dict[str, float] = {}
        for rank, entry in enumerate(meta):
            fused[entry.uri] = 1 / (_RRF_K + rank)
        for rank, (uri, _) in enumerate(text):
            fused[uri] = fused.get(uri, 0.0) + 1 / (_RRF_K + rank)
        snippets = dict(text)
        best = sorted(fused, key=lambda uri: (-fused[uri], uri))[:limit]
        hits = []
        for uri in best:
            found = catalog.get(uri)
            if found is not None:
                hits.append(Hit(found, snippets.get(uri)))
        return hits

    async def _meta(self, catalog: Catalog, terms: Sequence[tuple[str, bool]], scopes: frozenset[str] | None,
                    prefix: str, limit: int) -> list[Entry]:
        try:
            return await self._metadata.search(catalog, terms, scopes, prefix, limit)
        except MetadataTimeout:
            raise InvalidSearch("the search took too long; use more specific words") from None

    def parse_search_uri(self, uri: str) -> tuple[str, str, int]:
        """(q, prefix, limit) of a search:// URI; InvalidSearch if it is not one."""
        return parse_search_uri(uri)

    # --- the indexer (search_indexer.Indexer) --------------------------------------------------------------------

    @property
    def indexed_generation(self) -> int:
        """The catalog generation the index last caught up with (0: never): for tests and /healthz-style checks."""
        return self._indexer.indexed_generation

    @property
    def not_indexed(self) -> int:
        """Files of `index: true` collections the last pass left out (unreadable, or past the byte budget)."""
        return self._indexer.not_indexed

    def stop(self) -> None:
        self._indexer.stop()

    async def run(self) -> None:
        """Keep the full-text index current until `stop()` (see `Indexer.run`)."""
        await self._indexer.run()

    async def aclose(self) -> None:
        """Close the index (a file index keeps what it holds for the next start)."""
        await self._indexer.aclose()

    async def index_once(self) -> None:
        """One indexing pass (see `Indexer.index_once`)."""
        await self._indexer.index_once()

    async def wait_indexed(self, generation: int | None = None) -> None:
        """Until a pass has caught up with `generation` (default: the current one) and no change is pending."""
        await self._indexer.wait_indexed(generation)
