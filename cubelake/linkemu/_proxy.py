"""The proxy's socket side, on one asyncio event loop: accept clients, forward each request to the
upstream, and shape and break the responses as the specs and :mod:`.policy` decide.

HTTP/1.1 itself is h11's (:mod:`._http`): client connections are kept alive as far as h11's rules
allow; each request gets its own upstream connection (S3 test servers such as moto close theirs
after every response anyway). Requests go upstream with the header fields the client signed for
the proxy's ``host:port``; responses come back with the client side's own connection fields.

The body faults break HTTP on purpose: the head and the first half of the body go out through
h11, then the proxy resets the socket (``reset``), closes it without the rest (``truncate``), or
waits (``stall``); the client connection's h11 state is then left mid-message and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, TypeVar
from urllib.parse import urlsplit

import h11

from ._http import MAX_HEAD, Peer, client_response, upstream_request, whole_response
from .policy import (
    TokenBucket,
    bucket_for,
    cut_point,
    decide_fault,
    error_response,
    slice_bytes,
    ttfb_s,
)
from .spec import FaultKind, FaultSpec, LinkSpec, LinkStats

__all__ = ["Proxy"]

log = logging.getLogger(__name__)

_UPSTREAM_LIMIT = 1 << 20
_T = TypeVar("_T")


class _Reset(Exception):
    """The client connection must be reset now (an injected fault)."""


class UpstreamError(Exception):
    """The upstream could not be reached or sent something that is not an HTTP response."""


@dataclass(frozen=True, slots=True)
class _Request:
    """One request being served: its head, its number, its fault, when its response may start."""

    event: h11.Request
    index: int
    fault: FaultKind | None
    due: float  # loop time before which no response byte leaves

    @property
    def method(self) -> str:
        return self.event.method.decode("ascii")

    @property
    def target(self) -> str:
        return self.event.target.decode("ascii", "replace")


@dataclass
class _Counters:
    requests: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    faults: dict[FaultKind, int] = field(default_factory=lambda: dict.fromkeys(FaultKind, 0))
    upstream_errors: int = 0


class Proxy:
    """State shared by every connection of one link; its coroutines run on one event loop."""

    def __init__(self, upstream: tuple[str, int], link: LinkSpec, faults: FaultSpec, seed: int) -> None:
        self.upstream, self.link, self.faults, self.seed = upstream, link, faults, seed
        self.slice = slice_bytes(link.bytes_per_s)
        self.down: TokenBucket | None = None
        self.up: TokenBucket | None = None
        self._index = 0  # every request
        self._eligible = 0  # requests that can draw a fault
        self._lock = threading.Lock()  # the counters are read from other threads
        self._counters = _Counters()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle (on the loop) -------------------------------------------------
    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: a free port); the port."""
        now = asyncio.get_running_loop().time()
        self.down = bucket_for(self.link, now, self.slice)
        self.up = bucket_for(self.link, now, self.slice) if self.link.cap_uploads else None
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD)
        return int(self._server.sockets[0].getsockname()[1])

    async def shutdown(self) -> None:
        """Stop listening and end every connection (a stalled body included)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    # -- counters ------------------------------------------------------------------
    def count(self, sent: int = 0, received: int = 0, fault: FaultKind | None = None,
              upstream_error: bool = False) -> None:
        with self._lock:
            c = self._counters
            c.bytes_sent += sent
            c.bytes_received += received
            if fault is not None:
                c.faults[fault] += 1
            c.upstream_errors += upstream_error

    def stats(self) -> LinkStats:
        with self._lock:
            c = self._counters
            return LinkStats(c.requests, c.bytes_sent, c.bytes_received, {k.value: n for k, n in c.faults.items()},
                             c.upstream_errors)

    def _admit(self, event: h11.Request) -> _Request:
        """A new request with its index, fault and due time, decided in arrival order."""
        arrived = asyncio.get_running_loop().time()
        index, fault = self._index, None
        self._index += 1
        if self.faults.applies_to(event.method.decode("ascii"), self._eligible):
            fault = decide_fault(self.faults, self.seed, self._eligible)
            self._eligible += 1
        with self._lock:
            self._counters.requests += 1
        return _Request(event, index, fault, arrived + ttfb_s(self.link, self.seed, index))

    # -- one client connection -------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # a connection callback always runs in a task
        self._tasks.add(task)
        client = Peer(h11.SERVER, reader, writer, self.slice, on_read=lambda n: self.count(received=n),
                      on_write=lambda n: self.count(sent=n))
        reset = False
        try:
            while await self._exchange(client):
                client.conn.start_next_cycle()
        except (_Reset, asyncio.CancelledError):  # a cancelled connection (shutdown) ends here, quietly
            reset = True
        except h11.RemoteProtocolError as exc:
            log.debug("client connection ended: %s", exc)
            await _refuse(client, exc)
        except (ConnectionError, h11.ProtocolError) as exc:
            log.debug("client connection ended: %s", exc)
        finally:
            self._tasks.discard(task)
            if reset:
                _abort(writer)
            else:
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()

    async def _exchange(self, client: Peer) -> bool:
        """Serve one request; whether the client connection can carry another."""
        event = await client.next_event()
        if not isinstance(event, h11.Request):
            return False  # the client closed its connection between requests
        req = self._admit(event)
        if req.fault in (FaultKind.SLOWDOWN, FaultKind.INTERNAL):
            log.debug("request %d %s %s: injected %s", req.index, req.method, req.target, req.fault)
            await self._inject_error(req, client)
            return client.reusable
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream, limit=_UPSTREAM_LIMIT)
        except OSError as exc:
            await self._bad_gateway(req, client, f"cannot connect to {self.upstream[0]}:{self.upstream[1]}: {exc}")
            return False
        try:
            await self._forward(req, client, Peer(h11.CLIENT, up_reader, up_writer, self.slice))
        finally:
            up_writer.close()
        return client.reusable

    async def _inject_error(self, req: _Request, client: Peer) -> None:
        """Answer with an S3 error; the upstream never sees the request."""
        assert req.fault is not None  # only called for an injected error
        # a client waiting for ``100 Continue`` never sends its body: answer, then close
        close = client.conn.they_are_waiting_for_100_continue
        if not close:
            while not isinstance(await client.next_event(), h11.EndOfMessage):
                pass  # the request's body, read and dropped, so the connection stays usable
        await _sleep_until(req.due)
        err = error_response(req.fault, urlsplit(req.target).path or "/", f"LINKEMU{req.index:012d}",
                             self.faults.retry_after_s)
        # counted before it is sent: a client that has its answer must find it in :meth:`stats`
        self.count(fault=req.fault)
        await client.send(whole_response(err.status, err.reason, err.headers, err.body, req.method == "HEAD", close))

    async def _bad_gateway(self, req: _Request, client: Peer, why: str) -> None:
        log.warning("link emulator: %s %s: %s", req.method, req.target, why)
        self.count(upstream_error=True)
        body = f"link emulator: the upstream failed: {why}\n".encode()
        await client.send(whole_response(502, "Bad Gateway", [("Content-Type", "text/plain")], body,
                                         req.method == "HEAD", close=True))

    async def _forward(self, req: _Request, client: Peer, up: Peer) -> None:
        """Send a request upstream (its body streamed while the response is awaited), then the response back."""
        up.write(up.encode(upstream_request(req.event, self.upstream)))
        pump = asyncio.create_task(self._pump(client, up))
        try:
            try:
                resp = await _await_with(self._response_head(up, client), pump)
            except UpstreamError as exc:
                await self._bad_gateway(req, client, str(exc))
                return
            # the client's connection is reusable only if its whole request body was read
            head = client_response(resp, close=not _succeeded(pump))
            await _sleep_until(req.due)
            await self._respond(req, head, client, up)
        finally:
            if not pump.done():
                pump.cancel()
            await asyncio.wait({pump})
            if not pump.cancelled():
                pump.exception()  # retrieved: a client that went away mid-upload is not an error here

    async def _pump(self, client: Peer, up: Peer) -> bool:
        """Stream a request body to the upstream (paced when uploads are capped); whether all of it went."""
        while True:
            event = await client.next_event()
            if not isinstance(event, h11.Data | h11.EndOfMessage):
                return False
            try:
                data = up.encode(event)
                if self.up is not None and isinstance(event, h11.Data):
                    await _pace(self.up, len(data))
                up.write(data)
                await up.writer.drain()
            except (ConnectionError, h11.LocalProtocolError):  # the upstream stopped reading (it answered
                return False                                     # early); its answer still goes back
            if isinstance(event, h11.EndOfMessage):
                return True

    async def _response_head(self, up: Peer, client: Peer) -> h11.Response:
        """The upstream's final response head; interim ones (``100 Continue``) go to the client at once."""
        while True:
            try:
                event = await up.next_event()
            except (h11.RemoteProtocolError, ConnectionError) as exc:
                if up.reader.at_eof() and isinstance(exc, h11.RemoteProtocolError):
                    raise UpstreamError("it closed the connection without a response") from None
                raise UpstreamError(str(exc) or type(exc).__name__) from None
            if isinstance(event, h11.Response):
                return event
            if not isinstance(event, h11.InformationalResponse) or event.status_code == 101:
                raise UpstreamError("it switched protocols, which the link emulator does not forward")
            client.write(client.encode(client_response(event)))

    async def _respond(self, req: _Request, head: h11.Response, client: Peer, up: Peer) -> None:
        """The response to the client: its head, then its body, broken as the request's fault says."""
        try:
            first = _peek(up)
        except UpstreamError as exc:  # nothing has gone to the client yet
            await self._bad_gateway(req, client, str(exc))
            return
        if req.fault is not None:
            log.debug("request %d %s %s: injecting %s", req.index, req.method, req.target, req.fault)
            self.count(fault=req.fault)
            if isinstance(first, h11.EndOfMessage):  # a response without a body
                await self._fault_without_body(req.fault, head, client)
                return
        client.write(client.encode(head))
        await self._body(req.fault, _content_length(head), _upstream_body(up, first), client)

    async def _fault_without_body(self, fault: FaultKind, head: h11.Response, client: Peer) -> None:
        """A body fault on a response without a body: reset or close before the head; a stall delays it."""
        if fault is FaultKind.RESET:
            raise _Reset
        if fault is FaultKind.TRUNCATE:
            return  # nothing sent: the connection closes
        await asyncio.sleep(self.faults.stall_s)
        await client.send([head, h11.EndOfMessage()])

    async def _body(self, fault: FaultKind | None, length: int | None,
                    events: AsyncIterator[h11.Data | h11.EndOfMessage], client: Peer) -> None:
        """Forward a response body, paced, breaking it at its middle for a body fault."""
        cut = cut_point(length, 0) if length is not None else None
        sent = 0
        try:
            async for event in events:
                if fault is None or isinstance(event, h11.EndOfMessage):
                    await self._send(client, event)
                    continue
                data = event.data
                cut = cut if cut is not None else sent + cut_point(None, len(data))
                if sent + len(data) < cut:
                    await self._send(client, event)
                    sent += len(data)
                    continue
                if not await self._break(fault, client, data[: cut - sent], data[cut - sent:]):
                    return
                fault = None  # a stalled body resumed
        except UpstreamError as exc:
            log.warning("link emulator: the upstream's response body broke off: %s", exc)
            self.count(upstream_error=True)

    async def _break(self, fault: FaultKind, client: Peer, before: bytes, after: bytes) -> bool:
        """Send ``before``, then break the body as ``fault`` says; whether it goes on (a stall, with ``after``).
        The client's h11 connection is left mid-body by a reset or a truncation: the socket ends next."""
        await self._send(client, h11.Data(data=before))
        if fault is FaultKind.TRUNCATE:
            return False  # closed short of the promised length
        await _flush(client.writer)
        if fault is FaultKind.RESET:
            raise _Reset
        await asyncio.sleep(self.faults.stall_s)
        client.writer.transport.set_write_buffer_limits()
        await self._send(client, h11.Data(data=after))
        return True

    async def _send(self, client: Peer, event: h11.Data | h11.EndOfMessage) -> None:
        """Send a body event to the client; a body's bytes wait for the link's bucket first."""
        if isinstance(event, h11.Data) and not event.data:
            return
        data = client.encode(event)
        if self.down is not None and isinstance(event, h11.Data):
            await _pace(self.down, len(data))
        client.write(data)
        await client.writer.drain()


def _peek(up: Peer) -> h11.Event | None:
    """The upstream's next event if h11 has it without reading more (``None``: it needs bytes);
    a response without a body (HEAD, 204, 304, ``Content-Length: 0``) ends at once."""
    try:
        event = up.conn.next_event()
    except h11.RemoteProtocolError as exc:
        raise UpstreamError(str(exc)) from None
    return event if isinstance(event, h11.Event) else None


async def _upstream_body(up: Peer, first: h11.Event | None) -> AsyncIterator[h11.Data | h11.EndOfMessage]:
    """The upstream's body events to its end (trailer fields included); one that breaks off raises
    :class:`UpstreamError`."""
    try:
        event = first if first is not None else await up.next_event()
        while isinstance(event, h11.Data):
            yield event
            event = await up.next_event()
    except (h11.RemoteProtocolError, ConnectionError) as exc:
        raise UpstreamError(str(exc) or type(exc).__name__) from None
    if not isinstance(event, h11.EndOfMessage):
        raise UpstreamError(f"unexpected {type(event).__name__} in a response body")
    yield event


def _content_length(head: h11.Response) -> int | None:
    """The body length the upstream promised (h11 checked the field); ``None``: chunked or until close."""
    fields = dict(head.headers)
    if b"transfer-encoding" in fields or b"content-length" not in fields:
        return None
    return int(fields[b"content-length"])


async def _refuse(client: Peer, exc: h11.RemoteProtocolError) -> None:
    """Answer a request h11 could not read with the status it suggests (400, 413, 431, 501) if no
    response has begun and the client is still there."""
    if client.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE) or client.reader.at_eof():
        return
    status = exc.error_status_hint
    body = f"link emulator: {exc}\n".encode()
    with contextlib.suppress(h11.ProtocolError, ConnectionError):
        await client.send(whole_response(status, HTTPStatus(status).phrase, [("Content-Type", "text/plain")], body,
                                         head_only=False, close=True))


async def _pace(bucket: TokenBucket, n: int) -> None:
    wait = bucket.reserve(n, asyncio.get_running_loop().time())
    if wait > 0:
        await asyncio.sleep(wait)


async def _sleep_until(when: float) -> None:
    delay = when - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)


async def _flush(writer: asyncio.StreamWriter) -> None:
    """Wait until everything written so far has left the process (reached the kernel)."""
    writer.transport.set_write_buffer_limits(high=0)
    await writer.drain()


def _succeeded(task: asyncio.Task[bool]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None and task.result()


async def _await_with(main: Coroutine[Any, Any, _T], side: asyncio.Task[bool]) -> _T:
    """Await ``main`` while ``side`` runs; if ``side`` fails first, cancel ``main`` and raise that failure."""
    task = asyncio.ensure_future(main)
    try:
        while not task.done():
            await asyncio.wait({task} | ({side} if not side.done() else set()), return_when=asyncio.FIRST_COMPLETED)
            failure = side.exception() if side.done() and not side.cancelled() else None
            if failure is not None:
                task.cancel()
                await asyncio.wait({task})
                raise failure
    except asyncio.CancelledError:
        task.cancel()
        raise
    return task.result()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Reset a connection: SO_LINGER 0 makes close() send RST instead of FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def parse_upstream(url: str) -> tuple[str, int]:
    """``(host, port)`` of an ``http://host[:port]`` upstream URL (ValueError if it is not one)."""
    parts = urlsplit(url.strip())
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError("the upstream must be an http://host[:port] URL (https is not supported)")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError("the upstream URL must be just http://host[:port], with no path, query or credentials")
    return parts.hostname, parts.port or 80
