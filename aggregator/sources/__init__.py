"""Source kinds, chosen by the protocol of a source's `url` (fsspec-style registry)."""

from __future__ import annotations

from collections.abc import Callable

from aggregator.manifest.model import SourceSpec
from aggregator.sources.base import FileInfo, Source, SourceError, SourceNotFound, SourceTooLarge
from aggregator.sources.local import LocalSource

__all__ = [
    "FileInfo",
    "LocalSource",
    "Source",
    "SourceError",
    "SourceNotFound",
    "SourceTooLarge",
    "open_source",
    "register_source_kind",
]

SourceFactory = Callable[[SourceSpec], Source]

_KINDS: dict[str, SourceFactory] = {
    "file": lambda spec: LocalSource(spec.id, spec.url),
}


def register_source_kind(protocol: str, factory: SourceFactory) -> None:
    """Make `protocol` URLs open with `factory`."""
    _KINDS[protocol] = factory


def open_source(spec: SourceSpec) -> Source:
    """Open the source a manifest entry describes; SourceError if its kind is unknown or it cannot be opened."""
    factory = _KINDS.get(spec.protocol)
    if factory is None:
        supported = ", ".join(sorted(_KINDS))
        raise SourceError(f"source kind {spec.protocol!r} is not supported (supported: {supported})")
    return factory(spec)
