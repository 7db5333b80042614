"""deploy/: the image, the Kubernetes files and the balancers, checked offline (no cluster runs here; the image is
built and run by `make image-check`, not by the suite) and then for real: replicas behind HAProxy and nginx, driven
by the official MCP client on both wires."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from mcp import Client
from mcp.shared.subscriptions import ResourcesListChanged, ResourceUpdated

from tests.conftest import MODES, server_params
from tests.replicas import (DEPLOY, HAPROXY_CFG, NGINX_CONF, ROOT, cluster, find_binary, free_port, haproxy_env,
                            legacy_failures, nginx_config, replicas)
from tests.test_live import Inbox, listened
from tests.command import aggregator

KUBERNETES = DEPLOY / "kubernetes"
KUBERNETES_VERSION = "1.34.0"
"""The Kubernetes API the files are validated against (kubernetes-validate's bundled schemas)."""
GRACEFUL_SHUTDOWN = int(re.findall(r"timeout_graceful_shutdown=(\d+)",
                                   (ROOT / "aggregator" / "serve_http.py").read_text())[0])
"""Seconds `serve --http` lets requests in flight finish after SIGTERM (uvicorn's, as serve_http.py sets it)."""

MANIFEST = """
version: 1
server: {name: fleet, reloadSettle: 0s}
sources:
  docs: {url: ./docs}
collections:
  - {source: docs, glob: "*.md", uri: "docs://{path}"}
"""


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _kubernetes_objects() -> dict[str, dict[str, Any]]:
    """Every object of the kustomization's resources, by kind/name."""
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    return {f"{d['kind']}/{d['metadata']['name']}": d
            for name in kustomization["resources"] for d in _documents(KUBERNETES / name)}


# --- the image ------------------------------------------------------------------------------------------------


def _dockerfile() -> Any:
    parser = pytest.importorskip("dockerfile_parse", reason="dockerfile-parse (the test extra) is not installed")
    return parser.DockerfileParser(str(DEPLOY / "Dockerfile"))


def test_dockerfile_runs_as_non_root_installs_runtime_extras_and_copies_files_that_exist() -> None:
    """The Dockerfile parsed (`make image-check`, run by .ci/run, builds it with podman and checks inside)."""
    parsed = _dockerfile()
    steps = [(i["instruction"], i["value"]) for i in parsed.structure]
    stages = [v for k, v in steps if k == "FROM"]
    assert len(stages) == 2 and parsed.baseimage == "python:3.11-slim-bookworm"
    # Both stages start from one argument, python:3.11-slim by default: .ci/image passes a base it made itself (no
    # registry is reachable there), and every --build-arg it passes is one the Dockerfile declares.
    declared = {v.split("=")[0] for k, v in steps if k == "ARG"}
    assert {v.split()[0] for v in stages} == {"${PYTHON_IMAGE}"} and "PYTHON_IMAGE" in declared
    passed = set(re.findall(r'--build-arg "(\w+)=', (ROOT / ".ci" / "image").read_text()))
    assert "PYTHON_IMAGE" in passed and passed <= declared
    final = steps[max(i for i, (k, _) in enumerate(steps) if k == "FROM"):]
    users = [v for k, v in final if k == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert int(users[-1].split(":")[0]) >= 1000
    assert [v for k, v in final if k == "EXPOSE"] == ["8080"]
    assert json.loads(dict(final)["ENTRYPOINT"]) == ["aggregator"]
    assert json.loads(dict(final)["CMD"]) == ["serve", "/etc/aggregator/manifest.yaml", "--http", "0.0.0.0:8080"]
    # The extras it installs are the runtime ones, each declared in pyproject.toml; never the test extra.
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    installs = re.findall(r'pip install "\.\[([a-z,]+)\]"', " ".join(v for k, v in steps if k == "RUN"))
    assert installs == ["remote,postgres,server,cluster,otel"]
    assert set(installs[0].split(",")) <= set(extras) - {"test", "bench"}
    # Every COPY from the build context names something in the repository, and .dockerignore does not hide it.
    ignored = [line for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line and not line.startswith("#")]
    for key, value in steps:
        if key == "COPY" and not value.startswith("--from="):
            *sources, _ = shlex.split(value)
            for source in sources:
                assert (ROOT / source).exists(), source
                assert not any(source == i or source.startswith(i + "/") for i in ignored), source


def test_dockerfile_build_stage_copies_what_the_package_symlinks_point_to() -> None:
    """A symlink in a copied folder (aggregator/manifest.schema.json -> ../schemas/) dangles in the build stage
    unless its target is copied too: the wheel then lacks the file and `aggregator validate` fails in the image."""
    steps = [(i["instruction"], i["value"]) for i in _dockerfile().structure]
    build = steps[:[i for i, (k, _) in enumerate(steps) if k == "FROM"][1]]
    copied = [ROOT / source for key, value in build if key == "COPY" and not value.startswith("--from=")
              for source in shlex.split(value)[:-1]]
    links = [path for top in copied if top.is_dir() for path in top.rglob("*") if path.is_symlink()]
    assert links, "expected aggregator/manifest.schema.json to be a symlink into schemas/"
    for link in links:
        target = link.resolve()
        assert any(target == top or top in target.parents for top in copied), (
            f"{link.relative_to(ROOT)} -> {target.relative_to(ROOT)}: not copied into the build stage")


def test_dockerfile_healthcheck_answers_for_a_live_server_and_fails_for_none(tmp_path: Path) -> None:
    """The HEALTHCHECK command (Python's urllib: slim has no curl) exits 0 against a serving replica, 1 when
    nothing listens; it carries a timeout."""
    healthcheck = dict((i["instruction"], i["value"]) for i in _dockerfile().structure)["HEALTHCHECK"]
    assert "--timeout=" in healthcheck
    command = json.loads(healthcheck[healthcheck.index("CMD") + 3:])
    assert command[:2] == ["python", "-c"] and "timeout=" in command[2]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n")
    (tmp_path / "manifest.yaml").write_text(MANIFEST)
    with replicas(tmp_path / "manifest.yaml", 1, tmp_path) as (replica,):
        probe = command[2].replace("127.0.0.1:8080", replica.address)
        assert probe != command[2]
        assert subprocess.run([sys.executable, "-c", probe], timeout=30).returncode == 0
    probe = command[2].replace("127.0.0.1:8080", f"127.0.0.1:{free_port()}")
    assert subprocess.run([sys.executable, "-c", probe], timeout=30, capture_output=True).returncode != 0


# --- Kubernetes -----------------------------------------------------------------------------------------------


def test_kubernetes_files_validate_strictly_against_the_pinned_api_version() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate",
                                              reason="kubernetes-validate (the test extra) is not installed")
    objects = _kubernetes_objects()
    assert {key.split("/")[0] for key in objects} == {
        "ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"}
    for key, document in objects.items():
        # strict: an unknown or misspelled field is an error, not silently ignored by the API server.
        assert kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True), key


def test_kustomization_lists_every_file_in_the_folder_and_only_those() -> None:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    listed = kustomization["resources"]
    present = sorted(p.name for p in KUBERNETES.iterdir() if p.name != "kustomization.yaml")
    assert sorted(listed) == present and len(set(listed)) == len(listed)
    assert "secretGenerator" not in kustomization  # a real secret never lives here
    assert not any(d["kind"] == "Secret" for name in listed for d in _documents(KUBERNETES / name))


def test_deployment_probes_shutdown_security_secret_and_configmap_folder_mount() -> None:
    objects = _kubernetes_objects()
    deployment = objects["Deployment/aggregator"]
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert deployment["spec"]["replicas"] == 3
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/healthz"
    assert container["args"][-2:] == ["--http", "0.0.0.0:8080"]
    # SIGTERM comes after preStop; the grace period must outlast both, or the kubelet kills requests in flight.
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert spec["terminationGracePeriodSeconds"] > int(pre_stop[1]) + GRACEFUL_SHUTDOWN
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    user = [i["value"] for i in _dockerfile().structure if i["instruction"] == "USER"][-1]
    assert str(spec["securityContext"]["runAsUser"]) == user.split(":")[0]
    # REDIS_URL may hold a password: from a Secret, never a literal.
    (redis,) = [e for e in container["env"] if e["name"] == "REDIS_URL"]
    assert "value" not in redis and redis["valueFrom"]["secretKeyRef"]["key"]
    # The ConfigMap is a folder mount: a subPath mount is never updated by the kubelet.
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    (manifest_volume,) = [n for n, v in volumes.items() if "configMap" in v]
    assert mounts[manifest_volume]["mountPath"] == "/etc/aggregator"
    assert not any("subPath" in m or "subPathExpr" in m for m in container["volumeMounts"])
    assert volumes[manifest_volume]["configMap"]["name"] in {k.split("/")[1] for k in objects if
                                                            k.startswith("ConfigMap/")}
    # The served manifest is the ConfigMap's key at that path; the container writes only to emptyDirs.
    assert "/etc/aggregator/manifest.yaml" in container["args"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    for key in ("Service/aggregator", "PodDisruptionBudget/aggregator"):
        found = objects[key]["spec"]["selector"]
        assert found.get("matchLabels", found) == selector, key
    assert objects["HorizontalPodAutoscaler/aggregator"]["spec"]["scaleTargetRef"]["name"] == "aggregator"


def test_configmap_manifest_is_valid_and_takes_redis_from_the_environment(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from aggregator.manifest import load_manifest

    configmap = _kubernetes_objects()["ConfigMap/aggregator-manifest"]
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(configmap["data"]["manifest.yaml"])
    checked = aggregator("validate", "--offline", str(manifest), env={"REDIS_URL": "redis://:s3cret@redis:6379/0"})
    assert checked.returncode == 0, checked.stderr
    assert "s3cret" not in checked.stdout + checked.stderr
    assert "${REDIS_URL}" in manifest.read_text()
    monkeypatch.setenv("REDIS_URL", "redis://redis:6379/0")
    loaded = load_manifest(manifest)
    assert loaded.server.cluster is not None and loaded.server.cluster.redis == "redis://redis:6379/0"
    # In-cluster clients reach the Service as aggregator:8080 (Host header with the port): it must pass the
    # replicas' DNS-rebinding check, which `serve --http 0.0.0.0:8080` builds from allowedHosts.
    anyio.run(_host_checks, loaded.server.http)


async def _host_checks(settings: Any) -> None:
    from mcp.server.transport_security import TransportSecurityMiddleware
    from starlette.requests import Request

    from aggregator.http_app import transport_security

    guard = TransportSecurityMiddleware(transport_security("0.0.0.0", 8080, settings))

    async def verdict(host: str) -> Any:
        scope = {"type": "http", "method": "GET", "path": "/mcp", "headers": [(b"host", host.encode())]}
        return await guard.validate_request(Request(scope))

    for host in ("aggregator:8080", "aggregator.docs.svc.cluster.local:8080", "docs.example.com"):
        assert await verdict(host) is None, host
    assert (await verdict("evil.example")).status_code == 421


def _configmap_mount(mount: Path, stamp: str, manifest: str) -> None:
    """What the kubelet's AtomicWriter does: the files in a new `..<timestamp>` folder, a `..data_tmp` link to it
    renamed over `..data`, links for each key (first time only), then the previous folder removed."""
    folder = mount / f"..{stamp}"
    folder.mkdir(parents=True)
    (folder / "manifest.yaml").write_text(manifest)
    previous = os.readlink(mount / "..data") if (mount / "..data").is_symlink() else None
    os.symlink(folder.name, mount / "..data_tmp")
    os.replace(mount / "..data_tmp", mount / "..data")
    if not (mount / "manifest.yaml").is_symlink():
        os.symlink("..data/manifest.yaml", mount / "manifest.yaml")
    if previous is not None:
        for child in (mount / previous).iterdir():
            child.unlink()
        (mount / previous).rmdir()


@pytest.mark.parametrize("mode", MODES)
def test_serve_reads_a_configmap_mount_and_reloads_on_the_kubelets_symlink_swap(tmp_path: Path, mode: str) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n")
    base = MANIFEST.replace("./docs", str(docs))
    mount = tmp_path / "etc-aggregator"
    mount.mkdir()
    _configmap_mount(mount, "2026_11_23_10_00_00.000000001", base)
    added = base + 'resources:\n  - {uri: "note://swapped", name: swapped, text: "from the new ConfigMap"}\n'
    inbox = Inbox()

    def swap() -> None:
        _configmap_mount(mount, "2026_11_23_10_01_00.000000002", added)

    async def main() -> None:
        # Each wire as its client hears changes: legacy through the message handler, modern through listen.
        async with Client(server_params(mount / "manifest.yaml"), mode=mode, cache=None,  # type: ignore[arg-type]
                          message_handler=inbox) as client:
            assert [str(r.uri) for r in (await client.list_resources()).resources] == ["docs://a.md"]
            if mode == "legacy":
                await anyio.sleep(0.3)  # the watcher is up
                swap()
                assert await inbox.next(timeout=10) == ("list_changed", None)
            else:
                assert await listened(client, [(swap, 1)], resources_list_changed=True) == [ResourcesListChanged()]
            assert (await client.read_resource("note://swapped")).contents[0].text == "from the new ConfigMap"

    anyio.run(main)
    assert sorted(p.name for p in mount.iterdir()) == ["..2026_11_23_10_01_00.000000002", "..data", "manifest.yaml"]


# --- the balancers --------------------------------------------------------------------------------------------


def _stick_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith(("stick ", "stick-table "))]


def test_haproxy_config_checks_with_fixed_addresses_and_with_kubernetes_dns(tmp_path: Path) -> None:
    binary = find_binary("haproxy", "/usr/sbin/haproxy")
    text = HAPROXY_CFG.read_text()
    assert _stick_lines(text) == ["stick-table type string len 64 size 1m expire 30m",
                                  "stick store-response res.hdr(mcp-session-id)",
                                  "stick match req.hdr(mcp-session-id)"]
    for line in ("option http-no-delay", "balance roundrobin", "option httpchk GET /healthz"):
        assert re.search(rf"^\s*{re.escape(line)}$", text, re.M), line
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AGGREGATOR_")}
    fixed = haproxy_env(["127.0.0.1:18001", "127.0.0.1:18002", "127.0.0.1:18003"], 18080)
    dns = {"AGGREGATOR_BIND": ":8080", "AGGREGATOR_DNS": "localhost", "AGGREGATOR_RESOLVER": "127.0.0.1:53"}
    for env in (fixed, dns):
        checked = subprocess.run([binary, "-c", "-f", str(HAPROXY_CFG)], env={**clean, **env}, capture_output=True,
                                 text=True, timeout=30)
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_nginx_config_checks(tmp_path: Path) -> None:
    binary = find_binary("nginx", "/usr/sbin/nginx")
    conf = nginx_config(["127.0.0.1:18001", "127.0.0.1:18002"], 18080, tmp_path)
    text = NGINX_CONF.read_text()
    for line in ("proxy_buffering off;", "proxy_http_version 1.1;", "proxy_read_timeout 1h;"):
        assert line in text, line
    assert "haproxy.cfg" in text and "mcp_session_id" in text  # says why legacy sessions need HAProxy
    checked = subprocess.run([binary, "-t", "-p", str(tmp_path), "-c", str(conf), "-e", "stderr",
                              "-g", f"pid {tmp_path / 'nginx.pid'};"], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr


def _fleet(folder: Path) -> Path:
    """A manifest over a docs folder every replica shares (as each pod has its own copy of a ConfigMap)."""
    (folder / "docs").mkdir()
    (folder / "docs" / "a.md").write_text("# A\n")
    (folder / "manifest.yaml").write_text(MANIFEST)
    return folder / "manifest.yaml"


def _reads(c: Any) -> list[float]:
    return [r.requests("resources/read") for r in c.replicas]


@pytest.mark.parametrize("balancer", ["haproxy", "nginx"])
def test_modern_wire_round_robins_over_three_replicas(tmp_path: Path, balancer: str) -> None:
    """60 modern-wire reads through the balancer land on every replica (each replica's /metrics counts its own),
    and a listen stream through it hears a change."""
    manifest = _fleet(tmp_path)

    async def main(url: str) -> None:
        async with Client(url, mode="auto", cache=None) as client:
            assert client.protocol_version == "2026-07-28"
            for _ in range(60):
                assert (await client.read_resource("docs://a.md")).contents[0].text == "# A\n"
            events = await listened(client, [(lambda: (tmp_path / "docs" / "a.md").write_text("# A2\n"), 1)],
                                    resource_subscriptions=["docs://a.md"])
            assert events == [ResourceUpdated(uri="docs://a.md")]

    with cluster(manifest, 3, tmp_path, balancer=balancer) as c:
        anyio.run(main, c.url)
        reads = _reads(c)
    print(f"{balancer}: modern-wire reads per replica {reads}")
    assert sum(reads) == 60 and all(n > 0 for n in reads), reads


def test_legacy_sessions_stick_to_their_replica_through_haproxy(tmp_path: Path) -> None:
    """100 calls over 5 legacy sessions through HAProxy: 0 fail, the sessions spread over the replicas, and a
    session's GET stream reaches its replica (a subscription's `updated` arrives)."""
    manifest = _fleet(tmp_path)
    inbox = Inbox()

    async def notified(url: str) -> None:
        async with Client(url, mode="legacy", cache=None, message_handler=inbox) as client:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                await client.subscribe_resource("docs://a.md")
            await anyio.sleep(0.3)
            (tmp_path / "docs" / "a.md").write_text("# A, edited\n")
            assert await inbox.next(timeout=10) == ("updated", "docs://a.md")

    with cluster(manifest, 3, tmp_path) as c:
        failed = anyio.run(legacy_failures, c.url)
        reads = _reads(c)
        anyio.run(notified, c.url)
    print(f"haproxy, legacy: {failed} of 100 calls failed; reads per replica {reads}")
    assert failed == 0
    assert sum(reads) == 100 and all(n > 0 for n in reads), reads


@pytest.mark.parametrize("balancer", ["haproxy without its stick lines", "nginx"])
def test_round_robin_without_learned_stickiness_loses_legacy_calls(tmp_path: Path, balancer: str) -> None:
    """The same 100 legacy calls through deploy/haproxy.cfg minus its three stick lines, or through
    deploy/nginx.conf, fail in part: the stick lines matter, and nginx is for the modern wire only."""
    manifest = _fleet(tmp_path)
    if balancer == "nginx":
        chosen: dict[str, Any] = {"balancer": "nginx"}
    else:
        plain = tmp_path / "plain.cfg"
        text = HAPROXY_CFG.read_text()
        stick = _stick_lines(text)
        plain.write_text("".join(line for line in text.splitlines(keepends=True) if line.strip() not in stick))
        chosen = {"config": plain}
    with cluster(manifest, 3, tmp_path, **chosen) as c:
        failed = anyio.run(legacy_failures, c.url)
    print(f"{balancer}, legacy: {failed} of 100 calls failed")
    assert failed > 0


def test_cluster_manifest_replicas_take_redis_url_from_the_environment(tmp_path: Path) -> None:
    """The harness as the cluster tests use it: a redis-server of the test's own, REDIS_URL passed to 3 replicas
    whose manifest says `server.cluster: {redis: "${REDIS_URL}"}`, HAProxy in front; both wires answer, and the
    harness can pause, kill and restart that Redis."""
    import uuid

    from tests.replicas import redis_server

    manifest = _fleet(tmp_path)
    prefix = f"test-{uuid.uuid4().hex}"
    manifest.write_text(MANIFEST.replace("server: {name: fleet, reloadSettle: 0s}", "server:\n  name: fleet\n"
                                         f"  cluster: {{redis: \"${{REDIS_URL}}\", prefix: {prefix}}}"))

    async def main(url: str) -> None:
        for mode in MODES:
            async with Client(url, mode=mode, cache=None) as client:
                assert (await client.read_resource("docs://a.md")).contents[0].text == "# A\n"

    with redis_server(tmp_path) as redis:
        with cluster(manifest, 3, tmp_path, env={"REDIS_URL": redis.url}) as c:
            anyio.run(main, c.url)
            assert all(r.health()["status"] == "ok" for r in c.replicas)
        redis.pause(200)
        redis.kill()
        assert not redis.ping()
        redis.start()
        assert redis.ping()


def test_a_replica_dying_behind_haproxy_costs_modern_clients_no_failed_call(tmp_path: Path) -> None:
    """SIGKILL one of 3 replicas mid-traffic: HAProxy retries refused connections on another replica (`retries`,
    `option redispatch`) until its health check takes the dead one out, so 90 modern-wire reads all succeed."""
    manifest = _fleet(tmp_path)

    async def main(c: Any) -> int:
        failed = 0
        async with Client(c.url, mode="auto", cache=None) as client:
            for i in range(90):
                if i == 30:
                    c.replicas[1].kill()
                try:
                    with anyio.fail_after(10):
                        await client.read_resource("docs://a.md")
                except Exception:
                    failed += 1
        return failed

    with cluster(manifest, 3, tmp_path) as c:
        failed = anyio.run(main, c)
        reads = [c.replicas[0].requests("resources/read"), c.replicas[2].requests("resources/read")]
    print(f"haproxy, one of 3 replicas killed: {failed} of 90 reads failed; survivors answered {reads}")
    assert failed == 0 and sum(reads) > 60


def test_the_images_default_manifest_is_valid_where_the_image_puts_it(tmp_path: Path) -> None:
    """The runtime stage's COPYs from the build context, laid out under a temporary root as the image lays them out:
    the manifest its CMD serves is there and valid, its folder beside it."""
    import shutil

    steps = [(i["instruction"], i["value"]) for i in _dockerfile().structure]
    final = steps[max(i for i, (k, _) in enumerate(steps) if k == "FROM"):]
    for key, value in final:
        if key == "COPY" and not value.startswith("--from="):
            source, target = shlex.split(value)
            destination = tmp_path / target.lstrip("/")
            destination.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if (ROOT / source).is_dir() else shutil.copy)(ROOT / source, destination)
    cmd = json.loads(dict(final)["CMD"])
    manifest = tmp_path / cmd[1].lstrip("/")
    checked = subprocess.run([sys.executable, "-m", "aggregator", "validate", str(manifest)], capture_output=True,
                             text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert checked.returncode == 0, checked.stderr


async def _taking_traffic(replica: Any, timeout: float = 30.0) -> None:
    """Return once `replica` has answered a read, i.e. the balancer routes to it (its own /metrics count it)."""
    with anyio.fail_after(timeout):
        while not await anyio.to_thread.run_sync(replica.requests, "resources/read"):
            await anyio.sleep(0.05)


def test_a_rolling_restart_behind_haproxy_costs_modern_clients_no_failed_call(tmp_path: Path) -> None:
    """Each of 3 replicas in turn gets SIGTERM and is replaced on its port (a rolling deploy) while 4 modern-wire
    clients read through HAProxy without pause: no read fails. Each restart begins once the replica before it takes
    traffic again (HAProxy's health check passed, or never failed), not after a fixed wait."""
    manifest = _fleet(tmp_path)
    outcome = {"ok": 0, "failed": 0}
    errors: list[str] = []

    async def main(c: Any) -> None:
        done = anyio.Event()

        async def reader() -> None:
            async with Client(c.url, mode="auto", cache=None) as client:
                while not done.is_set():
                    try:
                        # A read that never answers fails here; one that is only slow (four processes starting on
                        # a loaded machine) is not a failed call.
                        with anyio.fail_after(60):
                            await client.read_resource("docs://a.md")
                        outcome["ok"] += 1
                    except Exception as error:  # noqa: BLE001 - every failed read is the finding
                        outcome["failed"] += 1
                        errors.append(repr(error))
                    await anyio.sleep(0.05)  # steady traffic (80 reads a second), not a load test

        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(reader)
            for replica in c.replicas:
                await _taking_traffic(replica)
            for index in range(len(c.replicas)):
                await anyio.to_thread.run_sync(c.restart, index)
                await _taking_traffic(c.replicas[index])
            done.set()

    with cluster(manifest, 3, tmp_path) as c:
        try:
            anyio.run(main, c)
        finally:  # what the balancer saw goes with any failure (a client that crashed included)
            print("haproxy, requests not answered 200 cleanly:", *_balancer_trouble(tmp_path / "haproxy.log"),
                  sep="\n  ")
        fresh = [r.requests("resources/read") for r in c.replicas]
    print(f"haproxy, rolling restart: {outcome['failed']} of {sum(outcome.values())} reads failed; "
          f"reads on the new replicas {fresh}")
    assert outcome["failed"] == 0 and outcome["ok"] > 100, (outcome, errors[:5])


def _balancer_trouble(log: Path, most: int = 40) -> list[str]:
    """HAProxy's log lines (httplog) of requests not answered 200 or not ended cleanly (termination state not
    `----`), the last `most` of them."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return [line for line in lines if not re.search(r" 200 \d+ \S+ \S+ ---- ", line)][-most:]
