"""Manifests built from manifests: include (paths, https and s3 URLs, namespaces, sha256 pins, cycles) and extends
(overlay merge rules, located errors in either file), and hot reload of an included file."""

from __future__ import annotations

import functools
import hashlib
import http.server
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from aggregator.service import ResourceService
from aggregator.manifest import load_manifest
from aggregator.manifest.model import ManifestError
from tests.command import aggregator
from tests.conftest import MODES, connect, write_manifest
from tests.http_server import serve
from tests.isolation import free_port

TEAM = """
    version: 1
    server: {name: team-a}
    defaults: {ttl: 42s}
    sources:
      docs: {url: ./docs}
    collections:
      - {source: docs, glob: "*.md", uri: "docs://{path}", name: "{stem}"}
    templates:
      - {uriTemplate: "docs://by-name/{name}", name: by-name, source: docs, path: "{name}.md"}
    """


@pytest.fixture
def teams(tmp_path: Path) -> Path:
    for team in ("a", "b"):
        folder = tmp_path / f"team-{team}"
        (folder / "docs").mkdir(parents=True)
        (folder / "docs" / "guide.md").write_text(f"# Team {team} guide\n")
        write_manifest(folder, TEAM.replace("team-a", f"team-{team}"))
    return tmp_path


def _errors(path: Path) -> str:
    with pytest.raises(ManifestError) as caught:
        load_manifest(path)
    return str(caught.value)


def test_include_with_namespaces(teams: Path) -> None:
    root = write_manifest(teams, """
        version: 1
        server: {name: all-teams}
        include:
          - {path: team-a/manifest.yaml, namespace: team-a}
          - {path: team-b/manifest.yaml, namespace: team-b}
        resources:
          - {uri: "note://hello", name: hello, text: hi}
        """)

    async def main() -> None:
        aggregator = await ResourceService.open(root)
        try:
            uris = [e.uri for e in aggregator.catalog.entries]
            assert uris == ["note://hello", "team-a+docs://guide.md", "team-b+docs://guide.md"]
            names = {e.uri: e.name for e in aggregator.catalog.entries}
            assert names["team-b+docs://guide.md"] == "team-b/guide"
            assert set(aggregator.sources) == {"team-a.docs", "team-b.docs"}
            # Local paths of an included manifest are relative to its own folder; its defaults still apply.
            assert (await aggregator.read("team-b+docs://guide.md")).content.text == "# Team b guide\n"
            guide = await aggregator.read("team-a+docs://by-name/guide")
            assert guide.content.text == "# Team a guide\n" and guide.ttl == 42
            assert {p.name for p in aggregator.manifest.files} == {"manifest.yaml"}
            assert len(aggregator.manifest.files) == 3
        finally:
            await aggregator.aclose()

    anyio.run(main)


def test_include_without_namespace_collides_with_located_errors(teams: Path) -> None:
    root = write_manifest(teams, """
        version: 1
        server: {name: clash}
        include: [team-a/manifest.yaml, team-b/manifest.yaml]
        """)
    message = _errors(root)
    assert f"{root}:3:33: include[1]: source 'docs' of 'team-b/manifest.yaml' is also declared by sources.docs" in message
    assert "give the include a namespace" in message


def test_sha256_pins(teams: Path) -> None:
    digest = hashlib.sha256((teams / "team-a" / "manifest.yaml").read_bytes()).hexdigest()
    good = write_manifest(teams, f"""
        version: 1
        server: {{name: pinned}}
        include:
          - {{path: team-a/manifest.yaml, sha256: "{digest}"}}
        """, name="good.yaml")
    assert len(load_manifest(good).sources) == 1
    bad = write_manifest(teams, f"""
        version: 1
        server: {{name: pinned}}
        include:
          - {{path: team-a/manifest.yaml, sha256: "{"0" * 64}"}}
        """, name="bad.yaml")
    message = _errors(bad)
    assert f"{bad}:4:" in message and "include[0].sha256" in message
    assert digest in message and "0" * 64 in message


def test_include_cycles_are_reported_with_the_chain(tmp_path: Path) -> None:
    write_manifest(tmp_path, 'version: 1\nserver: {name: a}\ninclude: [b.yaml]\n', name="a.yaml")
    write_manifest(tmp_path, 'version: 1\nserver: {name: b}\ninclude: [a.yaml]\n', name="b.yaml")
    message = _errors(tmp_path / "a.yaml")
    assert "include cycle:" in message
    assert message.count("a.yaml ->") == 1 and message.rstrip().endswith("a.yaml")


def test_errors_inside_an_included_file_name_that_file(teams: Path) -> None:
    broken = teams / "team-a" / "manifest.yaml"
    broken.write_text(broken.read_text().replace("glob: \"*.md\"", "glob: \"*.md\", colour: red"))
    root = write_manifest(teams, 'version: 1\nserver: {name: x}\ninclude: [team-a/manifest.yaml]\n')
    message = _errors(root)
    assert "team-a/manifest.yaml:7:" in message and "collections[0].colour" in message
    missing = write_manifest(teams, 'version: 1\nserver: {name: x}\ninclude: [nope.yaml]\n', name="m2.yaml")
    assert f"{missing}:3:11: include[0]: cannot read included manifest 'nope.yaml': no such file" in _errors(missing)


@pytest.fixture
def web(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A loopback HTTP server over a folder."""
    folder = tmp_path / "web"
    folder.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", folder
    finally:
        server.shutdown()
        server.server_close()


REMOTE = """
    version: 1
    server: {name: remote}
    resources:
      - {uri: "shared://policy", name: policy, text: "Be kind."}
    """


def test_include_by_https_url_and_local_folders_refused(tmp_path: Path, web: tuple[str, Path]) -> None:
    base, folder = web
    write_manifest(folder, REMOTE, name="shared.yaml")
    write_manifest(folder, "version: 1\nserver: {name: r}\nsources: {d: {url: ./x}}\n", name="local.yaml")
    digest = hashlib.sha256((folder / "shared.yaml").read_bytes()).hexdigest()
    root = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: via-http}}
        include:
          - {{url: "{base}/shared.yaml", namespace: shared, sha256: "{digest}"}}
        """)
    manifest = load_manifest(root)
    assert [r.uri for r in manifest.resources] == ["shared+shared://policy"]
    assert manifest.files == (root.resolve(),)
    refused = write_manifest(tmp_path, f'version: 1\nserver: {{name: x}}\ninclude: [{{url: "{base}/local.yaml"}}]\n',
                             name="refused.yaml")
    assert "may not declare local folders" in _errors(refused)


def test_include_by_s3_url(tmp_path: Path) -> None:
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    import boto3

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="k",
                          aws_secret_access_key="s")
        s3.create_bucket(Bucket="shared-manifests")
        body = REMOTE.replace("\n    ", "\n").encode()
        s3.put_object(Bucket="shared-manifests", Key="team/shared.yaml", Body=body)
        root = write_manifest(tmp_path, f"""
            version: 1
            server: {{name: via-s3}}
            include:
              - url: "s3://shared-manifests/team/shared.yaml"
                options: {{key: k, secret: s, endpoint_url: "{endpoint}"}}
                sha256: "{hashlib.sha256(body).hexdigest()}"
            """)
        manifest = load_manifest(root)
        assert [r.uri for r in manifest.resources] == ["shared://policy"]
    finally:
        server.stop()


def test_s3_includes_on_a_refused_endpoint_fail_validate_at_once(tmp_path: Path) -> None:
    """Each is a located error naming why no connection was made, after one attempt, as for S3 sources
    (botocore's legacy mode tried 5 times with growing waits: ~7 s per include, 20 s or more for these three)."""
    pytest.importorskip("s3fs", reason="s3fs is not installed")
    port = free_port()
    urls = ["s3://bucket/x.yaml", "s3://bucket/y.yaml", "s3://other/z.yaml"]
    options = f'{{key: k, secret: "s3-secret-2d7a", endpoint_url: "http://127.0.0.1:{port}"}}'
    root = tmp_path / "root.yaml"
    root.write_text("version: 1\nserver: {name: t}\ninclude:\n" +
                    "".join(f'  - {{url: "{url}", options: {options}}}\n' for url in urls))
    started = time.monotonic()
    done = aggregator("validate", str(root))
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    for key, url in enumerate(urls):
        assert (f"{root}:{key + 4}:5: include[{key}]: cannot read included manifest {url!r}: connection refused "
                f"127.0.0.1:{port}\n") in done.stderr, done.stderr
    assert "s3-secret-2d7a" not in done.stderr + done.stdout
    assert elapsed < 5, elapsed


def test_include_from_a_git_repository_at_a_ref(tmp_path: Path) -> None:
    """`git://REPO:REF@PATH` (fsspec's git filesystem): the manifest as it is at that tag, not at the branch tip."""
    pygit2 = pytest.importorskip("pygit2", reason="pygit2 is not installed (the git extra)")
    repo = pygit2.init_repository(str(tmp_path / "shared-repo"), initial_head="main")
    signature = pygit2.Signature("Test", "test@example.com", 1_700_000_000, 0)
    parents: list = []
    for text in (REMOTE, REMOTE.replace("Be kind.", "Be quick.")):
        (tmp_path / "shared-repo" / "team").mkdir(exist_ok=True)
        (tmp_path / "shared-repo" / "team" / "shared.yaml").write_text(text.replace("\n    ", "\n"))
        repo.index.add("team/shared.yaml")
        repo.index.write()
        parents = [repo.create_commit("HEAD", signature, signature, "shared", repo.index.write_tree(), parents)]
        if len(parents) == 1 and not repo.references.get("refs/tags/v1"):
            repo.create_tag("v1", parents[0], pygit2.enums.ObjectType.COMMIT, signature, "v1")
    root = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: via-git}}
        include:
          - {{url: "git://{tmp_path / 'shared-repo'}:v1@team/shared.yaml", namespace: team}}
          - {{url: "git://{tmp_path / 'shared-repo'}:main@team/shared.yaml", namespace: tip}}
        """)
    manifest = load_manifest(root)
    texts = {r.uri: r.text for r in manifest.resources}
    assert texts == {"team+shared://policy": "Be kind.", "tip+shared://policy": "Be quick."}
    missing = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: via-git}}
        include: [{{url: "git://{tmp_path / 'shared-repo'}:main@team/nope.yaml"}}]
        """, name="missing.yaml")
    assert "missing.yaml:3:11: include[0]: cannot read included manifest" in _errors(missing)


BASE = """
    version: 1
    server: {name: base, instructions: From the base.}
    defaults: {ttl: 5m, maxBytes: 1MiB}
    sources:
      docs: {url: ./docs}
      old: {url: ./docs}
    resources:
      - {uri: "note://a", name: a, text: "base a"}
      - {uri: "note://b", name: b, text: "base b"}
    collections:
      - {source: docs, glob: "*.md", uri: "docs://{path}", name: "{path}"}
    templates:
      - {uriTemplate: "docs://by/{name}", name: by, source: docs, path: "{name}.md"}
      - {uriTemplate: "old://{name}", name: old, source: old, path: "{name}.md"}
    """


def test_extends_merge_rules(tmp_path: Path) -> None:
    (tmp_path / "base" / "docs").mkdir(parents=True)
    (tmp_path / "base" / "docs" / "x.md").write_text("x")
    write_manifest(tmp_path / "base", BASE)
    (tmp_path / "prod").mkdir()
    overlay = write_manifest(tmp_path / "prod", """
        extends: ../base/manifest.yaml
        server: {name: prod}
        defaults: {ttl: 30s}
        sources:
          old: null
        resources:
          - {uri: "note://a", text: "prod a"}
          - {uri: "note://b", remove: true}
          - {uri: "note://c", name: c, text: "prod c"}
        collections:
          - {uri: "docs://{path}", name: "doc {path}"}
        templates:
          - {uriTemplate: "old://{name}", remove: true}
        """)
    m = load_manifest(overlay)
    assert (m.server.name, m.server.instructions) == ("prod", "From the base.")
    assert (m.defaults.ttl, m.defaults.max_bytes) == (30, 1024 * 1024)
    assert list(m.sources) == ["docs"]
    # Relative paths written in the base stay relative to the base's folder.
    assert m.sources["docs"].url == str(tmp_path / "base" / "docs")
    assert [(r.uri, r.name, r.text) for r in m.resources] == [("note://a", "a", "prod a"), ("note://c", "c", "prod c")]
    assert [(c.uri, c.name, c.glob) for c in m.collections] == [("docs://{path}", "doc {path}", "*.md")]
    assert [t.uri_template for t in m.templates] == ["docs://by/{name}"]
    assert {p.name for p in m.files} == {"manifest.yaml"} and len(m.files) == 2
    # Entries keep the location of the file that wrote them.
    assert m.resources[1].where.file == str(overlay)
    assert m.templates[0].where.file.endswith("base/manifest.yaml")


def test_extends_errors_point_into_the_right_file(tmp_path: Path) -> None:
    write_manifest(tmp_path, BASE.replace("maxBytes: 1MiB", "maxBytes: lots"), name="base.yaml")
    overlay = write_manifest(tmp_path, """
        extends: base.yaml
        resources:
          - {uri: "note://b", remove: true}
          - {uri: "note://zzz", remove: true}
          - {uri: "not a uri", name: bad, text: x}
        """, name="over.yaml")
    message = _errors(overlay)
    # written in the base (shown relative to the working directory when that is shorter)
    assert "/base.yaml:3:31: defaults.maxBytes" in message or message.startswith("base.yaml:3:31:")
    assert f"{overlay}:4:" in message and "no resources entry with uri 'note://zzz'" in message
    assert f"{overlay}:5:" in message  # the bad URI in the overlay
    write_manifest(tmp_path, "extends: loop-b.yaml\n", name="loop-a.yaml")
    write_manifest(tmp_path, "extends: loop-a.yaml\n", name="loop-b.yaml")
    assert "extends cycle:" in _errors(tmp_path / "loop-a.yaml")


def test_saving_an_included_file_reloads(teams: Path) -> None:
    root = write_manifest(teams, """
        version: 1
        server: {name: live-include}
        include: [{path: team-a/manifest.yaml, namespace: a}]
        """)
    included = teams / "team-a" / "manifest.yaml"

    async def main() -> None:
        async with connect(root, "legacy") as client:
            before = {r.uri for r in (await client.list_resources()).resources}
            assert before == {"a+docs://guide.md"}
            included.write_text(included.read_text().replace(
                "templates:", 'resources:\n  - {uri: "n://x", name: x, text: y}\ntemplates:'))
            for _ in range(60):
                await anyio.sleep(0.1)
                after = {r.uri for r in (await client.list_resources()).resources}
                if after != before:
                    break
            assert after == {"a+docs://guide.md", "a+n://x"}

    anyio.run(main)


def test_renders_in_a_namespaced_include_read_their_own_uris(teams: Path) -> None:
    """A shared manifest's render names its own URIs; included under a namespace, they still mean its resources."""
    team = teams / "team-a" / "manifest.yaml"
    team.write_text(team.read_text() + textwrap.dedent("""\
        resources:
          - uri: "digest://all"
            name: digest
            render: |
              {% for r in resources("docs://") %}{{ r.uri }}: {{ read(r.uri) | trim }}
              {% endfor %}{{ read("docs://guide.md") | trim }}
        """))
    root = write_manifest(teams, """
        version: 1
        server: {name: all}
        include:
          - {path: team-a/manifest.yaml, namespace: team-a}
          - {path: team-b/manifest.yaml, namespace: team-b}
        """)

    async def main() -> None:
        aggregator = await ResourceService.open(root)
        try:
            text = (await aggregator.read("team-a+digest://all")).content.text
            assert text == "team-a+docs://guide.md: # Team a guide\n# Team a guide\n"
        finally:
            await aggregator.aclose()

    anyio.run(main)


def test_nested_namespaces_reach_the_inner_manifests_resources(teams: Path) -> None:
    team = teams / "team-a" / "manifest.yaml"
    team.write_text(team.read_text() + 'resources:\n  - {uri: "d://x", name: d, render: "{{ read(\'docs://guide.md\') }}"}\n')
    write_manifest(teams, "version: 1\nserver: {name: mid}\ninclude: [{path: team-a/manifest.yaml, namespace: a}]\n",
                   name="mid.yaml")
    root = write_manifest(teams, "version: 1\nserver: {name: top}\ninclude: [{path: mid.yaml, namespace: m}]\n")

    async def main() -> None:
        aggregator = await ResourceService.open(root)
        try:
            assert (await aggregator.read("m+a+d://x")).content.text == "# Team a guide\n"
        finally:
            await aggregator.aclose()

    anyio.run(main)


def test_a_bases_includes_resolve_against_the_base(tmp_path: Path, teams: Path) -> None:
    """`include: [team-a/manifest.yaml]` written in a base in another folder means the base's neighbour."""
    (tmp_path / "env").mkdir()
    write_manifest(teams, "version: 1\nserver: {name: base}\ninclude: [{path: team-a/manifest.yaml, namespace: a}]\n",
                   name="base.yaml")
    overlay = write_manifest(tmp_path / "env", f"version: 1\nextends: {teams / 'base.yaml'}\nserver: {{name: prod}}\n")
    manifest = load_manifest(overlay)
    assert [c.uri for c in manifest.collections] == ["a+docs://{path}"]
    assert teams / "team-a" / "manifest.yaml" in manifest.files


def test_an_include_cycle_through_a_base_shows_the_whole_chain(tmp_path: Path) -> None:
    write_manifest(tmp_path, "version: 1\nserver: {name: m}\ninclude: [a.yaml]\n", name="m.yaml")
    write_manifest(tmp_path, "version: 1\nserver: {name: a}\nextends: b.yaml\n", name="a.yaml")
    write_manifest(tmp_path, "version: 1\nserver: {name: b}\ninclude: [m.yaml]\n", name="b.yaml")
    message = _errors(tmp_path / "m.yaml")
    chain = message.split("include cycle: ", 1)[1].splitlines()[0]
    assert [Path(p).name for p in chain.split(" -> ")] == ["m.yaml", "a.yaml", "b.yaml", "m.yaml"]


def test_a_url_manifest_reaches_only_urls(tmp_path: Path, web: tuple[str, Path]) -> None:
    """Relative includes of a URL manifest are fetched beside it; it may not name local files, declare local
    sources or private networks, or read the server's environment."""
    base, folder = web
    (folder / "team").mkdir()
    write_manifest(folder / "team", REMOTE, name="policy.yaml")
    write_manifest(folder, "version: 1\nserver: {name: s}\ninclude: [{path: team/policy.yaml, namespace: p}]\n",
                   name="shared.yaml")
    (tmp_path / "secret.yaml").write_text("version: 1\nserver: {name: s}\nsources: {d: {url: /etc}}\n")
    (tmp_path / "docs").mkdir()
    write_manifest(folder, f"version: 1\nserver: {{name: s}}\ninclude: [{tmp_path / 'secret.yaml'}]\n", name="abs.yaml")
    write_manifest(folder, "version: 1\nserver: {name: s}\ninclude: [../../secret.yaml]\n", name="up.yaml")
    write_manifest(folder, "version: 1\nserver: {name: s}\nextends: file:///etc/x.yaml\n", name="ext.yaml")
    write_manifest(folder, "version: 1\nserver: {name: s}\nsources: {g: {url: 'git+file:///srv/repo'}}\n",
                   name="git.yaml")
    write_manifest(folder, "version: 1\nserver: {name: s}\nsources: {l: {url: 'local:///etc'}}\n", name="fs.yaml")
    for proto, url in (("zip", "zip://docs.md::file:///etc/archive.zip"), ("tar", "tar:///etc/x.tar"),
                       ("ftp", "ftp://10.0.0.1/pub"), ("dir", "dir:///etc")):
        write_manifest(folder, f"version: 1\nserver: {{name: s}}\nsources: {{w: {{url: '{url}'}}}}\n",
                       name=f"{proto}.yaml")
    write_manifest(folder, "version: 1\nserver: {name: s}\nsources:\n  h: {url: 'http://10.0.0.1/', "
                           "allowPrivateNetwork: true}\n", name="net.yaml")
    write_manifest(folder, "version: 1\nserver: {name: s}\nsources:\n  b: {url: 's3://bucket/x', options: "
                           "{anon: true, endpoint_url: 'http://169.254.169.254'}}\n", name="s3.yaml")
    write_manifest(folder, "version: 1\nserver: {name: s}\nresources:\n"
                           "  - {uri: 'x://k', name: k, text: '${AGG_TEST_SECRET}'}\n"
                           "  - {uri: 'x://d', name: d, text: '${AGG_TEST_SECRET:-none} $${HOME}'}\n", name="env.yaml")

    def including(name: str, env: dict[str, str] | None = None) -> Path:
        return write_manifest(tmp_path, f'version: 1\nserver: {{name: x}}\ninclude: [{{url: "{base}/{name}"}}]\n',
                              name=f"inc-{name}")

    manifest = load_manifest(including("shared.yaml"))
    assert [r.uri for r in manifest.resources] == ["p+shared://policy"]
    for name in ("abs.yaml", "ext.yaml"):
        assert "may name other manifests only by URL" in _errors(including(name))
    assert "cannot read included manifest '../../secret.yaml'" in _errors(including("up.yaml"))  # fetched, 404
    assert "may not declare local folders" in _errors(including("git.yaml"))
    assert "may not declare local folders" in _errors(including("fs.yaml"))  # fsspec's name for local files
    for proto in ("zip", "tar", "ftp", "dir"):  # fsspec protocols that reach local files or any host, unguarded
        assert f"may not open the fsspec protocol {proto!r}" in _errors(including(f"{proto}.yaml")), proto
    assert "may not open private networks" in _errors(including("net.yaml"))
    refused = _errors(including("s3.yaml"))
    assert "sources.b.options.endpoint_url" in refused and "may not point a source at another endpoint" in refused
    assert "options.anon" not in refused
    with pytest.raises(ManifestError) as caught:
        load_manifest(including("env.yaml"), env={"AGG_TEST_SECRET": "s3cr3t"})
    assert "cannot read the server's environment (${AGG_TEST_SECRET})" in str(caught.value)
    assert "s3cr3t" not in str(caught.value)
    (folder / "env.yaml").write_text((folder / "env.yaml").read_text().replace("  - {uri: 'x://k'", "  - {uri: 'x://z'")
                                     .replace("'${AGG_TEST_SECRET}'", "ok"))
    texts = {r.uri: r.text for r in load_manifest(including("env.yaml"), env={"AGG_TEST_SECRET": "s"}).resources}
    assert texts == {"x://z": "ok", "x://d": "none ${HOME}"}


# --- hostile includes: whoever serves an unpinned URL cannot crash or exhaust the server ------------------------


def test_deep_manifest_by_url_is_a_located_error(tmp_path: Path, web: tuple[str, Path]) -> None:
    base, folder = web
    (folder / "deep.yaml").write_text("[" * 40_000)  # segfaulted libyaml's composer
    root = write_manifest(tmp_path, f'version: 1\nserver: {{name: x}}\ninclude: [{{url: "{base}/deep.yaml"}}]\n')
    assert f"{base}/deep.yaml:1:65: <root>: values are nested more than 64 levels deep" in _errors(root)


def test_include_by_url_is_read_no_further_than_max_manifest_bytes(tmp_path: Path, web: tuple[str, Path]) -> None:
    base, folder = web
    (folder / "big.yaml").write_text("version: 1\nserver: {name: big}\n" + "# padding\n" * 10_000)  # 100 KB
    with serve() as upstream:
        root = write_manifest(tmp_path, f"""
            version: 1
            server: {{name: x, maxManifestBytes: 64KiB}}
            include:
              - {{url: "{base}/big.yaml"}}
              - {{url: "http://127.0.0.1:{upstream.port}/base/endless"}}
            """)
        found: list[str] = []
        # An endless body: reading it whole would never return.
        worker = threading.Thread(target=lambda: found.append(_errors(root)), daemon=True)
        worker.start()
        worker.join(60)
        assert not worker.is_alive() and found
    assert f"manifest.yaml:4:5: include[0]: included manifest '{base}/big.yaml' is larger than " \
           "server.maxManifestBytes (64KiB)" in found[0]
    assert f"manifest.yaml:5:5: include[1]: included manifest 'http://127.0.0.1:{upstream.port}/base/endless' is " \
           "larger than server.maxManifestBytes (64KiB)" in found[0]


def test_extends_base_over_the_cap_is_located_at_extends(tmp_path: Path) -> None:
    write_manifest(tmp_path, "version: 1\nserver: {name: b}\n" + "# padding\n" * 500_000, name="base.yaml")
    overlay = write_manifest(tmp_path, "extends: base.yaml\nserver: {name: o}\n")
    assert "manifest.yaml:1:10: extends: base manifest 'base.yaml' is larger than server.maxManifestBytes (4MiB)" \
        in _errors(overlay)


def test_extends_merge_time_grows_linearly_with_the_base(tmp_path: Path) -> None:
    """Every mark copied scanned every mark of the file (2,000 entries: 3 s, 20,000: minutes, on reload too)."""
    def load_seconds(entries: int) -> float:
        folder = tmp_path / str(entries)
        folder.mkdir()
        write_manifest(folder, "version: 1\nserver: {name: b}\nresources:\n" + "".join(
            f"  - {{uri: 'n://{i}', name: n{i}, text: t}}\n" for i in range(entries)), name="base.yaml")
        overlay = write_manifest(folder, "extends: base.yaml\nresources:\n  - {uri: 'n://x', name: x, text: y}\n")
        best = float("inf")
        for _ in range(2):  # this process's CPU time, not the clock: other processes' load does not count
            start = time.process_time()
            assert len(load_manifest(overlay, env={}).resources) == entries + 1
            best = min(best, time.process_time() - start)
        return best

    small, large = load_seconds(250), load_seconds(2000)
    assert large < 25 * small, (small, large)  # 8x the entries: linear ~8x, quadratic ~64x


@pytest.mark.parametrize("mode", MODES)
def test_a_reload_waiting_on_a_slow_include_does_not_stall_requests(tmp_path: Path, mode: str) -> None:
    """The reload loaded the manifest on the event loop: a 10 s include URL froze every request for 10 s."""
    root = write_manifest(tmp_path, 'version: 1\nserver: {name: r}\nresources: [{uri: "note://a", name: a, text: a}]\n')

    async def main() -> None:
        with serve() as upstream:
            async with connect(root, mode) as client:
                tmp = root.with_suffix(".tmp~")
                tmp.write_text(root.read_text() + f'include: [{{url: "http://127.0.0.1:{upstream.port}/base/slow"}}]\n')
                tmp.replace(root)
                with anyio.fail_after(15):
                    while not any(hit.endswith(" slow") for hit in upstream.hits):
                        await anyio.sleep(0.05)  # the reload is now waiting on the include
                with anyio.fail_after(5):  # the include answers after 10 s
                    assert [r.uri for r in (await client.list_resources()).resources] == ["note://a"]
                    assert (await client.read_resource("note://a")).contents[0].text == "a"

    anyio.run(main)


def test_one_load_reads_at_most_max_files_manifests(tmp_path: Path) -> None:
    """Includes that name files again and again (or a tree of them) made a load read without end."""
    write_manifest(tmp_path, "version: 1\nserver: {name: leaf}\n", name="leaf.yaml")
    write_manifest(tmp_path, "version: 1\nserver: {name: mid}\ninclude: [" + ", ".join(["leaf.yaml"] * 10) + "]\n",
                   name="mid.yaml")
    fine = write_manifest(tmp_path, "version: 1\nserver: {name: r}\ninclude: [" + ", ".join(["mid.yaml"] * 5) + "]\n",
                          name="fine.yaml")
    assert load_manifest(fine, env={}).server.name == "r"  # 1 + 5 + 50 files
    fan = write_manifest(tmp_path, "version: 1\nserver: {name: r}\ninclude:\n" + "  - mid.yaml\n" * 8)
    errors = _errors(fan)
    # The root, 5 mids and their 50 leaves, the 6th mid and 7 of its leaves: the 8th leaf is the 65th file.
    assert "mid.yaml:3:" in errors and "include[7]: more than 64 manifest files in one load" in errors
    assert errors.count("more than 64 manifest files") == 2  # where it happened, and the mid that was not read


def _tree(folder: Path, base: str, team_doc: str = "# guide\n") -> Path:
    """A root manifest extending a base and including a local and a URL manifest, in `folder`."""
    folder.mkdir(parents=True)
    (folder / "team-a" / "docs").mkdir(parents=True)
    (folder / "team-a" / "docs" / "guide.md").write_text(team_doc)
    write_manifest(folder / "team-a", TEAM)
    write_manifest(folder, "version: 1\nserver: {name: base}\ndefaults: {ttl: 7s}\n", name="base.yaml")
    return write_manifest(folder, f"""
        version: 1
        extends: base.yaml
        server: {{name: company}}
        include:
          - {{path: team-a/manifest.yaml, namespace: a}}
          - {{url: "{base}/shared.yaml", namespace: shared}}
        """)


def test_digest_covers_every_file_read_and_nothing_else(tmp_path: Path, web: tuple[str, Path]) -> None:
    """The sha256 depends on the bytes of the root, its extends base, its includes (URL ones too) in load order:
    two copies in different folders with different mtimes agree, a changed include or base changes it, and a
    served file does not (it is content, not manifest)."""
    import os

    base, folder = web
    write_manifest(folder, REMOTE, name="shared.yaml")
    one = load_manifest(_tree(tmp_path / "one", base))
    two_root = _tree(tmp_path / "elsewhere" / "two", base, team_doc="# another guide\n")
    for path in (two_root.parent).rglob("*.yaml"):
        os.utime(path, (1_000_000, 1_000_000))
    two = load_manifest(two_root)
    assert len(one.digest) == 64 and int(one.digest, 16) >= 0
    assert one.digest == two.digest
    assert load_manifest(two_root).digest == two.digest  # stable from load to load
    write_manifest(tmp_path / "elsewhere" / "two" / "team-a", TEAM + "# a comment\n")
    changed_include = load_manifest(two_root).digest
    assert changed_include != one.digest
    write_manifest(folder, REMOTE + "# a comment\n", name="shared.yaml")
    changed_url = load_manifest(two_root).digest
    assert changed_url not in (one.digest, changed_include)
    write_manifest(tmp_path / "elsewhere" / "two", "version: 1\nserver: {name: base}\ndefaults: {ttl: 8s}\n",
                   name="base.yaml")
    assert load_manifest(two_root).digest not in (one.digest, changed_include, changed_url)


def test_digest_of_a_single_file_is_its_sha256(tmp_path: Path) -> None:
    """A manifest of one file reports what `sha256sum manifest.yaml` prints, so an operator can check it by hand."""
    root = write_manifest(tmp_path, "version: 1\nserver: {name: one}\n")
    assert load_manifest(root).digest == hashlib.sha256(root.read_bytes()).hexdigest()
