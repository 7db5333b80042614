"""The console's screenshots in docs/, taken from a real `aggregator serve --http` in headless Chromium, so they show
the console as it is: run `.venv/bin/python docs/screenshots.py` after changing the console (the browser tests
run `take()` too, into a temporary folder, so the script keeps working).

One picture per screen, over the test server of tests/console_server.py (a docs folder, a secret folder behind a
scope, an HTTP source on a closed port):

- console.png: the catalog tree and a JSON preview with its detail pane;
- console-detail.png: a resource's detail (title, description, annotations, cache state) and its raw read;
- console-search.png: a search narrowed by mimeType, with its total;
- console-templates.png: a template's form, completed from the data, and the read it previews;
- console-sources.png: the sources, one failing with its cause, counted in the title;
- console-reloads.png: an applied save's changes and a refused save's located error.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the test server's helpers live in tests/
    sys.path.insert(0, str(ROOT))

from tests.console_server import ADMIN, Served, serve  # noqa: E402
from tests.test_live import save  # noqa: E402

CHROMIUM = os.environ.get("AGGREGATOR_CHROMIUM", "/usr/bin/chromium")
WAIT_MS = 15_000
SCREENS = ("console.png", "console-detail.png", "console-search.png", "console-templates.png", "console-sources.png",
           "console-reloads.png")


def _catalog(page: Any, shot: Callable[[str], None]) -> None:
    page.click('#tree button[data-prefix="docs://"]')
    page.click('#tree button[data-uri="docs://api.json"]')
    page.wait_for_selector('#preview [data-testid="detail"]', timeout=WAIT_MS)
    shot("console.png")
    page.click('#crumbs button:text("all")')
    page.click('#tree button[data-prefix="note://"]')
    page.click('#tree button[data-uri="note://hello"]')
    page.wait_for_selector('#preview [data-testid="detail"]', timeout=WAIT_MS)
    page.click('#preview [data-testid="raw"] summary')
    shot("console-detail.png")
    page.fill("#f-q", "guides")
    page.fill("#f-mime", "text/*")
    page.click("#filter button[type=submit]")
    page.wait_for_selector('#tree-count:text("found")', timeout=WAIT_MS)
    page.click('#tree button[data-uri="docs://guides/setup.md"]')
    page.wait_for_selector('#preview [data-testid="detail"]', timeout=WAIT_MS)
    shot("console-search.png")


def _templates(page: Any, shot: Callable[[str], None]) -> None:
    page.click("#tab-templates")
    field = page.locator('li[data-template="guide://{name}"] input')
    field.fill("intro")
    page.click('li[data-template="guide://{name}"] button[type=submit]')
    page.wait_for_selector('#template-preview pre[data-language="markdown"]', timeout=WAIT_MS)
    shot("console-templates.png")


def _reloads(page: Any, served: Served, shot: Callable[[str], None]) -> None:
    page.click("#tab-reloads")
    original = served.manifest.read_text()
    try:
        save(served.manifest, original.replace(
            "resources:\n", 'resources:\n  - {uri: "fresh://news", name: news, text: "just saved"}\n'))
        page.wait_for_selector('#reloads li[data-ok="true"] pre:has-text("+ fresh://news")', timeout=WAIT_MS)
        save(served.manifest, original.replace("collections:", "collections: 7\nbad:"))
        page.wait_for_selector('#reloads li[data-ok="false"]', timeout=WAIT_MS)
        shot("console-reloads.png")
    finally:
        save(served.manifest, original)


def take(out: Path, served: Served, browser: Any | None = None) -> list[Path]:
    """Every screen of SCREENS into `out`, from a console signed in as the admin token of `served`, in `browser` (a
    Playwright Chromium; None: one launched here and closed after)."""
    if browser is None:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as playwright:
            launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                                  args=["--no-sandbox", "--disable-gpu"])
            try:
                return take(out, served, launched)
            finally:
                launched.close()
    out.mkdir(parents=True, exist_ok=True)
    taken: list[Path] = []
    # The HTTP source on a closed port fails once read: the Sources screen shows why, and the title counts it.
    served.get("/console/api/read", uri="web://down")
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = context.new_page()
        page.goto(served.base + "/console")
        page.fill("#token", ADMIN)
        page.click("#login button[type=submit]")
        page.wait_for_selector('#live[data-state="live"]', timeout=WAIT_MS)

        def shot(name: str) -> None:
            page.mouse.move(0, 0)  # no hover highlight in the picture
            page.screenshot(path=str(out / name), full_page=True)
            taken.append(out / name)

        _catalog(page, shot)
        _templates(page, shot)
        page.click("#tab-sources")
        page.wait_for_selector('#sources tr.failing[data-source="web"]', timeout=WAIT_MS)
        shot("console-sources.png")
        _reloads(page, served, shot)
    finally:
        context.close()
    return taken


def main() -> None:
    with tempfile.TemporaryDirectory() as folder, serve(Path(folder)) as served:
        for path in take(Path(__file__).resolve().parent, served):
            print(path.relative_to(ROOT))


if __name__ == "__main__":
    main()
