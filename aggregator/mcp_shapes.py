"""MCP results as they go on the wire: resources, templates, contents and search hits as plain dicts.

Handlers return wire-shaped dicts: the SDK validates and sieves every result against the negotiated protocol
version anyway, so building pydantic models first would only do that work twice.
"""

from __future__ import annotations

import base64
from functools import lru_cache
from typing import Any

from aggregator.catalog import FILE_MTIME, Entry, TemplateEntry
from aggregator.content import Content
from aggregator.manifest.model import Annotations, Display, Icon
from aggregator.search import Hit
from aggregator.search_query import SEARCH_TEMPLATE

__all__ = ["COMPLETE", "SEARCH_TEMPLATE_DICT", "ReadResult", "cache_scope", "contents_dict", "read_result",
           "resource_dict", "search_result", "template_dict", "ttl_ms"]

COMPLETE = {"resultType": "complete"}
"""The modern wire requires `resultType`; the legacy wire's result schema drops it."""


def cache_scope(private: bool) -> str:
    return "private" if private else "public"


def ttl_ms(seconds: float) -> int:
    return max(0, int(seconds * 1000))


@lru_cache(maxsize=1024)
def _icons(icons: tuple[Icon, ...] | None) -> list[dict[str, Any]] | None:
    if not icons:
        return None
    return [_compact({"src": i.src, "mimeType": i.mime_type, "sizes": list(i.sizes) if i.sizes else None,
                      "theme": i.theme}) for i in icons]


@lru_cache(maxsize=1024)
def _static_annotations(a: Annotations | None) -> dict[str, Any]:
    if a is None:
        return {}
    # `lastModified: file` is filled per entry (`Entry.listed_last_modified`).
    # `priority` as a float, as the SDK's sieve dumps it (YAML's `1` is an int), so fast paths encode the same.
    return _compact({"audience": list(a.audience) if a.audience else None,
                     "priority": None if a.priority is None else float(a.priority),
                     "lastModified": None if a.last_modified == FILE_MTIME else a.last_modified})


def _annotations(a: Annotations | None, last_modified: str | None = None) -> dict[str, Any] | None:
    fields = _static_annotations(a)
    if last_modified is not None and "lastModified" not in fields:
        return {**fields, "lastModified": last_modified}
    return dict(fields) if fields else None


def _compact(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def resource_dict(entry: Entry) -> dict[str, Any]:
    """An MCP `Resource` as it goes on the wire. Called for every listed entry of a page: kept lean."""
    d: Display = entry.display
    out: dict[str, Any] = {"uri": entry.uri, "name": entry.name}
    if entry.title is not None:
        out["title"] = entry.title
    if d.description is not None:
        out["description"] = d.description
    if entry.mime_type is not None:
        out["mimeType"] = entry.mime_type
    if entry.size is not None:
        out["size"] = entry.size
    if d.icons:
        out["icons"] = _icons(d.icons)
    if d.annotations is not None:
        annotations = _annotations(d.annotations, entry.listed_last_modified)
        if annotations:
            out["annotations"] = annotations
    return out


def template_dict(entry: TemplateEntry) -> dict[str, Any]:
    """An MCP `ResourceTemplate` as it goes on the wire."""
    d = entry.spec.display
    return _compact({"uriTemplate": entry.uri_template, "name": entry.spec.name, "title": d.title,
                     "description": d.description, "mimeType": d.mime_type, "icons": _icons(d.icons),
                     "annotations": _annotations(d.annotations)})


SEARCH_TEMPLATE_DICT = {
    "uriTemplate": SEARCH_TEMPLATE, "name": "search", "title": "Search resources", "mimeType": "application/json",
    "description": "Resources whose URI, name, title, description or (indexed) text hold every word of q, best "
                   "first, as JSON with snippets; prefix narrows to URIs starting with it, limit caps the results "
                   "(default 20, at most 100). E.g. search://?q=install%20docker&limit=5",
}


def hit_dict(hit: Hit) -> dict[str, Any]:
    """A search result: the resource as resources/list shows it, and a snippet when its text matched."""
    out = resource_dict(hit.entry)
    if hit.snippet:
        out["snippet"] = hit.snippet
    return out


def search_result(query: str, hits: list[Hit]) -> dict[str, Any]:
    return {"query": query, "results": [hit_dict(h) for h in hits]}


class ReadResult(dict[str, Any]):
    """A `resources/read` result as `read_result` builds it: every value of the type the wire wants, keys in the
    order the SDK's result sieve dumps them (`cacheScope`, `contents`, `resultType`, `ttlMs`; an item's `blob` or
    `text` beside `mimeType` and `uri`), so the fast paths put it on the wire without checking it again
    (`wire_results.shaped`)."""

    __slots__ = ()


def read_result(uri: str, content: Content, ttl: float, private: bool) -> ReadResult:
    """A read's result: its content under `uri`, with how long a client may keep it (seconds) and its scope."""
    if content.text is not None:
        item = {"mimeType": content.mime_type, "text": content.text, "uri": uri}
    else:
        item = {"blob": base64.b64encode(content.blob or b"").decode("ascii"), "mimeType": content.mime_type,
                "uri": uri}
    return ReadResult(cacheScope="private" if private else "public", contents=[item], resultType="complete",
                      ttlMs=max(0, int(ttl * 1000)))


def contents_dict(uri: str, content: Content) -> dict[str, Any]:
    """MCP `TextResourceContents` or `BlobResourceContents` as they go on the wire."""
    if content.text is not None:
        return {"uri": uri, "mimeType": content.mime_type, "text": content.text}
    return {"uri": uri, "mimeType": content.mime_type, "blob": base64.b64encode(content.blob or b"").decode("ascii")}
