"""Replicas behind a real balancer, for tests and benchmarks: N `aggregator serve --http` processes on free loopback
ports, then HAProxy (deploy/haproxy.cfg, configured by environment variables) or nginx (deploy/nginx.conf) in
front of them. Everything started is stopped on the way out (SIGTERM, then SIGKILL), even when a test fails.

    with cluster(manifest, 3, env={"REDIS_URL": url}, logs=tmp_path) as c:
        async with Client(c.url, mode="auto") as client: ...
        c.replicas[0].kill()          # e.g. the lease holder

A missing balancer binary skips the test with the reason (CI turns skips into failures). Tests that pause, kill or
restart Redis use `redis_server()`: a redis-server of their own on a free port, never the shared one on 6379.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.isolation import free_port
from tests.served import START_TIMEOUT, Server, answers, start, stop, wait_until

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
HAPROXY_CFG = DEPLOY / "haproxy.cfg"
NGINX_CONF = DEPLOY / "nginx.conf"
MAX_STATIC_REPLICAS = 8
"""deploy/haproxy.cfg has AGGREGATOR_REPLICA_1 .. _8 for fixed addresses."""
STOP_TIMEOUT = 10.0

__all__ = ["Balancer", "Cluster", "RedisServer", "Replica", "cluster", "find_binary", "free_port", "haproxy",
           "haproxy_env", "metric_sum", "nginx", "nginx_config", "redis_server", "replicas", "start_replica",
           "wait_http"]


def find_binary(name: str, *candidates: str) -> str:
    """The path of `name` (PATH, then `candidates`), or skip the test saying it is missing."""
    for path in (shutil.which(name), *candidates):
        if path and os.access(path, os.X_OK):
            return path
    pytest.skip(f"{name} is not installed (apt-get install {name}; .ci/run installs it): "
                "these tests run the real program")


def wait_http(url: str, timeout: float = START_TIMEOUT, process: subprocess.Popen[bytes] | None = None,
              log: Path | None = None) -> None:
    """Wait until GET `url` answers 200; fail with the process's log if it exits or the time runs out."""
    wait_until(answers(url), url, process=process, log=log, timeout=timeout)


def _stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int | None:
    """Send `sig`, wait; SIGKILL past STOP_TIMEOUT. The exit code (None if even SIGKILL did not end it)."""
    return stop(process, sig, STOP_TIMEOUT)


@dataclass
class Replica:
    """One `aggregator serve --http 127.0.0.1:PORT` process; its stderr goes to `log`."""

    index: int
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def base(self) -> str:
        return f"http://{self.address}"

    @property
    def url(self) -> str:
        """This replica's own /mcp, bypassing the balancer."""
        return f"{self.base}/mcp"

    def health(self) -> dict[str, Any]:
        import httpx2 as httpx

        return dict(httpx.get(f"{self.base}/healthz", timeout=5).json())

    def metrics(self) -> str:
        import httpx2 as httpx

        return str(httpx.get(f"{self.base}/metrics", timeout=5).text)

    def requests(self, method: str) -> float:
        """aggregator_requests_total summed over outcomes for `method`, from this replica's /metrics."""
        return metric_sum(self.metrics(), "aggregator_requests_total", method=method)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> int | None:
        """SIGTERM (graceful), then SIGKILL if it lingers; the exit code."""
        return _stop(self.process)

    def kill(self) -> None:
        """SIGKILL: a crash, no goodbye to Redis or clients."""
        _stop(self.process, signal.SIGKILL)


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` in Prometheus text whose labels include `labels`."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def start_replica(manifest: Path, index: int, logs: Path, *, env: Mapping[str, str] | None = None,
                  args: Sequence[str] = (), port: int | None = None) -> Replica:
    """Start replica `index` of `manifest` (not waiting for it: see `wait_http`). `env` adds to os.environ."""
    port = port or free_port()
    log = logs / f"replica{index}.log"
    process = start([sys.executable, "-m", "aggregator", "serve", str(manifest), "--http", f"127.0.0.1:{port}",
                     *args], log, env=env)
    return Replica(index, port, process, log)


@contextmanager
def replicas(manifest: Path, count: int, logs: Path, *, env: Mapping[str, str] | None = None,
             args: Sequence[str] = ()) -> Iterator[list[Replica]]:
    """`count` replicas of `manifest`, each answering /healthz; all stopped on the way out."""
    started: list[Replica] = []
    try:
        for index in range(count):
            started.append(start_replica(manifest, index, logs, env=env, args=args))
        for replica in started:
            wait_http(f"{replica.base}/healthz", process=replica.process, log=replica.log)
        yield started
    finally:
        for replica in started:  # all at once, then wait for each: shutdowns overlap
            if replica.alive():
                replica.process.send_signal(signal.SIGTERM)
        for replica in started:
            replica.stop()


Balancer = Server
"""A running balancer: clients use `url`; `log` holds its output (HAProxy's request log)."""


def haproxy_env(backends: Sequence[str], port: int) -> dict[str, str]:
    """The environment deploy/haproxy.cfg reads for fixed backend addresses and a loopback frontend."""
    if not 1 <= len(backends) <= MAX_STATIC_REPLICAS:
        raise ValueError(f"deploy/haproxy.cfg takes 1 to {MAX_STATIC_REPLICAS} fixed backends, not {len(backends)}")
    env = {"AGGREGATOR_BIND": f"127.0.0.1:{port}"}
    env.update({f"AGGREGATOR_REPLICA_{i}": address for i, address in enumerate(backends, 1)})
    return env


@contextmanager
def haproxy(backends: Sequence[str], logs: Path, *, config: Path = HAPROXY_CFG) -> Iterator[Balancer]:
    """HAProxy in the foreground on a free loopback port with `config`, routing to `backends` (host:port)."""
    binary = find_binary("haproxy", "/usr/sbin/haproxy")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGGREGATOR_")}
    env.update(haproxy_env(backends, port))
    log = logs / "haproxy.log"
    with log.open("ab") as out:
        process = subprocess.Popen([binary, "-db", "-f", str(config)], env=env, stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=out)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", process=process, log=log)
        yield Balancer(port, process, log)
    finally:
        # SIGTERM is HAProxy's hard stop (SIGUSR1, the soft one, would wait for open streams): the replicas
        # behind it are stopped gracefully next.
        _stop(process)


def nginx_config(backends: Sequence[str], port: int, workdir: Path, *, config: Path = NGINX_CONF) -> Path:
    """deploy/nginx.conf with its one `server` line replaced by `backends` and its `listen` by the loopback `port`
    (nginx reads no environment); each replaced line must be there exactly once, so the example stays testable."""
    text = config.read_text()
    upstream = re.compile(r"^(\s*)server aggregator:8080( [^;]*)?;$", re.M)
    listen = re.compile(r"^(\s*)listen 8080;$", re.M)
    if len(upstream.findall(text)) != 1 or len(listen.findall(text)) != 1:
        raise AssertionError(f"{config}: expected one 'server aggregator:8080...;' and one 'listen 8080;' line")
    text = upstream.sub(lambda m: "\n".join(f"{m.group(1)}server {b}{m.group(2) or ''};" for b in backends), text)
    text = listen.sub(lambda m: f"{m.group(1)}listen 127.0.0.1:{port};", text)
    # Temporary files under the prefix: the build's defaults (/var/lib/nginx) may not be writable.
    temp = "".join(f"    {kind}_temp_path {workdir / kind};\n" for kind in ("client_body", "proxy", "fastcgi",
                                                                           "uwsgi", "scgi"))
    text = text.replace("http {\n", "http {\n" + temp, 1)
    target = workdir / "nginx.conf"
    target.write_text(text)
    return target


def _nginx_command(binary: str, conf: Path, workdir: Path, *extra: str) -> list[str]:
    return [binary, "-p", str(workdir), "-c", str(conf), "-e", "stderr",
            "-g", f"daemon off; pid {workdir / 'nginx.pid'};", *extra]


@contextmanager
def nginx(backends: Sequence[str], workdir: Path, *, config: Path = NGINX_CONF) -> Iterator[Balancer]:
    """nginx in the foreground on a free loopback port with `config` (see nginx_config), routing to `backends`."""
    binary = find_binary("nginx", "/usr/sbin/nginx")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = nginx_config(backends, port, workdir, config=config)
    log = workdir / "nginx.log"
    with log.open("ab") as out:
        process = subprocess.Popen(_nginx_command(binary, conf, workdir), stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=out)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", process=process, log=log)
        yield Balancer(port, process, log)
    finally:
        _stop(process, signal.SIGQUIT)  # graceful: workers finish their requests


@dataclass
class Cluster:
    """Replicas and the balancer in front of them (its backend addresses are the replicas' ports, so a replica
    restarted on its port is back in the balancer once its health check passes)."""

    replicas: list[Replica]
    balancer: Balancer
    manifest: Path
    logs: Path
    env: Mapping[str, str] | None = None
    args: Sequence[str] = ()

    @property
    def url(self) -> str:
        """/mcp through the balancer."""
        return self.balancer.url

    def restart(self, index: int, *, kill: bool = False) -> Replica:
        """Stop replica `index` (SIGTERM, or SIGKILL with `kill`) and start a new one on its port, as a rolling
        deploy does; return it once /healthz answers."""
        old = self.replicas[index]
        if kill:
            old.kill()
        else:
            old.stop()
        new = start_replica(self.manifest, index, self.logs, env=self.env, args=self.args, port=old.port)
        self.replicas[index] = new  # the list `replicas()` stops on the way out
        wait_http(f"{new.base}/healthz", process=new.process, log=new.log)
        return new


@contextmanager
def cluster(manifest: Path, count: int, logs: Path, *, env: Mapping[str, str] | None = None,
            args: Sequence[str] = (), balancer: str = "haproxy", config: Path | None = None) -> Iterator[Cluster]:
    """`count` replicas of `manifest` behind HAProxy (deploy/haproxy.cfg) or nginx (deploy/nginx.conf), or the
    given `config`; everything stopped on the way out."""
    if balancer not in ("haproxy", "nginx"):
        raise ValueError(f"balancer must be haproxy or nginx, not {balancer!r}")
    # Skip before starting replicas, not after.
    find_binary(balancer, f"/usr/sbin/{balancer}")
    with ExitStack() as stack:
        started = stack.enter_context(replicas(manifest, count, logs, env=env, args=args))
        addresses = [r.address for r in started]
        if balancer == "haproxy":
            front = stack.enter_context(haproxy(addresses, logs, config=config or HAPROXY_CFG))
        else:
            front = stack.enter_context(nginx(addresses, logs / "nginx", config=config or NGINX_CONF))
        yield Cluster(started, front, manifest, logs, env, args)


@dataclass
class RedisServer:
    """A redis-server of the test's own on a free loopback port; `url` for REDIS_URL. Nothing is saved unless a test
    asks (`cli("SAVE")`): a start then loads what was saved, as a Redis restarting with its data does."""

    port: int
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it (again, on the same port: a restart) and wait until it answers PING."""
        binary = find_binary("redis-server", "/usr/bin/redis-server")
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(self.log.parent), "--dbfilename", f"redis-{self.port}.rdb"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        wait_until(self.ping, f"redis-server on port {self.port}", process=self.process, log=self.log)

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def pause(self, milliseconds: int) -> None:
        """CLIENT PAUSE: every client's commands wait `milliseconds` (Redis slow, not down)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as conn:
            conn.sendall(f"CLIENT PAUSE {int(milliseconds)} ALL\r\n".encode())
            reply = conn.recv(64)
        if not reply.startswith(b"+OK"):
            raise AssertionError(f"CLIENT PAUSE answered {reply!r}")

    def cli(self, *args: str) -> str:
        """redis-cli against this server: its output (e.g. `CLIENT KILL TYPE pubsub`, `PUBSUB NUMSUB ch`)."""
        binary = find_binary("redis-cli", "/usr/bin/redis-cli")
        return subprocess.run([binary, "-p", str(self.port), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout

    def freeze(self) -> None:
        """SIGSTOP: Redis hangs (connections stay open, nothing answers, keys do not expire) until `thaw()`."""
        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after `freeze()`."""
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: Redis gone at once, connections reset."""
        if self.process is not None:
            _stop(self.process, signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM (a clean shutdown); `start()` brings it back on the same port."""
        if self.process is not None:
            _stop(self.process)


@contextmanager
def redis_server(logs: Path) -> Iterator[RedisServer]:
    """A started RedisServer, stopped on the way out (whatever the test did to it)."""
    find_binary("redis-server", "/usr/bin/redis-server")
    server = RedisServer(free_port(), logs / "redis.log")
    try:
        server.start()
        yield server
    finally:
        server.thaw()  # a frozen process would take SIGTERM only once continued
        server.stop()


async def legacy_failures(url: str, sessions: int = 5, calls: int = 20, uri: str = "docs://a.md") -> int:
    """`sessions` legacy sessions one after another, `calls` reads of `uri` each: how many of the calls failed (a
    session that breaks, e.g. its initialized notification sent to a replica that does not know it, fails the calls
    it had left)."""
    import anyio
    from mcp import Client

    failed = 0
    for _ in range(sessions):
        left = calls
        try:
            with anyio.fail_after(60):
                async with Client(url, mode="legacy", cache=None) as client:
                    while left:
                        left -= 1
                        try:
                            with anyio.fail_after(10):
                                await client.read_resource(uri)
                        except Exception:
                            failed += 1
        except Exception:
            failed += left
    return failed
