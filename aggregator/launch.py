"""The `aggregator` command's entry point (and `python -m aggregator`'s): SIGTERM/SIGINT are heard before the CLI's
own imports, about a tenth of a second, so a stop that early is a clean one too (aggregator.stopping)."""

from __future__ import annotations

__all__ = ["main"]


def main() -> int:
    """Run the command line of this process: `aggregator.cli.main`, with stops heard from here on."""
    from aggregator.stopping import listen

    listen()  # first: the imports below are start-up too
    from aggregator.startup import pause_collection

    pause_collection()  # from here, not cli.main(): the CLI's own imports are start-up too (main resumes it)
    from aggregator.cli import main as cli_main

    return cli_main()
