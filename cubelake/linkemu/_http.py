"""HTTP/1.1 for the proxy through h11: one :class:`Peer` per socket (the client's, where the proxy
is the server; the upstream's, where it is the client), driven by asyncio streams.

h11 parses and writes heads, frames bodies (Content-Length, chunked, ended by closing) and decides
whether a connection can carry another request; this module only moves bytes between h11 and the
streams and translates messages from one side to the other. Request header names and values go
upstream as the client sent them (h11 keeps a name's case and only trims a value's surrounding
blanks, as SigV4's canonical form does), so a signature made for the proxy's ``host:port`` holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TypeVar

import h11

__all__ = ["MAX_HEAD", "Peer", "client_response", "upstream_request", "whole_response"]

MAX_HEAD = 64 * 1024
_HOP = {b"connection", b"keep-alive", b"proxy-connection"}
_R = TypeVar("_R", h11.Response, h11.InformationalResponse)


def _ignore(n: int) -> None:
    pass


class Peer:
    """One side's h11 connection on its asyncio streams; ``on_read`` and ``on_write`` hear of every
    byte that crosses the socket."""

    def __init__(self, role: type[h11.CLIENT] | type[h11.SERVER], reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, read_size: int, on_read: Callable[[int], None] = _ignore,
                 on_write: Callable[[int], None] = _ignore) -> None:
        self.conn = h11.Connection(role, max_incomplete_event_size=MAX_HEAD)
        self.reader, self.writer, self.read_size = reader, writer, read_size
        self.on_read, self.on_write = on_read, on_write

    async def next_event(self) -> h11.Event:
        """The peer's next event, reading at most ``read_size`` bytes at a time as h11 needs them
        (:class:`h11.RemoteProtocolError` if the peer broke the protocol or closed mid-message)."""
        while True:
            event = self.conn.next_event()
            if isinstance(event, h11.Event):
                return event
            if event is h11.PAUSED:  # only after a whole message, and the proxy never asks then
                raise h11.LocalProtocolError("the next message was asked for before this exchange ended")
            data = await self.reader.read(self.read_size)
            self.on_read(len(data))
            self.conn.receive_data(data)

    def encode(self, event: h11.Event) -> bytes:
        """The bytes of ``event`` for this peer (h11's state advances: they must then be written)."""
        return self.conn.send(event) or b""

    def write(self, data: bytes) -> None:
        self.on_write(len(data))  # first: a client that got the bytes finds them counted
        self.writer.write(data)

    async def send(self, events: Iterable[h11.Event]) -> None:
        """Encode, write and drain ``events``."""
        for event in events:
            self.write(self.encode(event))
        await self.writer.drain()

    @property
    def reusable(self) -> bool:
        """Both sides finished their messages and neither asked to close: the next request may come."""
        return self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE


def upstream_request(req: h11.Request, upstream: tuple[str, int]) -> h11.Request:
    """The client's request as it goes upstream: same method, target and header fields (names in
    their case, values as sent, hop-by-hop ones too: the upstream connection ends after one
    response anyway). h11 sends only HTTP/1.1, which needs a Host: an HTTP/1.0 client that sent
    none gets the upstream's."""
    headers = req.headers.raw_items()
    if not any(name.lower() == b"host" for name, _ in headers):
        headers = [(b"Host", f"{upstream[0]}:{upstream[1]}".encode()), *headers]
    return h11.Request(method=req.method, target=req.target, headers=headers)


def client_response(resp: _R, close: bool = False) -> _R:
    """The upstream's response as it goes to the client: its connection fields dropped (h11 writes
    the client side's own), ``Connection: close`` if ``close``."""
    headers = [(k, v) for k, v in resp.headers.raw_items() if k.lower() not in _HOP]
    if close:
        headers.append((b"Connection", b"close"))
    return type(resp)(status_code=resp.status_code, reason=resp.reason, headers=headers)


def whole_response(status: int, reason: str, headers: Iterable[tuple[str, str]], body: bytes, head_only: bool,
                   close: bool = False) -> list[h11.Event]:
    """The events of a complete response of the proxy's own (``head_only``: an answer to a HEAD)."""
    fields = [*headers, ("Content-Length", str(len(body)))]
    if close:
        fields.append(("Connection", "close"))
    events: list[h11.Event] = [h11.Response(status_code=status, reason=reason, headers=fields)]
    if body and not head_only:
        events.append(h11.Data(data=body))
    return [*events, h11.EndOfMessage()]
