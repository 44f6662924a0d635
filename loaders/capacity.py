"""Will training stall on this link, and what should change? The capacity arithmetic, pure.

The model (the seed article's, made explicit): a batch of ``k`` samples needs ``D·k`` bytes from
storage (``D``: bytes fetched per sample, read amplification included). ``c`` range requests of
``s`` bytes in flight over a link of ``B`` bytes/s and time-to-first-byte ``r`` move

    X(c) = min(B, c·s / (r + s/B))                bytes/s

so fetching a batch takes ``D·k / X(c)`` and decoding it ``D·k / R_dec`` (the decode threads'
rate on fetched bytes). Fetch and decode run ahead of the consumer (prefetch), so a batch is
ready every ``T_d = max(D·k/X(c), D·k/R_dec)``; with compute ``T_c`` per batch the consumer is
busy at most ``U = T_c / max(T_c, T_d)`` of the time (stall ``1 − U``), and the link suffices
when ``B·8 ≥ 8·D·k / T_c`` (the seed's ``B/8 ≥ D·k/T_c`` with ``B`` in bits/s).

An epoch also starts empty: the first batch waits ``T_fill = r + F/X(c) + F/R_dec`` for the
``F`` bytes of the chunks it needs (with a chunk-local shuffle, every chunk of the first round),
while the link would otherwise idle. Over ``n`` batches the epoch takes
``max(n·T_d + T_c, T_fill + n·T_c)``: the supply's pace, or the consumer's after the fill.

The reader's threads each fetch a request and then decode it, so a thread decoding is not
fetching. With ``decode_threads`` set (the workload measured on that reader), the rate of ``c``
such threads is found by mean-value analysis of a closed queueing network: each thread cycles
through the link (a shared server, ``s/B`` a request) and a delay ``r + s/R₁`` (the first byte,
then its own decode at the per-thread rate ``R₁``); for ``n = 1…c``: ``R(n) = (s/B)·(1 + Q(n−1))``,
``X(n) = n / (r + s/R₁ + R(n))``, ``Q(n) = X(n)·R(n)``, and ``T_d = D·k / (s·X(c))``. It is
exact for this model, approaches ``B`` as ``c`` grows, and is below the bound above near the knee,
where the bench found the bound 20–45 % optimistic.

What to change follows from which term is the largest: compute (nothing stalls), decode CPU
(more decode threads or a cheaper codec), link bandwidth (a faster link, fewer bytes per
sample, or accept the stall) or latency (more requests in flight, or larger requests).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Link", "Prediction", "Workload", "fetch_rate", "pipeline_rate", "predict", "requests_to_fill"]

_FILL = 0.95  # "the link is full" when in-flight requests carry this share of it


@dataclass(frozen=True, slots=True)
class Link:
    """A network path to the store: bandwidth in bits/s and time to first byte of a request."""

    bandwidth_bps: float
    ttfb_s: float

    def __post_init__(self) -> None:
        if not (self.bandwidth_bps > 0 and math.isfinite(self.bandwidth_bps)):
            raise ValueError(f"link bandwidth must be a positive number of bits/s, not {self.bandwidth_bps}")
        if not (self.ttfb_s >= 0 and math.isfinite(self.ttfb_s)):
            raise ValueError(f"time to first byte must be >= 0 s, not {self.ttfb_s}")

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_bps / 8


@dataclass(frozen=True, slots=True)
class Workload:
    """What training asks of the link, per batch (measured by a short local epoch, or given)."""

    bytes_per_sample: float  # D: bytes fetched from storage per sample served
    batch_size: int  # k
    request_bytes: float  # s: bytes per (coalesced) range request
    decode_bytes_per_s: float  # R_dec: fetched bytes the decode threads get through per second
    compute_s: float  # T_c: the model's time per batch
    first_batch_bytes: float = 0.0  # F: bytes fetched before the first batch can be cut (0: not modelled)
    epoch_batches: int = 0  # n: batches in an epoch (0: steady state only)
    decode_threads: int = 0  # threads R_dec was measured on, each fetching then decoding (0: separate pipelines)

    def __post_init__(self) -> None:
        for name in ("bytes_per_sample", "request_bytes", "decode_bytes_per_s", "compute_s"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a positive number, not {v}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {self.batch_size}")
        if (not (self.first_batch_bytes >= 0 and math.isfinite(self.first_batch_bytes)) or self.epoch_batches < 0
                or self.decode_threads < 0):
            raise ValueError(f"first_batch_bytes, epoch_batches and decode_threads must be >= 0, not "
                             f"{self.first_batch_bytes}, {self.epoch_batches}, {self.decode_threads}")

    @property
    def batch_bytes(self) -> float:
        return self.bytes_per_sample * self.batch_size


@dataclass(frozen=True, slots=True)
class Prediction:
    """What the planner predicts for one link, workload and concurrency, and what it recommends."""

    concurrency: int
    fetch_bytes_per_s: float  # X(c)
    fetch_s: float  # per batch
    decode_s: float  # per batch
    load_s: float  # T_d
    compute_s: float  # T_c
    samples_per_s: float
    utilisation: float  # T_c / max(T_c, T_d)
    stall_fraction: float
    required_bps: float  # 8·D·k/T_c: the link rate at which compute is never starved
    bandwidth_ok: bool
    binding: str  # "compute", "decode", "bandwidth" or "latency"
    recommended_concurrency: int
    recommended_prefetch: int  # batches
    recommended_cache_bytes: int
    explanation: str
    fill_s: float = 0.0  # T_fill: the first batch's wait for its chunks
    epoch_s: float = 0.0  # an epoch of epoch_batches, fill included (0: not asked)
    epoch_samples_per_s: float = 0.0  # over that epoch (the steady rate when not asked)
    epoch_stall_fraction: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fetch_rate(link: Link, request_bytes: float, concurrency: int) -> float:
    """``X(c)``: bytes/s that ``concurrency`` requests of ``request_bytes`` move over ``link``."""
    per_request_s = link.ttfb_s + request_bytes / link.bytes_per_s
    return min(link.bytes_per_s, concurrency * request_bytes / per_request_s)


def pipeline_rate(link: Link, request_bytes: float, concurrency: int, decode_s: float) -> float:
    """Bytes/s that ``concurrency`` threads move when each fetches a request and then spends ``decode_s``
    decoding it: exact mean-value analysis of that closed network (module docstring)."""
    service = request_bytes / link.bytes_per_s
    delay = link.ttfb_s + decode_s
    queued = rate = 0.0
    for n in range(1, max(1, concurrency) + 1):
        response = service * (1 + queued)
        rate = n / (delay + response)
        queued = rate * response
    return rate * request_bytes


def requests_to_fill(link: Link, request_bytes: float) -> int:
    """The fewest requests in flight that carry 95 % of the link: ``0.95·(1 + r·B/s)``, rounded up."""
    return max(1, math.ceil(_FILL * (1 + link.ttfb_s * link.bytes_per_s / request_bytes)))


def predict(link: Link, work: Workload, concurrency: int, cache_budget_bytes: float | None = None) -> Prediction:
    """Predict samples/s and stall for ``concurrency`` requests in flight, and recommend settings."""
    x = _rate(link, work, concurrency)
    fetch_s = work.batch_bytes / x
    decode_s = work.batch_bytes / work.decode_bytes_per_s
    load_s = max(fetch_s, decode_s)
    period = max(work.compute_s, load_s)
    required = 8 * work.batch_bytes / work.compute_s
    binding = _binding(link, work, x, fetch_s, decode_s)
    c_rec = requests_to_fill(link, work.request_bytes) if not work.decode_threads else _threads_to_fill(link, work)
    if cache_budget_bytes is not None:  # in-flight requests are held in the cache budget: at most half of it
        c_rec = max(1, min(c_rec, int(cache_budget_bytes / 2 // work.request_bytes)))
    prefetch = min(16, max(2, math.ceil(load_s / work.compute_s) + 1))
    cache = int(c_rec * work.request_bytes + (prefetch + 1) * work.batch_bytes)
    fill_s, epoch_s, epoch_sps, epoch_stall = _epoch(link, work, x, load_s)
    explanation = _explain(binding, link, work, x, c_rec, required)
    if epoch_s and fill_s > 0.02 * epoch_s and binding == "compute":
        explanation += (f"; but the first batch waits {fill_s:.1f} s for its chunks ({fill_s / epoch_s:.0%} of the "
                        "epoch): fewer chunks per round (PlanSpec.chunks_per_round) shorten that wait")
    return Prediction(concurrency, x, fetch_s, decode_s, load_s, work.compute_s, work.batch_size / period,
                      work.compute_s / period, 1 - work.compute_s / period, required, link.bandwidth_bps >= required,
                      binding, c_rec, prefetch, cache, explanation, fill_s, epoch_s, epoch_sps, epoch_stall)


def _rate(link: Link, work: Workload, concurrency: int) -> float:
    """``X(c)``, or with ``decode_threads`` the rate of ``c`` threads that fetch and decode in turn."""
    if not work.decode_threads:
        return fetch_rate(link, work.request_bytes, concurrency)
    per_request = work.request_bytes * work.decode_threads / work.decode_bytes_per_s  # one thread's decode
    return pipeline_rate(link, work.request_bytes, concurrency, per_request)


def _threads_to_fill(link: Link, work: Workload, most: int = 64) -> int:
    """The fewest fetching-and-decoding threads that keep 95 % of the link busy (at most ``most``)."""
    return next((c for c in range(1, most + 1) if _rate(link, work, c) >= _FILL * link.bytes_per_s), most)


def _epoch(link: Link, work: Workload, x: float, load_s: float) -> tuple[float, float, float, float]:
    """``(T_fill, epoch s, epoch samples/s, epoch stall)``; without an epoch length, the steady state."""
    f = work.first_batch_bytes
    fill_s = link.ttfb_s + f / x + f / work.decode_bytes_per_s if f > 0 else 0.0
    n, tc = work.epoch_batches, work.compute_s
    if n == 0:
        period = max(tc, load_s)
        return fill_s, 0.0, work.batch_size / period, 1 - tc / period
    epoch_s = max(n * load_s + tc, fill_s + n * tc)
    return fill_s, epoch_s, n * work.batch_size / epoch_s, max(0.0, 1 - n * tc / epoch_s)


def _binding(link: Link, work: Workload, x: float, fetch_s: float, decode_s: float) -> str:
    if work.compute_s >= max(fetch_s, decode_s):
        return "compute"
    if decode_s >= fetch_s:
        return "decode"
    return "bandwidth" if x >= _FILL * link.bytes_per_s else "latency"


def _explain(binding: str, link: Link, work: Workload, x: float, c_rec: int, required_bps: float) -> str:
    mbps = 1e6
    if binding == "compute":
        return (f"compute-bound: the model takes {work.compute_s * 1000:.0f} ms per batch and the data arrive "
                f"sooner, so the consumer never waits (the link needs {required_bps / mbps:.0f} of its "
                f"{link.bandwidth_bps / mbps:.0f} Mbit/s)")
    if binding == "decode":
        return (f"decode-bound: decoding a batch takes longer than the model; add decode threads (ReaderConfig."
                f"threads) or store with a cheaper codec ({work.decode_bytes_per_s / 2**20:.0f} MiB/s now)")
    if binding == "bandwidth":
        return (f"bandwidth-bound: the model would take {required_bps / mbps:.0f} Mbit/s and the link carries "
                f"{link.bandwidth_bps / mbps:.0f}; fetch fewer bytes per sample (larger stride, fewer bands, "
                "a cached epoch) or train on a faster link")
    return (f"latency-bound: {x * 8 / mbps:.0f} of {link.bandwidth_bps / mbps:.0f} Mbit/s used because too few "
            f"requests are in flight for a {link.ttfb_s * 1000:.0f} ms time to first byte; keep {c_rec} in flight "
            f"(ReaderConfig.threads) or make requests larger (ReaderConfig.group, larger chunks)")
