"""An emulated network link in front of an S3-protocol endpoint: bandwidth, latency and faults.

``tc netem`` needs root and a network namespace; this is an HTTP proxy on 127.0.0.1 that
clients use as their S3 endpoint. It caps the bandwidth of every response body together (one
token bucket), holds each response until its time to first byte, and injects seeded S3 faults
(503 SlowDown, 500 InternalError, a reset, a truncated or a stalled body)::

    from cubelake.linkemu import FaultSpec, LinkEmulator, LinkSpec
    from cubelake.storage import Store

    with LinkEmulator("http://127.0.0.1:9000", link=LinkSpec.preset("500mbps"),
                      faults=FaultSpec(rate=0.05, kinds="503,500,reset"), seed=1) as link:
        store = Store("s3://bucket/lake", {"endpoint_url": link.endpoint})
        ...
        print(link.stats.faults)

Layers: ``spec`` (typed specs, parsing) and ``policy`` (token bucket, seeded decisions) are
pure; ``_http`` (HTTP/1.1 through h11) and ``_proxy`` do the socket I/O; ``emulator`` runs it on a
thread. It depends only on ``cubelake.errors`` and h11.
"""

from __future__ import annotations

from .emulator import LinkEmulator
from .policy import TokenBucket, decide_fault
from .spec import (
    DEFAULT_TTFB_MS,
    PRESETS,
    FaultKind,
    FaultSpec,
    LinkSpec,
    LinkStats,
    parse_fault_mix,
    parse_link,
    parse_rate_mbps,
)

__all__ = [
    "DEFAULT_TTFB_MS",
    "PRESETS",
    "FaultKind",
    "FaultSpec",
    "LinkEmulator",
    "LinkSpec",
    "LinkStats",
    "TokenBucket",
    "decide_fault",
    "parse_fault_mix",
    "parse_link",
    "parse_rate_mbps",
]
