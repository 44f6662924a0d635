"""What a link does to requests: typed specs and the parsers that build them (pure, no I/O).

A :class:`LinkSpec` is the shaping (a bandwidth cap in Mbit/s shared by every connection, a
time to first byte, seeded jitter); a :class:`FaultSpec` is the fault injection (a rate, a
weighted mix of :class:`FaultKind`, which methods it applies to). ``parse_*`` turn user text
(``"500mbps"``, ``"503,500:2,reset"``) into canonical values or raise :class:`ConfigError`
naming what was received and what is accepted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, TypeAlias, cast

from cubelake.errors import ConfigError

__all__ = [
    "DEFAULT_TTFB_MS",
    "PRESETS",
    "FaultKind",
    "FaultMix",
    "FaultMixLike",
    "FaultSpec",
    "LinkSpec",
    "LinkStats",
    "parse_fault_mix",
    "parse_link",
    "parse_rate_mbps",
]

DEFAULT_TTFB_MS = 40.0
#: named links (Mbit/s; ``None`` is no cap): the article's three object-store links, and no shaping
PRESETS: Mapping[str, float | None] = {"1gbps": 1000.0, "500mbps": 500.0, "200mbps": 200.0, "none": None}
_MAX_TTFB_MS = 60_000.0
_UNITS = {"bps": 1e-6, "kbps": 1e-3, "mbps": 1.0, "gbps": 1e3, "kbit": 1e-3, "mbit": 1.0, "gbit": 1e3}
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-z/]+)\s*$")


class FaultKind(StrEnum):
    """A fault the link can inject into one request."""

    SLOWDOWN = "503"  # 503 SlowDown with an S3 XML body and Retry-After; the upstream never sees the request
    INTERNAL = "500"  # 500 InternalError with an S3 XML body; the upstream never sees the request
    RESET = "reset"  # the connection is reset (TCP RST) halfway through the response body
    TRUNCATE = "truncate"  # Content-Length promised, half the body sent, then the connection closes
    STALL = "stall"  # half the body, then nothing for FaultSpec.stall_s, then the rest


_KIND_ALIASES = {"slowdown": FaultKind.SLOWDOWN, "internal": FaultKind.INTERNAL,
                 "internalerror": FaultKind.INTERNAL, "rst": FaultKind.RESET, "truncated": FaultKind.TRUNCATE}

FaultMix: TypeAlias = tuple[tuple[FaultKind, float], ...]
#: ``"503,500:2"``, ``["503", "reset"]`` or ``{"503": 1, "reset": 0.5}``: kinds with relative weights
FaultMixLike: TypeAlias = str | Sequence[FaultKind | str] | Mapping[FaultKind | str, float]


def parse_rate_mbps(text: str) -> float | None:
    """A link rate in Mbit/s from a preset name or ``<number><unit>`` (``"300mbps"``, ``"1.5gbps"``); ``None`` = no cap."""
    key = text.strip().lower()
    if key in PRESETS:
        return PRESETS[key]
    m = _RATE.match(key.replace("bit/s", "bit").replace("b/s", "bps"))
    if m is None or m.group(2) not in _UNITS:
        raise ConfigError(f"{text!r}: not a link preset or rate; use one of {', '.join(PRESETS)}, or a rate such as "
                          "300mbps, 2.5gbps or 800kbps (bits per second)")
    mbps = float(m.group(1)) * _UNITS[m.group(2)]
    if not 0 < mbps < 1e6:
        raise ConfigError(f"{text!r}: a link rate must be above 0 and below 1000 gbps")
    return mbps


def _parse_kind(text: str) -> FaultKind:
    key = text.strip().lower()
    try:
        return FaultKind(key)
    except ValueError:
        if key in _KIND_ALIASES:
            return _KIND_ALIASES[key]
    raise ConfigError(f"{text!r}: not a fault kind; use {', '.join(k.value for k in FaultKind)} "
                      "(a weight may follow a colon: 503:3)")


def _weight(kind: str, raw: object) -> float:
    try:
        w = float(cast(float, raw))
    except (TypeError, ValueError):
        raise ConfigError(f"fault {kind}: weight {raw!r} is not a number") from None
    if not (math.isfinite(w) and w > 0):
        raise ConfigError(f"fault {kind}: weight {raw!r} must be a positive number")
    return w


def parse_fault_mix(kinds: FaultMixLike) -> FaultMix:
    """Fault kinds with relative weights, canonical: one entry per kind, in the order first given."""
    pairs: list[tuple[FaultKind, float]] = []
    if isinstance(kinds, str):
        for part in (p.strip() for p in kinds.split(",")):
            if part:
                name, _, raw = part.partition(":")
                pairs.append((_parse_kind(name), _weight(name, raw) if raw else 1.0))
    elif isinstance(kinds, Mapping):
        pairs = [(_parse_kind(str(k)), _weight(str(k), w)) for k, w in kinds.items()]
    else:
        pairs = [(_parse_kind(str(k)), 1.0) for k in kinds]
    merged: dict[FaultKind, float] = {}
    for kind, weight in pairs:
        merged[kind] = merged.get(kind, 0.0) + weight
    if not merged:
        raise ConfigError(f"{kinds!r}: no fault kinds; name at least one of {', '.join(k.value for k in FaultKind)}")
    return tuple(merged.items())


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """Shaping of a link: bandwidth shared by every connection, and time to first byte.

    ``rate_mbps``: megabits per second for all response bodies together (``None``: no cap).
    ``ttfb_ms``: no response starts sooner than this after its request arrived (the upstream's
    own time counts within it). ``jitter_ms``: each request's TTFB is drawn uniformly from
    ``ttfb_ms ± jitter_ms`` (seeded). ``cap_uploads``: request bodies get a cap of the same
    rate in the other direction (a full-duplex link). ``burst_ms``: how far ahead of the rate
    the link may send after an idle moment (a few ms keeps 1 Gbit/s accurate despite timer
    granularity).
    """

    rate_mbps: float | None = None
    ttfb_ms: float = 0.0
    jitter_ms: float = 0.0
    cap_uploads: bool = False
    burst_ms: float = 4.0

    def __post_init__(self) -> None:
        if self.rate_mbps is not None and not (math.isfinite(self.rate_mbps) and self.rate_mbps > 0):
            raise ConfigError(f"rate_mbps={self.rate_mbps!r}: a link rate must be a positive number (or None: no cap)")
        for name in ("ttfb_ms", "jitter_ms"):
            v = getattr(self, name)
            if not (math.isfinite(v) and 0 <= v <= _MAX_TTFB_MS):
                raise ConfigError(f"{name}={v!r}: must be between 0 and {_MAX_TTFB_MS:.0f} ms")
        if not (math.isfinite(self.burst_ms) and 0 < self.burst_ms <= 1000):
            raise ConfigError(f"burst_ms={self.burst_ms!r}: must be above 0 and at most 1000 ms")

    @property
    def bytes_per_s(self) -> float | None:
        """The cap in bytes per second (``None``: no cap)."""
        return None if self.rate_mbps is None else self.rate_mbps * 125_000.0

    @property
    def shaped(self) -> bool:
        return self.rate_mbps is not None or self.ttfb_ms > 0 or self.jitter_ms > 0

    @classmethod
    def preset(cls, name: str, ttfb_ms: float | None = None, jitter_ms: float = 0.0,
               cap_uploads: bool = False) -> LinkSpec:
        """A named link (``1gbps``, ``500mbps``, ``200mbps``, ``none``) or a rate such as ``300mbps``.

        ``ttfb_ms`` defaults to 40 ms for a capped link and 0 for ``none`` (no shaping at all).
        """
        rate = parse_rate_mbps(name)
        ttfb = ttfb_ms if ttfb_ms is not None else (0.0 if rate is None else DEFAULT_TTFB_MS)
        return cls(rate_mbps=rate, ttfb_ms=ttfb, jitter_ms=jitter_ms, cap_uploads=cap_uploads)

    def describe(self) -> str:
        """One line for logs and the CLI, e.g. ``500 Mbit/s, TTFB 40 ms``."""
        if not self.shaped:
            return "no shaping"
        rate = "no bandwidth cap" if self.rate_mbps is None else (
            f"{self.rate_mbps / 1000:g} Gbit/s" if self.rate_mbps >= 1000 else f"{self.rate_mbps:g} Mbit/s")
        if self.rate_mbps is not None and self.cap_uploads:
            rate += " each way"
        jitter = f" ± {self.jitter_ms:g}" if self.jitter_ms else ""
        return f"{rate}, TTFB {self.ttfb_ms:g}{jitter} ms"


def parse_link(preset: str, ttfb_ms: float | None = None, jitter_ms: float = 0.0, cap_uploads: bool = False) -> LinkSpec:
    """:meth:`LinkSpec.preset` under the ``parse_*`` name the CLI uses."""
    return LinkSpec.preset(preset, ttfb_ms=ttfb_ms, jitter_ms=jitter_ms, cap_uploads=cap_uploads)


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """Seeded fault injection: each eligible request fails with probability ``rate``.

    ``kinds``: which faults, with relative weights (``"503,500"``, ``{"503": 3, "reset": 1}``);
    normalised to a :data:`FaultMix`. ``methods``: ``"GET"`` (default: reads only) or ``"all"``.
    ``retry_after_s``: the ``Retry-After`` header of a 503. ``stall_s``: how long a stalled
    body stops (the default outlasts any sensible client timeout; a short one is a hiccup).
    ``first``: draw faults only among the first ``first`` eligible requests (a burst when a client
    starts, e.g. a cold bucket throttling; with ``rate=1.0`` exactly those requests fail).
    """

    rate: float = 0.0
    kinds: FaultMixLike = "503,500"
    methods: Literal["GET", "all"] = "GET"
    retry_after_s: int = 1
    stall_s: float = 600.0
    first: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and 0.0 <= self.rate <= 1.0):
            raise ConfigError(f"fault rate {self.rate!r}: must be between 0 and 1 (0.05 = 5% of requests)")
        object.__setattr__(self, "kinds", parse_fault_mix(self.kinds))
        if self.methods not in ("GET", "all"):
            raise ConfigError(f"methods={self.methods!r}: use 'GET' (faults on reads only) or 'all'")
        if not (isinstance(self.retry_after_s, int) and 0 <= self.retry_after_s <= 3600):
            raise ConfigError(f"retry_after_s={self.retry_after_s!r}: must be a whole number of seconds, 0 to 3600")
        if not (math.isfinite(self.stall_s) and 0 <= self.stall_s <= 86_400):
            raise ConfigError(f"stall_s={self.stall_s!r}: must be between 0 and 86400 s")
        if self.first is not None and not (isinstance(self.first, int) and self.first >= 0):
            raise ConfigError(f"first={self.first!r}: must be a whole number of requests, 0 or more")

    @property
    def mix(self) -> FaultMix:
        """The kinds and weights, canonical."""
        return cast(FaultMix, self.kinds)

    def applies_to(self, method: str, eligible_before: int = 0) -> bool:
        """Whether a request of this method, after ``eligible_before`` eligible ones, can draw a fault."""
        if self.first is not None and eligible_before >= self.first:
            return False
        return self.rate > 0 and (self.methods == "all" or method.upper() == "GET")

    def describe(self) -> str:
        if self.rate <= 0:
            return "no faults"
        total = sum(w for _, w in self.mix)
        kinds = ", ".join(k.value if len(self.mix) == 1 else f"{k.value} {w / total:.0%}" for k, w in self.mix)
        scope = "GET requests" if self.methods == "GET" else "requests"
        scope = scope if self.first is None else f"the first {self.first} {scope}"
        return f"faults on {self.rate * 100:.4g}% of {scope} ({kinds})"


@dataclass(frozen=True, slots=True)
class LinkStats:
    """What a link has done so far: requests, bytes each way, faults injected by kind."""

    requests: int = 0
    bytes_sent: int = 0  # to clients: response heads and bodies
    bytes_received: int = 0  # from clients: request heads and bodies
    faults: Mapping[str, int] = field(default_factory=lambda: {k.value: 0 for k in FaultKind})  # by FaultKind value
    upstream_errors: int = 0  # requests answered 502 because the upstream failed

    @property
    def faults_total(self) -> int:
        return sum(self.faults.values())

    def to_dict(self) -> dict[str, object]:
        return {"requests": self.requests, "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
                "faults": dict(self.faults), "faults_total": self.faults_total,
                "upstream_errors": self.upstream_errors}
