"""Serving over Streamable HTTP: uvicorn with our protocol limits, on `[HOST:]PORT` or a socket workers share,
until SIGTERM or Ctrl-C (our signal handling, installed before uvicorn starts; one heard earlier, by
aggregator.stopping, means not serving at all; a second one, while requests in flight finish, means not waiting
for them)."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    import socket

    from mcp.server.lowlevel import Server

    from aggregator.metrics import Metrics
    from aggregator.search import Discovery
    from aggregator.stopping import Stop
    from aggregator.supervisor import Supervisor

__all__ = ["CannotListen", "host_port", "http_address", "serve_http"]

logger = logging.getLogger("aggregator")


def host_port(http: str) -> tuple[str, int]:
    """(host, port) of `[HOST:]PORT` (an IPv6 host in brackets); host 127.0.0.1 when none is given."""
    host, _, port = http.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def http_address(host: str, port: int) -> str:
    """`host:port` as a URL writes it: an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class CannotListen(Exception):
    """The server cannot listen on its address: one line for the operator, the address and the system's reason
    (`cannot listen on 127.0.0.1:8080: address already in use`); `serve` ends with exits.EXIT_USAGE."""

    def __init__(self, host: str, port: int, error: OSError) -> None:
        # The errno's own words: asyncio's message repeats the address as a tuple; a resolver's error (gaierror)
        # has a negative code and its words in strerror.
        reason = os.strerror(error.errno) if error.errno and error.errno > 0 else error.strerror or str(error)
        super().__init__(f"cannot listen on {http_address(host, port)}: {reason[:1].lower()}{reason[1:]}")


class _NotTheBindError(logging.Filter):
    """Drops uvicorn's log line of a failed bind (the OSError itself as the message): CannotListen says it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not isinstance(record.msg, OSError)


async def serve_http(server: Server[Any], live: Supervisor, metrics: Metrics, args: argparse.Namespace,
                      sock: Any = None, discovery: Discovery | None = None, stop: Stop | None = None,
                      ready: Callable[[], None] = lambda: None) -> None:
    """Streamable HTTP on `args.http` (`[HOST:]PORT`, host 127.0.0.1 by default) at /mcp, until SIGTERM or Ctrl-C;
    on `sock` when given (a socket shared by workers). Not at all when `stop` heard one already; else `ready()`
    once uvicorn listens (a connection is accepted from then on), a stop being heard as one of a server in service
    since before uvicorn started. CannotListen when uvicorn cannot bind the address (its lifespan ended first)."""
    import uvicorn

    from aggregator.stopping import stop_signals

    from aggregator.http_app import http_app
    from aggregator.http_limits import limited_protocol, quiet_client_disconnects
    from aggregator.http_stop import Abandonable

    host, port = host_port(args.http)
    console = None
    if live.service.manifest.server.console is not None:
        from aggregator.console.app import Console

        console = Console(live, discovery)
    app = Abandonable(http_app(server, live, metrics, host, int(port), json_response=args.json_response,
                               stateless=args.stateless, console=console))
    limits = live.service.manifest.server.http
    quiet_client_disconnects()
    # log_config=None: uvicorn's own lines go through our handler, so --log-format json covers them too.
    # http=: uvicorn's httptools protocol plus header/body timeouts and the connection cap (aggregator.http_limits).
    # The ignore: uvicorn annotates timeout_keep_alive as int but only hands it to loop.call_later (float seconds).
    config = uvicorn.Config(app, host=host, port=int(port), log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=5, log_config=None, http=limited_protocol(limits),
                            timeout_keep_alive=limits.keep_alive_timeout)  # type: ignore[arg-type]

    class Quiet(uvicorn.Server):
        # The signals are ours (below): uvicorn would re-raise them after shutting down, ending with -SIGTERM.
        def capture_signals(self) -> Any:
            return nullcontext()

        unbound: OSError | None = None

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            # "serving" means "connect now": logged once uvicorn listens (without workers it binds the port only
            # here, after the lifespan's start-up), and not once a stop has come meanwhile.
            bind_error = logging.getLogger("uvicorn.error")
            quiet = _NotTheBindError()
            bind_error.addFilter(quiet)
            try:
                await super().startup(sockets)
            except SystemExit as exc:
                # uvicorn logs a failed bind, shuts the lifespan down and calls sys.exit inside its `except
                # OSError`: the OSError is the exit's context. Kept for CannotListen, and uvicorn's serve() returns
                # (not started, nothing to shut down) instead of an exit unwinding through our task groups.
                if not isinstance(exc.__context__, OSError):
                    raise
                self.unbound = exc.__context__
                self.should_exit = True
                return
            finally:
                bind_error.removeFilter(quiet)
            if self.started and not self.should_exit:
                ready()

    http = Quiet(config)

    def stopping() -> None:
        # Listen streams never end by themselves: close them first, so each sends its final result and uvicorn's
        # graceful shutdown is not left waiting on them.
        live.notifier.close()
        http.should_exit = True

    async with anyio.create_task_group() as tg:
        # Before uvicorn starts: a worker's start-up handler ends here. A second stop gives up what is in flight,
        # each request ended cleanly (`abandon`).
        await tg.start(stop_signals, stop, stopping, app.abandon)
        if not http.should_exit:
            await http.serve(sockets=[sock] if sock is not None else None)
        tg.cancel_scope.cancel()
    if http.unbound is not None:
        raise CannotListen(host, port, http.unbound)
