"""What a JSON Schema cannot say: references between entries, placeholders, paths kept inside their source,
and entries that would shadow each other.

The checks read the raw tree defensively, so they run (and report) even where the schema found problems.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from aggregator.manifest.model import ManifestIssue
from aggregator.manifest.placeholders import FILE_PLACEHOLDERS, PLACEHOLDER
from aggregator.sources.registry import source_protocol
from aggregator.sources.registry import kind_for_url
from aggregator.manifest.yaml_marks import KeyPath, Marked

__all__ = ["check_references"]

_SQL_PARAMETER = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")


def check_references(marked: Marked) -> list[ManifestIssue]:
    """Every cross-reference, placeholder, path and duplicate problem in `marked.data`, located."""
    data = marked.data if isinstance(marked.data, dict) else {}
    return list(_Checker(marked, data).run())


class _Checker:
    """One pass over the tree; each method yields the issues of one kind of check."""

    def __init__(self, marked: Marked, data: dict[str, Any]) -> None:
        self.marked = marked
        self.data = data
        sources = data.get("sources")
        self.sources: dict[str, Any] = sources if isinstance(sources, dict) else {}

    def issue(self, path: KeyPath, message: str) -> ManifestIssue:
        return self.marked.issue(path, message)

    def run(self) -> Iterator[ManifestIssue]:
        for i, entry in self.entries("resources"):
            yield from self.source_ref(("resources", i), entry)
            yield from self.inside_source(("resources", i, "path"), entry.get("path"), "path")
            yield from self.kind_path(("resources", i, "path"), entry, "path", entry.get("path"))
        yield from self.duplicates("resources", "uri")
        for i, entry in self.entries("collections"):
            yield from self.source_ref(("collections", i), entry)
            yield from self.inside_source(("collections", i, "glob"), entry.get("glob"), "glob")
            yield from self.kind_path(("collections", i, "glob"), entry, "glob", entry.get("glob"))
            excludes = entry.get("exclude")
            for j, pattern in enumerate(excludes if isinstance(excludes, list) else []):
                yield from self.inside_source(("collections", i, "exclude", j), pattern, "exclude glob")
                yield from self.kind_path(("collections", i, "exclude", j), entry, "exclude", pattern)
            yield from self.collection_patterns(("collections", i), entry)
        for i, entry in self.entries("templates"):
            yield from self.source_ref(("templates", i), entry)
            yield from self.inside_source(("templates", i, "path"), entry.get("path"), "path")
            yield from self.kind_path(("templates", i, "path"), entry, "template path", entry.get("path"))
            yield from self.template_variables(("templates", i), entry)
        yield from self.duplicates("templates", "uriTemplate")
        yield from self.literal_tokens()

    def literal_tokens(self) -> Iterator[ManifestIssue]:
        """A static token (or the cluster's secret) written into the manifest would sit in version control and in
        every copy of the file."""
        server = self.data.get("server")
        cluster = server.get("cluster") if isinstance(server, dict) else None
        secret: KeyPath = ("server", "cluster", "secret")
        if isinstance(cluster, dict) and isinstance(cluster.get("secret"), str) and \
                secret not in self.marked.interpolated:
            yield self.issue(secret, "the cluster's secret may not be written into the manifest: take it from the "
                                   "environment (secret: ${CLUSTER_SECRET})")
        auth = server.get("auth") if isinstance(server, dict) else None
        tokens = auth.get("tokens") if isinstance(auth, dict) else None
        for i, token in enumerate(tokens if isinstance(tokens, list) else []):
            path = ("server", "auth", "tokens", i, "token")
            if isinstance(token, dict) and isinstance(token.get("token"), str) and path not in self.marked.interpolated:
                yield self.issue(path, "a token may not be written into the manifest: take it from the environment "
                                       "(token: ${DOCS_TOKEN}) or give its digest (sha256: ...)")

    def entries(self, section: str) -> Iterator[tuple[int, dict[str, Any]]]:
        items = self.data.get(section)
        for i, entry in enumerate(items if isinstance(items, list) else []):
            if isinstance(entry, dict):
                yield i, entry

    def source_ref(self, path: KeyPath, entry: dict[str, Any]) -> Iterator[ManifestIssue]:
        sid = entry.get("source")
        if isinstance(sid, str) and sid not in self.sources:
            known = ", ".join(sorted(self.sources)) or "none are declared under sources:"
            import difflib  # a mistake's suggestion: a valid manifest never needs it

            close = difflib.get_close_matches(sid, list(self.sources), n=1, cutoff=0.6)
            guess = f" (did you mean {close[0]!r}?)" if close else ""
            yield self.issue(path + ("source",), f"unknown source {self.marked.quote(path + ('source',), sid)}"
                                                 f"{guess}; sources: {known}")

    def inside_source(self, path: KeyPath, value: Any, what: str) -> Iterator[ManifestIssue]:
        """A glob or path may never leave its source: no absolute paths, no `..` segments."""
        if not isinstance(value, str):
            return
        absolute = value.startswith(("/", "\\")) or bool(_DRIVE.match(value))
        if absolute or ".." in re.split(r"[\\/]", value):
            problem = "is absolute" if absolute else "has a '..' segment"
            yield self.issue(path, f"{what} {self.marked.quote(path, value)} {problem}; it must stay inside its "
                                   "source, relative to the source's root")

    def kind_path(self, path: KeyPath, entry: dict[str, Any], role: str, value: Any) -> Iterator[ManifestIssue]:
        """What the kind of the entry's source says of `value`, the glob or path at `path` (an mcp source's paths
        are what follows its prefix)."""
        sid = entry.get("source")
        keys = self.sources.get(sid) if isinstance(sid, str) else None
        if isinstance(sid, str) and isinstance(keys, dict) and isinstance(keys.get("url"), str) \
                and isinstance(value, str):
            problem = kind_for_url(keys["url"]).path_issue(sid, keys, role, value)
            if problem:
                yield self.issue(path, problem)

    def collection_patterns(self, path: KeyPath, entry: dict[str, Any]) -> Iterator[ManifestIssue]:
        allowed = ", ".join(f"{{{p}}}" for p in FILE_PLACEHOLDERS)
        for key in ("uri", "name", "title"):
            pattern = entry.get(key)
            if not isinstance(pattern, str):
                continue
            for placeholder in dict.fromkeys(PLACEHOLDER.findall(pattern)):
                if placeholder not in FILE_PLACEHOLDERS:
                    yield self.issue(path + (key,), f"unknown placeholder {{{placeholder}}}; a collection "
                                                    f"pattern may use {allowed}")
        uri = entry.get("uri")
        if isinstance(uri, str) and not {"path", "name", "stem"} & set(PLACEHOLDER.findall(uri)):
            yield self.issue(path + ("uri",), "the uri pattern must use {path} (or {name} or {stem}) so that "
                                              "every file gets a URI of its own")

    def template_variables(self, path: KeyPath, entry: dict[str, Any]) -> Iterator[ManifestIssue]:
        variables = _template_variables(entry.get("uriTemplate"))
        if variables is None:
            return  # no template to compare with: the schema has reported why
        known = ", ".join(variables) or "none"
        target = entry.get("path")
        for placeholder in dict.fromkeys(PLACEHOLDER.findall(target if isinstance(target, str) else "")):
            if placeholder not in variables:
                hint = (f"; write {{{placeholder[1:]}}}: the operator belongs in the uriTemplate"
                        if placeholder[:1] in "+#./;?&" and placeholder[1:] in variables else "")
                yield self.issue(path + ("path",), f"placeholder {{{placeholder}}} is not a variable of the "
                                                   f"uriTemplate (its variables: {known}){hint}")
        values = entry.get("values")
        for name in values if isinstance(values, dict) else ():
            if name not in variables:
                yield self.issue(path + ("values", name), f"{name!r} is not a variable of the uriTemplate "
                                                          f"(its variables: {known})")
        query = entry.get("query")
        if isinstance(query, str):
            sid = entry.get("source")
            spec = self.sources.get(sid) if isinstance(sid, str) else None
            url = spec.get("url") if isinstance(spec, dict) else None
            if isinstance(url, str) and not kind_for_url(url).runs_queries:
                yield self.issue(path + ("query",), f"query needs a SQL source; source {sid!r} is "
                                                    f"{source_protocol(url)}")
            for parameter in dict.fromkeys(_SQL_PARAMETER.findall(query)):
                if parameter not in variables:
                    yield self.issue(path + ("query",), f"parameter :{parameter} is not a variable of the "
                                                        f"uriTemplate (its variables: {known})")

    def duplicates(self, section: str, key: str) -> Iterator[ManifestIssue]:
        """Two entries answering the same URI: the second would silently shadow the first."""
        first: dict[str, int] = {}
        for i, entry in self.entries(section):
            value = entry.get(key)
            if not isinstance(value, str):
                continue
            if value in first:
                line, _ = self.marked.where((section, first[value], key))
                yield self.issue((section, i, key), f"duplicate {key} {self.marked.quote((section, i, key), value)}: "
                                                    f"{section}[{first[value]}] (line {line}) already uses it")
            else:
                first[value] = i


def _template_variables(text: Any) -> tuple[str, ...] | None:
    # Imported here: the template engine is only needed once a manifest declares templates.
    from aggregator.templates import TemplateSyntaxError, UriTemplate

    if not isinstance(text, str):
        return None
    try:
        return UriTemplate.parse(text).variables
    except TemplateSyntaxError:
        return None
