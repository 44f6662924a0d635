"""The proxy's socket side, on one asyncio event loop: accept clients, forward each request to the
upstream, and shape and break the responses as the specs and :mod:`.policy` decide.

Client connections are kept alive (HTTP/1.1); each request gets its own upstream connection
(S3 test servers such as moto close theirs after every response anyway). Heads go upstream byte
for byte, so the client signs for the proxy's ``host:port`` and the upstream sees exactly what
was signed; response heads only get their ``Connection`` field replaced.
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
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ._http import (
    MAX_HEAD,
    Framing,
    Head,
    ProtocolError,
    body_slices,
    keep_alive,
    read_head,
    request_framing,
    response_framing,
    response_head_for_client,
)
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
    """One request being served: its head and framing, its number, its fault, when its response may start."""

    head: Head
    framing: Framing
    index: int
    fault: FaultKind | None
    keep: bool  # the client wants its connection kept open
    due: float  # loop time before which no response byte leaves

    @property
    def http10(self) -> bool:
        return self.head.start[2] == "HTTP/1.0"


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

    def _admit(self, method: str) -> tuple[int, FaultKind | None]:
        """A new request's index and its fault, decided in arrival order."""
        index, fault = self._index, None
        self._index += 1
        if self.faults.applies_to(method):
            fault = decide_fault(self.faults, self.seed, self._eligible)
            self._eligible += 1
        with self._lock:
            self._counters.requests += 1
        return index, fault

    # -- one client connection -------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # a connection callback always runs in a task
        self._tasks.add(task)
        reset = False
        try:
            while await self._exchange(reader, writer):
                pass
        except (_Reset, asyncio.CancelledError):  # a cancelled connection (shutdown) ends here, quietly
            reset = True
        except (ConnectionError, ProtocolError, asyncio.IncompleteReadError) as exc:
            log.debug("client connection ended: %s", exc)
        finally:
            self._tasks.discard(task)
            if reset:
                _abort(writer)
            else:
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()

    async def _exchange(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> bool:
        """Serve one request; whether the client connection stays open for another."""
        head = await read_head(creader)
        if head is None:
            return False
        arrived = asyncio.get_running_loop().time()
        self.count(received=len(head.raw))
        index, fault = self._admit(head.method)
        req = _Request(head, request_framing(head), index, fault, keep_alive(head),
                       arrived + ttfb_s(self.link, self.seed, index))
        if fault in (FaultKind.SLOWDOWN, FaultKind.INTERNAL):
            log.debug("request %d %s %s: injected %s", index, head.method, head.target, fault)
            return await self._inject_error(req, creader, cwriter)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream, limit=_UPSTREAM_LIMIT)
        except OSError as exc:
            await self._bad_gateway(head, cwriter, f"cannot connect to {self.upstream[0]}:{self.upstream[1]}: {exc}")
            return False
        try:
            return await self._forward(req, creader, cwriter, up_reader, up_writer)
        finally:
            up_writer.close()

    async def _inject_error(self, req: _Request, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> bool:
        """Answer with an S3 error; the upstream never sees the request."""
        assert req.fault is not None  # only called for an injected error
        keep = req.keep
        if req.framing.kind != "none":
            if "100-continue" in req.head.tokens("expect"):
                keep = False  # the client waits for us before sending its body: it never comes
            else:
                async for data in body_slices(creader, req.framing, self.slice):
                    self.count(received=len(data))
        await _sleep_until(req.due)
        resource = urlsplit(req.head.target).path or "/"
        data = error_response(req.fault, resource, f"LINKEMU{req.index:012d}", self.faults.retry_after_s, keep,
                              with_body=req.head.method != "HEAD")
        cwriter.write(data)
        self.count(sent=len(data), fault=req.fault)
        await cwriter.drain()
        return keep

    async def _bad_gateway(self, head: Head, cwriter: asyncio.StreamWriter, why: str) -> None:
        log.warning("link emulator: %s %s: %s", head.method, head.target, why)
        self.count(upstream_error=True)
        body = f"link emulator: the upstream failed: {why}\n".encode()
        data = (b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body)) + (body if head.method != "HEAD" else b"")
        cwriter.write(data)
        self.count(sent=len(data))
        await cwriter.drain()

    async def _forward(self, req: _Request, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter,
                       up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> bool:
        """Send a request upstream (its body streamed while the response is awaited), then the response back."""
        up_writer.write(req.head.raw)
        pump = asyncio.create_task(self._pump(req.framing, creader, up_writer))
        try:
            try:
                resp, rframing = await _await_with(self._response_head(req, up_reader, cwriter), pump)
            except UpstreamError as exc:
                await self._bad_gateway(req.head, cwriter, str(exc))
                return False
            # the client's connection is reusable only if its whole request body was read
            keep = req.keep and _succeeded(pump) and rframing.kind != "close"
            await _sleep_until(req.due)
            if req.fault is not None:
                log.debug("request %d %s %s: injecting %s", req.index, req.head.method, req.head.target, req.fault)
                self.count(fault=req.fault)
                if rframing.kind == "none":
                    return await self._fault_without_body(req, resp, keep, cwriter)
            out = response_head_for_client(resp, keep, req.http10)
            cwriter.write(out)
            self.count(sent=len(out))
            done = await self._body(rframing, req.fault, up_reader, cwriter)
            return keep and done and _succeeded(pump)
        finally:
            if not pump.done():
                pump.cancel()
            await asyncio.wait({pump})
            if not pump.cancelled():
                pump.exception()  # retrieved: a client that went away mid-upload is not an error here

    async def _pump(self, framing: Framing, creader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> bool:
        """Stream a request body to the upstream (paced when uploads are capped); whether all of it went."""
        async for data in body_slices(creader, framing, self.slice):
            self.count(received=len(data))
            if self.up is not None:
                await _pace(self.up, len(data))
            try:
                up_writer.write(data)
                await up_writer.drain()
            except ConnectionError:  # the upstream stopped reading (it answered early); its answer still goes back
                return False
        return True

    async def _response_head(self, req: _Request, up_reader: asyncio.StreamReader,
                             cwriter: asyncio.StreamWriter) -> tuple[Head, Framing]:
        """The upstream's final response head and its body's framing; interim heads (``100 Continue``)
        go to the client at once."""
        while True:
            try:
                resp = await read_head(up_reader, response=True)
                if resp is None:
                    raise UpstreamError("it closed the connection without a response")
                if resp.status == 101:
                    raise UpstreamError("it switched protocols, which the link emulator does not forward")
                if resp.status >= 200:
                    return resp, response_framing(resp, req.head.method)
            except (ProtocolError, ConnectionError) as exc:
                raise UpstreamError(str(exc) or type(exc).__name__) from None
            cwriter.write(resp.raw)
            self.count(sent=len(resp.raw))

    async def _fault_without_body(self, req: _Request, resp: Head, keep: bool, cwriter: asyncio.StreamWriter) -> bool:
        """A body fault on a response without a body: reset or close before the head; a stall delays it."""
        if req.fault is FaultKind.RESET:
            raise _Reset
        if req.fault is FaultKind.TRUNCATE:
            return False
        await asyncio.sleep(self.faults.stall_s)
        out = response_head_for_client(resp, keep, req.http10)
        cwriter.write(out)
        self.count(sent=len(out))
        await cwriter.drain()
        return keep

    async def _body(self, framing: Framing, fault: FaultKind | None, up_reader: asyncio.StreamReader,
                    cwriter: asyncio.StreamWriter) -> bool:
        """Forward a response body, paced, breaking it at its middle for a body fault; whether it completed."""
        cut = cut_point(framing.length, 0) if framing.length is not None else None
        sent = 0
        try:
            async for data in _upstream_body(up_reader, framing, self.slice):
                if fault is None:
                    await self._send(cwriter, data)
                    continue
                cut = cut if cut is not None else sent + cut_point(None, len(data))
                if sent + len(data) < cut:
                    await self._send(cwriter, data)
                    sent += len(data)
                    continue
                await self._send(cwriter, data[: cut - sent])
                if fault is FaultKind.RESET:
                    await _flush(cwriter)
                    raise _Reset
                if fault is FaultKind.TRUNCATE:
                    return False
                await _flush(cwriter)
                await asyncio.sleep(self.faults.stall_s)
                cwriter.transport.set_write_buffer_limits()
                await self._send(cwriter, data[cut - sent:])
                fault = None
        except UpstreamError as exc:
            log.warning("link emulator: the upstream's response body broke off: %s", exc)
            self.count(upstream_error=True)
            return False
        await cwriter.drain()
        return True

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        if not data:
            return
        if self.down is not None:
            await _pace(self.down, len(data))
        writer.write(data)
        self.count(sent=len(data))
        await writer.drain()


async def _upstream_body(up_reader: asyncio.StreamReader, framing: Framing, max_slice: int) -> AsyncIterator[bytes]:
    """The upstream's body slices; an upstream that breaks off raises :class:`UpstreamError`."""
    try:
        async for data in body_slices(up_reader, framing, max_slice):
            yield data
    except (ProtocolError, ConnectionError) as exc:
        raise UpstreamError(str(exc) or type(exc).__name__) from None


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
