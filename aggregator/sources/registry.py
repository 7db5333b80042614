"""The registry of source kinds (in the spirit of fsspec's): name -> "module:Declaration", imported when first needed.

Built-in kinds are listed below; another package adds one without touching this repository through the entry-point
group `aggregator.source_kinds` (`archive = "my_package.archive:ArchiveKind"`), a program through
`register_source_kind`. A source's kind is the one claiming its URL's scheme, the most recently registered first;
a scheme no kind claims is opened by fsspec's implementation of that name (the `fsspec` kind).
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from aggregator.sources.kind import SourceKind, load_object

if TYPE_CHECKING:
    from aggregator.manifest.model import SourceSpec
    from aggregator.sources.base import Source

__all__ = ["ENTRY_POINT_GROUP", "FALLBACK", "builtin_kinds", "kind_for_url", "only_builtin_kinds", "open_source",
           "register_source_kind", "registry_version", "source_kind", "source_kinds", "source_protocol",
           "unregister_source_kind"]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "aggregator.source_kinds"
FALLBACK = "fsspec"
"""The kind that opens URLs no other kind claims."""

_BUILTIN: dict[str, str] = {
    "file": "aggregator.sources.builtin:LocalKind",
    "http": "aggregator.sources.builtin:HttpKind",
    "git": "aggregator.sources.builtin:GitKind",
    "sql": "aggregator.sources.builtin:SqlKind",
    "mcp": "aggregator.sources.builtin:McpKind",
    "fsspec": "aggregator.sources.builtin:FsspecKind",
}

_registered: dict[str, str | type[SourceKind]] = {}
_kinds: dict[str, SourceKind] | None = None
_only_builtins = False
_version = 0


def register_source_kind(name: str, declaration: str | type[SourceKind]) -> None:
    """Add (or replace) the kind `name`: its SourceKind subclass, or "module:Class" naming it (imported when the
    registry is next read). Its URL schemes win over those of kinds registered before it."""
    global _kinds, _version
    _registered.pop(name, None)  # re-registering moves it last: it claims first
    _registered[name] = declaration
    _kinds = None
    _version += 1


def unregister_source_kind(name: str) -> None:
    """Forget a kind `register_source_kind` added (built-ins and entry points stay)."""
    global _kinds, _version
    if _registered.pop(name, None) is not None:
        _kinds = None
        _version += 1


def registry_version() -> int:
    """A number that changes whenever a kind is registered (what schema caches are keyed on)."""
    return _version


def source_kinds() -> dict[str, SourceKind]:
    """Every kind, by name, in registration order: built-ins, then entry points, then `register_source_kind`'s."""
    global _kinds, _only_builtins
    if _kinds is None:
        declared: dict[str, str | type[SourceKind]] = dict(_BUILTIN)
        for point in entry_points(group=ENTRY_POINT_GROUP):
            declared.pop(point.name, None)
            declared[point.name] = point.value
        for name, declaration in _registered.items():
            declared.pop(name, None)
            declared[name] = declaration
        _kinds = {}
        for name, declaration in declared.items():
            kind = _instantiate(name, declaration)
            if kind is not None:
                _kinds[name] = kind
        _only_builtins = declared == _BUILTIN and list(_kinds) == list(_BUILTIN)
    return _kinds


def only_builtin_kinds() -> bool:
    """Whether the kinds are exactly the built-in ones, each loaded (then the schema is the published one)."""
    source_kinds()
    return _only_builtins


def _instantiate(name: str, declaration: str | type[SourceKind]) -> SourceKind | None:
    """The kind's declaration, named `name`; None (logged) when it cannot be imported: the other kinds still work."""
    try:
        cls = load_object(declaration) if isinstance(declaration, str) else declaration
        if not (isinstance(cls, type) and issubclass(cls, SourceKind)):
            raise TypeError(f"{declaration!r} is not a SourceKind subclass")
        kind = cls()
    except Exception as exc:
        log.warning("source kind %r (%s) cannot be loaded: %s: %s", name, declaration, type(exc).__name__, exc)
        return None
    kind.name = name
    return kind


def builtin_kinds() -> list[SourceKind]:
    """The kinds this package declares, whatever is installed or registered (what the published schema shows)."""
    return [kind for name, declaration in _BUILTIN.items() if (kind := _instantiate(name, declaration)) is not None]


def source_kind(name: str) -> SourceKind:
    """The kind called `name`; KeyError if none is."""
    return source_kinds()[name]


def kind_for_url(url: str) -> SourceKind:
    """The kind a source `url` opens with: the last registered kind claiming its scheme, else fsspec's."""
    from aggregator.manifest.source_urls import url_scheme  # here: the manifest package imports this module

    scheme = url_scheme(url)
    kinds = source_kinds()
    for kind in reversed(kinds.values()):
        if kind.name != FALLBACK and kind.claims(scheme):
            return kind
    return kinds[FALLBACK]


def source_protocol(url: str) -> str:
    """The protocol a source url selects: `file`, `sql`, `git` or the URL's own scheme (as the kinds decide)."""
    from aggregator.manifest.source_urls import url_scheme

    return kind_for_url(url).protocol(url_scheme(url))


def open_source(spec: SourceSpec) -> Source:
    """Open the source a manifest entry describes; SourceError if it cannot be opened (a missing extra included)."""
    return source_kind(spec.kind).open(spec)
