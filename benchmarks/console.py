"""The operator console on a 100,000-resource catalog: server time per page of the tree (in process, and through HTTP
on loopback), the catalog page's first paint in headless chromium, and a manifest save -> the open page updated.
`python -m benchmarks.console [--count 100000] [--rounds 20]` prints them and writes its section of
docs/benchmarks.md. Needs playwright (the test extra) and Debian's chromium (`apt-get install chromium`)."""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio

from benchmarks.machine import describe as describe_machine
from benchmarks.sections import CONSOLE, DOCS, write_section
from benchmarks.workload import generate

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / ".data"
CHROMIUM = os.environ.get("AGGREGATOR_CHROMIUM", "/usr/bin/chromium")
PAGE = 100


def manifest_text(root: Path, extra: str = "") -> str:
    return (f"version: 1\nserver: {{name: console-bench, reloadSettle: 0s, console: true}}\n"
            f"sources:\n  files: {{url: {root}}}\n"
            f"collections:\n  - {{source: files, glob: \"**/*.md\", uri: \"bench://{{path}}\"}}\n{extra}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def _server(manifest: Path) -> Iterator[str]:
    import httpx2 as httpx

    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "aggregator", "serve", str(manifest), "--http", str(port)],
                               env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                httpx.get(base + "/healthz", timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the server did not start") from None
                time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        process.wait(30)


def _median_ms(run: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def visible(manifest: Path) -> tuple[Any, list[str]]:
    """The compiled catalog's entries and their sorted URIs (what the console pages over), compiled once."""
    from aggregator.compiler import compile_catalog
    from aggregator.manifest import load_manifest
    from aggregator.service import open_sources

    async def catalog() -> Any:
        loaded = load_manifest(manifest)
        return await compile_catalog(loaded, open_sources(loaded))

    return anyio.run(catalog).visible(None)  # type: ignore[no-any-return]


def tree_levels(entries: Any, uris: list[str]) -> list[tuple[str, str, str | None]]:
    """(label, prefix, cursor) of the pages measured: the top, a page of folders, a later one, a page of files."""
    from aggregator.console.tree import tree_page

    cursor = None
    for _ in range(min(9, len(uris) // 100 // PAGE)):
        cursor = tree_page(entries, uris, "bench://", cursor, PAGE).next_cursor
    folders, middle = (len(uris) + 99) // 100, f"bench://d{len(uris) // 200:04}/"
    levels: list[tuple[str, str, str | None]] = [
        ("top level (1 child)", "", None),
        (f"bench:// first page ({min(PAGE, folders)} of {folders:,} folders)", "bench://", None)]
    if cursor:
        levels.append(("bench:// tenth page (cursor)", "bench://", cursor))
    return levels + [(f"{middle} (100 files)", middle, None)]


def server_times(entries: Any, uris: list[str], levels: list[tuple[str, str, str | None]], rounds: int
                 ) -> dict[str, float]:
    """Median ms to build one tree page and its JSON response, in process."""
    from starlette.responses import JSONResponse

    from aggregator.console.tree import tree_page
    from aggregator.console.views import tree_view

    return {label: _median_ms(lambda: JSONResponse(tree_view(tree_page(entries, uris, prefix, cursor, PAGE))),
                              rounds) for label, prefix, cursor in levels}


def scoped_times(entries: Any, rounds: int) -> dict[str, float]:
    """A catalog where every other folder needs a scope: a caller without it pages over its own view, which the
    catalog filters once per scope set and generation (the first page after a reload pays for it)."""
    import dataclasses

    from starlette.responses import JSONResponse

    from aggregator.catalog import Catalog
    from aggregator.console.tree import tree_page
    from aggregator.console.views import tree_view

    hidden = frozenset({"team"})
    restricted = [dataclasses.replace(e, access=hidden) if int(e.uri[9:13]) % 2 else e for e in entries]
    scopes = frozenset({"other"})

    def first_page() -> None:
        catalog = Catalog(restricted, [])  # a new generation: no view of it yet
        started = time.perf_counter()
        view, uris = catalog.visible(scopes)
        JSONResponse(tree_view(tree_page(view, uris, "bench://", None, PAGE)))
        times.append((time.perf_counter() - started) * 1000)

    times: list[float] = []
    for _ in range(max(3, rounds // 4)):
        first_page()
    catalog = Catalog(restricted, [])
    view, uris = catalog.visible(scopes)
    return {"scoped caller, first page of a new generation (filters its view)": statistics.median(times),
            "scoped caller, next pages": _median_ms(
                lambda: JSONResponse(tree_view(tree_page(*catalog.visible(scopes), "bench://", None, PAGE))),
                rounds)}


def http_times(base: str, levels: list[tuple[str, str, str | None]], rounds: int) -> dict[str, float]:
    """Median ms per GET /console/api/tree through HTTP on loopback (keep-alive), page bodies checked."""
    import httpx2 as httpx

    out = {}
    with httpx.Client(base_url=base, timeout=30) as client:
        for label, prefix, cursor in levels:
            params = {"prefix": prefix, "limit": str(PAGE), **({"cursor": cursor} if cursor else {})}

            def get() -> None:
                response = client.get("/console/api/tree", params=params)
                assert response.status_code == 200 and response.json()["children"], response.text

            get()
            out[label] = _median_ms(get, rounds)
    return out


def stream_times(base: str, manifest: Path, root: Path, rounds: int) -> list[float]:
    """Manifest save -> the `catalog` event on an open /console/api/events stream (ms): the server's part of a live
    update (reload, list_changed, the event), without a browser."""
    import threading

    import httpx2 as httpx

    arrived: list[float] = []
    signal = threading.Condition()

    def read() -> None:
        with httpx.Client(timeout=httpx.Timeout(30, read=None)) as client:
            with client.stream("GET", base + "/console/api/events") as response:
                for line in response.iter_lines():
                    if line == "event: catalog":
                        with signal:
                            arrived.append(time.perf_counter())
                            signal.notify_all()

    threading.Thread(target=read, daemon=True).start()
    time.sleep(0.5)
    out = []
    for i in range(rounds):
        seen = len(arrived)
        started = time.perf_counter()
        _save(manifest, manifest_text(root, f"resources:\n  - {{uri: \"stream{i}://x\", name: x, text: x}}\n"))
        with signal:
            if not signal.wait_for(lambda: len(arrived) > seen, timeout=20):
                raise RuntimeError("no catalog event")
            out.append((arrived[seen] - started) * 1000)
        time.sleep(0.2)
    return out


def _save(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp~")
    tmp.write_text(text)
    os.replace(tmp, path)


OBSERVE = """(selector) => {
  window.seenAt = null;
  new MutationObserver((_, observer) => {
    if (document.querySelector(selector)) { window.seenAt = Date.now(); observer.disconnect(); }
  }).observe(document.body, {subtree: true, childList: true});
}"""


def browser_times(base: str, manifest: Path, root: Path, rounds: int) -> dict[str, list[float]]:
    """First contentful paint and the catalog's first rows (ms from navigation start) in new tabs; then, in an open
    tab, a manifest save -> the new entry's folder shown (ms, measured from the save)."""
    from playwright.sync_api import sync_playwright

    results: dict[str, list[float]] = {"first contentful paint": [], "catalog rows painted": [],
                                       "save -> open page updated": []}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=["--no-sandbox", "--disable-gpu"])
        try:
            for _ in range(rounds):
                context = browser.new_context()
                page = context.new_page()
                page.goto(base + "/console")
                page.wait_for_selector("#tree li")
                paint = page.evaluate("() => performance.getEntriesByName('first-contentful-paint')[0]?.startTime")
                ready = page.evaluate("() => performance.getEntriesByName('console:catalog-ready')[0].startTime")
                results["first contentful paint"].append(float(paint))
                results["catalog rows painted"].append(float(ready))
                context.close()
            context = browser.new_context()
            page = context.new_page()
            page.goto(base + "/console")
            page.wait_for_selector('#live[data-state="live"]')
            for i in range(rounds):
                selector = f'#tree button[data-prefix="fresh{i}://"]'
                # The page notes when the entry appears (Playwright's own waiting polls at growing intervals).
                page.evaluate(OBSERVE, selector)
                started = time.time()
                _save(manifest, manifest_text(root, f"resources:\n  - {{uri: \"fresh{i}://x\", name: x, text: x}}\n"))
                page.wait_for_selector(selector, timeout=20_000)
                results["save -> open page updated"].append(page.evaluate("() => window.seenAt") - started * 1000)
                time.sleep(0.2)
            context.close()
        finally:
            browser.close()
    return results


def section(count: int, server: dict[str, float], scoped: dict[str, float], http: dict[str, float],
            browser: dict[str, list[float]], command: str) -> str:
    started = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
    rows = [f"| {label} | {server[label]:.2f} | {http[label]:.2f} |" for label in server]
    rows += [f"| {label} | {value:.2f} | (in process only) |" for label, value in scoped.items()]
    browser_rows = [f"| {name} | {statistics.median(v):.0f} | {max(v):.0f} | {len(v)} |" for name, v in browser.items()]
    return "\n".join([
        CONSOLE, "",
        f"Run {started} with `{command}` on {describe_machine()}: `aggregator serve --http` with "
        "`server.console: true` "
        f"over {count:,} generated files (`bench://dNNNN/fNNN.md`, 100 a folder), no auth. Server time builds one "
        "page of the tree (100 children: each folder is counted and skipped by bisection, so a page never walks "
        "the entries below it) and its JSON response, in process over the compiled catalog; HTTP is the same "
        "request through `GET /console/api/tree` on loopback (keep-alive, median). Targets: each page < 100 ms "
        "server time; first paint of the catalog < 1 s. The scoped rows page the same catalog with every other "
        "folder behind a scope the caller lacks: its view is filtered once per scope set and catalog generation.",
        "",
        "| tree page | server time (ms, median) | through HTTP (ms, median) |", "|---|---|---|", *rows, "",
        "Headless chromium (Debian's, driven by Playwright), a new tab per round: the first contentful paint and the "
        "catalog's first rows (the page's own `console:catalog-ready` mark, after /whoami and the first tree page), "
        "in ms from navigation start; then, in one open tab, the manifest saved atomically (`reloadSettle: 0s`) to "
        "the new entry's folder shown by the page (server-sent events, no page reload; a MutationObserver the "
        "benchmark puts in the page notes the moment). The first row is the server's part alone (reload of the "
        "catalog, list_changed, the event), timed on a plain event stream.", "",
        "| browser | median (ms) | max (ms) | rounds |", "|---|---|---|---|", *browser_rows, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--output", type=Path, default=DOCS, help="the Markdown file whose section to rewrite")
    args = parser.parse_args()
    root = generate(DATA, args.count, prefix="console")
    manifest = DATA / f"console-{args.count}.yaml"
    manifest.write_text(manifest_text(root))
    entries, uris = visible(manifest)
    levels = tree_levels(entries, uris)
    server = server_times(entries, uris, levels, args.rounds)
    scoped = scoped_times(entries, args.rounds)
    with _server(manifest) as base:
        http = http_times(base, levels, args.rounds)
        rounds = max(5, args.rounds // 4)
        browser = {"save -> catalog event on the stream (no browser)": stream_times(base, manifest, root, rounds),
                   **browser_times(base, manifest, root, rounds)}
    text = section(args.count, server, scoped, http, browser,
                   " ".join(["python -m benchmarks.console", *sys.argv[1:]]))
    print(text)
    write_section(args.output, text)


if __name__ == "__main__":
    main()
