"""Small local files already in the page cache are read on the event loop, with the thread's answer; anything
else (a network file system, a large file, a swapped file, a link) takes the thread as before."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from aggregator.sources import LocalSource, SourceNotFound
from aggregator.sources.base import SourceTooLarge
from aggregator.sources.cached_read import (INLINE_MAX, NOWAIT_ATTEMPTS, filesystem_type, inline_possible,
                                            read_if_cached)
from tests.conftest import write_manifest

pytestmark = pytest.mark.skipif(not hasattr(os, "RWF_NOWAIT"), reason="no preadv2 RWF_NOWAIT on this system")


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """This module's folders on the system's temporary disk, not where the suite keeps the others (conftest:
    /dev/shm): tmpfs answers preadv2 RWF_NOWAIT with EOPNOTSUPP, so nothing there is ever read inline."""
    with tempfile.TemporaryDirectory(prefix="aggregator-cached-read-") as folder:
        yield Path(folder)


def test_the_file_system_type_comes_from_the_longest_mount_point(tmp_path: Path) -> None:
    table = tmp_path / "mountinfo"
    table.write_text("22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
                     "40 22 0:50 / /mnt/share rw,relatime shared:9 - nfs4 server:/export rw\n"
                     "41 22 0:51 / /mnt/share\\040two rw - cifs //host/x rw\n")
    assert filesystem_type("/home/x", str(table)) == "ext4"
    assert filesystem_type("/mnt/share/docs", str(table)) == "nfs4"
    assert filesystem_type("/mnt/shared", str(table)) == "ext4"
    assert filesystem_type("/mnt/share two/a", str(table)) == "cifs"
    assert filesystem_type("/x", str(tmp_path / "missing")) is None


def test_reads_a_cached_small_file_and_declines_the_rest(tmp_path: Path) -> None:
    small, large = tmp_path / "small.md", tmp_path / "large.bin"
    small.write_bytes(b"# hello\n")
    large.write_bytes(b"x" * (INLINE_MAX + 1))
    got = read_if_cached(str(small), os.lstat(small))
    assert got is not None and got[0] == b"# hello\n" and got[1].st_size == 8
    assert read_if_cached(str(large), os.lstat(large)) is None
    before = os.lstat(small)
    (tmp_path / "other.md").write_bytes(b"# other\n")
    os.replace(tmp_path / "other.md", small)  # swapped for another file since the stat
    assert read_if_cached(str(small), before) is None
    (tmp_path / "link.md").symlink_to(small)
    assert read_if_cached(str(tmp_path / "link.md"), os.stat(small)) is None  # never through a link
    assert read_if_cached(str(tmp_path), os.lstat(tmp_path)) is None


def test_local_source_reads_inline_with_the_threads_answer(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.md").write_text("alpha", encoding="utf-8")
    (root / "big.md").write_bytes(b"y" * 100)
    (root / "empty.md").write_bytes(b"")
    source = LocalSource("docs", str(root))
    assert source.inline == inline_possible(source.root)
    if not source.inline:
        pytest.skip("the temporary folder is not on a local file system")

    async def main() -> None:
        for path in ("sub/a.md", "empty.md"):
            tried = NOWAIT_ATTEMPTS[os.stat(root).st_dev]
            inline = source._read_cached(path, 1000)
            assert NOWAIT_ATTEMPTS[os.stat(root).st_dev] == tried + 1  # a disk keeps reading inline
            assert inline is not None
            threaded = source._read_file(path, 1000)
            assert (inline.data, inline.version) == (threaded.data, threaded.version)
            assert (await source.read(path, 1000)).data == threaded.data
        assert source._read_cached("big.md", 99) is None  # over the limit: the thread says how much
        with pytest.raises(SourceTooLarge):
            await source.read("big.md", 99)
        assert source._read_cached("missing.md", 1000) is None
        with pytest.raises(SourceNotFound):
            await source.read("missing.md", 1000)
        assert source.busy_threads() == 0

    anyio.run(main)


def _refuses_nowait(folder: Path) -> bool:
    """Whether the file system of `folder` answers preadv2 RWF_NOWAIT with EOPNOTSUPP."""
    probe = folder / ".probe"
    probe.write_bytes(b"x")
    fd = os.open(probe, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(2)], 0, os.RWF_NOWAIT)
    except OSError as exc:
        return exc.errno == errno.EOPNOTSUPP
    finally:
        os.close(fd)
        probe.unlink()
    return False


def test_a_tmpfs_folder_that_refuses_nowait_is_tried_inline_once_per_device() -> None:
    """tmpfs here refuses RWF_NOWAIT: reads through the server answer from the thread with the right content, and
    only the first one on the device pays the open, fstat and refused read."""
    from mcp import Client

    from aggregator.server import build_server
    from aggregator.service import ResourceService

    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    with tempfile.TemporaryDirectory(prefix="aggregator-cached-read-", dir="/dev/shm") as name:
        folder = Path(name)
        if filesystem_type(str(folder.resolve())) != "tmpfs" or not _refuses_nowait(folder):
            pytest.skip("/dev/shm is not a tmpfs that refuses RWF_NOWAIT")
        (folder / "docs").mkdir()
        for index in range(5):
            (folder / "docs" / f"{index}.md").write_text(f"# note {index}\n")
        manifest = write_manifest(folder, """
            version: 1
            server: {name: shm}
            sources:
              docs: {url: ./docs}
            collections:
              - {source: docs, glob: "*.md", uri: "docs://{path}"}
            """)
        device = os.stat(folder / "docs").st_dev

        async def main() -> None:
            service = await ResourceService.open(manifest)
            try:
                async with Client(build_server(service), mode="auto", cache=None) as client:
                    for _ in range(3):
                        for index in range(5):
                            read = await client.read_resource(f"docs://{index}.md")
                            assert read.contents[0].text == f"# note {index}\n"  # type: ignore[union-attr]
            finally:
                await service.aclose()

        anyio.run(main)
        assert NOWAIT_ATTEMPTS[device] <= 1
