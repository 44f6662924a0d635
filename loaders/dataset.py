"""The PyTorch side: an ``IterableDataset`` that executes the epoch plan and yields ready batches.

Batches are formed inside the dataset (use ``DataLoader(ds, batch_size=None, ...)``) because
which samples go together is the plan's business: a batch is cut from chunks that are resident
together. Each worker process, and each DDP rank, plans its own disjoint share of the chunks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from cubelake.storage import S3Options, check_fork_safe

from .cache import DiskCache
from .metrics import LoaderMetrics
from .plan import (
    COL,
    ROW,
    SCENE,
    Edge,
    EpochPlan,
    PlanSpec,
    SampleTable,
    batch_count,
    label_windows,
    plan_epoch,
    random_windows,
    sliding_windows,
)
from .reader import ChunkReader, ReaderConfig
from .sources import ChunkSource, ProductError, ProductLike, open_sources
from .spectral import Projection, Spectral, band_stats, fit_pca, select_bands

__all__ = ["CubeDataset", "Sampling"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Sampling:
    """Which windows an epoch serves.

    ``mode``: ``"sliding"`` (every ``stride`` pixels over the valid chunks), ``"labels"``
    (centred on each pixel whose label is not ``ignore_label``), ``"random"`` (``count`` windows
    per scene, new positions every epoch). ``edge``: ``"drop"`` windows reaching past the raster,
    or ``"pad"`` them with ``Spectral.fill``. ``labels``: ``"center"`` (class of the centre
    pixel), ``"dense"`` (the window's label patch, ``-1`` outside the raster) or ``"none"``.
    ``min_valid``: drop a sample when less than this fraction of its pixels is valid (not nodata,
    inside the raster), counted in ``LoaderMetrics.invalid_samples``; chunk-level validity (an
    all-nodata chunk Zarr did not store) is applied when planning, this is the pixel-level rest.
    """

    mode: Literal["sliding", "labels", "random"] = "sliding"
    size: int | tuple[int, int] = 32
    stride: int | tuple[int, int] | None = None
    edge: Edge = "drop"
    count: int = 1024
    ignore_label: int = 0
    labels: Literal["center", "dense", "none"] = "center"
    min_valid: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in ("sliding", "labels", "random"):
            raise ValueError(f"sampling mode must be 'sliding', 'labels' or 'random', got {self.mode!r}")
        if self.edge not in ("drop", "pad"):
            raise ValueError(f"edge must be 'drop' or 'pad', got {self.edge!r}")
        if self.labels not in ("center", "dense", "none"):
            raise ValueError(f"labels must be 'center', 'dense' or 'none', got {self.labels!r}")
        if not 0.0 <= self.min_valid <= 1.0:
            raise ValueError(f"min_valid is a fraction of the window's pixels (0..1), got {self.min_valid}")

    @property
    def window(self) -> tuple[int, int]:
        return (self.size, self.size) if isinstance(self.size, int) else (int(self.size[0]), int(self.size[1]))

    @property
    def step(self) -> tuple[int, int]:
        s = self.stride if self.stride is not None else self.size
        return (s, s) if isinstance(s, int) else (int(s[0]), int(s[1]))


def _delivery_position(nbatches: Sequence[int], worker: int, j: int) -> int:
    """Where a DataLoader delivers batch ``j`` of ``worker`` among all its workers' batches.

    With an ``IterableDataset`` the DataLoader takes batches from its workers in turn, skipping
    workers that are done: ``sum_v min(j, n_v) + #{v < worker : n_v > j}``.
    """
    return sum(min(j, nv) for nv in nbatches) + sum(1 for v in range(worker) if nbatches[v] > j)


def _delivery_skip(nbatches: Sequence[int], worker: int, batches_done: int) -> int:
    """How many of ``worker``'s batches were among the first ``batches_done`` delivered."""
    skip = 0
    while skip < nbatches[worker] and _delivery_position(nbatches, worker, skip) < batches_done:
        skip += 1
    return skip


class BufferPool:
    """Batch-sized arrays reused once nothing else refers to them.

    A fresh 32 MiB array per batch is a fresh ``mmap`` from the allocator, and faulting its pages
    in took about as long as cutting the batch. An array handed out in a tensor comes back when
    the consumer drops the tensor (its reference count falls back to the pool's own).
    """

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._free: list[np.ndarray] = []

    def get(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        for a in self._free:
            # 3 = the pool's list, the loop variable and getrefcount's argument: nobody else holds it
            if a.shape == shape and a.dtype == dtype and sys.getrefcount(a) <= 3:
                return a
        a = np.empty(shape, dtype)
        self._free.append(a)
        if len(self._free) > self.size:
            self._free.pop(0)
        return a

    def __getstate__(self) -> dict[str, Any]:
        return {"size": self.size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.size, self._free = state["size"], []


class CubeDataset(IterableDataset[dict[str, Any]]):
    """Batches of windows cut from hyperspectral products, planned so each chunk is decoded once per epoch.

    ``products``: lake scene folders, catalog search hits (with ``lake=``), STAC items, ``.zarr`` stores, refs or
    COGs (local or ``s3://``). Yields dicts: ``image`` ``(batch, band, h, w)`` float tensor,
    ``label`` (``(batch,)`` or ``(batch, h, w)`` int64, ``-1`` = none), ``scene`` (ids),
    ``window`` ``(batch, 4)`` = row, col, height, width in the scene's pixels, and ``epoch``,
    ``cursor`` (the batch's position in the epoch, for :meth:`state_dict`).
    """

    def __init__(self, products: Sequence[ProductLike] | Iterable[ProductLike], *, sampling: Sampling | None = None,
                 spectral: Spectral | None = None, plan: PlanSpec | None = None, reader: ReaderConfig | None = None,
                 prefetch: int = 8, prefetch_batches: int = 2, disk_cache: str | Path | None = None, rank: int | None = None,
                 world_size: int | None = None, storage_options: S3Options | None = None,
                 prefer: Sequence[str] = ("zarr", "refs", "cog"), labels: Sequence[str | Path | None] | None = None,
                 stats_chunks: int = 4, lake: str | Path | None = None) -> None:
        super().__init__()
        self.sampling = sampling or Sampling()
        self.spectral = spectral or Spectral()
        self.plan_spec = plan or PlanSpec()
        self.reader_config = reader or ReaderConfig()
        self.prefetch = max(0, int(prefetch))
        self.prefetch_batches = max(0, int(prefetch_batches))
        self.disk_cache = str(disk_cache) if disk_cache is not None else None
        prods = list(products)
        if not prods:
            raise ProductError("no products given to the loader (an empty catalog search?)")
        label_paths = list(labels) if labels is not None else [None] * len(prods)
        self.sources: list[ChunkSource] = [
            open_sources([p], storage_options=storage_options, prefer=prefer, labels=lp, lake=lake)[0]
            for p, lp in zip(prods, label_paths, strict=True)]
        self.grids = [s.grid for s in self.sources]
        self._rank, self._world = rank, world_size
        self._bands = [select_bands(s.wavelengths_nm, self.spectral.wavelength_ranges_nm, s.url) for s in self.sources]
        counts = {s.scene_id: (s.n_bands if b is None else b.size) for s, b in zip(self.sources, self._bands, strict=True)}
        if len(set(counts.values())) > 1:
            raise ProductError(f"scenes give different band counts after selection ({counts}); a batch needs one "
                               "band axis: select a wavelength range every scene covers with the same bands")
        self.n_bands = next(iter(counts.values()))
        self._labels = self._load_labels()
        self._norm = self._normalisation(stats_chunks)
        self._affine_params = self._affine()
        self._buffers = BufferPool()
        self._table_cache: tuple[int, SampleTable] | None = None
        self._table_fixed = self._build_table(0) if self.sampling.mode != "random" else None
        self._epoch_base = 0
        self._iters = 0
        self._resume: dict[str, Any] | None = None
        self._reader: ChunkReader | None = None
        self._last_metrics: LoaderMetrics | None = None
        self._live_metrics: LoaderMetrics | None = None
        self._consumer: dict[int, tuple[float, float]] = {}
        self._metrics_dir = tempfile.mkdtemp(prefix="cubelake-loader-metrics-")
        self._finalizer = weakref.finalize(self, shutil.rmtree, self._metrics_dir, True)

    # -- set-up -------------------------------------------------------------------------------------

    def _load_labels(self) -> list[np.ndarray | None]:
        need = self.sampling.mode == "labels" or self.sampling.labels != "none"
        out = [s.labels() if need else None for s in self.sources]
        if self.sampling.mode == "labels":
            missing = [s.scene_id for s, lab in zip(self.sources, out, strict=True) if lab is None]
            if missing:
                raise ProductError(f"sampling mode 'labels' needs a label raster, and scenes {missing} have none; "
                                   "ingest with --labels, or pass labels=[...] on each scene's grid")
        return out

    def _normalisation(self, stats_chunks: int) -> list[tuple[np.ndarray, np.ndarray] | None]:
        if self.spectral.normalize == "none":
            return [None] * len(self.sources)
        stats = []
        for i, s in enumerate(self.sources):
            st = s.stats
            if st is None or not np.isfinite(st["mean"]).all() or not np.isfinite(st["std"]).all():
                st = self._compute_stats(i, stats_chunks)
                s.stats = st
            b = self._bands[i]
            m, sd = (st["mean"], st["std"]) if b is None else (st["mean"][b], st["std"][b])
            stats.append((np.nan_to_num(m), np.where(np.isfinite(sd) & (sd > 0), sd, 1.0)))
        if self.spectral.normalize == "global":
            n = np.array([s.grid.height * s.grid.width for s in self.sources], float)[:, None]
            means = np.stack([m for m, _ in stats])
            var = np.stack([sd**2 for _, sd in stats])
            gm = (n * means).sum(0) / n.sum()
            gv = (n * (var + (means - gm) ** 2)).sum(0) / n.sum()
            stats = [(gm, np.sqrt(np.where(gv > 0, gv, 1.0)))] * len(self.sources)
        return [(m.astype(np.float32), sd.astype(np.float32)) for m, sd in stats]

    def _compute_stats(self, i: int, n_chunks: int) -> dict[str, np.ndarray]:
        """Per-band physical mean/std from up to ``n_chunks`` stored chunks spread over the scene."""
        src = self.sources[i]
        valid = src.valid_chunks()
        ids = np.flatnonzero(valid.ravel()) if valid is not None else np.arange(src.grid.n_chunks)
        if ids.size == 0:
            raise ProductError(f"{src.url}: no stored chunk to compute band statistics from (the scene is all nodata)")
        pick = ids[np.linspace(0, ids.size - 1, min(n_chunks, ids.size)).round().astype(int)]
        reader = ChunkReader([src], replace(self.reader_config, strict=True), LoaderMetrics())
        try:
            reader.request([(0, int(k)) for k in pick])
            vals = []
            for k in pick:
                a = reader.get((0, int(k)))
                assert a is not None  # strict mode raises instead
                vals.append(a.reshape(a.shape[0], -1))
        finally:
            reader.close()
        raw = np.concatenate(vals, axis=1)
        ok = np.ones(raw.shape, bool) if src.fill_value is None else ~self._is_fill(raw, src.fill_value)
        phys = raw.astype(np.float64) * src.scale + src.add_offset
        log.info("%s: band statistics computed from %d chunks (none recorded at ingest)", src.url, len(pick))
        return band_stats(phys, ok & np.isfinite(phys))

    @staticmethod
    def _is_fill(raw: np.ndarray, fill: float) -> np.ndarray:
        return np.isnan(raw) if np.isnan(fill) else raw == np.asarray(fill).astype(raw.dtype)

    def _build_table(self, epoch: int) -> SampleTable:
        sm = self.sampling
        size = sm.window
        tables = []
        for i, s in enumerate(self.sources):
            g = s.grid
            if sm.mode == "sliding":
                tables.append(sliding_windows(i, g, size, sm.step, sm.edge, s.valid_chunks()))
            elif sm.mode == "random":
                rng = np.random.default_rng([self.plan_spec.seed, epoch, i, 1])
                tables.append(random_windows(i, g, size, sm.count, rng, s.valid_chunks()))
            else:
                lab = self._labels[i]
                assert lab is not None
                r, c = np.nonzero(lab != sm.ignore_label)
                tables.append(label_windows(i, g, size, r, c, lab[r, c], sm.edge))
        table = SampleTable.concat(size, tables)
        if sm.labels == "center" and sm.mode != "labels":
            table.labels = self._centre_labels(table)
        return table

    def _centre_labels(self, table: SampleTable) -> np.ndarray:
        out = np.full(len(table), -1, np.int64)
        for i, lab in enumerate(self._labels):
            if lab is None:
                continue
            m = table.rows[:, SCENE] == i
            r = table.rows[m, ROW] + table.size[0] // 2
            c = table.rows[m, COL] + table.size[1] // 2
            inside = (r >= 0) & (r < lab.shape[0]) & (c >= 0) & (c < lab.shape[1])
            vals = np.full(r.size, -1, np.int64)
            vals[inside] = lab[r[inside], c[inside]]
            out[m] = vals
        return out

    def table(self, epoch: int = 0) -> SampleTable:
        """The epoch's samples (fixed for sliding/label sampling, drawn anew per epoch for random)."""
        if self._table_fixed is not None:
            return self._table_fixed
        if self._table_cache is None or self._table_cache[0] != epoch:
            self._table_cache = (epoch, self._build_table(epoch))
        return self._table_cache[1]

    # -- epochs and state ---------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (for non-persistent workers; persistent ones count on)."""
        self._epoch_base, self._iters = int(epoch), 0

    def _shard(self) -> tuple[int, int, int, int]:
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        rank, world = self._rank, self._world
        if rank is None or world is None:
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
            else:
                rank, world = 0, 1
        return rank, world, wid, nw

    def plan(self, epoch: int = 0, *, rank: int = 0, world_size: int = 1, worker: int = 0,
             num_workers: int = 1) -> EpochPlan:
        """The plan one shard executes in ``epoch`` (pure; for inspection and tests)."""
        return plan_epoch(self.grids, self.table(epoch), self.plan_spec, epoch, rank=rank, world_size=world_size,
                          worker=worker, num_workers=num_workers)

    def state_dict(self, last_batch: dict[str, Any] | None = None) -> dict[str, Any]:
        """Where to resume: after ``last_batch`` (the last batch the training loop consumed)."""
        if last_batch is None:
            return {"seed": self.plan_spec.seed, "epoch": self._epoch_base + self._iters, "batches_done": 0,
                    "num_workers": None}
        return {"seed": self.plan_spec.seed, "epoch": int(last_batch["epoch"]),
                "batches_done": int(last_batch["cursor"]) + 1, "num_workers": int(last_batch["num_workers"]),
                "world_size": int(last_batch["world_size"])}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume mid-epoch: the next iteration serves exactly the samples not yet consumed.

        Call before the DataLoader starts its workers, with the same ``num_workers`` and world size.
        """
        if int(state["seed"]) != self.plan_spec.seed:
            raise ValueError(f"state was saved with seed {state['seed']}, this dataset has seed {self.plan_spec.seed}")
        self._epoch_base, self._iters = int(state["epoch"]), 0
        self._resume = dict(state) if int(state.get("batches_done") or 0) > 0 else None

    # -- iteration ----------------------------------------------------------------------------------

    def _get_reader(self, metrics: LoaderMetrics) -> ChunkReader:
        if self._reader is not None and self._reader.pid != os.getpid():
            self._reader = None  # forked into a DataLoader worker: the parent's threads did not come along
        if self._reader is None:
            disk = DiskCache(self.disk_cache) if self.disk_cache else None
            self._reader = ChunkReader(self.sources, self.reader_config, metrics, disk)
        self._reader.new_epoch(metrics)
        return self._reader

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None  # threads and caches stay in their process
        state["_finalizer"] = None
        return state

    def __iter__(self) -> Iterator[dict[str, Any]]:
        rank, world, wid, nw = self._shard()
        if get_worker_info() is not None:
            for s in self.sources:
                if s.url.startswith("s3://") or s.storage_options:
                    check_fork_safe(s.url)
        epoch = self._epoch_base + self._iters
        self._iters += 1
        skip = 0
        resume = self._resume
        self._resume = None
        plan = plan_epoch(self.grids, self.table(epoch), self.plan_spec, epoch, rank=rank, world_size=world,
                          worker=wid, num_workers=nw)
        need = plan.stats.get("peak_resident", 0) * max(s.chunk_nbytes for s in self.sources)
        if need > self.reader_config.cache_bytes:
            log.warning("epoch %d needs up to %d chunks (%.0f MiB) resident to decode each once; cache_bytes is "
                        "%.0f MiB, so some chunks will be decoded again (raise cache_bytes, lower chunks_per_round "
                        "or scenes_in_flight, or use order='local')", epoch, plan.stats["peak_resident"],
                        need / 2**20, self.reader_config.cache_bytes / 2**20)
        bs = self.plan_spec.batch_size
        sizes = plan.worker_sizes
        nbatches = [batch_count(n, bs, self.plan_spec.drop_last) for n in sizes]
        if resume is not None:
            if int(resume["num_workers"]) != nw or int(resume.get("world_size", world)) != world:
                raise ValueError(f"state was saved with {resume['num_workers']} workers x {resume.get('world_size')} "
                                 f"ranks; resume with the same (now {nw} x {world})")
            skip = _delivery_skip(nbatches, wid, int(resume["batches_done"]))
        gen = self._run(plan, epoch, skip, nbatches, wid, nw, world)
        if get_worker_info() is None and self.prefetch_batches > 0:
            return self._background(gen)
        return gen

    def _background(self, gen: Generator[dict[str, Any], None, None]) -> Iterator[dict[str, Any]]:
        """Run ``gen`` in a thread, ``prefetch_batches`` ahead, so the training loop does not cut its own batches.

        Without worker processes this is what keeps the consumer from stalling: cutting and
        converting a batch is numpy work that releases the GIL while the model runs.
        """
        q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=self.prefetch_batches)
        stop = threading.Event()

        def produce() -> None:
            try:
                for item in gen:
                    while not stop.is_set():
                        try:
                            q.put(("batch", item), timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        break
                q.put(("end", None))
            except BaseException as e:  # handed to the consumer, which raises it
                q.put(("error", e))
            finally:
                gen.close()

        t = threading.Thread(target=produce, name="cubelake-batches", daemon=True)
        t_start = time.perf_counter()
        t.start()
        waited = 0.0
        try:
            while True:
                t0 = time.perf_counter()
                kind, item = q.get()
                waited += time.perf_counter() - t0
                if kind == "end":
                    break
                if kind == "error":
                    raise item
                m = self._live_metrics
                if m is not None:
                    m.wait_s, m.wall_s = waited, time.perf_counter() - t_start
                yield item
        finally:
            stop.set()
            while t.is_alive():
                with contextlib.suppress(queue.Empty):
                    q.get(timeout=0.05)
            m = self._live_metrics
            if m is not None:
                m.wait_s, m.wall_s = waited, time.perf_counter() - t_start
                m.save(Path(self._metrics_dir) / f"epoch{m.epoch}-worker0.json")

    def _run(self, plan: EpochPlan, epoch: int, skip: int, nbatches: list[int], wid: int, nw: int,
             world: int) -> Generator[dict[str, Any], None, None]:
        metrics = LoaderMetrics(epoch=epoch)
        self._live_metrics = metrics
        reader = self._get_reader(metrics)
        table = self.table(epoch)
        bs = self.plan_spec.batch_size
        n = len(plan) if not self.plan_spec.drop_last else nbatches[wid] * bs
        chunks = [(int(s), int(c)) for s, c in plan.chunks]
        by_last = np.argsort(plan.last_use, kind="stable")
        next_req = need_end = 0
        next_rel = 0
        start = skip * bs
        # chunks only the skipped samples needed are never loaded
        while next_req < len(chunks) and plan.last_use[next_req] < start:
            next_req += 1
        while next_rel < len(by_last) and plan.last_use[by_last[next_rel]] < start:
            next_rel += 1
        t_start = time.perf_counter()
        busy = 0.0
        last_save = t_start
        path = Path(self._metrics_dir) / f"epoch{epoch}-worker{wid}.json"
        for b in range(skip, nbatches[wid]):
            t0 = time.perf_counter()
            lo, hi = b * bs, min((b + 1) * bs, n)
            # chunks are in first-use order: those before need_end serve this batch
            while need_end < len(chunks) and plan.first_use[need_end] < hi:
                need_end += 1
            reader.request([chunks[k] for k in range(next_req, need_end) if plan.last_use[k] >= lo])
            next_req = max(next_req, need_end)
            # then keep up to `prefetch` chunks beyond them in flight or held (more when the adaptive reader
            # wants more requests in flight), as the budget allows
            ahead: list[tuple[int, int]] = []
            depth = max(self.prefetch, reader.chunks_ahead)
            while next_req < len(chunks) and next_req - need_end < depth and reader.has_room(chunks[next_req]):
                ahead.append(chunks[next_req])
                next_req += 1
            reader.request(ahead)
            batch = self._assemble(plan, table, lo, hi, chunks, reader, metrics)
            while next_rel < len(by_last) and plan.last_use[by_last[next_rel]] < hi:
                reader.release(chunks[by_last[next_rel]])
                next_rel += 1
            batch.update(epoch=epoch, cursor=_delivery_position(nbatches, wid, b), worker=wid, num_workers=nw, world_size=world)
            metrics.batches += 1
            now = time.perf_counter()
            busy += now - t0
            metrics.wall_s = now - t_start
            if get_worker_info() is not None:
                metrics.wait_s = metrics.chunk_wait_s
            elif self.prefetch_batches == 0:  # the caller cuts its own batches: all loader time is its wait
                metrics.wait_s = busy
            if now - last_save > 0.5:
                metrics.save(path)
                last_save = now
            yield batch
        metrics.wall_s = time.perf_counter() - t_start
        if get_worker_info() is not None:
            metrics.wait_s = metrics.chunk_wait_s
        elif self.prefetch_batches == 0:
            metrics.wait_s = busy
        metrics.save(path)
        self._last_metrics = metrics

    def _affine(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per scene: ``gain (scene, band)``, ``offset (scene, band)`` and ``fill (scene,)`` taking stored values
        to the output (CF scale/offset and normalisation folded into one multiply-add); fill NaN = none."""
        gains, offs, fills = [], [], []
        for i, src in enumerate(self.sources):
            n = self.n_bands
            g = np.full(n, src.scale, np.float64)
            o = np.full(n, src.add_offset, np.float64)
            norm = self._norm[i]
            if norm is not None:  # (x * scale + offset - mean) / std
                g, o = g / norm[1], (o - norm[0]) / norm[1]
            gains.append(g)
            offs.append(o)
            fills.append(np.nan if src.fill_value is None else src.fill_value)
        return (np.stack(gains).astype(np.float32), np.stack(offs).astype(np.float32), np.array(fills, np.float64))

    def _assemble(self, plan: EpochPlan, table: SampleTable, lo: int, hi: int, chunks: list[tuple[int, int]],
                  reader: ChunkReader, metrics: LoaderMetrics) -> dict[str, Any]:
        """Cut the batch's windows from their chunks in the stored type, then convert all at once in torch."""
        h, w = table.size
        idx = plan.order[lo:hi]
        rows = table.rows[idx]
        n = idx.size
        # windows are cast to float32 as they are copied out of the chunks: one pass, not two
        x = self._buffers.get((n, self.n_bands, h, w), np.dtype(np.float32))
        outside: np.ndarray | None = None  # (n, h, w): pixels beyond the raster (padded windows)
        keep = np.ones(n, bool)
        masked = np.zeros(n, bool)  # samples touching a chunk with nodata
        used = 0
        t_wait = metrics.chunk_wait_s
        t0 = time.perf_counter()
        for i in range(n):
            s, r, c = (int(v) for v in rows[i])
            src = self.sources[s]
            g = src.grid
            bands = self._bands[s]
            if r < 0 or c < 0 or r + h > g.height or c + w > g.width:
                if outside is None:
                    outside = np.zeros((n, h, w), bool)
                outside[i] = True
                outside[i, max(r, 0) - r:min(r + h, g.height) - r, max(c, 0) - c:min(c + w, g.width) - c] = False
                x[i] = 0
                masked[i] = True
            for cpos in plan.chunks_of(lo + i):
                key = chunks[int(cpos)]
                arr = reader.get(key)
                if arr is None:
                    keep[i] = False
                    break
                masked[i] |= reader.has_fill(key)
                cy, cx = divmod(key[1], g.n_cols)
                y0, x0 = cy * g.chunk_y, cx * g.chunk_x
                ry0, ry1 = max(r, y0, 0), min(r + h, y0 + g.chunk_y, g.height)
                rx0, rx1 = max(c, x0, 0), min(c + w, x0 + g.chunk_x, g.width)
                if ry0 >= ry1 or rx0 >= rx1:
                    continue
                part = arr[:, ry0 - y0:ry1 - y0, rx0 - x0:rx1 - x0]
                dst = x[i, :, ry0 - r:ry1 - r, rx0 - c:rx1 - c]
                dst[...] = part if bands is None else part[bands]
                used += part.nbytes if bands is None else part.nbytes // part.shape[0] * bands.size
        if not keep.all():
            x, idx, rows, masked = x[keep], idx[keep], rows[keep], masked[keep]
            outside = outside[keep] if outside is not None else None
        scenes = rows[:, SCENE]
        ok = self._fill_and_scale(x, scenes, masked, outside)
        invalid = int((~ok).sum()) if ok is not None else 0
        if invalid:
            x, idx, rows, scenes = x[ok], idx[ok], rows[ok], scenes[ok]
        proj = self.spectral.projection
        if proj is not None:
            x = proj.apply(x)
        if x.dtype != np.dtype(self.spectral.dtype):
            x = x.astype(self.spectral.dtype)
        image = torch.from_numpy(x)
        label = self._batch_labels(table, idx, rows)
        metrics.add(samples=int(idx.size), bytes_used=used, dropped_samples=int((~keep).sum()), invalid_samples=invalid,
                    assemble_s=time.perf_counter() - t0 - (metrics.chunk_wait_s - t_wait))
        window = np.column_stack([rows[:, ROW], rows[:, COL], np.full(idx.size, h), np.full(idx.size, w)])
        return {"image": image, "label": label, "scene": [self.sources[int(s)].scene_id for s in scenes],
                "window": torch.from_numpy(window.astype(np.int64))}

    def _fill_and_scale(self, x: np.ndarray, scenes: np.ndarray, masked: np.ndarray,
                        outside: np.ndarray | None) -> np.ndarray | None:
        """Scale ``x`` in place and set its nodata, NaN and outside pixels to the fill; the samples valid
        enough to keep (``None``: no ``min_valid`` check was needed)."""
        gain, off, fillv = (v[scenes] for v in self._affine_params)
        mi = np.flatnonzero(masked)
        bad: np.ndarray | None = None
        if mi.size:  # nodata, NaN and outside pixels of the samples that can have them (before scaling)
            sub = x[mi]
            bad = np.isnan(sub)
            fills = fillv[mi]
            has = np.isfinite(fills)
            if has.any():  # stored values are exact in float32 for the integer types cubelake writes
                bad |= (sub == np.where(has, fills, np.nan).astype(np.float32)[:, None, None, None])
            if outside is not None:
                bad |= outside[mi][:, None]
        if not (np.all(gain == 1.0) and np.all(off == 0.0)):
            x *= gain[:, :, None, None]
            x += off[:, :, None, None]
        if bad is None:
            return None
        sub = x[mi]
        sub[bad] = self.spectral.fill
        x[mi] = sub
        if self.sampling.min_valid <= 0:
            return None
        frac = np.ones(x.shape[0])
        frac[mi] = 1.0 - bad.mean(axis=(1, 2, 3))
        return frac >= self.sampling.min_valid

    def _batch_labels(self, table: SampleTable, idx: np.ndarray, rows: np.ndarray) -> torch.Tensor:
        if self.sampling.labels != "dense":
            return torch.from_numpy(table.labels[idx].astype(np.int64))
        h, w = table.size
        out = np.full((idx.size, h, w), -1, np.int64)
        for i in range(idx.size):
            s, r, c = (int(v) for v in rows[i])
            lab = self._labels[s]
            if lab is None:
                continue
            y0, y1 = max(r, 0), min(r + h, lab.shape[0])
            x0, x1 = max(c, 0), min(c + w, lab.shape[1])
            if y0 < y1 and x0 < x1:
                out[i, y0 - r:y1 - r, x0 - c:x1 - c] = lab[y0:y1, x0:x1]
        return torch.from_numpy(out)

    # -- metrics ------------------------------------------------------------------------------------

    def timed(self, batches: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Iterate ``batches`` (e.g. a DataLoader over this dataset), timing how long the consumer waits."""
        it = iter(batches)
        t_start = time.perf_counter()
        waited = 0.0
        epoch = None
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            waited += time.perf_counter() - t0
            epoch = int(batch["epoch"])
            self._consumer[epoch] = (waited, time.perf_counter() - t_start)
            yield batch
        if epoch is not None:
            self._consumer[epoch] = (waited, time.perf_counter() - t_start)

    def metrics(self, epoch: int | None = None) -> LoaderMetrics:
        """The epoch's counters, merged over this process's workers (latest epoch by default)."""
        import json

        files = sorted(Path(self._metrics_dir).glob("epoch*-worker*.json"))
        epochs = sorted({int(f.name[5:].split("-")[0]) for f in files})
        if not epochs and self._last_metrics is not None:
            return self._last_metrics
        if epoch is None:
            if not epochs:
                return LoaderMetrics()
            epoch = epochs[-1]
        parts = [LoaderMetrics.from_dict(json.loads(f.read_text())) for f in files
                 if f.name.startswith(f"epoch{epoch}-")]
        merged = LoaderMetrics.merge(parts)
        merged.epoch = epoch
        if epoch in self._consumer:
            merged.wait_s, merged.wall_s = self._consumer[epoch]
        return merged

    # -- helpers ------------------------------------------------------------------------------------

    def fit_projection(self, k: int, max_batches: int = 8, pixels_per_sample: int = 16) -> Projection:
        """PCA of spectra drawn from the first ``max_batches`` batches of epoch 0 (in this process)."""
        saved = (self.spectral, self._epoch_base, self._iters)
        self.spectral = replace(self.spectral, projection=None)
        self.set_epoch(0)
        rng = np.random.default_rng(self.plan_spec.seed)
        spectra = []
        try:
            for b, batch in enumerate(self):
                x = batch["image"].float().numpy()
                flat = x.transpose(0, 2, 3, 1).reshape(-1, x.shape[1])
                pick = rng.choice(flat.shape[0], min(flat.shape[0], pixels_per_sample * x.shape[0]), replace=False)
                spectra.append(flat[pick])
                if b + 1 >= max_batches:
                    break
        finally:
            self.spectral, self._epoch_base, self._iters = saved
        return fit_pca(np.concatenate(spectra), k)

    def n_samples(self, epoch: int = 0) -> int:
        """Samples per epoch over all shards (before any equal-count trimming across ranks)."""
        return len(self.table(epoch))
