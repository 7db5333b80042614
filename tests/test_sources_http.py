"""HTTP sources against a real server on loopback: content types, templates, limits, SSRF guards, caching."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from aggregator.core import Aggregator
from aggregator.errors import ResourceNotFound, ResourceTooLarge, ResourceUnavailable
from tests.conftest import MODES, connect, write_manifest
from tests.http_server import BINARY, Upstream, serve


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with serve() as server:
        yield server


def manifest(tmp_path: Path, upstream: Upstream, extra: str = "", source: str = "") -> Path:
    base = f"http://127.0.0.1:{upstream.port}/base"
    return write_manifest(tmp_path, f"""
        version: 1
        server: {{name: http-test}}
        defaults: {{maxBytes: 1MiB}}
        sources:
          api:
            url: "{base}"
            allowPrivateNetwork: ["127.0.0.1/32"]
            headers: {{Authorization: "Bearer ${{API_TOKEN:-tok-123}}"}}
            timeout: 1s
            ttl: 300ms
            staleIfError: 30s
            {source}
        resources:
          - {{uri: "api://a", name: a, source: api, path: docs/a.md}}
          - {{uri: "api://data", name: data, source: api, path: data}}
          - {{uri: "api://blob", name: blob, source: api, path: blob}}
        templates:
          - {{uriTemplate: "api://weather/{{city}}", name: weather, source: api, path: "weather?city={{city}}"}}
          - {{uriTemplate: "api://raw/{{+path}}", name: raw, source: api, path: "{{path}}"}}
        {extra}
        """)




@pytest.mark.parametrize("mode", MODES)
def test_content_type_decides_and_templates_encode(tmp_path: Path, upstream: Upstream, mode: str) -> None:
    path = manifest(tmp_path, upstream)

    async def main() -> None:
        async with connect(path, mode) as client:
            a = (await client.read_resource("api://a")).contents[0]
            assert a.mime_type == "text/markdown" and a.text == upstream.body
            data = (await client.read_resource("api://data")).contents[0]
            assert data.mime_type == "application/json" and json.loads(data.text) == {"ok": True}
            blob = (await client.read_resource("api://blob")).contents[0]
            assert blob.mime_type == "application/octet-stream" and base64.b64decode(blob.blob) == BINARY
            city = "São Paulo & x=1#frag"
            weather = (await client.read_resource("api://weather/S%C3%A3o%20Paulo%20%26%20x%3D1%23frag")).contents[0]
            assert json.loads(weather.text) == {"city": city, "params": ["city"]}

    anyio.run(main)
    assert upstream.seen_headers[0]["Authorization"] == "Bearer tok-123"


HOSTILE = ["api://raw/..%2f..%2fsecret", "api://raw/../secret", "api://raw/%2f%2fevil.example/x",
           "api://raw/docs/a.md%23x", "api://raw/a%3F%2F..", "api://weather/..", "api://weather/a%2fb",
           "api://raw/@evil.example/x", "api://raw/a::b"]


def test_hostile_variables_never_leave_the_base(tmp_path: Path, upstream: Upstream) -> None:

    async def main() -> None:
        agg = await Aggregator.open(manifest(tmp_path, upstream))
        for uri in HOSTILE:
            try:
                await agg.read(uri)
            except (ResourceNotFound, ResourceUnavailable):
                pass
        await agg.aclose()

    anyio.run(main)
    # Whatever was asked stayed on the base's host and under its folder, and never climbed out of it.
    assert not [k for k in upstream.hits if k.startswith("OUTSIDE")], upstream.hits
    assert not [k for k in upstream.hits if "secret" in k or ".." in k], upstream.hits


@pytest.mark.parametrize("host", ["127.0.0.1", "2130706433", "0x7f000001", "0177.0.0.1", "127.1", "localhost.",
                                  "[::ffff:127.0.0.1]", "[::1]", "169.254.169.254", "0.0.0.0", "10.0.0.1"])
def test_private_addresses_refused_in_every_spelling(tmp_path: Path, upstream: Upstream, host: str) -> None:
    path = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: ssrf}}
        sources:
          api: {{url: "http://{host}:{upstream.port}/base", timeout: 2s}}
        resources:
          - {{uri: "api://a", name: a, source: api, path: docs/a.md}}
        """)

    async def main() -> None:
        agg = await Aggregator.open(path)
        with pytest.raises(ResourceUnavailable):
            await agg.read("api://a")
        await agg.aclose()

    anyio.run(main)
    assert sum(upstream.hits.values()) == 0


@pytest.mark.parametrize("target", ["http://127.0.0.2:{port}/base/docs/a.md", "http://169.254.169.254/latest/meta-data",
                                    "http://0x7f000002:{port}/base/docs/a.md", "http://[::ffff:127.0.0.2]:{port}/base/x",
                                    "file:///etc/passwd"])
def test_every_redirect_hop_is_checked(tmp_path: Path, upstream: Upstream, target: str) -> None:
    to = target.format(port=upstream.port)
    # Template values cannot add a query ('?' is encoded), so the redirecting URL is a listed resource.
    path = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: redirects}}
        sources:
          api: {{url: "http://127.0.0.1:{upstream.port}/base", allowPrivateNetwork: ["127.0.0.1/32"]}}
        resources:
          - {{uri: "api://hop", name: hop, source: api, path: "redirect?to={to}"}}
        """)

    async def hop() -> None:
        agg2 = await Aggregator.open(path)
        with pytest.raises(ResourceUnavailable):
            await agg2.read("api://hop")
        await agg2.aclose()

    anyio.run(hop)
    assert upstream.hits["GET redirect"] == 1
    assert upstream.hits["GET docs/a.md"] == 0 and upstream.hits["GET x"] == 0


def test_redirect_within_allowed_network_is_followed(tmp_path: Path, upstream: Upstream) -> None:
    to = f"http://127.0.0.1:{upstream.port}/base/data"
    path = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: redirects}}
        sources:
          api: {{url: "http://127.0.0.1:{upstream.port}/base", allowPrivateNetwork: ["127.0.0.1/32"]}}
        resources:
          - {{uri: "api://hop", name: hop, source: api, path: "redirect?to={to}"}}
        """)

    async def main() -> None:
        agg = await Aggregator.open(path)
        assert json.loads((await agg.read("api://hop")).text) == {"ok": True}
        await agg.aclose()

    anyio.run(main)


def test_limits_timeout_size_bomb_and_failures(tmp_path: Path, upstream: Upstream, caplog: pytest.LogCaptureFixture) -> None:

    async def main() -> None:
        agg = await Aggregator.open(manifest(tmp_path, upstream))
        started = time.monotonic()
        with pytest.raises(ResourceUnavailable):
            await agg.read("api://raw/slow")
        assert time.monotonic() - started < 5
        with pytest.raises(ResourceTooLarge):
            await agg.read("api://raw/endless")
        with pytest.raises(ResourceTooLarge):
            await agg.read("api://raw/bomb")
        with pytest.raises(ResourceNotFound):
            await agg.read("api://raw/missing")
        upstream.failing = True
        with pytest.raises(ResourceUnavailable) as err:
            await agg.read("api://raw/anything")
        assert "SECRET" not in err.value.message and "127.0.0.1" not in err.value.message
        await agg.aclose()

    anyio.run(main)
    assert "SECRET" not in caplog.text and "tok-123" not in caplog.text


def test_single_flight_revalidation_and_stale_if_error(tmp_path: Path, upstream: Upstream) -> None:

    async def main() -> None:
        agg = await Aggregator.open(manifest(tmp_path, upstream))
        results: list[str] = []

        async def read() -> None:
            results.append((await agg.read("api://a")).text or "")

        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(read)
        assert upstream.hits["GET docs/a.md"] == 1 and len(set(results)) == 1 and len(results) == 50

        heads = upstream.hits["HEAD docs/a.md"]  # one came from listing (size and date of a listed resource)
        await anyio.sleep(0.4)  # past the 300ms ttl: revalidate with a HEAD, no download
        assert (await agg.read("api://a")).text == upstream.body
        assert upstream.hits["HEAD docs/a.md"] == heads + 1 and upstream.hits["GET docs/a.md"] == 1

        upstream.etag, upstream.body = '"v2"', "# A\n\nsecond version\n"
        await anyio.sleep(0.4)
        assert (await agg.read("api://a")).text == upstream.body
        assert upstream.hits["GET docs/a.md"] == 2

        upstream.failing = True
        await anyio.sleep(0.4)
        assert (await agg.read("api://a")).text == upstream.body  # stale, within staleIfError
        assert agg.cache.stale_served == 1
        await agg.aclose()

    anyio.run(main)


def test_collection_over_http_is_a_located_error(tmp_path: Path, upstream: Upstream) -> None:
    from aggregator.manifest import ManifestError

    path = manifest(tmp_path, upstream, extra='collections:\n          - {source: api, glob: "*.md", uri: "api://{path}"}')
    with pytest.raises(ManifestError) as err:
        anyio.run(Aggregator.open, path)
    assert "cannot be listed" in str(err.value) and "collections[0]" in str(err.value)
