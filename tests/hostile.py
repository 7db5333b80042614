"""A folder nobody curated: every kind of name and file a served folder may hold, and what each must do.

`make_hostile_folder(tmp)` builds `tmp/hostile` (the served root) beside `tmp/outside` (what must never be
served) and returns the file names by what they are, so tests assert behaviour per kind rather than per name.
"""

from __future__ import annotations

import os
import socket
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

OUTSIDE_TEXT = "OUTSIDE THE ROOT: never served"
SECRET_TEXT = "PASSWORD=hunter2"
LATIN1_NAME = b"caf\xe9.md"  # not UTF-8: 0xE9 alone is an invalid sequence
LATIN1_TEXT = "a name in latin-1"


@dataclass(frozen=True)
class HostileFolder:
    root: Path
    outside: Path
    readable: dict[str, bytes]
    """Listed and readable: relative path (os.fsdecode form) -> bytes."""
    unlisted: tuple[str, ...]
    """Never listed by `**` and never readable through a template without `hidden: true`."""
    hidden: dict[str, bytes]
    """Dotfiles: readable only where an entry opts in with `hidden: true`."""
    locked: str
    """chmod 000: listed, reading it fails with the backend error (root reads it anyway)."""
    doomed: str
    """Listed, then deleted by the test before it is read."""


def make_hostile_folder(tmp: Path) -> HostileFolder:
    root, outside = tmp / "hostile", tmp / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.md").write_text(OUTSIDE_TEXT)
    readable = {
        "ok.md": b"# ok\n",
        "sub/deep.md": b"deep\n",
        "empty.md": b"",
        "100%.md": b"percent\n",
        "spaced name.md": b"spaced\n",
        "inner-link.md": b"# ok\n",
        os.fsdecode(LATIN1_NAME): LATIN1_TEXT.encode(),
    }
    for rel, data in readable.items():
        if rel != "inner-link.md":
            (root / rel).write_bytes(data)
    os.symlink("ok.md", root / "inner-link.md")
    hidden = {".env": SECRET_TEXT.encode(), ".git/config": b"[remote]\nurl = https://user:token@example.com/r\n",
              "sub/.ssh/id_rsa": b"-----BEGIN KEY-----\n"}
    for rel, data in hidden.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "new\nline.md").write_text("newline name\n")
    (root / "back\\slash.md").write_text("backslash name\n")
    os.mkfifo(root / "pipe.md")
    _unix_socket(root / "sock.md")
    os.symlink("loop.md", root / "loop.md")  # resolving it loops
    os.symlink(".", root / "cycle")  # a folder cycle: walking it must end
    os.symlink(outside / "secret.md", root / "out.md")
    os.symlink(outside, root / "outdir")
    unlisted = ("new\nline.md", "back\\slash.md", "pipe.md", "sock.md", "loop.md", "out.md", "outdir/secret.md")
    (root / "locked.md").write_text("locked\n")
    os.chmod(root / "locked.md", 0)
    (root / "doomed.md").write_text("soon gone\n")
    return HostileFolder(root, outside, readable, unlisted, hidden, "locked.md", "doomed.md")


def _unix_socket(path: Path) -> None:
    """A bound UNIX socket at `path` (bound in a short folder on the same file system, then moved: socket paths are
    limited to ~100 bytes, and a move to another file system fails)."""
    device = os.stat(path.parent).st_dev
    near = next((d for d in ("/dev/shm", "/tmp") if os.path.isdir(d) and os.stat(d).st_dev == device), "/tmp")
    short = Path(tempfile.mkdtemp(prefix="s", dir=near)) / "s"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(short))
    finally:
        sock.close()
    os.replace(short, path)
    short.parent.rmdir()
    assert stat.S_ISSOCK(os.lstat(path).st_mode)


def can_bypass_permissions() -> bool:
    """Root reads a chmod 000 file: assertions that it fails only hold for other users."""
    return os.geteuid() == 0


HOSTILE_MANIFEST = """
    version: 1
    server: {name: hostile, pageSize: 7}
    defaults: {timeout: 5s}
    sources:
      h: {url: ./hostile}
    resources:
      - {uri: "env://explicit", name: env, source: h, path: .env}  # named by the author: served
      - {uri: "idx://all", name: index, render: "{% for r in resources('h://') %}{{ r.uri }} {{ r.name }}|{% endfor %}"}
    collections:
      - {source: h, glob: "**", uri: "h://{path}", name: "{path}", title: "{stem}"}
      - {source: h, glob: "**", uri: "all://{path}", name: "{path}", hidden: true}
    templates:
      - {uriTemplate: "t://{+path}", name: file, source: h, path: "{path}"}
      - {uriTemplate: "one://{name}", name: one, source: h, path: "{name}"}
      - {uriTemplate: "hid://{+path}", name: hidden-file, source: h, path: "{path}", hidden: true}
    """
