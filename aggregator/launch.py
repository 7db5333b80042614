"""The `aggregator` command's entry point (and `python -m aggregator`'s): SIGTERM/SIGINT are taken by main's first
line, before any import (aggregator.stopping's own is some 5,000 lines of Python: `signal` builds its enums), so a
stop at any moment once main runs is a clean one (aggregator.stopping). What runs before main (the interpreter's
start-up, `site`, this package's import: about 15-20 ms on an idle machine) cannot hear a stop: SIGTERM's default
action ends the process there, which has done nothing yet."""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # built in and loaded by the interpreter: no file to read

__all__ = ["main"]

_early: list[int] = []
"""Stops heard before aggregator.stopping took over: handed to its Stop by `listen`."""


def _heard_early(signum: int, frame: object) -> None:
    _early.append(signum)


def main() -> int:
    """Run the command line of this process: `aggregator.cli.main`, with stops heard from here on."""
    _signal.signal(_signal.SIGTERM, _heard_early)  # first, one line: from the next line on a stop is noted
    _signal.signal(_signal.SIGINT, _heard_early)
    from aggregator.stopping import listen

    listen(_early)  # first: the imports below are start-up too
    from aggregator.startup import pause_collection

    pause_collection()  # from here, not cli.main(): the CLI's own imports are start-up too (main resumes it)
    from aggregator.cli import main as cli_main

    return cli_main()
