"""The command line as a user runs it: exit codes, stdout for output, stderr for diagnostics."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.command import aggregator
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
    # The digest /healthz and /metrics will report, checkable before a deploy (offline too).
    digest = hashlib.sha256(docs_manifest.read_bytes()).hexdigest()
    assert report["manifest"] == {"sha256": digest}
    offline = json.loads(run("validate", str(docs_manifest), "--offline", "--format", "json").stdout)
    assert offline["manifest"] == {"sha256": digest}


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
    """Each sample validates fully, its sources opened: S3 and HTTP ones against local servers started here (the
    command in this process: the tests above run it as one)."""
    offline = aggregator("validate", "--offline", str(sample))
    assert offline.returncode == 0 and "offline" in offline.stdout, offline.stderr
    with sample_services() as env:
        result = aggregator("validate", str(sample), env=env)
    assert result.returncode == 0, result.stderr
    assert "offline" not in result.stdout


@contextmanager
def sample_services() -> Iterator[dict[str, str]]:
    """moto S3 with the bucket local_s3.py makes, an HTTP server over sample-configs/docs, the sample SQLite db, and
    this Python first on PATH (gateway.yaml's upstreams run `python -m aggregator`)."""
    import functools
    import http.server
    import threading

    # The script moves the database into place in one step: a test on another worker may be reading it.
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
        yield {"S3_ENDPOINT": f"http://{host}:{port}", "SITE_URL": f"http://127.0.0.1:{web.server_address[1]}",
               "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    finally:
        web.shutdown()
        s3.stop()


def many_files_manifest(folder: Path, count: int = 3000) -> Path:
    """A manifest listing `count` files: more output than a pipe holds, so a writer meets a closed reader."""
    docs = folder / "docs"
    docs.mkdir()
    for i in range(count):
        (docs / f"page-{i:05}-with-a-long-enough-name.md").write_text(f"# {i}\n" * 40)
    return write_manifest(folder, """
        version: 1
        server: {name: many}
        sources: {docs: {url: ./docs}}
        collections:
          - {source: docs, glob: "*.md", uri: "docs://{path}", name: "{path}"}
        """)


def assert_quiet_exit(result: subprocess.CompletedProcess[bytes]) -> None:
    err = result.stderr.decode()
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err
    assert result.returncode == 0, err


def test_output_into_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    """`aggregator list M | head`: once the reader is gone, every printing command stops without a traceback."""
    manifest = many_files_manifest(tmp_path)
    (tmp_path / "docs" / "big.md").write_text("x" * 1_000_000)
    other = write_manifest(tmp_path, (manifest.read_text() + "resources:\n  - {uri: 'n://a', name: a, text: a}\n"),
                           name="other.yaml")
    commands = [("list", str(manifest)), ("list", str(manifest), "--json"), ("read", str(manifest), "docs://big.md"),
                ("schema",), ("diff", str(manifest), str(other)),
                ("diff", str(manifest), str(other), "--format", "json"),
                ("validate", str(manifest)), ("validate", str(manifest), "--format", "json")]
    for command in commands:
        process = subprocess.Popen([sys.executable, "-m", "aggregator", *command], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
        process.stdout.close()  # type: ignore[union-attr]  # the reader went away before the first line
        err = process.stderr.read()  # type: ignore[union-attr]
        process.wait(60)
        expected = 1 if command[0] == "diff" else 0  # diff says "different" by its exit code, pipe or not
        assert "Traceback" not in err.decode() and "Exception ignored" not in err.decode(), (command, err.decode())
        assert process.returncode == expected, (command, err.decode())


def test_list_into_head_exits_quietly(tmp_path: Path) -> None:
    manifest = many_files_manifest(tmp_path)
    for command in (f"list {manifest}", f"list {manifest} --json"):
        result = subprocess.run(f"set -o pipefail; {sys.executable} -m aggregator {command} | head -n 3", shell=True,
                                executable="/bin/bash", capture_output=True, timeout=120,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert len(result.stdout.splitlines()) == 3
        assert_quiet_exit(result)


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_manifest_that_is_no_regular_file_is_one_line_at_once(tmp_path: Path, kind: str) -> None:
    # A FIFO used to block the loader forever (waiting for a writer); a folder gave an IsADirectoryError traceback.
    target = tmp_path / "m.yaml"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    other = write_manifest(tmp_path, "version: 1\nserver: {name: t}\n", name="other.yaml")
    for args in (("validate", str(target)), ("list", str(target)), ("diff", str(other), str(target))):
        done = subprocess.run([sys.executable, "-m", "aggregator", *args], capture_output=True, timeout=30,
                              env={"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": os.environ["PATH"]})
        lines = done.stderr.decode().strip().splitlines()
        assert done.returncode == 2, (args, done.stderr)
        assert len(lines) == 1 and lines[0].startswith(f"aggregator: {target}: "), (args, lines)
        assert ("not a regular file" if kind == "fifo" else "is a folder") in lines[0]


def test_an_include_that_is_a_fifo_is_a_located_error(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "side.yaml")
    manifest = write_manifest(tmp_path, "version: 1\nserver: {name: t}\ninclude: [side.yaml]\n")
    done = run("validate", str(manifest))
    assert done.returncode == 1
    assert f"{manifest}:3:11: include[0]: cannot read included manifest 'side.yaml': is not a regular file" in (
        done.stderr.decode())


def test_an_unknown_or_uninstalled_protocol_is_one_located_line_each(tmp_path: Path) -> None:
    """`nope://`, `sftp://` without paramiko, `ftp://` whose filesystem fails to build: a located line each and
    nothing else on stderr (no "Exception ignored" from a half-built filesystem's destructor)."""
    sources = write_manifest(tmp_path, """
        version: 1
        server: {name: t}
        sources:
          f: {url: "ftp:///x"}
          n: {url: "nope://bucket/x"}
          s: {url: "sftp://example.com/x"}
        collections:
          - {source: f, glob: "*", uri: "f://{path}", name: "{stem}"}
          - {source: n, glob: "*", uri: "n://{path}", name: "{stem}"}
          - {source: s, glob: "*", uri: "s://{path}", name: "{stem}"}
        """)
    done = run("validate", str(sources))
    lines = done.stderr.decode().splitlines()
    assert done.returncode == 1
    assert [line.split(": ")[1] for line in lines] == ["sources.f.url", "sources.n.url", "sources.s.url"], lines
    assert lines[0].startswith(f"{sources}:4:3: sources.f.url: cannot open a ftp filesystem: TypeError: ")
    assert lines[1] == f"{sources}:5:3: sources.n.url: no filesystem for protocol 'nope': Protocol not known: nope"
    assert lines[2].startswith(f"{sources}:6:3: sources.s.url: no filesystem for protocol 'sftp': ")
    included = write_manifest(tmp_path, 'version: 1\nserver: {name: t}\ninclude: ["nope://x/y.yaml"]\n',
                              name="inc.yaml")
    done = run("validate", str(included))
    assert done.returncode == 1
    assert done.stderr.decode().splitlines() == [
        f"{included}:3:11: include[0]: cannot read included manifest 'nope://x/y.yaml': Protocol not known: nope"]


def test_a_binary_file_as_the_manifest_is_one_located_line(tmp_path: Path) -> None:
    binary = tmp_path / "m.yaml"
    binary.write_bytes(PNG_BYTES)
    for args in (("validate", str(binary)), ("list", str(binary))):
        done = run(*args)
        lines = done.stderr.decode().splitlines()
        assert done.returncode == 1 and len(lines) == 1, (args, lines)
        assert lines[0].startswith(f"{binary}:1:") and "not UTF-8 text" in lines[0]
