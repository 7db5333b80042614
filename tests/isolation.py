"""What keeps parallel test workers (pytest-xdist, `make test`) apart: each worker takes its TCP ports from a block
of its own below the kernel's ephemeral range, and its databases by name. Temp dirs (tmp_path) and Redis key
prefixes (tests/cluster_redis.py: a uuid per test) are apart already.

A port the OS picks (bind to port 0) is in the ephemeral range, where the next outgoing connection of any process
(a client, HAProxy dialing a backend) may take it between the probe and the server's own bind: with several workers
starting servers at once that happened. Ports from a worker's own block, handed out in turn, are never the
ephemeral ones, never another worker's, and not reused by the worker until it has gone once round its block.
"""

from __future__ import annotations

import itertools
import os
import random
import socket

BLOCK = 1500
"""Ports per worker: 10 workers and a serial run fit between FIRST_PORT and the ephemeral range (32768)."""
FIRST_PORT = 15000


def worker() -> str:
    """This process's xdist worker id (gw0, gw1, ...), or "main" outside xdist."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def worker_index() -> int:
    """0 for a serial run, 1 + N for worker gwN."""
    name = worker()
    return int(name[2:]) + 1 if name.startswith("gw") and name[2:].isdigit() else 0


def _port_block() -> range:
    start = FIRST_PORT + (worker_index() % 11) * BLOCK
    return range(start, start + BLOCK)


_BLOCK = _port_block()
# A random start: two serial runs at once (two checkouts) rarely walk the same ports in step.
_START = random.randrange(BLOCK)
_NEXT = itertools.cycle([*_BLOCK[_START:], *_BLOCK[:_START]])


def free_port() -> int:
    """A TCP port of this worker's block that nothing listens on or holds on 127.0.0.1 right now."""
    for _ in range(BLOCK):
        port = next(_NEXT)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_BLOCK} for worker {worker()}")


def database_name(purpose: str) -> str:
    """The name of this worker's own database for `purpose` (PostgreSQL and MariaDB): aggregator_<purpose>_<worker>."""
    return f"aggregator_{purpose}_{worker()}"


def own_database(admin_url: str, purpose: str) -> str:
    """The URL of this worker's database for `purpose` on the server `admin_url` names (PostgreSQL or MariaDB),
    created when missing; it keeps what earlier tests left, so a test empties or replaces what it uses. Skips the
    test saying why when the server does not answer (CI turns the skip into a failure)."""
    import pytest
    import sqlalchemy

    name = database_name(purpose)
    admin = sqlalchemy.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            if admin.dialect.name == "postgresql":
                exists = conn.execute(sqlalchemy.text("SELECT 1 FROM pg_database WHERE datname = :n"),
                                      {"n": name}).first()
                if exists is None:
                    try:
                        conn.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
                    except sqlalchemy.exc.DBAPIError as exc:  # created meanwhile by another run
                        if "already exists" not in str(exc) and "duplicate key" not in str(exc):
                            raise
            else:
                conn.execute(sqlalchemy.text(f"CREATE DATABASE IF NOT EXISTS {name}"))
    except sqlalchemy.exc.OperationalError as exc:
        pytest.skip(f"database at {admin_url.split('@')[-1]} is not reachable: {type(exc.orig).__name__}")
    finally:
        admin.dispose()
    return admin_url.rsplit("/", 1)[0] + "/" + name
