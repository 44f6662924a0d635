"""What a loader did in an epoch: samples, requests, bytes, cache behaviour, and where the time went."""

from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ["LoaderMetrics", "latency_bucket", "latency_quantile"]

#: request latency histogram: bucket i holds latencies up to 0.1 ms * 2**(i/4) (19 % wide), the last one the rest
LATENCY_BUCKETS = 96


def latency_bucket(seconds: float) -> int:
    """The histogram bucket of a request that took ``seconds``."""
    if seconds <= 1e-4:
        return 0
    return min(LATENCY_BUCKETS - 1, math.ceil(4 * math.log2(seconds / 1e-4)))


def latency_quantile(hist: list[int], q: float) -> float:
    """The ``q`` quantile (0..1) of a latency histogram, in seconds (the bucket's upper edge); 0 when empty."""
    total = sum(hist)
    if total == 0:
        return 0.0
    rank, seen = q * total, 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= rank:
            return 1e-4 * 2 ** (i / 4)
    return 1e-4 * 2 ** ((len(hist) - 1) / 4)

_ADDITIVE = ("samples", "batches", "requests", "bytes_fetched", "bytes_decoded", "bytes_used", "chunks_decoded",
             "redecodes", "cache_hits", "cache_misses", "disk_hits", "disk_misses", "failed_chunks",
             "dropped_samples", "invalid_samples", "retries", "throttled", "hedges", "hedge_wins", "fetch_s", "decode_s", "wait_s", "chunk_wait_s", "assemble_s")


@dataclass
class LoaderMetrics:
    """Counters of one epoch (of one worker, or merged over workers and ranks).

    ``bytes_fetched``: compressed bytes read from storage (coalescing gaps included).
    ``bytes_decoded``: bytes of decoded chunks. ``bytes_used``: bytes of stored pixels that ended
    up in samples. ``wait_s``: time the consumer waited for the loader; ``wall_s``: the epoch's
    wall time as the consumer saw it, so ``stall_fraction = wait_s / wall_s``. In a DataLoader
    worker the consumer is another process: there ``wait_s`` is the worker's own wait for chunks
    until :meth:`CubeDataset.timed` measures the consumer.
    """

    epoch: int = 0
    samples: int = 0
    batches: int = 0
    requests: int = 0
    bytes_fetched: int = 0
    bytes_decoded: int = 0
    bytes_used: int = 0
    chunks_decoded: int = 0
    redecodes: int = 0  # chunks decoded again in the same epoch (resident budget too small)
    cache_hits: int = 0
    cache_misses: int = 0
    disk_hits: int = 0
    disk_misses: int = 0
    failed_chunks: int = 0
    dropped_samples: int = 0  # samples of chunks that failed
    invalid_samples: int = 0  # samples below Sampling.min_valid
    retries: int = 0
    throttled: int = 0  # failed requests the store throttled (503 SlowDown, 429): backed off at least slowdown_s
    hedges: int = 0  # duplicate requests issued for slow ones (ReaderConfig.hedge_after_s)
    hedge_wins: int = 0  # duplicates that answered before the request they duplicated
    fetch_s: float = 0.0
    decode_s: float = 0.0
    wait_s: float = 0.0
    chunk_wait_s: float = 0.0  # the loader waiting for chunks to arrive and decode
    assemble_s: float = 0.0
    wall_s: float = 0.0
    stage: int = 0  # curriculum stage of the epoch (1: core scenes only, 2: all)
    shared_chunks: int = 0  # chunks a shard read that another shard also needed (summed over shards)
    regions: int = 0  # geohash cells with samples (region balance), over all shards
    region_samples_before: int = 0  # the epoch's samples before hot-region downsampling, all shards
    region_samples_after: int = 0  # ... and kept
    threads: int = 1  # fetch/decode threads of the reader (load time per batch divides their busy time)
    inflight_peak: int = 0  # most storage requests in flight at once
    inflight_limit: int = 0  # the adaptive limit at the end (0: fixed at ``threads``)
    request_hist: list[int] = field(default_factory=lambda: [0] * LATENCY_BUCKETS)  # request latencies

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._inflight = 0

    def request_started(self) -> None:
        with self._lock:
            self._inflight += 1
            self.inflight_peak = max(self.inflight_peak, self._inflight)

    def request_done(self, seconds: float) -> None:
        with self._lock:
            self._inflight -= 1
            self.request_hist[latency_bucket(seconds)] += 1

    def add(self, **kw: float) -> None:
        with self._lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def stall_fraction(self) -> float:
        return min(1.0, self.wait_s / self.wall_s) if self.wall_s > 0 else 0.0

    def latency_ms(self, q: float) -> float:
        """The ``q`` quantile of storage request latency (time to the whole response), ms."""
        return 1000 * latency_quantile(self.request_hist, q)

    @property
    def throughput_bps(self) -> float:
        """Bits fetched from storage per second of the epoch's wall time."""
        return 8 * self.bytes_fetched / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def bytes_per_sample(self) -> float:
        """``D``: bytes fetched from storage per sample served."""
        return self.bytes_fetched / self.samples if self.samples else 0.0

    @property
    def load_s_per_batch(self) -> float:
        """``T_d``: the loader's time per batch, its slowest stage: fetch + decode over its threads, or cutting."""
        if not self.batches:
            return 0.0
        return max((self.fetch_s + self.decode_s) / max(1, self.threads), self.assemble_s) / self.batches

    @property
    def compute_s_per_batch(self) -> float:
        """``T_c``: the consumer's time per batch when not waiting for the loader (the model, with ``timed``)."""
        return max(0.0, self.wall_s - self.wait_s) / self.batches if self.batches else 0.0

    @property
    def utilisation_bound(self) -> float:
        """``T_c / max(T_c, T_d)``: the consumer's busy share the loader allows."""
        tc, td = self.compute_s_per_batch, self.load_s_per_batch
        return tc / max(tc, td) if max(tc, td) > 0 else 0.0

    @property
    def read_amplification(self) -> float:
        """Compressed bytes read per byte of stored pixels used."""
        return self.bytes_fetched / self.bytes_used if self.bytes_used else 0.0

    @property
    def decode_amplification(self) -> float:
        return self.bytes_decoded / self.bytes_used if self.bytes_used else 0.0

    @property
    def cache_hit_rate(self) -> float:
        n = self.cache_hits + self.cache_misses
        return self.cache_hits / n if n else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.update(samples_per_s=self.samples_per_s, stall_fraction=self.stall_fraction,
                 read_amplification=self.read_amplification, decode_amplification=self.decode_amplification,
                 latency_ms={"p50": self.latency_ms(0.5), "p95": self.latency_ms(0.95), "p99": self.latency_ms(0.99)},
                 throughput_bps=self.throughput_bps, bytes_per_sample=self.bytes_per_sample,
                 load_s_per_batch=self.load_s_per_batch, compute_s_per_batch=self.compute_s_per_batch,
                 utilisation_bound=self.utilisation_bound, utilisation=1 - self.stall_fraction)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LoaderMetrics:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def merge(cls, parts: list[LoaderMetrics]) -> LoaderMetrics:
        """Counters summed; wall time is the longest part's (workers run side by side)."""
        out = cls(epoch=max((p.epoch for p in parts), default=0))
        for p in parts:
            for k in _ADDITIVE:
                setattr(out, k, getattr(out, k) + getattr(p, k))
            out.wall_s = max(out.wall_s, p.wall_s)
            for k in ("stage", "regions", "region_samples_before", "region_samples_after"):  # the epoch's, not a shard's
                setattr(out, k, max(getattr(out, k), getattr(p, k)))
            out.shared_chunks += p.shared_chunks
            out.threads = max(out.threads, p.threads)
            out.inflight_limit = max(out.inflight_limit, p.inflight_limit)
            out.inflight_peak += p.inflight_peak  # workers run side by side: their peaks may coincide
            hist = p.request_hist if len(p.request_hist) == LATENCY_BUCKETS else [0] * LATENCY_BUCKETS
            out.request_hist = [a + b for a, b in zip(out.request_hist, hist, strict=True)]
        return out

    def save(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)

    def report(self) -> str:
        mb = 1024 * 1024
        return "\n".join([
            f"epoch {self.epoch}: {self.samples} samples in {self.batches} batches, {self.wall_s:.2f} s "
            f"({self.samples_per_s:,.0f} samples/s), stall {self.stall_fraction:.1%} (waited {self.wait_s:.2f} s)",
            f"  storage: {self.requests} requests, {self.bytes_fetched / mb:,.1f} MiB fetched "
            f"({self.read_amplification:.2f} per byte used), disk cache {self.disk_hits} hits / {self.disk_misses} misses",
            f"  decode: {self.chunks_decoded} chunks ({self.redecodes} again), {self.bytes_decoded / mb:,.1f} MiB decoded "
            f"({self.decode_amplification:.2f} per byte used), memory cache {self.cache_hits} hits / {self.cache_misses} misses",
            f"  time: fetch {self.fetch_s:.2f} s, decode {self.decode_s:.2f} s (thread time), waiting for chunks "
            f"{self.chunk_wait_s:.2f} s, cutting batches {self.assemble_s:.2f} s",
            f"  link: {self.throughput_bps / 1e6:,.1f} Mbit/s fetched, {self.bytes_per_sample / 1024:,.1f} KiB per sample; "
            f"request latency p50 {self.latency_ms(0.5):,.1f} / p95 {self.latency_ms(0.95):,.1f} / p99 "
            f"{self.latency_ms(0.99):,.1f} ms, up to {self.inflight_peak} in flight"
            + (f" (adaptive limit {self.inflight_limit})" if self.inflight_limit else ""),
            f"  per batch: compute T_c {self.compute_s_per_batch * 1000:,.1f} ms, load T_d {self.load_s_per_batch * 1000:,.1f} "
            f"ms: utilisation bound {self.utilisation_bound:.0%}, measured {1 - self.stall_fraction:.0%}",
            f"  errors: {self.failed_chunks} chunks failed ({self.retries} retries, {self.throttled} throttled), "
            f"{self.dropped_samples} samples dropped, {self.invalid_samples} below min_valid; {self.hedges} hedged "
            f"requests ({self.hedge_wins} won)",
            *self._geo_lines(),
        ])

    def _geo_lines(self) -> list[str]:
        lines = []
        if self.regions:
            kept = self.region_samples_after / self.region_samples_before if self.region_samples_before else 0.0
            lines.append(f"  regions: {self.regions} geohash cells, {self.region_samples_before} samples before "
                         f"downsampling, {self.region_samples_after} kept ({kept:.0%}); per cell: "
                         "ds.epoch_table(epoch).region_counts()")
        if self.stage or self.shared_chunks:
            lines.append(f"  curriculum stage {self.stage or 2}; {self.shared_chunks} chunks also needed by another shard")
        return lines
