"""Handler results as the SDK's runner puts them on the wire, encoded as one JSON-RPC response line: for the fast
paths that answer without the SDK's per-message machinery (stdio's `stdio_fast`; an HTTP one may reuse them).

`shaped` is the runner's `_serialize` for a core result: cache hints, the per-version sieve, `resultType` and the
`serverInfo` stamp. A listing page (`page_line`) sieves only its envelope through the SDK and encodes its items
with the standard encoder, keys sorted as the sieve's dump sorts them: the sieve validating and re-dumping each of
500 items was most of a page's cost, and the items are `mcp_shapes`' dicts built from a validated manifest, whose
every field the surface model keeps as it is (tests/test_stdio_fast.py compares every kind of item with the SDK's
answer on both wires).
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types import methods as sdk_methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from aggregator.codec import dumps, dumps_line
from aggregator.mcp_shapes import ReadResult

__all__ = ["LIST_ITEMS", "SERVER_INFO_META_KEY", "Envelopes", "ItemsText", "encode_response", "page_line", "shaped"]

logger = logging.getLogger("aggregator.stdio")

SERVER_INFO_META_KEY = "io.modelcontextprotocol/serverInfo"
LIST_ITEMS = {"resources/list": "resources", "resources/templates/list": "resourceTemplates"}
"""The listing methods and the key of their items."""

_SPLICE = "\x00items\x00"
_SPLICE_JSON = json.dumps(_SPLICE).encode("utf-8")


class ItemsText(str):
    """A listing's items already encoded as the JSON array `page_line` would write (keys sorted, UTF-8 as it is):
    what a handler answering the fast path gives instead of the items (`listing_json`), spliced in as it is."""

    __slots__ = ()


class Envelopes:
    """Which modern `_meta` envelopes the SDK's own request validator accepts on a method, each checked once (a
    client sends the same one every time; the classifier checks only the version, not the other keys' shapes).
    Per method, the last envelope found valid afresh is kept for `known`, which tells it again at the cost of a
    comparison."""

    KEPT = 256
    KEPT_CHARS = 16_384
    """The longest envelope (as its key) kept as valid: a request line may be megabytes, and KEPT of them were kept."""
    DEPTH = 32
    """The deepest envelope kept for `known` (a real one is 3 deep): bounds the comparison's recursion."""

    def __init__(self) -> None:
        self._valid: set[str] = set()
        self._last: dict[str, _Kept] = {}

    def known(self, method: str, meta: object) -> str | None:
        """The protocol version of `method`'s kept envelope when `meta` is that envelope (what the SDK's classifier
        and validator accepted then, they accept now: both look at nothing else on stdio); None otherwise."""
        kept = self._last.get(method)
        if kept is None or meta != kept.meta:
            return None
        # `==` holds between 1, 1.0 and true: the kept envelope's numbers and booleans must be of the same type.
        for path, kind in kept.typed:
            node: Any = meta
            for key in path:
                node = node[key]
            if type(node) is not kind:
                return None
        return kept.version

    def valid(self, method: str, version: str, params: Mapping[str, Any]) -> bool:
        """Whether the `_meta` of `params` passes the SDK's validation of `method` at `version` (the method's own
        params are checked by the caller: the envelope's validity does not depend on them)."""
        meta = params["_meta"]
        if self.known(method, meta) == version:
            return True
        # Any key works that equal envelopes share and different ones do not: repr tells 1, 1.0 and True apart.
        key = f"{method}\0{version}\0{meta!r}"
        if key in self._valid:
            return True
        probe: dict[str, Any] = {"uri": ""} if method == "resources/read" else {}
        try:
            sdk_methods.validate_client_request(method, version, {**probe, "_meta": meta})
        except (ValidationError, KeyError):
            return False
        if len(key) > self.KEPT_CHARS:
            return True  # valid, and validated again next time
        if len(self._valid) >= self.KEPT:
            self._valid.clear()
        self._valid.add(key)
        self._keep(method, version, meta)
        return True

    def _keep(self, method: str, version: str, meta: Any) -> None:
        """Keep `meta` (a copy: the caller's may change) as `method`'s last valid envelope, unless it is too deep."""
        typed: list[tuple[tuple[str | int, ...], type]] = []
        stack: list[tuple[tuple[str | int, ...], Any]] = [((), meta)]
        while stack:
            path, node = stack.pop()
            kind = type(node)
            if kind is dict or kind is list:
                if len(path) >= self.DEPTH:
                    return
                items = node.items() if kind is dict else enumerate(node)
                stack.extend(((*path, key), value) for key, value in items)
            elif kind is bool or kind is int or kind is float:
                typed.append((path, kind))
        self._last[method] = _Kept(copy.deepcopy(meta), version, tuple(typed))


@dataclass(frozen=True, slots=True)
class _Kept:
    """An envelope found valid: its copy, the version it was served at, and where its numbers and booleans are."""

    meta: Any
    version: str
    typed: tuple[tuple[tuple[str | int, ...], type], ...]


def shaped(server: Any, method: str, version: str, result: Mapping[str, Any], stamp: Any = None) -> dict[str, Any]:
    """The handler's result as the SDK's runner puts it on the wire: cache hints under the handler's keys, the
    version's result sieve, and the `serverInfo` stamp on the modern wire (`stamp`: the server's, taken before)."""
    if type(result) is ReadResult:  # ours, of the sieve's shape: what the version keeps of it (hints are its own)
        if version == _MODERN:
            return {**result, "_meta": {SERVER_INFO_META_KEY: stamp or server.server_info_stamp}}
        if version == _LEGACY:
            return {"contents": result["contents"]}
    hint = server.cache_hints.get(method)
    dumped = {"ttlMs": hint.ttl_ms, "cacheScope": hint.scope, **result} if hint is not None else dict(result)
    try:
        sieved = read_sieved(version, dumped) if method == READ else None
        dumped = sieved if sieved is not None else sdk_methods.serialize_server_result(method, version, dumped)
    except Exception:
        logger.exception("handler for %r returned an invalid result", method)
        raise MCPError(code=types.INTERNAL_ERROR, message="Handler returned an invalid result") from None
    if version in MODERN_PROTOCOL_VERSIONS:
        if dumped.get("resultType") is None:
            dumped["resultType"] = "complete"
        meta = dumped.get("_meta")
        if meta is None or (isinstance(meta, dict) and meta.get(SERVER_INFO_META_KEY) is None):
            dumped["_meta"] = {**(meta or {}), SERVER_INFO_META_KEY: stamp or server.server_info_stamp}
    return dumped


READ = "resources/read"
_LEGACY, _MODERN = "2025-11-25", "2026-07-28"
"""The versions whose read sieve `read_sieved` (and `shaped` for a `ReadResult`) knows."""
_TEXT_ITEM, _BLOB_ITEM = frozenset({"uri", "mimeType", "text"}), frozenset({"uri", "mimeType", "blob"})
_READ_KEYS = frozenset({"contents", "ttlMs", "cacheScope", "resultType"})
"""The keys of the read result our handler builds: all of them on the 2026-07-28 wire; at most these on 2025-11-25,
whose sieve drops the hints."""


def read_sieved(version: str, result: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the SDK's result sieve gives for a `resources/read` result of the shape our handler builds (contents of
    plain strings: `uri`, `mimeType` and `text` or `blob`; on the 2026-07-28 wire valid hints and `resultType`),
    keys in its order, without its models; None for any other result or version (the sieve decides those).
    tests/test_wire_results.py holds it to the sieve."""
    contents = result.get("contents")
    if type(contents) is not list:
        return None
    keys = result.keys()
    if version == "2026-07-28":
        ttl, scope, kind = result.get("ttlMs"), result.get("cacheScope"), result.get("resultType")
        if (keys != _READ_KEYS or type(ttl) is not int or ttl < 0 or scope not in ("private", "public")
                or type(kind) is not str):
            return None
    elif version != "2025-11-25" or not keys <= _READ_KEYS:
        return None
    items = []
    for item in contents:
        if type(item) is not dict:
            return None
        shape = item.keys()
        if shape == _TEXT_ITEM:
            if type(item["uri"]) is not str or type(item["mimeType"]) is not str or type(item["text"]) is not str:
                return None
            items.append({"mimeType": item["mimeType"], "text": item["text"], "uri": item["uri"]})
        elif shape == _BLOB_ITEM:
            if type(item["uri"]) is not str or type(item["mimeType"]) is not str or type(item["blob"]) is not str:
                return None
            items.append({"blob": item["blob"], "mimeType": item["mimeType"], "uri": item["uri"]})
        else:
            return None
    if version == "2025-11-25":
        return {"contents": items}
    return {"cacheScope": scope, "contents": items, "resultType": kind, "ttlMs": ttl}


def encode_response(request_id: types.RequestId, result: dict[str, Any]) -> bytes:
    """One JSON-RPC response line, as compact as the SDK's (UTF-8, no spaces)."""
    return dumps_line({"jsonrpc": "2.0", "id": request_id, "result": result})


def page_line(server: Any, method: str, version: str, request_id: types.RequestId, result: Mapping[str, Any],
              stamp: Any = None) -> bytes:
    """The response line of a listing page (`method` one of LIST_ITEMS): what `encode_response(shaped(...))` gives,
    at the cost of one encode of the items. The items are spliced into the sieved envelope's line where a marker
    list stood. `stamp` as for `shaped`."""
    key = LIST_ITEMS[method]
    items = result[key]
    envelope = shaped(server, method, version, {**result, key: []}, stamp)
    envelope[key] = _SPLICE
    line = encode_response(request_id, envelope)
    head, marker, tail = line.partition(_SPLICE_JSON)
    if not marker or _SPLICE_JSON in tail:  # a string of the envelope holds the marker: never in practice
        envelope[key] = json.loads(items) if isinstance(items, ItemsText) else items
        return dumps_line({"jsonrpc": "2.0", "id": request_id, "result": envelope})
    return head + (items.encode("utf-8") if isinstance(items, ItemsText) else dumps(items, sort_keys=True)) + tail
