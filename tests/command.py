"""`aggregator ARGS` run inside the test process: `aggregator.cli.main` with the process-wide state a command
touches (stdout, stderr, logging, working folder, environment) given and restored. It answers as
`subprocess.run([python, -m, aggregator, ...], capture_output=True, text=True)` would, without a Python start and
the package's imports each time (half a second of CPU per command). What needs the process itself (exit on a closed
pipe, signals, what `python -m aggregator` imports) stays with tests/test_cli.py's real processes."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

__all__ = ["aggregator"]


@contextmanager
def _process_state(cwd: Path | None, env: Mapping[str, str] | None) -> Iterator[tuple[io.TextIOWrapper, io.TextIOWrapper]]:
    """New stdout and stderr (text over bytes, as a process has), `cwd` and `env` for the block; everything back
    after it, the root logger's handlers and level too (setup_logging replaces them)."""
    # Encoded as this process's own streams are (stderr backslash-escapes what it cannot encode).
    out = io.TextIOWrapper(io.BytesIO(), encoding=sys.__stdout__.encoding, errors=sys.__stdout__.errors,
                           write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding=sys.__stderr__.encoding, errors=sys.__stderr__.errors,
                           write_through=True)
    saved_streams = sys.stdout, sys.stderr
    root = logging.getLogger()
    saved_logging = root.handlers[:], root.level, logging.getLogger("watchfiles").level
    saved_cwd, saved_env = os.getcwd(), dict(os.environ)
    try:
        sys.stdout, sys.stderr = out, err
        if cwd is not None:
            os.chdir(cwd)
        os.environ.update(env or {})
        yield out, err
    finally:
        sys.stdout, sys.stderr = saved_streams
        root.handlers[:], level, watchfiles = saved_logging
        root.setLevel(level)
        logging.getLogger("watchfiles").setLevel(watchfiles)
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def aggregator(*args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    """Run `aggregator ARGS` in this process (in `cwd`, with `env` added): its exit code, stdout and stderr."""
    from aggregator.cli import main

    with _process_state(cwd, env) as (out, err):
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse's usage errors, --help
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    return subprocess.CompletedProcess(["aggregator", *args], code, _text(out), _text(err))


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    data = stream.buffer.getvalue()  # type: ignore[attr-defined]
    return data.decode(stream.encoding, errors="replace").replace("\r\n", "\n")
