"""Source kinds, chosen by the scheme of a source's `url` (an fsspec-style registry: `aggregator.sources.registry`).

`file` is a local folder, `http`/`https` an HTTP base URL, `git+...` a repository at a ref, a database URL a SQL
source; any other protocol is opened with fsspec's implementation of that name (s3, gcs, az, memory ...), options
passed through. Each kind declares its own manifest keys (`aggregator.sources.kind.SourceKind`).

Names are imported on first use: loading a manifest reads the kinds' declarations (`kind`, `registry`) and
should not pay for the sources themselves (anyio, threads) when it only validates or prints the schema.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aggregator.sources.base import (Blob, FileInfo, Source, SourceError, SourceNotFound, SourceTooLarge,
                                        SourceUnsupported)
    from aggregator.sources.kind import Setting, SourceKind
    from aggregator.sources.local import LocalSource
    from aggregator.sources.registry import (kind_for_url, open_source, register_source_kind, source_kind,
                                             source_kinds)

_HOMES = {
    "Blob": "base", "FileInfo": "base", "Source": "base", "SourceError": "base", "SourceNotFound": "base",
    "SourceTooLarge": "base", "SourceUnsupported": "base", "Setting": "kind", "SourceKind": "kind",
    "LocalSource": "local", "kind_for_url": "registry", "open_source": "registry",
    "register_source_kind": "registry", "source_kind": "registry", "source_kinds": "registry",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value
