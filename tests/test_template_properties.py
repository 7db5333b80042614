"""Property tests (hypothesis): expand/match round trips, and no matched path ever leaves its source root."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.catalog import Catalog, TemplateEntry
from aggregator.errors import ResourceNotFound
from aggregator.manifest.model import Display, Location, TemplateSpec
from aggregator.templates import UriTemplate

# Values without reserved characters: then every operator's expansion can be told apart from the literals around it.
VALUE_CHARS = st.sampled_from(list("abcXYZ019 -_~é%ü") + ["\u2603", "\t"])
VALUES = st.text(VALUE_CHARS, min_size=1, max_size=12)
# Reserved expansion passes %XX triplets through (RFC 6570 3.2.3): a literal '%' has no unique reverse there.
RESERVED_VALUES = st.text(VALUE_CHARS.filter(lambda c: c != "%"), min_size=1, max_size=12)
OPERATORS = st.sampled_from(["", "+", "/", ".", ";", "#"])


@st.composite
def templates_and_values(draw: st.DrawFn) -> tuple[str, dict[str, object]]:
    """A template of 1-4 expressions separated by '!' literals (never in an expansion here), maybe a query, and
    values for it."""
    count = draw(st.integers(1, 4))
    parts, values = ["t://"], {}
    fragment_used = False
    for i in range(count):
        op = draw(OPERATORS)
        if op == "#":
            if fragment_used or i != count - 1:
                op = "/"
            fragment_used = True
        explode = op in ("/", ".", ";") and draw(st.booleans())
        name = f"v{i}"
        if explode:
            values[name] = draw(st.lists(VALUES, min_size=1, max_size=3))
        else:
            values[name] = draw(RESERVED_VALUES if op in ("+", "#") else VALUES)
        parts.append(f"{{{op}{name}{'*' if explode else ''}}}")
        if i != count - 1:
            parts.append("!")
    if not fragment_used and draw(st.booleans()):
        names = ["q0", "q1"]
        parts.append("{?q0,q1}")
        for name in names:
            if draw(st.booleans()):
                values[name] = draw(VALUES)
    return "".join(parts), values


@settings(max_examples=400, deadline=None)
@given(templates_and_values())
def test_expand_then_match_round_trips(case: tuple[str, dict[str, object]]) -> None:
    text, values = case
    template = UriTemplate.parse(text)
    uri = template.expand(values)
    assert template.match(uri) == values, uri


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_match_never_crashes(uri: str) -> None:
    for text in ("t://{a}/{+b}{?c,d}", "t://{/p*}{.e}", "t://{;x,y}{#f}", "t://{a:3}-{b}"):
        result = UriTemplate.parse(text).match("t://" + uri)
        assert result is None or isinstance(result, dict)


HOSTILE = st.lists(st.sampled_from(["..", ".", "/", "%2e", "%2E", "%2f", "%2F", "%5c", "%00", "%252e", "\\", "a",
                                    "b.md", "é", "%", "~", ":", "C:", "//", "%2e%2e", "..%2f", "\x00", "?x=1", "#"]),
                   min_size=1, max_size=8).map("".join)


def _catalog(root: Path) -> Catalog:
    def template(uri: str, path: str) -> TemplateEntry:
        spec = TemplateSpec(uri, "t", "docs", path, Display(), Location("m.yaml", 1, 1), "templates[0]")
        return TemplateEntry(UriTemplate.parse(uri), spec)

    return Catalog([], [template("f://{+path}", "{path}"), template("g://{name}", "sub/{name}"),
                        template("h://r{/segs*}", "{segs}"), template("k://{a}/{+rest}", "{a}/{rest}")])


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scheme=st.sampled_from(["f://", "g://", "h://r/", "k://"]), tail=HOSTILE)
def test_no_matched_path_leaves_the_root(tmp_path: Path, scheme: str, tail: str) -> None:
    root = os.path.realpath(tmp_path)
    catalog = _catalog(Path(root))
    try:
        target = catalog.resolve(scheme + tail)
    except ResourceNotFound:
        return
    assert target.path is not None
    joined = os.path.normpath(os.path.join(root, target.path))
    assert joined == root or joined.startswith(root + os.sep), (scheme + tail, target.path)
    assert ".." not in target.path.split("/") and "\x00" not in target.path and "\\" not in target.path
