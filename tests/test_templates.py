from __future__ import annotations

import pytest

from aggregator.templates import TemplateSyntaxError, UriTemplate


@pytest.mark.parametrize(("template", "uri", "expected"), [
    ("docs://{+path}", "docs://a/b%20c.md", {"path": "a/b c.md"}),
    ("docs://{name}", "docs://a", {"name": "a"}),
    ("docs://{name}", "docs://a/b", None),
    ("docs://{name}", "docs://a%2Fb", {"name": "a/b"}),
    ("api://w/{city}/f{?days,units}", "api://w/paris/f?units=c&days=3", {"city": "paris", "days": "3", "units": "c"}),
    ("api://w/{city}/f{?days,units}", "api://w/paris/f", {"city": "paris"}),
    ("x://{a}/{a}", "x://q/q", {"a": "q"}),
    ("x://{a}/{a}", "x://q/r", None),
    ("x://r{/a,b}{.ext}", "x://r/one/two.md", {"a": "one", "b": "two", "ext": "md"}),
    ("x://r{#frag}", "x://r#a/b", {"frag": "a/b"}),
    ("x://static", "x://static", {}),
    ("x://static", "x://static2", None),
])
def test_match(template: str, uri: str, expected: dict | None) -> None:
    assert UriTemplate.parse(template).match(uri) == expected


@pytest.mark.parametrize(("template", "values", "expected"), [
    ("docs://{+path}", {"path": "a/b c.md"}, "docs://a/b%20c.md"),
    ("docs://{name}", {"name": "a/b"}, "docs://a%2Fb"),
    ("api://w/{city}{?days}", {"city": "São Paulo", "days": "3"}, "api://w/S%C3%A3o%20Paulo?days=3"),
    ("x://r{/a,b}", {"a": "1", "b": "2"}, "x://r/1/2"),
    ("x://r{?a,b}", {"b": "2"}, "x://r?b=2"),
])
def test_expand(template: str, values: dict, expected: str) -> None:
    assert UriTemplate.parse(template).expand(values) == expected


@pytest.mark.parametrize(("template", "values"), [
    ("docs://{+path}", {"path": "guides/a b.md"}),
    ("docs://{name}", {"name": "a b?c"}),
    ("x://{a}/{b}{?q}", {"a": "1", "b": "two", "q": "x y"}),
])
def test_round_trip(template: str, values: dict) -> None:
    t = UriTemplate.parse(template)
    assert t.match(t.expand(values)) == values


@pytest.mark.parametrize("bad", ["", "x://{", "x://}", "x://{}", "x://{a b}", "x://{=a}", "x://{a:0}", "x://a b/{c}"])
def test_syntax_errors(bad: str) -> None:
    with pytest.raises(TemplateSyntaxError):
        UriTemplate.parse(bad)


def test_variables_and_multi_segment() -> None:
    t = UriTemplate.parse("x://{team}/{+doc}{?v}")
    assert t.variables == ("team", "doc", "v")
    assert t.multi_segment == {"doc"}
