"""Shared fixtures: a docs folder with text, binary, nested and hostile files, and a real stdio client."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

PNG_BYTES = bytes.fromhex("89504e470d0a1a0a0000000d49484452") + bytes(range(256))
MODES = ("legacy", "auto")


def _one_tls_context_per_process() -> None:
    """httpx builds a TLS context for every client, loading the system's CA bundle (20 ms of CPU), and the tests
    make thousands of clients (an MCP client per connection, `httpx.get` in every health poll): a minute of CPU a
    run. One default context per test process serves them all, as it would any number of clients (the servers the
    tests start are plain HTTP on loopback; the aggregator processes they start are left as they are)."""
    import functools

    import httpcore2

    httpcore2.default_ssl_context = functools.cache(httpcore2.default_ssl_context)


_one_tls_context_per_process()


def write_manifest(folder: Path, text: str, name: str = "manifest.yaml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


@pytest.fixture
def docs_tree(tmp_path: Path) -> Path:
    """tmp/docs with 12 markdown files in folders, a PNG, a JSON file, a secret beside the root and links."""
    docs = tmp_path / "docs"
    for i in range(12):
        folder = docs / ("guides" if i % 2 else "ref")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"page{i:02}.md").write_text(f"# Page {i}\n\nBody {i}.\n", encoding="utf-8")
    (docs / "README.md").write_text("# Readme\n", encoding="utf-8")
    (docs / "logo.png").write_bytes(PNG_BYTES)
    (docs / "data.json").write_text('{"a": 1}', encoding="utf-8")
    (docs / "notes with space.txt").write_text("spaced", encoding="utf-8")
    (docs / ".hidden.md").write_text("hidden", encoding="utf-8")
    (docs / "big.bin").write_bytes(b"x" * 4096)
    (tmp_path / "secret.txt").write_text("TOP SECRET", encoding="utf-8")
    (tmp_path / "docs_old").mkdir()
    (tmp_path / "docs_old" / "old.md").write_text("OLD SIBLING", encoding="utf-8")
    os.symlink(tmp_path / "secret.txt", docs / "escape.txt")
    os.symlink(tmp_path / "docs_old", docs / "oldlink")
    os.symlink(docs / "README.md", docs / "inner-link.md")
    return docs


@pytest.fixture
def docs_manifest(docs_tree: Path) -> Path:
    return write_manifest(docs_tree.parent, """
        version: 1
        server: {name: test-docs, title: Test docs, version: "9.9.9", instructions: Read the README first., pageSize: 5}
        defaults: {ttl: 90s, maxBytes: 2KiB}
        sources:
          docs: {url: ./docs}
        resources:
          - {uri: "docs://readme", name: readme, source: docs, path: README.md, mimeType: text/markdown}
          - {uri: "note://inline", name: inline, text: "Inline content"}
          - {uri: "img://logo", name: logo, source: docs, path: logo.png}
        collections:
          - {source: docs, glob: "**/*.md", uri: "docs://{path}", name: "{stem}", annotations: {lastModified: file}}
        templates:
          - {uriTemplate: "file://docs/{+path}", name: file, source: docs, path: "{path}"}
          - {uriTemplate: "page://{name}", name: page, source: docs, path: "guides/{name}.md"}
        """)


def server_params(manifest: Path, *extra: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "aggregator", "serve", str(manifest), *extra],
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": os.environ.get("PATH", "")},
    )


@asynccontextmanager
async def connect(manifest: Path, mode: str) -> AsyncIterator[Client]:
    """An official MCP client talking to `aggregator serve manifest` over stdio, without client-side caching."""
    async with Client(server_params(manifest), mode=mode, cache=None) as client:  # type: ignore[arg-type]
        yield client


async def list_all(client: Client) -> tuple[list, int]:
    """Every listed resource, following cursors to the last page, and how many pages that took."""
    resources: list = []
    pages, cursor = 0, None
    while True:
        page = await client.list_resources(cursor=cursor)
        resources.extend(page.resources)
        pages += 1
        cursor = page.next_cursor
        if not cursor:
            return resources, pages


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    """In CI (AGGREGATOR_FAIL_ON_SKIP=1) a skipped test is a failure: a missing service must not pass silently."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("AGGREGATOR_FAIL_ON_SKIP") == "1" and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped, which CI treats as a failure: {report.longrepr}"


def reads_are_unavailable(manifest: Path, uris: list[str]) -> None:
    """Each of `uris` read from `manifest`'s aggregator fails as a client sees it: unavailable, naming only the URI
    (what the operator is told goes to the log, which the caller checks)."""
    import anyio

    from aggregator.service import ResourceService
    from aggregator.errors import ResourceUnavailable

    async def main() -> None:
        agg = await ResourceService.open(manifest)
        try:
            for uri in uris:
                with pytest.raises(ResourceUnavailable) as err:
                    await agg.read(uri)
                assert err.value.message == f"Resource {uri} could not be read right now"
        finally:
            await agg.aclose()

    anyio.run(main)


SLOW_MODULES = {
    "test_deploy": "the deploy files run for real: HAProxy and nginx in front of replica fleets",
    "test_cluster_haproxy": "replica fleets behind HAProxy, Redis restarted",
    "test_cluster_replicas": "replica processes on Redis, paused and killed",
    "test_console_browser": "the console in Chromium",
}
"""Modules whose tests are marked `slow` (what `make test-quick` leaves out; `make test` runs them)."""


MEMORY_TMP = Path("/dev/shm")
"""Where test folders go when it is a tmpfs: the tests make tens of thousands of files (30,000 for one search test,
3,000 for a listing), and on a disk other work shares, creating 5,000 empty files took 7 s (0.04 s in memory)."""


def _tests_in_memory(config: pytest.Config) -> None:
    """Test folders in memory (MEMORY_TMP) unless --basetemp is given or AGGREGATOR_TEST_TMP=disk: one folder per
    run (named by the pytest process's id, so a targeted run beside `make test` leaves the suite's folders alone),
    and the folders of runs that have ended are removed when the next run starts (the last one stays to look at).
    xdist workers get their folder under it from the controller."""
    if config.option.basetemp or os.environ.get("AGGREGATOR_TEST_TMP") == "disk" or hasattr(config, "workerinput"):
        return
    if not (MEMORY_TMP.is_dir() and os.access(MEMORY_TMP, os.W_OK)):
        return
    import shutil

    runs = MEMORY_TMP / f"aggregator-tests-{os.getuid()}"
    runs.mkdir(exist_ok=True)
    for run in runs.iterdir():
        if run.name.isdigit() and not _alive(int(run.name)):
            shutil.rmtree(run, ignore_errors=True)
    config.option.basetemp = str(runs / str(os.getpid()))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


@pytest.hookimpl(tryfirst=True)  # before the tmp_path plugin reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    _tests_in_memory(config)
    config.addinivalue_line("markers", "source_contract(*flags): a contract test needing these capability flags")
    config.addinivalue_line("markers", "slow: runs real balancers, replica fleets or a browser; `make test-quick` "
                                       "leaves these out")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Contract tests a source kind has no capability for are deselected (not skipped: CI fails on skips); the
    tests of SLOW_MODULES are marked slow; under xdist each worker's share of the tests starts with its slowest
    (tests/schedule.py), unless the order is random on purpose (`make test-random`)."""
    from tests import schedule
    from tests.source_contract import deselect_unsupported

    deselect_unsupported(config, items)
    for item in items:
        if item.path.stem in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    if workers > 1 and not _random_order(config):
        cache = getattr(config, "cache", None)  # None with -p no:cacheprovider
        durations = cache.get(schedule.CACHE_KEY, {}) if cache is not None else {}
        items[:] = schedule.order(items, workers, durations)


def _random_order(config: pytest.Config) -> bool:
    """Whether pytest-random-order shuffles this run (its own test: an option given, or --random-order)."""
    if config.getoption("random_order_enabled", False):
        return True
    return any(not str(config.getoption(name, "default:")).startswith("default:")
               for name in ("random_order_bucket", "random_order_seed"))


_TIMES: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each test's seconds (setup, call and teardown), gathered where reports arrive: the controller of an xdist
    run, or a serial run."""
    _TIMES[report.nodeid] = _TIMES.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The seconds each test took this time, for tests/schedule.py's next order (workers leave it to the
    controller, which saw every report)."""
    from tests import schedule

    config = session.config
    cache = getattr(config, "cache", None)  # None with -p no:cacheprovider
    if hasattr(config, "workerinput") or cache is None or not _TIMES:
        return
    durations = dict(cache.get(schedule.CACHE_KEY, {}))
    durations.update({nodeid: round(seconds, 2) for nodeid, seconds in _TIMES.items()})
    cache.set(schedule.CACHE_KEY, durations)

