from __future__ import annotations

import pytest

from aggregator.paths import UnsafePath, is_within, safe_relpath


@pytest.mark.parametrize("path", ["a.md", "guides/a.md", "a b/c.txt", "x/y/z/.env", "..a", "a..b/c"])
def test_safe_paths_pass_unchanged(path: str) -> None:
    assert safe_relpath(path) == path


@pytest.mark.parametrize("path", [
    "", "..", "../x", "a/../../x", "a/..", ".", "./a", "a/./b", "/etc/passwd", "a\\..\\b", "a\x00b",
    "C:/x", "c:x", "a//b", "a/", "%2e%2e/x", "a%2Fb", "a%5cb", "a%00", "s3://bucket/x", "a\nb",
])
def test_unsafe_paths_refused(path: str) -> None:
    with pytest.raises(UnsafePath):
        safe_relpath(path)


def test_is_within_is_component_wise() -> None:
    assert is_within("/srv/docs", "/srv/docs")
    assert is_within("/srv/docs", "/srv/docs/a/b")
    assert not is_within("/srv/docs", "/srv/docs_old")
    assert not is_within("/srv/docs", "/srv/docs_old/a")
    assert not is_within("/srv/docs", "/srv")


def test_hidden_means_a_segment_starting_with_a_dot() -> None:
    from aggregator.paths import is_hidden

    assert all(is_hidden(p) for p in (".env", ".git/config", "a/.ssh/id_rsa", "a/b/.x"))
    assert not any(is_hidden(p) for p in ("a.md", "a/b.c/d", "x..y", "dir/file.env"))


def test_undecodable_names_keep_their_bytes_in_uris_and_show_replacement_characters() -> None:
    import os

    from aggregator.paths import display_text, has_raw_bytes, uri_path

    name = os.fsdecode(b"d/caf\xe9 \xff.md")
    assert has_raw_bytes(name) and not has_raw_bytes("café")
    assert uri_path(name) == "d/caf%E9%20%FF.md" and uri_path("café") == "caf%C3%A9"
    assert display_text(name) == "d/caf\ufffd \ufffd.md" and display_text("café") == "café"
    assert os.fsencode(name) == b"d/caf\xe9 \xff.md"
