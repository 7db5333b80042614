"""reads/backend.py: a source's failure becomes a client-safe error naming the URI; every failure but not-found is
counted per source (for /metrics) with the last one's reason kept (for the console). Real local folder and a real
HTTP upstream, read through `ResourceService.read`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from aggregator.errors import ResourceNotFound, ResourceTooLarge, ResourceUnavailable
from aggregator.service import ResourceService
from tests.conftest import write_manifest
from tests.http_server import Upstream, serve


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with serve() as server:
        yield server


def _manifest(tmp_path: Path, upstream: Upstream) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "small.md").write_text("# small\n")
    (docs / "big.md").write_text("x" * 100)
    return write_manifest(tmp_path, f"""
        version: 1
        server: {{name: backend-calls}}
        sources:
          docs: {{url: ./docs, maxBytes: 50}}
          api: {{url: "http://127.0.0.1:{upstream.port}/base", allowPrivateNetwork: true, timeout: 10s}}
        resources:
          - {{uri: "api://a", name: a, source: api, path: docs/a.md}}
        templates:
          - {{uriTemplate: "docs://{{+path}}", name: docs, source: docs, path: "{{path}}"}}
        """)


def test_failures_become_errors_naming_the_uri_and_are_counted_per_source(tmp_path: Path, upstream: Upstream) -> None:
    async def main() -> None:
        service = await ResourceService.open(_manifest(tmp_path, upstream))
        try:
            assert (await service.read("docs://small.md")).content.text == "# small\n"

            with pytest.raises(ResourceNotFound) as missing:
                await service.read("docs://nothing.md")
            assert missing.value.uri == "docs://nothing.md"
            assert service.source_errors == {}  # a missing file is the client's mistake, not the source's

            with pytest.raises(ResourceTooLarge) as big:
                await service.read("docs://big.md")
            assert (big.value.uri, big.value.limit) == ("docs://big.md", 50)
            assert service.source_errors == {"docs": 1}

            upstream.failing = True
            with pytest.raises(ResourceUnavailable) as down:
                await service.read("api://a")
            assert down.value.uri == "api://a"
            assert "SECRET-UPSTREAM-BODY" not in str(down.value)  # the body is never read into a message
            assert service.source_errors == {"docs": 1, "api": 1}
            when, why = service.last_source_error["api"]
            assert when > 0 and "500" in why
        finally:
            await service.aclose()

    anyio.run(main)
