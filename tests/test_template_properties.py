"""Property tests (hypothesis): expand/match round trips, and no matched path ever leaves its source root."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.catalog import Catalog, FileTarget, TemplateEntry
from aggregator.errors import ResourceNotFound
from aggregator.manifest.model import Display, Location, TemplateSpec
from aggregator.sources import LocalSource, SourceError
from aggregator.templates import LINEAR_MATCHING, TemplateSyntaxError, UriTemplate

# Values without reserved characters or '.': then every operator's expansion can be told apart from the literals
# ('!') and the operator characters around it. Multi-byte characters make percent-encoded text longer than the value.
VALUE_CHARS = st.sampled_from(list("abcXYZ019 -_~é%ü") + ["\u2603", "\t", "\U0001f600"])
VALUES = st.text(VALUE_CHARS, min_size=1, max_size=12)
QUERY_VALUES = st.text(VALUE_CHARS, max_size=12)  # `?q=` is an expansion of the empty string
# Reserved expansion passes %XX triplets through (RFC 6570 3.2.3): a literal '%' has no unique reverse there.
RESERVED_VALUES = st.text(VALUE_CHARS.filter(lambda c: c != "%"), min_size=1, max_size=12)
LISTS = st.lists(VALUES, min_size=1, max_size=3)
# Operators whose expressions may hold several variables, each given a value (an absent one shifts the rest).
PATH_OPERATORS = ["", "/", ".", ";"]
# Operators that start with their own character: an expression of one may follow another with no literal between.
LED = ("/", ".", ";")


@st.composite
def expression(draw: st.DrawFn, names: list[str], values: dict[str, object]) -> tuple[str, str]:
    """One non-query, non-fragment expression with values for every variable; returns (text, operator)."""
    op = draw(st.sampled_from(PATH_OPERATORS + ["+"]))
    count = 1 if op == "+" else draw(st.integers(1, 3))
    specs = []
    for i in range(count):
        name = f"v{len(names)}"
        names.append(name)
        last = i == count - 1
        kind = draw(st.sampled_from(["plain", "prefix", "explode"] if last and op != "+" else ["plain", "prefix"]))
        if kind == "explode":
            values[name] = draw(LISTS)
            specs.append(name + "*")
        elif kind == "prefix":
            width = draw(st.integers(1, 5))
            values[name] = draw(st.text(VALUE_CHARS if op != "+" else VALUE_CHARS.filter(lambda c: c != "%"),
                                        min_size=1, max_size=width))  # fits: the prefix is the whole value
            specs.append(f"{name}:{width}")
        else:
            values[name] = draw(RESERVED_VALUES if op == "+" else VALUES)
            specs.append(name)
    return "{" + op + ",".join(specs) + "}", op


@st.composite
def templates_and_values(draw: st.DrawFn) -> tuple[str, dict[str, object]]:
    """A template of 1-4 expressions (several variables, prefixes, explode), separated by '!' literals (never in an
    expansion here) or by nothing where the next one starts with its own character; maybe a query (`{?a,b}`,
    `{?tag*}`, then `{&c}`) and a fragment; and values for it."""
    names: list[str] = []
    values: dict[str, object] = {}
    parts = ["t://"]
    previous: tuple[str, bool] | None = None  # operator and explode of the expression just before
    for _ in range(draw(st.integers(1, 4))):
        text, op = draw(expression(names, values))
        if previous is not None:
            prev_op, prev_explode = previous
            adjacent_ok = op in LED and not (prev_op == op and prev_explode)
            if not (adjacent_ok and draw(st.booleans())):
                parts.append("!")
        parts.append(text)
        previous = (op, text.endswith("*}"))
    if draw(st.booleans()):
        query_names = [f"q{i}" for i in range(draw(st.integers(1, 3)))]
        exploded = draw(st.booleans())
        first = draw(st.integers(1, len(query_names)))
        specs = [n + ("*" if exploded and i == len(query_names) - 1 else "") for i, n in enumerate(query_names)]
        parts.append("{?" + ",".join(specs[:first]) + "}")
        if first < len(specs):
            parts.append("{&" + ",".join(specs[first:]) + "}")
        for i, (name, spec) in enumerate(zip(query_names, specs, strict=True)):
            # Query parameters are optional, but `{+p}{?a}{&b}` with only b expands to `p&b=`: reserved text may
            # hold '&', so that one has no unique reverse (the module docstring says so).
            needed = i == 0 and previous is not None and previous[0] == "+" and first < len(specs)
            if needed or draw(st.booleans()):
                values[name] = draw(st.lists(QUERY_VALUES, min_size=1, max_size=3)) if spec.endswith("*") \
                    else draw(QUERY_VALUES)
    if draw(st.booleans()):
        parts.append("{#frag}")
        values["frag"] = draw(RESERVED_VALUES)
    return "".join(parts), values


@settings(max_examples=600, deadline=None)
@given(templates_and_values())
def test_expand_then_match_round_trips(case: tuple[str, dict[str, object]]) -> None:
    text, values = case
    template = UriTemplate.parse(text)
    uri = template.expand(values)
    assert template.match(uri) == values, uri


@st.composite
def prefix_cases(draw: st.DrawFn) -> tuple[str, int, str]:
    op = draw(st.sampled_from(["", "/", ".", ";", "?"]))
    width = draw(st.integers(1, 90))  # past 83 the pattern is unbounded and only the decoded length refuses
    value = draw(st.text(VALUE_CHARS, min_size=1, max_size=width + 5))
    return op, width, value


@settings(max_examples=300, deadline=None)
@given(prefix_cases())
def test_prefix_matches_the_prefix_and_refuses_longer_values(case: tuple[str, int, str]) -> None:
    """`{x:n}` gives back the first n characters; text longer than n characters is not an expansion of it."""
    op, width, value = case
    template = UriTemplate.parse(f"p://r!{{{op}x:{width}}}")
    assert template.match(template.expand({"x": value})) == {"x": value[:width]}
    unlimited = UriTemplate.parse(f"p://r!{{{op}x}}").expand({"x": value})
    assert template.match(unlimited) == ({"x": value} if len(value) <= width else None), unlimited


@st.composite
def ambiguous_pairs(draw: st.DrawFn) -> str:
    """Two adjacent expressions whose split a match could not determine."""
    first = draw(st.sampled_from(["{a}", "{+a}", "{/a}", "{.a}", "{;a}", "{a*}", "{/a*}", "{?a}", "{#a}"]))
    second = draw(st.sampled_from(["{b}", "{+b}", "{b,c}", "{+b*}"]))
    return "t://" + first + second


@settings(max_examples=100, deadline=None)
@given(ambiguous_pairs())
def test_adjacent_variables_without_their_own_character_are_refused(text: str) -> None:
    with pytest.raises(TemplateSyntaxError, match="cannot be told apart"):
        UriTemplate.parse(text)
    UriTemplate.parse(text, for_matching=False).expand({"a": "1", "b": "2"})  # still an RFC 6570 template


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_match_never_crashes(uri: str) -> None:
    for text in ("t://{a}/{+b}{?c,d}", "t://{/p*}{.e}", "t://{;x,y}{#f}", "t://{a:3}-{b}", "t://{?k*}",
                 "t://{/a,b}{/c}{?q*}"):
        result = UriTemplate.parse(text).match("t://" + uri)
        assert result is None or isinstance(result, dict)


PATHOLOGICAL_TEMPLATES = ["t://{a}-{b}-{c}-{d}!", "t://{+a}/{+b}/{+c}x", "t://{/p*}{.e}{?q,r}", "t://{a:5}{/b,c}z",
                          "t://{;x*}{#f}", "t://{.d*}.{.e*}y", "t://{?k*}"]


def test_matching_uses_a_linear_time_engine() -> None:
    """Linear time is a property of the engine, not something a timer can prove: the matcher must be RE2's."""
    assert LINEAR_MATCHING, "google-re2 is a core dependency"
    template = UriTemplate.parse("t://{a}")
    template.match("t://x")
    assert type(template._matcher.regex).__module__.startswith("re2")  # type: ignore[union-attr]


@settings(max_examples=40, deadline=None)
@given(template=st.sampled_from(PATHOLOGICAL_TEMPLATES), unit=st.sampled_from(["-", "a", "/", "a-", "%2", ".", ";x=",
                                                                                "?q=&", "%", "/a"]),
       length=st.sampled_from([1_000, 100_000]), tail=st.sampled_from(["", "!", "x", "#"]))
def test_pathological_inputs_return(template: str, unit: str, length: int, tail: str) -> None:
    """Long runs that make a backtracking matcher explode (Python's re: ~9 s for 400 '-' on the first template)
    come back with an answer; no timing is asserted, a hang or a crash is the failure."""
    uri = "t://" + unit * (length // len(unit)) + tail
    result = UriTemplate.parse(template).match(uri)
    assert result is None or isinstance(result, dict)


# --- no matched path leaves its source root ------------------------------------------------------------------

HOSTILE = st.lists(st.sampled_from(["..", ".", "/", "%2e", "%2E", "%2f", "%2F", "%5c", "%00", "%252e", "%252f", "\\",
                                    "a", "b.md", "é", "%", "~", ":", "C:", "//", "%2e%2e", "..%2f", "\x00", "?x=1",
                                    "#", "%c0%ae", "%u002e", ";", "&v=..", "%3F", "%23", "\n", "%0a", "outside"]),
                   min_size=1, max_size=8).map("".join)
# (uri template, path in the source), each reachable with a prefix that HOSTILE completes
TEMPLATES = [("f://{+path}", "{path}"), ("g://{name}", "sub/{name}"), ("h://r{/segs*}", "{segs}"),
             ("k://{a}/{+rest}", "{a}/{rest}"), ("m://{n:8}.md", "sub/{n}.md"), ("q://{+path}{?v}", "{path}"),
             ("e://r{/dir,file}{.ext}", "{dir}/{file}.{ext}"), ("s://{x}/{y}", "{x}/{y}")]
SCHEMES = ["f://", "g://", "h://r/", "h://r", "k://", "k://a/", "m://", "q://", "e://r/", "e://r/d/", "s://", "s://a/"]


def _catalog(url_paths: bool) -> Catalog:
    entries = []
    for i, (uri, path) in enumerate(TEMPLATES):
        spec = TemplateSpec(uri, f"t{i}", "docs", path, Display(), Location("m.yaml", i + 1, 1), f"templates[{i}]")
        entries.append(TemplateEntry(UriTemplate.parse(uri), spec))
    return Catalog([], entries, url_sources={"docs": url_paths})


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A source root with files a hostile URI may reach, and a secret beside it that none may."""
    base = Path(os.path.realpath(tmp_path_factory.mktemp("tree")))
    root = base / "root"
    (root / "sub").mkdir(parents=True)
    (root / "a").mkdir()
    (root / "b.md").write_text("in root")
    (root / "sub" / "b.md").write_text("in sub")
    (root / "a" / "b.md").write_text("in a")
    (base / "outside").write_text("SECRET")
    (base / "b.md").write_text("SECRET")
    return root


@settings(max_examples=600, deadline=None)
@given(scheme=st.sampled_from(SCHEMES), tail=HOSTILE, url_paths=st.booleans())
def test_no_matched_path_leaves_the_root(tree: Path, scheme: str, tail: str, url_paths: bool) -> None:
    root = str(tree)
    try:
        target = _catalog(url_paths).resolve(scheme + tail)
    except ResourceNotFound:
        return
    assert isinstance(target, FileTarget)
    path = target.path.split("?", 1)[0] if url_paths else target.path
    # Lexically: a relative path of plain segments, so no join can climb out of any root.
    assert not path.startswith("/") and "\\" not in path and "\x00" not in path, (scheme + tail, target.path)
    assert not any(seg in ("", ".", "..") for seg in path.split("/")), (scheme + tail, target.path)
    joined = os.path.normpath(os.path.join(root, path))
    assert joined == root or joined.startswith(root + os.sep), (scheme + tail, target.path)
    # And through the real local source: whatever it reads is inside the root, never the secret beside it.
    try:
        blob = anyio.run(LocalSource("docs", root).read, path, 1 << 16)
    except SourceError:
        return
    assert blob.data != b"SECRET", (scheme + tail, target.path)


def test_the_root_property_reaches_real_files(tree: Path) -> None:
    """The property above is not vacuous: hostile-looking but safe URIs do resolve and read files in the root."""
    catalog = _catalog(False)
    assert anyio.run(LocalSource("docs", str(tree)).read, catalog.resolve("f://sub/b.md").path, 100).data == b"in sub"
    assert catalog.resolve("h://r/a/b.md").path == "a/b.md"
    assert catalog.resolve("m://b.md").path == "sub/b.md"
    for uri in ("f://../outside", "f://%2e%2e/outside", "h://r/../outside", "g://..%2foutside", "k://../b.md",
                "s://%2e%2e/b.md", "e://r/%2E%2E/b.md"):
        with pytest.raises(ResourceNotFound):
            catalog.resolve(uri)
