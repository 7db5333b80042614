"""Relative paths that can never leave their source root, and the one rule for which paths are served.

Every path a request can influence (template variables, collection entries) goes through `safe_relpath`
before any backend sees it; local sources additionally confine the resolved real path (symlinks).

The rule for listing, reading, completion and renders alike: a path is served only if `safe_relpath` accepts it
(so a name holding a newline or a backslash is never listed, since it could never be read back), and a segment
starting with '.' only where the manifest spells the dot or the entry says `hidden: true`.

Local file names are `os.fsdecode` strings: bytes that are not UTF-8 are kept as surrogate escapes, so the name
reads back exactly. URIs carry those raw bytes percent-encoded (`caf%E9.md`, `uri_path`); names and titles shown
to clients replace them with U+FFFD (`display_text`).
"""

from __future__ import annotations

import os
import re
from urllib.parse import quote

__all__ = ["UnsafePath", "display_text", "has_raw_bytes", "is_hidden", "is_servable", "is_within", "safe_relpath",
           "uri_path", "url_start"]

# Percent-encoded dot, slash and backslash left after decoding mean double encoding: an attack, not a name.
_ENCODED_SEPARATOR = re.compile(r"%(2e|2f|5c|00)", re.IGNORECASE)
_DRIVE = re.compile(r"^[A-Za-z]:")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_BAD_SEGMENT = re.compile(r"(?:^|/)\.{0,2}(?:/|$)")  # an empty, '.' or '..' segment
_URL_START = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://+")


class UnsafePath(ValueError):
    """The path would leave its source root (or cannot be a file name); treated exactly like not-found."""


def safe_relpath(path: str) -> str:
    """Return `path` as a clean '/'-separated relative path, or raise UnsafePath.

    Refused: empty paths, NUL and control bytes, backslashes, absolute paths and drive letters,
    `.` and `..` segments, and leftover percent-encoded dots, slashes, backslashes or NULs.
    """
    if not path or len(path) > 4096:
        raise UnsafePath("empty or overlong path")
    if _CONTROL.search(path):
        raise UnsafePath("control character in path")
    if "\\" in path or path.startswith("/") or _DRIVE.match(path) or "://" in path or "::" in path:
        raise UnsafePath("absolute path, URL or foreign separator")
    if _ENCODED_SEPARATOR.search(path):
        raise UnsafePath("encoded separator in path")
    # A trailing slash names a folder, never a file.
    if _BAD_SEGMENT.search(path):
        raise UnsafePath("empty, '.' or '..' segment")
    return path


def url_start(text: str) -> str | None:
    """The scheme and slashes `text` starts with when it is a whole URL (`file:///a` -> `file:///`), else None: what
    a source of another server's URIs would take as its prefix."""
    found = _URL_START.match(text)
    return found.group() if found else None


def is_within(root: str, candidate: str) -> bool:
    """True if `candidate` is `root` or inside it, component-wise (`/srv/docs` does not admit `/srv/docs_old`)."""
    try:
        return os.path.commonpath([root, candidate]) == root
    except ValueError:
        return False


def is_servable(path: str) -> bool:
    """Whether `safe_relpath` accepts `path`: a listing offers only names that can be read back."""
    try:
        safe_relpath(path)
    except UnsafePath:
        return False
    return True


def is_hidden(path: str) -> bool:
    """True if a segment of `path` starts with '.' (`.env`, `.git/config`, `a/.ssh/id_rsa`)."""
    return path.startswith(".") or "/." in path


_SURROGATE = re.compile("[\ud800-\udfff]")


def has_raw_bytes(text: str) -> bool:
    """True if `text` holds bytes a file name could not decode (surrogate escapes)."""
    return not text.isascii() and _SURROGATE.search(text) is not None


def uri_path(text: str, safe: str = "/") -> str:
    """`text` percent-encoded for a URI, raw bytes of an undecodable name included (`caf\\udce9.md` -> `caf%E9.md`)."""
    return quote(text.encode("utf-8", "surrogateescape"), safe=safe)


def display_text(text: str) -> str:
    """`text` as valid Unicode for clients: each undecodable byte of a file name becomes U+FFFD."""
    return _SURROGATE.sub("\ufffd", text) if has_raw_bytes(text) else text
