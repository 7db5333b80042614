"""Where a server's memory goes: `python -m benchmarks.memory_profile OUT.json serve MANIFEST` runs aggregator's
command line with tracemalloc on (one frame a trace); each SIGUSR1 writes the live Python allocations, summed by
source line and by file, to OUT.json. Tracing slows the server and about doubles its memory: the figures say where
memory goes, not how much the untraced server takes (`benchmarks.scale` measures that beside the floor).
"""

from __future__ import annotations

import json
import linecache
import os
import signal
import sys
import tracemalloc
from types import FrameType
from typing import Any

TOP = 15


def short(filename: str) -> str:
    """A source file's path from its package on (`aggregator/compiler.py`, `pydantic/fields.py`, `typing.py`)."""
    for marker in ("site-packages/", "/lib/python3.11/", "/lib/python3.12/", "/lib/python3.13/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return "aggregator/" + filename.split("/aggregator/", 1)[1] if "/aggregator/" in filename else filename


def snapshot_summary() -> dict[str, Any]:
    """The traced allocations now (their total, and the largest by line, with the line's code, and by file: bytes,
    blocks) and the traced peak since the start."""
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    by_line = snapshot.statistics("lineno")
    lines = [[f"{short(s.traceback[0].filename)}:{s.traceback[0].lineno}", s.size, s.count,
              linecache.getline(s.traceback[0].filename, s.traceback[0].lineno).strip()[:90]] for s in by_line[:TOP]]
    files = [[short(s.traceback[0].filename), s.size, s.count] for s in snapshot.statistics("filename")[:TOP]]
    return {"total": sum(s.size for s in by_line), "peak": tracemalloc.get_traced_memory()[1], "lines": lines,
            "files": files}


def main() -> int:
    out, argv = sys.argv[1], sys.argv[2:]

    def dump(signum: int, frame: FrameType | None) -> None:
        with open(out + ".tmp", "w") as handle:
            json.dump(snapshot_summary(), handle)
        os.replace(out + ".tmp", out)

    tracemalloc.start(1)
    signal.signal(signal.SIGUSR1, dump)
    from aggregator.cli import main as aggregator_main

    return aggregator_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
