"""The link's decisions, as pure functions of the specs, a seed and a counter (no sockets, no clock).

Seeded choices (a request's TTFB jitter, whether and how it fails) are drawn from a hash of
``(seed, purpose, request index)``, not from a shared random stream: the n-th request gets
the same outcome whatever other requests did meanwhile, so a run is reproducible as far as the
order of requests is.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from xml.sax.saxutils import escape

from .spec import FaultKind, FaultSpec, LinkSpec

__all__ = ["ErrorResponse", "TokenBucket", "bucket_for", "cut_point", "decide_fault", "error_response", "slice_bytes", "ttfb_s", "unit_draw"]

_MIN_SLICE, _MAX_SLICE = 1024, 64 * 1024
_SLICE_S = 0.002  # a slice is at most ~2 ms of the link's time: pacing stays smooth at any rate


def unit_draw(seed: int, purpose: str, index: int) -> float:
    """A number in ``[0, 1)`` fixed by ``(seed, purpose, index)``."""
    digest = hashlib.blake2b(f"{seed}:{purpose}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def ttfb_s(link: LinkSpec, seed: int, index: int) -> float:
    """The time to first byte of request ``index`` in seconds: ``ttfb_ms ± jitter_ms``, never negative."""
    if not link.jitter_ms:
        return link.ttfb_ms / 1000.0
    offset = (2.0 * unit_draw(seed, "ttfb", index) - 1.0) * link.jitter_ms
    return max(0.0, link.ttfb_ms + offset) / 1000.0


def decide_fault(faults: FaultSpec, seed: int, index: int) -> FaultKind | None:
    """The fault of the ``index``-th eligible request (``None``: it goes through), by weight."""
    if faults.rate <= 0 or unit_draw(seed, "fault", index) >= faults.rate:
        return None
    mix = faults.mix
    point = unit_draw(seed, "kind", index) * sum(w for _, w in mix)
    for kind, weight in mix:
        point -= weight
        if point < 0:
            return kind
    return mix[-1][0]


def slice_bytes(bytes_per_s: float | None) -> int:
    """How many bytes a body is forwarded in at a time: ~2 ms of the link, 1 to 64 KiB."""
    if bytes_per_s is None:
        return _MAX_SLICE
    return int(min(_MAX_SLICE, max(_MIN_SLICE, bytes_per_s * _SLICE_S)))


def cut_point(content_length: int | None, first_slice: int) -> int:
    """Where a reset, truncated or stalled body stops: halfway through it (a body of unknown
    length, chunked or ended by closing, halfway through its first slice)."""
    if content_length is not None:
        return content_length // 2
    return max(1, first_slice // 2)


@dataclass
class TokenBucket:
    """A shared byte budget refilled at ``rate`` bytes/s, holding at most ``burst`` bytes.

    :meth:`reserve` takes the bytes at once (the balance may go negative: later takers queue
    behind) and says how long to wait before sending them, so concurrent senders share the
    rate in the order they asked, and a late timer does not lose throughput (up to ``burst``).
    """

    rate: float
    burst: float
    tokens: float
    stamp: float

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> TokenBucket:
        return cls(rate=rate, burst=burst, tokens=burst, stamp=now)

    def reserve(self, n: int, now: float) -> float:
        """Take ``n`` bytes at time ``now`` (seconds); the seconds to wait before sending them."""
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
        self.tokens -= n
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


def bucket_for(link: LinkSpec, now: float, slice_n: int) -> TokenBucket | None:
    """The bucket of a link's cap (``None``: uncapped); it holds at least one slice."""
    rate = link.bytes_per_s
    if rate is None:
        return None
    return TokenBucket.full(rate, max(float(slice_n), rate * link.burst_ms / 1000.0), now)


_ERRORS = {
    FaultKind.SLOWDOWN: (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    FaultKind.INTERNAL: (500, "Internal Server Error", "InternalError",
                         "We encountered an internal error. Please try again."),
}


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """An injected S3 error: status, reason, header fields (framing aside) and the XML body."""

    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]
    body: bytes


def error_response(kind: FaultKind, resource: str, request_id: str, retry_after_s: int) -> ErrorResponse:
    """The response of an injected S3 error (``503 SlowDown`` or ``500 InternalError``)."""
    status, reason, code, message = _ERRORS[kind]
    body = ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message><Resource>{escape(resource)}</Resource>"
            f"<RequestId>{request_id}</RequestId></Error>").encode()
    headers = [("Content-Type", "application/xml"), ("x-amz-request-id", request_id), ("Server", "cubelake-linkemu")]
    if kind is FaultKind.SLOWDOWN:
        headers.append(("Retry-After", str(retry_after_s)))
    return ErrorResponse(status, reason, tuple(headers), body)
