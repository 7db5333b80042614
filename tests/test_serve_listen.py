"""The address `serve --http` listens on. One it cannot listen on (a port in use, a host that does not resolve, an
address not on this machine, a privileged port): one clean line naming the address, exit 2 (exits.EXIT_USAGE: bad
usage), no traceback, nothing left running; alike in one process (uvicorn binds) and with `--workers` (we bind,
then fork). `localhost`: every address it resolves to. Real processes, on a port a test socket holds."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.isolation import free_port
from tests.served import ROOT, START_TIMEOUT, group_running, start, stop, tail, wait_until
from tests.test_live import BASE

MODES = {"one process": (), "one process, asyncio loop": ("--loop", "asyncio"),
         "workers": ("--stateless", "--workers", "2")}

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO) ")
"""The start-up's ordinary log lines (the session manager's start and end), which are not problems."""


def _manifest(folder: Path) -> Path:
    (folder / "docs").mkdir()
    (folder / "docs" / "a.md").write_text("# A\n")
    manifest = folder / "manifest.yaml"
    manifest.write_text(BASE)
    return manifest


def _refused(folder: Path, http: str, mode: tuple[str, ...], runner: tuple[str, ...] = ()) -> tuple[int, list[str]]:
    """`serve MANIFEST --http HTTP` (run by `runner` when given) to its end, in a process group of its own, nothing
    of which may outlive it: its exit code and the lines of its stderr that are not ordinary log lines; no
    traceback."""
    argv = [*runner, sys.executable, "-m", "aggregator", "serve", str(_manifest(folder)), "--http", http, *mode]
    process = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, process_group=0)
    try:
        _, stderr = process.communicate(timeout=START_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise AssertionError(f"still running {START_TIMEOUT:g}s after the start: {process.communicate()[1]}") from None
    left = group_running(process.pid)
    if left:
        os.killpg(process.pid, signal.SIGKILL)
    assert not left, (left, stderr)
    assert "Traceback" not in stderr, stderr
    return process.returncode, [line for line in stderr.splitlines() if not LOG_LINE.match(line)]


@contextmanager
def _held() -> Iterator[int]:
    """A port a test socket holds (bound and listening) on 127.0.0.1."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", free_port()))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_a_port_in_use_is_one_clean_line(tmp_path: Path, mode: tuple[str, ...]) -> None:
    with _held() as port:
        code, problems = _refused(tmp_path, str(port), mode)
    assert (code, problems) == (2, [f"aggregator: cannot listen on 127.0.0.1:{port}: address already in use"])


@pytest.mark.parametrize("http", ["192.0.2.1:8080", "[2001:db8::1]:8080"])  # documentation ranges: never local
@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_an_address_not_on_this_machine_is_one_clean_line(tmp_path: Path, mode: tuple[str, ...], http: str) -> None:
    if http.startswith("[") and not _ipv6():
        pytest.skip("no IPv6 here")
    code, problems = _refused(tmp_path, http, mode)
    assert (code, problems) == (2, [f"aggregator: cannot listen on {http}: cannot assign requested address"])


def _ipv6() -> bool:
    """Whether this machine has IPv6 (a socket can listen on ::1)."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_a_host_that_does_not_resolve_is_one_clean_line(tmp_path: Path, mode: tuple[str, ...]) -> None:
    code, problems = _refused(tmp_path, "no-such-host.invalid:8080", mode)  # .invalid never resolves (RFC 6761)
    assert code == 2 and len(problems) == 1, (code, problems)
    # The resolver's own words: "name or service not known", or "temporary failure..." without DNS.
    assert problems[0].startswith("aggregator: cannot listen on no-such-host.invalid:8080: "), problems


def _unprivileged() -> tuple[str, ...]:
    """What runs a command without the right to listen on a privileged port: nothing as non-root, setpriv dropping
    CAP_NET_BIND_SERVICE as root (skipped without setpriv, or where every port is unprivileged)."""
    try:
        first = int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())
    except (OSError, ValueError):
        first = 1024
    if first <= 1:
        pytest.skip(f"every port from {first} up is unprivileged here")
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root, and no setpriv to drop CAP_NET_BIND_SERVICE")
    return setpriv, "--bounding-set=-net_bind_service", "--inh-caps=-net_bind_service"


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_a_privileged_port_is_one_clean_line(tmp_path: Path, mode: tuple[str, ...]) -> None:
    code, problems = _refused(tmp_path, "127.0.0.1:1", mode, _unprivileged())
    assert (code, problems) == (2, ["aggregator: cannot listen on 127.0.0.1:1: permission denied"])


def test_localhost_listens_on_each_address_it_names(tmp_path: Path) -> None:
    """uvicorn binds `localhost` itself: on each address the resolver gives (127.0.0.1 and ::1 where both are)."""
    port = free_port()
    log = tmp_path / "stderr.log"
    process = start([sys.executable, "-m", "aggregator", "serve", str(_manifest(tmp_path)), "--http",
                     f"localhost:{port}"], log)
    try:
        hosts = {info[4][0] for info in socket.getaddrinfo("localhost", port, type=socket.SOCK_STREAM)}
        for host in hosts:
            wait_until(lambda: _accepts(host, port), f"serve --http localhost:{port} on {host}", process=process,
                       log=log)
    finally:
        assert stop(process) == 0, tail(log)
    assert not group_running(process.pid)


def test_the_serving_line_names_an_ipv6_address_in_brackets(tmp_path: Path) -> None:
    """The URL a person copies from the "serving" line: http://[::1]:PORT/mcp, not http://::1:PORT/mcp."""
    if not _ipv6():
        pytest.skip("no IPv6 here")
    port = free_port()
    log = tmp_path / "stderr.log"
    process = start([sys.executable, "-m", "aggregator", "serve", str(_manifest(tmp_path)), "--http",
                     f"[::1]:{port}"], log)
    try:
        wait_until(lambda: "serving" in log.read_text(), f"serve --http [::1]:{port}", process=process, log=log)
    finally:
        assert stop(process) == 0, tail(log)
    assert f"HTTP on http://[::1]:{port}/mcp;" in log.read_text(), tail(log)


def _accepts(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on `host` (IPv4 or IPv6) `port`."""
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError:
        return False
    return True
