"""What an upstream's listings and reads become: `Listing` and `UpstreamRead`, with the caching hints the upstream
gave (modern wire only), a read's contents decoded and bounded."""

from __future__ import annotations

import base64
import binascii
import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import mcp_types as types
from mcp import Client
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from aggregator.sources.base import SourceError, SourceNotFound, SourceTooLarge, TextBytes

__all__ = ["CACHE_SCOPES", "Content", "ListedResource", "Listing", "Make", "UpstreamContent", "UpstreamRead", "hints",
           "listed", "plain_meta", "read_answer", "read_result", "timestamp", "upstream_read"]

MAX_SIZE = 2**63
"""Sizes from here on are no size (an array of signed 64-bit integers keeps them)."""


@dataclass(frozen=True, slots=True)
class ListedResource:
    """One resource of an upstream's listing: what the catalog shows of it. A page's SDK models become these as the
    page arrives, so a listing costs memory in proportion to what it keeps, not to the messages; a source keeps
    them as columns (`upstream.records`)."""

    uri: str
    name: str
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None
    size: int | None = None
    """Bytes, when the upstream gave a size that is one (a whole number, not negative, below 2**63: what a catalog
    row's size column holds)."""
    mtime: float | None = None
    """`annotations.lastModified` as a timestamp, when it parses."""


def listed(resource: types.Resource) -> ListedResource:
    """The record kept of one listed resource."""
    size = resource.size
    annotations = resource.annotations
    return ListedResource(str(resource.uri), resource.name, resource.title, resource.description,
                          resource.mime_type, size if isinstance(size, int) and 0 <= size < MAX_SIZE else None,
                          timestamp(annotations.last_modified if annotations is not None else None))


def timestamp(value: object) -> float | None:
    """`annotations.lastModified` as a timestamp, None when it is not an ISO 8601 time."""
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    if isinstance(value, str):
        try:
            return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


@dataclass(frozen=True, slots=True)
class Listing:
    """Every entry of a paginated listing, with the caching hints of its pages (modern wire only)."""

    items: Sequence[Any]
    ttl_ms: int | None = None
    """The smallest ttlMs any page gave."""
    cache_scope: str | None = None
    """`private` if any page said so, else `public` if one did."""
    truncated: bool = False
    """The listing went past the page or entry cap (or its cursors looped): `items` is a prefix."""
    cut: str | None = None
    """Where and why it was cut short (for the log), when `truncated`."""


@dataclass(slots=True)
class UpstreamContent(TextBytes):
    uri: str
    mime_type: str | None
    raw: bytes | None
    """The bytes; None when they are the UTF-8 of `text`, not encoded until `data` is asked for (`Blob.raw`)."""
    is_text: bool
    text: str | None = None
    """The text sent, when `data` is its UTF-8 (None: a blob, or text holding a lone surrogate, which only
    `surrogatepass` encodes and no decoding gives back)."""

    def __eq__(self, other: object) -> bool:
        """Equal contents: the same bytes whether encoded yet or not."""
        if type(other) is not UpstreamContent:
            return NotImplemented
        return (self.uri, self.mime_type, self.is_text, self.text, self.data) == (
            other.uri, other.mime_type, other.is_text, other.text, other.data)


@dataclass(slots=True)
class UpstreamRead:
    """A read's contents (the one for the URI asked first), with the upstream's caching hints when it gave them."""

    contents: list[UpstreamContent]
    ttl_ms: int | None = None
    cache_scope: str | None = None

    @property
    def first(self) -> UpstreamContent:
        return self.contents[0]


def hints(client: Client, result: Any) -> tuple[int | None, str | None]:
    """The ttlMs and cacheScope the upstream sent, or None: the SDK fills in 0 and private when it sent none (always on
    the 2025-11-25 wire, where they are no hints at all), and those defaults are not the upstream's word."""
    if client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return None, None
    sent = result.model_fields_set
    return (result.ttl_ms if "ttl_ms" in sent else None, result.cache_scope if "cache_scope" in sent else None)


Content = tuple[str, str | None, bytes | None, bool, str | None]
"""One content of a read as `_read` checks it: what an `UpstreamContent` holds (uri, mimeType, raw, is_text, text)."""
Made = TypeVar("Made")


Make = Callable[[list[Content], int | None, str | None], Made]
"""What makes a read of its checked contents (the one asked first), ttlMs and cacheScope."""


def upstream_read(contents: list[Content], ttl_ms: int | None, cache_scope: str | None) -> UpstreamRead:
    """The `UpstreamRead` of checked contents (`read_result`'s `make`)."""
    return UpstreamRead([UpstreamContent(*content) for content in contents], ttl_ms, cache_scope)


def read_result(label: str, uri: str, result: types.ReadResourceResult, max_bytes: int, ttl_ms: int | None = None,
                cache_scope: str | None = None, make: Make[Made] = upstream_read) -> Made:  # type: ignore[assignment]
    """A read's contents as bytes, the one for `uri` first; SourceNotFound if none, SourceTooLarge past `max_bytes`.
    What it gives is `make(contents, ttl_ms, cache_scope)`: an `UpstreamRead`, or what a caller makes of them."""
    return _read(label, uri, [(str(item.uri), item.mime_type, getattr(item, "text", None), getattr(item, "blob", ""))
                              for item in result.contents], max_bytes, ttl_ms, cache_scope, make)


def read_answer(label: str, uri: str, result: dict[str, Any], max_bytes: int, modern: bool,
                make: Make[Made] = upstream_read) -> Made | None:  # type: ignore[assignment]
    """`read_result` of a read's `result` as the wire gave it (a parsed dict), without the SDK's models, for the shape
    upstreams answer: text or blob contents of plain values, valid hints (`modern`: the wire that has them). None for
    any other shape: the model decides those (it rejects or coerces them), so what this takes it would take alike."""
    contents, meta = result.get("contents"), result.get("_meta")
    if (type(result) is not dict or type(contents) is not list
            or (meta is not None and type(meta) is not dict)):  # `plain_meta`, written out
        return None  # a `LooseResult` too: it may hold text no UTF-8 encodes
    ttl_ms, cache_scope = result.get("ttlMs"), result.get("cacheScope")
    if ("ttlMs" in result and (type(ttl_ms) is not int or ttl_ms < 0)) or (
            "cacheScope" in result and cache_scope not in CACHE_SCOPES):
        return None
    items: list[tuple[str, str | None, str | None, str]] = []
    for item in contents:
        if type(item) is not dict:
            return None
        item_uri, mime_type, text, blob = item.get("uri"), item.get("mimeType"), item.get("text"), item.get("blob")
        if (type(item_uri) is not str or (mime_type is not None and type(mime_type) is not str)
                or (text is None) == (blob is None) or type(text if blob is None else blob) is not str
                or ((meta := item.get("_meta")) is not None and type(meta) is not dict)):
            return None
        items.append((item_uri, mime_type, text, blob or ""))
    if not modern:
        return _read(label, uri, items, max_bytes, None, None, make, strict=True)
    return _read(label, uri, items, max_bytes, ttl_ms, cache_scope, make, strict=True)


CACHE_SCOPES = ("public", "private")
"""The `cacheScope` values a result may carry (2026-07-28)."""


def plain_meta(value: dict[str, Any]) -> bool:
    """Whether `value` has no `_meta` or an object there, as the SDK's models take it."""
    meta = value.get("_meta")
    return meta is None or type(meta) is dict


def _read(label: str, uri: str, items: list[tuple[str, str | None, str | None, str]], max_bytes: int,
          ttl_ms: int | None, cache_scope: str | None, make: Make[Made], strict: bool = False) -> Made:
    """The read of `items` (uri, MIME type, text or None, base64 blob), checked and bounded as `read_result` says,
    made by `make`. `strict`: parsed by orjson, whose strings hold no lone surrogate (every text has a UTF-8)."""
    if not items:
        raise SourceNotFound(f"{label}: resources/read {uri}: no contents")
    contents: list[Content] = []
    data: bytes | None
    for item_uri, mime_type, text, blob in items:
        if text is not None:
            if len(text) > max_bytes:  # a character is at least one byte
                raise SourceTooLarge(len(text), max_bytes)
            if strict and (text.isascii() or len(text) * 4 <= max_bytes):
                # Within bounds at any encoding (at most 4 bytes a character): encoded only if its bytes are asked
                # for, as served text needs none (a 12 KB text's UTF-8 cost a relayed read a fifth of its time).
                data, kept = None, text
            else:
                try:
                    data, kept = text.encode("utf-8"), text
                except UnicodeEncodeError:  # a lone surrogate: kept in the bytes, which decoding them refuses
                    data, kept = text.encode("utf-8", "surrogatepass"), None
            is_text = True
        else:
            if len(blob) // 4 * 3 > max_bytes + 3:
                raise SourceTooLarge(len(blob) // 4 * 3, max_bytes)
            try:
                data, is_text, kept = base64.b64decode(blob, validate=True), False, None
            except (binascii.Error, ValueError):
                raise SourceError(f"{label}: resources/read {uri}: a blob that is not base64") from None
        if data is not None and len(data) > max_bytes:
            raise SourceTooLarge(len(data), max_bytes)
        contents.append((item_uri, mime_type, data, is_text, kept))
    # The content for the URI asked comes first; a read may return sub-resources beside it.
    if len(contents) > 1:
        contents.sort(key=lambda c: c[0] != uri)
    return make(contents, ttl_ms, cache_scope)
