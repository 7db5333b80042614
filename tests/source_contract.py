"""The behaviour every source kind owes the rest of the aggregator, as one suite each kind runs against itself.

Like `fsspec/tests/abstract`: `SourceContract` holds the tests; a kind's test module subclasses it once and gives it
a backend. The tests cover listing (glob, exclude, hidden names), stat, reads (bytes intact), not-found, path
containment, `maxBytes`, timeouts, versions and `poll`, `aclose`, `probe`, `query`, `watch_root`, and `describe`
(and errors) without credentials.

How a new kind adopts the suite (see tests/test_source_contract_local.py for the shortest example):

1. In `tests/test_source_contract_<kind>.py`, write `class TestMyKindContract(SourceContract)`.
2. Give it a `make_source` fixture returning `open(files: dict[str, bytes], **settings) -> Source` (settings are
   `SourceSpec` fields such as `timeout`): put
   `files` (relative path -> bytes) in a fresh backend, put `OUTSIDE` beside the root where the backend has a
   "beside" (`../outside.txt`), and return the source opened over the root, through ONE helper of the kind
   (`open_kind` here opens any manifest URL).
3. Set the capability flags where the kind differs from the defaults: `listing`, `nested`, `exact_bytes`,
   `mutable` are on, `hangs`, `credentials`, `queries` off. Then implement what the flags it has need: `write` and
   `remove` (`mutable`), the `hanging` fixture (`hangs`), the `with_credentials` fixture (`credentials`),
   `assert_content` (without `exact_bytes`), `held` (a kind that keeps connections open between calls).
4. Add tests only that kind has (symlinks, refs, locks) to the same class.

Tests of a missing capability are deselected at collection (tests/conftest.py), never skipped: CI fails on skips.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

from aggregator.manifest.model import Location, SourceSpec
from aggregator.manifest.source_urls import url_scheme
from aggregator.sources import (Blob, Source, SourceError, SourceNotFound, SourceTooLarge, SourceUnsupported,
                                kind_for_url, open_source)

__all__ = ["ESCAPES", "FILES", "FLAT_FILES", "OUTSIDE", "Opener", "SourceContract", "deselect_unsupported",
           "open_kind", "requires", "silent_server"]

OUTSIDE = b"OUTSIDE-THE-ROOT: never served"
"""What a kind's backend holds beside the root (`../outside.txt`): no path may ever read it."""

FILES: dict[str, bytes] = {
    "a.md": b"# A\n\nalpha\n",
    "notes.txt": b"plain text\n",
    "blob.bin": bytes(range(256)) + b"\r\n\x00\xff",
    "big.bin": b"z" * 3000,
    ".hidden.md": b"# hidden\n",
    "docs/b.md": b"# B\n",
    "docs/deep/c.md": b"# C\n",
    "docs/deep/d.txt": b"dee\n",
    "docs/.secret/e.md": b"# E\n",
}
"""The suite's files for kinds with folders."""

FLAT_FILES = {path: data for path, data in FILES.items() if "/" not in path}
"""The suite's files for kinds without folders (a database's tables)."""

ESCAPES = ["../outside.txt", "../../outside.txt", "docs/../../outside.txt", "docs/deep/../../../outside.txt",
           "/outside.txt", "/etc/passwd", "//outside.txt", "..%2foutside.txt", "..%2Foutside.txt",
           "%2e%2e/outside.txt", "docs/%2e%2e/%2e%2e/outside.txt", "..\\outside.txt", "docs\\..\\..\\outside.txt",
           "C:/outside.txt", "file:///etc/passwd", "s3://other/outside.txt", "x::y", "a.md\x00.txt", "..", ".",
           "", "docs/", "./a.md", "a.md/.", "a.md#x", "%2e%2e%2foutside.txt"]
"""Paths that name something outside the root, or nothing: each is not found (or refused as such)."""

LISTING_ESCAPES = ["../*", "../**", "/**", "**/../*", "docs/../*", "docs/../**", "docs/deep/../../*", "./*",
                   "docs/./*", "docs//*", "%2e%2e/*", "*/../*"]
"""Globs that would list something outside the root, or name files by unclean paths: nothing such is listed."""


def is_clean(path: str) -> bool:
    """A relative '/'-separated path without empty, '.' or '..' segments: what a listing may give."""
    return bool(path) and not path.startswith("/") and all(seg not in ("", ".", "..") for seg in path.split("/"))


TIMEOUT = 0.5
"""The timeout the hanging tests give a source; a stalled call must fail within a few times that."""

Opener = Callable[..., Source]


def open_kind(url: str, base: Path | None = None, **settings: Any) -> Source:
    """The source a manifest entry `{url: url, **settings}` opens (settings as SourceSpec fields, snake_case).

    The one place the suite builds sources: a change in how kinds are configured or registered is adapted here.
    """
    kind = kind_for_url(url)
    common = {name: value for name, value in settings.items() if name in SourceSpec.__dataclass_fields__}
    own = {_manifest_key(name): value for name, value in settings.items() if name not in common}
    unknown = set(own) - set(kind.settings)
    assert not unknown, f"not settings of {kind.name} sources: {unknown}"
    parsed = {key: setting.parse(own[key]) if key in own else setting.default for key, setting in kind.settings.items()}
    spec = SourceSpec(id="contract", url=kind.locate(url, base or Path.cwd()), protocol=kind.protocol(url_scheme(url)),
                      where=Location("contract.yaml", 1, 1), key="sources.contract", kind=kind.name, settings=parsed,
                      **common)
    return open_source(spec)


def _manifest_key(name: str) -> str:
    """`allow_private_network` -> `allowPrivateNetwork`: a kind's setting as the manifest spells it."""
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


@contextmanager
def silent_server() -> Iterator[int]:
    """A loopback port that takes connections and never answers on them (a stalled server); its port."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]


def requires(*capabilities: str) -> pytest.MarkDecorator:
    """Mark a contract test as needing capability flags (`"not listing"`: lacking one); other kinds never
    collect it."""
    return pytest.mark.source_contract(*capabilities)


def deselect_unsupported(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop contract tests whose kind lacks a capability they require (deselected, so not a skip)."""
    kept, dropped = [], []
    for item in items:
        marker = item.get_closest_marker("source_contract")
        cls = getattr(item, "cls", None)
        if marker and cls is not None and not all(_has(cls, flag) for flag in marker.args):
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _has(cls: type, flag: str) -> bool:
    name = flag.removeprefix("not ")
    return bool(getattr(cls, name)) != (name != flag)


class SourceContract:
    """The contract tests; a kind subclasses this with a `make_source` fixture and its capability flags."""

    listing: ClassVar[bool] = True
    """`list` works (HTTP cannot list)."""
    nested: ClassVar[bool] = True
    """Paths have folders (`docs/b.md`); else the flat files only (tables)."""
    exact_bytes: ClassVar[bool] = True
    """`read` returns the bytes stored; else `assert_content` says what a read of them looks like."""
    mutable: ClassVar[bool] = True
    """Files can change under an open source (`write`, `remove`); a git source is pinned to one commit."""
    hangs: ClassVar[bool] = False
    """The `hanging` fixture can stall a backend call for real (a silent server, a held lock)."""
    credentials: ClassVar[bool] = False
    """The `with_credentials` fixture opens a source holding secrets (a token header, a password)."""
    queries: ClassVar[bool] = False
    """`query` runs SQL (else it raises SourceUnsupported)."""

    # -- what a kind provides -------------------------------------------------------------------------------------

    @pytest.fixture
    def make_source(self) -> Opener:
        """`open(files, **settings)`: `files` in a fresh backend, `OUTSIDE` beside its root, a source over it."""
        raise NotImplementedError("a kind's contract class defines the make_source fixture")

    @pytest.fixture
    def hanging(self) -> Callable[[float], tuple[Source, str]]:
        """`stall(timeout)`: a source opened with `timeout` and a path whose read stalls in its backend (a kind
        with several ways to stall parametrizes this fixture: a silent server, a held lock ...)."""
        raise NotImplementedError("a kind with `hangs` defines the hanging fixture")

    @pytest.fixture
    def with_credentials(self) -> tuple[Source, list[str]]:
        """A source opened with secrets, and the secrets."""
        raise NotImplementedError("a kind with `credentials` defines the with_credentials fixture")

    def write(self, source: Source, path: str, data: bytes) -> None:
        """Make `path` hold `data` (create or replace) behind `source`'s back."""
        raise NotImplementedError

    def remove(self, source: Source, path: str) -> None:
        """Delete `path` behind `source`'s back."""
        raise NotImplementedError

    def held(self, source: Source) -> int:
        """Connections (or pools) `source` holds open now; 0 for kinds that hold none between calls."""
        return 0

    def assert_content(self, path: str, data: bytes, blob: Blob) -> None:
        """`blob` is what reading `path` that holds `data` gives."""
        assert blob.data == data, path

    # -- helpers ------------------------------------------------------------------------------------------------

    @property
    def files(self) -> dict[str, bytes]:
        return dict(FILES if self.nested else FLAT_FILES)

    def run(self, make_source: Opener, body: Callable[[Source], Awaitable[None]],
            files: Mapping[str, bytes] | None = None, **settings: Any) -> None:
        """Open a source over `files` (the suite's by default), run `body` with it, close it."""
        source = make_source(dict(self.files if files is None else files), **settings)

        async def main() -> None:
            try:
                await body(source)
            finally:
                await source.aclose()

        anyio.run(main)

    # -- listing ------------------------------------------------------------------------------------------------

    @requires("listing")
    def test_list_everything_visible(self, make_source: Opener) -> None:
        async def body(source: Source) -> None:
            listed = await source.list("**")
            assert all(is_clean(f.path) for f in listed)
            visible = {p for p in self.files if not p.startswith(".") and "/." not in p}
            assert sorted(f.path for f in listed) == sorted(visible)
            assert len(listed) == len(visible)  # once each

        self.run(make_source, body)

    @requires("listing")
    def test_list_hidden_names_only_when_asked_or_spelled(self, make_source: Opener) -> None:
        async def body(source: Source) -> None:
            assert sorted(f.path for f in await source.list("**", hidden=True)) == sorted(self.files)
            assert [f.path for f in await source.list(".hidden.md")] == [".hidden.md"]
            assert [f.path for f in await source.list(".*.md")] == [".hidden.md"]
            assert ".hidden.md" not in [f.path for f in await source.list("*.md")]

        self.run(make_source, body)

    @requires("listing")
    def test_list_glob_and_exclude(self, make_source: Opener) -> None:
        async def body(source: Source) -> None:
            assert sorted(f.path for f in await source.list("*.md")) == ["a.md"]
            assert sorted(f.path for f in await source.list("*.{md,txt}")) == ["a.md", "notes.txt"]
            assert sorted(f.path for f in await source.list("*", exclude=["*.bin"])) == ["a.md", "notes.txt"]
            assert await source.list("*.nothing") == []

        self.run(make_source, body)

    @requires("not listing")
    def test_list_is_unsupported_where_the_kind_cannot_list(self, make_source: Opener) -> None:
        async def body(source: Source) -> None:
            for pattern in ("**", "*.md", "a.md"):
                with pytest.raises(SourceUnsupported):
                    await source.list(pattern)

        self.run(make_source, body)

    @requires("listing", "nested")
    def test_list_nested_glob_and_exclude(self, make_source: Opener) -> None:
        async def body(source: Source) -> None:
            assert sorted(f.path for f in await source.list("**/*.md")) == ["a.md", "docs/b.md", "docs/deep/c.md"]
            assert sorted(f.path for f in await source.list("docs/**")) == ["docs/b.md", "docs/deep/c.md",
                                                                           "docs/deep/d.txt"]
            assert sorted(f.path for f in await source.list("docs/*")) == ["docs/b.md"]
            assert sorted(f.path for f in await source.list("docs/**", exclude=["**/deep/**"])) == ["docs/b.md"]
            assert sorted(f.path for f in await source.list("docs/**/*.md", hidden=True)) == [
                "docs/.secret/e.md", "docs/b.md", "docs/deep/c.md"]
            assert await source.list("nowhere/**") == []

        self.run(make_source, body)

    @requires("listing")
    def test_listed_info_agrees_with_stat(self, make_source: Opener) -> None:
        async def body(source: Source) -> None:
            for info in await source.list("**", hidden=True):
                stat = await source.stat(info.path)
                assert stat.path == info.path
                assert info.version in (None, stat.version), info.path  # a listing may not know versions
                if info.size is not None and self.exact_bytes:
                    assert info.size == len(self.files[info.path]), info.path

        self.run(make_source, body)

    # -- stat and read ------------------------------------------------------------------------------------------

    def test_stat_names_the_file(self, make_source: Opener) -> None:
        async def body(source: Source) -> None:
            for path, data in self.files.items():
                info = await source.stat(path)
                assert info.path == path
                if self.exact_bytes:
                    assert info.size in (None, len(data)), path

        self.run(make_source, body)

    def test_stat_many_agrees_with_stat(self, make_source: Opener) -> None:
        """A batch stat finds what `stat` finds, one by one; with `folders`, a watched kind (a folder on this
        machine) also finds every file under a named folder as `list` does, and no kind finds anything else."""
        folders = ["docs"] if self.nested else []
        asked = [*self.files, "nope.md", "nope/a.md", *folders, *ESCAPES[:2]]

        async def body(source: Source) -> None:
            want = {}
            for path in asked:
                try:
                    want[path] = await source.stat(path)
                except SourceError:
                    pass
            found, missing = await source.stat_many(asked)
            assert {info.path: info for info in found} == want and missing == set(asked) - want.keys()
            found, missing = await source.stat_many(asked, folders=True)
            assert missing == set(asked) - want.keys()
            listed = {info.path: info for info in await source.list("**", hidden=True)} if self.listing else {}
            under = {path: info for path, info in listed.items() if any(path.startswith(f + "/") for f in folders)}
            got = {info.path: info for info in found}
            assert all(got[path] == info for path, info in want.items())
            assert all(under.get(path) == info for path, info in got.items() if path not in want)
            if source.watch_root() is not None:
                assert got == want | under

        self.run(make_source, body)

    def test_read_gives_the_bytes_intact(self, make_source: Opener) -> None:
        async def body(source: Source) -> None:
            for path, data in self.files.items():
                self.assert_content(path, data, await source.read(path, 1 << 20))

        self.run(make_source, body)

    def test_missing_files_are_not_found(self, make_source: Opener) -> None:
        missing = ["nope.md", "a.md.bak", "nope/a.md", "a.md/x"] + (["docs", "docs/deep"] if self.nested
                                                                             else [])

        async def body(source: Source) -> None:
            for path in missing:
                with pytest.raises(SourceNotFound):
                    await source.stat(path)
                with pytest.raises(SourceNotFound):
                    await source.read(path, 1 << 20)

        self.run(make_source, body)

    def test_paths_never_escape_the_root(self, make_source: Opener) -> None:
        async def body(source: Source) -> None:
            for path in ESCAPES:
                for call in (source.stat, lambda p: source.read(p, 1 << 20)):
                    try:
                        result = await call(path)
                    except SourceNotFound:
                        continue
                    raise AssertionError(f"{path!r} was served: {result!r}")
            if self.listing:
                for pattern in LISTING_ESCAPES:
                    listed = [f.path for f in await source.list(pattern, hidden=True)]
                    assert all(is_clean(p) for p in listed), (pattern, listed)

        self.run(make_source, body)

    # -- maxBytes -----------------------------------------------------------------------------------------------

    def test_reads_past_max_bytes_are_refused_with_size_and_limit(self, make_source: Opener) -> None:
        async def body(source: Source) -> None:
            for path in ("big.bin", "a.md"):
                whole = await source.read(path, 1 << 20)
                size = len(whole.data)
                assert (await source.read(path, size)).data == whole.data  # the limit is inclusive
                with pytest.raises(SourceTooLarge) as err:
                    await source.read(path, size - 1)
                assert err.value.limit == size - 1 and err.value.size > size - 1, path
            with pytest.raises(SourceTooLarge):
                await source.read("big.bin", 0)

        self.run(make_source, body)

    # -- timeout ------------------------------------------------------------------------------------------------

    @requires("hangs")
    def test_a_stalled_backend_fails_within_the_timeout(self, hanging: Callable[[float], tuple[Source, str]]) -> None:
        source, path = hanging(TIMEOUT)

        async def main() -> None:
            try:
                for call in (lambda: source.read(path, 1 << 20), lambda: source.stat(path)):
                    started = time.monotonic()
                    with pytest.raises(SourceError) as err:
                        with anyio.fail_after(10 * TIMEOUT + 5):  # a hang of the source itself fails here
                            await call()
                    took = time.monotonic() - started
                    assert not isinstance(err.value, SourceNotFound)
                    assert took < 4 * TIMEOUT + 1, f"{took:.1f}s for a {TIMEOUT}s timeout"
            finally:
                with anyio.fail_after(5):
                    await source.aclose()

        anyio.run(main)

    # -- versions -----------------------------------------------------------------------------------------------

    def test_version_is_stable_while_unchanged(self, make_source: Opener) -> None:
        async def body(source: Source) -> None:
            for path in self.files:
                first = await source.version(path)
                assert first is not None, path
                assert await source.version(path) == first, path
                read = await source.read(path, 1 << 20)
                assert read.version in (None, first), path
            assert await source.version("nope.md") is None

        self.run(make_source, body)

    def test_poll_agrees_with_version(self, make_source: Opener) -> None:
        async def body(source: Source) -> None:
            paths = [*self.files, "nope.md"]
            polled = await source.poll(paths)
            assert set(polled) == set(paths)
            for path in paths:
                assert polled[path] == await source.version(path), path
            assert polled["nope.md"] is None

        self.run(make_source, body)

    @requires("mutable")
    def test_version_follows_changes_and_removal(self, make_source: Opener) -> None:
        async def body(source: Source) -> None:
            before = await source.version("a.md")
            other = await source.version("notes.txt")
            self.write(source, "a.md", b"# A, changed\n")
            after = await source.version("a.md")
            assert after is not None and after != before
            self.assert_content("a.md", b"# A, changed\n", await source.read("a.md", 1 << 20))
            assert (await source.poll(["a.md"]))["a.md"] == after
            assert await source.version("notes.txt") == other  # untouched files keep theirs
            self.write(source, "new.md", b"# new\n")
            assert await source.version("new.md") is not None
            self.assert_content("new.md", b"# new\n", await source.read("new.md", 1 << 20))
            self.remove(source, "a.md")
            assert await source.version("a.md") is None
            assert (await source.poll(["a.md", "notes.txt"])) == {"a.md": None, "notes.txt": other}
            with pytest.raises(SourceNotFound):
                await source.read("a.md", 1 << 20)

        self.run(make_source, body)

    # -- close --------------------------------------------------------------------------------------------------

    def test_aclose_twice_and_reads_after_it_fail_cleanly_or_reopen(self, make_source: Opener) -> None:
        """After `aclose` a read either works (the source reopens what it needs) or raises SourceError; never
        anything else, and never a hang. Closing again is harmless."""
        async def body(source: Source) -> None:
            assert (await source.read("a.md", 1 << 20)).data
            await source.aclose()
            assert self.held(source) == 0
            await source.aclose()
            with anyio.fail_after(10):
                try:
                    blob = await source.read("a.md", 1 << 20)
                except SourceError:
                    pass
                else:
                    self.assert_content("a.md", self.files["a.md"], blob)

        self.run(make_source, body)

    # -- the defaults a kind may override ----------------------------------------------------------------------

    def test_probe_reaches_a_healthy_backend(self, make_source: Opener) -> None:
        async def body(source: Source) -> None:
            await source.probe()

        self.run(make_source, body)

    def test_query_runs_only_where_the_kind_has_queries(self, make_source: Opener) -> None:
        async def body(source: Source) -> None:
            if not self.queries:
                with pytest.raises(SourceUnsupported):
                    await source.query("SELECT 1", {}, "json", 1 << 20)
                return
            blob = await source.query("SELECT 1 AS one", {}, "json", 1 << 20)
            assert json.loads(blob.data)["rows"] == [{"one": 1}]
            with pytest.raises(SourceTooLarge):
                await source.query("SELECT 1 AS one", {}, "json", 5)

        self.run(make_source, body)

    def test_watch_root_is_the_folder_or_nothing(self, make_source: Opener) -> None:
        async def body(source: Source) -> None:
            root = source.watch_root()
            assert root is None or (os.path.isabs(root) and os.path.isdir(root))

        self.run(make_source, body)

    # -- describe -----------------------------------------------------------------------------------------------

    def test_describe_is_a_short_label(self, make_source: Opener) -> None:
        async def body(source: Source) -> None:
            label = source.describe()
            assert isinstance(label, str) and label and "\n" not in label and len(label) < 300

        self.run(make_source, body)

    @requires("credentials")
    def test_describe_and_errors_never_hold_credentials(self, with_credentials: tuple[Source, list[str]]) -> None:
        source, secrets = with_credentials

        async def main() -> None:
            said = [source.describe(), repr(source.describe())]
            for call in (lambda: source.read("nope.md", 1 << 20), lambda: source.stat("nope.md"),
                         lambda: source.read("big.bin", 1)):
                try:
                    await call()
                except SourceError as exc:
                    said.append(str(exc))
            await source.aclose()
            for secret in secrets:
                assert not any(secret in text for text in said), secret

        anyio.run(main)
