"""One snapshot per reload: a read finishes on the snapshot it started with (bytes, ttl and cache scope alike),
sources a reload drops close only once the reads holding them are done, and their bytes never answer for their
successors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from aggregator.server import build_server
from aggregator.service import ResourceService
from tests.conftest import write_manifest
from tests.http_server import Upstream, serve


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with serve() as server:
        yield server


def manifest(tmp_path: Path, upstream: Upstream, ttl: str, extra_source: str = "") -> Path:
    return write_manifest(tmp_path, f"""
        version: 1
        server: {{name: snapshot-test}}
        defaults: {{ttl: 1s}}
        sources:
          api: {{url: "http://127.0.0.1:{upstream.port}/base", allowPrivateNetwork: true, timeout: 10s, ttl: {ttl}}}
          {extra_source}
        resources:
          - {{uri: "api://gated", name: gated, source: api, path: gated}}
          - {{uri: "api://a", name: a, source: api, path: docs/a.md}}
        """)


async def _wait_for(condition: Any, seconds: float = 5.0) -> None:
    with anyio.fail_after(seconds):
        while not condition():
            await anyio.sleep(0.01)


def test_a_read_in_flight_keeps_its_snapshot_and_its_source(tmp_path: Path, upstream: Upstream) -> None:
    """A reload that replaces the source (its ttl changed) while a slow read is in flight: the read completes from
    the old source with the old ttl, the old source closes once it is done, and its late bytes are not cached for
    the new source."""
    path = manifest(tmp_path, upstream, ttl="5s")

    async def main() -> None:
        service = await ResourceService.open(path)
        try:
            old_source = service.sources["api"]
            session = old_source._client()  # noqa: SLF001  # the pool a close would shut
            results: list[Any] = []

            async def read() -> None:
                results.append(await service.read("api://gated"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                await _wait_for(lambda: upstream.hits["GET gated"] == 1)
                manifest(tmp_path, upstream, ttl="60s")
                await service.reload()
                assert service.sources["api"] is not old_source
                assert not session.closed, "the old source closed under a read still using it"
                upstream.gate.set()
            (served,) = results
            assert served.content.text == "gated body"
            assert served.ttl == 5 and served.private is False  # the snapshot the bytes came from
            assert session.closed, "the dropped source was not closed once its last read finished"
            again = await service.read("api://gated")
            assert again.ttl == 60
            assert upstream.hits["GET gated"] == 2, "the old source's late bytes answered for the new source"
        finally:
            await service.aclose()

    anyio.run(main)


def test_a_dropped_source_closes_once_idle(tmp_path: Path, upstream: Upstream) -> None:
    local = tmp_path / "docs"
    local.mkdir()
    (local / "x.md").write_text("x")
    path = manifest(tmp_path, upstream, ttl="5s")

    async def main() -> None:
        service = await ResourceService.open(path)
        try:
            assert (await service.read("api://a")).content.text == upstream.body
            session = service.sources["api"]._client()  # noqa: SLF001
            write_manifest(tmp_path, f"""
                version: 1
                server: {{name: snapshot-test}}
                sources:
                  docs: {{url: "{local}"}}
                resources:
                  - {{uri: "docs://x", name: x, source: docs, path: x.md}}
                """)
            await service.reload()
            assert "api" not in service.sources
            assert session.closed
        finally:
            await service.aclose()

    anyio.run(main)


def test_read_result_ttl_comes_from_the_snapshot_that_served_it(tmp_path: Path, upstream: Upstream) -> None:
    """Over MCP (modern wire): `ttlMs` of a read that straddles a reload is the old source's."""
    path = manifest(tmp_path, upstream, ttl="5s")

    async def main() -> None:
        service = await ResourceService.open(path)
        try:
            async with Client(build_server(service), mode="auto", cache=None) as client:
                results: list[Any] = []

                async def read() -> None:
                    results.append(await client.read_resource("api://gated"))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(read)
                    await _wait_for(lambda: upstream.hits["GET gated"] == 1)
                    manifest(tmp_path, upstream, ttl="60s")
                    await service.reload()
                    upstream.gate.set()
                (result,) = results
                assert result.contents[0].text == "gated body"
                assert result.ttl_ms == 5000 and result.cache_scope == "public"
                assert (await client.read_resource("api://gated")).ttl_ms == 60_000
        finally:
            await service.aclose()

    anyio.run(main)


def test_a_render_reads_everything_from_its_own_snapshot(tmp_path: Path, upstream: Upstream) -> None:
    """A render whose first read is slow, with a reload in between: its second read sees the manifest the render
    started on, not the reloaded one."""

    def write(note: str) -> Path:
        return write_manifest(tmp_path, f"""
            version: 1
            server: {{name: snapshot-test}}
            sources:
              api: {{url: "http://127.0.0.1:{upstream.port}/base", allowPrivateNetwork: true, timeout: 10s}}
            resources:
              - {{uri: "api://gated", name: gated, source: api, path: gated}}
              - {{uri: "note://x", name: note, text: "{note}"}}
              - {{uri: "digest://x", name: digest, render: "{{{{ read('api://gated') }}}}+{{{{ read('note://x') }}}}"}}
            """)

    path = write("old")

    async def main() -> None:
        service = await ResourceService.open(path)
        try:
            results: list[Any] = []

            async def read() -> None:
                results.append(await service.read("digest://x"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                await _wait_for(lambda: upstream.hits["GET gated"] == 1)
                write("new")
                await service.reload()
                upstream.gate.set()
            (served,) = results
            assert served.content.text == "gated body+old"
            assert (await service.read("note://x")).content.text == "new"
        finally:
            await service.aclose()

    anyio.run(main)
