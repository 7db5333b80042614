"""The worker processes' shared socket (the processes themselves are driven in test_server_http.py)."""

from __future__ import annotations

import asyncio
import socket

from aggregator.workers import listening_socket


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
