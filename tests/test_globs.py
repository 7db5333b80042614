from __future__ import annotations

import pytest

from aggregator.globs import compile_glob, glob_prefix


@pytest.mark.parametrize(("pattern", "path", "expected"), [
    ("**/*.md", "a.md", True),
    ("**/*.md", "x/y/a.md", True),
    ("**/*.md", "a.txt", False),
    ("*.md", "x/a.md", False),
    ("*.md", "a.md", True),
    ("**/*.md", ".git/a.md", False),
    ("**/*.md", "x/.a.md", False),
    (".github/*.yml", ".github/ci.yml", True),
    ("*.{md,txt}", "a.txt", True),
    ("*.{md,txt}", "a.rst", False),
    ("reports/**", "reports/2024/q1.pdf", True),
    ("reports/**", "reports/.cache/x", False),
    ("page?.md", "page1.md", True),
    ("page?.md", "page10.md", False),
    ("[!a]*.md", "b.md", True),
    ("[!a]*.md", "a.md", False),
    ("[ab].md", "b.md", True),
    ("a+b(c).md", "a+b(c).md", True),
])
def test_glob_matching(pattern: str, path: str, expected: bool) -> None:
    assert bool(compile_glob(pattern).fullmatch(path)) is expected


def test_glob_prefix() -> None:
    assert glob_prefix("reports/2024/*.md") == "reports/2024"
    assert glob_prefix("reports/**/x.md") == "reports"
    assert glob_prefix("**/*.md") == ""
    assert glob_prefix("*.md") == ""


def test_unclosed_brace_is_an_error() -> None:
    with pytest.raises(ValueError):
        compile_glob("*.{md")


def test_hidden_true_lets_wildcards_match_dotfiles() -> None:
    from aggregator.globs import compile_glob

    for pattern, path in (("**", ".env"), ("**", ".git/config"), ("**/*.md", "a/.b/c.md"), ("*", ".x"),
                          ("docs/**", "docs/.hidden/a")):
        assert not compile_glob(pattern).fullmatch(path), (pattern, path)
        assert compile_glob(pattern, hidden=True).fullmatch(path), (pattern, path)
    assert compile_glob(".*").fullmatch(".env")  # a pattern that spells the dot still matches
