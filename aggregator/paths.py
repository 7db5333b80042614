"""Relative paths that can never leave their source root.

Every path a request can influence (template variables, collection entries) goes through `safe_relpath`
before any backend sees it; local sources additionally confine the resolved real path (symlinks).
"""

from __future__ import annotations

import os
import re

__all__ = ["UnsafePath", "safe_relpath", "is_within"]

# Percent-encoded dot, slash and backslash left after decoding mean double encoding: an attack, not a name.
_ENCODED_SEPARATOR = re.compile(r"%(2e|2f|5c|00)", re.IGNORECASE)
_DRIVE = re.compile(r"^[A-Za-z]:")


class UnsafePath(ValueError):
    """The path would leave its source root (or cannot be a file name); treated exactly like not-found."""


def safe_relpath(path: str) -> str:
    """Return `path` as a clean '/'-separated relative path, or raise UnsafePath.

    Refused: empty paths, NUL and control bytes, backslashes, absolute paths and drive letters,
    `.` and `..` segments, and leftover percent-encoded dots, slashes, backslashes or NULs.
    """
    if not path or len(path) > 4096:
        raise UnsafePath("empty or overlong path")
    if any(ord(c) < 0x20 or c == "\x7f" for c in path):
        raise UnsafePath("control character in path")
    if "\\" in path or path.startswith("/") or _DRIVE.match(path) or "://" in path or "::" in path:
        raise UnsafePath("absolute path, URL or foreign separator")
    if _ENCODED_SEPARATOR.search(path):
        raise UnsafePath("encoded separator in path")
    segments = path.split("/")
    # A trailing slash names a folder, never a file.
    if any(seg in ("", ".", "..") for seg in segments):
        raise UnsafePath("empty, '.' or '..' segment")
    return path


def is_within(root: str, candidate: str) -> bool:
    """True if `candidate` is `root` or inside it, component-wise (`/srv/docs` does not admit `/srv/docs_old`)."""
    try:
        return os.path.commonpath([root, candidate]) == root
    except ValueError:
        return False
