"""`aggregator validate` catches what would break or surprise at serve time: empty collections, unreachable
sources, files an explicit resource names that are not there, unused sources and renders that cannot render."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.command import aggregator
from tests.conftest import write_manifest
from tests.isolation import free_port

TOKEN = "tok-5e3c7a91"
PASSWORD = "hunter2-9d1f"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """`aggregator ARGS` in this process (tests/command.py; test_cli runs `validate` as a process)."""
    return aggregator(*args)


def closed_port() -> int:
    """A loopback port nothing listens on."""
    return free_port()


def test_a_collection_matching_nothing_is_a_located_warning_and_strict_fails(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n")
    manifest = write_manifest(tmp_path, """
        version: 1
        server: {name: t}
        sources:
          docs: {url: ./docs}
        collections:
          - {source: docs, glob: "**/*.md", uri: "docs://{path}", name: "{stem}"}
          - {source: docs, glob: "**/*.txt", uri: "text://{path}", name: "{stem}"}
        """)
    plain = run("validate", str(manifest))
    assert plain.returncode == 0, plain.stderr
    assert f"{manifest}:7:5: collections[1]: warning: glob '**/*.txt' matches no file in source 'docs'" in plain.stderr
    assert "collections[0]" not in plain.stderr
    assert "1 warning" in plain.stdout
    strict = run("validate", "--strict", str(manifest))
    assert strict.returncode == 1 and "collections[1]: warning: glob '**/*.txt'" in strict.stderr
    report = json.loads(run("validate", "--format", "json", str(manifest)).stdout)
    assert report["valid"] is True and [w["key"] for w in report["warnings"]] == ["collections[1]"]
    assert report["warnings"][0]["line"] == 7


def _unreachable_manifest(tmp_path: Path, optional: bool) -> Path:
    (tmp_path / "docs").mkdir(exist_ok=True)
    (tmp_path / "docs" / "a.md").write_text("# A\n")
    flag = ", optional: true" if optional else ""
    return write_manifest(tmp_path, f"""
        version: 1
        server: {{name: t}}
        sources:
          docs: {{url: ./docs{flag}}}
          refused: {{url: "http://127.0.0.1:{closed_port()}/base/", allowPrivateNetwork: true,
                    headers: {{Authorization: "Bearer {TOKEN}"}}{flag}}}
          nowhere: {{url: "https://no-such-host.invalid/"{flag}}}
          crm: {{url: "postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1:5432/no_such_db_15", timeout: 5s{flag}}}
        resources:
          - {{uri: "docs://missing", name: missing, source: docs, path: missing.md}}
          - {{uri: "web://a", name: a, source: refused, path: a.md}}
          - {{uri: "web://b", name: b, source: nowhere, path: b.md}}
        templates:
          - {{uriTemplate: "crm://{{id}}", name: customer, source: crm, query: "select 1"}}
        """)


def test_unreachable_sources_and_missing_files_are_located_errors_unless_optional(tmp_path: Path) -> None:
    manifest = _unreachable_manifest(tmp_path, optional=False)
    done = run("validate", str(manifest))
    assert done.returncode == 1, done.stderr
    err = done.stderr
    port = err.split("connection refused 127.0.0.1:")[1].split()[0] if "connection refused" in err else "?"
    assert f"{manifest}:5:3: sources.refused: cannot reach HTTP source http://127.0.0.1:{port}: " \
           f"connection refused 127.0.0.1:{port}" in err, err
    assert f"{manifest}:7:3: sources.nowhere: cannot reach HTTP source https://no-such-host.invalid: " \
           "DNS name not resolved: no-such-host.invalid" in err, err
    assert f"{manifest}:8:3: sources.crm: cannot reach database " in err and 'database "no_such_db_15" does not ' \
           "exist" in err, err
    assert f"{manifest}:10:5: resources[0]: file 'missing.md' not found in source 'docs'" in err, err
    assert TOKEN not in err + done.stdout and PASSWORD not in err + done.stdout
    assert "WARNING" not in err  # each problem once, located; not again as a log line
    # --offline opens nothing: the manifest itself is fine.
    assert run("validate", "--offline", str(manifest)).returncode == 0


def test_optional_sources_are_warnings_and_serving_still_starts(tmp_path: Path) -> None:
    manifest = _unreachable_manifest(tmp_path, optional=True)
    done = run("validate", str(manifest))
    assert done.returncode == 0, done.stderr
    assert "sources.refused: warning: cannot reach HTTP source" in done.stderr
    assert "resources[0]: warning: file 'missing.md' not found in source 'docs'" in done.stderr
    assert run("validate", "--strict", str(manifest)).returncode == 1
    listed = run("list", str(manifest))  # what serve does at start: keeps going, logs a warning
    assert listed.returncode == 0 and "web://a" in listed.stdout
    assert TOKEN not in listed.stderr and PASSWORD not in listed.stderr


def test_an_optional_source_that_cannot_open_is_skipped_and_the_rest_serves(tmp_path: Path) -> None:
    """Any kind, not only SQL: a folder that is not there, marked optional, is one located warning saying it is
    skipped, and `list` (what serve does at start) serves the rest; unmarked, it refuses the manifest, located."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n")
    text = """
        version: 1
        server: {name: t}
        sources:
          docs: {url: ./docs}
          gone: {url: ./nope%s}
        collections:
          - {source: docs, glob: "*.md", uri: "docs://{path}"}
          - {source: gone, glob: "*.md", uri: "gone://{path}"}
        """
    manifest = write_manifest(tmp_path, text % ", optional: true")
    done = run("validate", str(manifest))
    assert done.returncode == 0, done.stderr
    assert done.stderr == (f"{manifest}:5:3: sources.gone: warning: cannot open source 'gone': folder "
                           f"'{tmp_path / 'nope'}' does not exist or is not a folder; skipped (optional: true): the "
                           "other sources serve without it\n")
    listed = run("list", str(manifest))
    assert listed.returncode == 0 and listed.stdout.split("\t")[0] == "docs://a.md", listed
    assert "sources.gone: cannot open source 'gone'" in listed.stderr and "until a reload opens it" in listed.stderr

    required = write_manifest(tmp_path, text % "", "required.yaml")
    for command in ("validate", "list"):
        done = run(command, str(required))
        assert done.returncode == 1 and done.stderr == (
            f"{required}:5:3: sources.gone.url: folder '{tmp_path / 'nope'}' does not exist or is not a folder\n"), done


def test_a_source_no_entry_uses_is_a_located_warning(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n")
    manifest = write_manifest(tmp_path, """
        version: 1
        server: {name: t}
        sources:
          docs: {url: ./docs}
          spare: {url: ./docs}
        resources:
          - {uri: "docs://a", name: a, source: docs, path: a.md}
        """)
    for extra in ((), ("--offline",)):
        done = run("validate", *extra, str(manifest))
        assert done.returncode == 0, done.stderr
        assert f"{manifest}:5:3: sources.spare: warning: source 'spare' is used by no resource, collection or " \
               "template" in done.stderr
        assert "sources.docs" not in done.stderr
        assert run("validate", "--strict", *extra, str(manifest)).returncode == 1


def test_validate_renders_each_static_render_once(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, """
        version: 1
        server: {name: t}
        resources:
          - {uri: "note://a", name: a, text: "alpha"}
          - {uri: "digest://ok", name: ok, render: "{{ read('note://a') }}"}
          - uri: digest://typo
            name: typo
            render: "Hello {{ nmae }}"
          - {uri: "digest://gone", name: gone, render: "{{ read('note://nope') }}"}
        templates:
          - {uriTemplate: "echo://{name}", name: echo, render: "{{ nmae }}"}
        """)
    done = run("validate", str(manifest))
    assert done.returncode == 1, done.stderr
    assert f"{manifest}:6:5: resources[2]: render failed: UndefinedError: 'nmae' is undefined" in done.stderr
    assert f"{manifest}:9:5: resources[3]: render failed: " in done.stderr and "note://nope" in done.stderr
    assert "resources[1]" not in done.stderr and "templates[0]" not in done.stderr  # templates need values
    report = json.loads(run("validate", "--format", "json", str(manifest)).stdout)
    assert report["valid"] is False and {e["key"] for e in report["errors"]} == {"resources[2]", "resources[3]"}


def test_an_s3_bucket_that_is_missing_or_unreachable_is_a_located_error(tmp_path: Path) -> None:
    import pytest

    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = '{key: test-key, secret: "s3-secret-4b1e", endpoint_url: "%s"}'
        manifest = write_manifest(tmp_path, f"""
            version: 1
            server: {{name: t}}
            sources:
              gone: {{url: "s3://no-such-bucket-15/x", options: {options % f"http://{host}:{port}"}}}
              down: {{url: "s3://bucket/x", timeout: 3s, options: {options % f"http://127.0.0.1:{closed_port()}"}}}
            templates:
              - {{uriTemplate: "gone://{{+key}}", name: gone, source: gone, path: "{{key}}"}}
              - {{uriTemplate: "down://{{+key}}", name: down, source: down, path: "{{key}}"}}
            """)
        done = run("validate", str(manifest))
    finally:
        server.stop()
    assert done.returncode == 1, done.stderr
    assert f"{manifest}:4:3: sources.gone: cannot reach s3://no-such-bucket-15/x: no such bucket or folder" in (
        done.stderr)
    assert f"{manifest}:5:3: sources.down: cannot reach s3://bucket/x: " in done.stderr
    assert "s3-secret-4b1e" not in done.stderr + done.stdout


def test_an_s3_collection_on_a_refused_endpoint_is_a_located_error(tmp_path: Path) -> None:
    """The listing's connection error names the manifest's file, line and key, and why no connection was made
    (tests/test_sources_s3_failures.py checks it comes after one attempt, not after retries)."""
    port = closed_port()
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: t}}
        sources:
          b: {{url: "s3://bucket/x", options: {{key: k, secret: "s3-secret-77c2", endpoint_url: "http://127.0.0.1:{port}"}}}}
        collections:
          - {{source: b, glob: "*.md", uri: "s3x://{{path}}"}}
        """)
    done = run("validate", str(manifest))
    assert done.returncode == 1, done.stderr
    assert (f"{manifest}:6:5: collections[0]: cannot list source 'b': listing failed: EndpointUnreachableError: "
            f"Could not connect to the endpoint URL (connection refused 127.0.0.1:{port})") in done.stderr, done.stderr
    assert "s3-secret-77c2" not in done.stderr + done.stdout
