"""`aggregator diff OLD NEW`: what a reload from OLD to NEW would add, remove or change, URI by URI."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from aggregator.catalog import Catalog, Entry, TemplateEntry
from aggregator.entry_spans import Differing
from aggregator.manifest.model import Defaults, Manifest, SourceSpec
from aggregator.sources.registry import source_kind

__all__ = ["CatalogDiff", "diff_catalogs", "diff_change", "diff_entries", "diff_sources"]

_T = TypeVar("_T")


@dataclass
class CatalogDiff:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[tuple[str, list[str]]] = field(default_factory=list)
    """(URI or URI template, the fields that differ)."""
    sources: list[tuple[str, list[str]]] = field(default_factory=list)
    """(source id, the settings that differ): what is read, and how, changes for every URI it serves."""
    access: dict[str, frozenset[str]] = field(default_factory=dict)
    """The scopes needed to see what each URI or URI template line names (before and after, joined)."""

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed or self.sources)

    def lines(self) -> list[str]:
        """`+ uri`, `- uri`, `~ uri (fields)` in URI order, then `~ source id (settings)`."""
        return [text for _, text in self.entry_lines() + self.source_lines()]

    def entry_lines(self) -> list[tuple[str, str]]:
        """The lines about entries and templates in URI order, each with the URI or URI template it names."""
        rows = [(u, f"+ {u}") for u in self.added] + [(u, f"- {u}") for u in self.removed]
        rows += [(u, f"~ {u} ({', '.join(fields)})") for u, fields in self.changed]
        return sorted(rows)

    def source_lines(self) -> list[tuple[str, str]]:
        """The lines about sources, each with the id of the source it names."""
        return [(sid, f"~ source {sid} ({', '.join(fields)})") for sid, fields in self.sources]

    def to_dict(self) -> dict[str, Any]:
        return {"added": self.added, "removed": self.removed,
                "changed": [{"uri": u, "fields": fields} for u, fields in self.changed],
                "sources": [{"id": sid, "fields": fields} for sid, fields in self.sources]}


def _entry_facts(e: Entry) -> dict[str, Any]:
    d = e.display
    return {"name": e.name, "title": e.title, "description": d.description, "mimeType": e.mime_type, "size": e.size,
            "lastModified": e.last_modified, "source": e.source, "path": e.path, "text": e.text,
            "render": e.render, "access": sorted(e.access), "annotations": d.annotations, "icons": d.icons}


def _template_facts(t: TemplateEntry) -> dict[str, Any]:
    s = t.spec
    return {"name": s.name, "title": s.display.title, "description": s.display.description,
            "mimeType": s.display.mime_type, "source": s.source, "path": s.path, "query": s.query,
            "format": s.format, "render": s.render, "access": sorted(s.access), "values": dict(s.values)}


# The settings every source has, as the manifest spells them; a kind names its own (SourceKind.changed). Values
# are never shown (URLs and headers may hold credentials).
_SOURCE_SETTINGS = {"url": "url", "ttl": "ttl", "max_bytes": "maxBytes", "timeout": "timeout",
                    "max_concurrency": "maxConcurrency", "stale_if_error": "staleIfError", "poll": "poll",
                    "access": "access"}


def _effective(source: SourceSpec, defaults: Defaults) -> SourceSpec:
    """`source` with the manifest's defaults filled in: a changed `defaults.ttl` changes every source using it."""
    return replace(source, ttl=source.ttl if source.ttl is not None else defaults.ttl,
                   max_bytes=source.max_bytes if source.max_bytes is not None else defaults.max_bytes)


def diff_sources(old: Manifest, new: Manifest) -> list[tuple[str, list[str]]]:
    """Sources in both manifests whose settings differ, with the names of those settings (never their values)."""
    changed = []
    for sid in sorted(set(old.sources) & set(new.sources)):
        a, b = _effective(old.sources[sid], old.defaults), _effective(new.sources[sid], new.defaults)
        settings = [name for attr, name in _SOURCE_SETTINGS.items() if getattr(a, attr) != getattr(b, attr)]
        settings += _kind_settings(a, b)
        if settings:
            changed.append((sid, settings))
    return changed


def _kind_settings(a: SourceSpec, b: SourceSpec) -> list[str]:
    """The kind's own settings that differ, asked of the kind (a url naming another kind already says `url`)."""
    if a.kind != b.kind:
        return []
    try:
        kind = source_kind(a.kind)
    except KeyError:  # registered when the manifest loaded, gone since: compare what is there
        return sorted(k for k in {*a.settings, *b.settings} if a.settings.get(k) != b.settings.get(k))
    return kind.changed(a.settings, b.settings)


def diff_catalogs(old: Catalog, new: Catalog) -> CatalogDiff:
    """Listed resources by URI and templates by URI template: added, removed, or changed (which fields)."""
    result = CatalogDiff()
    _compare_sorted(old.entries, new.entries, result)
    _compare_templates(old, new, result)
    return result


def diff_change(old: Catalog, new: Catalog, differing: Differing) -> CatalogDiff:
    """What `diff_catalogs(old, new)` finds, for catalogs whose entries differ only within `differing` (what a
    reload says it changed): the spans' entries and the templates are compared, never the other entries."""
    result = diff_entries(differing)
    _compare_templates(old, new, result)
    return result


def diff_entries(differing: Differing) -> CatalogDiff:
    """The entries added, removed or changed within `differing`: its spans' entries alone are built."""
    result = CatalogDiff()
    for before, after in differing:
        _compare_sorted(before.built(), after.built(), result)
    return result


def _compare_templates(old: Catalog, new: Catalog, result: CatalogDiff) -> None:
    _compare({t.uri_template: t for t in old.templates}, {t.uri_template: t for t in new.templates}, _template_facts,
             _template_access, result)


def _template_access(template: TemplateEntry) -> frozenset[str]:
    return template.spec.access


def _seen_with(result: CatalogDiff, key: str, *access: frozenset[str]) -> None:
    """Note that the line about `key` needs these scopes (an entry and a template of one name: both's)."""
    result.access[key] = result.access.get(key, frozenset()).union(*access)


def _compare_sorted(before: Sequence[Entry], after: Sequence[Entry], result: CatalogDiff) -> None:
    """`_compare` for entries, which both catalogs keep sorted by URI: one merge walk, and entries a reload reused
    (the same object) are not compared field by field, so an unchanged 100,000-entry catalog costs one pass."""
    # Indexed item by item below: a catalog changed in place keeps entries in chunks (chunked.py), a list is faster.
    before, after = _indexable(before), _indexable(after)
    i = j = 0
    while i < len(before) and j < len(after):
        a, b = before[i], after[j]
        if a is b:
            i, j = i + 1, j + 1
        elif a.uri == b.uri:
            old, new = _entry_facts(a), _entry_facts(b)
            fields = [f for f in old if old[f] != new[f]]
            if fields:
                result.changed.append((a.uri, fields))
                _seen_with(result, a.uri, a.access, b.access)
            i, j = i + 1, j + 1
        elif a.uri < b.uri:
            result.removed.append(a.uri)
            _seen_with(result, a.uri, a.access)
            i += 1
        else:
            result.added.append(b.uri)
            _seen_with(result, b.uri, b.access)
            j += 1
    for gone in before[i:]:
        result.removed.append(gone.uri)
        _seen_with(result, gone.uri, gone.access)
    for came in after[j:]:
        result.added.append(came.uri)
        _seen_with(result, came.uri, came.access)


def _indexable(entries: Sequence[Entry]) -> Sequence[Entry]:
    return entries if isinstance(entries, (list, tuple)) else list(entries)


def _compare(before: Mapping[str, _T], after: Mapping[str, _T], facts: Callable[[_T], dict[str, Any]],
             access: Callable[[_T], frozenset[str]], result: CatalogDiff) -> None:
    """Add to `result` the keys only `after` has, those only `before` has, and the fields that changed."""
    for key in sorted(set(after) - set(before)):
        result.added.append(key)
        _seen_with(result, key, access(after[key]))
    for key in sorted(set(before) - set(after)):
        result.removed.append(key)
        _seen_with(result, key, access(before[key]))
    for key in sorted(set(before) & set(after)):
        if before[key] is after[key]:  # a reload reuses the entries of unchanged collections: nothing to compare
            continue
        a, b = facts(before[key]), facts(after[key])
        fields = [f for f in a if a[f] != b[f]]
        if fields:
            result.changed.append((key, fields))
            _seen_with(result, key, access(before[key]), access(after[key]))
