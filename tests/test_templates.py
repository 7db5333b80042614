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


# RFC 6570 section 3.2's own variables and examples (levels 1-4).
RFC_VARS = {
    "count": ["one", "two", "three"], "dom": ["example", "com"], "dub": "me/too", "hello": "Hello World!",
    "half": "50%", "var": "value", "who": "fred", "base": "http://example.com/home/", "path": "/foo/bar",
    "list": ["red", "green", "blue"], "keys": {"semi": ";", "dot": ".", "comma": ","}, "v": "6", "x": "1024",
    "y": "768", "empty": "", "empty_keys": {}, "undef": None,
}


@pytest.mark.parametrize(("template", "expected"), [
    ("{count}", "one,two,three"), ("{count*}", "one,two,three"), ("{/count}", "/one,two,three"),
    ("{/count*}", "/one/two/three"), ("{;count}", ";count=one,two,three"), ("{;count*}", ";count=one;count=two;count=three"),
    ("{?count}", "?count=one,two,three"), ("{?count*}", "?count=one&count=two&count=three"),
    ("{&count*}", "&count=one&count=two&count=three"),
    ("{var}", "value"), ("{hello}", "Hello%20World%21"), ("{half}", "50%25"), ("O{empty}X", "OX"),
    ("O{undef}X", "OX"), ("{x,y}", "1024,768"), ("{x,hello,y}", "1024,Hello%20World%21,768"),
    ("?{x,empty}", "?1024,"), ("?{x,undef}", "?1024"), ("?{undef,y}", "?768"), ("{var:3}", "val"),
    ("{var:30}", "value"), ("{list}", "red,green,blue"), ("{list*}", "red,green,blue"),
    ("{keys}", "semi,%3B,dot,.,comma,%2C"), ("{keys*}", "semi=%3B,dot=.,comma=%2C"),
    ("{+var}", "value"), ("{+hello}", "Hello%20World!"), ("{+half}", "50%25"), ("{base}index", "http%3A%2F%2Fexample.com%2Fhome%2Findex"),
    ("{+base}index", "http://example.com/home/index"), ("O{+empty}X", "OX"), ("{+path}/here", "/foo/bar/here"),
    ("here?ref={+path}", "here?ref=/foo/bar"), ("up{+path}{var}/here", "up/foo/barvalue/here"),
    ("{+x,hello,y}", "1024,Hello%20World!,768"), ("{+path,x}/here", "/foo/bar,1024/here"), ("{+path:6}/here", "/foo/b/here"),
    ("{+list}", "red,green,blue"), ("{+list*}", "red,green,blue"), ("{+keys}", "semi,;,dot,.,comma,,"),
    ("{+keys*}", "semi=;,dot=.,comma=,"),
    ("{#var}", "#value"), ("{#hello}", "#Hello%20World!"), ("{#half}", "#50%25"), ("foo{#empty}", "foo#"),
    ("foo{#undef}", "foo"), ("{#x,hello,y}", "#1024,Hello%20World!,768"), ("{#path,x}/here", "#/foo/bar,1024/here"),
    ("{#path:6}/here", "#/foo/b/here"), ("{#list}", "#red,green,blue"), ("{#list*}", "#red,green,blue"),
    ("{#keys}", "#semi,;,dot,.,comma,,"), ("{#keys*}", "#semi=;,dot=.,comma=,"),
    ("{.who}", ".fred"), ("{.who,who}", ".fred.fred"), ("{.half,who}", ".50%25.fred"), ("www{.dom*}", "www.example.com"),
    ("X{.var}", "X.value"), ("X{.empty}", "X."), ("X{.undef}", "X"), ("X{.var:3}", "X.val"), ("X{.list}", "X.red,green,blue"),
    ("X{.list*}", "X.red.green.blue"), ("X{.keys}", "X.semi,%3B,dot,.,comma,%2C"), ("X{.keys*}", "X.semi=%3B.dot=..comma=%2C"),
    ("X{.empty_keys}", "X"), ("X{.empty_keys*}", "X"),
    ("{/who}", "/fred"), ("{/who,who}", "/fred/fred"), ("{/half,who}", "/50%25/fred"), ("{/who,dub}", "/fred/me%2Ftoo"),
    ("{/var}", "/value"), ("{/var,empty}", "/value/"), ("{/var,undef}", "/value"), ("{/var,x}/here", "/value/1024/here"),
    ("{/var:1,var}", "/v/value"), ("{/list}", "/red,green,blue"), ("{/list*}", "/red/green/blue"),
    ("{/list*,path:4}", "/red/green/blue/%2Ffoo"), ("{/keys}", "/semi,%3B,dot,.,comma,%2C"), ("{/keys*}", "/semi=%3B/dot=./comma=%2C"),
    ("{;who}", ";who=fred"), ("{;half}", ";half=50%25"), ("{;empty}", ";empty"), ("{;v,empty,who}", ";v=6;empty;who=fred"),
    ("{;v,bar,who}", ";v=6;who=fred"), ("{;x,y}", ";x=1024;y=768"), ("{;x,y,empty}", ";x=1024;y=768;empty"),
    ("{;x,y,undef}", ";x=1024;y=768"), ("{;hello:5}", ";hello=Hello"), ("{;list}", ";list=red,green,blue"),
    ("{;list*}", ";list=red;list=green;list=blue"), ("{;keys}", ";keys=semi,%3B,dot,.,comma,%2C"),
    ("{;keys*}", ";semi=%3B;dot=.;comma=%2C"),
    ("{?who}", "?who=fred"), ("{?half}", "?half=50%25"), ("{?x,y}", "?x=1024&y=768"), ("{?x,y,empty}", "?x=1024&y=768&empty="),
    ("{?x,y,undef}", "?x=1024&y=768"), ("{?var:3}", "?var=val"), ("{?list}", "?list=red,green,blue"),
    ("{?list*}", "?list=red&list=green&list=blue"), ("{?keys}", "?keys=semi,%3B,dot,.,comma,%2C"),
    ("{?keys*}", "?semi=%3B&dot=.&comma=%2C"),
    ("{&who}", "&who=fred"), ("{&half}", "&half=50%25"), ("?fixed=yes{&x}", "?fixed=yes&x=1024"), ("{&x,y,empty}", "&x=1024&y=768&empty="),
    ("{&var:3}", "&var=val"), ("{&list}", "&list=red,green,blue"), ("{&list*}", "&list=red&list=green&list=blue"),
    ("{&keys}", "&keys=semi,%3B,dot,.,comma,%2C"), ("{&keys*}", "&semi=%3B&dot=.&comma=%2C"),
])
def test_rfc6570_expansion_examples(template: str, expected: str) -> None:
    # Some (`up{+path}{var}/here`, `{/list*,path:4}`) expand but could not be matched: parse them for expansion.
    assert UriTemplate.parse(template, for_matching=False).expand(RFC_VARS) == expected


@pytest.mark.parametrize(("template", "uri", "expected"), [
    ("files://{/path*}", "files:///a/b/c.md", {"path": ["a", "b", "c.md"]}),
    ("files://root{/path*}{?v}", "files://root/a/b?v=2", {"path": ["a", "b"], "v": "2"}),
    ("s://find{?tag*}", "s://find?tag=a&tag=b%20c", {"tag": ["a", "b c"]}),
    ("s://m{;list*}", "s://m;list=red;list=green", {"list": ["red", "green"]}),
    ("s://m{;x,y}", "s://m;y=2;x=1", {"x": "1", "y": "2"}),
    ("s://{list*}", "s://red,green", {"list": ["red", "green"]}),
    ("s://www{.dom*}", "s://www.example.com", {"dom": ["example", "com"]}),
    ("s://{x,y}", "s://1024,768", {"x": "1024", "y": "768"}),
    ("s://{var:3}", "s://val", {"var": "val"}),
    ("s://{var:3}", "s://value", None),
    ("s://{?var:3}", "s://?var=val", {"var": "val"}),
    ("s://{?var:3}", "s://?var=value", None),  # a query prefix is a prefix too
    ("s://{/a}{/b}", "s:///x/y", {"a": "x", "b": "y"}),  # one segment each, not all of it to a
    ("s://{.a}{.b}", "s://.x.y", {"a": "x", "b": "y"}),
    ("s://{;a}{;b}", "s://;a=1;b=2", {"a": "1", "b": "2"}),
    ("s://{/a}{?q}{&r}", "s:///x&r=1", {"a": "x", "r": "1"}),  # `{?q}` absent: the query starts at `{&r}`'s '&'
])
def test_match_explode_and_prefix(template: str, uri: str, expected: dict | None) -> None:
    assert UriTemplate.parse(template).match(uri) == expected


def test_exploded_path_is_multi_segment() -> None:
    assert UriTemplate.parse("f://{/path*}").multi_segment == {"path"}


def test_matching_is_linear_on_hostile_input() -> None:
    """A backtracking matcher takes seconds on this (Python's re: ~9 s at n=400). Linear time comes from the engine
    (RE2, checked here and in the property tests), not from a timer: a hang is the failure, no time is asserted."""
    from aggregator.templates import LINEAR_MATCHING

    assert LINEAR_MATCHING, "google-re2 is a core dependency"
    t = UriTemplate.parse("x://{a}-{b}-{c}-{d}!")
    for n in (400, 50_000):
        assert t.match("x://" + "-" * n) is None
    assert t.match("x://" + "a" * 50_000 + "-b-c-d!") == {"a": "a" * 50_000, "b": "b", "c": "c", "d": "d"}


def test_long_prefix_variables_match_and_stay_bounded() -> None:
    """RE2 refuses repeat counts over 1000; a {x:500} template must still match, and refuse a longer value."""
    template = UriTemplate.parse("long://{x:500}")
    assert template.match("long://" + "a" * 500) == {"x": "a" * 500}
    assert template.match("long://" + "a" * 501) is None


@pytest.mark.parametrize(("template", "uri", "expected"), [
    ("s://find{?keys*}", "s://find?keys=a&keys=b", {"keys": ["a", "b"]}),  # an exploded list
    ("s://find{?keys*}", "s://find", {}),
    ("s://find{?keys*}", "s://find?semi=%3B&dot=.", None),  # a mapping's expansion: no reverse, and not `{}`
    ("s://find{?keys*}", "s://find?keys=a&dot=.", None),
    ("s://find{?a,b}", "s://find?a=1&c=2", None),  # a parameter the template does not name
    ("s://find{?a,b}", "s://find?a=1&a=2", None),  # a second value for a variable that is not exploded
    ("s://find{?a}{&b*}", "s://find?b=1&a=2&b=3", {"a": "2", "b": ["1", "3"]}),
])
def test_query_matches_only_what_an_expansion_produces(template: str, uri: str, expected: dict | None) -> None:
    assert UriTemplate.parse(template).match(uri) == expected


def test_exploded_mapping_is_not_read_back() -> None:
    """The RFC's own `{?keys*}` expansion of a mapping names parameters the template lacks: it does not match."""
    template = UriTemplate.parse("s://find{?keys*}")
    uri = template.expand(RFC_VARS)
    assert uri == "s://find?semi=%3B&dot=.&comma=%2C"
    assert template.match(uri) is None


@pytest.mark.parametrize(("template", "reason"), [
    ("x://{a}{b}", "{a}{b} at position 4: adjacent variables cannot be told apart"),
    ("x://{+a}{b}", "adjacent variables cannot be told apart"),
    ("x://{a}{+b}", "adjacent variables cannot be told apart"),
    ("x://{/a}{b,c}", "adjacent variables cannot be told apart"),
    ("x://p/{a}{b}.md", "{a}{b} at position 6"),
    ("x://{?q}{b}", "adjacent variables cannot be told apart"),
    ("x://{/a*}{/b}", "where its list ends and {/b} begins is ambiguous"),
    ("x://{;a*}{;b}", "where its list ends and {;b} begins is ambiguous"),
    ("x://{#a}{/b}", "a fragment expression runs to the end of the URI"),
    ("x://{?q}{/b}", "a query expression runs to the fragment"),
    ("x://{/a*,b}", "{/a*,b} at position 4: an exploded variable must be the last of its expression"),
])
def test_ambiguous_templates_are_refused_at_parse(template: str, reason: str) -> None:
    with pytest.raises(TemplateSyntaxError) as err:
        UriTemplate.parse(template)
    assert reason in str(err.value)


@pytest.mark.parametrize(("template", "values"), [
    ("x://{a}{/b}", {"a": "1", "b": "2"}),
    ("x://{a}{?b}", {"a": "1", "b": "2"}),
    ("x://{a}{.b}", {"a": "1", "b": "2"}),
    ("x://{a}{#b}", {"a": "1", "b": "2"}),
    ("x://{a}{;b}", {"a": "1", "b": "2"}),
    ("x://{+a}{/b}", {"a": "1", "b": "2"}),
    ("x://{/a*}{.ext}", {"a": ["p", "q"], "ext": "md"}),
    ("x://{/a,b}{/c}", {"a": "1", "b": "2", "c": "3"}),
    ("x://{?a}{&b}{#f}", {"a": "1", "b": "2", "f": "3"}),
])
def test_adjacent_expressions_with_their_own_character_are_accepted(template: str, values: dict) -> None:
    t = UriTemplate.parse(template)
    assert t.match(t.expand(values)) == values


def test_an_expand_only_template_refuses_to_match() -> None:
    t = UriTemplate.parse("x://{a}{b}", for_matching=False)
    assert t.expand({"a": "1", "b": "2"}) == "x://12"
    with pytest.raises(TemplateSyntaxError, match="adjacent variables cannot be told apart"):
        t.match("x://12")


def test_an_ambiguous_template_is_a_located_manifest_issue() -> None:
    from pathlib import Path

    from aggregator.manifest import ManifestError, parse_manifest

    text = ("version: 1\nserver: {name: t}\nsources:\n  docs: {url: ./docs}\ntemplates:\n"
            "  - {uriTemplate: 'x://{a}{b}', name: t, source: docs, path: '{a}/{b}'}\n")
    with pytest.raises(ManifestError) as err:
        parse_manifest(text, "m.yaml", Path("/srv"), env={})
    (issue,) = err.value.issues
    assert (issue.file, issue.line, issue.col, issue.key) == ("m.yaml", 6, 19, "templates[0].uriTemplate")
    assert "adjacent variables cannot be told apart" in issue.message
