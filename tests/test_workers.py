"""The worker processes' shared socket, and stops at any moment of their start-up (serving is driven in
test_server_http.py): real processes and real signals, each landing at a chosen point without timing."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys

import pytest

from aggregator.workers import listening_socket
from tests.served import ROOT, STOP_TIMEOUT


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
