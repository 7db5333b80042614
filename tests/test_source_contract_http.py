"""The source contract for HTTP base URLs: a real server on loopback serving the files under /base/."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from aggregator.sources import Source
from tests.http_server import Upstream, serve
from tests.source_contract import Opener, SourceContract, open_kind, silent_server

TOKEN = "Bearer tok-0f9e8d7c6b5a"


def http_source(upstream: Upstream, files: dict[str, bytes], **settings: object) -> Source:
    """`files` served under http://127.0.0.1:port/base/ (everything else answers 200: an escape would show)."""
    upstream.files.clear()
    upstream.files.update(files)
    return open_kind(f"http://127.0.0.1:{upstream.port}/base/", allow_private_network=True, **settings)


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with serve() as running:
        yield running


class TestHttpContract(SourceContract):
    listing = False
    hangs = True
    credentials = True

    @pytest.fixture
    def make_source(self, upstream: Upstream) -> Opener:
        self.upstream = upstream
        return lambda files, **settings: http_source(upstream, files, **settings)

    @pytest.fixture(params=["stalled response", "silent server"])
    def hanging(self, upstream: Upstream, request: pytest.FixtureRequest
                ) -> Iterator[Callable[[float], tuple[Source, str]]]:
        if request.param == "silent server":
            with silent_server() as port:
                yield lambda timeout: (open_kind(f"http://127.0.0.1:{port}/base/", allow_private_network=True,
                                                 timeout=timeout), "a.md")
            return
        upstream.stalled.add("stall.md")
        yield lambda timeout: (http_source(upstream, {}, timeout=timeout), "stall.md")

    @pytest.fixture
    def with_credentials(self, upstream: Upstream) -> tuple[Source, list[str]]:
        return http_source(upstream, {}, headers={"Authorization": TOKEN}), [TOKEN, TOKEN.split()[1]]

    def held(self, source: Source) -> int:
        session = source._session  # type: ignore[attr-defined]
        return 0 if session is None or session.closed else 1

    def test_a_read_holds_a_pool_until_aclose(self, make_source: Opener) -> None:
        async def body(source: Source) -> None:
            await source.read("a.md", 1 << 20)
            assert self.held(source) == 1

        self.run(make_source, body)

    def write(self, source: Source, path: str, data: bytes) -> None:
        self.upstream.files[path] = data

    def remove(self, source: Source, path: str) -> None:
        del self.upstream.files[path]

    def test_escapes_never_reach_the_server_outside_the_base(self, make_source: Opener) -> None:
        from tests.source_contract import ESCAPES
        from aggregator.sources import SourceNotFound

        async def body(source: Source) -> None:
            for path in ESCAPES:
                for call in (source.stat, lambda p: source.read(p, 1 << 20)):
                    with pytest.raises(SourceNotFound):
                        await call(path)
            assert not [hit for hit in self.upstream.hits if hit.startswith("OUTSIDE")]

        self.upstream.hits.clear()
        self.run(make_source, body)
