"""A watcher setting up right after a listing does not read again the folders that listing found holding only
files (issue 26: at 1,000,000 files, the second walk competed with the first listing for the CPU): a source's
whole listing records them with their modification time, and `folders_under` finds the same folders with the hint
as without it, a folder that changed since included."""

from __future__ import annotations

import os
from pathlib import Path

import anyio

from aggregator.folder_watch import folders_under
from aggregator.sources.local import LocalSource


def _tree(root: Path) -> None:
    for folder in ("a", "b/c", "b/d", "e"):
        (root / folder).mkdir(parents=True)
        (root / folder / "f.md").write_text("x")
    (root / "top.md").write_text("x")
    os.symlink(root / "a", root / "e" / "to-a")


def _settled(root: Path) -> None:
    """Folder times well before the listing (the source vouches only for folders that changed a while ago)."""
    for folder, _, _ in os.walk(root):
        os.utime(folder, ns=(10**18, 10**18))


def test_a_whole_listing_records_its_plain_folders_and_the_watcher_finds_the_same_folders(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _tree(root)
    _settled(root)
    source = LocalSource("docs", str(root))
    anyio.run(source.list, "**/*.md")
    real = os.path.realpath(root)
    plain = source.plain_folders()
    assert set(plain) == {os.path.join(real, f) for f in ("a", "b/c", "b/d")}  # e holds a link, b and root folders
    assert folders_under([real], plain) == folders_under([real])

    (root / "a" / "new").mkdir()  # a plain folder gains a subfolder: its time moves on, so it is read again
    os.symlink(root / "b", root / "b" / "c" / "to-b")
    assert os.path.join(real, "a", "new") in folders_under([real], plain)
    assert folders_under([real], plain) == folders_under([real])


def test_only_a_walk_of_the_whole_root_and_settled_folders_count(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _tree(root)
    source = LocalSource("docs", str(root))
    anyio.run(source.list, "**/*.md")
    assert source.plain_folders() == {}  # just made: a change in the same clock tick could leave its time as it was
    _settled(root)
    anyio.run(source.list, "b/**/*.md")
    assert source.plain_folders() == {}  # a listing under b/ says nothing of the rest
