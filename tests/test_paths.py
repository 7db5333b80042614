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
