"""Source kinds, chosen by the protocol of a source's `url` (fsspec-style registry).

`file` is a local folder, `http`/`https` an HTTP base URL, `git` a repository at a ref; any other protocol
is opened with fsspec's implementation of that name (s3, gcs, az, memory ...), options passed through.
"""

from __future__ import annotations

from collections.abc import Callable

from aggregator.manifest.model import SourceSpec
from aggregator.sources.base import (Blob, FileInfo, Source, SourceError, SourceNotFound, SourceTooLarge,
                                    SourceUnsupported)
from aggregator.sources.local import LocalSource

__all__ = [
    "Blob",
    "FileInfo",
    "LocalSource",
    "Source",
    "SourceError",
    "SourceNotFound",
    "SourceTooLarge",
    "SourceUnsupported",
    "open_source",
    "register_source_kind",
]

SourceFactory = Callable[[SourceSpec], Source]


def _local(spec: SourceSpec) -> Source:
    return LocalSource(spec.id, spec.url, timeout=spec.timeout, max_concurrency=spec.max_concurrency)


def _http(spec: SourceSpec) -> Source:
    try:
        from aggregator.sources.http import HttpSource
    except ImportError:
        raise SourceError("HTTP sources need aiohttp: pip install 'mcp-aggregator[http]' "
                          "(in a checkout: pip install -e '.[http]')") from None
    return HttpSource(spec.id, spec.url, headers=spec.headers, allow_private_network=spec.allow_private_network,
                      timeout=spec.timeout, max_concurrency=spec.max_concurrency)


def _git(spec: SourceSpec) -> Source:
    from aggregator.sources.git import open_git

    return open_git(spec.id, spec.url, spec.ref, timeout=spec.timeout, max_concurrency=spec.max_concurrency)


def _fsspec(spec: SourceSpec) -> Source:
    from aggregator.sources.filesystem import FsspecSource

    return FsspecSource.from_url(spec.id, spec.protocol, spec.url, spec.options, timeout=spec.timeout,
                                 max_concurrency=spec.max_concurrency)


def _sql(spec: SourceSpec) -> Source:
    from aggregator.sources.sql import SqlSource

    return SqlSource(spec.id, spec.url, tables=spec.tables, sample_rows=spec.sample_rows, row_limit=spec.row_limit,
                     timeout=spec.timeout, max_concurrency=spec.max_concurrency, checksum=spec.checksum)


_KINDS: dict[str, SourceFactory] = {"file": _local, "http": _http, "https": _http, "git": _git, "sql": _sql}


def register_source_kind(protocol: str, factory: SourceFactory) -> None:
    """Make `protocol` URLs open with `factory` instead of fsspec's implementation."""
    _KINDS[protocol] = factory


def open_source(spec: SourceSpec) -> Source:
    """Open the source a manifest entry describes; SourceError if it cannot be opened."""
    return _KINDS.get(spec.protocol, _fsspec)(spec)
