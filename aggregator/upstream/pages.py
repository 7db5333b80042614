"""One page of an upstream's listing made into the records kept (`Page`).

Over stdio a `resources/list` page comes off the lane as the wire's dict (`lane.Lane.list_resources`) and
`resource_page` checks it entry by entry as the SDK's client would (its wire model of the negotiated version, then
its result model), making each entry its `ListedResource` without a model and dropping the entry's dict once it is
recorded. Through the SDK a 1,000,000-entry page (60 MB of JSON) held the parsed dicts, a wire model an entry and
their dump, then a result model an entry at once: about 1.3 GB of RSS at the peak for 230 MB kept. Here it holds
the dicts, and the records as the dicts go.

What the dict check takes is only the plain shape (each value of the type its field declares, none the models
would coerce); anything else (a size of `"5"`, a name that is a number, a priority past 1) goes to the SDK's own
checks of the page (`client_result`), with the entries already recorded standing in as valid ones, so the listing
gives the records, or raises the ValidationError, the SDK's client would. Those checks are the client's own steps
(`ClientSession.send_request` in mcp 2.3, two of its private helpers taken here): tests/test_upstream_pages.py
compares them with what the official client gives and raises.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio.to_thread
import mcp_types as types
from mcp import Client
from mcp.client.session import _clamp_inbound_ttl, _later_revision_fields
from mcp_types import methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

from aggregator.upstream.answers import (CACHE_SCOPES, MAX_SIZE, ListedResource, hints, listed, plain_meta,
                                         timestamp)

__all__ = ["OFF_LOOP_ENTRIES", "Page", "client_result", "model_page", "off_loop_if_big", "parsed_page",
           "resource_page"]

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
_LIST = "resources/list"
_RECORDED = {"uri": "", "name": ""}
"""What the SDK's checks see in place of an entry already recorded (a valid one: it adds no error)."""
_ROLES = ("user", "assistant")
_THEMES = ("light", "dark")
OFF_LOOP_ENTRIES = 5_000
"""Entries of a page (or listing) past which it is made into records in a worker thread: at a million entries that
takes seconds, which the event loop would stop for."""


@dataclass(frozen=True, slots=True)
class Page:
    """One page: its records (at most the room the listing had left), how many entries it had, its caching hints
    (modern wire only) and its cursor."""

    items: list[Any]
    parsed: int
    ttl_ms: int | None
    cache_scope: str | None
    next_cursor: str | None


def model_page(client: Client, result: Any, entries: list[Any], room: int,
               record: Callable[[Any], T] = lambda entry: entry) -> Page:
    """The page of a result the SDK's client gave (`entries` its list), each of the first `room` entries `record`ed."""
    return Page([record(entry) for entry in entries[:room]], len(entries), *hints(client, result), result.next_cursor)


def resource_page(result: dict[str, Any], version: str, room: int) -> Page:
    """The page of a `resources/list` result as the wire gave it (see the module docstring): its entries' dicts are
    gone once it returns; ValidationError where the SDK's client raises it."""
    given = _plain_hints(result, version in MODERN_PROTOCOL_VERSIONS)
    if given is None:
        return _checked(result, version, room, 0, [])
    resources: list[Any] = result["resources"]
    found: list[ListedResource] = []
    for index in range(len(resources)):
        item = _record(resources[index])
        if item is None:
            return _checked(result, version, room, index, found)
        resources[index] = None  # the dict goes now, the record keeps its strings
        if len(found) < room:
            found.append(item)
    return Page(found, len(resources), *given, result.get("nextCursor"))


async def parsed_page(result: dict[str, Any], version: str, room: int) -> Page:
    """`resource_page`, in a worker thread for a big page (the loop serves meanwhile; `result` is the caller's)."""
    resources = result.get("resources")
    return await off_loop_if_big(len(resources) if isinstance(resources, list) else 0, resource_page, result,
                                 version, room)


async def off_loop_if_big(entries: int, func: Callable[..., T], *args: Any) -> T:
    """`func(*args)` for work over `entries` entries: here below OFF_LOOP_ENTRIES (a thread hop is not worth it),
    else in a worker thread, so that the event loop serves meanwhile (abandoned, left to finish, if the caller is
    cancelled)."""
    if entries < OFF_LOOP_ENTRIES:
        return func(*args)
    return await anyio.to_thread.run_sync(func, *args, abandon_on_cancel=True)


def _checked(result: dict[str, Any], version: str, room: int, done: int, found: list[ListedResource]) -> Page:
    """The page as the SDK's checks make it, the first `done` entries recorded already (`found`, cut at `room`)."""
    resources = result.get("resources")
    if done:
        result = {**result, "resources": [_RECORDED] * done + resources[done:]}  # type: ignore[index]
    checked = client_result(_LIST, version, result, types.ListResourcesResult)
    modern = version in MODERN_PROTOCOL_VERSIONS
    sent = checked.model_fields_set
    found.extend(listed(resource) for resource in checked.resources[len(found):room])
    return Page(found, len(checked.resources), checked.ttl_ms if modern and "ttl_ms" in sent else None,
                checked.cache_scope if modern and "cache_scope" in sent else None, checked.next_cursor)


def client_result(method: str, version: str, raw: dict[str, Any], model: type[M]) -> M:
    """`raw` (a result of `method` on the wire of `version`) as the SDK's client makes it into `model`: a negative
    ttlMs floored, the result checked against that version's wire model, a later revision's fields dropped, then
    the model; pydantic's ValidationError where the client raises it. `raw` itself is not changed."""
    raw = dict(raw)
    _clamp_inbound_ttl(raw)
    try:
        methods.validate_server_result(method, version, raw)
    except KeyError:  # a method or version the SDK has no wire model of: it checks the result model alone
        pass
    if not (foreign := _later_revision_fields(method, version)).isdisjoint(raw):
        raw = {key: value for key, value in raw.items() if key not in foreign}
    return model.model_validate(raw, by_name=False)


def _plain_hints(result: dict[str, Any], modern: bool) -> tuple[int | None, str | None] | None:
    """The page's caching hints when its own fields (all but the entries) are of the plain shape; None otherwise."""
    cursor, meta = result.get("nextCursor"), result.get("_meta")
    if (type(result.get("resources")) is not list or (cursor is not None and type(cursor) is not str)
            or (meta is not None and type(meta) is not dict)):
        return None
    if not modern:  # the 2025-11-25 wire has no hints: the SDK drops what a later revision declares
        return None, None
    ttl_ms, scope = result.get("ttlMs"), result.get("cacheScope")
    if type(ttl_ms) is not int or scope not in CACHE_SCOPES or type(result.get("resultType")) is not str:
        return None
    return max(ttl_ms, 0), scope  # the SDK floors a negative ttlMs at 0


def _record(entry: Any) -> ListedResource | None:
    """The record of one entry of the plain shape (what `listed` makes of its model); None for any other."""
    if type(entry) is not dict:
        return None
    uri, name = entry.get("uri"), entry.get("name")
    if type(uri) is not str or type(name) is not str:
        return None
    if len(entry) == 2:  # the usual entry: nothing else to check
        return ListedResource(uri, name)
    title, description, mime_type, size = (entry.get("title"), entry.get("description"), entry.get("mimeType"),
                                           entry.get("size"))
    if ((title is not None and type(title) is not str) or (description is not None and type(description) is not str)
            or (mime_type is not None and type(mime_type) is not str) or (size is not None and type(size) is not int)
            or not plain_meta(entry) or not _plain_icons(entry.get("icons"))):
        return None
    annotations, mtime = entry.get("annotations"), None
    if annotations is not None:
        if type(annotations) is not dict or not _plain_annotations(annotations):
            return None
        mtime = timestamp(annotations.get("lastModified"))
    return ListedResource(uri, name, title, description, mime_type,
                          size if size is not None and 0 <= size < MAX_SIZE else None, mtime)


def _plain_annotations(annotations: dict[str, Any]) -> bool:
    audience, priority, modified = (annotations.get("audience"), annotations.get("priority"),
                                    annotations.get("lastModified"))
    return ((audience is None or (type(audience) is list and all(type(a) is str and a in _ROLES for a in audience)))
            and (priority is None or (type(priority) in (int, float) and 0 <= priority <= 1))
            and (modified is None or type(modified) is str))


def _plain_icons(icons: Any) -> bool:
    if icons is None:
        return True
    if type(icons) is not list:
        return False
    for icon in icons:
        if type(icon) is not dict:
            return False
        src, mime_type, sizes, theme = icon.get("src"), icon.get("mimeType"), icon.get("sizes"), icon.get("theme")
        if (type(src) is not str or (mime_type is not None and type(mime_type) is not str)
                or (sizes is not None and (type(sizes) is not list or any(type(s) is not str for s in sizes)))
                or (theme is not None and (type(theme) is not str or theme not in _THEMES))):
            return False
    return True
