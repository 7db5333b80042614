"""A `FileTarget` read: the source's `read` (its `version` to revalidate an expired copy), gunzipped when the
manifest says `decompress`, typed from the manifest or upstream, through the caches; at most the source's
`maxBytes`, decompressed or not."""

from __future__ import annotations

import logging
import anyio

from aggregator.cache_keys import FileKey
from aggregator.catalog import FileTarget
from aggregator.content import Content, GzipError, GzipTooLarge, decode_body, gunzip
from aggregator.documents.pool import DocumentPool
from aggregator.errors import ResourceCorrupt, ResourceTooLarge
from aggregator.reads.backend import SourceCalls
from aggregator.reads.cached import Caches
from aggregator.reads.documents import convert_file
from aggregator.snapshot import Snapshot
from aggregator.sources import Blob

__all__ = ["declared_type", "file_key", "read_file", "typed", "unpacked"]

logger = logging.getLogger("aggregator")
_tuple_new = tuple.__new__


def file_key(target: FileTarget, epoch: int) -> FileKey:
    """What a read of `target` is cached under, its source opened in `epoch` (the read path and the console's
    detail pane both ask here, so they cannot disagree)."""
    # The tuple made in C: `FileKey(...)` runs the named tuple's Python `__new__`, and every read makes one.
    return _tuple_new(FileKey, (target.source, epoch, target.path, target.mime_type, target.decompress,
                                target.convert))


async def read_file(snapshot: Snapshot, target: FileTarget, caches: Caches, calls: SourceCalls,
                    documents: DocumentPool, background: bool = False) -> Content:
    """The content of the file `target` names, from `snapshot`'s source and limits (converted when it says so).
    `background`: the search indexer's read, whose conversion yields to clients' (and is the one they get from
    the cache: a client's read that waits for it moves it ahead of the indexer's queue)."""
    convert = target.convert
    key = file_key(target, snapshot.epochs[target.source])
    if convert is None and (hit := caches.cache.fresh(key)) is not None:
        return hit  # what `cached()` gives of a fresh copy, without making the loaders a miss needs
    source, limits, path = snapshot.sources[target.source], snapshot.limits[target.source], target.path
    # A document is read up to its conversion's input limit: the Markdown, not the file, is what is served.
    max_bytes = convert.max_input_bytes if convert is not None else limits.max_bytes

    async def load() -> tuple[Content, str | None]:
        blob = await calls.call("aggregator.source.read", snapshot, target, path,
                                lambda: source.read(path, max_bytes))
        data = unpacked(target, blob, max_bytes, source.url_paths)
        if convert is not None:
            data = blob.data if data is None else data
            return await convert_file(target, convert, data, documents, turn), blob.version
        return typed(target, blob, data), blob.version

    async def revalidate(version: str) -> bool:
        return await calls.call("aggregator.source.version", snapshot, target, path,
                                lambda: source.version(path)) == version

    async def cached() -> Content:
        return await caches.get_or_load(snapshot, key, load, lambda spec, cluster: cluster.file_item(
            spec, path, target.mime_type, target.decompress, max_bytes, limits.ttl, convert), revalidate)

    turn: anyio.Event | None = None
    if convert is None:
        return await cached()
    if not background:
        documents.wanted(key)
        return await cached()
    with documents.queued(key) as turn:
        return await cached()


def unpacked(target: FileTarget, blob: Blob, max_bytes: int, url_paths: bool) -> bytes | None:
    """The bytes a read of `target` serves (or converts): `blob`'s, decompressed when the entry says so; None when
    they are `blob`'s text's UTF-8, not encoded yet (`Blob.raw`)."""
    if not target.decompress:
        return blob.raw
    # An HTTP server may send a .gz with Content-Encoding: gzip, which the client already undid.
    if url_paths and not blob.data.startswith(b"\x1f\x8b"):
        return blob.data
    return _gunzip(target, blob.data, max_bytes)


def typed(target: FileTarget, blob: Blob, data: bytes | None) -> Content:
    """`data` (what `unpacked` gave of `blob`) as the content of `target`: text or bytes, of the declared type."""
    return decode_body(data, declared_type(target, blob), blob.max_age, blob.private,
                       blob.text if data is blob.raw else None)


def declared_type(target: FileTarget, blob: Blob) -> str | None:
    """The type `typed` serves `blob` as when it says one (None: a look at the bytes decides)."""
    # An upstream Content-Type beats a guess from the name, except for the bytes we decompressed.
    upstream = None if target.decompress else blob.mime_type
    return target.mime_type if target.mime_declared or not upstream else upstream


def _gunzip(target: FileTarget, data: bytes, max_bytes: int) -> bytes:
    """`data` decompressed, at most `max_bytes` of it; a bomb is too large and corrupt data a permanent error."""
    try:
        return gunzip(data, max_bytes)
    except GzipTooLarge:
        logger.warning("read %s: more than %d bytes once decompressed", target.uri, max_bytes)
        raise ResourceTooLarge(target.uri, max_bytes + 1, max_bytes) from None
    except GzipError as exc:
        logger.warning("read %s: cannot decompress: %s", target.uri, exc)
        raise ResourceCorrupt(target.uri, "it is not valid gzip data") from None
