"""Discovery: list and search the catalog (the `list_resources` and `search_resources` tools and the
`search://{?q,prefix,limit}` resource), and the full-text index of collections that say `index: true`.

Everything here answers for one caller: it sees exactly what resources/list shows it (its `access` scopes), and
a full-text hit, snippet included, comes only from a resource it may read. Metadata (URI, name, title,
description) is scanned in memory; text goes into an SQLite FTS5 index (BM25 ranking, snippets) that a background
task fills within `server.search.indexBytes` and keeps current as files change and the manifest reloads.
"""

from __future__ import annotations

import bisect
import fnmatch
import logging
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from aggregator.catalog import Catalog, Entry, FileTarget, Page, decode_cursor, encode_cursor, prefix_range
from aggregator.content import decode_body, gunzip, is_text_mime
from aggregator.errors import RequestError
from aggregator.manifest.model import SearchSettings
from aggregator.search_meta import MetadataSearch, MetadataTimeout
from aggregator.templates import UriTemplate

if TYPE_CHECKING:
    from aggregator.service import ResourceService

__all__ = ["SEARCH_TEMPLATE", "Discovery", "FullTextIndex", "Hit", "InvalidSearch", "query_terms"]

logger = logging.getLogger("aggregator.search")

SEARCH_TEMPLATE = "search://{?q,prefix,limit}"
SEARCH_SCHEME = "search:"
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
MAX_QUERY_CHARS = 1000
MAX_TERMS = 16
MAX_GLOB_CHARS = 200
LIST_SCAN = 20_000
"""Entries one filtered list_resources page looks at, at most: a page may come back short (even empty) with a
nextCursor, so that a filter matching nothing never costs a scan of the whole catalog in one call."""
QUERY_SECONDS = 5.0
"""Longest a full-text query may run before it is interrupted (a clean error, never a stuck thread)."""
QUERY_THREADS = 2
"""Full-text queries waiting on the index at once; more wait on the event loop, not in threads."""
BATCH_DOCS = 64
"""Documents the indexer reads, then writes in one transaction: a query waits for at most one batch."""
READ_CONCURRENCY = 8
SNIPPET_TOKENS = 16
_RRF_K = 60
"""Reciprocal rank fusion's constant: metadata and full-text rankings are merged by 1 / (K + rank)."""
_TERM = re.compile(r"(\w+)(\*?)")
_SEARCH = UriTemplate.parse(SEARCH_TEMPLATE)


class InvalidSearch(RequestError):
    """Arguments a search or listing cannot use; the message says which (it is safe for clients)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


def query_terms(query: str) -> list[tuple[str, bool]]:
    """The words of a query (lower-cased, at most MAX_TERMS) and whether each ends in `*` (a prefix search).
    Anything else a query holds (quotes, operators, brackets) is a separator: a query is text, never syntax."""
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidSearch(f"the query is longer than {MAX_QUERY_CHARS} characters")
    terms = [(word.lower(), bool(star)) for word, star in _TERM.findall(query)]
    return list(dict.fromkeys(terms))[:MAX_TERMS]


def fts_expression(terms: Sequence[tuple[str, bool]]) -> str:
    """An FTS5 MATCH expression requiring every term: each one quoted, so no input is read as FTS5 syntax."""
    return " ".join('"' + word.replace('"', '""') + '"' + ("*" if prefix else "") for word, prefix in terms)


def parse_limit(value: object, default: int = DEFAULT_LIMIT, most: int = MAX_LIMIT) -> int:
    if value is None or value == "":
        return default
    try:
        limit = int(str(value))
    except ValueError:
        raise InvalidSearch("limit must be a whole number") from None
    if not 1 <= limit <= most:
        raise InvalidSearch(f"limit must be between 1 and {most}")
    return limit


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result: a listed entry the caller may see, and where its text matched (if it did)."""

    entry: Entry
    snippet: str | None = None


# --- the full-text index ------------------------------------------------------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (id INTEGER PRIMARY KEY, uri TEXT UNIQUE NOT NULL, version TEXT NOT NULL,
                                 bytes INTEGER NOT NULL);
CREATE VIRTUAL TABLE IF NOT EXISTS fts USING fts5(body, tokenize = 'unicode61 remove_diacritics 2');
"""


class QueryTimeout(Exception):
    pass


class FullTextIndex:
    """An SQLite FTS5 index of document text by URI, in memory or in a file. Blocking: call it from a worker
    thread. One connection, used by one thread at a time (a lock), so queries and writes never interleave."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(path) if path else ":memory:", check_same_thread=False,
                                     isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            if path is not None:
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._conn.execute("PRAGMA synchronous=NORMAL")
                self._conn.execute("PRAGMA busy_timeout=5000")  # --workers N share the file
            self._conn.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def known(self) -> dict[str, tuple[str, int]]:
        """Every indexed URI with the version and byte count it was indexed at."""
        with self._lock:
            return {uri: (version, size) for uri, version, size in
                    self._conn.execute("SELECT uri, version, bytes FROM docs")}

    def put(self, docs: Sequence[tuple[str, str, str, int]]) -> None:
        """Index (uri, version, text, bytes) documents, replacing what those URIs had, in one transaction."""
        with self._lock, _transaction(self._conn) as conn:
            for uri, version, text, size in docs:
                row = conn.execute("SELECT id FROM docs WHERE uri = ?", (uri,)).fetchone()
                if row is not None:
                    conn.execute("DELETE FROM fts WHERE rowid = ?", row)
                    conn.execute("UPDATE docs SET version = ?, bytes = ? WHERE id = ?", (version, size, row[0]))
                    rowid = row[0]
                else:
                    rowid = conn.execute("INSERT INTO docs (uri, version, bytes) VALUES (?, ?, ?)",
                                         (uri, version, size)).lastrowid
                conn.execute("INSERT INTO fts (rowid, body) VALUES (?, ?)", (rowid, text))

    def delete(self, uris: Sequence[str]) -> None:
        with self._lock, _transaction(self._conn) as conn:
            for uri in uris:
                row = conn.execute("SELECT id FROM docs WHERE uri = ?", (uri,)).fetchone()
                if row is not None:
                    conn.execute("DELETE FROM fts WHERE rowid = ?", row)
                    conn.execute("DELETE FROM docs WHERE id = ?", row)

    def query(self, match: str, limit: int, visible: Callable[[str], bool] | None, prefix: str = "",
              seconds: float = QUERY_SECONDS) -> list[tuple[str, str]]:
        """(uri, snippet) of the best documents matching `match` (BM25) under `prefix`: `limit` of them that
        `visible` accepts, or without `visible`, `limit` of them (the caller filters; a test per row costs a
        Python call for every match). QueryTimeout past `seconds`. Snippets are made only for the ones returned."""
        deadline = time.monotonic() + seconds
        where, args = "fts MATCH ?", [match]
        if prefix:
            where += " AND docs.uri >= ? AND docs.uri < ?"
            args += [prefix, prefix + "\U0010ffff"]
        if visible is not None:
            where += " AND visible(docs.uri)"
        with self._lock:
            conn = self._conn
            if visible is not None:
                conn.create_function("visible", 1, lambda uri: bool(visible(uri)), deterministic=False)
            conn.set_progress_handler(lambda: time.monotonic() > deadline, 10_000)
            try:
                top = conn.execute(
                    f"SELECT fts.rowid, docs.uri FROM fts JOIN docs ON docs.id = fts.rowid WHERE {where} "
                    "ORDER BY bm25(fts) LIMIT ?", (*args, limit)).fetchall()
                if not top:
                    return []
                marks = ",".join("?" * len(top))
                snippets = dict(conn.execute(
                    f"SELECT rowid, snippet(fts, 0, '«', '»', '…', {SNIPPET_TOKENS}) FROM fts "
                    f"WHERE fts MATCH ? AND rowid IN ({marks})", (match, *(rowid for rowid, _ in top))).fetchall())
            except sqlite3.OperationalError:
                if time.monotonic() > deadline:
                    raise QueryTimeout() from None
                raise
            finally:
                conn.set_progress_handler(None, 0)
        return [(uri, snippets.get(rowid, "")) for rowid, uri in top]

    def stats(self) -> tuple[int, int]:
        """(documents, bytes of text) indexed."""
        with self._lock:
            docs, size = self._conn.execute("SELECT count(*), coalesce(sum(bytes), 0) FROM docs").fetchone()
        return docs, size


class _transaction:
    """One write transaction: committed when the block ends, rolled back if it raises."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        # IMMEDIATE takes the write lock first, so another process writing the same index file (--workers N) makes
        # this one wait (busy_timeout) rather than fail when it upgrades from reading to writing.
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, kind: object, *rest: object) -> None:
        self.conn.execute("ROLLBACK" if kind is not None else "COMMIT")


def _binary(entry: Entry) -> bool:
    """Listed with a type that is not text: never read for the index."""
    return entry.mime_type is not None and not is_text_mime(entry.mime_type)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _name_test(glob: str | None) -> Callable[[str], bool] | None:
    if not glob:
        return None
    if len(glob) > MAX_GLOB_CHARS:
        raise InvalidSearch(f"the name glob is longer than {MAX_GLOB_CHARS} characters")
    return re.compile(fnmatch.translate(glob), re.IGNORECASE | re.DOTALL).match  # type: ignore[return-value]


def _mime_test(mime_type: str | None) -> Callable[[str | None], bool] | None:
    """`text/markdown` matches that type (parameters ignored); `text/*` any text type."""
    if not mime_type:
        return None
    wanted = mime_type.split(";", 1)[0].strip().lower()
    if wanted.endswith("/*"):
        major = wanted[:-1]
        return lambda m: m is not None and m.lower().startswith(major)
    return lambda m: m is not None and m.split(";", 1)[0].strip().lower() == wanted


# --- discovery -----------------------------------------------------------------------------------------------


class Discovery:
    """Listing with filters and search for one service, and the indexer that keeps the full-text index current.

    `tools` is whether the server offers the tools (fixed at start); the search:// template is offered when
    tools are on or a collection says `index: true`, unless the manifest itself serves `search:` URIs.
    """

    def __init__(self, service: ResourceService, tools: bool = False, settings: SearchSettings | None = None) -> None:
        self.service = service
        self.tools = tools
        self.settings = settings or service.manifest.server.search
        self._index: FullTextIndex | None = None
        self._limiter = anyio.CapacityLimiter(QUERY_THREADS)
        self._metadata = MetadataSearch()
        self._owns_scheme: tuple[Catalog, bool] | None = None
        self._wake = anyio.Event()
        self._stop = anyio.Event()
        self._dirty: set[tuple[str, str]] = set()
        self._known: dict[str, tuple[str, int]] = {}
        self.indexed_generation = 0
        """The catalog generation the index last caught up with (0: never): for tests and /healthz-style checks."""
        self.not_indexed = 0
        service.change_listeners.append(self._changed)

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

    # --- listing -----------------------------------------------------------------------------------------------

    def list_page(self, cursor: str | None, scopes: frozenset[str] | None, *, prefix: str = "",
                  mime_type: str | None = None, name: str | None = None, limit: int | None = None) -> Page:
        """A page of what resources/list shows this caller, narrowed to URIs starting with `prefix`, a MIME type
        (`text/*` allowed) and a name glob; InvalidCursor for a cursor no catalog made. Costs O(page) when only
        `prefix` narrows it; with other filters it looks at LIST_SCAN entries at most, and may come back short."""
        catalog = self.service.catalog
        limit = limit or self.service.page_size
        entries, uris = catalog.visible(scopes)
        start, end = prefix_range(uris, prefix)
        if cursor:
            start = max(start, bisect.bisect_right(uris, decode_cursor(cursor)))
        name_ok, mime_ok = _name_test(name), _mime_test(mime_type)
        if name_ok is None and mime_ok is None:
            chunk = entries[start : min(end, start + limit)]
            more = start + limit < end
            return Page(chunk, encode_cursor(uris[start + limit - 1]) if more else None)
        found: list[Entry] = []
        i, stop = start, min(end, start + LIST_SCAN)
        while i < stop and len(found) < limit:
            entry = entries[i]
            if (name_ok is None or name_ok(entry.name)) and (mime_ok is None or mime_ok(entry.mime_type)):
                found.append(entry)
            i += 1
        return Page(found, encode_cursor(uris[i - 1]) if i < end else None)

    # --- search --------------------------------------------------------------------------------------------

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
        text = await self._full_text(catalog, terms, scopes, prefix, limit)
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

    async def _full_text(self, catalog: Catalog, terms: Sequence[tuple[str, bool]], scopes: frozenset[str] | None,
                         prefix: str, limit: int) -> list[tuple[str, str]]:
        index = self._index
        if index is None or not self._known:
            return []
        if not _encodable(prefix):
            return []  # no URI starts with text that is not Unicode
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

    def parse_search_uri(self, uri: str) -> tuple[str, str, int]:
        """(q, prefix, limit) of a search:// URI; InvalidSearch if it is not one."""
        values = _SEARCH.match(uri)
        if values is None:
            raise InvalidSearch(f"a search URI looks like {SEARCH_TEMPLATE}, e.g. search://?q=install&limit=5")
        q, prefix = values.get("q") or "", values.get("prefix") or ""
        if not isinstance(q, str) or not isinstance(prefix, str):
            raise InvalidSearch("q and prefix are single values")
        return q, prefix, parse_limit(values.get("limit"))

    # --- the indexer -------------------------------------------------------------------------------------------

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
                    with anyio.move_on_after(30):
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
            blob = await source.read(entry.path, max_bytes)
            data = blob.data
            if isinstance(target, FileTarget) and target.decompress and data.startswith(b"\x1f\x8b"):
                data = gunzip(data, max_bytes)
        except Exception as exc:  # a file that cannot be read now is tried again on its next change
            logger.debug("search index: cannot read %s: %s", entry.uri, exc)
            return None
        content = decode_body(data, target.mime_type)
        return content.text if content.text is not None else ""

    async def wait_indexed(self, generation: int | None = None) -> None:
        """Until a pass has caught up with `generation` (default: the current one) and no change is pending."""
        while True:
            want = generation or self.service.catalog.generation
            if self.indexed_generation >= want and not self._dirty and not self._wake.is_set():
                return
            await anyio.sleep(0.02)
