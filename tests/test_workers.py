"""The worker processes' shared socket, and stops at any moment of their start-up (serving is driven in
test_server_http.py): real processes and real signals, each landing at a chosen point without timing."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from aggregator.workers import listening_socket
from tests.isolation import free_port
from tests.served import ROOT, STOP_TIMEOUT, start, tail, wait_until, workers_up
from tests.test_live import BASE


def test_connections_accepted_on_the_shared_socket_have_nodelay() -> None:
    """Without TCP_NODELAY every small answer on a keep-alive connection waits for a delayed ACK (~40 ms)."""
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    seen: list[int] = []

    async def main() -> None:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accepted, sock=sock)
        async with server:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            await reader.read()
            writer.close()

    asyncio.run(main())
    assert seen and seen[0] != 0


# A parent of two workers that serve (sleep) until stopped, and SIGTERM sent to it by a profile hook at the first
# call of the C function named by argv[1]: a signal at that exact point of the start-up, every run.
_STOPPED_AT = """
import _signal, os, signal, sys, time
from aggregator.stopping import listen
from aggregator.workers import run_workers

stop = listen()
target = {"pthread_sigmask": _signal.pthread_sigmask, "fork": os.fork}[sys.argv[1]]  # signal's wraps the former
parent, sent = os.getpid(), []

def hook(frame, event, arg):
    if event == "c_call" and arg is target and not sent and os.getpid() == parent:
        sent.append(True)
        os.kill(parent, signal.SIGTERM)

sys.setprofile(hook)
code = run_workers(2, lambda index: time.sleep(120) or 0, stop=stop)
sys.setprofile(None)
print("sent" if sent else "not sent", flush=True)
sys.exit(code)
"""


@pytest.mark.parametrize("moment", ["pthread_sigmask", "fork"], ids=["as-it-starts-to-fork", "during-a-fork"])
def test_a_stop_while_forking_reaches_every_worker(moment: str) -> None:
    """SIGTERM to the parent just as it gets ready to fork (its handler runs before the signals are blocked) or
    during a fork (blocked, pending): no worker is forked after it without hearing it, so all end at once, exit 0.
    (A worker forked after the handler had forwarded the stop to the others served on, and the parent waited.)"""
    process = subprocess.Popen([sys.executable, "-c", _STOPPED_AT, moment], env={**os.environ, "PYTHONPATH": str(ROOT)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = process.communicate(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the parent and the worker it waits for
        process.communicate()
        raise AssertionError(f"still running {STOP_TIMEOUT:g}s after the stop") from None
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0 and out == b"sent\n", (process.returncode, out, err[-2000:])
    assert b"Traceback" not in err, err[-2000:]


def test_stopping_its_workers_costs_the_parent_little(tmp_path: Path) -> None:
    """Once its workers have stopped, the parent of `serve --workers 2` exits without walking the modules it
    imported with the cyclic collector (frozen before forking): that walk was a quarter of a second of CPU, which a
    loaded machine stretched to seconds. The parent's own CPU from the SIGTERM to its exit (read while it is a
    zombie, before it is reaped), which load does not stretch."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n")
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(BASE)
    log = tmp_path / "stderr.log"
    process = start([sys.executable, "-m", "aggregator", "serve", str(manifest), "--http", str(free_port()),
                     "--stateless", "--workers", "2"], log)
    try:
        wait_until(workers_up(process.pid, 2), "two workers serving", process=process, log=log)
        before = _cpu(process.pid)
        process.send_signal(signal.SIGTERM)
        wait_until(lambda: os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None,
                   "the exit", timeout=STOP_TIMEOUT)
        stopping = _cpu(process.pid) - before
    finally:
        process.kill()
        code = process.wait()
    assert code == 0, tail(log)
    assert stopping < 0.1, (stopping, tail(log))


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used itself, not counting its children (/proc: Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
