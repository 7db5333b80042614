"""Load a manifest file: YAML with marks -> ${ENV} -> JSON Schema -> cross-references -> typed Manifest."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from aggregator.manifest.interpolate import interpolate
from aggregator.manifest.model import (
    DEFAULT_PAGE_SIZE,
    Annotations,
    CollectionSpec,
    Defaults,
    Display,
    HttpSettings,
    Icon,
    Location,
    Manifest,
    ManifestError,
    ManifestIssue,
    ResourceSpec,
    ServerSettings,
    SourceSpec,
    TemplateSpec,
)
from aggregator.manifest.units import parse_duration, parse_size
from aggregator.manifest.validate import validate
from aggregator.manifest.yaml_marks import KeyPath, Marked, format_path, load_marked

__all__ = ["load_manifest", "parse_manifest"]

COLLECTION_PLACEHOLDERS = ("path", "name", "stem", "ext")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_SQL_SCHEMES = {"sqlite", "postgresql", "postgres", "mysql", "mariadb", "mssql", "oracle"}


def load_manifest(path: str | Path, env: Mapping[str, str] | None = None) -> Manifest:
    """Read and check the manifest at `path`; ManifestError listing every located problem.

    FileNotFoundError if the file does not exist.
    """
    text = Path(path).read_text(encoding="utf-8")
    return parse_manifest(text, str(path), base=Path(path).resolve().parent, env=env)


def parse_manifest(text: str, file: str, base: Path, env: Mapping[str, str] | None = None) -> Manifest:
    """Check manifest `text` (named `file` in errors); relative local source paths resolve against `base`."""
    marked, issues = load_marked(text, file)
    if marked is None:
        raise ManifestError(issues)
    # Duplicate keys and unset variables do not stop the later checks: report everything at once.
    issues += interpolate(marked, os.environ if env is None else env)
    # A value already reported (bad tag, unset variable) would only echo as a schema error: leave those out.
    reported = {i.key for i in issues}
    schema_issues = [i for i in validate(marked) if not _within_reported(i.key, reported)]
    if issues or schema_issues:
        raise ManifestError(issues + schema_issues)
    builder = _Builder(marked, Path(file), base)
    manifest = builder.build()
    if builder.issues:
        raise ManifestError(builder.issues)
    return manifest


def _network_allowance(value: bool | list[str]) -> bool | tuple[str, ...]:
    return tuple(value) if isinstance(value, list) else bool(value)


def _within_reported(key: str, reported: set[str]) -> bool:
    return any(key == r or key.startswith((r + ".", r + "[")) for r in reported)


class _Builder:
    """Turns a schema-valid tree into the typed model, checking what a schema cannot (references, paths)."""

    def __init__(self, marked: Marked, file: Path, base: Path) -> None:
        self.marked = marked
        self.file = file
        self.base = base
        self.issues: list[ManifestIssue] = []

    def fail(self, path: KeyPath, message: str) -> None:
        self.issues.append(self.marked.issue(path, message))

    def at(self, path: KeyPath) -> Location:
        line, col = self.marked.where(path)
        return Location(self.marked.file, line, col)

    def build(self) -> Manifest:
        data = self.marked.data
        server = data["server"]
        defaults = self.base_defaults = self.defaults(data.get("defaults", {}))
        sources = {sid: self.source(sid, spec) for sid, spec in data.get("sources", {}).items()}
        return Manifest(
            path=self.file,
            server=ServerSettings(server["name"], server.get("title"), server.get("version"),
                                  server.get("instructions"), server.get("pageSize", DEFAULT_PAGE_SIZE),
                                  server.get("maxSubscriptions", 1000), self.http(server.get("http", {}))),
            defaults=defaults,
            sources=sources,
            resources=tuple(self.resource(i, r, sources) for i, r in enumerate(data.get("resources", []))),
            collections=tuple(self.collection(i, c, sources) for i, c in enumerate(data.get("collections", []))),
            templates=tuple(self.template(i, t, sources) for i, t in enumerate(data.get("templates", []))),
        )

    def http(self, spec: dict[str, Any]) -> HttpSettings:
        return HttpSettings(tuple(spec.get("allowedHosts", ())), tuple(spec.get("allowedOrigins", ())),
                            parse_size(spec.get("maxBodyBytes", HttpSettings().max_body_bytes)))

    def defaults(self, spec: dict[str, Any]) -> Defaults:
        base = Defaults()
        return Defaults(
            ttl=parse_duration(spec.get("ttl", base.ttl)),
            max_bytes=parse_size(spec.get("maxBytes", base.max_bytes)),
            cache_bytes=parse_size(spec.get("cacheBytes", base.cache_bytes)),
            timeout=parse_duration(spec.get("timeout", base.timeout)),
            max_concurrency=spec.get("maxConcurrency", base.max_concurrency),
            stale_if_error=parse_duration(spec.get("staleIfError", base.stale_if_error)),
        )

    def source(self, sid: str, spec: dict[str, Any]) -> SourceSpec:
        path: KeyPath = ("sources", sid)
        url = spec["url"]
        match = _SCHEME.match(url)
        scheme = match.group(1).lower() if match else None
        if scheme is None or scheme == "file":
            local = unquote(urlsplit(url).path) if match else url
            protocol, url = "file", str((self.base / os.path.expanduser(local)).resolve())
        elif scheme.split("+", 1)[0] in _SQL_SCHEMES:
            protocol = "sql"
            if url.startswith("sqlite:///") and not url.startswith("sqlite:////") and url != "sqlite:///:memory:":
                url = "sqlite:///" + str((self.base / url[len("sqlite:///"):]).resolve())
        elif scheme.startswith("git+"):
            # git+file://./repo, git+https://host/repo.git: the repository; `ref` picks the tree.
            protocol, url = "git", url[len("git+"):]
            if url.startswith("file://"):
                url = str((self.base / os.path.expanduser(unquote(url[len("file://"):]))).resolve())
        else:
            protocol = scheme
        return SourceSpec(
            id=sid, url=url, protocol=protocol, where=self.at(path), key=format_path(path),
            ttl=parse_duration(spec["ttl"]) if "ttl" in spec else None,
            max_bytes=parse_size(spec["maxBytes"]) if "maxBytes" in spec else None,
            options=spec.get("options", {}), description=spec.get("description"),
            headers=spec.get("headers", {}), ref=spec.get("ref"),
            timeout=parse_duration(spec.get("timeout", self.base_defaults.timeout)),
            max_concurrency=spec.get("maxConcurrency", self.base_defaults.max_concurrency),
            stale_if_error=parse_duration(spec.get("staleIfError", self.base_defaults.stale_if_error)),
            allow_private_network=_network_allowance(spec.get("allowPrivateNetwork", False)),
            poll=parse_duration(spec["poll"]) if "poll" in spec else None,
            tables=tuple(spec.get("tables", ())), sample_rows=spec.get("sampleRows", 0),
            row_limit=spec.get("rowLimit", 1000), checksum=spec.get("checksum"),
        )

    def check_source(self, path: KeyPath, sid: str | None, sources: Mapping[str, SourceSpec]) -> None:
        if sid is not None and sid not in sources:
            known = ", ".join(sorted(sources)) or "none declared"
            self.fail(path + ("source",), f"unknown source {sid!r} (sources: {known})")

    def check_relative(self, path: KeyPath, value: str, what: str) -> None:
        segments = value.replace("\\", "/").split("/")
        if value.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", value) or ".." in segments:
            self.fail(path, f"{what} {value!r} must stay inside its source: no absolute paths or '..' segments")

    def display(self, spec: dict[str, Any]) -> Display:
        icons = tuple(Icon(i["src"], i.get("mimeType"), tuple(i["sizes"]) if "sizes" in i else None, i.get("theme"))
                      for i in spec.get("icons", ())) or None
        a = spec.get("annotations")
        annotations = None
        if a is not None:
            annotations = Annotations(tuple(a["audience"]) if "audience" in a else None, a.get("priority"),
                                      a.get("lastModified"))
        return Display(spec.get("title"), spec.get("description"), spec.get("mimeType"), icons, annotations)

    def resource(self, i: int, spec: dict[str, Any], sources: Mapping[str, SourceSpec]) -> ResourceSpec:
        path: KeyPath = ("resources", i)
        self.check_source(path, spec.get("source"), sources)
        if "path" in spec:
            self.check_relative(path + ("path",), spec["path"], "path")
        return ResourceSpec(spec["uri"], spec["name"], self.display(spec), self.at(path), format_path(path),
                            spec.get("source"), spec.get("path"), spec.get("text"), spec.get("size"))

    def collection(self, i: int, spec: dict[str, Any], sources: Mapping[str, SourceSpec]) -> CollectionSpec:
        path: KeyPath = ("collections", i)
        self.check_source(path, spec["source"], sources)
        self.check_relative(path + ("glob",), spec["glob"], "glob")
        for j, pattern in enumerate(spec.get("exclude", [])):
            self.check_relative(path + ("exclude", j), pattern, "exclude glob")
        for key in ("uri", "name", "title"):
            if key in spec:
                for placeholder in _PLACEHOLDER.findall(spec[key]):
                    if placeholder not in COLLECTION_PLACEHOLDERS:
                        self.fail(path + (key,), f"unknown placeholder {{{placeholder}}}; a collection pattern may "
                                                 f"use {{path}}, {{name}}, {{stem}} and {{ext}}")
        return CollectionSpec(spec["source"], spec["glob"], spec["uri"], spec.get("name", "{path}"),
                              self.display(spec), self.at(path), format_path(path), tuple(spec.get("exclude", ())))

    def template(self, i: int, spec: dict[str, Any], sources: Mapping[str, SourceSpec]) -> TemplateSpec:
        from aggregator.templates import TemplateSyntaxError, UriTemplate

        path: KeyPath = ("templates", i)
        self.check_source(path, spec["source"], sources)
        source = sources.get(spec["source"])
        if "query" in spec and source is not None and source.protocol != "sql":
            self.fail(path + ("query",), f"query: needs a SQL source; {spec['source']!r} is {source.protocol}")
        if "path" in spec:
            self.check_relative(path + ("path",), spec["path"], "path")
        try:
            variables = UriTemplate.parse(spec["uriTemplate"]).variables
        except TemplateSyntaxError:
            variables = ()  # already reported by the schema's uri-template format
        for placeholder in _PLACEHOLDER.findall(spec.get("path", "")):
            if placeholder not in variables:
                known = ", ".join(variables) or "none"
                self.fail(path + ("path",), f"placeholder {{{placeholder}}} is not a variable of the uriTemplate "
                                            f"(variables: {known})")
        if "query" in spec:
            for parameter in re.findall(r"(?<![:\w]):([A-Za-z_]\w*)", spec["query"]):
                if parameter not in variables:
                    self.fail(path + ("query",), f"parameter :{parameter} is not a variable of the uriTemplate "
                                                 f"(variables: {', '.join(variables) or 'none'})")
        return TemplateSpec(spec["uriTemplate"], spec["name"], spec["source"], spec.get("path"), self.display(spec),
                            self.at(path), format_path(path), spec.get("query"), spec.get("format", "json"))
