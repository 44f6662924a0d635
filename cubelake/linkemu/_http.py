"""Just enough HTTP/1.1 for a transparent proxy: message heads (parsed, pure) and body framing.

Heads are forwarded byte for byte (a request's signature covers them); the proxy parses them
only to know where a body ends (``Content-Length``, chunked, or the connection closing), whether
a connection stays open, and which method a response answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

__all__ = ["Framing", "Head", "ProtocolError", "body_slices", "keep_alive", "parse_head", "read_head",
           "request_framing", "response_framing", "response_head_for_client"]

MAX_HEAD = 64 * 1024
_HOP = {"connection", "keep-alive", "proxy-connection"}


class ProtocolError(Exception):
    """A peer sent something that is not HTTP/1.x this proxy can forward."""


@dataclass(frozen=True, slots=True)
class Head:
    """A message head: the start line's three parts, the header fields, and the raw bytes."""

    start: tuple[str, str, str]
    headers: tuple[tuple[str, str], ...]
    raw: bytes

    def get(self, name: str) -> str | None:
        """The value of a header (several fields of one name joined by commas), or ``None``."""
        vals = [v for k, v in self.headers if k.lower() == name]
        return ", ".join(vals) if vals else None

    def tokens(self, name: str) -> list[str]:
        """The comma-separated, lowercased tokens of a header."""
        return [t.strip().lower() for t in (self.get(name) or "").split(",") if t.strip()]

    @property
    def method(self) -> str:
        return self.start[0]

    @property
    def target(self) -> str:
        return self.start[1]

    @property
    def status(self) -> int:
        return int(self.start[1])


def parse_head(raw: bytes, response: bool = False) -> Head:
    """A head from its bytes (ending in a blank line); :class:`ProtocolError` if malformed."""
    lines = raw.decode("latin-1").split("\r\n")
    while lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise ProtocolError("empty message head")
    parts = lines[0].split(" ", 2)
    if response:
        parts += [""] * (3 - len(parts))
        if not (parts[0].startswith("HTTP/1.") and parts[1].isdigit() and len(parts[1]) == 3):
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    elif len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[0].isalpha():
        raise ProtocolError(f"not an HTTP/1.x request line: {lines[0][:80]!r}")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or " " in name:
            raise ProtocolError(f"malformed header line: {line[:80]!r}")
        headers.append((name, value.strip()))
    return Head((parts[0], parts[1], parts[2]), tuple(headers), raw)


async def read_head(reader: asyncio.StreamReader, response: bool = False) -> Head | None:
    """The next head from a stream; ``None`` at a clean end of stream (nothing more was sent)."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise ProtocolError("the connection closed in the middle of a message head") from None
    except asyncio.LimitOverrunError:
        raise ProtocolError(f"message head longer than {MAX_HEAD} bytes") from None
    return parse_head(raw.lstrip(b"\r\n"), response)


@dataclass(frozen=True, slots=True)
class Framing:
    """How a body is delimited: none, ``length`` bytes, chunked, or by the connection closing."""

    kind: Literal["none", "length", "chunked", "close"]
    length: int | None = None


def _length(head: Head) -> int | None:
    raw = head.get("content-length")
    if raw is None:
        return None
    values = {v.strip() for v in raw.split(",")}
    if len(values) != 1 or not next(iter(values)).isdigit():
        raise ProtocolError(f"bad Content-Length {raw[:40]!r}")
    return int(values.pop())


def request_framing(head: Head) -> Framing:
    """Where a request's body ends."""
    if head.tokens("transfer-encoding"):
        if head.tokens("transfer-encoding")[-1] != "chunked":
            raise ProtocolError("a request's Transfer-Encoding must end with chunked")
        return Framing("chunked")
    n = _length(head)
    return Framing("none") if not n else Framing("length", n)


def response_framing(head: Head, method: str) -> Framing:
    """Where the body of a response to ``method`` ends."""
    status = head.status
    if method == "HEAD" or 100 <= status < 200 or status in (204, 304):
        return Framing("none")
    if head.tokens("transfer-encoding"):
        chunked = head.tokens("transfer-encoding")[-1] == "chunked"
        return Framing("chunked") if chunked else Framing("close")
    n = _length(head)
    if n is None:
        return Framing("close")
    return Framing("none") if n == 0 else Framing("length", n)


def keep_alive(head: Head) -> bool:
    """Whether the sender of this message keeps its connection open afterwards."""
    tokens = head.tokens("connection")
    version = head.start[0] if head.start[0].startswith("HTTP/") else head.start[2]
    if version == "HTTP/1.0":
        return "keep-alive" in tokens
    return "close" not in tokens


def response_head_for_client(head: Head, keep: bool, client_http10: bool) -> bytes:
    """A response head with the upstream's connection fields replaced by the client side's own."""
    lines = [" ".join(p for p in head.start if p)]
    lines += [f"{k}: {v}" for k, v in head.headers if k.lower() not in _HOP]
    if not keep:
        lines.append("Connection: close")
    elif client_http10:
        lines.append("Connection: keep-alive")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def body_slices(reader: asyncio.StreamReader, framing: Framing, max_slice: int) -> AsyncIterator[bytes]:
    """A body's bytes as sent (chunk framing included), at most ``max_slice`` at a time."""
    try:
        if framing.kind == "length":
            left = framing.length or 0
            while left:
                data = await reader.read(min(left, max_slice))
                if not data:
                    raise ProtocolError(f"the body ended {left} bytes short of its Content-Length")
                left -= len(data)
                yield data
        elif framing.kind == "close":
            while data := await reader.read(max_slice):
                yield data
        elif framing.kind == "chunked":
            async for data in _chunked(reader, max_slice):
                yield data
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        raise ProtocolError("the connection closed in the middle of a chunked body") from None


async def _chunked(reader: asyncio.StreamReader, max_slice: int) -> AsyncIterator[bytes]:
    while True:
        line = await reader.readuntil(b"\r\n")
        digits = line.split(b";", 1)[0].strip()
        if not digits or len(digits) > 16 or digits.strip(b"0123456789abcdefABCDEF"):
            raise ProtocolError(f"bad chunk size line {line[:40]!r}")
        size = int(digits, 16)
        yield line
        if size == 0:
            while True:  # trailer fields, then the blank line
                trailer = await reader.readuntil(b"\r\n")
                yield trailer
                if trailer == b"\r\n":
                    return
        while size:
            data = await reader.read(min(size, max_slice))
            if not data:
                raise ProtocolError("the connection closed in the middle of a chunk")
            size -= len(data)
            yield data
        yield await reader.readexactly(2)
