"""S3 sources against moto's threaded S3 server on 127.0.0.1, the way s3fs tests itself."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from aggregator.core import Aggregator
from aggregator.errors import ResourceNotFound, ResourceUnavailable
from tests.conftest import MODES, connect, write_manifest

moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")
boto3 = pytest.importorskip("boto3", reason="boto3 is not installed")

KEYS = {"latest/r1.md": b"# Report 1\n", "latest/sub/r2.md": b"# Report 2\n", "latest/chart.png": b"\x89PNG\x00\x01",
        "latest/data.json": b'{"n": 3}', "private/secret.md": b"TOP SECRET", "latest-old/old.md": b"OLD"}


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test-key",
                          aws_secret_access_key="test-secret-value", region_name="us-east-1")
    client.create_bucket(Bucket="source-tests")
    for key, body in KEYS.items():
        client.put_object(Bucket="source-tests", Key=key, Body=body)
    yield endpoint
    server.stop()


def manifest(tmp_path: Path, endpoint: str, extra: str = "") -> Path:
    return write_manifest(tmp_path, f"""
        version: 1
        server: {{name: s3-test}}
        sources:
          reports:
            url: "s3://source-tests/latest"
            options: {{key: "${{S3_KEY:-test-key}}", secret: "${{S3_SECRET:-test-secret-value}}", endpoint_url: "{endpoint}"}}
            ttl: 1m
        collections:
          - {{source: reports, glob: "**/*.md", uri: "reports://{{path}}", name: "{{stem}}",
             annotations: {{lastModified: file}}}}
        templates:
          - {{uriTemplate: "reports://files/{{+key}}", name: file, source: reports, path: "{{key}}"}}
        {extra}
        """)


@pytest.mark.parametrize("mode", MODES)
def test_s3_collection_templates_and_hostile_keys(tmp_path: Path, s3: str, mode: str) -> None:
    path = manifest(tmp_path, s3)

    async def main() -> None:
        async with connect(path, mode) as client:
            listed = (await client.list_resources()).resources
            assert [r.uri for r in listed] == ["reports://r1.md", "reports://sub/r2.md"]
            assert listed[0].size == len(KEYS["latest/r1.md"]) and listed[0].annotations.last_modified
            dumped = json.dumps([r.model_dump() for r in listed])
            assert "test-secret-value" not in dumped and "test-key" not in dumped
            assert (await client.read_resource("reports://sub/r2.md")).contents[0].text == "# Report 2\n"
            chart = (await client.read_resource("reports://files/chart.png")).contents[0]
            assert chart.mime_type == "image/png" and chart.blob
            data = (await client.read_resource("reports://files/data.json")).contents[0]
            assert json.loads(data.text) == {"n": 3}
            for uri in ["reports://files/../private/secret.md", "reports://files/..%2fprivate%2fsecret.md",
                        "reports://files/%2e%2e/private/secret.md", "reports://files//private/secret.md",
                        "reports://files/s3::%2f%2fother/x", "reports://files/../latest-old/old.md",
                        "reports://files/nope.md"]:
                with pytest.raises(MCPError) as err:
                    await client.read_resource(uri)
                assert err.value.data == {"uri": uri} and err.value.message == "Resource not found", uri

    anyio.run(main)


def test_s3_single_flight_and_cache(tmp_path: Path, s3: str) -> None:
    async def main() -> None:
        agg = await Aggregator.open(manifest(tmp_path, s3))
        texts: list[str] = []

        async def read() -> None:
            texts.append((await agg.read("reports://r1.md")).text or "")

        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(read)
        assert texts == ["# Report 1\n"] * 50
        assert agg.cache.misses == 1 and agg.cache.hits == 49
        await agg.aclose()

    anyio.run(main)


def test_s3_bad_credentials_give_a_generic_error(tmp_path: Path, s3: str, caplog: pytest.LogCaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("S3_SECRET", "wrong-secret-value")
    # moto accepts any credentials (and its buckets are shared process-wide): an unknown bucket stands in for a refusal.
    path_file = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: s3-test}}
        sources:
          gone: {{url: "s3://no-such-bucket/x", options: {{key: k, secret: "${{S3_SECRET}}", endpoint_url: "{s3}"}}}}
        templates:
          - {{uriTemplate: "gone://{{name}}", name: g, source: gone, path: "{{name}}"}}
        """, name="gone.yaml")

    async def main() -> None:
        agg = await Aggregator.open(path_file)
        with pytest.raises((ResourceNotFound, ResourceUnavailable)) as err:
            await agg.read("gone://a.md")
        assert "wrong-secret-value" not in err.value.message
        await agg.aclose()

    anyio.run(main)
    assert "wrong-secret-value" not in caplog.text
