"""A real `aggregator serve --http` with the console on, for the console's tests and benchmark: a docs folder with
text, JSON, CSV, an image, a binary, an HTML file and a file past maxBytes; a secret folder behind a scope; static
tokens for an admin (every scope), a reader (docs) and a nobody (no scope)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx

from tests.conftest import PNG_BYTES
from tests.replicas import free_port
from tests.served import serve_http

ADMIN = "admin-token-0123456789abcdef"
READER = "reader-token-0123456789abcdef"
NOBODY = "nobody-token-0123456789abcdef"
TOKENS = {"ADMIN_TOKEN": ADMIN, "READER_TOKEN": READER, "NOBODY_TOKEN": NOBODY}

MANIFEST = """\
version: 1
server:
  name: console-test
  title: Console test
  reloadSettle: 50ms
  pageSize: 50
  console: {adminScope: admin}
  auth:
    tokens:
      - {name: admin, token: "${ADMIN_TOKEN}", scopes: [docs, secret, admin]}
      - {name: reader, token: "${READER_TOKEN}", scopes: [docs]}
      - {name: nobody, token: "${NOBODY_TOKEN}"}
defaults: {maxBytes: 8KiB}
sources:
  docs: {url: ./docs}
  secret: {url: ./secret, access: {scopes: [secret]}}
  web: {url: "http://127.0.0.1:%(dead_port)d/base/", headers: {X-Api-Key: hunter2}, allowPrivateNetwork: true,
        timeout: 5s}
collections:
  - {source: docs, glob: "**/*", uri: "docs://{path}"}
  - {source: secret, glob: "*.md", uri: "secret://{path}", index: true}
resources:
  - {uri: "note://hello", name: hello, title: Hello note, description: "A greeting, for the detail pane", text: "hello there",
     annotations: {audience: [user, assistant], priority: 0.8, lastModified: "2026-01-02T03:04:05Z"}}
  - {uri: "web://down", name: down, source: web, path: down.md}
templates:
  - {uriTemplate: "guide://{name}", name: guide, title: A guide by name, source: docs, path: "guides/{name}.md"}
  - {uriTemplate: "secret://by-name/{name}", name: secret-by-name, source: secret, path: "{name}.md"}
"""


def make_folder(folder: Path) -> Path:
    """The docs and secret folders and the manifest; returns the manifest's path."""
    docs = folder / "docs"
    (docs / "guides").mkdir(parents=True)
    for name in ("intro", "setup", "deploy"):
        (docs / "guides" / f"{name}.md").write_text(f"# {name.title()}\n\nSee `{name}` and **more**.\n")
    (docs / "api.json").write_text('{"name": "api", "version": 2, "stable": true, "tags": null}')
    (docs / "table.csv").write_text("city,people\nParis,2100000\n\"Rome, IT\",2800000\n")
    (docs / "logo.png").write_bytes(PNG_BYTES)
    (docs / "blob.bin").write_bytes(bytes(range(256)))
    (docs / "page.html").write_text("<script>alert(1)</script>")
    (docs / "huge.txt").write_text("x" * 20_000)
    (folder / "secret").mkdir()
    (folder / "secret" / "plan.md").write_text("# the secret plan\n\nclassified words\n")
    manifest = folder / "manifest.yaml"
    manifest.write_text(MANIFEST % {"dead_port": free_port()})
    return manifest


@dataclass
class Served:
    base: str
    folder: Path
    manifest: Path
    log: Path

    def get(self, path: str, token: str | None = ADMIN, **params: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(self.base + path, params=params, headers=headers, timeout=30)


@contextmanager
def serve(folder: Path, manifest: Path | None = None, extra_env: dict[str, str] | None = None) -> Iterator[Served]:
    """`aggregator serve --http` on a free loopback port until the block ends (then SIGTERM, exit 0 expected)."""
    manifest = manifest or make_folder(folder)
    with serve_http(manifest, folder, env={**TOKENS, **(extra_env or {})}) as server:
        yield Served(server.base, folder, manifest, server.log)
