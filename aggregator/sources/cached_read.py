"""Reading a small local file on the event loop, only when that cannot block: the file system is a local one and
every byte is already in the page cache (`preadv2` with `RWF_NOWAIT` says so, or fails with EAGAIN).

A thread hop per read costs more CPU than reading a 2 KB file; but a read that waits on a disk or a hung mount must
never stall the loop, so anything else (a network file system, a file not cached, larger than `INLINE_MAX`, grown
or swapped meanwhile, any error) returns None and the caller takes its thread as before.

Some local file systems refuse `RWF_NOWAIT` outright (tmpfs on some kernels: EOPNOTSUPP). The first refusal marks
the device (`st_dev`), and later reads there go straight to the thread, without an open, fstat and failed read.
"""

from __future__ import annotations

import errno
import os
import stat as stat_mode
from collections import Counter

__all__ = ["INLINE_MAX", "LOCAL_FS_TYPES", "NOWAIT_ATTEMPTS", "filesystem_type", "inline_possible", "read_if_cached"]

INLINE_MAX = 64 * 1024
"""Bytes at most read on the event loop."""

LOCAL_FS_TYPES = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "overlay", "f2fs", "zfs",
                            "squashfs", "erofs", "vfat", "exfat"})
"""File systems whose metadata calls answer from this machine (never a network round trip)."""

NOWAIT_ATTEMPTS: Counter[int] = Counter()
"""`preadv2(RWF_NOWAIT)` calls made, by device (st_dev): at most one on a device that refuses the flag."""

_NOWAIT = getattr(os, "RWF_NOWAIT", None)
_REFUSED: set[int] = set()  # devices that answered RWF_NOWAIT with EOPNOTSUPP: never tried again
_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
          | getattr(os, "O_NOCTTY", 0))


def filesystem_type(path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the file system `path` (a real path) is on, from the mount table; None when unknown."""
    best, best_type = "", None
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as table:
            for line in table:
                fields = line.split()
                try:
                    point, fs_type = fields[4].replace("\\040", " "), fields[fields.index("-") + 1]
                except (IndexError, ValueError):
                    continue
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, best_type = point, fs_type
    except OSError:
        return None
    return best_type


def inline_possible(root: str) -> bool:
    """Whether reads under `root` may try the event loop: `RWF_NOWAIT` exists and the file system is local."""
    return _NOWAIT is not None and filesystem_type(root) in LOCAL_FS_TYPES


def read_if_cached(real: str, st: os.stat_result) -> tuple[bytes, os.stat_result] | None:
    """The whole of regular file `real` (lstat `st`, at most INLINE_MAX bytes) and its fstat, if it is still that
    file and all of it is in the page cache; None otherwise (nothing was waited for)."""
    if _NOWAIT is None or not stat_mode.S_ISREG(st.st_mode) or st.st_size > INLINE_MAX or st.st_dev in _REFUSED:
        return None
    try:
        fd = os.open(real, _FLAGS)
    except OSError:
        return None
    try:
        now = os.fstat(fd)
        if (now.st_ino, now.st_dev, now.st_size) != (st.st_ino, st.st_dev, st.st_size) or \
                not stat_mode.S_ISREG(now.st_mode):
            return None
        buffer = bytearray(now.st_size + 1)  # one more: a file that grew since is not read here
        NOWAIT_ATTEMPTS[now.st_dev] += 1
        got = os.preadv(fd, [buffer], 0, _NOWAIT)
    except OSError as exc:  # EAGAIN: not all cached; anything else: the thread's read reports it
        if exc.errno == errno.EOPNOTSUPP:
            _REFUSED.add(st.st_dev)
        return None
    finally:
        os.close(fd)
    if got != now.st_size:
        return None
    return bytes(memoryview(buffer)[:got]), now
