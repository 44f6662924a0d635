"""The API's listening socket: connections accepted from it send without Nagle's delay."""

from __future__ import annotations

import asyncio
import socket

import pytest

from cubelake.catalog.serve import _bind
from cubelake.errors import CatalogError


@pytest.mark.integration
def test_connections_accepted_from_the_api_socket_have_tcp_nodelay() -> None:
    """uvicorn writes a response's head and body separately; with Nagle's algorithm on, the body waited for the
    client's delayed ACK (40 ms per request, measured with httpx). asyncio sets TCP_NODELAY on an accepted
    connection only when the listening socket says it is TCP."""
    sock = _bind("127.0.0.1", 0)
    port = sock.getsockname()[1]

    async def main() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conn = writer.get_extra_info("socket")
            seen.set_result(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accepted, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            nodelay = await asyncio.wait_for(seen, 10)
            writer.close()
            return nodelay

    assert asyncio.run(main()) != 0


@pytest.mark.integration
def test_a_taken_port_is_named() -> None:
    first = _bind("127.0.0.1", 0)
    try:
        with pytest.raises(CatalogError, match=rf"cannot listen on 127.0.0.1:{first.getsockname()[1]} .*--port"):
            _bind("127.0.0.1", first.getsockname()[1])
    finally:
        first.close()
