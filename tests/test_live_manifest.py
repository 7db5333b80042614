"""Reloading the manifest when it is saved (aggregator/live/manifest.py), in one process: ConfigMap swaps, a soak of
saves folding into few reloads, settings fixed at start, the settle window, the guard, a FIFO in the manifest's place."""

from __future__ import annotations

import asyncio
import gc
import os
import tracemalloc
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.conftest import write_manifest
from tests.test_live import BASE, save
from tests.test_live_inprocess import docs, running  # noqa: F401 - `docs` is the fixture


def test_configmap_symlink_swap_reloads(tmp_path: Path) -> None:
    """Kubernetes mounts a ConfigMap as m.yaml -> ..data/m.yaml, ..data -> ..<timestamp>; updates swap ..data."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("a")
    mount = tmp_path / "config"
    first = mount / "..2026_01"
    first.mkdir(parents=True)
    (first / "m.yaml").write_text(BASE.replace("./docs", str(tmp_path / "docs")))
    os.symlink("..2026_01", mount / "..data")
    os.symlink("..data/m.yaml", mount / "m.yaml")

    async def main() -> None:
        async with running(mount / "m.yaml") as (server, live):
            second = mount / "..2026_02"
            second.mkdir()
            (second / "m.yaml").write_text(BASE.replace("./docs", str(tmp_path / "docs")) +
                                           'resources:\n  - {uri: "note://cm", name: cm, text: swapped}\n')
            os.symlink("..2026_02", mount / "..data_tmp")
            os.replace(mount / "..data_tmp", mount / "..data")
            with anyio.fail_after(5):
                while live.service.catalog.get("note://cm") is None:
                    await anyio.sleep(0.02)
            assert live.reloads == 1

    anyio.run(main)


def test_soak_200_saves_bounded_notifications_no_leaks(docs: Path) -> None:
    async def main() -> None:
        async with running(docs) as (server, live):
            async with Client(server, mode="legacy", cache=None) as client:
                await client.list_resources()
                gc.collect()
                tasks_before = len(asyncio.all_tasks())
                tracemalloc.start()
                base_memory = tracemalloc.get_traced_memory()[0]
                for i in range(200):
                    save(docs, BASE + f'resources:\n  - {{uri: "note://n{i % 7}", name: n, text: "{i}"}}\n')
                    await anyio.sleep(0.002)
                with anyio.fail_after(10):  # the saves settle, then one reload serves the last
                    while live.service.catalog.get("note://n3") is None:
                        await anyio.sleep(0.05)
                await anyio.sleep(0.5)
                gc.collect()
                grown = tracemalloc.get_traced_memory()[0] - base_memory
                tracemalloc.stop()
                sent = live.notifier.sent_list_changed
                print(f"200 saves -> {sent} list_changed, {live.reloads} reloads, {grown} bytes grown")
                assert 1 <= sent <= 60, sent  # debounced and folded: far fewer than 200
                assert live.reload_errors == 0
                assert len(asyncio.all_tasks()) <= tasks_before
                assert grown < 5_000_000, grown
                final = [r.uri for r in (await client.list_resources()).resources]
                assert "note://n3" in final  # the last save (199 % 7 == 3) is what serves

    anyio.run(main)


def test_settings_fixed_at_start_are_named_on_reload(docs: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A reload that changes server.tools or server.auth applies the rest and says which settings wait for a
    restart."""
    async def main() -> None:
        async with running(docs) as (server, live):
            save(docs, BASE.replace("server: {name: live}", "server: {name: live, tools: true}") +
                 'resources:\n  - {uri: "note://n", name: n, text: "n"}\n')
            with anyio.fail_after(5):
                while live.service.catalog.get("note://n") is None:
                    await anyio.sleep(0.02)

    with caplog.at_level("WARNING", logger="aggregator.supervisor"):
        anyio.run(main)
    assert "server.tools changed: it applies when the server restarts" in caplog.text


def _write_in_place(path: Path, chunks: list[str]) -> Any:
    """Rewrite `path` in place, as a shell redirect or a plain editor save does, one chunk per call of `next()`."""
    with path.open("r+") as handle:
        handle.truncate(0)
        for chunk in chunks:
            handle.write(chunk)
            handle.flush()
            yield


def test_reload_waits_until_the_manifest_settles(docs: Path) -> None:
    """A save written in five chunks 0.1 s apart (prefixes valid or not) is read once, whole, when it settled."""
    write_manifest(docs.parent, BASE.replace("{name: live}", "{name: live, reloadSettle: 1s}"))
    new = BASE.replace("{name: live}", "{name: live, reloadSettle: 1s}") + \
        'resources:\n  - {uri: "note://n", name: n, text: hello}\n'
    step = len(new) // 5 + 1

    async def main() -> None:
        async with running(docs) as (server, live):
            assert live.service.manifest.server.reload_settle == 1.0
            for _ in _write_in_place(docs, [new[i:i + step] for i in range(0, len(new), step)]):
                await anyio.sleep(0.1)
            with anyio.fail_after(10):
                while live.service.catalog.get("note://n") is None:
                    await anyio.sleep(0.02)
            assert (live.reloads, live.reload_errors, live.suspicious_reloads) == (1, 0, 0)
            assert live.service.catalog.get("docs://a.md") is not None

    anyio.run(main)


def test_suspicious_reload_waits_and_the_rest_of_the_save_wins(docs: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A settled first half that declares the source but lists nothing is held one more window; the rest of the
    save arriving meanwhile is what gets loaded, and the resource in both versions never goes away."""
    head = BASE.replace("{name: live}", "{name: live, reloadSettle: 300ms}")
    write_manifest(docs.parent, head)
    new = head + 'resources:\n  - {uri: "note://n", name: n, text: hello}\n'
    cut = new.index("collections:")
    missing = 0

    async def main() -> None:
        nonlocal missing
        async with running(docs) as (server, live):
            done = anyio.Event()

            async def watch_catalog() -> None:
                nonlocal missing
                while not done.is_set():
                    missing += live.service.catalog.get("docs://a.md") is None
                    await anyio.sleep(0.005)

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_catalog)
                writer = _write_in_place(docs, [new[:cut], new[cut:]])
                next(writer)
                with anyio.fail_after(5):
                    while live.suspicious_reloads == 0:
                        await anyio.sleep(0.01)
                next(writer, None)
                with anyio.fail_after(5):
                    while live.service.catalog.get("note://n") is None:
                        await anyio.sleep(0.02)
                done.set()
            assert (live.reloads, live.reload_errors, live.suspicious_reloads) == (1, 0, 1)

    with caplog.at_level("INFO", logger="aggregator.supervisor"):
        anyio.run(main)
    assert missing == 0
    assert "would remove every resource of source(s) 'docs'" in caplog.text
    assert "changed again: reloading its new content instead" in caplog.text


def test_deliberate_emptying_applies_after_one_more_window(docs: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Dropping every collection over a source that stays declared is held one settle window, then applied and
    told to clients; emptying a catalog of inline resources is held the same way."""
    head = BASE.replace("{name: live}", "{name: live, reloadSettle: 200ms}")
    write_manifest(docs.parent, head)

    async def main() -> None:
        async with running(docs) as (server, live):
            async with Client(server, mode="auto", cache=None) as client:
                async with client.listen(resources_list_changed=True) as sub:
                    await anyio.sleep(0.2)
                    save(docs, head[:head.index("collections:")] +
                         'resources:\n  - {uri: "note://only", name: only, text: hi}\n')
                    with anyio.fail_after(5):
                        while live.suspicious_reloads == 0:
                            await anyio.sleep(0.01)
                    assert live.service.catalog.get("docs://a.md") is not None  # held back
                    with anyio.fail_after(5):
                        await sub.__anext__()  # list_changed once applied
                    assert [r.uri for r in (await client.list_resources()).resources] == ["note://only"]
                    assert (live.reloads, live.suspicious_reloads) == (1, 1)

                    save(docs, "version: 1\nserver: {name: live, reloadSettle: 200ms}\n")  # nothing at all
                    with anyio.fail_after(5):
                        await sub.__anext__()
                    assert (await client.list_resources()).resources == []
                    assert (live.reloads, live.suspicious_reloads) == (2, 2)

    with caplog.at_level("WARNING", logger="aggregator.supervisor"):
        anyio.run(main)
    assert "would remove every resource of source(s) 'docs'" in caplog.text
    assert "would remove every resource of the catalog" in caplog.text
    assert caplog.text.count("stayed unchanged: applying the reload") == 2


def test_reload_settle_is_a_located_duration(tmp_path: Path) -> None:
    from aggregator.manifest import load_manifest
    from aggregator.manifest.model import ManifestError

    ok = write_manifest(tmp_path, "version: 1\nserver: {name: s, reloadSettle: 250ms}\n")
    assert load_manifest(ok).server.reload_settle == 0.25
    assert load_manifest(write_manifest(tmp_path, "version: 1\nserver: {name: s}\n")).server.reload_settle == 0.5
    bad = write_manifest(tmp_path, "version: 1\nserver: {name: s, reloadSettle: soon}\n")
    with pytest.raises(ManifestError) as err:
        load_manifest(bad)
    assert "reloadSettle" in str(err.value) and "manifest.yaml:2" in str(err.value)


def test_a_fifo_put_where_the_manifest_was_is_never_waited_on(docs: Path) -> None:
    """The digest check used to read the manifest whole on the event loop: a FIFO in its place froze the server
    (no writer ever comes). Now it is refused unread, the catalog keeps serving, and a real file after it reloads."""
    fifo = docs.parent / "fifo"
    os.mkfifo(fifo)

    async def main() -> None:
        async with running(docs) as (server, live):
            os.replace(fifo, docs)
            async with Client(server, cache=None) as client:
                for _ in range(3):  # past a digest check (every 2 s) and a settle window
                    with anyio.fail_after(5):
                        assert (await client.read_resource("docs://a.md")).contents[0].text == "# a.md\n"
                    await anyio.sleep(1)
                tmp = docs.parent / "next.yaml"
                tmp.write_text(BASE + 'resources:\n  - {uri: "note://back", name: back, text: back}\n')
                os.replace(tmp, docs)
                with anyio.fail_after(10):
                    while live.service.catalog.get("note://back") is None:
                        await anyio.sleep(0.05)

    anyio.run(main)
