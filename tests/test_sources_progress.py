"""Progress on long listings: a source listing for longer than a moment logs how far it got, on stderr only.

The quiet start and the interval are made short with AGGREGATOR_PROGRESS_AFTER / AGGREGATOR_PROGRESS_EVERY."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import write_manifest

ROOT = Path(__file__).resolve().parents[1]
PROGRESS = re.compile(r"source '(\w+)': listing, ([\d,]+) (files|objects) seen so far")
FAST = {"AGGREGATOR_PROGRESS_AFTER": "0", "AGGREGATOR_PROGRESS_EVERY": "0"}


def run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AGGREGATOR_PROGRESS")}
    return subprocess.run([sys.executable, "-m", "aggregator", *args], capture_output=True, text=True, cwd=cwd,
                          env={**base, "PYTHONPATH": str(ROOT), **(env or {})}, timeout=120)


def counts(stderr: str, source: str) -> list[int]:
    return [int(m.group(2).replace(",", "")) for m in PROGRESS.finditer(stderr) if m.group(1) == source]


def test_a_long_local_listing_logs_progress_on_stderr_and_leaves_stdout_alone(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    for i in range(40):
        folder = docs / f"d{i:02}"
        folder.mkdir(parents=True)
        for j in range(100):
            (folder / f"f{j:03}.md").write_text("x")
    write_manifest(tmp_path, """
        version: 1
        server: {name: big}
        sources: {docs: {url: ./docs}}
        collections: [{source: docs, glob: "**/*.md", uri: "docs://{path}"}]
        """)
    quiet = run("list", "manifest.yaml", cwd=tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    assert not counts(quiet.stderr, "docs")  # a start of well under two seconds says nothing
    for command in ("list", "validate"):
        loud = run(command, "manifest.yaml", cwd=tmp_path, env=FAST)
        assert loud.returncode == 0, loud.stderr
        seen = counts(loud.stderr, "docs")
        assert len(seen) >= 2 and seen == sorted(seen) and 0 < seen[-1] <= 4000, loud.stderr[-2000:]
        assert "source 'docs': listed 4,000 files in" in loud.stderr
        assert "listing" not in loud.stdout and "seen so far" not in loud.stdout
        if command == "list":
            assert loud.stdout == quiet.stdout


def test_a_long_bucket_listing_logs_objects_page_by_page(tmp_path: Path) -> None:
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    boto3 = pytest.importorskip("boto3", reason="boto3 is not installed")
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s",
                              region_name="us-east-1")
        client.create_bucket(Bucket="many")
        client.put_object(Bucket="many", Key="docs/00000.md", Body=b"x")
        # Two pages of list_objects_v2: the rest straight into the server's store (1,100 PUTs took 15 s).
        store = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
        for i in range(1, 1100):
            store.put_object("many", f"docs/{i:05}.md", b"x")
        write_manifest(tmp_path, f"""
            version: 1
            server: {{name: bucket}}
            sources:
              bucket: {{url: "s3://many/docs", options: {{key: k, secret: s, endpoint_url: "{endpoint}"}}}}
            collections: [{{source: bucket, glob: "**/*.md", uri: "b://{{path}}"}}]
            """)
        loud = run("list", "manifest.yaml", cwd=tmp_path, env=FAST)
        assert loud.returncode == 0, loud.stderr
        seen = counts(loud.stderr, "bucket")
        # Counted while the pages arrive, not once the listing is over.
        assert seen and seen == sorted(seen) and seen[0] < 1100, loud.stderr[-2000:]
        assert "source 'bucket': listed 1,100 objects in" in loud.stderr
        assert len(loud.stdout.splitlines()) == 1100 and "seen so far" not in loud.stdout
    finally:
        server.stop()
