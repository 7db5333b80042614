"""The console's routes: a static shell at /console and paged, scoped JSON (and one event stream) under /console/api.

The shell and its scripts hold no data, so a browser can load them before it has a token; every /console/api/
request passes the same bearer gate as /mcp (auth.protect) and sees exactly what its token may see. Every route
checks Host and Origin as /mcp does, and every response carries a strict Content-Security-Policy (no inline script
or style, nothing from another origin).
"""

from __future__ import annotations

import logging
import mimetypes
import re
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from aggregator.callers import caller_expiry, caller_name, caller_scopes
from aggregator.catalog import Page
from aggregator.completion import Completer
from aggregator.console.detail import cache_look, detail_view
from aggregator.console.events import EventHub, EventStreamResponse, TooManyStreams
from aggregator.console.history import KEPT_RELOADS, ReloadHistory, ReloadRecord
from aggregator.console.tree import tree_page
from aggregator.console.views import (catalog_facts, catalog_scopes, entry_view, reload_view, sees_all, source_rows,
                                      template_view, tree_view, view_changed, visible_uri)
from aggregator.errors import RequestError, ResourceNotFound
from aggregator.listing_change import ListingChange
from aggregator.manifest.model import ConsoleSettings
from aggregator.search_list import entry_filter
from aggregator.search_query import DEFAULT_LIMIT, MAX_LIMIT

if TYPE_CHECKING:
    from mcp.server.transport_security import TransportSecurityMiddleware

    from aggregator.notify import Notifier
    from aggregator.search import Discovery
    from aggregator.snapshot import Snapshot
    from aggregator.service import ResourceService

__all__ = ["API_PREFIX", "Console", "ConsoleLive"]

logger = logging.getLogger("aggregator.console")

API_PREFIX = "/console/api/"
MAX_PAGE = 500
SEARCH_WINDOW = 500
"""Search hits ranked for one console search at most: pages come from them, and past it the total is a floor."""
PREVIEW_CHARS = 512 * 1024
"""Text shown in a preview at most; the download has it all (within the same maxBytes as resources/read)."""
RAW_CHARS = 64 * 1024
"""Of the raw resources/read JSON in the detail pane, the text or base64 kept: it shows the result's shape (the
preview beside it already carries up to PREVIEW_CHARS of the text)."""
STATIC = ("index.html", "console.css", "app.js", "api.js", "highlight.js", "views.js", "detail.js", "link.js",
          "operations.js", "favicon.svg")
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY", "Cross-Origin-Opener-Policy": "same-origin",
           "Cross-Origin-Resource-Policy": "same-origin"}
API_HEADERS = {**HEADERS, "Cache-Control": "no-store"}
INLINE_IMAGES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp", "image/avif", "image/bmp"})
_STATUS = {"ResourceNotFound": 404, "InvalidCursor": 400, "InvalidSearch": 400, "ResourceTooLarge": 413}
Scopes = frozenset[str] | None
Rows = list[dict[str, Any]]  # a module alias: the class's `list` route shadows the builtin in its annotations


class ConsoleLive(Protocol):
    """What the console reads from the supervisor (aggregator.supervisor.Supervisor)."""

    @property
    def service(self) -> ResourceService: ...

    @property
    def notifier(self) -> Notifier: ...

    @property
    def history(self) -> ReloadHistory: ...

    def cluster_health(self) -> dict[str, object] | None: ...


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class Console:
    """The operator's console over one supervisor: its routes, its event hub, its completer."""

    def __init__(self, live: ConsoleLive, discovery: Discovery | None = None) -> None:
        self.live, self.discovery = live, discovery
        settings = live.service.manifest.server.console or ConsoleSettings()
        self.admin_scope = settings.admin_scope
        live.history.keep_diffs = True
        self.events = EventHub(live.notifier.bus, live.history, settings.max_streams, settings.max_streams_per_caller,
                               settings.admin_streams if self.admin_scope is not None else 0,
                               swaps=live.service.swap_listeners)
        live.notifier.close_listeners.append(self.events.close)
        live.notifier.interest.append(self.events.previewed)
        self.events.previews_changed = live.notifier.interest_changed
        self.completer = Completer()
        self._static = {name: (resources.files("aggregator.console") / "static" / name).read_bytes()
                        for name in STATIC}

    def routes(self, guard: TransportSecurityMiddleware) -> list[Route]:
        api: dict[str, Callable[[Request, Scopes], Awaitable[Response]]] = {
            "whoami": self.whoami, "tree": self.tree, "list": self.list, "search": self.search,
            "templates": self.templates, "complete": self.complete, "expand": self.expand, "read": self.read,
            "raw": self.raw, "sources": self.sources, "reloads": self.reloads, "events": self.stream}
        out = [Route("/console", self._guarded(guard, self.shell), methods=["GET"]),
               Route("/console/", self._guarded(guard, self.shell), methods=["GET"]),
               Route("/console/static/{name}", self._guarded(guard, self.static), methods=["GET"])]
        out += [Route(API_PREFIX + name, self._guarded(guard, self._api(handler)), methods=["GET"])
                for name, handler in api.items()]
        return out

    # --- plumbing ------------------------------------------------------------------------------------------

    @staticmethod
    def _guarded(guard: TransportSecurityMiddleware, endpoint: Callable[[Request], Awaitable[Response]]
                 ) -> Callable[[Request], Awaitable[Response]]:
        async def checked(request: Request) -> Response:
            refused = await guard.validate_request(request)
            if refused is not None:
                refused.headers.update(API_HEADERS)
                return refused
            return await endpoint(request)

        return checked

    def _api(self, handler: Callable[[Request, Scopes], Awaitable[Response]]
             ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                response = await handler(request, self._scopes(request))
            except Refused as exc:
                response = _error(exc.status, exc.message)
            except RequestError as exc:
                # The same client-safe messages as resources/read; a hidden URI is as unknown as a missing one.
                message = "Resource not found" if isinstance(exc, ResourceNotFound) else exc.message
                response = _error(_STATUS.get(type(exc).__name__, 502), message)
            except Exception:
                logger.exception("console request %s failed", request.url.path)
                response = _error(500, "Internal error")
            for name, value in API_HEADERS.items():  # a route's own (the raw bytes' sandbox) stays
                response.headers.setdefault(name, value)
            return response

        return endpoint

    def _scopes(self, request: Request) -> Scopes:
        """The caller's scopes, or (`?as=`, for a holder of the admin scope only) those it views the console as:
        a comma-separated list, or `*` for everything."""
        own = caller_scopes(request)
        view_as = request.query_params.get("as")
        if view_as is None:
            return own
        if not self._is_admin(own):
            raise Refused(403, "viewing as other scopes needs the console's admin scope")
        return None if view_as == "*" else frozenset(s for s in view_as.split(",") if s)

    def _is_admin(self, scopes: Scopes) -> bool:
        return self.admin_scope is not None and scopes is not None and self.admin_scope in scopes

    @property
    def service(self) -> ResourceService:
        return self.live.service

    def _limit(self, request: Request, default: int | None = None, most: int = MAX_PAGE) -> int:
        """`?limit=`, within 1..`most` (default: the manifest's page size); 400 when it is not a number."""
        try:
            return max(1, min(most, int(request.query_params.get("limit") or default or self.service.page_size)))
        except ValueError:
            raise Refused(400, "limit is a number") from None

    # --- the shell ---------------------------------------------------------------------------------------------

    async def shell(self, request: Request) -> Response:
        return Response(self._static["index.html"], media_type="text/html; charset=utf-8",
                        headers={**HEADERS, "Cache-Control": "no-cache"})

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in self._static or name == "index.html":
            return _error(404, "not found")
        kind = {"js": "text/javascript", "css": "text/css", "svg": "image/svg+xml"}[name.rsplit(".", 1)[1]]
        return Response(self._static[name], media_type=f"{kind}; charset=utf-8",
                        headers={**HEADERS, "Cache-Control": "no-cache"})

    # --- the catalog ---------------------------------------------------------------------------------------

    async def whoami(self, request: Request, scopes: Scopes) -> Response:
        snapshot = self.service.snapshot
        own = caller_scopes(request)
        entries, _ = snapshot.catalog.visible(scopes)
        settings = snapshot.manifest.server
        body: dict[str, Any] = {
            "server": {"name": settings.name, "title": settings.title, "version": settings.version},
            "resources": len(entries),
            "caller": caller_name(request), "scopes": sorted(own or ()), "auth": settings.auth is not None,
            "admin": self._is_admin(own), "viewingAs": request.query_params.get("as"),
            "search": self.discovery is not None, "seesAll": sees_all(snapshot, scopes),
            "failingSources": [row["id"] for row in self._source_rows(snapshot, scopes) if row["failing"]]}
        if body["admin"]:
            body["knownScopes"] = sorted(catalog_scopes(snapshot))
        body.update(self._deployment(snapshot, scopes))
        return JSONResponse(body)

    def _deployment(self, snapshot: Snapshot, scopes: Scopes) -> dict[str, Any]:
        """This replica's id and cluster state (with `server.cluster`), and for a caller who sees everything the
        catalog generation and the manifest's sha256 (views.catalog_facts): what tells replicas apart and says
        whether they serve the same manifest."""
        out = catalog_facts(snapshot, scopes)
        cluster = self.live.cluster_health()
        if cluster is not None:
            out["cluster"] = {"replica": cluster["replica"], "connected": cluster["connected"]}
        return out

    async def tree(self, request: Request, scopes: Scopes) -> Response:
        entries, uris = self.service.catalog.visible(scopes)
        page = tree_page(entries, uris, request.query_params.get("prefix", ""), request.query_params.get("cursor"),
                         self._limit(request))
        return JSONResponse(tree_view(page))

    async def list(self, request: Request, scopes: Scopes) -> Response:
        """A flat page narrowed by prefix, mimeType (`text/*`) and a name glob (as the list_resources tool)."""
        query = request.query_params
        if self.discovery is None:
            page: Page[Any] = self.service.list_page(query.get("cursor"), scopes).page
        else:
            page = self.discovery.list_page(query.get("cursor"), scopes, prefix=query.get("prefix", ""),
                                            mime_type=query.get("mimeType") or None, name=query.get("name") or None,
                                            limit=self._limit(request))
        return JSONResponse({"children": [entry_view(e) for e in page.items], "nextCursor": page.next_cursor})

    async def search(self, request: Request, scopes: Scopes) -> Response:
        """A page of the best SEARCH_WINDOW hits, narrowed by mimeType and name as /list is; `total` counts them
        (`more`: past the window, so at least that many); the cursor is the offset of the next page."""
        if self.discovery is None:
            raise Refused(404, "search is not available")
        query = request.query_params
        try:
            offset = max(0, int(query.get("cursor") or 0))
        except ValueError:
            raise Refused(400, "cursor is a number") from None
        size = self._limit(request, default=DEFAULT_LIMIT * 2, most=MAX_LIMIT)
        keep = entry_filter(query.get("mimeType") or None, query.get("name") or None)
        hits = await self.discovery.search(query.get("q", ""), scopes, prefix=query.get("prefix", ""),
                                           limit=SEARCH_WINDOW)
        matched = [hit for hit in hits if keep is None or keep(hit.entry)]
        results = []
        for hit in matched[offset : offset + size]:
            view = entry_view(hit.entry)
            if hit.snippet:
                view["snippet"] = hit.snippet
            results.append(view)
        return JSONResponse({"children": results, "total": len(matched), "more": len(hits) >= SEARCH_WINDOW,
                             "nextCursor": str(offset + size) if offset + size < len(matched) else None})

    async def templates(self, request: Request, scopes: Scopes) -> Response:
        snapshot = self.service.snapshot
        page = snapshot.catalog.template_page(request.query_params.get("cursor"), self._limit(request), scopes)
        return JSONResponse({"templates": [template_view(t) for t in page.items], "nextCursor": page.next_cursor})

    async def complete(self, request: Request, scopes: Scopes) -> Response:
        """Values for one variable of a template the caller may see, from the data (`c.<name>`: chosen values)."""
        query = request.query_params
        context = {key[2:]: value for key, value in query.items() if key.startswith("c.")}
        async with self.service.lease() as snapshot:
            template = snapshot.template_for(query.get("template", ""), scopes)
            if template is None:
                raise ResourceNotFound(query.get("template", ""))
            source = snapshot.sources.get(template.spec.source) if template.spec.source else None
            found = await self.completer.complete(template, source, query.get("name", ""), query.get("prefix", ""),
                                                  context)
        return JSONResponse({"values": found.values, "total": found.total, "hasMore": found.has_more})

    async def expand(self, request: Request, scopes: Scopes) -> Response:
        """The URI a template the caller may see expands to with `v.<name>` values (then read it with /read)."""
        query = request.query_params
        template = self.service.template_for(query.get("template", ""), scopes)
        if template is None:
            raise ResourceNotFound(query.get("template", ""))
        parsed = template.template
        values: dict[str, Any] = {}
        for key, value in query.items():
            name = key[2:]
            if key.startswith("v.") and name in parsed.variables and value:
                multi = name in parsed.multi_segment and name not in parsed.reserved
                values[name] = value.split("/") if multi else value
        return JSONResponse({"uri": parsed.expand(values)})

    async def read(self, request: Request, scopes: Scopes) -> Response:
        """What resources/read returns for `uri`, shaped for a preview: text (cut at PREVIEW_CHARS), or an image or
        other blob by size and type (its bytes at /raw); with `detail=1` also the pane's detail (console.detail)."""
        uri = request.query_params.get("uri", "")
        detail = request.query_params.get("detail") == "1"
        if detail:  # what the cache held before this read fills it (the scopes are checked first, as a read does)
            snapshot = self.service.snapshot
            before = cache_look(self.service.cache, snapshot, snapshot.allowed(uri, scopes))
        served = await self.service.read(uri, scopes)
        if request.query_params.get("stream"):  # the page's event stream: tell it when this preview changes
            self.events.preview(request.query_params["stream"], _principal(request), uri)
        content = served.content
        body: dict[str, Any] = {"uri": uri, "mimeType": content.mime_type, "ttl": served.ttl}
        if content.text is not None:
            body.update(kind="text", size=len(content.text.encode("utf-8", "surrogatepass")),
                        text=content.text[:PREVIEW_CHARS], truncated=len(content.text) > PREVIEW_CHARS,
                        language=_language(content.mime_type, uri))
        else:
            blob = content.blob or b""
            body.update(kind="image" if _inline_image(content.mime_type) else "binary", size=len(blob))
        if detail:
            after = cache_look(self.service.cache, snapshot, snapshot.allowed(uri, scopes))
            body["detail"] = detail_view(snapshot, uri, served, before, after, RAW_CHARS)
        return JSONResponse(body)

    async def raw(self, request: Request, scopes: Scopes) -> Response:
        """The bytes of `uri`: raster images inline, anything else as a download, in a sandbox either way (a
        served HTML or SVG file never runs in the console's origin)."""
        uri = request.query_params.get("uri", "")
        content = (await self.service.read(uri, scopes)).content
        data = content.text.encode("utf-8", "surrogatepass") if content.text is not None else content.blob or b""
        kind = _base_type(content.mime_type)
        inline = kind in INLINE_IMAGES
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", uri.rstrip("/").rsplit("/", 1)[-1])[-100:] or "resource"
        if "." not in name:
            name += mimetypes.guess_extension(kind) or ".bin"
        elif mimetypes.guess_type(name)[0] not in (None, kind) and mimetypes.guess_extension(kind):
            name += mimetypes.guess_extension(kind) or ""  # a converted report.pdf downloads as report.pdf.md
        # Only a type from INLINE_IMAGES goes into the header: a resource's own may hold anything (CR/LF included).
        return Response(data, media_type=kind if inline else "application/octet-stream", headers={
            "Content-Security-Policy": "default-src 'none'; sandbox",
            "Content-Disposition": f'{"inline" if inline else "attachment"}; filename="{name}"'})

    # --- operations ------------------------------------------------------------------------------------------

    def _source_rows(self, snapshot: Snapshot, scopes: Scopes) -> Rows:
        service, cache = self.service, self.service.cache
        return source_rows(snapshot, scopes, hits=cache.hits_by, misses=cache.misses_by, held=cache.bytes_by(),
                           errors=service.source_errors, last_errors=service.last_source_error,
                           successes=service.last_source_success, health=service.health(),
                           detail=sees_all(snapshot, scopes))

    async def sources(self, request: Request, scopes: Scopes) -> Response:
        service = self.service
        snapshot = service.snapshot
        everything = sees_all(snapshot, scopes)
        cache = service.cache
        rows = self._source_rows(snapshot, scopes)
        body: dict[str, Any] = {"sources": rows, "failing": [row["id"] for row in rows if row["failing"]],
                                **self._deployment(snapshot, scopes)}
        if everything:
            body["cache"] = {"hits": cache.hits, "misses": cache.misses, "bytes": cache.current_bytes,
                             "entries": len(cache)}
        return JSONResponse(body)

    async def reloads(self, request: Request, scopes: Scopes) -> Response:
        snapshot = self.service.snapshot
        everything = sees_all(snapshot, scopes)
        count = self._limit(request, default=10, most=50)
        # A scoped caller is not told of reloads about hidden things alone (nor, by the gap, when they happened).
        records = [r for r in self.live.history.last(KEPT_RELOADS) if everything or r.seen_by(scopes)][:count]
        body: dict[str, Any] = {"reloads": [reload_view(r, scopes, everything, str(snapshot.manifest.path))
                                            for r in records]}
        if everything:
            body["generation"] = snapshot.catalog.generation
        return JSONResponse(body)

    async def stream(self, request: Request, scopes: Scopes) -> Response:
        service = self.service
        # Each asked as an event is sent, of the catalog and manifest served then: a reload may hide a source from
        # this caller, or show it one, while the stream is open.
        seen = [service.catalog]  # what the caller was last told of (held until the next list change)

        def generation() -> int | None:  # a caller may stop seeing everything
            snapshot = service.snapshot
            return snapshot.catalog.generation if sees_all(snapshot, scopes) else None

        def changed(told: ListingChange, swapped: ListingChange) -> bool:
            old, seen[0] = seen[0], service.catalog
            return view_changed(old, seen[0], scopes, told, swapped)

        def told(record: ReloadRecord) -> bool:
            return sees_all(service.snapshot, scopes) or record.seen_by(scopes)

        try:
            body = self.events.stream(lambda uri: visible_uri(service.snapshot, uri, scopes), generation,
                                      caller=_principal(request), admin=self._is_admin(caller_scopes(request)),
                                      changed=changed, until=caller_expiry(request), told=told)
            first = await body.__anext__()  # raises TooManyStreams before any byte is sent
        except TooManyStreams as exc:
            raise Refused(503, str(exc)) from None

        async def frames() -> Any:
            yield first
            async for frame in body:
                yield frame

        return EventStreamResponse(frames(), media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})


def _principal(request: Request) -> str:
    """Who holds an event stream, for the per-caller cap: the token's subject or client; an anonymous caller by
    its address (without server.auth every caller is anonymous)."""
    name = caller_name(request)
    if name != "anonymous":
        return "token:" + name
    return "anonymous:" + (request.client.host if request.client else "")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _base_type(mime_type: str) -> str:
    """`type/subtype` of a media type, lower-cased, without parameters."""
    return mime_type.split(";")[0].strip().lower()


def _inline_image(mime_type: str) -> bool:
    return _base_type(mime_type) in INLINE_IMAGES


def _language(mime_type: str, uri: str) -> str | None:
    """Which highlighter the page uses: markdown, json or csv (by type, then by the URI's extension)."""
    kind = _base_type(mime_type)
    if kind in ("text/markdown", "text/x-markdown") or uri.lower().endswith((".md", ".markdown")):
        return "markdown"
    if kind == "application/json" or kind.endswith("+json") or uri.lower().endswith(".json"):
        return "json"
    if kind in ("text/csv", "text/tab-separated-values") or uri.lower().endswith((".csv", ".tsv")):
        return "csv"
    return None
