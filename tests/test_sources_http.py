"""HTTP sources against a real server on loopback: content types, templates, limits, SSRF guards, caching."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from aggregator.service import ResourceService
from aggregator.errors import ResourceNotFound, ResourceTooLarge, ResourceUnavailable
from aggregator.manifest import ManifestError
from tests.conftest import MODES, connect, reads_are_unavailable, write_manifest
from tests.http_server import BINARY, Upstream, serve
from tests.isolation import free_port
from tests.command import aggregator



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
        agg = await ResourceService.open(manifest(tmp_path, upstream))
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


@pytest.mark.parametrize("host", ["2130706433", "0x7f000001", "0177.0.0.1", "127.1", "localhost", "localhost."])
def test_private_addresses_refused_in_every_spelling(tmp_path: Path, upstream: Upstream, host: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Names and legacy IPv4 spellings are resolved by the guarded resolver: each read is refused."""
    path = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: ssrf}}
        sources:
          api: {{url: "http://{host}:{upstream.port}/base", timeout: 2s}}
        resources:
          - {{uri: "api://a", name: a, source: api, path: docs/a.md}}
        """)

    async def main() -> None:
        agg = await ResourceService.open(path)
        with pytest.raises(ResourceUnavailable):
            await agg.read("api://a")
        await agg.aclose()

    anyio.run(main)
    if host in ("0x7f000001", "localhost"):  # aiohttp rejects the others as invalid URLs (or DNS has no answer)
        assert "refused a request to" in caplog.text and "resolves only to refused addresses" in caplog.text
    assert sum(upstream.hits.values()) == 0


# IP literals, each refused before any connection: IPv4, and IPv6 spellings that carry a private IPv4 address.
LITERALS = {
    "[64:ff9b::7f00:1]": "127.0.0.1 (loopback)", "[64:ff9b::a9fe:a9fe]": "169.254.169.254 (link-local)",
    "[64:ff9b:1::7f00:1]": "64:ff9b:1::7f00:1 is special-purpose", "[::127.0.0.1]": "127.0.0.1 (loopback)",
    "[::ffff:0:7f00:1]": "127.0.0.1 (loopback)", "[2002:7f00:1::1]": "127.0.0.1 (loopback)",
    "[2002:a00:1::1]": "10.0.0.1 (private)", "[2001:0:4136:e378:8000:63bf:80ff:fffe]": "127.0.0.1 (loopback)",
    "[2606:4700:1:2::5efe:a9fe:a9fe]": "169.254.169.254 (link-local)", "[::ffff:127.0.0.1]": "127.0.0.1 (loopback)",
    "[::1]": "::1 is loopback", "[fe80::1]": "fe80::1 is link-local", "127.0.0.1": "127.0.0.1 is loopback",
    "169.254.169.254": "169.254.169.254 is link-local", "0.0.0.0": "0.0.0.0 is unspecified",
    "10.0.0.1": "10.0.0.1 is private", "100.64.0.1": "100.64.0.1 is special-purpose",
}


@pytest.mark.parametrize("host", sorted(LITERALS))
def test_a_refused_ip_literal_is_a_located_error(tmp_path: Path, upstream: Upstream, host: str) -> None:
    """`aggregator validate` names the manifest line, the key and what the address carries; nothing connects."""
    path = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: ssrf}}
        sources:
          api:
            url: "http://{host}:{upstream.port}/base"
            timeout: 2s
        resources:
          - {{uri: "api://a", name: a, source: api, path: docs/a.md}}
        """)
    result = aggregator("validate", str(path))
    assert result.returncode == 1, result
    output = result.stdout + result.stderr
    assert f"{path}:4:3: sources.api.url: refused: " in output and LITERALS[host] in output, output
    assert "allowPrivateNetwork" in output
    with pytest.raises(ManifestError):
        anyio.run(ResourceService.open, path)
    assert sum(upstream.hits.values()) == 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("host", "allow"), [("[::ffff:127.0.0.1]", '["127.0.0.1/32"]'),
                                             ("[::ffff:127.0.0.1]", "true"), ("127.0.0.1", '["127.0.0.0/8"]')])
def test_allow_private_network_still_reaches_the_listed_networks(tmp_path: Path, upstream: Upstream, host: str,
                                                                 allow: str, mode: str) -> None:
    path = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: allowed}}
        sources:
          api: {{url: "http://{host}:{upstream.port}/base", allowPrivateNetwork: {allow}, timeout: 5s}}
        resources:
          - {{uri: "api://a", name: a, source: api, path: docs/a.md}}
        """)

    async def main() -> None:
        async with connect(path, mode) as client:
            assert (await client.read_resource("api://a")).contents[0].text == upstream.body

    anyio.run(main)
    assert upstream.hits["GET docs/a.md"] == 1


def test_a_listed_network_does_not_open_the_others(tmp_path: Path, upstream: Upstream) -> None:
    path = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: allowed}}
        sources:
          api: {{url: "http://[::ffff:127.0.0.1]:{upstream.port}/base", allowPrivateNetwork: ["10.0.0.0/8"]}}
        """)
    with pytest.raises(ManifestError) as err:
        anyio.run(ResourceService.open, path)
    assert "sources.api.url" in str(err.value) and "127.0.0.1 (loopback)" in str(err.value)
    assert sum(upstream.hits.values()) == 0


@pytest.mark.parametrize("target", ["http://127.0.0.2:{port}/base/docs/a.md", "http://169.254.169.254/latest/meta-data",
                                    "http://0x7f000002:{port}/base/docs/a.md", "http://[::ffff:127.0.0.2]:{port}/base/x",
                                    "http://[64:ff9b::7f00:2]:{port}/base/x", "http://[::127.0.0.2]:{port}/base/x",
                                    "http://[2002:a9fe:a9fe::1]/latest/meta-data", "file:///etc/passwd"])
def test_every_redirect_hop_is_checked(tmp_path: Path, upstream: Upstream, target: str,
                                       caplog: pytest.LogCaptureFixture) -> None:
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
        agg2 = await ResourceService.open(path)
        with pytest.raises(ResourceUnavailable):
            await agg2.read("api://hop")
        await agg2.aclose()

    anyio.run(hop)
    # Refused by the policy, not by a failed connection (a NAT64 gateway on the path would have answered).
    assert "refused a request" in caplog.text and "request failed" not in caplog.text, caplog.text
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
        agg = await ResourceService.open(path)
        assert json.loads((await agg.read("api://hop")).content.text) == {"ok": True}
        await agg.aclose()

    anyio.run(main)


def test_limits_timeout_size_bomb_and_failures(tmp_path: Path, upstream: Upstream, caplog: pytest.LogCaptureFixture) -> None:

    async def main() -> None:
        agg = await ResourceService.open(manifest(tmp_path, upstream))
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
        agg = await ResourceService.open(manifest(tmp_path, upstream))
        results: list[str] = []

        async def read() -> None:
            results.append((await agg.read("api://a")).content.text or "")

        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(read)
        assert upstream.hits["GET docs/a.md"] == 1 and len(set(results)) == 1 and len(results) == 50

        heads = upstream.hits["HEAD docs/a.md"]  # one came from listing (size and date of a listed resource)
        await anyio.sleep(0.4)  # past the 300ms ttl: revalidate with a HEAD, no download
        assert (await agg.read("api://a")).content.text == upstream.body
        assert upstream.hits["HEAD docs/a.md"] == heads + 1 and upstream.hits["GET docs/a.md"] == 1

        upstream.etag, upstream.body = '"v2"', "# A\n\nsecond version\n"
        await anyio.sleep(0.4)
        assert (await agg.read("api://a")).content.text == upstream.body
        assert upstream.hits["GET docs/a.md"] == 2

        upstream.failing = True
        await anyio.sleep(0.4)
        assert (await agg.read("api://a")).content.text == upstream.body  # stale, within staleIfError
        assert agg.cache.stale_served == 1
        await agg.aclose()

    anyio.run(main)


def test_collection_over_http_is_a_located_error(tmp_path: Path, upstream: Upstream) -> None:

    path = manifest(tmp_path, upstream, extra='collections:\n          - {source: api, glob: "*.md", uri: "api://{path}"}')
    with pytest.raises(ManifestError) as err:
        anyio.run(ResourceService.open, path)
    assert "cannot be listed" in str(err.value) and "collections[0]" in str(err.value)


def test_connection_failures_name_the_reason_for_the_operator(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()  # nothing listens there
    path = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: http-why}}
        sources:
          refused: {{url: "http://127.0.0.1:{port}/", allowPrivateNetwork: true,
                    headers: {{Authorization: "Bearer tok-77f1"}}}}
          nowhere: {{url: "https://no-such-host.invalid/", headers: {{X-Api-Key: key-91c2}}}}
        resources:
          - {{uri: "web://a", name: a, source: refused, path: a.md}}
          - {{uri: "web://b", name: b, source: nowhere, path: b.md}}
        """)

    reads_are_unavailable(path, ["web://a", "web://b"])
    assert f"connection refused 127.0.0.1:{port}" in caplog.text
    assert "DNS name not resolved: no-such-host.invalid" in caplog.text
    assert "tok-77f1" not in caplog.text and "key-91c2" not in caplog.text
