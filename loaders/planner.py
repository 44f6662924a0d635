"""The capacity planner's measurements: a short run of the loader, and a probe of the link to the store.

:func:`plan_capacity` answers "will training stall on this link, and what should change?" for a
:class:`~cubelake.loaders.CubeDataset`: it serves a few batches to measure what the workload
asks of storage (bytes per sample, request size, decode rate), probes the link to the products'
store (time to first byte, bandwidth) unless one is given, and hands both to the arithmetic in
:mod:`.capacity`.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from typing import TYPE_CHECKING

import numpy as np

from cubelake.errors import CubelakeError
from cubelake.storage import S3Options, Store, object_at

from .capacity import Link, Prediction, Workload, predict
from .metrics import LoaderMetrics

if TYPE_CHECKING:
    from .dataset import CubeDataset

__all__ = ["measure_workload", "plan_capacity", "probe_link", "workload_from_metrics"]

log = logging.getLogger(__name__)


def workload_from_metrics(m: LoaderMetrics, compute_s: float, decode_threads: int) -> Workload:
    """What a measured run asked of storage, per sample and per request, and how fast it decoded.

    ``decode_s`` sums the decode threads' time, so their joint rate is ``threads`` times bytes/time.
    """
    if m.samples == 0 or m.batches == 0 or m.requests == 0 or m.bytes_fetched == 0:
        raise CubelakeError("the measured run fetched nothing from storage (all chunks cached, or no samples); "
                            "measure with an empty cache and at least one batch")
    decode_rate = m.bytes_fetched * max(1, decode_threads) / max(m.decode_s, 1e-9)
    return Workload(bytes_per_sample=m.bytes_fetched / m.samples, batch_size=max(1, round(m.samples / m.batches)),
                    request_bytes=m.bytes_fetched / m.requests, decode_bytes_per_s=decode_rate, compute_s=compute_s,
                    decode_threads=max(1, decode_threads))


def measure_workload(ds: CubeDataset, compute_s: float, batches: int = 16) -> tuple[Workload, LoaderMetrics]:
    """Serve up to ``batches`` batches of epoch 0 and measure what they asked of storage.

    The first batches also fetch chunks prefetched for later ones, so bytes per sample are taken
    over the whole epoch instead: the epoch plan's decoded bytes per sample (each chunk decoded
    once) times the measured ratio of fetched to decoded bytes (the codec's), which prefetching
    does not bias.
    """
    ds.set_epoch(0)
    served = 0
    for _ in ds:
        served += 1
        if served >= batches:
            break
    m = ds.metrics()
    log.info("measured %d batches: %d samples, %d requests, %d bytes fetched", served, m.samples, m.requests,
             m.bytes_fetched)
    work = workload_from_metrics(m, compute_s, ds.reader_config.threads)
    plan = ds.plan(0)
    if m.bytes_decoded > 0 and len(plan.order) > 0:
        ratio = m.bytes_fetched / m.bytes_decoded  # fetched per decoded byte: the codec's
        sizes = np.array([ds.sources[int(s)].chunk_nbytes for s, _ in plan.chunks], dtype=np.float64)
        k = ds.plan_spec.batch_size
        work = dataclasses.replace(work, bytes_per_sample=float(sizes.sum()) * ratio / len(plan.order),
                                   first_batch_bytes=float(sizes[plan.first_use < k].sum()) * ratio,
                                   epoch_batches=-(-len(plan.order) // k))
    return work, m


def probe_link(url: str, options: S3Options | None = None, *, repeats: int = 5, probe_bytes: int = 16 * 1024 * 1024,
               streams: int = 4) -> Link:
    """Time to first byte (median of ``repeats`` 1-byte reads) and bandwidth of the link to the object at ``url``.

    Bandwidth is the slope between two reads of ``streams`` concurrent ranges, small (64 KiB each) and
    large (``probe_bytes`` in all): what a request costs whatever its size (the first byte's wait, the
    server's own work per GET, which a whole-object-reading server such as moto makes large) cancels,
    and what is left is what each further byte costs.
    """
    store, key = object_at(url, options)
    size = store.head(key).size
    if size == 0:
        raise CubelakeError(f"{url}: an empty object cannot measure a link; probe a product's data object")
    r = statistics.median(_timed_ranges(store, key, 1, 1) for _ in range(max(1, repeats)))
    n = max(1, min(streams, size // 2))
    small = min(64 * 1024, max(1, size // (2 * n)))
    large = max(small + 1, min(size, probe_bytes) // n)
    t_small = min(_timed_ranges(store, key, n, small) for _ in range(2))
    t_large = _timed_ranges(store, key, n, large)
    extra = n * (large - small)
    bandwidth = 8 * extra / max(t_large - t_small, 1e-6)
    log.info("%s: time to first byte %.1f ms, %.0f Mbit/s (%d streams: %d bytes in %.3f s, %d in %.3f s)", url,
             r * 1000, bandwidth / 1e6, n, n * small, t_small, n * large, t_large)
    return Link(bandwidth_bps=bandwidth, ttfb_s=r)


def _timed_ranges(store: Store, key: str, streams: int, part: int) -> float:
    """Seconds to read ``streams`` concurrent ranges of ``part`` bytes (spread over the object's start)."""
    starts = [i * part for i in range(streams)]
    t0 = time.perf_counter()
    store.get_ranges(key, starts, [s + part for s in starts])
    return time.perf_counter() - t0


def _probe_url(ds: CubeDataset) -> str:
    """An object of the dataset's first scene that holds chunk data (the probe reads ranges of it)."""
    src = ds.sources[0]
    for cy in range(src.grid.n_rows):
        for cx in range(src.grid.n_cols):
            pieces = src.pieces(cy, cx)
            if pieces:
                return pieces[0].url
    raise CubelakeError(f"{src.url}: no stored chunk to probe the link with")


def plan_capacity(ds: CubeDataset, *, compute_s: float, link: Link | None = None, batches: int = 16,
                  storage_options: S3Options | None = None) -> tuple[Prediction, Workload, Link]:
    """Predict samples/s and stall for ``ds`` on ``link`` (probed from its store when not given)."""
    work, _ = measure_workload(ds, compute_s, batches)
    if link is None:
        link = probe_link(_probe_url(ds), storage_options or ds.sources[0].storage_options)
    cfg = ds.reader_config
    return predict(link, work, concurrency=max(1, cfg.threads), cache_budget_bytes=cfg.cache_bytes), work, link
