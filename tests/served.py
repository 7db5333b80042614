"""A server as a test's subprocess (`aggregator serve --http`, an upstream, a balancer): its stderr in a file, waited
for within START_TIMEOUT, stopped on the way out. A server that exits, or does not answer in time, fails the test
with the tail of its stderr: a failed start says why instead of timing out later somewhere else.

    with serve_http(manifest, tmp_path, env={"TOKEN": "..."}) as server:
        async with Client(server.url, mode="auto") as client: ...
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from tests.isolation import free_port

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT = 60.0
"""Seconds a server may take to answer: generous for a loaded machine (a start takes 1-2 s on an idle one)."""
STOP_TIMEOUT = 15.0
POLL = 0.02

__all__ = ["START_TIMEOUT", "STOP_TIMEOUT", "Server", "accepts", "answers", "serve_http", "start", "start_listening",
           "stop", "wait_until", "wait_watched", "watched", "watchers_up", "workers_up", "catches", "group_running",
           "patched_command"]


def tail(log: Path | None, chars: int = 4000) -> str:
    """The last `chars` of `log` (a server's stderr), or "" when there is none."""
    return log.read_text(errors="replace")[-chars:] if log is not None and log.exists() else ""


def wait_until(ready: Callable[[], bool], what: str, *, process: subprocess.Popen[bytes] | None = None,
               log: Path | None = None, timeout: float = START_TIMEOUT) -> None:
    """Return once `ready()` holds (checked every 50 ms); fail with `log`'s tail if `process` exits first or
    `timeout` passes (the process is left to the caller's clean-up)."""
    began = time.monotonic()
    while True:
        if ready():
            return
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{what}: the process exited with {process.returncode}\n{tail(log)}")
        waited = time.monotonic() - began
        if waited > timeout:
            raise AssertionError(f"{what}: not ready within {timeout:g}s\n{tail(log)}")
        time.sleep(pause(waited))


def pause(waited: float) -> float:
    """Seconds to the next check after `waited`: 20 ms at first, up to 250 ms after 5 s, so a start that takes long
    on a loaded machine is not also charged a check every 50 ms."""
    return min(0.25, POLL + waited / 20)


def accepts(port: int, host: str = "127.0.0.1") -> Callable[[], bool]:
    """Whether something accepts TCP connections on `host`:`port`."""
    def check() -> bool:
        with socket.socket() as probe:
            return probe.connect_ex((host, port)) == 0
    return check


def answers(url: str, status: int | None = 200) -> Callable[[], bool]:
    """Whether GET `url` answers (with `status`, unless None: any answer). A port that refuses is found by a bare
    connect first: cheaper than an HTTP client's attempt, for the many checks a slow start takes."""
    parts = urlsplit(url)
    port = accepts(parts.port or 80, parts.hostname or "127.0.0.1")

    def check() -> bool:
        import httpx2 as httpx

        if not port():
            return False
        try:
            code = httpx.get(url, timeout=2).status_code
        except httpx.HTTPError:
            return False
        return status is None or code == status
    return check


def start(argv: Sequence[str], log: Path, *, env: Mapping[str, str] | None = None,
          stdout: int | None = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    """Start `argv` with its stderr appended to `log` (os.environ, PYTHONPATH at the checkout, plus `env`)."""
    with log.open("ab") as sink:
        return subprocess.Popen(list(argv), env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                                stdin=subprocess.DEVNULL, stdout=stdout, stderr=sink)


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int | None:
    """Send `sig` and wait; SIGKILL past `timeout`. The exit code (None if even SIGKILL did not end it)."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                return None
    return process.returncode


def start_listening(argv: Sequence[str], port: int, *, log: Path | None = None,
                    env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`argv` started (see `start`) once it accepts connections on `port`; stopped, failing with its stderr, if it
    does not within START_TIMEOUT. Without `log` its stderr goes to a temporary file."""
    if log is None:
        handle, name = tempfile.mkstemp(prefix="server-", suffix=".log")
        os.close(handle)
        log = Path(name)
    process = start(argv, log, env=env)
    try:
        wait_until(accepts(port), f"{Path(argv[1] if len(argv) > 1 else argv[0]).name} on port {port}",
                   process=process, log=log)
    except BaseException:
        stop(process, signal.SIGKILL)
        raise
    return process


def _inotify_inodes(pid: int) -> set[tuple[int, int]]:
    """The (device, inode) pairs process `pid` has inotify watches on (/proc/PID/fdinfo: Linux)."""
    found: set[tuple[int, int]] = set()
    try:
        names = os.listdir(f"/proc/{pid}/fdinfo")
    except OSError:
        return found
    for name in names:
        try:
            with open(f"/proc/{pid}/fdinfo/{name}", encoding="ascii", errors="replace") as info:
                text = info.read()
        except OSError:  # closed meanwhile
            continue
        for match in _INOTIFY.finditer(text):
            found.add((int(match["dev"], 16), int(match["ino"], 16)))
    return found


_INOTIFY = re.compile(r"^inotify wd:\S+ ino:(?P<ino>[0-9a-f]+) sdev:(?P<dev>[0-9a-f]+)", re.M)


def watched(*folders: Path) -> bool:
    """Whether this process or one of its descendants (a server it started, that server's workers) watches each of
    `folders` (inotify): from then on a change there reaches the server. A test's folders are its own, so whoever
    watches them is its server."""
    import psutil

    wanted = set()
    for folder in folders:
        st = folder.stat()
        # /proc shows the device as the kernel's dev_t (major << 20 | minor), st_dev is glibc's encoding.
        wanted.add(((os.major(st.st_dev) << 20) | os.minor(st.st_dev), st.st_ino))
    me = psutil.Process()
    seen: set[tuple[int, int]] = set()
    for process in [me, *me.children(recursive=True)]:
        seen |= _inotify_inodes(process.pid)
        if wanted <= seen:
            return True
    return False


def wait_watched(*folders: Path, timeout: float = START_TIMEOUT) -> None:
    """Return once `watched(*folders)`: a server's folder watchers are up (what tests waited a fixed 0.3 s for)."""
    wait_until(lambda: watched(*folders), f"a watcher on {', '.join(map(str, folders))}", timeout=timeout)


async def watchers_up(*folders: Path, timeout: float = START_TIMEOUT) -> None:
    """`wait_watched` for async tests: the event loop keeps running meanwhile."""
    import anyio

    began = time.monotonic()
    with anyio.fail_after(timeout):
        while not await anyio.to_thread.run_sync(watched, *folders):
            await anyio.sleep(pause(time.monotonic() - began))


def group_running(pgid: int) -> list[int]:
    """The processes of process group `pgid` still running (zombies aside; /proc: Linux)."""
    found = []
    for name in os.listdir("/proc"):
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):  # not a process, or gone meanwhile
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(name))
    return found


def catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (SigCgt in /proc/PID/status: Linux); False once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            caught = next((line.split()[1] for line in status if line.startswith("SigCgt:")), "0")
    except OSError:
        return False
    return bool(int(caught, 16) >> (signum - 1) & 1)


def workers_up(pid: int, count: int) -> Callable[[], bool]:
    """Whether `serve --workers` process `pid` has `count` workers that each accept connections: its event loop
    polls the shared listening socket (an epoll of the worker watches that descriptor: /proc/PID/fdinfo, Linux).
    A worker stopped before that exits 0 without having opened its catalog, so a test that needs every worker to
    have served (its spans, its figures) must first wait for this."""
    import psutil

    def serving(child: psutil.Process) -> bool:
        listening = {c.fd for c in child.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        for name in os.listdir(f"/proc/{child.pid}/fdinfo"):
            try:
                text = Path(f"/proc/{child.pid}/fdinfo/{name}").read_text()
            except OSError:
                continue
            if listening & {int(fd) for fd in re.findall(r"^tfd:\s+(\d+)", text, re.M)}:
                return True
        return False

    def check() -> bool:
        try:
            children = psutil.Process(pid).children()
            return len(children) >= count and all(serving(child) for child in children)
        except (psutil.Error, OSError):
            return False
    return check


def patched_command(module: str, **values: object) -> tuple[str, ...]:
    """`aggregator` run with `module`'s constants set to `values` first: for a test whose subject is not one of the
    server's limits, but which a loaded machine could run into (e.g. a search's time budget), so that the test
    proves its subject and nothing else. The values are Python literals."""
    sets = "; ".join(f"m.{name} = {value!r}" for name, value in values.items())
    return (sys.executable, "-c", f"import sys, {module} as m; {sets}; from aggregator.cli import main; "
                                  "raise SystemExit(main(sys.argv[1:]))")


@dataclass
class Server:
    """A running server process on a loopback port: `base` (http://127.0.0.1:PORT), `url` (its /mcp), `log` (its
    stderr)."""

    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base}/mcp"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def serve_http(manifest: Path, logs: Path, *args: str, env: Mapping[str, str] | None = None,
               port: int | None = None, bind: str = "", ready: str = "/healthz",
               exit_code: int | None = 0, log_name: str = "server.log", global_args: Sequence[str] = (),
               command: Sequence[str] = (sys.executable, "-m", "aggregator")) -> Iterator[Server]:
    """`aggregator [global_args] serve manifest --http [bind]PORT args` once GET `ready` answers 200 ("" waits only
    for the port to accept); SIGTERM on the way out, and then its exit code must be `exit_code` (None: any).
    `command` is what runs as `aggregator` (see `patched_command`)."""
    port = port or free_port()
    log = logs / log_name
    argv = [*command, *global_args, "serve", str(manifest), "--http", f"{bind}{port}", *args]
    process = start(argv, log, env=env)
    server = Server(port, process, log)
    try:
        check = answers(server.base + ready) if ready else accepts(port)
        wait_until(check, f"aggregator serve --http {port}", process=process, log=log)
        yield server
    finally:
        code = stop(process)
    if exit_code is not None:
        assert code == exit_code, f"exit {code}\n{tail(log)}"
