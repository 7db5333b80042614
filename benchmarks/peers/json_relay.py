"""The JSON relay floor: the relay floor (benchmarks/peers/relay.py) that also parses every message and encodes it
again, as any gateway that checks what it passes on must: one `orjson.loads` and one `orjson.dumps` a line each way
(the codec the aggregator's hot paths use, aggregator/codec.py; with the stdlib's json this floor cost 2-3x the CPU
a read over server-everything's documents).

Usage: python -m benchmarks.peers.json_relay COMMAND [ARG...]

The stdlib and orjson only. It checks nothing beyond the JSON and rewrites nothing (one client, the upstream's own
URIs), so a gateway that resolves, authorizes, checks and renames what it relays costs at least this.
"""

from __future__ import annotations

import sys
from typing import IO

import orjson

from benchmarks.peers.relay import relay


def pump(source: IO[bytes], sink: IO[bytes]) -> None:
    """Each line of `source` parsed and written to `sink` encoded again, until end of file (or either side goes)."""
    try:
        for line in source:
            message = orjson.loads(line)
            sink.write(orjson.dumps(message) + b"\n")
            sink.flush()
    except (OSError, ValueError):
        pass  # the other side went away (or sent what is not JSON): the relay ends with it


def main(argv: list[str]) -> int:
    return relay(argv, lambda child: pump(child.stdout, sys.stdout.buffer),  # type: ignore[arg-type]
                 lambda child: pump(sys.stdin.buffer, child.stdin))  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
