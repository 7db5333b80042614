"""Source kinds, chosen by the scheme of a source's `url` (an fsspec-style registry: `aggregator.sources.registry`).

`file` is a local folder, `http`/`https` an HTTP base URL, `git+...` a repository at a ref, a database URL a SQL
source; any other protocol is opened with fsspec's implementation of that name (s3, gcs, az, memory ...), options
passed through. Each kind declares its own manifest keys (`aggregator.sources.kind.SourceKind`).
"""

from __future__ import annotations

from aggregator.sources.base import (Blob, FileInfo, Source, SourceError, SourceNotFound, SourceTooLarge,
                                    SourceUnsupported)
from aggregator.sources.kind import Setting, SourceKind
from aggregator.sources.local import LocalSource
from aggregator.sources.registry import kind_for_url, open_source, register_source_kind, source_kind, source_kinds

__all__ = [
    "Blob",
    "FileInfo",
    "LocalSource",
    "Setting",
    "Source",
    "SourceError",
    "SourceKind",
    "SourceNotFound",
    "SourceTooLarge",
    "SourceUnsupported",
    "kind_for_url",
    "open_source",
    "register_source_kind",
    "source_kind",
    "source_kinds",
]
