"""Reading a source's `url`: its scheme, whether a git URL is remote, and local paths made absolute (which kind a
URL opens with is the registry's question: `aggregator.sources.registry.kind_for_url`).

Local folders are written as paths relative to the manifest's folder (`./docs`), as absolute paths, as `~/...`,
or as `file://` URLs (`file:///srv/docs`, or `file://./docs` relative like a bare path; `local://`, fsspec's other
name for them, alike: it too opens the confined folder source, never fsspec's own). Any other `proto://...` keeps
the URL as written; the kind that claims its scheme decides what it means (database URLs, `git+...` repositories),
and fsspec's implementation of the scheme opens any URL no kind claims.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

__all__ = ["S3_SCHEMES", "file_url_path", "is_remote_git", "local_path", "url_scheme"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://|^([A-Za-z][A-Za-z0-9.-]*\+[A-Za-z0-9+.-]*):")
"""`proto://...`, or a compound scheme without an authority (`mcp+stdio:`): a drive letter (`C:`) has no `+`."""
S3_SCHEMES = frozenset({"s3", "s3a"})
"""The schemes s3fs opens: their clients, for sources and for manifests read from such URLs alike, take
`aggregator.s3_client`'s settings."""
_REMOTE_GIT = re.compile(r"^(https?|ssh|git)://|^[\w.-]+@[\w.-]+:")


def url_scheme(url: str) -> str:
    """The URL's scheme in lower case; `file` for a path."""
    match = _SCHEME.match(url)
    return (match.group(1) or match.group(2)).lower() if match else "file"


def is_remote_git(url: str) -> bool:
    """Whether a git source's url (without `git+`) names a remote to clone (https, ssh, git or scp-like
    `user@host:path`) rather than a repository on this machine."""
    return bool(_REMOTE_GIT.match(url))


def file_url_path(url: str) -> str:
    """`file:///abs` and `file://localhost/abs` are absolute; `file://./rel` and `file://rel` are relative (and
    the same for `local://`)."""
    rest = url.split("://", 1)[1]
    if rest.lower().startswith("localhost/"):
        rest = rest[len("localhost"):]
    return unquote(rest.split("?", 1)[0].split("#", 1)[0])


def local_path(path: str, base: Path) -> str:
    """`path` (relative to `base`, absolute or `~/...`) as an absolute path, symlinks resolved."""
    return str((base / os.path.expanduser(path)).resolve())
