"""Manifests built from manifests: `extends:` a base (an overlay merged over it) and `include:` others.

`extends: base.yaml` merges this file over the base before anything is checked, so an overlay may be partial:
- mappings merge key by key (`defaults`, `server`, each source under `sources`); `null` deletes a key;
- `resources` and `collections` merge by `uri`, `templates` by `uriTemplate`: an entry with the same identity is
  merged into the base's, `remove: true` drops it, new entries are appended; `include` lists are concatenated;
- any other value (scalars, lists such as `tables` or `exclude`) is replaced.
Errors keep pointing at the file and line that wrote the value, base or overlay.

`include:` loads other manifests whole (each checked on its own, local paths relative to its own folder) and adds
their sources, resources, collections and templates. `namespace: team-a` prefixes an included manifest's URI
schemes (`docs://x` becomes `team-a+docs://x`, still a valid URI scheme), its entry names (`team-a/name`) and its
source ids (`team-a.docs`), so two teams' manifests cannot collide. `sha256:` pins the included file's bytes.
Only the including manifest's `server:` applies; an included manifest's `defaults:` still apply to its own sources.
Renders of a namespaced include name the include's own URIs (`Render.uri`).
A file met again on its own include or extends chain is a cycle, reported with the chain.

Limits, each a located error: every file is read no further than `server.maxManifestBytes` (the root's own value
for its includes; the value in force, the default at start, for the root and its bases), and one load reads at
most MAX_FILES files.

Relative names resolve against the file that wrote them, and a manifest read from a URL may name only URLs
(aggregator.manifest.files, which reads them); one named relative to a URL is fetched with its parent's
`options:`.
"""

from __future__ import annotations

import bisect
import hashlib
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, overload

from aggregator.manifest.files import ManifestTooLarge, RefusedReference, read_manifest_bytes, resolve_ref
from aggregator.manifest.model import (
    DEFAULT_MAX_MANIFEST_BYTES,
    CollectionSpec,
    Location,
    Manifest,
    ManifestError,
    ManifestIssue,
    Render,
    ResourceSpec,
    TemplateSpec,
    is_url,
    namespaced_uri,
)
from aggregator.manifest.yaml_marks import KeyPath, Marked, format_path, load_marked

__all__ = ["IDENTITY", "MAX_FILES", "Reads", "apply_extends", "include_manifests", "namespaced_uri"]

IDENTITY = {"resources": "uri", "collections": "uri", "templates": "uriTemplate"}
MAX_CHAIN = 16
MAX_FILES = 64
"""Manifest files one load reads at most (the root, its bases and includes at every level): an include list naming
files again and again, or a tree of them, cannot make a load read and check without end."""


class Reads:
    """The manifest files one load has read so far, shared by every level of includes and extends, and the digest
    of their bytes in the order read.

    The digest chains: sha256 of the root's bytes, then for each further file sha256(previous digest + the file's
    sha256). A manifest of one file thus reports what `sha256sum` prints for it, and moving text from one file to
    another changes it. Paths and mtimes play no part: replicas serving the same content report the same digest.
    """

    def __init__(self, root: bytes = b"") -> None:
        self.files = 1  # the root
        self._digest = hashlib.sha256(root).digest()

    def take(self) -> bool:
        """Count one more file; False (and it must not be read) past MAX_FILES."""
        self.files += 1
        return self.files <= MAX_FILES

    def read(self, data: bytes) -> None:
        """Add the bytes of one more file read (a base or an include) to the digest."""
        self._digest = hashlib.sha256(self._digest + hashlib.sha256(data).digest()).digest()

    @property
    def digest(self) -> str:
        """The digest of every file read so far, in hex."""
        return self._digest.hex()


_TOO_MANY = f"more than {MAX_FILES} manifest files in one load (includes and extends bases at every level)"


def _inherited(options: Mapping[str, Any] | None, parent: str, ref: str) -> Mapping[str, Any] | None:
    """The fsspec options a manifest named by `ref` is read with: its parent's, when `ref` is relative to a URL."""
    return options if is_url(parent) and not is_url(ref) else None


# --- extends ---------------------------------------------------------------------------------------------------


def apply_extends(marked: Marked, here: str, chain: tuple[str, ...], options: Mapping[str, Any] | None = None,
                  max_bytes: int = DEFAULT_MAX_MANIFEST_BYTES, reads: Reads | None = None
                  ) -> tuple[Marked, list[ManifestIssue], tuple[str, ...]]:
    """`marked` (the manifest named `here`) merged over the manifest its `extends:` names, recursively.

    Returns the merged manifest, issues located in either file, and the bases' canonical names, nearest first.
    `options`: fsspec options for a base named relative to a manifest read from a URL. A base larger than
    `max_bytes` is an issue at the `extends` key, and so is one past the load's MAX_FILES (`reads`).
    """
    ref = marked.data.get("extends")
    if ref is None:
        return marked, [], ()
    if not isinstance(ref, str) or not ref:
        return marked, [marked.issue(("extends",), "extends: names one base manifest (a path or URL)")], ()
    reads = reads or Reads()
    if not reads.take():
        return marked, [marked.issue(("extends",), _TOO_MANY)], ()
    try:
        name = resolve_ref(ref, here)
        data = read_manifest_bytes(name, _inherited(options, here, ref), max_bytes)
    except ManifestTooLarge as exc:
        return marked, [marked.issue(("extends",), f"base manifest {ref!r} {exc}")], ()
    except Exception as exc:  # noqa: BLE001 - any failure to fetch is reported at the extends key
        return marked, [marked.issue(("extends",), f"cannot read base manifest {ref!r}: {_reason(exc)}")], ()
    if name in chain or len(chain) >= MAX_CHAIN:
        return marked, [marked.issue(("extends",), "extends cycle: " + " -> ".join((*chain, name)))], ()
    reads.read(data)
    text = data.decode("utf-8-sig", errors="replace")
    base, issues = load_marked(text, _display(name))
    if base is None or not isinstance(base.data, dict):
        return marked, issues, ()
    base, more, bases = apply_extends(base, name, (*chain, name), _inherited(options, here, ref), max_bytes, reads)
    merged, merge_issues = _merge_marked(base, marked)
    return merged, issues + more + merge_issues, (name, *bases)


def _merge_marked(base: Marked, over: Marked) -> tuple[Marked, list[ManifestIssue]]:
    """The overlay `over` merged over `base`, every mark copied with the file that wrote it."""
    result = Marked(over.file, None)
    issues: list[ManifestIssue] = []

    indexes: dict[tuple[int, str], _Subtree] = {}

    def under(src: Marked, table: str, src_path: KeyPath) -> list[KeyPath]:
        index = indexes.get((id(src), table))
        if index is None:
            index = indexes[(id(src), table)] = _Subtree(getattr(src, table))
        return index.under(src_path)

    def copy(src: Marked, src_path: KeyPath, dst_path: KeyPath) -> None:
        n = len(src_path)
        for table, dst_table in (("values", result.values), ("keys", result.keys)):
            positions = getattr(src, table)
            for path in under(src, table, src_path):
                new = dst_path + path[n:]
                dst_table[new] = positions[path]
                result.origins[new] = src.file_of(path)
        for attr in ("plain", "interpolated", "refused"):
            for path in under(src, attr, src_path):
                getattr(result, attr).add(dst_path + path[n:])

    def merge(b: Any, o: Any, bpath: KeyPath, opath: KeyPath, rpath: KeyPath) -> Any:
        if isinstance(b, dict) and isinstance(o, dict):
            out: dict[str, Any] = {}
            copy_self(over, opath, rpath)
            for key in list(b) + [k for k in o if k not in b]:
                if key == "extends":
                    continue
                if key in o and o[key] is None and key in b:
                    continue  # `key: null` in the overlay deletes the base's key
                if key not in o:
                    out[key] = b[key]
                    copy(base, bpath + (key,), rpath + (key,))
                elif key not in b:
                    out[key] = o[key]
                    copy(over, opath + (key,), rpath + (key,))
                elif len(rpath) == 0 and key in IDENTITY and isinstance(b[key], list) and isinstance(o[key], list):
                    out[key] = merge_entries(key, b[key], o[key], bpath + (key,), opath + (key,), rpath + (key,))
                elif len(rpath) == 0 and key == "include" and isinstance(b[key], list) and isinstance(o[key], list):
                    out[key] = b[key] + o[key]
                    for i in range(len(b[key])):
                        copy(base, bpath + (key, i), rpath + (key, i))
                    for i in range(len(o[key])):
                        copy(over, opath + (key, i), rpath + (key, len(b[key]) + i))
                    copy_self(over, opath + (key,), rpath + (key,))
                else:
                    out[key] = merge(b[key], o[key], bpath + (key,), opath + (key,), rpath + (key,))
            return out
        copy(over, opath, rpath)
        return o

    def copy_self(src: Marked, src_path: KeyPath, dst_path: KeyPath) -> None:
        """The position of a mapping itself (not its children): errors about a missing key point at it."""
        for table, dst_table in ((src.values, result.values), (src.keys, result.keys)):
            if src_path in table:
                dst_table[dst_path] = table[src_path]
                result.origins[dst_path] = src.file_of(src_path)

    def merge_entries(section: str, b: list[Any], o: list[Any], bpath: KeyPath, opath: KeyPath,
                      rpath: KeyPath) -> list[Any]:
        ident = IDENTITY[section]
        out: list[Any] = []
        origin: list[tuple[Marked, KeyPath]] = []
        index = {e.get(ident): i for i, e in enumerate(b) if isinstance(e, dict) and e.get(ident) is not None}
        for i, entry in enumerate(b):
            out.append(entry)
            origin.append((base, bpath + (i,)))
        removed: set[int] = set()
        for j, entry in enumerate(o):
            key = entry.get(ident) if isinstance(entry, dict) else None
            if key is not None and key in index:
                i = index[key]
                if entry.get("remove") is True:
                    removed.add(i)
                    continue
                out[i] = ("merge", i, j)
                continue
            if isinstance(entry, dict) and entry.get("remove") is True:
                issues.append(over.issue(opath + (j, "remove"), f"no {section} entry with {ident} {key!r} in the "
                                                                "base manifest to remove"))
                continue
            out.append(entry)
            origin.append((over, opath + (j,)))
        final: list[Any] = []
        copy_self(over, opath, rpath)
        for i, entry in enumerate(out):
            if i in removed:
                continue
            at = rpath + (len(final),)
            if isinstance(entry, tuple) and entry and entry[0] == "merge":
                _, bi, oj = entry
                final.append(merge(b[bi], o[oj], bpath + (bi,), opath + (oj,), at))
            else:
                src, src_path = origin[i]
                copy(src, src_path, at)
                final.append(entry)
        return final

    result.data = merge(base.data, over.data, (), (), ())
    return result, issues


class _Subtree:
    """The paths of one table of marks in tree order: those under a path are found in O(log n + found), so a
    merge copies each mark once rather than scanning them all for every entry."""

    def __init__(self, paths: Iterable[KeyPath]) -> None:
        self.paths = sorted(paths, key=_order)
        self.orders = [_order(p) for p in self.paths]

    def under(self, prefix: KeyPath) -> list[KeyPath]:
        n, found = len(prefix), []
        i = bisect.bisect_left(self.orders, _order(prefix))
        while i < len(self.paths) and self.paths[i][:n] == prefix:
            found.append(self.paths[i])
            i += 1
        return found


def _order(path: KeyPath) -> tuple[tuple[bool, str | int], ...]:
    # Keys and list indexes never compare with each other: indexes sort before keys at the same depth.
    return tuple((isinstance(part, str), part) for part in path)


# --- include ---------------------------------------------------------------------------------------------------

LoadText = Callable[[str, str, tuple[str, ...], Mapping[str, Any] | None], Manifest]


def include_manifests(manifest: Manifest, marked: Marked, chain: tuple[str, ...], bases: tuple[str, ...],
                      load: LoadText, options: Mapping[str, Any] | None = None,
                      max_bytes: int = DEFAULT_MAX_MANIFEST_BYTES, reads: Reads | None = None) -> Manifest:
    """`manifest` with everything its `include:` entries bring; ManifestError locating each failing include.

    `chain` ends with this manifest's canonical name and `bases` are its extends bases (from `apply_extends`): an
    entry a base wrote resolves against that base and has it on its chain. `options`: fsspec options for entries
    named relative to a manifest read from a URL. `load(text, name, chain, options)` checks and builds one
    included manifest (recursively). An included file larger than `max_bytes` is an issue at its entry, and so
    is the first past the load's MAX_FILES (`reads`; the entries after it are not read).
    """
    reads = reads or Reads()
    entries = marked.data.get("include") or []
    issues: list[ManifestIssue] = []
    sources = dict(manifest.sources)
    resources, collections, templates = list(manifest.resources), list(manifest.collections), list(manifest.templates)
    files = list(manifest.files)
    writers = {_display(b): (*chain, *bases[:k + 1]) for k, b in enumerate(bases)}
    for i, entry in enumerate(entries):
        path: KeyPath = ("include", i)
        spec: dict[str, Any] = {"path": entry} if isinstance(entry, str) else dict(entry)
        ref: str = spec.get("path") or spec["url"]  # the schema requires one of them
        # The chain of the file that wrote this entry: this manifest, or the extends base that did.
        at = writers.get(marked.file_of(path), chain)
        parent = at[-1]
        inherited = _inherited(options, parent, ref)
        if not reads.take():
            issues.append(marked.issue(path, _TOO_MANY))
            break
        try:
            name = resolve_ref(ref, parent)
            data = read_manifest_bytes(name, spec.get("options") or inherited, max_bytes)
        except ManifestTooLarge as exc:
            issues.append(marked.issue(path, f"included manifest {ref!r} {exc}"))
            continue
        except Exception as exc:  # noqa: BLE001 - any failure to fetch is reported at the include entry
            issues.append(marked.issue(path, f"cannot read included manifest {ref!r}: {_reason(exc)}"))
            continue
        pinned = spec.get("sha256")
        digest = hashlib.sha256(data).hexdigest()
        if pinned and pinned.lower() != digest:
            issues.append(marked.issue(path + ("sha256",), f"{ref!r} does not match its pin: sha256 is {digest}, "
                                                           f"the manifest pins {pinned.lower()}"))
            continue
        if name in at or len(at) >= MAX_CHAIN:
            issues.append(marked.issue(path, "include cycle: " + " -> ".join((*at, name))))
            continue
        reads.read(data)
        try:
            included = load(data.decode("utf-8-sig", errors="replace"), _display(name), (*at, name),
                            spec.get("options") or inherited)
        except ManifestError as exc:
            issues += exc.issues
            continue
        namespace = spec.get("namespace")
        where = Location(*marked.locate(path))
        for sid, source in included.sources.items():
            source = replace(source, ttl=source.ttl if source.ttl is not None else included.defaults.ttl,
                             max_bytes=source.max_bytes if source.max_bytes is not None
                             else included.defaults.max_bytes)
            new_id = f"{namespace}.{sid}" if namespace else sid
            if new_id in sources:
                issues.append(ManifestIssue(where.file, where.line, where.col, format_path(path),
                                            f"source {new_id!r} of {ref!r} is also declared by {sources[new_id].key} "
                                            f"({sources[new_id].where}); give the include a namespace"))
                continue
            sources[new_id] = replace(source, id=new_id)
        rename = _Renamer(namespace)
        resources += [rename.resource(r) for r in included.resources]
        collections += [rename.collection(c) for c in included.collections]
        templates += [rename.template(t) for t in included.templates]
        files += [f for f in included.files if f not in files]
    if issues:
        raise ManifestError(issues)
    return replace(manifest, sources=sources, resources=tuple(resources), collections=tuple(collections),
                   templates=tuple(templates), files=tuple(files))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, RefusedReference):
        return str(exc)
    if isinstance(exc, (ImportError, ValueError)) and str(exc):  # fsspec: an unknown or uninstalled protocol
        return str(exc).splitlines()[0][:200]
    return getattr(exc, "strerror", None) or type(exc).__name__


def _display(name: str) -> str:
    """How issues name an included file: relative to the working directory when that is shorter."""
    if "://" in name:
        return name
    rel = os.path.relpath(name)
    return rel if len(rel) < len(name) else name


class _Renamer:
    def __init__(self, namespace: str | None) -> None:
        self.ns = namespace

    def name(self, name: str) -> str:
        return f"{self.ns}/{name}" if self.ns else name

    @overload
    def source(self, sid: str) -> str: ...
    @overload
    def source(self, sid: str | None) -> str | None: ...

    def source(self, sid: str | None) -> str | None:
        return f"{self.ns}.{sid}" if self.ns and sid else sid

    def render(self, render: Render | None) -> Render | None:
        return render.within(self.ns) if render is not None else None

    def resource(self, r: ResourceSpec) -> ResourceSpec:
        return replace(r, uri=namespaced_uri(self.ns, r.uri), name=self.name(r.name), source=self.source(r.source),
                       render=self.render(r.render))

    def collection(self, c: CollectionSpec) -> CollectionSpec:
        return replace(c, uri=namespaced_uri(self.ns, c.uri), name=self.name(c.name), source=self.source(c.source))

    def template(self, t: TemplateSpec) -> TemplateSpec:
        return replace(t, uri_template=namespaced_uri(self.ns, t.uri_template), name=self.name(t.name),
                       source=self.source(t.source), render=self.render(t.render))
