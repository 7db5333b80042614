"""Redis for cluster tests: the shared one on 127.0.0.1:6379 under a unique key prefix, or a private redis-server
on a free port for tests that pause, kill or restart it (never the shared one)."""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

SHARED = "redis://127.0.0.1:6379/0"


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def require_shared() -> str:
    """The shared Redis URL, or skip saying why."""
    if importlib.util.find_spec("redis") is None:
        pytest.skip("redis-py is not installed: pip install 'mcp-aggregator[cluster]'")
    if not _answers(6379):
        pytest.skip("no Redis answers on 127.0.0.1:6379 (the cluster tests need one)")
    return SHARED


def unique_prefix() -> str:
    return f"test-{uuid.uuid4().hex}"


def delete_prefix(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    """A redis-server of this test's own, to pause, kill and start again on the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not _answers(self.port):
            if time.monotonic() > deadline:
                raise RuntimeError("the private redis-server did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None

    def cli(self, *args: str) -> str:
        return subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True,
                              timeout=10, check=True).stdout


@contextmanager
def private_redis() -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server/redis-cli are not installed (apt-get install redis-server)")
    server = PrivateRedis()
    server.start()
    try:
        yield server
    finally:
        server.stop()
