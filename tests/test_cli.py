"""The command line as a user runs it: exit codes, stdout for output, stderr for diagnostics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import PNG_BYTES, write_manifest

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "aggregator", *args], capture_output=True, env=full_env, timeout=60)


def test_validate_ok_and_json(docs_manifest: Path) -> None:
    ok = run("validate", str(docs_manifest))
    assert ok.returncode == 0, ok.stderr.decode()
    assert b"valid" in ok.stdout
    as_json = run("validate", str(docs_manifest), "--format", "json")
    report = json.loads(as_json.stdout)
    assert report["valid"] is True and report["resources"] == 17 and report["templates"] == 2


def test_validate_reports_every_error_located(tmp_path: Path) -> None:
    bad = write_manifest(tmp_path, """
        version: 1
        server: {name: x, pageSize: "many"}
        sources:
          docs: {url: ./nowhere, colour: blue}
        templates:
          - {uriTemplate: "x://{a", name: t, source: docs, path: "{a}"}
        """, name="bad.yaml")
    result = run("validate", str(bad))
    assert result.returncode == 1
    lines = result.stderr.decode().strip().splitlines()
    assert any(line.startswith(f"{bad}:2:") and "server.pageSize" in line for line in lines), lines
    assert any(f"{bad}:4:" in line and "colour" in line for line in lines), lines
    assert any(f"{bad}:6:" in line and "uriTemplate" in line for line in lines), lines
    as_json = json.loads(run("validate", str(bad), "--format", "json").stdout)
    assert as_json["valid"] is False
    assert {"file", "line", "col", "key", "message"} <= set(as_json["errors"][0])


def test_validate_collision_found_after_globbing(docs_tree: Path) -> None:
    m = write_manifest(docs_tree.parent, """
        version: 1
        server: {name: x}
        sources: {docs: {url: ./docs}}
        resources:
          - {uri: "docs://README.md", name: readme, source: docs, path: README.md}
        collections:
          - {source: docs, glob: "*.md", uri: "docs://{path}"}
        """)
    result = run("validate", str(m))
    assert result.returncode == 1
    err = result.stderr.decode()
    assert f"{m}:7:" in err and "docs://README.md" in err and "resources[0]" in err


def test_missing_manifest_file(tmp_path: Path) -> None:
    result = run("validate", str(tmp_path / "absent.yaml"))
    assert result.returncode != 0 and b"absent.yaml" in result.stderr


def test_list_and_read(docs_manifest: Path) -> None:
    listed = run("list", str(docs_manifest), "--json")
    assert listed.returncode == 0, listed.stderr.decode()
    data = json.loads(listed.stdout)
    uris = [r["uri"] for r in data["resources"]]
    assert "docs://guides/page01.md" in uris and "img://logo" in uris
    assert {t["uriTemplate"] for t in data["resourceTemplates"]} == {"file://docs/{+path}", "page://{name}"}
    plain = run("list", str(docs_manifest))
    assert b"docs://README.md\ttext/markdown" in plain.stdout

    assert run("read", str(docs_manifest), "docs://readme").stdout == b"# Readme\n"
    assert run("read", str(docs_manifest), "img://logo").stdout == PNG_BYTES
    missing = run("read", str(docs_manifest), "file://docs/../secret.txt")
    assert missing.returncode == 1 and b"not found" in missing.stderr and missing.stdout == b""


def test_schema_command_prints_the_schema() -> None:
    result = run("schema")
    schema = json.loads(result.stdout)
    assert schema["$schema"].endswith("2020-12/schema")
    assert schema == json.loads((ROOT / "schemas" / "manifest.schema.json").read_text())


@pytest.mark.parametrize("sample", sorted((ROOT / "sample-configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_sample_validates(sample: Path) -> None:
    """Each sample validates fully, its sources opened: S3 and HTTP ones against local servers started here."""
    offline = run("validate", "--offline", str(sample))
    assert offline.returncode == 0 and b"offline" in offline.stdout, offline.stderr.decode()
    with sample_services() as env:
        result = run("validate", str(sample), env=env)
    assert result.returncode == 0, result.stderr.decode()
    assert b"offline" not in result.stdout


@contextmanager
def sample_services() -> Iterator[dict[str, str]]:
    """moto S3 with the bucket local_s3.py makes, an HTTP server over sample-configs/docs, the sample SQLite db."""
    import functools
    import http.server
    import threading

    subprocess.run([sys.executable, str(ROOT / "sample-configs" / "sql" / "make_db.py")], check=True,
                   capture_output=True)
    boto3 = pytest.importorskip("boto3", reason="boto3 is not installed")
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    s3 = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    s3.start()
    host, port = s3.get_host_and_port()
    client = boto3.client("s3", endpoint_url=f"http://{host}:{port}", aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    client.create_bucket(Bucket="reports")
    client.put_object(Bucket="reports", Key="latest/2026/q1.md", Body=b"# Q1\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(ROOT / "sample-configs" / "docs"))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        yield {"S3_ENDPOINT": f"http://{host}:{port}", "SITE_URL": f"http://127.0.0.1:{web.server_address[1]}"}
    finally:
        web.shutdown()
        s3.stop()
