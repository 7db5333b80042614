"""`aggregator diff OLD NEW`: what a reload from OLD to NEW would add, remove or change, URI by URI."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aggregator.catalog import Catalog, Entry, TemplateEntry

__all__ = ["CatalogDiff", "diff_catalogs"]


@dataclass
class CatalogDiff:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[tuple[str, list[str]]] = field(default_factory=list)
    """(URI or URI template, the fields that differ)."""

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def lines(self) -> list[str]:
        """`+ uri`, `- uri`, `~ uri (fields)`, in URI order."""
        rows = [(u, f"+ {u}") for u in self.added] + [(u, f"- {u}") for u in self.removed]
        rows += [(u, f"~ {u} ({', '.join(fields)})") for u, fields in self.changed]
        return [text for _, text in sorted(rows)]

    def to_dict(self) -> dict[str, Any]:
        return {"added": self.added, "removed": self.removed,
                "changed": [{"uri": u, "fields": fields} for u, fields in self.changed]}


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


def diff_catalogs(old: Catalog, new: Catalog) -> CatalogDiff:
    """Listed resources by URI and templates by URI template: added, removed, or changed (which fields)."""
    result = CatalogDiff()
    for before, after, facts in (
        ({e.uri: e for e in old.entries}, {e.uri: e for e in new.entries}, _entry_facts),
        ({t.uri_template: t for t in old.templates}, {t.uri_template: t for t in new.templates}, _template_facts),
    ):
        result.added += sorted(set(after) - set(before))
        result.removed += sorted(set(before) - set(after))
        for key in sorted(set(before) & set(after)):
            a, b = facts(before[key]), facts(after[key])  # type: ignore[arg-type]
            fields = [f for f in a if a[f] != b[f]]
            if fields:
                result.changed.append((key, fields))
    return result
