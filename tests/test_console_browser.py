"""The console in a real browser: Playwright driving Debian's chromium, headless, against `aggregator serve --http`.

Clicks through catalog -> preview -> template form -> sources -> reloads, checks that a save of the manifest updates
the open page live (no page reload), that a token without a scope sees no hidden entry in any tab or any JSON the page
fetched, and that axe-core finds no serious violations. Screenshots go to tests/artifacts/console/ (ignored by git).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.console_server import ADMIN, READER, Served, serve
from tests.test_live import save

CHROMIUM = os.environ.get("AGGREGATOR_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parent / "artifacts" / "console"
WAIT_MS = 15_000  # generous: a wait, never a timing assertion

sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (the test extra)")
if not shutil.which(CHROMIUM):
    pytest.skip(f"the browser tests need chromium at {CHROMIUM} (apt-get install chromium; .ci/run installs it)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                              args=["--no-sandbox", "--disable-gpu"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(tmp_path_factory.mktemp("console-browser")) as running:
        yield running


class Console:
    """One signed-in console tab, recording what the page fetched from /console/api/ and what went wrong."""

    def __init__(self, browser: Any, served: Served, token: str) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 800})
        self.page = self.context.new_page()
        self.problems: list[str] = []
        self.bodies: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.problems.append(str(e)))
        self.page.on("response", self._response)
        self.page.goto(served.base + "/console")
        self.page.fill("#token", token)
        self.page.click("#login button[type=submit]")
        self.page.wait_for_selector("#tree li", timeout=WAIT_MS)

    def _console(self, message: Any) -> None:
        # Refusals the page asked for (401 before signing in, 413 for a file past maxBytes) are expected; a CSP
        # violation or a script error is not.
        expected = ("status of 401", "status of 413")
        if message.type == "error" and not any(e in message.text for e in expected):
            self.problems.append(message.text)

    def _response(self, response: Any) -> None:
        if "/console/api/" in response.url and "/events" not in response.url and "/raw" not in response.url:
            try:
                self.bodies.append(response.text())
            except Exception:  # noqa: BLE001 - a body the page abandoned (navigation): nothing to check
                pass

    def tab(self, name: str) -> None:
        self.page.click(f"#tab-{name}")
        self.page.wait_for_selector(f"#panel-{name}:not([hidden])", timeout=WAIT_MS)

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def admin(browser: Any, served: Served) -> Iterator[Console]:
    console = Console(browser, served, ADMIN)
    try:
        yield console
    finally:
        console.close()


def test_click_through_catalog_preview_templates_sources_reloads(admin: Console) -> None:
    page = admin.page
    page.click('#tree button[data-prefix="docs://"]')
    page.click('#tree button[data-prefix="docs://guides/"]')
    page.click('#tree button[data-uri="docs://guides/intro.md"]')
    page.wait_for_selector('#preview pre[data-language="markdown"] .tok-h', timeout=WAIT_MS)
    assert "# Intro" in page.inner_text("#preview pre")
    page.click('#crumbs button:text("docs://")')
    page.click('#tree button[data-uri="docs://api.json"]')
    page.wait_for_selector('#preview pre[data-language="json"] .tok-key', timeout=WAIT_MS)
    admin.shot("preview")
    page.click('#tree button[data-uri="docs://table.csv"]')
    page.wait_for_selector('#preview table[data-language="csv"] td:text("Rome, IT")', timeout=WAIT_MS)
    page.click('#tree button[data-uri="docs://logo.png"]')
    image = page.wait_for_selector("#preview img", timeout=WAIT_MS)
    sync_api.expect(page.locator("#preview img")).to_have_attribute("src", re.compile("^blob:"), timeout=WAIT_MS)
    assert image.get_attribute("alt") == "Preview of docs://logo.png"
    page.click('#tree button[data-uri="docs://huge.txt"]')
    error = page.wait_for_selector('[data-testid="read-error"]', timeout=WAIT_MS)
    assert "413" in error.inner_text() and "8192" in error.inner_text()
    # Filters narrow to a flat list; search finds by words.
    page.fill("#f-name", "*.json")
    page.click("#filter button[type=submit]")
    sync_api.expect(page.locator("#tree li")).to_have_count(1, timeout=WAIT_MS)
    sync_api.expect(page.locator('#tree button[data-uri="docs://api.json"]')).to_be_visible()
    page.click("#filter button[type=reset]")
    page.fill("#f-q", "setup")
    page.click("#filter button[type=submit]")
    sync_api.expect(page.locator("#tree li").first).to_contain_text("docs://guides/setup.md", timeout=WAIT_MS)
    page.click("#filter button[type=reset]")
    page.wait_for_selector('#tree button[data-prefix="docs://"]', timeout=WAIT_MS)
    admin.shot("catalog")

    admin.tab("templates")
    field = page.locator('li[data-template="guide://{name}"] input')
    field.fill("in")
    page.wait_for_selector('li[data-template="guide://{name}"] datalist option[value="intro"]', state="attached",
                           timeout=WAIT_MS)
    field.fill("intro")
    page.click('li[data-template="guide://{name}"] button[type=submit]')
    page.wait_for_selector('#template-preview h2:text("guide://intro")', timeout=WAIT_MS)
    page.wait_for_selector('#template-preview pre[data-language="markdown"]', timeout=WAIT_MS)
    admin.shot("templates")

    admin.tab("sources")
    page.wait_for_selector('#sources tr[data-source="docs"]', timeout=WAIT_MS)
    assert page.locator("#sources tbody tr").count() == 3
    admin.shot("sources")

    admin.tab("reloads")
    page.wait_for_selector("#reloads li", timeout=WAIT_MS)
    admin.shot("reloads")
    assert admin.problems == []


def test_a_failing_source_is_highlighted_with_its_cause_and_counted_in_the_title(browser: Any,
                                                                                 served: Served) -> None:
    assert served.get("/console/api/read", uri="web://down").status_code == 502  # the web source's port is closed
    console = Console(browser, served, ADMIN)
    try:
        page = console.page
        # Only web: a file past maxBytes read earlier (docs) is the file's problem, not a failing source.
        sync_api.expect(page).to_have_title(re.compile(r"^\(1 source failing\) "), timeout=WAIT_MS)
        sync_api.expect(page.locator('[data-testid="failing"]')).to_contain_text("web", timeout=WAIT_MS)
        console.tab("sources")
        row = page.wait_for_selector('#sources tr.failing[data-source="web"]', timeout=WAIT_MS)
        text = row.inner_text()
        assert "failing" in text and "127.0.0.1" in text and "never" in text  # the cause; no success yet
        assert "hunter2" not in text
        assert page.locator("#sources tr.failing").count() == 1
        console.shot("sources-failing")
        assert console.problems == []
    finally:
        console.close()


def test_search_shows_a_total_and_honours_the_filters(admin: Console) -> None:
    page = admin.page
    page.fill("#f-q", "guides")
    page.click("#filter button[type=submit]")
    sync_api.expect(page.locator("#tree-count")).to_have_text("3 found; 3 shown", timeout=WAIT_MS)
    page.fill("#f-mime", "text/csv")
    page.click("#filter button[type=submit]")
    sync_api.expect(page.locator("#tree-count")).to_have_text("0 found; 0 shown", timeout=WAIT_MS)
    page.click("#filter button[type=reset]")
    assert admin.problems == []


def test_a_refused_token_says_so_and_sign_out_and_keyboard_keep_focus(browser: Any, served: Served) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = context.new_page()
        page.goto(served.base + "/console")
        page.fill("#token", "not-a-token")
        page.click("#login button[type=submit]")
        sync_api.expect(page.locator("#login-why")).to_contain_text("refused", timeout=WAIT_MS)
        page.fill("#token", ADMIN)
        page.click("#login button[type=submit]")
        page.wait_for_selector('#tree button[data-prefix="docs://"]', timeout=WAIT_MS)
        page.focus('#tree button[data-prefix="docs://"]')
        page.keyboard.press("Enter")  # opening a folder from the keyboard keeps focus in the tree
        page.wait_for_selector('#tree button[data-prefix="docs://guides/"]', timeout=WAIT_MS)
        assert page.evaluate("document.activeElement.closest('#tree') !== null")
        page.click("#sign-out")
        sync_api.expect(page.locator("#login")).to_be_visible(timeout=WAIT_MS)
        assert page.evaluate("document.activeElement.id") == "token"
        assert page.evaluate("sessionStorage.length") == 0  # the token is gone
    finally:
        context.close()


def test_the_open_preview_refreshes_when_its_file_changes(admin: Console, served: Served) -> None:
    page = admin.page
    page.click('#tree button[data-prefix="docs://"]')
    page.click('#tree button[data-uri="docs://api.json"]')
    page.wait_for_selector('#preview pre[data-language="json"]', timeout=WAIT_MS)
    time.sleep(0.3)  # the read named the page's stream; the watcher is up
    (served.folder / "docs" / "api.json").write_text('{"name": "api", "version": 4, "refreshed": true}')
    sync_api.expect(page.locator("#preview pre").first).to_contain_text("refreshed", timeout=WAIT_MS)  # then the raw
    assert admin.problems == []


def test_a_save_updates_the_open_page_without_reloading_it(admin: Console, served: Served) -> None:
    page = admin.page
    page.evaluate("window.stillTheSamePage = true")
    page.wait_for_selector('#live[data-state="live"]', timeout=WAIT_MS)
    original = served.manifest.read_text()
    try:
        started = time.monotonic()
        save(served.manifest, original.replace(
            "resources:\n", 'resources:\n  - {uri: "fresh://news", name: news, text: "just saved"}\n'))
        page.wait_for_selector('#tree button[data-prefix="fresh://"]', timeout=WAIT_MS)
        seconds = time.monotonic() - started
        admin.tab("reloads")
        page.wait_for_selector('#reloads li[data-ok="true"] pre:has-text("+ fresh://news")', timeout=WAIT_MS)
        assert page.evaluate("window.stillTheSamePage") is True
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "save-to-page.json").write_text(json.dumps({"seconds": round(seconds, 3)}))
        # A broken save shows its located error, and the page keeps serving the last good catalog.
        save(served.manifest, original.replace("collections:", "collections: 7\nbad:"))
        page.wait_for_selector('#reloads li[data-ok="false"] li:has-text("manifest.yaml:")', timeout=WAIT_MS)
        admin.shot("reload-refused")
    finally:
        save(served.manifest, original)
        page.wait_for_selector('#reloads li[data-ok="true"] pre:has-text("- fresh://news")', timeout=WAIT_MS)
    assert admin.problems == []


def test_a_token_without_the_scope_sees_no_hidden_entry_in_the_page(browser: Any, served: Served) -> None:
    reader = Console(browser, served, READER)
    try:
        page = reader.page
        texts = [page.content()]
        page.click('#tree button[data-prefix="docs://"]')
        page.wait_for_selector('#tree button[data-uri="docs://api.json"]', timeout=WAIT_MS)
        page.fill("#f-q", "classified plan")
        page.click("#filter button[type=submit]")
        page.wait_for_selector("#tree li", timeout=WAIT_MS)
        texts.append(page.content())
        for name in ("templates", "sources", "reloads"):
            reader.tab(name)
            page.wait_for_selector(f"#panel-{name} li, #panel-{name} tr", timeout=WAIT_MS)
            texts.append(page.content())
        assert page.locator("#viewas").is_hidden()
        # A save adding a hidden entry does not reach the open page at all (no `reload`, no `catalog` event:
        # nothing the reader may see changed); the next save, which adds a visible entry too, does.
        original = served.manifest.read_text()
        assert "generation" not in page.inner_text("#facts")  # a scoped caller is told no catalog generation
        generation = served.get("/console/api/whoami").json()["generation"]  # the admin's
        listed = page.locator("#reloads > li[data-ok]").count()
        try:
            hidden = original.replace("resources:\n", 'resources:\n  - {uri: "secret://memo", '
                                      'name: memo, text: "hush", access: {scopes: [secret]}}\n')
            save(served.manifest, hidden)
            deadline = time.monotonic() + WAIT_MS / 1000  # the hidden save applied (the admin sees it) ...
            while served.get("/console/api/whoami").json()["generation"] != generation + 1:
                assert time.monotonic() < deadline, "the hidden save was not applied"
                time.sleep(0.05)
            time.sleep(0.3)  # ... and its events sent, which the page must not hear of
            save(served.manifest, hidden.replace("resources:\n", 'resources:\n  - {uri: "fresh://seen", '
                                                 'name: seen, text: "seen"}\n'))
            sync_api.expect(page.locator("#live")).to_have_text(re.compile(r"^(reloaded|catalog changed)$"),
                                                                timeout=WAIT_MS)
            reader.tab("reloads")
            sync_api.expect(page.locator("#reloads > li[data-ok]").first).to_contain_text("+ fresh://seen",
                                                                                         timeout=WAIT_MS)
            # The hidden save is not listed (the page shows the last 10).
            assert page.locator("#reloads > li[data-ok]").count() == min(listed + 1, 10)
            assert page.locator("#reloads li[data-generation]").count() == 0
            texts.append(page.content())
            reader.tab("catalog")
            page.wait_for_selector("#tree li", timeout=WAIT_MS)
            texts.append(page.content())
        finally:
            save(served.manifest, original)
        reader.shot("reader")
        for text in texts + reader.bodies:
            assert "secret" not in text.lower().replace("secrets", ""), text[:2000]
        assert reader.bodies, "the page fetched nothing from /console/api/"
    finally:
        reader.close()


def test_an_admin_views_as_a_scope(admin: Console) -> None:
    page = admin.page
    assert page.locator('#tree button[data-prefix="secret://"]').count() == 1
    page.select_option("#viewas-select", "")
    page.select_option("#viewas-select", ",")
    sync_api.expect(page.locator('#tree button[data-prefix="secret://"]')).to_have_count(0, timeout=WAIT_MS)
    page.select_option("#viewas-select", "*")
    page.wait_for_selector('#tree button[data-prefix="secret://"]', timeout=WAIT_MS)


def test_axe_finds_no_violations_of_any_impact(admin: Console) -> None:
    from axe_playwright_python.sync_playwright import Axe

    axe = Axe()
    page = admin.page
    page.click('#tree button[data-prefix="docs://"]')
    page.click('#tree button[data-uri="docs://api.json"]')
    page.wait_for_selector('#preview pre[data-language="json"]', timeout=WAIT_MS)
    found: dict[str, list[str]] = {}
    for name in ("catalog", "templates", "sources", "reloads"):
        admin.tab(name)
        page.wait_for_selector(f"#panel-{name} li, #panel-{name} tr", timeout=WAIT_MS)
        results = axe.run(page)
        serious = [f"{v['id']} ({v.get('impact')}): {v['help']} ({len(v['nodes'])} nodes)"
                   for v in results.response["violations"]]  # any impact, moderate and minor included
        if serious:
            found[name] = serious
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "axe.json").write_text(json.dumps(found, indent=2))
    assert found == {}
