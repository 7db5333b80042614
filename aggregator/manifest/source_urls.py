"""What a source's `url` names: its protocol, and for anything local an absolute path.

Local folders are written as paths relative to the manifest's folder (`./docs`), as absolute paths, as `~/...`,
or as `file://` URLs (`file:///srv/docs`, or `file://./docs` relative like a bare path; `local://`, fsspec's other
name for them, alike: it too opens the confined folder source, never fsspec's own). Any other
`proto://...` keeps the URL as written and uses the scheme as the protocol (`s3`, `https`, `gcs`, ...), except
database URLs (protocol `sql`) and `git+...` repositories (protocol `git`, URL without the `git+`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

__all__ = ["SQL_SCHEMES", "is_remote_git", "resolve_source_url", "source_protocol"]

SQL_SCHEMES = frozenset({"sqlite", "postgresql", "postgres", "mysql", "mariadb", "mssql", "oracle"})
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_REMOTE_GIT = re.compile(r"^(https?|ssh|git)://|^[\w.-]+@[\w.-]+:")


def is_remote_git(url: str) -> bool:
    """Whether a git source's url (without `git+`) names a remote to clone (https, ssh, git or scp-like
    `user@host:path`) rather than a repository on this machine."""
    return bool(_REMOTE_GIT.match(url))


def source_protocol(url: str) -> str:
    """The protocol a source url selects: `file`, `sql`, `git` or the URL's own scheme."""
    match = _SCHEME.match(url)
    scheme = match.group(1).lower() if match else "file"
    if scheme.split("+", 1)[0] in SQL_SCHEMES:
        return "sql"
    if scheme.startswith("git+"):
        return "git"
    if scheme == "local":
        return "file"
    return scheme


def resolve_source_url(url: str, base: Path) -> tuple[str, str]:
    """(protocol, url) with every local path made absolute against `base`, the manifest's folder."""
    protocol = source_protocol(url)
    if protocol == "file":
        return protocol, _local(_file_url_path(url) if _SCHEME.match(url) else url, base)
    if protocol == "git":
        url = url[len("git+"):]
        if url.lower().startswith("file://"):
            url = _local(_file_url_path(url), base)
        return protocol, url
    if protocol == "sql" and url.startswith("sqlite:///") and not url.startswith("sqlite:////") \
            and url != "sqlite:///:memory:":
        # sqlite:///data/app.db is relative (three slashes); sqlite:////abs/app.db is absolute.
        return protocol, "sqlite:///" + _local(url[len("sqlite:///"):], base)
    return protocol, url


def _file_url_path(url: str) -> str:
    """`file:///abs` and `file://localhost/abs` are absolute; `file://./rel` and `file://rel` are relative (and
    the same for `local://`)."""
    rest = url.split("://", 1)[1]
    if rest.lower().startswith("localhost/"):
        rest = rest[len("localhost"):]
    return unquote(rest.split("?", 1)[0].split("#", 1)[0])


def _local(path: str, base: Path) -> str:
    return str((base / os.path.expanduser(path)).resolve())
