"""The shared Redis on 127.0.0.1:6379 for cluster tests: a unique key prefix per test, its keys deleted after, and
a skip saying why when it is absent. Tests that pause, kill or restart Redis use `tests.replicas.redis_server()`
(a redis-server of their own on a free port), never this one."""

from __future__ import annotations

import importlib.util
import socket
import uuid

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
    """The shared Redis URL, or skip saying why (CI turns the skip into a failure)."""
    if importlib.util.find_spec("redis") is None:
        pytest.skip("redis-py is not installed: pip install 'mcp-aggregator[cluster]'")
    if not _answers(6379):
        pytest.skip("no Redis answers on 127.0.0.1:6379 (apt-get install redis-server): the cluster tests need one")
    return SHARED


def unique_prefix() -> str:
    """A key prefix no other test (or helper sharing this Redis) uses."""
    return f"test-{uuid.uuid4().hex}"


def delete_prefix(url: str, prefix: str) -> None:
    """Delete every key under `prefix`."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
