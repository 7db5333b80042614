"""The console's resource detail pane, deep links and keyboard focus, in Chromium against `aggregator serve --http`.

The detail pane shows what resources/list says of a resource (name, title, description, annotations, size, mimeType),
what the content cache held of it, and the raw JSON of the resources/read result; the URL's fragment names the
selected resource, folder, filter or search, so Back, reload and a shared link restore the view, and a link to a
resource the token may not see shows what a link to a missing one shows. Hostile names and contents stay text.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.console_server import ADMIN, READER, Served, serve
from tests.hostile import make_hostile_folder
from tests.test_console_browser import ARTIFACTS, WAIT_MS, Console, admin, browser, served, sync_api  # noqa: F401

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

XSS_NAME = '<img src=x onerror="window.pwned=1">.md'
XSS_JSON = '{"a": "</pre><img src=x onerror=\\"window.pwned=2\\">", "<b>key</b>": 1}'


def _open(page: Any, *prefixes: str) -> None:
    for prefix in prefixes:
        page.click(f'#tree button[data-prefix="{prefix}"]')
        page.wait_for_selector(f'#crumbs button:text("{prefix}")', timeout=WAIT_MS)


def _field(page: Any, name: str) -> str:
    return str(page.inner_text(f'#preview dd[data-field="{name}"]', timeout=WAIT_MS))


def _preview_of(page: Any, uri: str) -> None:
    page.wait_for_selector(f'#preview h2:text-is("{uri}")', timeout=WAIT_MS)
    page.wait_for_selector('#preview [data-testid="detail"]', timeout=WAIT_MS)


def test_the_detail_pane_shows_metadata_cache_state_and_the_raw_read(admin: Console, served: Served) -> None:
    page = admin.page
    _open(page, "note://")
    page.click('#tree button[data-uri="note://hello"]')
    _preview_of(page, "note://hello")
    assert _field(page, "name") == "hello"
    assert _field(page, "title") == "Hello note"
    assert _field(page, "description") == "A greeting, for the detail pane"
    assert _field(page, "audience") == "user, assistant"
    assert _field(page, "priority") == "0.8"
    assert _field(page, "lastModified") == "2026-01-02T03:04:05Z"
    assert _field(page, "mimeType") == "text/plain"
    assert _field(page, "size") == "11 B"
    assert "not cached" in _field(page, "cache")  # text from the manifest: nothing to cache
    page.click('#preview [data-testid="raw"] summary')
    raw = json.loads(page.inner_text('#preview [data-testid="raw"] pre'))
    assert raw["contents"] == [{"uri": "note://hello", "mimeType": "text/plain", "text": "hello there"}]
    assert raw["cacheScope"] == "public" and raw["ttlMs"] >= 0

    admin.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=served.base)
    page.click("#copy-uri")
    sync_api.expect(page.locator("#copy-uri")).to_have_text("Copied", timeout=WAIT_MS)
    assert page.evaluate("navigator.clipboard.readText()") == "note://hello"

    # A file's first read is a miss that leaves it in the cache; reading it again is a hit.
    page.click('#crumbs button:text("all")')
    _open(page, "docs://", "docs://guides/")
    page.click('#tree button[data-uri="docs://guides/deploy.md"]')
    _preview_of(page, "docs://guides/deploy.md")
    assert _field(page, "cache").startswith("miss")
    assert _field(page, "source") == "docs"
    page.click('#tree button[data-uri="docs://guides/setup.md"]')
    _preview_of(page, "docs://guides/setup.md")
    page.click('#tree button[data-uri="docs://guides/deploy.md"]')
    _preview_of(page, "docs://guides/deploy.md")
    assert _field(page, "cache").startswith("hit")
    assert admin.problems == []


def test_copy_uri_works_without_the_clipboard_api(browser: Any, served: Served) -> None:
    """Over plain http to another host the page is not a secure context and has no navigator.clipboard: the button
    selects the URI and copies it the old way."""
    console = Console(browser, served, ADMIN)
    try:
        page = console.page
        page.add_init_script("Object.defineProperty(Navigator.prototype, 'clipboard', {get: () => undefined})")
        page.reload()
        page.wait_for_selector("#tree li", timeout=WAIT_MS)
        assert page.evaluate("navigator.clipboard") is None
        _open(page, "note://")
        page.click('#tree button[data-uri="note://hello"]')
        _preview_of(page, "note://hello")
        page.click("#copy-uri")
        sync_api.expect(page.locator("#copy-uri")).to_have_text(re.compile("^(Copied|Selected: press Ctrl\\+C)"),
                                                                timeout=WAIT_MS)
        assert page.evaluate("String(window.getSelection())") == "note://hello"
        assert console.problems == []
    finally:
        console.close()


def test_deep_links_restore_the_view_on_back_reload_and_a_shared_link(browser: Any, served: Served,
                                                                       admin: Console) -> None:
    page = admin.page
    _open(page, "docs://", "docs://guides/")
    page.click('#tree button[data-uri="docs://guides/intro.md"]')
    _preview_of(page, "docs://guides/intro.md")
    assert "uri=docs" in page.url and "prefix=docs" in page.url
    page.reload()
    _preview_of(page, "docs://guides/intro.md")
    page.wait_for_selector('#tree button[data-uri="docs://guides/setup.md"]', timeout=WAIT_MS)
    page.go_back()  # the folder, nothing selected
    sync_api.expect(page.locator("#preview .hint")).to_be_visible(timeout=WAIT_MS)
    page.wait_for_selector('#tree button[data-uri="docs://guides/setup.md"]', timeout=WAIT_MS)
    page.go_back()  # one folder up
    page.wait_for_selector('#tree button[data-prefix="docs://guides/"]', timeout=WAIT_MS)
    page.go_forward()
    page.go_forward()
    _preview_of(page, "docs://guides/intro.md")

    page.fill("#f-q", "setup")
    page.fill("#f-mime", "text/*")
    page.click("#filter button[type=submit]")
    sync_api.expect(page.locator("#tree-count")).to_have_text("1 found; 1 shown", timeout=WAIT_MS)
    link = page.url
    assert "q=setup" in link and "mimeType=text" in link
    page.reload()
    sync_api.expect(page.locator("#tree-count")).to_have_text("1 found; 1 shown", timeout=WAIT_MS)
    assert page.input_value("#f-q") == "setup" and page.input_value("#f-mime") == "text/*"

    # A shared link: a new tab asks for its own token, then shows what the link names.
    shared = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        other = shared.new_page()
        other.goto(served.base + "/console#uri=docs%3A%2F%2Fapi.json&prefix=docs%3A%2F%2F")
        other.fill("#token", ADMIN)
        other.click("#login button[type=submit]")
        _preview_of(other, "docs://api.json")
        other.wait_for_selector('#tree button[data-uri="docs://table.csv"]', timeout=WAIT_MS)
    finally:
        shared.close()
    assert admin.problems == []


def test_a_link_to_a_hidden_resource_shows_what_a_missing_one_shows(browser: Any, served: Served) -> None:
    seen = []
    for uri in ("secret://plan.md", "secret://no-such.md"):
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        try:
            page = context.new_page()
            bodies: list[str] = []
            page.on("response", lambda r: bodies.append(r.text()) if "/console/api/" in r.url
                    and "/events" not in r.url else None)
            page.goto(served.base + "/console#prefix=secret%3A%2F%2F&uri=" + quote(uri, safe=""))
            page.fill("#token", READER)
            page.click("#login button[type=submit]")
            page.wait_for_selector('[data-testid="read-error"]', timeout=WAIT_MS)
            page.wait_for_selector("#tree li.hint", timeout=WAIT_MS)
            seen.append((page.inner_text("#preview").replace(uri, "URI"), page.inner_text("#tree"),
                         page.inner_text("#tree-count")))
            assert not any("plan" in body or "classified" in body for body in bodies)
            assert "classified" not in page.content()
        finally:
            context.close()
    assert seen[0] == seen[1]
    assert "Resource not found" in seen[0][0]


def test_hostile_names_and_contents_stay_text_in_the_detail_pane(browser: Any,
                                                                 tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = tmp_path_factory.mktemp("console-hostile")
    hostile = make_hostile_folder(folder)
    (hostile.root / XSS_NAME).write_text("# hostile name\n")
    (hostile.root / "x.json").write_text(XSS_JSON)
    manifest = folder / "manifest.yaml"
    manifest.write_text(
        "version: 1\nserver: {name: hostile, title: \"<i>hostile</i>\", console: true}\n"
        "sources:\n  h: {url: ./hostile}\n"
        "collections:\n  - {source: h, glob: \"**\", uri: \"h://{path}\", name: \"{path}\", title: \"<b>{stem}</b>\","
        " description: \"<script>window.pwned=3</script>\"}\n")
    with serve(folder, manifest) as running:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        try:
            page = context.new_page()
            problems: list[str] = []

            def dialog(opened: Any) -> None:  # an alert() would mean a name or a content ran as script
                problems.append("dialog: " + opened.message)
                opened.dismiss()

            page.on("dialog", dialog)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(running.base + "/console")
            _open(page, "h://")
            names = (XSS_NAME, "x.json", "100%.md", "spaced name.md")
            # The crumbs change before the listing arrives: wait for the tree itself (or fail on what it shows).
            try:
                page.wait_for_function(
                    "uris => uris.every(u => [...document.querySelectorAll('#tree button[data-uri]')]"
                    ".some(b => b.dataset.uri === u))", arg=["h://" + quote(name) for name in names],
                    timeout=WAIT_MS)
            except sync_api.TimeoutError:
                pass  # the assertion below says what the tree showed
            uris = page.eval_on_selector_all("#tree button[data-uri]", "bs => bs.map(b => b.dataset.uri)")
            assert all("h://" + quote(name) in uris for name in names), uris  # a name's URI is percent-encoded
            for name in names:
                uri = "h://" + quote(name)
                page.click(f"#tree button[data-uri={json.dumps(uri)}]")
                sync_api.expect(page.locator("#preview h2")).to_have_text(uri, timeout=WAIT_MS)
                page.wait_for_selector('#preview [data-testid="detail"]', timeout=WAIT_MS)
                page.click('#preview [data-testid="raw"] summary')
                assert json.loads(page.inner_text('#preview [data-testid="raw"] pre'))["contents"][0]["uri"] == uri
                assert _field(page, "name") == name
                assert _field(page, "title") == f"<b>{name.rsplit('.', 1)[0]}</b>"
                assert _field(page, "description") == "<script>window.pwned=3</script>"
            page.goto(running.base + "/console#uri=" + quote("h://" + quote(XSS_NAME), safe=""))
            sync_api.expect(page.locator("#preview h2")).to_have_text("h://" + quote(XSS_NAME), timeout=WAIT_MS)
            page.wait_for_selector('#preview [data-testid="detail"]', timeout=WAIT_MS)
            assert page.evaluate("window.pwned") is None
            assert page.evaluate("document.querySelectorAll('img[src=x], b, i, script:not([src])').length") == 0
            assert problems == []
        finally:
            context.close()


def test_focus_stays_in_the_list_after_load_more_and_enter_on_a_folder(
        browser: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = tmp_path_factory.mktemp("console-many")
    rows = "".join(f'  - {{uri: "many://n{i:03}", name: n{i:03}, text: "{i}"}}\n' for i in range(130))
    manifest = folder / "manifest.yaml"
    manifest.write_text(f"version: 1\nserver: {{name: many, console: true}}\nresources:\n{rows}")
    with serve(folder, manifest) as running:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        try:
            page = context.new_page()
            page.goto(running.base + "/console")
            page.focus('#tree button[data-prefix="many://"]')
            page.keyboard.press("Enter")
            page.wait_for_selector('#tree button[data-uri="many://n000"]', timeout=WAIT_MS)
            assert page.evaluate("document.activeElement.dataset.uri") == "many://n000"
            sync_api.expect(page.locator("#tree li")).to_have_count(100, timeout=WAIT_MS)
            page.focus("#more")
            page.keyboard.press("Enter")
            sync_api.expect(page.locator("#tree li")).to_have_count(130, timeout=WAIT_MS)
            assert page.evaluate("document.activeElement.dataset.uri") == "many://n100"  # the first new row
        finally:
            context.close()


def test_axe_finds_no_violations_in_the_detail_pane_search_results_and_sign_in(admin: Console) -> None:
    from axe_playwright_python.sync_playwright import Axe

    axe, page = Axe(), admin.page
    found: dict[str, list[str]] = {}

    def check(screen: str) -> None:
        violations = [f"{v['id']} ({v.get('impact')}): {v['help']}" for v in axe.run(page).response["violations"]]
        if violations:
            found[screen] = violations

    _open(page, "note://")
    page.click('#tree button[data-uri="note://hello"]')
    _preview_of(page, "note://hello")
    page.click('#preview [data-testid="raw"] summary')
    page.wait_for_selector('#preview [data-testid="raw"] pre', timeout=WAIT_MS)
    check("detail")
    page.fill("#f-q", "guides")
    page.click("#filter button[type=submit]")
    sync_api.expect(page.locator("#tree-count")).to_have_text("3 found; 3 shown", timeout=WAIT_MS)
    check("search")
    page.click("#sign-out")
    page.wait_for_selector("#login:not([hidden])", timeout=WAIT_MS)
    check("sign-in")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "axe-detail.json").write_text(json.dumps(found, indent=2))
    assert found == {}


def test_the_docs_screenshots_script_takes_every_screen_the_docs_show(browser: Any, served: Served,
                                                                     tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("screenshots", ROOT / "docs" / "screenshots.py")
    assert spec is not None and spec.loader is not None
    screenshots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(screenshots)
    taken = screenshots.take(tmp_path, served, browser)
    assert sorted(p.name for p in taken) == sorted(screenshots.SCREENS)
    for path in taken:
        assert path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 10_000, path
    documented = (ROOT / "README.md").read_text()
    for name in screenshots.SCREENS:
        assert f"(docs/{name})" in documented, name  # the README shows each, and each is in docs/
        assert (ROOT / "docs" / name).is_file(), name
