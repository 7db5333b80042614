"""What a source kind declares: its name, the URLs it claims, its own manifest keys, its rules for manifests read
from URLs, and how its `Source` is built (in the spirit of fsspec's `known_implementations`).

A declaration is light: importing it never imports the kind's dependencies, so `aggregator validate` and
`aggregator schema` work without the kind's extra installed. The `Source` class it names (`source`,
"module:Class") is imported only when a source of the kind opens.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aggregator.manifest.model import SourceSpec
    from aggregator.sources.base import Source

__all__ = ["EMPTY", "Setting", "SourceKind", "load_object"]

EMPTY: Mapping[str, Any] = MappingProxyType({})
"""An immutable empty mapping, the default of mapping-valued settings."""

KeyPath = tuple[str | int, ...]


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True, slots=True)
class Setting:
    """One manifest key of a kind: its JSON Schema, its value when absent, and how a checked value becomes the
    value the source gets (`parse` may raise ValueError: a located issue)."""

    schema: Mapping[str, Any]
    default: Any = None
    parse: Callable[[Any], Any] = _same


def load_object(target: str) -> Any:
    """The object a "module:attribute" string names (ImportError if its module, or a dependency, is missing)."""
    module, _, attribute = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attribute.split(".") if attribute else ():
        obj = getattr(obj, part)
    return obj


class SourceKind:
    """A kind of source. Subclasses set the class attributes and implement `open`; the other methods have
    defaults for a kind whose URLs are remote and taken as written. The registry makes one instance."""

    name: str = ""
    """The kind's name (the registry's key), e.g. "http"."""
    schemes: frozenset[str] = frozenset()
    """URL schemes it claims (`https` in https://...); a bare path has the scheme `file`."""
    source: str = ""
    """"module:Class" of its `Source`, imported when a source of this kind opens."""
    extra: str | None = None
    """The extra of `distribution` that installs its dependencies, named when importing `source` fails."""
    distribution: str = "mcp-aggregator"
    """The package that declares the kind (a kind from another package names its own)."""
    url_help: str = ""
    """What its URLs look like, for the schema's description of `url`."""
    settings: Mapping[str, Setting] = EMPTY
    """Its own manifest keys (beyond the common ones), in the order the schema shows them."""
    runs_queries: bool = False
    """Whether templates may give its sources a `query`."""

    def claims(self, scheme: str) -> bool:
        """Whether URLs with this (lower-case) scheme are this kind's."""
        return scheme in self.schemes

    def protocol(self, scheme: str) -> str:
        """The protocol a source of this kind records (SourceSpec.protocol) for a URL with `scheme`."""
        return scheme

    def locate(self, url: str, base: Path) -> str:
        """The URL as the source opens it: local paths made absolute against `base` (the manifest's folder)."""
        return url

    def reads_this_machine(self, url: str) -> bool:
        """Whether a source at (located) `url` reads this machine's files: a manifest read from a URL may not."""
        return False

    def remote_refusals(self, url: str, keys: Mapping[str, Any]) -> Iterator[tuple[KeyPath, str]]:
        """What a manifest read from a URL may not write in this kind's source entry `keys`: (key path within the
        entry, what it would do), e.g. (("url",), "declare local folders, files or repositories")."""
        if self.reads_this_machine(url):
            yield ("url",), "declare local folders, files or repositories"

    def publishes(self, settings: Mapping[str, Any]) -> bool:
        """Whether a source with these (parsed) settings lists entries of its own (`Source.publishes`), so that it
        is used even when no resource, collection or template of the manifest names it."""
        return False

    def path_issue(self, source: str, keys: Mapping[str, Any], role: str, value: str) -> str | None:
        """What makes `value` wrong for the source `source` of this kind, whose entry is `keys` (as the manifest
        spells it), or None; `role` says what `value` is: "glob" or "exclude" of a collection, "path" of a resource,
        "template path". The caller locates the message at the key."""
        return None

    def changed(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
        """Its settings (as the manifest spells them) that differ between two sources' `settings`."""
        return [key for key in self.settings if old.get(key) != new.get(key)]

    def load(self) -> type[Source]:
        """Its `Source` class; SourceError naming the extra to install when the kind's dependency is missing."""
        from aggregator.sources.base import SourceError

        try:
            source: type[Source] = load_object(self.source)
            return source
        except ImportError as exc:
            missing = f" need {exc.name}" if exc.name else " cannot be imported"
            hint = (f": pip install '{self.distribution}[{self.extra}]' (in a checkout: pip install -e "
                    f"'.[{self.extra}]')" if self.extra else f": {exc}")
            raise SourceError(f"{self.name} sources{missing}{hint}") from None

    def open(self, spec: SourceSpec) -> Source:
        """A source for the manifest entry `spec` (the kind's own keys in `spec.settings`, parsed); SourceError if
        it cannot be opened. Typically `self.load()(spec.id, spec.url, ...)`."""
        raise NotImplementedError(f"{type(self).__name__}.open")
