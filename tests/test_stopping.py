"""SIGTERM/SIGINT stop `aggregator serve` cleanly (exit 0, no traceback, nothing half-served) at any point of its
start-up, over stdio and HTTP: a real server process each time. The points are reached without timing: a signal
pending when the process starts (sent while the spawner blocks it, as the child inherits that mask), once the
process has its handler (SigCgt), and once it serves (its first answer, or its port accepting). A second stop while
the first waits for a request in flight (held by an upstream that never answers) ends the process at once, still
cleanly: exit 128 + the signal's number, every line on stdout whole, the log flushed."""

from __future__ import annotations

import json
import os
import pty
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.isolation import free_port
from tests.served import ROOT, STOP_TIMEOUT, accepts, catches, group_running, stop, tail, wait_until

STOPS = {signal.SIGTERM, signal.SIGINT}

INITIALIZE = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}) + "\n"


def _manifest(folder: Path, slow: int | None = None) -> Path:
    """A folder of one file; with `slow` (a port), also a template reading from an HTTP server there."""
    (folder / "docs").mkdir()
    (folder / "docs" / "a.md").write_text("# A\n")
    manifest = folder / "manifest.yaml"
    text = ('version: 1\nserver: {name: stops}\nsources:\n  docs: {url: ./docs}\n'
            'collections:\n  - {source: docs, glob: "*.md", uri: "docs://{path}"}\n')
    if slow is not None:
        text = text.replace("sources:\n", f'sources:\n  slow: {{url: "http://127.0.0.1:{slow}/", '
                                          "allowPrivateNetwork: true, timeout: 60s}\n")
        text += 'templates:\n  - {uriTemplate: "slow://{name}", name: slow, source: slow, path: "{name}"}\n'
    manifest.write_text(text)
    return manifest


@contextmanager
def _serve(folder: Path, *extra: str, pending: signal.Signals | None = None, stdin: int = subprocess.PIPE,
           slow: int | None = None, group: bool = False) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m aggregator serve` on a folder of one file, stdin (unless given: an fd) and stdout pipes, stderr in
    folder/stderr.log; with `pending`, that signal is sent before the process can handle anything (blocked in the
    spawner, so it is pending in the child from its first instruction); with `group`, in a process group of its
    own (its id the process's: what a terminal's Ctrl-C or a supervisor's stop of a whole group reaches). Killed on
    the way out if it is still running."""
    log = folder / "stderr.log"
    argv = [sys.executable, "-m", "aggregator", "serve", str(_manifest(folder, slow)), *extra]
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS) if pending is not None else None
    try:
        with log.open("ab") as sink:
            process = subprocess.Popen(argv, cwd=folder, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                       stdin=stdin, stdout=subprocess.PIPE, stderr=sink, process_group=0 if group
                                       else None)
        if pending is not None:
            process.send_signal(pending)
    finally:
        if blocked is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    try:
        yield process
    finally:
        stop(process, signal.SIGKILL)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()


def _stopped_cleanly(process: subprocess.Popen[bytes], log: Path) -> bytes:
    """Wait for the exit (stdin left open: a stop, not end of input, must end it); assert exit 0 and no traceback.
    What it wrote on stdout."""
    try:
        code = process.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running {STOP_TIMEOUT:g}s after the stop\n{tail(log)}") from None
    assert code == 0, (code, tail(log))
    assert "Traceback" not in log.read_text(), tail(log)
    assert process.stdout is not None
    return process.stdout.read()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("extra", [(), ("--http", "PORT"), ("--http", "PORT", "--stateless", "--workers", "2")],
                         ids=["stdio", "http", "workers"])
def test_a_stop_pending_from_the_start_is_a_clean_one(tmp_path: Path, extra: tuple[str, ...],
                                                      sig: signal.Signals) -> None:
    """A stop that came before the process could run anything: heard once it can, and nothing is served. Nor is
    the start-up finished first (the server's imports, the manifest check: about 0.6 s of CPU, which a loaded
    machine stretched past the 15 s a supervisor or a test waits for the exit): the process costs about what
    importing the CLI costs. CPU time, which load does not stretch, nor a signal sent late (it is pending)."""
    extra = tuple(str(free_port()) if part == "PORT" else part for part in extra)
    cli = _cpu([sys.executable, "-c", "import aggregator.cli"])
    before = _children_cpu()
    with _serve(tmp_path, *extra, pending=sig) as process:
        assert _stopped_cleanly(process, tmp_path / "stderr.log") == b""
        stopped = _children_cpu() - before
    assert stopped < 2 * cli, (stopped, cli, tail(tmp_path / "stderr.log"))


def _children_cpu() -> float:
    """CPU seconds (user + system) of the children this process has waited for, so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cpu(argv: list[str]) -> float:
    """CPU seconds `argv` takes to run (it must succeed)."""
    before = _children_cpu()
    subprocess.run(argv, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True, timeout=STOP_TIMEOUT)
    return _children_cpu() - before


@pytest.mark.parametrize("extra", [(), ("--http", "PORT")], ids=["stdio", "http"])
def test_a_stop_once_the_handler_is_in_place_is_a_clean_one(tmp_path: Path, extra: tuple[str, ...]) -> None:
    """SIGTERM as soon as the process handles it (its imports and the manifest still ahead): exit 0."""
    extra = tuple(str(free_port()) if part == "PORT" else part for part in extra)
    log = tmp_path / "stderr.log"
    with _serve(tmp_path, *extra) as process:
        wait_until(lambda: catches(process.pid, signal.SIGTERM), "the SIGTERM handler", process=process, log=log)
        process.send_signal(signal.SIGTERM)
        assert _stopped_cleanly(process, log) == b""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_while_serving_stdio_is_a_clean_one(tmp_path: Path, sig: signal.Signals) -> None:
    """Over stdio, once the first request is answered (stdin still open): the stop ends the server, exit 0."""
    with _serve(tmp_path) as process:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(INITIALIZE.encode())
        process.stdin.flush()
        answer = json.loads(process.stdout.readline())
        assert answer["id"] == 1 and answer["result"]["serverInfo"]["name"] == "stops"
        process.send_signal(sig)
        assert _stopped_cleanly(process, tmp_path / "stderr.log") == b""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("typed", [True, False], ids=["answered", "nothing-typed"])
def test_a_stop_while_stdin_is_a_terminal_is_a_clean_one(tmp_path: Path, sig: signal.Signals, typed: bool) -> None:
    """`serve` run by hand (stdin a terminal, left open: nobody presses Enter or Ctrl-D after the stop), stopped once
    it has answered a request typed there, or once it is ready with nothing typed: exit 0, not a read of the terminal
    that keeps the process alive."""
    log = tmp_path / "stderr.log"
    terminal, line = pty.openpty()  # canonical mode, as a person's terminal: a line is read once Enter ends it
    try:
        with _serve(tmp_path, stdin=line) as process:
            assert process.stdout is not None
            os.close(line)
            if typed:
                os.write(terminal, INITIALIZE.encode())
                answer = json.loads(process.stdout.readline())
                assert answer["id"] == 1 and answer["result"]["serverInfo"]["name"] == "stops"
            else:
                wait_until(lambda: "serving 'stops'" in tail(log), "serving", process=process, log=log)
            process.send_signal(sig)
            assert _stopped_cleanly(process, log) == b""
    finally:
        os.close(terminal)


def test_a_stop_once_the_port_accepts_is_a_clean_one(tmp_path: Path) -> None:
    """Over HTTP, once the port accepts: exit 0 (uvicorn's graceful shutdown)."""
    port = free_port()
    log = tmp_path / "stderr.log"
    with _serve(tmp_path, "--http", str(port)) as process:
        wait_until(accepts(port), f"serve --http {port}", process=process, log=log)
        process.send_signal(signal.SIGTERM)
        _stopped_cleanly(process, log)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, 130)],
                         ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("command", [("schema",), ("validate", "--offline", "MANIFEST")], ids=["schema", "validate"])
def test_other_commands_keep_the_default_action(tmp_path: Path, command: tuple[str, ...], sig: signal.Signals,
                                                code: int) -> None:
    """Stops are heard from the command's first step, before it is known to be `serve`; any other command has
    nothing to finish, so a stop heard meanwhile ends it as it ends any program: killed by SIGTERM, exit 130 for
    Ctrl-C (no traceback); nothing printed."""
    argv = [sys.executable, "-m", "aggregator",
            *(str(_manifest(tmp_path)) if part == "MANIFEST" else part for part in command)]
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        process = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        process.send_signal(sig)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    out, err = process.communicate(timeout=STOP_TIMEOUT)
    assert process.returncode == code, (process.returncode, err[-2000:])
    assert out == b"" and b"Traceback" not in err, (out[:200], err[-2000:])


@contextmanager
def _upstream_that_never_answers() -> Iterator[tuple[int, threading.Event]]:
    """A port whose HTTP server reads requests and answers none (until the block ends), and an event set once a
    request came: a read from it stays in flight as long as the test wants."""
    listener = socket.create_server(("127.0.0.1", 0))
    asked = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)
            if conn.recv(65536):
                asked.set()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], asked
    finally:
        listener.close()
        for conn in held:
            conn.close()


READ_SLOW = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {"uri": "slow://x"}}) + "\n"


def _read_in_flight(process: subprocess.Popen[bytes], port: int | None) -> list[tuple[int, str]]:
    """Ask for slow://x: over stdio (after the handshake) when `port` is None, else over HTTP from a thread (the
    status and body it gets, once it gets them, in the list returned)."""
    statuses: list[tuple[int, str]] = []
    if port is None:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(INITIALIZE.encode())
        process.stdin.flush()
        assert json.loads(process.stdout.readline())["id"] == 1
        process.stdin.write((json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n").encode())
        process.stdin.write(READ_SLOW.encode())
        process.stdin.flush()
        return statuses
    import httpx2 as httpx

    def post() -> None:
        try:
            answer = httpx.post(f"http://127.0.0.1:{port}/mcp", content=READ_SLOW.encode(), timeout=60,
                                headers={"Content-Type": "application/json",
                                         "Accept": "application/json, text/event-stream",
                                         "MCP-Protocol-Version": "2025-11-25"})
            statuses.append((answer.status_code, answer.text))
        except httpx.HTTPError as exc:
            statuses.append((0, repr(exc)))  # no whole answer

    threading.Thread(target=post, daemon=True).start()
    return statuses


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("extra", [(), ("--http", "PORT", "--stateless"),
                                   ("--http", "PORT", "--stateless", "--workers", "2")], ids=["stdio", "http", "workers"])
def test_a_second_stop_during_the_first_ends_the_process_at_once_and_cleanly(tmp_path: Path, extra: tuple[str, ...],
                                                                              sig: signal.Signals) -> None:
    """The first stop waits for a read held by an upstream (stdio: its drain, up to 30 s; HTTP: uvicorn's graceful
    shutdown, 5 s), stdin left open; the second, sent while it waits, ends the process within a few seconds, not
    killed by the signal: exit 128 + its number, the log saying so, no traceback, stdout whole JSON lines, and an
    HTTP read in flight answered 503. With workers, the parent forwards both stops and exits as its worker did."""
    log = tmp_path / "stderr.log"
    port = free_port() if extra else None
    extra = tuple(str(port) if part == "PORT" else part for part in extra)
    with _upstream_that_never_answers() as (slow, asked), _serve(tmp_path, *extra, slow=slow) as process:
        if port is not None:
            wait_until(accepts(port), f"serve --http {port}", process=process, log=log)
        else:
            wait_until(lambda: "serving 'stops'" in tail(log), "serving", process=process, log=log)
        statuses = _read_in_flight(process, port)
        assert asked.wait(STOP_TIMEOUT), tail(log)
        process.send_signal(sig)
        wait_until(lambda: "finishing requests in flight" in tail(log), "the first stop", process=process, log=log)
        assert process.poll() is None  # still waiting for the read
        process.send_signal(sig)
        try:
            code = process.wait(10)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running 10 s after the second stop\n{tail(log)}") from None
        assert code == 128 + sig, (code, tail(log))
        text = log.read_text()
        assert "Traceback" not in text and f"{sig.name} again: stopping now" in text, tail(log)
        assert process.stdout is not None
        for line in process.stdout.read().splitlines():  # nothing half written (stdio: the read's answer never came)
            json.loads(line)
        if port is not None:  # 503, or (a long read's answer turns into an event stream) a stream ended unanswered
            wait_until(lambda: bool(statuses), "the read's answer", timeout=10)
            [(status, body)] = statuses
            assert status == 503 or (status == 200 and '"id":2' not in body.replace(" ", "")), statuses


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_one_stop_of_the_whole_group_is_one_stop_for_the_workers(tmp_path: Path, sig: signal.Signals) -> None:
    """A terminal's Ctrl-C (or a supervisor stopping every process of the service: systemd's control-group mode)
    reaches the workers itself and through the parent, which forwards what it hears. That is one stop, not two: the
    workers finish the read in flight (uvicorn's graceful shutdown, which answers it 503 after 5 s) and exit 0; a
    stop of the group again after that first one was heard is a second one (exit 128 + its number)."""
    log = tmp_path / "stderr.log"
    port = free_port()
    with _upstream_that_never_answers() as (slow, asked), _serve(
            tmp_path, "--http", str(port), "--stateless", "--workers", "2", slow=slow, group=True) as process:
        # Each worker's "serving" line says it hears a stop as one of a server in service, and accepts: a stop
        # before that is one it takes as it starts, which says so otherwise.
        wait_until(lambda: log.read_text().count("serving 'stops'") >= 2, "both workers serving", process=process,
                   log=log)
        statuses = _read_in_flight(process, port)
        assert asked.wait(STOP_TIMEOUT), tail(log)
        os.killpg(process.pid, sig)
        wait_until(lambda: log.read_text().count("finishing requests in flight") >= 2, "both workers' first stop",
                   process=process, log=log)
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(2)  # still finishing the read in flight
        assert f"{sig.name} again" not in tail(log), tail(log)
        os.killpg(process.pid, sig)
        try:
            code = process.wait(10)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running 10 s after the second stop\n{tail(log)}") from None
        assert code == 128 + sig, (code, tail(log))
        assert f"{sig.name} again: stopping now" in log.read_text(), tail(log)
        wait_until(lambda: bool(statuses), "the read's answer", timeout=10)


def test_a_stop_while_workers_report_an_invalid_manifest_still_exits_1(tmp_path: Path) -> None:
    """`--workers` checks the manifest before forking, with stops ending the process at once (exit 0: nothing was
    served); once the check has failed, a stop while the problems are reported no longer turns the failure into a
    clean exit. The stop is sent as the report begins (not timed)."""
    manifest = tmp_path / "bad.yaml"
    manifest.write_text("version: 1\nserver: {name: bad}\nsources:\n  docs: {url: 12}\n")
    script = ("import os, signal, sys\n"
              "import aggregator.cli as cli, aggregator.serve_command as serving\n"
              "real = serving.report\n"
              "def report(exc, *rest):\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    real(exc, *rest)\n"
              "serving.report = report\n"
              f"sys.exit(cli.main(['serve', {str(manifest)!r}, '--http', '{free_port()}', '--stateless', "
              "'--workers', '2']))\n")
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, timeout=STOP_TIMEOUT)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert b"docs" in done.stderr and b"Traceback" not in done.stderr, done.stderr[-2000:]


def test_a_stop_while_opening_the_manifest_ends_the_opening(tmp_path: Path) -> None:
    """A single-process `serve` opening a manifest whose upstream never answers its handshake (60 s allowed): a stop
    then gives the opening up at once and closes what it opened (the upstream's process ends), exit 0, nothing
    served; it does not wait for the opening to end first."""
    started = tmp_path / "upstream.pid"
    upstream = tmp_path / "silent.py"
    upstream.write_text(f"import os, sys, time\nopen({str(started)!r}, 'w').write(str(os.getpid()))\n"
                        "sys.stdin.buffer.read()\ntime.sleep(120)\n")
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(
        "version: 1\nserver: {name: opening}\nsources:\n"
        f"  up: {{url: 'mcp+stdio:', command: [{sys.executable!r}, {str(upstream)!r}], timeout: 60s}}\n"
        "collections:\n  - {source: up, glob: '**', uri: 'up://{path}'}\n")
    log = tmp_path / "stderr.log"
    with log.open("ab") as sink:
        process = subprocess.Popen([sys.executable, "-m", "aggregator", "serve", str(manifest)], cwd=tmp_path,
                                   env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=sink)
    try:
        wait_until(started.exists, "the upstream's start", process=process, log=log)
        wait_until(lambda: started.read_text().isdigit(), "the upstream's pid", process=process, log=log)
        process.send_signal(signal.SIGTERM)
        assert _stopped_cleanly(process, log) == b""
        assert "SIGTERM: giving up the manifest's opening, then stopping" in log.read_text(), tail(log)
        pid = int(started.read_text())
        wait_until(lambda: not _alive(pid), "the upstream's end", timeout=10)
    finally:
        stop(process, signal.SIGKILL)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@contextmanager
def _scripted(folder: Path, patch: str, *extra: str) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """`serve` on a folder of one file (`extra` its options, PORT a free port) in a process that runs `patch` first
    (Python lines, with os and signal imported), stdin and stdout pipes, stderr in folder/stderr.log; killed on the
    way out."""
    extra = tuple(str(free_port()) if part == "PORT" else part for part in extra)
    script = f"import os, signal, sys\n{patch}from aggregator.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    log = folder / "stderr.log"
    with log.open("ab") as sink:
        process = subprocess.Popen([sys.executable, "-c", script, "serve", str(_manifest(folder)), *extra], cwd=folder,
                                   env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=sink)
    try:
        yield process, log
    finally:
        stop(process, signal.SIGKILL)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize("extra", [(), ("--http", "PORT")], ids=["stdio", "http"])
def test_a_stop_as_the_opening_ends_is_not_lost(tmp_path: Path, extra: tuple[str, ...]) -> None:
    """SIGTERM as the manifest's opening ends (the process sends it itself as `ResourceService.open` returns: the
    same moment on any machine): a stop during start-up, exit 0, nothing served. It was lost: the opening's stop
    listener, cancelled once the opening was done, had not taken it yet, and the server served on until a second
    stop (in CI a `--workers` round, its stop forwarded to a worker at that moment, ran past 15 s until the test's
    own second SIGTERM)."""
    patch = ("import aggregator.service as service\n"
             "real = service.ResourceService.open.__func__\n"
             "async def opened(cls, *args, **kwargs):\n"
             "    service = await real(cls, *args, **kwargs)\n"
             "    os.kill(os.getpid(), signal.SIGTERM)\n"
             "    return service\n"
             "service.ResourceService.open = classmethod(opened)\n")
    with _scripted(tmp_path, patch, *extra) as (process, log):
        assert _stopped_cleanly(process, log) == b""
        assert "SIGTERM during start-up: stopping before serving" in log.read_text(), tail(log)


@pytest.mark.parametrize("extra", [(), ("--http", "PORT")], ids=["stdio", "http"])
def test_a_stop_once_serving_is_logged_is_one_in_service(tmp_path: Path, extra: tuple[str, ...]) -> None:
    """SIGTERM as the "serving ..." line is logged (the process sends it itself from a log handler: the same moment
    on any machine) is a stop of a server in service: 'finishing requests in flight', exit 0. The line used to come
    a step before the server listened for stops as such, and a stop then was taken as one during start-up: an
    operator, or a test, that waits for the line and then stops the server saw the start-up's path instead."""
    patch = ("import logging\n"
             "class StopOnServing(logging.Handler):\n"
             "    def emit(self, record):\n"
             "        if record.getMessage().startswith('serving '):\n"
             "            os.kill(os.getpid(), signal.SIGTERM)\n"
             "logging.getLogger('aggregator').addHandler(StopOnServing())\n")
    with _scripted(tmp_path, patch, *extra) as (process, log):
        _stopped_cleanly(process, log)
        text = log.read_text()
        assert "serving 'stops'" in text and "SIGTERM: finishing requests in flight, then stopping" in text, tail(log)
        assert "during start-up" not in text, tail(log)


@pytest.mark.parametrize("extra", [(), ("--stateless", "--workers", "2")], ids=["http", "workers"])
def test_serving_is_logged_once_the_port_accepts(tmp_path: Path, extra: tuple[str, ...]) -> None:
    """"serving ..." over HTTP means "connect now": the process tries its own port as it logs the line (from a log
    handler: the same moment on any machine) and is accepted at once. Without workers the line used to come before
    uvicorn had bound the port (refused), so a script or test that waited for it still had to poll the port."""
    port = free_port()
    patch = ("import logging, socket\n"
             "class ConnectOnServing(logging.Handler):\n"
             "    def emit(self, record):\n"
             "        if record.getMessage().startswith('serving '):\n"
             "            with socket.socket() as probe:\n"
             f"                code = probe.connect_ex(('127.0.0.1', {port}))\n"
             "            os.write(2, f'probe: {os.strerror(code) if code else \"accepted\"}\\n'.encode())\n"
             "logging.getLogger('aggregator').addHandler(ConnectOnServing())\n")
    with _scripted(tmp_path, patch, "--http", str(port), *extra) as (process, log):
        wait_until(lambda: "probe: " in log.read_text(), "serving", process=process, log=log)
        probes = [line for line in log.read_text().splitlines() if line.startswith("probe: ")]
        assert probes and set(probes) == {"probe: accepted"}, tail(log)
        process.send_signal(signal.SIGTERM)
        _stopped_cleanly(process, log)


_STOP_AT_LINE = """import os, sys
count = 0
def line(frame, event, arg):
    global count
    if event != "line":
        return line
    count += 1
    if count < {line}:
        return line
    sys.settrace(None)
    os.kill(os.getpid(), 15)
def call(frame, event, arg):
    entered = frame.f_code.co_name == "main" and frame.f_code.co_filename.endswith("launch.py")
    return line(frame, event, arg) if count or entered else None
sys.settrace(call)
from aggregator.launch import main
sys.argv[0] = "aggregator"
sys.exit(main())
"""


@pytest.mark.parametrize("line", [2, 50, 400, 2000, 5000, 20000])
def test_a_stop_at_any_line_once_main_runs_is_a_clean_one(tmp_path: Path, line: int) -> None:
    """SIGTERM sent by the process itself at its `line`-th line of Python once `aggregator.launch.main` runs (a
    tracer counts them: the same moment on any machine): exit 0, nothing served. The first line of main is what
    takes the stops; every line after it is covered. Until the stop module's imports were done (about 5,000 lines:
    `signal` builds its enums) the signal's default action killed the process (-15), a window of 1-3 ms that a
    supervisor stopping a service as it starts can hit."""
    log = tmp_path / "stderr.log"
    argv = [sys.executable, "-c", _STOP_AT_LINE.format(line=line), "serve", str(_manifest(tmp_path))]
    with log.open("ab") as sink:
        process = subprocess.Popen(argv, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sink)
    try:
        assert _stopped_cleanly(process, log) == b""
    finally:
        stop(process, signal.SIGKILL)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize("extra", [(), ("--http", "PORT"), ("--http", "PORT", "--stateless", "--workers", "2")],
                         ids=["stdio", "http", "workers"])
def test_a_stop_at_once_or_soon_after_the_start_leaves_nothing_running(tmp_path: Path, extra: tuple[str, ...]) -> None:
    """SIGTERM at once and at a few small delays after the start (the last ones as the server opens its manifest,
    or forks its workers): exit 0, no traceback, nothing of the process's group left running. -15 only when it was
    sent before the process handled SIGTERM: before main runs (the interpreter's start-up, about 15-20 ms on an
    idle machine, aggregator.launch) nothing can hear it."""
    for delay in (0, 0.01, 0.02, 0.05, 0.3, 1.0):
        folder = tmp_path / f"{delay * 1000:g}ms"
        folder.mkdir()
        log = folder / "stderr.log"
        argv = tuple(str(free_port()) if part == "PORT" else part for part in extra)
        with _serve(folder, *argv, group=True) as process:
            try:
                time.sleep(delay)
                handled = catches(process.pid, signal.SIGTERM)
                process.send_signal(signal.SIGTERM)
                try:
                    code = process.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    raise AssertionError(f"{delay}s: still running after the stop\n{tail(log)}") from None
                assert code == 0 or (code == -signal.SIGTERM and not handled), (delay, code, handled, tail(log))
                assert "Traceback" not in tail(log), tail(log)
                wait_until(lambda: not group_running(process.pid), f"{delay}s: the group's end", log=log,
                           timeout=STOP_TIMEOUT)
            finally:
                try:
                    os.killpg(process.pid, signal.SIGKILL)  # a worker left behind
                except ProcessLookupError:
                    pass
