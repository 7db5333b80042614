"""What the console's JSON endpoints say, built from one snapshot for one caller's scopes (None: everything).

Every builder filters by the caller's scopes first: an entry, template, source or reload line the caller may not
see is left out, never masked, so counts do not tell of it either. Operator detail (errors) is redacted of
credentials and this host's paths.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any
from weakref import WeakKeyDictionary

from aggregator.catalog import Catalog, Entry, TemplateEntry
from aggregator.console.history import ReloadRecord
from aggregator.console.redact import redact, where
from aggregator.console.tree import Folder, TreePage
from aggregator.listing_change import ListingChange
from aggregator.mcp_shapes import resource_dict, template_dict
from aggregator.snapshot import Snapshot
from aggregator.sources import Source

__all__ = ["catalog_facts", "catalog_scopes", "entry_view", "reload_view", "sees_all", "source_paths", "source_rows",
           "template_view", "tree_view", "view_changed", "visible_uri"]

_COUNTS: WeakKeyDictionary[Catalog, dict[frozenset[str] | None, Counter[str]]] = WeakKeyDictionary()
_SCOPES: WeakKeyDictionary[Catalog, frozenset[str]] = WeakKeyDictionary()
_MAX_VIEWS = 16


def catalog_scopes(snapshot: Snapshot) -> frozenset[str]:
    """Every scope an entry, template or source of `snapshot` asks for (once per catalog: O(n) the first time)."""
    return _entry_scopes(snapshot.catalog) | {s for spec in snapshot.manifest.sources.values() for s in spec.access}


def _entry_scopes(catalog: Catalog) -> frozenset[str]:
    """Every scope an entry or template of `catalog` asks for (once per catalog: a pass over its rows' columns that
    builds no entry, as every change makes a new catalog)."""
    found = _SCOPES.get(catalog)
    if found is None:
        accesses = catalog.entries.accesses() | {template.spec.access for template in catalog.templates}
        found = _SCOPES[catalog] = frozenset().union(*accesses)
    return found


def sees_all(snapshot: Snapshot, scopes: frozenset[str] | None) -> bool:
    """Whether a caller holding `scopes` sees the whole snapshot: only then does it get operator-wide detail."""
    return scopes is None or catalog_scopes(snapshot) <= scopes


def catalog_facts(snapshot: Snapshot, scopes: frozenset[str] | None) -> dict[str, Any]:
    """The catalog generation and the manifest's sha256 for a caller who sees everything; nothing for a scoped
    caller: the generation moves on every reload and relisting, the digest on every applied save, so they would
    tell it that, and how often, something it may not see changed (its event stream and Reloads list tell it of
    changes to what it sees)."""
    if not sees_all(snapshot, scopes):
        return {}
    return {"generation": snapshot.catalog.generation, "manifestDigest": snapshot.manifest.digest}


def entry_view(entry: Entry) -> dict[str, Any]:
    """A resource as resources/list shows it, plus the source it comes from (its id, never its path)."""
    out = resource_dict(entry)
    out["kind"] = "entry"
    if entry.source is not None:
        out["source"] = entry.source
    return out


def tree_view(page: TreePage) -> dict[str, Any]:
    children = [{"kind": "folder", "prefix": c.prefix, "count": c.count} if isinstance(c, Folder) else entry_view(c)
                for c in page.children]
    return {"prefix": page.prefix, "children": children, "nextCursor": page.next_cursor, "total": page.total}


def template_view(template: TemplateEntry) -> dict[str, Any]:
    """A template as resources/templates/list shows it, with its variables and their enumerated values."""
    out = template_dict(template)
    spec = template.spec
    out["variables"] = [{"name": name, "values": list(spec.values.get(name, ())),
                         "multiSegment": name in template.template.multi_segment}
                        for name in template.template.variables]
    if spec.source is not None:
        out["source"] = spec.source
    out["kind"] = "render" if spec.render is not None else "query" if spec.query is not None else "file"
    return out


def _counts(catalog: Catalog, scopes: frozenset[str] | None) -> Counter[str]:
    """Visible entries per source id, once per catalog and scope set (bounded)."""
    views = _COUNTS.setdefault(catalog, {})
    key = scopes if catalog.restricted else None
    found = views.get(key)
    if found is None:
        if len(views) >= _MAX_VIEWS:
            views.pop(next(iter(views)))
        entries, _ = catalog.visible(scopes)
        found = views[key] = Counter(e.source or "" for e in entries)
    return found


CLOCK_SET_S = 1.0
"""How far the wall clock must move against the monotonic one before `_wall_time` follows it (the clock was set)."""
_wall_offset: float | None = None


def _wall_time(at: float) -> float:
    """The time.time() of `at`, a time.monotonic() reading: the same for the same `at` on every call, so a listing
    time moves only when its source is listed again. (Read afresh, the two clocks' difference moves with the
    instant between the two reads, and a listing time with it, on every request.) The offset is taken again only
    when the wall clock was set since, by more than CLOCK_SET_S."""
    global _wall_offset
    offset = time.time() - time.monotonic()
    if _wall_offset is None or abs(offset - _wall_offset) > CLOCK_SET_S:
        _wall_offset = offset
    return _wall_offset + at


def source_paths(snapshot: Snapshot) -> dict[str, str]:
    """This host's folders a message may name, with the label the console shows instead."""
    paths = {str(os.path.dirname(snapshot.manifest.path)): "<manifest folder>"}
    for sid, spec in snapshot.manifest.sources.items():
        if spec.protocol == "file":
            paths[spec.url] = f"<{sid}>"
    return paths


def source_rows(snapshot: Snapshot, scopes: frozenset[str] | None, *, hits: Mapping[str, int],
                misses: Mapping[str, int], held: Mapping[str, int], errors: Mapping[str, int],
                last_errors: Mapping[str, tuple[float, str]], successes: Mapping[str, float],
                health: Mapping[str, Mapping[str, object]], detail: bool) -> list[dict[str, Any]]:
    """One row per source the caller may see: kind, listing, cache, change detection, upstream state, whether it
    is failing, when it last worked and will retry; why it failed (redacted) only with `detail`."""
    catalog, manifest = snapshot.catalog, snapshot.manifest
    counts = _counts(catalog, scopes)
    now_wall = time.time()
    listed: dict[str, float] = {}
    for key, at in catalog.listed_at.items():
        if key.source is not None:
            listed[key.source] = max(listed.get(key.source, 0.0), at)
    for sid, at in catalog.published_at.items():
        listed[sid] = max(listed.get(sid, 0.0), at)
    paths = source_paths(snapshot)
    rows = []
    for sid, spec in sorted(manifest.sources.items()):
        if scopes is not None and not spec.access <= scopes:
            continue
        backend = snapshot.sources.get(sid)
        lookups = hits.get(sid, 0) + misses.get(sid, 0)
        row: dict[str, Any] = {
            "id": sid, "kind": spec.kind, "protocol": spec.protocol, "description": spec.description,
            "resources": counts.get(sid, 0),
            "listedAt": _wall_time(listed[sid]) if sid in listed else None,
            "cache": {"hits": hits.get(sid, 0), "misses": misses.get(sid, 0), "bytes": held.get(sid, 0),
                      "hitRate": round(hits.get(sid, 0) / lookups, 4) if lookups else None},
            "errors": errors.get(sid, 0),
            "change": _change_detection(backend, spec.poll),
            "ttl": snapshot.limits[sid].ttl if sid in snapshot.limits else None,
        }
        row.update(_failure(last_errors.get(sid), successes.get(sid), health.get(sid), now_wall, paths, detail))
        if sid in health:
            row["upstream"] = {k: v for k, v in health[sid].items()
                               if isinstance(v, (str, int, float, bool)) and k not in _FAILURE_KEYS}
        rows.append(row)
    return rows


_FAILURE_KEYS = frozenset({"lastError", "connectedAt", "retryIn"})


def _failure(failed: tuple[float, str] | None, succeeded: float | None, health: Mapping[str, object] | None,
             now: float, paths: Mapping[str, str], detail: bool) -> dict[str, Any]:
    """Whether a source is failing (its upstream is down, or its last call failed after its last success), when
    it last worked, when its upstream tries again, and (with `detail`) the last error, redacted."""
    health = health or {}
    connected = health.get("connectedAt")
    successes = [t for t in (succeeded, connected) if isinstance(t, (int, float))]
    last_success = max(successes) if successes else None
    down = health.get("state") == "failed"
    out: dict[str, Any] = {
        "failing": down or (failed is not None and (last_success is None or failed[0] > last_success)),
        "lastSuccessAt": last_success}
    retry_in = health.get("retryIn")
    out["retryAt"] = now + retry_in if isinstance(retry_in, (int, float)) else None
    if detail:
        upstream_error = health.get("lastError")
        if failed is not None:
            out["lastError"] = {"at": failed[0], "message": redact(failed[1], paths)}
        elif down and isinstance(upstream_error, str):
            out["lastError"] = {"at": None, "message": redact(upstream_error, paths)}
    return out


def _change_detection(backend: Source | None, poll: float | None) -> str:
    """How the server learns that a source changed: a folder watcher, the backend's own events, polling, or only a
    reload of the manifest."""
    if backend is not None and backend.watch_root() is not None:
        return "watched"
    if backend is not None and backend.pushes_changes:
        return "pushed"
    return f"polled every {poll:g}s" if poll else "on reload"


def reload_view(record: ReloadRecord, scopes: frozenset[str] | None, everything: bool, manifest_path: str,
                limit: int = 200) -> dict[str, Any]:
    """A reload as a caller holding `scopes` may see it: its change lines about what it may see, and a refusal's
    located issues only for a caller who sees everything (they may name any entry), and so its generation and
    digest (catalog_facts: their steps would count the reloads a scoped caller is not shown)."""
    lines = [line.text for line in record.lines if scopes is None or line.access <= scopes]
    out: dict[str, Any] = {"at": record.at, "ok": record.ok, "lines": lines[:limit],
                           "moreLines": max(0, len(lines) - limit) + (record.more if everything else 0)}
    if everything:
        out["generation"] = record.generation
    if record.ok:
        out["linesKnown"] = record.lines_known  # False: the diff failed, so `lines` says nothing (only `everything`)
        out["resources"] = record.resources if everything else None
        if record.digest and everything:
            out["digest"] = record.digest
        return out
    folder = os.path.dirname(manifest_path)
    if everything:
        out["issues"] = [{"file": where(i.file, folder), "line": i.line, "col": i.col, "key": i.key,
                          "message": redact(i.message, {folder: "<manifest folder>"})} for i in record.issues]
        out["error"] = record.error
    else:
        out["issues"] = []
        out["error"] = (f"the save was refused ({len(record.issues)} problem(s)); their details need a token that "
                        "sees the whole catalog" if record.issues else record.error)
    return out


def view_changed(old: Catalog, new: Catalog, scopes: frozenset[str] | None, told: ListingChange,
                 swapped: ListingChange) -> bool:
    """Whether a caller holding `scopes` sees other entries or templates in `new` than in `old`: `told` is what the
    list change at hand says changed (NO_CHANGE at a reload), `swapped` what the catalogs swapped in from `old` to
    `new` changed (a reload may hide a source from the caller, or show it one, and list the same). A caller who
    sees all of both sees what `told.listing_changed` says; another what `swapped.shown_to` says of its scopes:
    O(distinct access sets), whatever the catalog's size."""
    if scopes is None or (_entry_scopes(old) <= scopes and _entry_scopes(new) <= scopes):
        return told.listing_changed
    return swapped.shown_to(scopes)


def visible_uri(snapshot: Snapshot, uri: str, scopes: frozenset[str] | None) -> bool:
    """Whether a caller holding `scopes` may see `uri` now (listed, or answered by a template it may see)."""
    from aggregator.errors import ResourceNotFound

    try:
        snapshot.allowed(uri, scopes)
    except ResourceNotFound:
        return False
    return True
