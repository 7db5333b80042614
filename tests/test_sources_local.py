"""Local folders: only regular files are opened, every call honours the source's timeout, a hung mount holds at most
`maxConcurrency` threads, and any file name (bytes) round-trips list -> URI -> resolve -> read, or is never listed."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

import anyio
import anyio.to_thread
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.shared.exceptions import MCPError

from aggregator.compiler import compile_catalog
from aggregator.service import ResourceService
from aggregator.errors import ResourceNotFound, ResourceUnavailable
from aggregator.manifest import load_manifest
from aggregator.paths import UnsafePath, safe_relpath
from aggregator.sources import LocalSource, SourceError, SourceNotFound, open_source
from aggregator.sources.base import SourceTooLarge
from aggregator.sources.local import read_at_most
from tests.conftest import MODES, connect, write_manifest


@pytest.fixture
def special(tmp_path: Path) -> Path:
    root = tmp_path / "special"
    root.mkdir()
    (root / "ok.md").write_text("ok")
    os.mkfifo(root / "pipe.md")
    (root / "folder.md").mkdir()
    return root


def test_only_regular_files_are_opened(special: Path) -> None:
    source = LocalSource("s", str(special), timeout=5)

    async def main() -> None:
        assert (await source.read("ok.md", 100)).data == b"ok"
        for name in ("pipe.md", "folder.md", "missing.md"):
            with pytest.raises(SourceNotFound):
                with anyio.fail_after(10):
                    await source.read(name, 100)
            with pytest.raises(SourceNotFound):
                await source.stat(name)
        assert [f.path for f in await source.list("**")] == ["ok.md"]

    anyio.run(main)


def test_source_timeout_and_concurrency_come_from_the_manifest(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    manifest = load_manifest(write_manifest(tmp_path, """
        version: 1
        server: {name: limits}
        defaults: {timeout: 7s, maxConcurrency: 3}
        sources:
          d: {url: ./d}
          e: {url: ./d, timeout: 2s, maxConcurrency: 1}
        """))
    d, e = (open_source(manifest.sources[sid]) for sid in ("d", "e"))
    assert isinstance(d, LocalSource) and isinstance(e, LocalSource)
    assert (d.timeout, d.max_concurrency) == (7.0, 3)
    assert (e.timeout, e.max_concurrency) == (2.0, 1)


@pytest.mark.parametrize("mode", MODES)
def test_fifo_reads_through_a_template_fail_promptly_and_stall_nothing(special: Path, mode: str) -> None:
    """45 concurrent reads of a FIFO (more than anyio's 40 default threads) while another source is read."""
    (special.parent / "other").mkdir()
    (special.parent / "other" / "b.md").write_text("other")
    manifest = write_manifest(special.parent, """
        version: 1
        server: {name: fifo}
        sources:
          s: {url: ./special}
          o: {url: ./other}
        templates:
          - {uriTemplate: "s://{+path}", name: s, source: s, path: "{path}"}
          - {uriTemplate: "o://{+path}", name: o, source: o, path: "{path}"}
        """)
    codes: list[int] = []

    async def main() -> None:
        async with connect(manifest, mode) as client:
            async def fifo() -> None:
                try:
                    await client.read_resource("s://pipe.md")
                except MCPError as exc:
                    codes.append(exc.code)

            started = time.monotonic()
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    for _ in range(45):
                        tg.start_soon(fifo)
                    (other,) = (await client.read_resource("o://b.md")).contents
                    assert other.text == "other"
            elapsed = time.monotonic() - started
            print(f"45 FIFO reads and one other read answered in {elapsed * 1000:.0f} ms")
            assert (await client.read_resource("s://ok.md")).contents[0].text == "ok"

    anyio.run(main)
    assert codes == [-32002 if mode == "legacy" else -32602] * 45


class HungSource(LocalSource):
    """A folder on a mount that stopped answering: every read blocks in open() of a FIFO nobody writes to."""

    def __init__(self, root: str, fifo: Path, **limits: float) -> None:
        super().__init__("hung", root, **limits)
        self.fifo = fifo
        self.inline = False  # a mount that can hang is a network one: no read on the event loop (cached_read)

    def _read_file(self, path: str, max_bytes: int):  # type: ignore[override]
        with open(self.fifo, "rb"):  # blocks until a writer opens the FIFO: a hung syscall, not a sleep
            pass
        return super()._read_file(path, max_bytes)


def test_a_hung_source_holds_at_most_its_own_threads(tmp_path: Path) -> None:
    root = tmp_path / "hung"
    root.mkdir()
    (root / "a.md").write_text("a")
    fifo = tmp_path / "stuck"
    os.mkfifo(fifo)
    healthy_root = tmp_path / "healthy"
    healthy_root.mkdir()
    (healthy_root / "b.md").write_text("b")
    hung = HungSource(str(root), fifo, timeout=0.5, max_concurrency=2)
    healthy = LocalSource("healthy", str(healthy_root), timeout=5, max_concurrency=2)
    outcomes: list[str] = []

    def unblock() -> None:
        """Open the FIFO's write end until every stuck reader has returned."""
        while hung.busy_threads():
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader waiting right now
                time.sleep(0.01)
                continue
            os.close(fd)

    def threads_of(source_id: str) -> int:
        return sum(1 for t in threading.enumerate() if t.name == f"aggregator source {source_id}")

    async def main() -> None:
        async def read_hung() -> None:
            try:
                await hung.read("a.md", 100)
            except SourceError as exc:
                outcomes.append(str(exc))

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for _ in range(45):
                tg.start_soon(read_hung)
            await anyio.sleep(0.1)
            # The hung source holds its two threads; the default pool and the other source are untouched.
            assert hung.busy_threads() == 2
            assert anyio.to_thread.current_default_thread_limiter().borrowed_tokens == 0
            healthy_started = time.monotonic()
            for _ in range(20):
                assert (await healthy.read("b.md", 100)).data == b"b"
            healthy_ms = (time.monotonic() - healthy_started) * 1000
        elapsed = time.monotonic() - started
        # Every hung read gave up after the source's timeout (0.5 s), waiting for a slot included.
        assert len(outcomes) == 45 and all("no answer within 0.5s" in o for o in outcomes), outcomes[:3]
        assert elapsed < 10, elapsed
        # The stuck threads still run and still hold their slots: no thread beyond maxConcurrency was started.
        assert hung.busy_threads() == 2 and threads_of("hung") == 2
        print(f"45 hung reads failed in {elapsed:.2f} s; 20 reads of another source took {healthy_ms:.0f} ms")
        await anyio.to_thread.run_sync(unblock)
        with anyio.fail_after(5):
            while hung.busy_threads():
                await anyio.sleep(0.01)
        # Once the mount answers again, the source serves again.
        writer = threading.Thread(target=unblock_once, args=(fifo,), daemon=True)
        writer.start()
        assert (await hung.read("a.md", 100)).data == b"a"

    anyio.run(main)


def unblock_once(fifo: Path) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            return
        except OSError:
            time.sleep(0.01)


def test_a_timed_out_read_is_unavailable_naming_the_uri(tmp_path: Path) -> None:
    root = tmp_path / "hung"
    root.mkdir()
    (root / "a.md").write_text("a")
    fifo = tmp_path / "stuck"
    os.mkfifo(fifo)
    manifest = load_manifest(write_manifest(tmp_path, """
        version: 1
        server: {name: hung}
        sources:
          hung: {url: ./hung, timeout: 300ms}
        resources:
          - {uri: "h://a", name: a, source: hung, path: a.md}
        """))

    async def main() -> None:
        sources = {"hung": HungSource(str(root), fifo, timeout=0.3, max_concurrency=1)}
        aggregator = ResourceService(manifest, sources, await compile_catalog(manifest, sources))
        with pytest.raises(ResourceUnavailable) as err:
            await aggregator.read("h://a")
        assert err.value.uri == "h://a" and "h://a" in err.value.message
        await anyio.to_thread.run_sync(unblock_once, fifo)

    anyio.run(main)


# --- any file name: list -> uri -> resolve -> read ------------------------------------------------------------

NAME_BYTES = st.binary(min_size=1, max_size=24).filter(lambda b: b"/" not in b and b"\0" not in b
                                                       and b not in (b".", b".."))


def _servable(name: str) -> bool:
    """A one-segment name is listed and read unless it is hidden or `safe_relpath` refuses it."""
    try:
        safe_relpath(name)
    except UnsafePath:
        return False
    return not name.startswith(".")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=st.lists(NAME_BYTES, min_size=1, max_size=4, unique=True))
def test_any_file_name_round_trips_or_is_never_listed(names: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "r"
        root.mkdir()
        for i, name in enumerate(names):
            with open(os.path.join(os.fsencode(root), name), "wb") as handle:
                handle.write(b"file %d" % i)
        manifest = load_manifest(write_manifest(Path(tmp), """
            version: 1
            server: {name: names}
            sources:
              r: {url: ./r}
            collections:
              - {source: r, glob: "**", uri: "c://{path}", name: "{name}", title: "{stem}"}
            templates:
              - {uriTemplate: "t://{+path}", name: t, source: r, path: "{path}"}
            """))

        async def main() -> None:
            sources = {"r": LocalSource("r", str(root))}
            aggregator = ResourceService(manifest, sources, await compile_catalog(manifest, sources))
            listed = {entry.uri: entry for entry in aggregator.catalog.entries}
            for i, name in enumerate(names):
                rel = os.fsdecode(name)
                uri_path = quote(name, safe="/")
                if _servable(rel):
                    entry = listed.pop("c://" + uri_path)
                    entry.name.encode("utf-8")  # valid Unicode, whatever the bytes
                    assert (entry.title or "").encode("utf-8") is not None
                    for uri in ("c://" + uri_path, "t://" + uri_path):
                        # Text or bytes as the name's type says (b"0.B" is chemical/x-molconn-Z): the same body.
                        content = (await aggregator.read(uri)).content
                        assert (content.blob if content.text is None else content.text.encode()) == b"file %d" % i
                else:
                    with pytest.raises(ResourceNotFound):
                        await aggregator.read("t://" + uri_path)
            assert not listed, listed

        anyio.run(main)


def test_folder_links_inside_the_root_are_followed_once_and_outside_ones_skipped_with_one_log_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The rule the README states: links (to files or folders) that stay inside the root are listed, a cycle is
    walked once; links leading outside are not listed, and the source says so once, with how many."""
    root = tmp_path / "root"
    (root / "real" / "deep").mkdir(parents=True)
    (root / "real" / "deep" / "a.md").write_text("a")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.md").write_text("secret")
    os.symlink(root / "real", root / "alias")  # a folder link inside the root
    os.symlink(root, root / "real" / "deep" / "loop")  # a cycle back to the root
    os.symlink(tmp_path / "outside", root / "out-dir")
    os.symlink(tmp_path / "outside" / "secret.md", root / "out-file.md")
    os.symlink(root / "missing", root / "dangling")
    source = LocalSource("s", str(root), timeout=10)
    caplog.set_level("INFO", logger="aggregator")

    def listed() -> list[str]:
        return sorted(f.path for f in anyio.run(source.list, "**/*.md"))

    paths = listed()
    assert paths == ["alias/deep/a.md", "real/deep/a.md"]
    notes = [r.getMessage() for r in caplog.records if "outside" in r.getMessage()]
    assert len(notes) == 1 and "2 link(s)" in notes[0] and "'s'" in notes[0]
    caplog.clear()
    assert listed() == paths
    assert not [r for r in caplog.records if "outside" in r.getMessage()]  # once per source, not per listing


def test_reads_follow_links_inside_the_root_and_refuse_the_rest(tmp_path: Path) -> None:
    """A read resolves links anywhere in the path: inside the root they are followed, outside they are refused,
    and a file past `maxBytes` is too large whichever way it is reached."""
    root = tmp_path / "root"
    (root / "real" / "deep").mkdir(parents=True)
    (root / "real" / "deep" / "a.md").write_text("a")
    (root / "big.md").write_bytes(b"x" * 11)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.md").write_text("secret")
    os.symlink(root / "real", root / "alias")
    os.symlink(root / "real" / "deep" / "a.md", root / "link.md")
    os.symlink(root / "big.md", root / "big-link.md")
    os.symlink(root, root / "real" / "deep" / "loop")
    os.symlink(tmp_path / "outside", root / "out-dir")
    os.symlink(tmp_path / "outside" / "secret.md", root / "out-file.md")
    os.symlink("../../outside/secret.md", root / "real" / "relative-out.md")
    source = LocalSource("s", str(root), timeout=10)

    async def main() -> None:
        for path in ("real/deep/a.md", "alias/deep/a.md", "link.md", "real/deep/loop/alias/deep/a.md"):
            assert (await source.read(path, 10)).data == b"a", path
        for path in ("out-dir/secret.md", "out-file.md", "real/relative-out.md", "real/deep/a.md/x", "real"):
            with pytest.raises(SourceNotFound):
                await source.read(path, 10)
        for path in ("big.md", "big-link.md"):
            with pytest.raises(SourceTooLarge):
                await source.read(path, 10)
            assert (await source.read(path, 11)).data == b"x" * 11

    anyio.run(main)


def test_a_file_longer_than_its_stat_said_is_read_to_its_end_or_one_byte_past_the_limit(tmp_path: Path) -> None:
    """The read is sized from fstat, but a file that grew since is read on: never cut short, never more than
    `max_bytes + 1` bytes."""
    path = tmp_path / "grown.md"
    path.write_bytes(bytes(range(256)) * 2000)
    fd = os.open(path, os.O_RDONLY)
    try:
        for expected, max_bytes, wanted in ((0, 10**6, 512_000), (10, 10**6, 512_000), (512_000, 10**6, 512_000),
                                            (0, 1000, 1001), (10**7, 1000, 1001), (0, 512_000, 512_000)):
            os.lseek(fd, 0, os.SEEK_SET)
            assert read_at_most(fd, expected, max_bytes) == path.read_bytes()[:wanted]
    finally:
        os.close(fd)


class SlowMount(LocalSource):
    """A folder on a slow mount: each run of files (here a folder's one file) takes `delay` to come, so a listing
    takes longer than `timeout`; after `stall_after` runs (if set) it hangs until `release` is set, as a mount that
    stopped answering."""

    def __init__(self, root: str, delay: float, stall_after: int | None = None, **limits: float) -> None:
        super().__init__("slow", root, **limits)
        self.delay, self.stall_after = delay, stall_after
        self.release = threading.Event()

    def _batches(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        for i, found in enumerate(super()._batches(*args, **kwargs)):
            if i == self.stall_after:
                self.release.wait(30)
            time.sleep(self.delay)
            yield found


def test_a_listing_that_goes_on_is_not_cut_by_the_timeout_and_a_stuck_one_is(tmp_path: Path) -> None:
    """`timeout` bounds a listing's silence, not its length: a million files take longer than 30 s on a loaded
    machine and must not fail the start. A listing that stops making progress still fails after `timeout`."""
    for i in range(12):
        (tmp_path / f"d{i:02}").mkdir()
        (tmp_path / f"d{i:02}" / "a.md").write_text("a")
    slow = SlowMount(str(tmp_path), delay=0.1, timeout=0.5)  # 1.2 s in all, a folder every 0.1 s
    assert len(anyio.run(slow.list, "**/*.md")) == 12
    got: list[tuple[str, int | None, float | None, str | None]] = []
    anyio.run(slow.scan, "**/*.md", (), False, lambda *row: got.append(row))
    assert [row[0] for row in got] == [f"d{i:02}/a.md" for i in range(12)]

    stuck = SlowMount(str(tmp_path), delay=0.01, stall_after=3, timeout=0.5)
    started = time.monotonic()
    with pytest.raises(SourceError, match="no answer within 0.5s"):
        anyio.run(stuck.list, "**/*.md")
    assert time.monotonic() - started < 10
    stuck.release.set()
