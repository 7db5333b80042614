"""Manifest files: where a manifest's name for another leads (`resolve_ref`), and a manifest's bytes read no
further than a cap (`read_manifest_bytes`), from a local file or a URL.

Relative names resolve against the file that wrote them: an overlay's against the overlay, a base's against the
base, a URL manifest's against its URL. A manifest read from a URL may name only URLs: it never reaches this
machine's files (the loader also refuses its local sources and `${ENV}`). A local name must be a regular file,
opened without blocking: a FIFO or a device put where a manifest was expected is refused, not waited on.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Mapping
from typing import Any, BinaryIO
from urllib.parse import urljoin

from aggregator.manifest.model import DEFAULT_MAX_MANIFEST_BYTES, is_url
from aggregator.manifest.source_urls import S3_SCHEMES, url_scheme
from aggregator.manifest.units import format_size

__all__ = ["ManifestTooLarge", "RefusedReference", "open_regular_file", "read_at_most", "read_file_at_most",
           "read_manifest_bytes", "resolve_ref"]


class RefusedReference(ValueError):
    """A manifest named another it may not reach."""


class ManifestTooLarge(ValueError):
    """A manifest file holds more bytes than the cap it is read with."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"is larger than server.maxManifestBytes ({format_size(limit)})")


_CHUNK = 64 * 1024


def resolve_ref(ref: str, parent: str) -> str:
    """The canonical name (absolute path or URL) of the manifest `ref` names, as written in the manifest named
    `parent` (canonical too). RefusedReference when a manifest read from a URL names a local file."""
    if is_url(ref):
        return ref
    if is_url(parent):
        # A shared manifest fetched over the network must not reach into this machine's files.
        if ref.startswith(("file:", "/", "~", "\\")) or os.path.isabs(ref):
            raise RefusedReference("a manifest read from a URL may name other manifests only by URL or by a path "
                                   "relative to its own URL")
        return _join_url(parent, ref)
    path = ref.removeprefix("file://")
    return os.path.normpath(os.path.join(os.path.dirname(parent), path))


def open_regular_file(path: str | os.PathLike[str]) -> BinaryIO:
    """`path` opened for reading if it is a regular file; OSError otherwise. Opened without blocking, so a FIFO
    or a device put where a manifest was expected is refused instead of waiting forever for a writer."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "is a folder, not a manifest file", str(path))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "is not a regular file (a FIFO, socket or device)", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_manifest_bytes(name: str, options: Mapping[str, Any] | None = None,
                        limit: int = DEFAULT_MAX_MANIFEST_BYTES) -> bytes:
    """The bytes of the manifest `name` (from `resolve_ref`): a local file or an fsspec URL (https://, s3://,
    git://REPO:REF@PATH). ManifestTooLarge past `limit` bytes, having read at most `limit + 1` of them;
    OSError (or the filesystem's own error) when it cannot be read."""
    if not is_url(name):
        return read_file_at_most(name, limit)
    import fsspec  # URLs only: local files need no filesystem layer

    if url_scheme(name) in S3_SCHEMES:  # s3fs first: when it is missing, fsspec's error says what to install
        fsspec.get_filesystem_class("s3")
        from aggregator.s3_client import OneRetryLoopS3, s3_options  # an S3 source's client and retries
        opened = fsspec.core.OpenFile(OneRetryLoopS3(**s3_options(options or {})), name, "rb")
    else:
        opened = fsspec.open(name, "rb", **dict(options or {}))
    with opened as handle:
        size = getattr(handle, "size", None)  # when the store says (Content-Length, object size): refuse unread
        if isinstance(size, int) and size > limit:
            raise ManifestTooLarge(limit)
        return read_at_most(handle, limit)


def read_file_at_most(path: str | os.PathLike[str], limit: int) -> bytes:
    """A local manifest file's bytes: ManifestTooLarge past `limit`, OSError if it is not a readable regular file."""
    with open_regular_file(path) as handle:
        return read_at_most(handle, limit)


def read_at_most(handle: Any, limit: int) -> bytes:
    """What `handle` holds, read in chunks; ManifestTooLarge as soon as more than `limit` bytes arrived (an
    endless HTTP body is never read further)."""
    chunks: list[bytes] = []
    total = 0
    while total <= limit:
        chunk = handle.read(min(_CHUNK, limit + 1 - total))  # a stream may answer fewer bytes than asked
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > limit:
        raise ManifestTooLarge(limit)
    return b"".join(chunks)


def _join_url(parent: str, ref: str) -> str:
    """`ref` relative to the folder of the URL `parent` (for git://REPO:REF@PATH, within the repository)."""
    scheme, _, rest = parent.partition("://")
    if scheme.lower() in ("http", "https"):
        return urljoin(parent, ref)
    if scheme.lower() == "git" and "@" in rest:
        head, _, inner = parent.rpartition("@")
        return f"{head}@{posixpath.normpath(posixpath.join(posixpath.dirname(inner), ref))}"
    return f"{scheme}://{posixpath.normpath(posixpath.join(posixpath.dirname(rest), ref))}"
