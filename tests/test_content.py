from __future__ import annotations

import gzip
import tracemalloc

import pytest

from aggregator.content import (GzipError, GzipTooLarge, decode_body, file_mime_type, guess_mime_type, gunzip,
                                is_text_mime)


@pytest.mark.parametrize(("path", "mime"), [
    ("a.md", "text/markdown"), ("a.json", "application/json"), ("a.png", "image/png"),
    ("a.yaml", "application/yaml"), ("a.PDF", "application/pdf"), ("Makefile", None),
])
def test_guess(path: str, mime: str | None) -> None:
    assert guess_mime_type(path) == mime


def test_text_types() -> None:
    assert is_text_mime("text/markdown") and is_text_mime("application/json; charset=utf-8")
    assert is_text_mime("application/vnd.api+json") and not is_text_mime("image/png")


def test_decode_text_blob_and_sniffing() -> None:
    assert decode_body("héllo".encode(), "text/plain").text == "héllo"
    assert decode_body(b"\xef\xbb\xbfbom", "text/plain").text == "bom"
    # Declared text that is not UTF-8 is served as a blob rather than mangled.
    latin = decode_body("é".encode("latin-1"), "text/plain")
    assert latin.text is None and latin.blob == b"\xe9"
    assert decode_body(b"\x89PNG\x00", "image/png").blob == b"\x89PNG\x00"
    sniffed = decode_body(b"plain words", None)
    assert sniffed.text == "plain words" and sniffed.mime_type == "text/plain"
    binary = decode_body(b"ab\x00cd", None)
    assert binary.blob == b"ab\x00cd" and binary.mime_type == "application/octet-stream"


@pytest.mark.parametrize(("path", "decompress", "mime"), [
    ("what?#frag.md", False, "text/markdown"), ("dir/what?#frag.md", False, "text/markdown"),
    ("x.MD", False, "text/markdown"), ("README", False, None), ("a.tar.gz", False, "application/gzip"),
    ("notes.txt.gz", False, "application/gzip"), ("notes.txt.gz", True, "text/plain"),
    ("a.tar.gz", True, "application/x-tar"), ("changelog.gz", True, None), (".gz", True, "application/gzip"),
    ("plain.md", True, "text/markdown"), ("a.bz2", False, "application/x-bzip2"),
])
def test_one_mime_decision(path: str, decompress: bool, mime: str | None) -> None:
    assert file_mime_type(path, None, decompress) == mime
    assert file_mime_type(path, "text/x-declared", decompress) == "text/x-declared"


def test_gunzip_members_and_limits() -> None:
    assert gunzip(gzip.compress(b"ab") + gzip.compress(b"cd"), 4) == b"abcd"
    assert gunzip(gzip.compress(b"ab") + bytes(512), 2) == b"ab"  # zero padding after the last member
    with pytest.raises(GzipTooLarge):
        gunzip(gzip.compress(b"abcde"), 4)
    for bad in (b"", b"not gzip", gzip.compress(b"x" * 1000)[:-6], b"\x1f\x8b\x08\x00" + bytes(20)):
        with pytest.raises(GzipError):
            gunzip(bad, 10_000)


def test_a_gzip_bomb_costs_no_more_than_the_limit() -> None:
    bomb = gzip.compress(bytes(10 * 1024 * 1024))
    tracemalloc.start()
    try:
        with pytest.raises(GzipTooLarge):
            gunzip(bomb, 100_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # The limit, one chunk and the compressed input's copies: far from the 10 MB a full decompression holds.
    assert peak < 1_000_000, peak
