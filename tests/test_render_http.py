"""Runaway renders over `serve --http`: a render past its budget fails naming its URI, and while it runs the
server keeps answering everyone else at its usual latency."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2 as httpx
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.conftest import write_manifest
from tests.served import serve_http


# No `render:` section: the default budget (2 s, 1,000,000 loop iterations) is what is tested.
MANIFEST = """
    version: 1
    server: {name: runaway}
    sources:
      docs: {url: ./docs}
    resources:
      - {uri: "docs://a", name: a, source: docs, path: a.md}
    templates:
      # The issue's reproduction: n * n iterations, n from the URI.
      - uriTemplate: "loops://{n}"
        name: loops
        render: "{% for i in range(n|int) %}{% for j in range(n|int) %}{% endfor %}{% endfor %}done"
      # 2^n macro calls and no loop at all: only the time limit stops it.
      - uriTemplate: "calls://{n}"
        name: calls
        render: "{% macro f(k) %}{% if k > 0 %}{{ f(k - 1) }}{{ f(k - 1) }}{% endif %}{% endmacro %}{{ f(n|int) }}done"
    """


@dataclass
class Served:
    base: str
    log: Path


@contextmanager
def _serving(folder: Path, manifest_text: str) -> Iterator[Served]:
    (folder / "docs").mkdir()
    (folder / "docs" / "a.md").write_text("# A\n")
    manifest = write_manifest(folder, manifest_text)
    # A server stuck in a render does not get to its signal handler: SIGKILL then, whatever its exit code.
    with serve_http(manifest, folder, exit_code=None) as server:
        yield Served(server.base, server.log)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """The manifest's server with the default render budget."""
    with _serving(tmp_path, MANIFEST) as server:
        yield server


@pytest.fixture
def served_without_a_clock(tmp_path: Path) -> Iterator[Served]:
    """The manifest's server with the default iteration cap and a time limit past the test's own: only the
    iteration cap can stop a render (on a loaded machine 1,000,000 iterations can take longer than the default 2 s,
    and the time limit would fire first, proving nothing about the cap)."""
    with _serving(tmp_path, MANIFEST.replace("server: {name: runaway}",
                                             "server: {name: runaway}\n    render: {timeout: 300s}")) as server:
        yield server


async def _probe(http: httpx.AsyncClient, client: Client, base: str) -> tuple[float, float]:
    """Seconds one GET /healthz and one cached resources/read took."""
    start = time.perf_counter()
    assert (await http.get(base + "/healthz")).status_code == 200
    middle = time.perf_counter()
    assert (await client.read_resource("docs://a")).contents[0].text == "# A\n"
    return middle - start, time.perf_counter() - middle


def test_a_runaway_render_stops_and_others_keep_their_latency(served: Served) -> None:
    """The issue's load: while a render runs to its time limit, /healthz and a cached read answer as fast as when
    the server is idle (within 100 ms, plus a margin for the load of a shared test machine)."""
    url = served.base + "/mcp"
    figures: dict[str, float] = {}

    async def main() -> None:
        async with httpx.AsyncClient(timeout=10) as http, Client(url, cache=None) as client, \
                Client(url, cache=None) as runaway_client:
            await _probe(http, client, served.base)  # warms the cache and the connections
            idle = [await _probe(http, client, served.base) for _ in range(10)]
            outcome: dict[str, object] = {}

            async def runaway() -> None:
                start = time.perf_counter()
                try:
                    await runaway_client.read_resource("calls://40")
                except MCPError as exc:
                    outcome["error"] = exc.error.message
                outcome["seconds"] = time.perf_counter() - start

            busy: list[tuple[float, float]] = []
            async with anyio.create_task_group() as group:
                group.start_soon(runaway)
                await anyio.sleep(0.2)  # the render is under way
                while "seconds" not in outcome:
                    probe = await _probe(http, client, served.base)
                    if "seconds" not in outcome:  # only probes that overlapped the render count
                        busy.append(probe)
                    await anyio.sleep(0.05)

            idle += [await _probe(http, client, served.base) for _ in range(10)]  # the load may have changed
            idle_max = max(max(p) for p in idle)
            figures.update(idle_healthz=max(p[0] for p in idle), idle_read=max(p[1] for p in idle),
                           busy_healthz=max(p[0] for p in busy), busy_read=max(p[1] for p in busy),
                           probes=len(busy), render=float(outcome["seconds"]))  # type: ignore[arg-type]
            print(figures)
            assert "calls://40" in str(outcome.get("error")), outcome
            assert float(outcome["seconds"]) < 10  # type: ignore[arg-type]  # the 2 s limit, with room for load
            assert len(busy) >= 5, figures
            # 100 ms as the issue asks, plus three times the worst idle latency measured before and after, for a
            # machine busy with other work (a render on the event loop took seconds).
            bound = 0.1 + 3 * idle_max
            assert figures["busy_healthz"] < bound and figures["busy_read"] < bound, figures

    anyio.run(main)
    log = served.log.read_text()
    assert "render calls://40 failed" in log and "2s" in log


def test_the_issue_s_nested_loops_stop_at_the_iteration_cap(served_without_a_clock: Served) -> None:
    """loops://10000 asks for 100,000,000 iterations (11 s of CPU before the cap): the cap of 1,000,000 stops it,
    and only the cap can (the time limit is longer than the test may run), so the log names the iterations."""
    served = served_without_a_clock

    async def main() -> None:
        async with Client(served.base + "/mcp", cache=None) as client:
            with pytest.raises(MCPError) as failed:
                await client.read_resource("loops://10000")
            assert "loops://10000" in failed.value.error.message
            assert (await client.read_resource("loops://100")).contents[0].text == "done"  # 10,100 iterations

    anyio.run(main)
    assert "1000000 loop iterations" in served.log.read_text()
