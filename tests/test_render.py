"""Rendered resources (`render:` Jinja2 in a sandbox): digests, JSON to Markdown, template variables as data,
syntax errors found by validate, output caps, recursion, and access scopes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from aggregator.core import Aggregator
from aggregator.errors import ResourceNotFound, ResourceTooLarge, ResourceUnavailable
from tests.conftest import MODES, connect, write_manifest

ROOT = Path(__file__).resolve().parents[1]

MANIFEST = """
    version: 1
    server: {name: rendered}
    defaults: {maxBytes: 4KiB}
    sources:
      reports: {url: ./reports}
      data: {url: ./data}
      vault: {url: ./vault, access: {scopes: [vault]}}
    collections:
      - {source: reports, glob: "*.md", uri: "reports://{path}", name: "{stem}"}
      - {source: vault, glob: "*.md", uri: "vault://{path}"}
    resources:
      - {uri: "data://teams", name: teams, source: data, path: teams.json}
      - uri: digest://latest
        name: latest-reports
        render: |
          # Five newest reports
          {% for r in (resources("reports://") | sort(attribute="lastModified", reverse=true))[:5] %}
          - [{{ r.name }}]({{ r.uri }}): {{ read(r.uri).splitlines()[0] }}
          {% endfor %}
      - uri: table://teams
        name: teams-table
        render: |
          | team | members |
          |---|---|
          {% for t in json("data://teams") %}
          | {{ t.name }} | {{ t.members }} |
          {% endfor %}
      - {uri: "loop://self", name: self, render: "{{ read('loop://self') }}"}
      - {uri: "big://out", name: big, render: "{% for i in range(100000) %}xxxxxxxxxx{% endfor %}"}
      - {uri: "evil://mro", name: evil, render: "{{ ''.__class__.__mro__[1].__subclasses__() }}"}
      - {uri: "secrets://digest", name: vault-digest, render: "{% for r in resources('vault://') %}{{ read(r.uri) }}{% endfor %}"}
    templates:
      - uriTemplate: "summary://{name}"
        name: summary
        mimeType: text/plain
        render: "Report {{ name }}: {{ read('reports://' ~ name ~ '.md') | length }} bytes; args={{ args | tojson }}"
      - {uriTemplate: "echo://{name}", name: echo, render: "{{ name }}|{{ args.name }}"}
    """


@pytest.fixture
def rendered(tmp_path: Path) -> Path:
    reports = tmp_path / "reports"
    reports.mkdir()
    for i in range(8):
        path = reports / f"r{i}.md"
        path.write_text(f"Report number {i}\nbody\n")
        os.utime(path, (1_700_000_000 + i * 86_400, 1_700_000_000 + i * 86_400))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "teams.json").write_text(json.dumps([{"name": "eng", "members": 12},
                                                              {"name": "ops", "members": 4}]))
    (tmp_path / "vault").mkdir()
    (tmp_path / "vault" / "k.md").write_text("VAULT SECRET")
    return write_manifest(tmp_path, MANIFEST)


@pytest.mark.parametrize("mode", MODES)
def test_rendered_reads_through_the_client(rendered: Path, mode: str) -> None:
    async def main() -> None:
        async with connect(rendered, mode) as client:
            listed = {r.uri: r for r in (await client.list_resources()).resources}
            assert listed["digest://latest"].mime_type == "text/markdown"
            digest = (await client.read_resource("digest://latest")).contents[0].text
            lines = [line for line in digest.splitlines() if line.startswith("- ")]
            assert lines == [f"- [r{i}](reports://r{i}.md): Report number {i}" for i in (7, 6, 5, 4, 3)]
            table = (await client.read_resource("table://teams")).contents[0].text
            assert table.splitlines() == ["| team | members |", "|---|---|", "| eng | 12 |", "| ops | 4 |"]
            summary = (await client.read_resource("summary://r2")).contents[0]
            assert summary.mime_type == "text/plain"
            assert summary.text == 'Report r2: 21 bytes; args={"name": "r2"}'
            # A value from the URI is data: template syntax in it is never evaluated.
            with pytest.raises(MCPError):  # no report of that name, so the read fails, generically
                await client.read_resource("summary://%7B%7B7*7%7D%7D")
            for uri in ("loop://self", "evil://mro", "big://out"):
                with pytest.raises(MCPError) as failed:
                    await client.read_resource(uri)
                message = failed.value.error.message
                assert "__class__" not in message and str(rendered.parent) not in message and uri in message

    anyio.run(main)


def test_uri_values_are_data_never_source(rendered: Path) -> None:
    async def main() -> None:
        aggregator = await Aggregator.open(rendered)
        try:
            text = (await aggregator.read("echo://%7B%7B7*7%7D%7D%7B%25%20if%20true%20%25%7D")).text
            assert text == "{{7*7}}{% if true %}|{{7*7}}{% if true %}"
        finally:
            await aggregator.aclose()

    anyio.run(main)


def test_render_failures_are_clean_errors(rendered: Path) -> None:
    async def main() -> None:
        aggregator = await Aggregator.open(rendered)
        try:
            with pytest.raises(ResourceUnavailable):
                await aggregator.read("loop://self")  # nesting stops; no hang, no RecursionError
            with pytest.raises(ResourceUnavailable):
                await aggregator.read("evil://mro")  # the sandbox refuses the attribute
            with pytest.raises(ResourceTooLarge):
                await aggregator.read("big://out")  # 1 MB of output against a 4 KiB cap
        finally:
            await aggregator.aclose()

    anyio.run(main)


def test_render_respects_access_scopes(rendered: Path) -> None:
    async def main() -> None:
        aggregator = await Aggregator.open(rendered)
        try:
            assert (await aggregator.read("secrets://digest", frozenset({"vault"}))).text == "VAULT SECRET"
            # Without the scope the vault's files are invisible to the template too.
            assert (await aggregator.read("secrets://digest", frozenset())).text == ""
            with pytest.raises(ResourceNotFound):
                await aggregator.read("vault://k.md", frozenset())
            # Its text depends on who asks, so its result must say cacheScope: private.
            assert aggregator.is_restricted("secrets://digest")
        finally:
            await aggregator.aclose()

    anyio.run(main)


def test_validate_reports_template_syntax_errors(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, """
        version: 1
        server: {name: broken}
        resources:
          - uri: digest://x
            name: x
            render: |
              line one
              {% for r in resources() %}
              {{ r.name }
        """)
    result = subprocess.run([sys.executable, "-m", "aggregator", "validate", "--offline", str(manifest)],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 1
    assert f"{manifest}:6:13: resources[0].render: template syntax error on line 3 of the template" in result.stderr


def test_arithmetic_failures_and_unknown_filters() -> None:
    """`{{ 1 // 0 }}` is a render failure like any other (not an internal error), and validate knows every filter."""
    from aggregator.render import RenderError, check_syntax, render

    async def no_read(uri: str) -> str:
        raise AssertionError(uri)

    async def main() -> None:
        with pytest.raises(RenderError):
            await render("{{ 1 // 0 }}", {}, no_read, lambda prefix: [], 1000)

    anyio.run(main)
    assert "nosuchfilter" in (check_syntax("{{ 'x' | nosuchfilter }}") or "")
    assert check_syntax("{{ 'x' | upper }}") is None


@pytest.mark.parametrize(("template", "variables"), [
    ("{{ 'x' * 10**10 }}", {}),
    ("{{ 'x' * (n | int) }}", {"n": "10000000000"}),  # the count comes from the URI
    ("{{ [1, 2] * (n | int) }}", {"n": "10000000000"}),
    ("{{ 2 ** (10**9) }}", {}),
    ("{{ '%*s' % (10**10, 'x') }}", {}),
    ("{{ '%10000000000d' % 1 }}", {}),
    ("{{ 'x' | center(10**10) }}", {}),
    ("{{ 'a\nb' | indent(10**10) }}", {}),
    ("{% set s = 'x' * 60000 %}{{ (s + s) | length }}", {}),  # built, never output
    # Padding and repetition reached by other ways than `*`, `center` and `indent`; the count from the URI:
    ("{{ 'x'.ljust(n | int) | length }}", {"n": "100000000"}),
    ("{{ '{:>{w}}'.format('x', w=n | int) | length }}", {"n": "100000000"}),
    ("{{ '%*s' | format(n | int, 'x') | length }}", {"n": "100000000"}),
    ("{{ ('%.100000000d' % 1) | length }}", {}),  # a precision pads numbers with zeros
    ("{{ ('%(a)100000000s' % {'a': 1}) | length }}", {}),
    ("{{ (['x' * 1000] * 1000) | join | length }}", {}),  # 1,000 references, but a megabyte once printed
    ("{{ range(100000) | join('x' * 1000) | length }}", {}),
    ("{% set s = 'x' * 1000 %}{{ s.replace('x', s) | length }}", {}),
    ("{% set s = 'x' * 1000 %}{{ s | replace('x', s) | length }}", {}),
    ("{% set ns = namespace(s='x' * 1000) %}{% for i in range(n | int) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
     "{{ ns.s | length }}", {"n": "10"}),  # doubles n times
    ("{{ [[1]] | tojson(n | int) | length }}", {"n": "10000000"}),
    ("{{ [1] | batch(n | int, 0) | list | length }}", {"n": "10000000"}),
    ("{{ lipsum(n | int) | length }}", {"n": "10000"}),
])
def test_values_bigger_than_the_cap_are_refused_before_they_are_built(template: str, variables: dict) -> None:
    """Each of these would build gigabytes (or take minutes) before an output-only cap could refuse it."""
    from aggregator.render import RenderTooLarge, render

    async def no_read(uri: str) -> str:
        raise AssertionError(uri)

    async def main() -> None:
        with pytest.raises(RenderTooLarge):
            await render(template, variables, no_read, lambda prefix: [], 100_000)

    anyio.run(main)


def test_ordinary_arithmetic_and_padding_still_render() -> None:
    from aggregator.render import render

    async def no_read(uri: str) -> str:
        raise AssertionError(uri)

    template = "{{ '-' * 5 }} {{ 2 ** 10 }} {{ 'a' + 'b' }} {{ '%3d' % 7 }} [{{ 'x' | center(3) }}] {{ [0] * 2 }}"
    assert anyio.run(render, template, {}, no_read, lambda prefix: [], 1000) == "----- 1024 ab   7 [ x ] [0, 0]"


@pytest.mark.parametrize("template", [
    "{{ (3 ** (n | int)) % 7 }}",  # 8 million bits: a third of a second here, twenty seconds at 80 million
    "{{ ((2 ** 600000) * (2 ** 600000)) % 7 }}",
])
def test_integers_are_capped_by_bits_whatever_the_byte_cap(template: str) -> None:
    """Big integers cost CPU in the event loop long before they cost memory, and cannot be printed anyway."""
    from aggregator.render import RenderTooLarge, render

    async def no_read(uri: str) -> str:
        raise AssertionError(uri)

    async def main() -> None:
        with pytest.raises(RenderTooLarge):
            await render(template, {"n": "5000000"}, no_read, lambda prefix: [], 10 * 1024 * 1024)

    anyio.run(main)


def test_a_big_number_is_not_mistaken_for_a_width() -> None:
    """`'%d' % n` is as long as n's digits: a size of 5 MB formats in 7 characters under a 1,000-byte cap."""
    from aggregator.render import render

    async def no_read(uri: str) -> str:
        raise AssertionError(uri)

    template = "{{ '%d bytes' % (n | int) }}, {{ '%(n)s' % {'n': n | int} }}, {{ '%s' | format(n | int) }}"
    assert anyio.run(render, template, {"n": "5000000"}, no_read, lambda prefix: [], 1000) == \
        "5000000 bytes, 5000000, 5000000"


def test_ordinary_padding_joining_and_formatting_still_render() -> None:
    from aggregator.render import render

    async def no_read(uri: str) -> str:
        raise AssertionError(uri)

    template = ("{{ 'ab'.ljust(4, '.') }}|{{ '{:>4}|{:.2f}'.format('x', 3.14159) }}|{{ '%-3s|%05.1f' % ('a', 2.5) }}|"
                "{{ range(3) | map('string') | join(',') }}|{{ ','.join(['a', 'b']) }}|{{ 'abc'.replace('b', 'XX') }}|"
                "{{ 'a' ~ 1 ~ [2] }}|{{ {'k': [1]} | tojson(1) }}|{{ [1, 2, 3] | batch(2, 0) | list }}|"
                "{% autoescape true %}{{ '<' ~ 'b' }}{% endautoescape %}")
    assert anyio.run(render, template, {}, no_read, lambda prefix: [], 1000) == (
        'ab..|   x|3.14|a  |002.5|0,1,2|a,b|aXXc|a1[2]|{\n "k": [\n  1\n ]\n}|[[1, 2], [3, 0]]|&lt;b')
