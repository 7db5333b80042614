from __future__ import annotations

import pytest

from aggregator.content import decode_body, guess_mime_type, is_text_mime


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
