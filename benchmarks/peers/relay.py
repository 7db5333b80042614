"""The relay floor: the least code that makes one stdio hop. It starts the upstream command as its child and copies
bytes both ways (its stdin to the child's stdin, the child's stdout to its stdout) with one thread per direction,
parsing nothing: newline-delimited JSON-RPC needs no rewriting when there is one client.

Usage: python -m benchmarks.peers.relay COMMAND [ARG...]

Stdlib only. What a read through it costs over a direct read is the floor of "one hop" on this machine: two more
pipes, two more wake-ups and one more process's scheduling; any gateway pays at least that.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable

CHUNK = 1 << 16


def pump(source: int, sink: int) -> None:
    """Copy `source` to `sink` until end of file (or until either side goes away)."""
    try:
        while chunk := os.read(source, CHUNK):
            view = memoryview(chunk)
            while view:
                view = view[os.write(sink, view):]
    except OSError:
        pass  # the other side went away: the relay ends with it


def relay(argv: list[str], down: Callable[[subprocess.Popen[bytes]], None],
          up: Callable[[subprocess.Popen[bytes]], None]) -> int:
    """Run `argv` as the child, `down` (its stdout to ours) on a thread and `up` (our stdin to its) here, until our
    stdin ends; the child's exit code."""
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    thread = threading.Thread(target=down, args=(child,), daemon=True)
    thread.start()
    up(child)
    child.stdin.close()  # the client's end of file is the upstream's cue to exit
    code = child.wait()
    thread.join(5)
    return code


def main(argv: list[str]) -> int:
    return relay(argv, lambda child: pump(child.stdout.fileno(), sys.stdout.fileno()),  # type: ignore[union-attr]
                 lambda child: pump(sys.stdin.fileno(), child.stdin.fileno()))  # type: ignore[union-attr]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
