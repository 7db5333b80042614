"""The source contract for S3 (s3fs) against moto's threaded server on loopback; a silent socket for hangs."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from aggregator.sources import Source
from tests.source_contract import OUTSIDE, Opener, SourceContract, open_kind, silent_server
from tests.test_sources_s3 import Store, start_store

SECRET = "contract-secret-4b1d"


def s3_source(endpoint: str, bucket: str, files: dict[str, bytes], client: Any = None, *, key: str = "test-key",
              secret: str = "test-secret-value", **settings: object) -> Source:
    """`files` under s3://bucket/root/, `OUTSIDE` beside it (bucket/outside.txt, bucket/root_old/outside.txt)."""
    if client is not None:
        client.create_bucket(Bucket=bucket)
        for path, data in {**{f"root/{p}": d for p, d in files.items()}, "outside.txt": OUTSIDE,
                           "root_old/outside.txt": OUTSIDE}.items():
            client.put_object(Bucket=bucket, Key=path, Body=data)
    return open_kind(f"s3://{bucket}/root", options={"key": key, "secret": secret, "endpoint_url": endpoint},
                     **settings)


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    running = start_store()
    yield running
    running.stop()


class TestS3Contract(SourceContract):
    hangs = True
    credentials = True

    @pytest.fixture
    def make_source(self, store: Store) -> Opener:
        self.store = store
        self.bucket = f"contract-{uuid.uuid4().hex[:12]}"
        return lambda files, **settings: s3_source(store.endpoint, self.bucket, files, store.client, **settings)

    @pytest.fixture
    def hanging(self) -> Iterator[Callable[[float], tuple[Source, str]]]:
        with silent_server() as port:
            yield lambda timeout: (s3_source(f"http://127.0.0.1:{port}", "stalled", {}, timeout=timeout), "a.md")

    @pytest.fixture
    def with_credentials(self, store: Store) -> tuple[Source, list[str]]:
        bucket = f"contract-{uuid.uuid4().hex[:12]}"
        source = s3_source(store.endpoint, bucket, {"a.md": b"# A\n"}, store.client, key="contract-key-9a8b",
                           secret=SECRET)
        return source, [SECRET, "contract-key-9a8b"]

    def write(self, source: Source, path: str, data: bytes) -> None:
        self.store.client.put_object(Bucket=self.bucket, Key=f"root/{path}", Body=data)

    def remove(self, source: Source, path: str) -> None:
        self.store.client.delete_object(Bucket=self.bucket, Key=f"root/{path}")
