"""Running the STAC API: uvicorn on 127.0.0.1 (unless told otherwise), stopped cleanly by Ctrl-C/SIGTERM."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from pathlib import Path

from cubelake.errors import CatalogError

__all__ = ["serve"]

log = logging.getLogger(__name__)


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so that port 0 can be announced and a taken port is a clear error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on connections whose socket
    # says it is TCP; with proto 0 each response's body waited for the client's delayed ACK of its head (~40 ms)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise CatalogError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); choose another --port "
                           "or --host") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(lake: str | Path, *, host: str = "127.0.0.1", port: int = 8000,
          announce: Callable[[str], None] | None = None) -> None:
    """Serve ``lake``'s catalog until interrupted."""
    import uvicorn

    # stac-fastapi's module-level default settings warn that they are defaults; this app passes its own
    logging.getLogger("stac_fastapi.types.config").setLevel(logging.ERROR)
    from .api import create_app

    app = create_app(lake)
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}/"
    if announce is not None:
        announce(url)
    log.info("serving %s at %s", lake, url)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5,
                            limit_concurrency=1024, backlog=2048)
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
