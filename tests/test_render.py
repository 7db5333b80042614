"""Rendered resources (`render:` Jinja2 in a sandbox): digests, JSON to Markdown, template variables as data,
syntax errors found by validate, output caps, recursion, and access scopes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from aggregator.service import ResourceService
from aggregator.errors import (ResourceNotFound, ResourceOverBudget, ResourceRenderFailed, ResourceTooLarge,
                               ResourceUnavailable)
from tests.conftest import MODES, connect, write_manifest
from tests.command import aggregator


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
        aggregator = await ResourceService.open(rendered)
        try:
            text = (await aggregator.read("echo://%7B%7B7*7%7D%7D%7B%25%20if%20true%20%25%7D")).content.text
            assert text == "{{7*7}}{% if true %}|{{7*7}}{% if true %}"
        finally:
            await aggregator.aclose()

    anyio.run(main)


def test_render_failures_are_clean_errors(rendered: Path) -> None:
    async def main() -> None:
        aggregator = await ResourceService.open(rendered)
        try:
            with pytest.raises(ResourceRenderFailed):
                await aggregator.read("loop://self")  # nesting stops; no hang, no RecursionError
            with pytest.raises(ResourceRenderFailed):
                await aggregator.read("evil://mro")  # the sandbox refuses the attribute
            with pytest.raises(ResourceTooLarge):
                await aggregator.read("big://out")  # 1 MB of output against a 4 KiB cap
        finally:
            await aggregator.aclose()

    anyio.run(main)


def test_render_respects_access_scopes(rendered: Path) -> None:
    async def main() -> None:
        aggregator = await ResourceService.open(rendered)
        try:
            vault = await aggregator.read("secrets://digest", frozenset({"vault"}))
            assert vault.content.text == "VAULT SECRET"
            # Without the scope the vault's files are invisible to the template too.
            assert (await aggregator.read("secrets://digest", frozenset())).content.text == ""
            with pytest.raises(ResourceNotFound):
                await aggregator.read("vault://k.md", frozenset())
            # Its text depends on who asks, so its result must say cacheScope: private.
            assert vault.private
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
    result = aggregator("validate", "--offline", str(manifest))
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


# --- the render budget: a time limit and a cap on loop iterations -------------------------------------------------

NESTED_LOOPS = "{% for i in range(n | int) %}{% for j in range(n | int) %}.{% endfor %}{% endfor %}"
CALLS = "{% macro f(k) %}{% if k > 0 %}{{ f(k - 1) }}{{ f(k - 1) }}{% endif %}{% endmacro %}{{ f(n | int) }}done"


async def _no_read(uri: str) -> str:
    raise AssertionError(uri)


def _render_with(template: str, variables: dict, timeout: float = 30.0, max_iterations: int = 1_000_000,
                 max_bytes: int = 10 * 1024 * 1024) -> str:
    from aggregator.manifest.model import RenderSettings
    from aggregator.render import render

    limits = RenderSettings(timeout=timeout, max_iterations=max_iterations)
    return anyio.run(lambda: render(template, variables, _no_read, lambda prefix: [], max_bytes, limits))


def test_loop_iterations_are_counted_across_all_loops() -> None:
    """10 outer and 100 inner iterations: 110 in all."""
    from aggregator.render import RenderOverBudget

    assert _render_with(NESTED_LOOPS, {"n": "10"}, max_iterations=110) == "." * 100
    with pytest.raises(RenderOverBudget, match="109 loop iterations"):
        _render_with(NESTED_LOOPS, {"n": "10"}, max_iterations=109)
    # The 100,000,000 iterations stop at the default cap, long before the time limit.
    with pytest.raises(RenderOverBudget, match="1000000 loop iterations"):
        _render_with(NESTED_LOOPS, {"n": "10000"}, timeout=60)


@pytest.mark.parametrize("template", [
    "{% for n in tree recursive %}{{ n.name }}{{ loop(n.children) }}{% endfor %}",  # loop() items count too
    "{% for n in tree if n.name %}{{ n.name }}{% for c in n.children %}{{ c.name }}{% endfor %}{% endfor %}",
])
def test_filtered_and_recursive_loops_count_their_items(template: str) -> None:
    from aggregator.render import RenderOverBudget, render

    tree = [{"name": "a", "children": [{"name": "b", "children": []}, {"name": "c", "children": []}]}]

    async def read_tree(uri: str) -> str:
        return json.dumps(tree)

    async def main(max_iterations: int) -> str:
        from aggregator.manifest.model import RenderSettings

        limits = RenderSettings(max_iterations=max_iterations)
        return await render("{% set tree = json('t') %}" + template, {}, read_tree, lambda prefix: [], 1000, limits)

    assert anyio.run(main, 3) == "abc"
    with pytest.raises(RenderOverBudget):
        anyio.run(main, 2)


@pytest.mark.parametrize(("template", "variables"), [
    (CALLS, {"n": "40"}),  # 2^40 macro calls and no loop: only the clock stops it
    ("{{ ('x' * (n | int)) | map('upper') | join | length }}", {"n": "5000000"}),  # a loop inside a filter
    ("{{ ('x' * (n | int)) | select('ne', 'y') | list | length }}", {"n": "5000000"}),
    ("{{ ('x' * (n | int)) | map(attribute='x') | list | length }}", {"n": "5000000"}),
])
def test_a_render_stops_at_its_time_limit(template: str, variables: dict) -> None:
    from aggregator.render import RenderOverBudget

    start = time.monotonic()
    with pytest.raises(RenderOverBudget, match=r"0\.3s"):
        _render_with(template, variables, timeout=0.3)
    assert time.monotonic() - start < 10  # seconds to hours without the limit


def test_a_render_stuck_inside_one_filter_is_interrupted_and_its_thread_serves_again() -> None:
    """`wordwrap` over 10 MB loops in Python inside one filter call, out of reach of every check (6 s here): past
    the deadline its thread is interrupted, and the thread goes on to serve other renders unharmed."""
    from aggregator.manifest.model import RenderSettings
    from aggregator.render import RenderOverBudget, render

    async def main() -> None:
        with pytest.raises(RenderOverBudget, match=r"0\.3s"):
            await render("{{ ('a ' * (n | int)) | wordwrap(5) | length }}", {"n": "5000000"}, _no_read,
                         lambda prefix: [], 10 * 1024 * 1024, RenderSettings(timeout=0.3))
        for _ in range(20):
            await anyio.sleep(0.01)  # a stop sent late would land here, in the next render of the same thread
            assert await render("{{ 'a' * 3 }}", {}, _no_read, lambda prefix: [], 100) == "aaa"

    anyio.run(main)


def test_the_budget_leaves_ordinary_renders_alone() -> None:
    assert _render_with(CALLS, {"n": "5"}, timeout=5) == "done"
    assert _render_with("{{ range(3) | map('string') | join(',') }}", {}, max_iterations=1) == "0,1,2"


def test_nested_renders_share_the_budget_and_never_wait_on_each_other(tmp_path: Path) -> None:
    """Four levels of renders, read by many callers at once: every level gets its own worker threads, so outer
    renders holding every thread cannot starve the renders they read; a level's loops count against its reader's
    budget."""
    manifest = write_manifest(tmp_path, """
        version: 1
        server: {name: nested}
        render: {maxIterations: 25}
        resources:
          - {uri: "l0://x", name: l0, render: "{% for i in range(5) %}{% endfor %}0{{ read('l1://x') }}"}
          - {uri: "l1://x", name: l1, render: "{% for i in range(5) %}{% endfor %}1{{ read('l2://x') }}"}
          - {uri: "l2://x", name: l2, render: "{% for i in range(5) %}{% endfor %}2{{ read('l3://x') }}"}
          - {uri: "l3://x", name: l3, render: "{% for i in range(5) %}{% endfor %}3{{ read('t://x') }}"}
          - {uri: "t://x", name: t, text: "."}
          - {uri: "over://x", name: over, render: "{% for i in range(11) %}{% endfor %}{{ read('l1://x') }}"}
        """)

    async def main() -> None:
        aggregator = await ResourceService.open(manifest)
        try:
            assert aggregator.manifest.render.max_iterations == 25
            results: list[str] = []

            async def read() -> None:
                results.append((await aggregator.read("l0://x")).content.text or "")

            async with anyio.create_task_group() as group:
                for _ in range(24):
                    group.start_soon(read)
            assert results == ["0123."] * 24
            with pytest.raises(ResourceOverBudget) as failed:  # 11 + 3 * 5 iterations: past 25
                await aggregator.read("over://x")
            assert "over://x" in failed.value.message
            assert (await aggregator.read("l1://x")).content.text == "123."  # read on its own, a level has its own budget
        finally:
            await aggregator.aclose()

    anyio.run(main)


def test_render_settings_come_from_the_root_manifest_only(tmp_path: Path) -> None:
    from aggregator.manifest import load_manifest
    from aggregator.manifest.model import ManifestError, RenderSettings

    write_manifest(tmp_path, """
        version: 1
        server: {name: team}
        render: {timeout: 1ms, maxIterations: 1}
        resources:
          - {uri: "team://x", name: x, render: "{% for i in range(3) %}{{ i }}{% endfor %}"}
        """, name="team.yaml")
    root = write_manifest(tmp_path, """
        version: 1
        server: {name: root}
        render: {timeout: 1500ms}
        include: [{path: team.yaml}]
        """)
    manifest = load_manifest(root)
    assert manifest.render == RenderSettings(timeout=1.5, max_iterations=1_000_000)
    assert load_manifest(tmp_path / "team.yaml").render == RenderSettings(timeout=0.001, max_iterations=1)

    async def main() -> None:
        aggregator = await ResourceService.open(root)
        try:
            assert (await aggregator.read("team://x")).content.text == "012"
        finally:
            await aggregator.aclose()

    anyio.run(main)
    for settings, problem in (("{timeout: 0s}", "render.timeout: a render timeout must be longer than 0s"),
                              ("{maxIterations: 0}", "render.maxIterations: must be at least 1"),
                              ("{memory: 1}", "render.memory: unknown key 'memory'")):
        bad = write_manifest(tmp_path, f"""
            version: 1
            server: {{name: bad}}
            render: {settings}
            """, name="bad.yaml")
        with pytest.raises(ManifestError) as failed:
            load_manifest(bad)
        assert f"bad.yaml:3:" in str(failed.value) and problem in str(failed.value)


def _port_nobody_listens_on() -> int:
    from tests.isolation import free_port

    return free_port()


@pytest.mark.parametrize("mode", MODES)
def test_a_broken_render_is_a_permanent_error_and_a_missing_input_a_transient_one(tmp_path: Path, mode: str) -> None:
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: t}}
        sources:
          down: {{url: "http://127.0.0.1:{_port_nobody_listens_on()}/", allowPrivateNetwork: true, optional: true}}
        resources:
          - {{uri: "note://a", name: a, text: "alpha"}}
          - {{uri: "digest://typo", name: typo, render: "Hello {{{{ nmae }}}}"}}
          - {{uri: "digest://nested", name: nested, render: "{{{{ read('digest://typo') }}}}"}}
          - {{uri: "web://a", name: web, source: down, path: a.md}}
          - {{uri: "digest://down", name: down, render: "{{{{ read('web://a') }}}}"}}
        """)

    async def main() -> None:
        async with connect(manifest, mode) as client:
            for uri in ("digest://typo", "digest://nested"):
                with pytest.raises(MCPError) as failed:
                    await client.read_resource(uri)
                assert failed.value.error.message == f"Resource {uri} could not be rendered (see the server log)"
                assert "nmae" not in str(failed.value.error)
            with pytest.raises(MCPError) as failed:
                await client.read_resource("digest://down")
            assert failed.value.error.message == "Resource digest://down could not be read right now"

    anyio.run(main)


def test_a_render_failure_logs_its_cause(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    manifest = write_manifest(tmp_path, """
        version: 1
        server: {name: t}
        resources:
          - {uri: "digest://typo", name: typo, render: "Hello {{ nmae }}"}
        """)

    async def main() -> None:
        aggregator = await ResourceService.open(manifest)
        try:
            with pytest.raises(ResourceRenderFailed) as failed:
                await aggregator.read("digest://typo")
            assert "right now" not in failed.value.message and "nmae" not in failed.value.message
        finally:
            await aggregator.aclose()

    anyio.run(main)
    assert "render digest://typo failed: UndefinedError: 'nmae' is undefined" in caplog.text
