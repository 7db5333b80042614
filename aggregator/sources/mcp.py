"""Another MCP server's resources as a source (the `mcp` kind: `mcp+stdio:` with `command`, or `mcp+https://host/mcp`),
over `aggregator.upstream`.

A "path" is the upstream's resource URI as it is (`file:///docs/a.md`), or with `root` (the manifest's `prefix`, a URI
prefix such as `file:///docs/`) what follows it (`a.md`): `list(pattern)` globs over the paths of the URIs the
upstream lists, `stat`/`read`/`version` forward to it. A catalog collection needs relative paths (no `//`): give it
a `prefix`.

- live: `changes(callback)` relays the upstream's ListChanged (callback(None): the supervisor lists again and sends
  our own list_changed only if our listing changed) and Updated (callback({path})); `want(paths)` subscribes
  upstream to what our subscribers read. A lost connection tells ListChanged, and the reconnect Updated for every
  subscribed URI (and ListChanged again only if no listing is owed since the loss's: one relist, not two).
  `health()` is the connection's state for /healthz and /metrics.
- access: the caller's token is never forwarded: the upstream's credentials are the manifest's `headers`.
- catalog: with a `namespace`, `published()` offers every upstream resource and template (under `root`) as
  `<ns>+<uri>`; its paths are then upstream URIs (`uri_paths`) that a template's own RFC 6570 text expands.
  `complete_path` forwards completion of a template whose path is an upstream template.
- cache: `read()` returns an `McpBlob` whose `max_age`/`private` carry the upstream's `ttlMs`/`cacheScope`.
  `version()` reads and hashes (MCP has no cheap version; a read carries none): change events are preferred over
  polling.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import anyio

from aggregator import heap
from aggregator.globs import path_filter
from aggregator.manifest.source_urls import url_scheme
from aggregator.manifest.model import namespaced_uri
from aggregator.sources.base import (Blob, ChangeCallback, FileInfo, Published, PublishedTemplate, RelayRoute,
                                     Source, SourceError, SourceNotFound, SourceUnsupported)
from aggregator.sources.progress import ListingProgress
from aggregator.upstream import (HttpTarget, ListChanged, Listing, StdioTarget, Target, Updated, Upstream,
                                 UpstreamEvent, UpstreamStatus)
from aggregator.upstream.answers import Content, ListedResource, UpstreamRead
from aggregator.upstream.pages import off_loop_if_big
from aggregator.upstream.records import Packed, PublishedRecords, ResourceRecords
from aggregator.upstream.values import UpstreamValues

if TYPE_CHECKING:
    from aggregator.manifest.model import SourceSpec

__all__ = ["McpBlob", "McpSource", "open_mcp"]

LISTING_REUSE_S = 2.0
"""How long one upstream listing answers stat/list calls (a catalog build stats every resource it lists)."""


@dataclass(slots=True)
class McpBlob(Blob):
    """A read's bytes with the upstream's caching hints (modern wire only; None when absent)."""

    ttl_ms: int | None = None
    cache_scope: str | None = None


class McpSource(Source):
    """Resources of one upstream MCP server; paths are upstream URIs."""

    pushes_changes = True

    def __init__(self, id: str, upstream: Upstream, *, root: str = "", namespace: str | None = None,
                 listing_reuse: float = LISTING_REUSE_S) -> None:
        self.id = id
        self.upstream = upstream
        self.namespace = namespace
        """With a namespace, every upstream resource and template (under `root`) is published as `<ns>+<uri>`."""
        self.root = root
        """A URI prefix paths are relative to (`bench://` makes `a/b.md` mean `bench://a/b.md`); "" for whole URIs.
        Only URIs under it are listed."""
        self._listing_reuse = listing_reuse
        self._listing: tuple[float, Listing] | None = None
        self._listing_lock = anyio.Lock()
        self._templates: tuple[float, Listing] | None = None
        self.values = UpstreamValues(f"{upstream.describe()} ({id})")
        """What the upstream lists and reads is checked here before it is served."""
        self._generation = 0
        """Counts the upstream's ListChanged: a listing asked before the latest one is not kept (it may predate it)."""
        self._kept: ResourceRecords | None = None
        """The last records listed (what the catalog most likely holds), for an equal listing to share them."""
        self._prefix = namespaced_uri(namespace, "") if namespace else ""
        """What the kept records' URIs start with: the namespace the catalog lists them under."""

    def describe(self) -> str:
        return self.upstream.describe()

    @property
    def status(self) -> UpstreamStatus:
        return self.upstream.status

    async def probe(self) -> None:
        await self.upstream.connect()

    async def aclose(self) -> None:
        await self.upstream.aclose()

    async def listing(self, fresh: bool = False) -> Listing:
        """The upstream's resources as `UpstreamValues` lets them through (each URI once), one listing shared by
        calls within `listing_reuse` seconds (single-flight); none if it answers that it has no resources/list."""
        async with self._listing_lock:
            now = anyio.current_time()
            if not fresh and self._listing is not None and now - self._listing[0] < self._listing_reuse:
                return self._listing[1]
            generation = self._generation
            progress = ListingProgress(self.id, "resources")  # counted in aggregator_source_listings_total
            try:
                listing = await self.upstream.list_resources()
            except SourceUnsupported:  # no resources capability: -32601, as an SDK server answers
                self.values.said("lists nothing: it offers no resources (resources/list: method not found)")
                listing = Listing([])
            listed = [listing.items]
            listing = replace(listing, items=())
            records = await off_loop_if_big(len(listed[0]), self._records, listed)
            self._kept = records
            listing = replace(listing, items=records)
            progress.add(len(listing.items))
            progress.done(len(listing.items))
            if generation == self._generation:
                self._listing = (anyio.current_time(), listing)
            return listing

    def _records(self, listed: list[Sequence[ListedResource]]) -> ResourceRecords:
        """The records `listed` holds (taken out of it) as `UpstreamValues` lets them through, kept as columns; the
        kept ones if equal. A big listing's are made in a worker thread: seconds at a million entries."""
        # URIs as the catalog lists them (with the namespace): the records go before the URI strings are made, so
        # that those fill the heap the records left (`Packed`).
        packed = Packed(self.values.resources(listed.pop()), self._prefix)
        kept = self._kept
        records = packed.records(kept)
        del packed
        if len(records) >= heap.BIG_LISTING:
            heap.trim()  # what the records took goes back to the system
        return kept if kept is not None and records == kept else records  # one copy, not one more a relisting

    async def records(self) -> ResourceRecords:
        """`listing().items`: the records, as columns."""
        items = (await self.listing()).items
        assert isinstance(items, ResourceRecords)
        return items

    async def templates(self) -> Listing:
        """The upstream's resource templates (items are `mcp_types.ResourceTemplate`, checked as `listing`'s), one
        listing shared by calls within `listing_reuse` seconds (completion asks on every keystroke); none if it
        answers -32601 (a server that registers no template handler has none)."""
        now = anyio.current_time()
        if self._templates is not None and now - self._templates[0] < self._listing_reuse:
            return self._templates[1]
        generation = self._generation
        try:
            templates = await self.upstream.list_templates()
        except SourceUnsupported:
            templates = Listing([])
        templates = replace(templates, items=self.values.templates(templates.items))
        if generation == self._generation:
            self._templates = (anyio.current_time(), templates)
        return templates

    @property
    def publishes(self) -> bool:
        return bool(self.namespace)

    @property
    def uri_paths(self) -> bool:
        return bool(self.namespace)

    async def published(self) -> Published:
        """Every upstream resource and template under `root`, as `<namespace>+<uri>`, described as upstream does."""
        if not self.namespace:
            return Published()
        records = await self.records()
        resources = await off_loop_if_big(len(records), PublishedRecords, records, self.root)
        templates = []
        for template in (await self.templates()).items:
            text = template.uri_template
            if text.startswith(self.root) and len(text) > len(self.root):
                templates.append(PublishedTemplate(
                    namespaced_uri(self.namespace, text), text[len(self.root):], template.name,
                    getattr(template, "title", None), template.description, template.mime_type))
        return Published(resources, templates)

    @property
    def forwarded_prefix(self) -> str | None:
        """With a namespace, `<ns>+<root>`: a read of an unlisted URI there goes to the upstream (past the cap)."""
        return namespaced_uri(self.namespace, self.root) if self.namespace else None

    def uri_of(self, path: str) -> str:
        """The upstream URI a path names."""
        return self.root + path

    def path_of(self, uri: str) -> str | None:
        """The path of an upstream URI, or None when it is not under `root`."""
        return uri[len(self.root):] if uri.startswith(self.root) and len(uri) > len(self.root) else None

    async def list(self, pattern: str, exclude: Sequence[str] = (), hidden: bool = False) -> list[FileInfo]:
        keep = path_filter(pattern, exclude, hidden)
        records = await self.records()
        return await off_loop_if_big(len(records), _files, records, self._prefix + self.root, keep)

    async def stat(self, path: str) -> FileInfo:
        records = await self.records()
        index = records.find(self._prefix + self.uri_of(path))
        if index is not None:
            return _info(path, records[index])
        # Not listed (a templated URI): it exists if it reads.
        blob = await self.read(path, self.upstream.max_message_bytes)
        return FileInfo(path, len(blob.data), None, _digest(blob.data), blob.mime_type)

    async def read(self, path: str, max_bytes: int) -> McpBlob:
        """The content, with no version: MCP has no cheap one, so revalidating a kept copy would read it all again
        anyway, and a digest of every read (most are never kept: an uncached hop) is a hash for nothing."""
        return self._blob(await self.upstream.read(self.uri_of(path), max_bytes))

    def relay_route(self, path: str, max_bytes: int) -> RelayRoute | None:
        """Reads of `path` sent on the upstream's lean lane without a task, their outcomes what `read` returns or
        raises (see `Upstream.route`)."""
        return self.upstream.route(self.uri_of(path), max_bytes, self._made)

    def _blob(self, result: UpstreamRead) -> McpBlob:
        content = result.first
        return self._made([(content.uri, content.mime_type, content.raw, content.is_text, content.text)],
                          result.ttl_ms, result.cache_scope)

    def _made(self, contents: Sequence[Content], ttl_ms: int | None, cache_scope: str | None) -> McpBlob:
        """The blob of a read's checked contents (the first is the one asked) and hints (`answers.read_result`'s
        `make`: a relayed read's are made straight into it)."""
        _, mime_type, raw, _, text = contents[0]
        return McpBlob(raw, self.values.mime_type(mime_type), None, None if ttl_ms is None else ttl_ms / 1000,
                       cache_scope == "private", text, ttl_ms, cache_scope)

    async def version(self, path: str | None) -> str | None:
        """A digest of the content (MCP has no cheaper version); None when gone or for queries."""
        if path is None:
            return None
        try:
            return _digest((await self.read(path, self.upstream.max_message_bytes)).data)
        except SourceNotFound:
            return None

    async def complete(self, uri_template: str, name: str, value: str,
                       context: dict[str, str] | None = None) -> Sequence[str]:
        """The upstream's completion values for one argument of one of its templates."""
        return self.values.completions((await self.upstream.complete(uri_template, name, value, context)).values)

    async def complete_path(self, path_template: str, name: str, value: str,
                            context: Mapping[str, str] | None = None) -> Sequence[str] | None:
        """The upstream's completion when the template's path, under `root`, is one of the upstream's templates
        (`template/{id}/data` under `test://` is `test://template/{id}/data`); None (complete from the listing)
        otherwise."""
        uri_template = self.uri_of(path_template)
        if not any(t.uri_template == uri_template for t in (await self.templates()).items):
            return None
        return await self.complete(uri_template, name, value, dict(context) if context else None)

    def watch(self, callback: Callable[[UpstreamEvent], Awaitable[None]] | None) -> None:
        """Deliver the upstream's change events to `callback` (None: stop); see `Upstream.on_change`."""
        self.upstream.on_change(callback)

    def subscribe(self, uris: Iterable[str]) -> None:
        """The upstream URIs whose `Updated` events are wanted (replaces the previous set)."""
        self.upstream.subscribe(uris)

    # ---- the generic Source hooks over the two above ----

    def changes(self, callback: ChangeCallback | None) -> None:
        if callback is None:
            self.watch(None)
            return

        async def relay(event: UpstreamEvent) -> None:
            if isinstance(event, ListChanged):
                # The next list asks the upstream again, and one under way when this came is not kept.
                self._generation += 1
                self._listing = self._templates = None
                await callback(None)
            elif isinstance(event, Updated) and (path := self.path_of(event.uri)) is not None:
                await callback(frozenset({path}))

        self.watch(relay)

    def want(self, paths: Collection[str]) -> None:
        self.subscribe(self.uri_of(path) for path in paths)

    def health(self) -> Mapping[str, object]:
        """The connection's state; `lastError` is operator detail (it may quote the upstream), shown redacted by the
        console to a caller who sees everything, never by /healthz or /metrics."""
        status = self.upstream.status
        return {"state": status.state, "reconnects": status.reconnects, "protocolVersion": status.protocol_version,
                "lastError": status.last_error, "connectedAt": status.connected_at, "retryIn": status.retry_in}


def _files(records: ResourceRecords, start: str, keep: Callable[[str], bool]) -> list[FileInfo]:
    """The files `records` list under `start` (their paths what follows it) that `keep` keeps."""
    return [_info(uri[len(start):], records[i]) for i, uri in enumerate(records.uris)
            if len(uri) > len(start) and uri.startswith(start) and keep(uri[len(start):])]


def open_mcp(spec: SourceSpec) -> McpSource:
    """The source an `mcp` manifest entry describes (`aggregator.sources.builtin.McpKind`): `mcp+stdio:<folder>` runs
    `command` there with `env`; `mcp+http(s)://...` connects with the manifest's `headers` (never a caller's token)
    through the SSRF guard. The connection is made when the source is first used."""
    s = spec.settings
    target: Target
    if url_scheme(spec.url) == "mcp+stdio":
        if s["headers"] or s["allowPrivateNetwork"] or s["oauth"]:
            raise SourceError("headers, oauth and allowPrivateNetwork are for mcp+https:// upstreams, not mcp+stdio:")
        target = StdioTarget(list(s["command"]), env=dict(s["env"]), cwd=spec.url.split(":", 1)[1] or None)
    else:
        if s["command"] or s["env"]:
            raise SourceError("command and env are for mcp+stdio: upstreams")
        target = HttpTarget(spec.url[len("mcp+"):], headers=dict(s["headers"]),
                            allow_private_network=s["allowPrivateNetwork"], oauth=s["oauth"])
    # A child (or a remote session) takes longer to start than one call may take.
    upstream = Upstream(spec.id, target, timeout=spec.timeout, connect_timeout=max(spec.timeout, 30.0),
                        max_concurrency=spec.max_concurrency, max_entries=s["maxEntries"],
                        max_message_bytes=s["maxMessageBytes"])
    return McpSource(spec.id, upstream, root=s["prefix"], namespace=s["namespace"])


def _info(path: str, resource: ListedResource) -> FileInfo:
    return FileInfo(path, resource.size, resource.mtime, None, resource.mime_type)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
