"""S3 sources against moto's threaded S3 server on 127.0.0.1, the way s3fs tests itself."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from aggregator.reload import next_snapshot
from aggregator.service import ResourceService
from aggregator.errors import ResourceNotFound, ResourceUnavailable
from tests.conftest import MODES, connect, write_manifest

moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")
boto3 = pytest.importorskip("boto3", reason="boto3 is not installed")

KEYS = {"latest/r1.md": b"# Report 1\n", "latest/sub/r2.md": b"# Report 2\n", "latest/chart.png": b"\x89PNG\x00\x01",
        "latest/data.json": b'{"n": 3}', "private/secret.md": b"TOP SECRET", "latest-old/old.md": b"OLD"}


@dataclass
class Store:
    """A moto server of one test's own, which the test may stop (an S3 outage), and a client to write with."""

    endpoint: str
    client: Any
    stop: Callable[[], None]


def start_store() -> Store:
    """moto's threaded S3 server on a free loopback port, with a client holding the tests' credentials."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test-key",
                          aws_secret_access_key="test-secret-value", region_name="us-east-1")
    running = [True]

    def stop() -> None:
        if running:
            running.clear()
            server.stop()

    return Store(endpoint, client, stop)


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    store = start_store()
    store.client.create_bucket(Bucket="source-tests")
    for key, body in KEYS.items():
        store.client.put_object(Bucket="source-tests", Key=key, Body=body)
    yield store.endpoint
    store.stop()


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
        agg = await ResourceService.open(manifest(tmp_path, s3))
        texts: list[str] = []

        async def read() -> None:
            texts.append((await agg.read("reports://r1.md")).content.text or "")

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
        agg = await ResourceService.open(path_file)
        with pytest.raises((ResourceNotFound, ResourceUnavailable)) as err:
            await agg.read("gone://a.md")
        assert "wrong-secret-value" not in err.value.message
        await agg.aclose()

    anyio.run(main)
    assert "wrong-secret-value" not in caplog.text


def test_an_s3_sources_retries_stay_as_the_manifest_says_and_a_reload_keeps_it(tmp_path: Path, s3: str) -> None:
    """botocore rewrites the `retries` it is given in place (`max_attempts` to `total_max_attempts`, a `mode`
    added): the client gets the user's setting, and the manifest keeps what it says, so a reload of the same
    manifest keeps the source (its connections, cached content and listing) instead of opening it again."""
    path_file = manifest(tmp_path, s3)
    path_file.write_text(path_file.read_text().replace(
        f'endpoint_url: "{s3}"}}', f'endpoint_url: "{s3}", config_kwargs: {{retries: {{max_attempts: 2}}}}}}'))

    async def main() -> None:
        agg = await ResourceService.open(path_file)
        old = agg.snapshot
        try:
            assert (await agg.read("reports://r1.md")).content.text == "# Report 1\n"  # the client is made
            client = await old.sources["reports"].fs.get_s3()
            assert client.meta.config.retries["total_max_attempts"] == 3  # max_attempts counts retries
            assert old.manifest.sources["reports"].settings["options"]["config_kwargs"] == {
                "retries": {"max_attempts": 2}}
            reloaded = await next_snapshot(old, (), False)
            assert reloaded.replaced == frozenset() and reloaded.snapshot.sources["reports"] is old.sources["reports"]
        finally:
            await agg.aclose()

    anyio.run(main)


@pytest.fixture
def own_s3() -> Iterator[Store]:
    store = start_store()
    yield store
    store.stop()


def refresh_manifest(tmp_path: Path, endpoint: str, bucket: str, extra: str = "") -> Path:
    return write_manifest(tmp_path, f"""
        version: 1
        server: {{name: s3-refresh}}
        sources:
          reports:
            url: "s3://{bucket}/latest"
            options: {{key: test-key, secret: test-secret-value, endpoint_url: "{endpoint}"}}
            ttl: 300ms
            timeout: 1s
            {extra}
        collections:
          - {{source: reports, glob: "**/*.md", uri: "reports://{{path}}", name: "{{stem}}"}}
        templates:
          - {{uriTemplate: "reports://files/{{+key}}", name: file, source: reports, path: "{{key}}"}}
        """)


TTL_PASSED = 0.5  # the manifests' ttl is 300ms


@pytest.mark.parametrize("mode", MODES)
def test_an_updated_object_is_served_once_the_ttl_passed(tmp_path: Path, own_s3: Store, mode: str) -> None:
    """The collection's listing must not answer revalidation: each expired entry asks the store (a HEAD)."""
    endpoint, s3 = own_s3.endpoint, own_s3.client
    bucket = f"refresh-{mode}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="latest/a.md", Body=b"# v1\n")
    s3.put_object(Bucket=bucket, Key="latest/sub/b.md", Body=b"# b1\n")
    path = refresh_manifest(tmp_path, endpoint, bucket)

    async def main() -> None:
        async with connect(path, mode) as client:
            listed = [r.uri for r in (await client.list_resources()).resources]
            assert listed == ["reports://a.md", "reports://sub/b.md"]
            assert (await client.read_resource("reports://a.md")).contents[0].text == "# v1\n"
            assert (await client.read_resource("reports://files/sub/b.md")).contents[0].text == "# b1\n"
            s3.put_object(Bucket=bucket, Key="latest/a.md", Body=b"# v2, longer\n")
            s3.put_object(Bucket=bucket, Key="latest/sub/b.md", Body=b"# b2\n")
            s3.put_object(Bucket=bucket, Key="latest/sub/new.md", Body=b"# new\n")
            await anyio.sleep(TTL_PASSED)
            assert (await client.read_resource("reports://a.md")).contents[0].text == "# v2, longer\n"
            assert (await client.read_resource("reports://files/sub/b.md")).contents[0].text == "# b2\n"
            # A key added after the listing is readable through the template (the listing does not deny it).
            assert (await client.read_resource("reports://files/sub/new.md")).contents[0].text == "# new\n"

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stale", [False, True], ids=["no-staleIfError", "staleIfError"])
def test_an_outage_surfaces_once_the_ttl_passed(tmp_path: Path, own_s3: Store, mode: str, stale: bool) -> None:
    """Warm entries do not hide a store that stopped answering: an error naming the URI, or the stale copy."""
    endpoint, s3 = own_s3.endpoint, own_s3.client
    bucket = f"outage-{mode}-{stale}".lower()
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="latest/a.md", Body=b"# v1\n")
    path = refresh_manifest(tmp_path, endpoint, bucket, "staleIfError: 1m" if stale else "")

    async def main() -> None:
        async with connect(path, mode) as client:
            assert (await client.read_resource("reports://a.md")).contents[0].text == "# v1\n"
            own_s3.stop()
            await anyio.sleep(TTL_PASSED)
            if stale:
                assert (await client.read_resource("reports://a.md")).contents[0].text == "# v1\n"
                return
            with pytest.raises(MCPError) as err:
                await client.read_resource("reports://a.md")
            assert err.value.data == {"uri": "reports://a.md"} and "reports://a.md" in err.value.message
            assert endpoint not in err.value.message and "test-secret-value" not in err.value.message

    anyio.run(main)


def test_an_unchanged_object_is_revalidated_not_downloaded(tmp_path: Path, own_s3: Store) -> None:
    own_s3.client.create_bucket(Bucket="revalidate")
    own_s3.client.put_object(Bucket="revalidate", Key="latest/a.md", Body=b"# same\n")

    async def main() -> None:
        agg = await ResourceService.open(refresh_manifest(tmp_path, own_s3.endpoint, "revalidate"))
        assert (await agg.read("reports://a.md")).content.text == "# same\n"
        await anyio.sleep(TTL_PASSED)
        assert (await agg.read("reports://a.md")).content.text == "# same\n"
        assert (agg.cache.misses, agg.cache.revalidated) == (1, 1)
        await agg.aclose()

    anyio.run(main)
