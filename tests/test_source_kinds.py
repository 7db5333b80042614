"""Source kinds: each declares its name, URL schemes and own keys; the registry (built-ins, the entry-point group
`aggregator.source_kinds`, register_source_kind) picks a source's kind by its URL; the schema is assembled from the
kinds; validating and printing the schema need none of the kinds' extras."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aggregator.diff import diff_sources
from aggregator.manifest import ManifestError, load_manifest, load_schema, schema_text
from aggregator.manifest.schema_build import PUBLISHED, build_schema, dump_schema, published_schema
from aggregator.sources import Setting, SourceError, SourceKind, kind_for_url, register_source_kind, source_kinds
from aggregator.sources.registry import builtin_kinds, unregister_source_kind
from tests.conftest import write_manifest

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("aiohttp", "sqlalchemy", "pygit2", "s3fs", "botocore", "psycopg", "pymysql", "jwt", "prometheus_client")


def without_modules(*modules: str) -> str:
    """Python code that makes importing `modules` fail (as when their extra is not installed), then runs the CLI."""
    return (f"import sys\nfor m in {list(modules)!r}: sys.modules[m] = None\n"
            "from aggregator.cli import main\nraise SystemExit(main())\n")


def run(*args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)


class Ftp(SourceKind):
    """A kind for tests: claims ftp:// and https:// and takes one key of its own."""

    schemes = frozenset({"ftp", "https"})
    url_help = "ftp://host/folder"
    settings = {"passive": Setting({"description": "ftp sources: passive mode.", "type": "boolean"}, True)}


@pytest.fixture
def ftp() -> Iterator[SourceKind]:
    register_source_kind("ftp", Ftp)
    try:
        yield source_kinds()["ftp"]
    finally:
        unregister_source_kind("ftp")


def test_the_published_schema_is_assembled_from_the_builtin_kinds() -> None:
    """schemas/manifest.schema.json is what the built-in kinds declare: regenerate it with
    `python -m aggregator.manifest.schema_build --write`."""
    assert dump_schema(build_schema(published_schema(), builtin_kinds())) == PUBLISHED.read_text(encoding="utf-8")
    assert schema_text() == PUBLISHED.read_text(encoding="utf-8")  # no other kind registered here
    printed = run("aggregator.manifest.schema_build")
    assert printed.returncode == 0 and printed.stderr == "" and printed.stdout == PUBLISHED.read_text(encoding="utf-8")


def test_each_builtin_kind_owns_its_keys() -> None:
    owned = {kind.name: list(kind.settings) for kind in builtin_kinds()}
    assert owned == {"file": [], "http": ["headers", "allowPrivateNetwork"], "git": ["ref"],
                     "sql": ["tables", "sampleRows", "rowLimit", "checksum"],
                     "mcp": ["command", "env", "headers", "oauth", "allowPrivateNetwork", "prefix", "namespace",
                             "maxEntries", "maxMessageBytes"], "fsspec": ["options"]}


@pytest.mark.parametrize(("url", "kind", "protocol"), [
    ("./docs", "file", "file"), ("/srv/docs", "file", "file"), ("~/docs", "file", "file"),
    ("file:///srv/docs", "file", "file"), ("FILE://./docs", "file", "file"),
    ("https://example.com/base", "http", "https"), ("http://example.com/", "http", "http"),
    ("git+https://example.com/r.git", "git", "git"), ("git+file://./repo", "git", "git"),
    ("sqlite:///app.db", "sql", "sql"), ("postgresql+psycopg://u@h/db", "sql", "sql"), ("mysql://h/db", "sql", "sql"),
    ("s3://bucket/prefix", "fsspec", "s3"), ("memory://x", "fsspec", "memory"), ("gcs://b", "fsspec", "gcs"),
    ("nosuchproto://x", "fsspec", "nosuchproto"),
])
def test_the_url_picks_the_kind(tmp_path: Path, url: str, kind: str, protocol: str) -> None:
    m = load_manifest(write_manifest(tmp_path, f"version: 1\nserver: {{name: s}}\nsources: {{s: {{url: '{url}'}}}}\n"))
    assert (m.sources["s"].kind, m.sources["s"].protocol) == (kind, protocol)
    assert kind_for_url(url).name == kind


def test_a_key_of_another_kind_is_refused_where_it_is_written(tmp_path: Path) -> None:
    """The schema takes every kind's keys on a source (it cannot tell kinds apart by url); the loader refuses a key
    the source's kind does not have. (It used to be ignored silently.)"""
    path = write_manifest(tmp_path, """
        version: 1
        server: {name: s}
        sources:
          bucket: {url: 's3://b/x', tables: [orders]}
          docs: {url: ./docs, headers: {A: b}, options: {anon: true}}
          web: {url: 'https://example.com/', ref: main}
          db: {url: 'sqlite:///app.db', tables: [orders], rowLimit: 5}
        """)
    with pytest.raises(ManifestError) as caught:
        load_manifest(path)
    assert [(i.line, i.col, i.key, i.message) for i in caught.value.issues] == [
        (4, 29, "sources.bucket.tables", "'tables' is a setting of sql sources only; this source's kind (from its "
                                         "url) is fsspec (s3)"),
        (5, 23, "sources.docs.headers", "'headers' is a setting of http and mcp sources only; this source's kind "
                                        "(from its url) is file"),
        (5, 40, "sources.docs.options", "'options' is a setting of fsspec sources only; this source's kind (from "
                                        "its url) is file"),
        (6, 38, "sources.web.ref", "'ref' is a setting of git sources only; this source's kind (from its url) is "
                                   "http (https)"),
    ]


def test_a_registered_kind_claims_its_schemes_and_its_keys_join_the_schema(tmp_path: Path, ftp: SourceKind) -> None:
    assert kind_for_url("ftp://host/x").name == "ftp"
    assert kind_for_url("https://example.com/").name == "ftp"  # registered later: its claim wins
    source = load_schema()["$defs"]["source"]
    assert source["properties"]["passive"]["description"] == "ftp sources: passive mode."
    assert "ftp://host/folder" in source["properties"]["url"]["description"]
    m = load_manifest(write_manifest(tmp_path, "version: 1\nserver: {name: s}\nsources:\n"
                                               "  f: {url: 'ftp://h/x', passive: false}\n  g: {url: 'ftp://h/y'}\n"))
    assert (m.sources["f"].kind, m.sources["f"].settings, m.sources["g"].settings) == (
        "ftp", {"passive": False}, {"passive": True})
    with pytest.raises(ManifestError, match="'passive' is a setting of ftp sources only"):
        load_manifest(write_manifest(tmp_path, "version: 1\nserver: {name: s}\nsources: {d: {url: ./d, passive: no}}\n",
                                     name="other.yaml"))
    unregister_source_kind("ftp")
    assert kind_for_url("https://example.com/").name == "http"
    assert schema_text() == PUBLISHED.read_text(encoding="utf-8")
    with pytest.raises(ManifestError, match="unknown key 'passive'"):
        load_manifest(tmp_path / "manifest.yaml")


def test_a_kind_that_cannot_be_imported_is_left_out_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    register_source_kind("broken", "no_such_module_anywhere:Kind")
    try:
        with caplog.at_level(logging.WARNING):
            kinds = source_kinds()
        assert "broken" not in kinds and {"file", "http", "git", "sql", "fsspec"} <= set(kinds)
        assert "source kind 'broken' (no_such_module_anywhere:Kind) cannot be loaded" in caplog.text
    finally:
        unregister_source_kind("broken")


def test_a_missing_extra_is_located_and_names_what_to_install(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, "version: 1\nserver: {name: s}\nsources:\n"
                                        "  web: {url: 'http://127.0.0.1:9/', allowPrivateNetwork: true}\n")
    result = run("validate", str(manifest), code=without_modules("aiohttp"))
    assert result.returncode == 1, result.stderr  # invalid: a source cannot open
    assert (f"{manifest}:4:3: sources.web.url: http sources need aiohttp: pip install 'mcp-aggregator[http]' "
            "(in a checkout: pip install -e '.[http]')") in result.stderr


def test_validate_and_schema_need_no_extra() -> None:
    """What `make validate-samples` does in the runtime-only venv: kinds declare their keys without importing
    their dependencies."""
    printed = run("schema", code=without_modules(*EXTRAS))
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == PUBLISHED.read_text(encoding="utf-8")
    # Every sample in one process with the extras blocked (a process each cost 13 starts): the imports are the
    # subject, and what one validate imported stays imported for the next, as blocked as before.
    samples = [str(sample) for sample in sorted((ROOT / "sample-configs").glob("*.yaml"))]
    assert samples
    checked = run(*samples, code=without_modules(*EXTRAS).replace(
        "raise SystemExit(main())\n",
        "failed = [m for m in sys.argv[1:] if main(['validate', '--offline', m]) != 0]\n"
        "print('FAILED', failed, file=sys.stderr)\nraise SystemExit(1 if failed else 0)\n"))
    assert checked.returncode == 0, (checked.stdout, checked.stderr[-4000:])
    assert "FAILED []" in checked.stderr


def test_diff_asks_the_kind_which_settings_changed(tmp_path: Path) -> None:
    text = "version: 1\nserver: {{name: s}}\nsources:\n  db: {{url: 'sqlite:///a.db', {db}}}\n  b: {{url: '{b}'}}\n"
    old = load_manifest(write_manifest(tmp_path, text.format(db="rowLimit: 5", b="s3://x/y"), name="old.yaml"))
    new = load_manifest(write_manifest(tmp_path, text.format(db="rowLimit: 6, tables: [t]", b="https://x/y"),
                                       name="new.yaml"))
    assert diff_sources(old, new) == [("b", ["url"]), ("db", ["tables", "rowLimit"])]
    assert diff_sources(old, old) == []
    assert json.loads(json.dumps(diff_sources(new, old))) == [["b", ["url"]], ["db", ["tables", "rowLimit"]]]


def test_a_kind_from_another_package_names_its_own_extra() -> None:
    class Zip(SourceKind):
        name, source, extra, distribution = "zip", "no_such_backend_module:ZipSource", "zip", "aggregator-zip"

    with pytest.raises(SourceError) as caught:
        Zip().load()
    assert str(caught.value) == ("zip sources need no_such_backend_module: pip install 'aggregator-zip[zip]' "
                                 "(in a checkout: pip install -e '.[zip]')")
