"""${VAR} and ${VAR:-default} interpolation: values only, shell semantics, located errors that never leak a value."""

from __future__ import annotations

from pathlib import Path

import pytest

from aggregator.manifest import ManifestError, parse_manifest
from aggregator.manifest.interpolate import UnresolvedReference, substitute

HEAD = "version: 1\nserver: {name: t}\n"


@pytest.mark.parametrize(("text", "env", "expected"), [
    ("${A}", {"A": "x"}, "x"),
    ("pre-${A}-post", {"A": "x"}, "pre-x-post"),
    ("${A}${B}", {"A": "1", "B": "2"}, "12"),
    ("${A:-fallback}", {}, "fallback"),
    ("${A:-fallback}", {"A": "set"}, "set"),
    ("${A:-fallback}", {"A": ""}, "fallback"),          # as in a shell: empty counts as unset for :-
    ("${A}", {"A": ""}, ""),                            # set but empty, no default: empty
    ("${A:-}", {}, ""),
    ("${A:-a b/c:d}", {}, "a b/c:d"),
    ("${A:-$5}", {}, "$5"),                              # a lone $ in a default is literal
    ("$${A}", {"A": "x"}, "${A}"),                      # $${ escapes
    ("$${A} ${A}", {"A": "x"}, "${A} x"),
    ("cost: $5, $HOME", {}, "cost: $5, $HOME"),         # only ${...} is a reference
    ("no references", {}, "no references"),
    ("${A}", {"A": "${B}"}, "${B}"),                    # values are not interpolated again
])
def test_substitute(text: str, env: dict[str, str], expected: str) -> None:
    assert substitute(text, env) == expected


@pytest.mark.parametrize(("text", "fragment"), [
    ("${MISSING}", "MISSING is not set"),
    ("${}", "malformed"),
    ("${1A}", "malformed"),
    ("${A", "malformed"),
    ("${A-x}", "malformed"),
    ("${A:-${B}}", "malformed"),                        # nested references are not supported: say so
])
def test_unresolved(text: str, fragment: str) -> None:
    with pytest.raises(UnresolvedReference) as err:
        substitute(text, {"B": "b"})
    assert fragment in str(err.value)


def parse(text: str, env: dict[str, str]):  # type: ignore[no-untyped-def]
    return parse_manifest(text, "m.yaml", Path("/srv"), env=env)


def issues(text: str, env: dict[str, str]) -> list[tuple[int, int, str, str]]:
    with pytest.raises(ManifestError) as err:
        parse(text, env)
    return [(i.line, i.col, i.key, i.message) for i in err.value.issues]


def test_keys_are_not_interpolated() -> None:
    # A key is kept as written; with ${ in it, it is not a valid source id, and is reported unchanged.
    found = issues(HEAD + "sources:\n  ${ID}: {url: ./x}\n", {"ID": "docs"})
    assert found == [(4, 3, "sources.${ID}", found[0][3])] and "'${ID}' is not a valid id" in found[0][3]


def test_nested_values_and_options_are_interpolated() -> None:
    m = parse(HEAD + "sources:\n  s: {url: 's3://${BUCKET}/x', options: {key: '${KEY}', list: ['${KEY:-d}', 1]}}\n",
              {"BUCKET": "b", "KEY": "k"})
    assert m.sources["s"].url == "s3://b/x" and m.sources["s"].settings["options"] == {"key": "k", "list": ["k", 1]}


def test_unset_variable_is_located_and_named_without_values() -> None:
    text = HEAD + "sources:\n  docs:\n    url: ./docs\n    options:\n      token: \"Bearer ${TOKEN}\"\n"
    ((line, col, key, message),) = issues(text, {"OTHER": "hunter2"})
    assert (line, col, key) == (7, 14, "sources.docs.options.token")
    assert "TOKEN is not set" in message and "${TOKEN:-default}" in message and "hunter2" not in message


def test_every_unset_variable_is_reported() -> None:
    text = HEAD + "sources:\n  a: {url: '${A_DIR}'}\n  b: {url: '${B_DIR}'}\n"
    assert [(i[0], i[2]) for i in issues(text, {})] == [(4, "sources.a.url"), (5, "sources.b.url")]


def test_default_and_escape_through_the_loader() -> None:
    m = parse(HEAD + "sources:\n  docs: {url: '${DOCS:-./fallback}'}\nresources:\n"
                     "  - {uri: 'n://x', name: x, text: 'a $${B} ${C} ${D:-d}'}\n", {"C": "c"})
    assert m.sources["docs"].url == "/srv/fallback" and m.resources[0].text == "a ${B} c d"


def test_unquoted_reference_is_read_as_yaml_after_substitution() -> None:
    block = "version: 1\nserver:\n  name: t\n  pageSize: ${PAGE}\n"
    assert parse(block, {"PAGE": "25"}).server.page_size == 25
    # Quoted, it stays a string, and the schema (which runs after interpolation) says so.
    ((line, col, key, message),) = issues(block.replace("${PAGE}", "'${PAGE}'"), {"PAGE": "25"})
    assert (line, col, key) == (4, 13, "server.pageSize")
    assert message == "expected integer, got string (after substituting environment variables)"


def test_types_are_checked_on_the_result() -> None:
    ((_, _, key, message),) = issues("version: 1\nserver:\n  name: t\n  pageSize: ${PAGE}\n", {"PAGE": "many"})
    assert key == "server.pageSize" and message.startswith("expected integer, got string")
    m = parse(HEAD + "defaults: {ttl: '${TTL}'}\n", {"TTL": "90s"})
    assert m.defaults.ttl == 90


def test_values_from_the_environment_are_never_quoted_in_errors() -> None:
    secret = "hunter2-not-a-uri"
    text = HEAD + ("sources:\n  docs: {url: ./d}\nresources:\n  - {uri: '${U}', name: a, source: '${S}', path: '${P}'}\n"
                   "  - {uri: 'x://a', name: b, text: t, annotations: {lastModified: '${U}'}}\n")
    found = issues(text, {"U": secret, "S": secret, "P": "../" + secret})
    assert {i[2] for i in found} == {"resources[0].uri", "resources[0].source", "resources[0].path",
                                     "resources[1].annotations.lastModified"}
    assert all(secret not in i[3] for i in found), found


def test_malformed_reference_is_located() -> None:
    ((line, col, key, message),) = issues(HEAD + "resources:\n  - {uri: 'n://x', name: x, text: 'x ${oops'}\n", {})
    assert (line, col, key) == (4, 35, "resources[0].text") and "malformed variable reference '${oops'" in message


def test_unquoted_reference_inside_braces_gets_a_hint() -> None:
    # In a {flow: mapping} a `{` starts a mapping, so YAML itself refuses an unquoted ${VAR} there.
    ((line, col, _, message),) = issues(HEAD.replace("{name: t}", "{name: t, pageSize: ${PAGE}}"), {"PAGE": "5"})
    assert (line, col) == (2, 30) and "YAML syntax error" in message and "quote" in message


def test_every_problem_in_one_value_is_reported() -> None:
    found = issues(HEAD + "resources:\n  - {uri: 'n://x', name: x, text: '${A}/${B:-b}/${C}/${bad'}\n", {})
    assert [(i[0], i[2], i[3].split(" (")[0].split(";")[0]) for i in found] == [
        (4, "resources[0].text", "environment variable A is not set"),
        (4, "resources[0].text", "environment variable C is not set"),
        (4, "resources[0].text", "malformed variable reference '${bad'"),
    ]


def test_tokens_come_from_the_environment_and_are_never_shown() -> None:
    auth = "  auth:\n    tokens:\n      - {name: ci, token: %s}\n"
    head = HEAD.replace("server: {name: t}\n", "server:\n  name: t\n")
    text = head.replace("  name: t\n", "  name: t\n" + auth % '"sup3r-literal-token-value"')
    ((line, col, key, message),) = issues(text, {})
    assert (key, line) == ("server.auth.tokens[0].token", 6)
    assert "may not be written into the manifest" in message and "sup3r" not in message
    assert parse(head.replace("  name: t\n", "  name: t\n" + auth % '"${CI_TOKEN}"'), {"CI_TOKEN": "x" * 20})
    found = issues(head.replace("  name: t\n", "  name: t\n" + auth % "[sup3r-literal]"), {})
    assert found and all("sup3r-literal" not in f[3] for f in found)
