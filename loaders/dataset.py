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

from . import geo
from .batch import BatchCutter
from .cache import DiskCache
from .epoch import EpochTable, RegionBalance, TableBuilder
from .feed import ChunkFeed
from .metrics import LoaderMetrics
from .normalise import normalisation
from .plan import Edge, EpochPlan, PlanSpec, SampleTable, batch_count, plan_epoch
from .reader import ChunkReader, ReaderConfig
from .samplers import (
    Curriculum,
    LabelSampler,
    RandomSampler,
    Region,
    Sampler,
    SceneView,
    SlidingSampler,
    WindowRule,
    region_of,
)
from .sources import ChunkSource, ProductError, ProductLike, open_aux, open_sources
from .spectral import Projection, Spectral, fit_pca, select_bands

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

    def sampler(self) -> Sampler:
        """The strategy ``mode`` names (any other :class:`~cubelake.loaders.samplers.Sampler` can be given to
        :class:`CubeDataset` as ``sampler=``)."""
        if self.mode == "sliding":
            return SlidingSampler(self.window, self.step, self.edge)
        if self.mode == "random":
            return RandomSampler.of(self.window, self.count)
        return LabelSampler(self.window, self.ignore_label, self.edge)


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


def _as_tuple(v: Any) -> tuple[Any, ...]:
    return (v,) if isinstance(v, str) else tuple(v)


def _query_text(q: Any) -> str:
    return ", ".join(f"{k}={getattr(q, k)!r}" for k in q.__dataclass_fields__ if getattr(q, k) not in (None, (), ""))


def _scene_products(prods: list[ProductLike]) -> list[ProductLike]:
    """``prods`` without the derived items (datacubes, predictions) a catalog search also finds: the loader reads scenes."""
    from cubelake.catalog.derived import is_derived_href

    derived = [p for p in prods if is_derived_href(getattr(p, "href", None))]
    if derived:
        log.info("the loader reads scenes: %d derived item(s) of the search left out (%s)", len(derived),
                 ", ".join(str(getattr(p, "id", p)) for p in derived[:5]) + (", ..." if len(derived) > 5 else ""))
    return [p for p in prods if not is_derived_href(getattr(p, "href", None))]


class CubeDataset(IterableDataset[dict[str, Any]]):
    """Batches of windows cut from hyperspectral products, planned so each chunk is decoded once per epoch.

    ``products``: lake scene folders, catalog search hits (with ``lake=``), STAC items, ``.zarr`` stores, refs or
    COGs (local or ``s3://``). Yields dicts: ``image`` ``(batch, band, h, w)`` float tensor,
    ``label`` (``(batch,)`` or ``(batch, h, w)`` int64, ``-1`` = none), ``scene`` (ids),
    ``window`` ``(batch, 4)`` = row, col, height, width in the scene's pixels, ``weight`` ``(batch,)`` float32
    (the loss weight of each sample: 1 unless ``balance`` sets ``alpha``), and ``epoch``, ``cursor`` (the
    batch's position in the epoch, for :meth:`state_dict`).

    ``sampler``: any :class:`~cubelake.loaders.samplers.Sampler` (default: the one ``sampling.mode`` names).
    ``aoi``: an area (WGS84 GeoJSON geometry or shapely) that limits every scene's windows; only chunks
    meeting it are read (``aoi_rule``: a window's ``"center"``, ``"intersects"`` or ``"within"``).
    ``curriculum``: core scenes alone for the first epochs. ``balance``: geohash-cell downsampling and
    loss weights (:class:`~cubelake.loaders.epoch.RegionBalance`). ``PlanSpec(shard_by="geohash")``
    gives ranks and workers whole geohash cells.
    """

    def __init__(self, products: Sequence[ProductLike] | Iterable[ProductLike], *, sampling: Sampling | None = None,
                 spectral: Spectral | None = None, plan: PlanSpec | None = None, reader: ReaderConfig | None = None,
                 prefetch: int = 8, prefetch_batches: int = 2, disk_cache: str | Path | None = None, rank: int | None = None,
                 world_size: int | None = None, storage_options: S3Options | None = None,
                 prefer: Sequence[str] = ("zarr", "refs", "cog"), labels: Sequence[str | Path | None] | None = None,
                 stats_chunks: int = 4, lake: str | Path | None = None, sampler: Sampler | None = None,
                 aoi: Any = None, aoi_rule: WindowRule = "center", curriculum: Curriculum | None = None,
                 balance: RegionBalance | None = None, aux: Sequence[str] = ()) -> None:
        super().__init__()
        self.sampling = sampling or Sampling()
        self.sampler = sampler or self.sampling.sampler()
        if not isinstance(self.sampler, Sampler):
            raise TypeError(f"sampler must implement the Sampler protocol (size, needs_labels, per_epoch, windows), "
                            f"got {type(self.sampler).__name__}")
        self.spectral = spectral or Spectral()
        self.plan_spec = plan or PlanSpec()
        self.reader_config = reader or ReaderConfig()
        self.prefetch = max(0, int(prefetch))
        self.prefetch_batches = max(0, int(prefetch_batches))
        self.disk_cache = str(disk_cache) if disk_cache is not None else None
        prods = _scene_products(list(products))
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
        self._norm = normalisation(self.sources, self._bands, self.spectral.normalize, self.reader_config, stats_chunks)
        self.aux = tuple(aux)
        if len(set(self.aux)) != len(self.aux):
            raise ValueError(f"aux layers named twice: {list(self.aux)}")
        # aux layers are sources on their scene's grid, read by the same reader: source n + i * len(aux) + k
        self._aux_sources = [open_aux(s, name) for s in self.sources for name in self.aux]
        self._cutter = BatchCutter(self.sources, self._bands, self.n_bands, self._norm, self.sampling, self._labels,
                                   self.aux, self._aux_sources)
        self.georefs = [geo.Georef.of(s.crs_wkt, s.transform) for s in self.sources]
        self.regions = self._regions(aoi) if aoi is not None else None
        self._tables = TableBuilder(
            self.sampler, self._scene_views(), [s.scene_id for s in self.sources], self.georefs, self.plan_spec.seed,
            centre_labels=self.sampling.labels == "center" and not self.sampler.needs_labels, regions=self.regions,
            window_rule=aoi_rule, curriculum=curriculum, balance=balance,
            shard_by_geohash=self.plan_spec.shard_by == "geohash")
        self._tables.base(0)  # fixed tables are built (and their errors raised) here, not in a worker
        self._epoch_base = 0
        self._iters = 0
        self._resume: dict[str, Any] | None = None
        self._reader: ChunkReader | None = None
        self._last_metrics: LoaderMetrics | None = None
        self._live_metrics: LoaderMetrics | None = None
        self._consumer: dict[int, tuple[float, float]] = {}
        self._metrics_dir = tempfile.mkdtemp(prefix="cubelake-loader-metrics-")
        self._finalizer = weakref.finalize(self, shutil.rmtree, self._metrics_dir, True)

    @classmethod
    def from_search(cls, lake: str | Path, query: Any = None, *, core_filters: Sequence[str] = (), core_epochs: int = 0,
                    aoi_rule: WindowRule = "center", **kwargs: Any) -> CubeDataset:
        """The scenes a catalog search finds, each limited to the search's area: one call from query to batches.

        ``query``: a :class:`cubelake.catalog.Query`, or its fields as keywords (``bbox=``, ``intersects=``,
        ``datetime=``, ``collections=``, ``filters=("eo:cloud_cover<10", "cubelake:quality>=0.8")`` ...).
        With a ``bbox`` or ``intersects``, windows outside the area are not served and chunks outside
        it are never read. ``core_filters`` + ``core_epochs``: a curriculum whose first ``core_epochs``
        epochs serve only the scenes that also match ``core_filters``. Other keywords go to the dataset.
        """
        # the catalog sits beside the loader: imported on use
        from cubelake.catalog import LakeCatalog, Query
        from cubelake.catalog.query import parse_query

        qfields = {k: kwargs.pop(k) for k in list(kwargs) if k in Query.__dataclass_fields__}
        if query is not None and qfields:
            raise TypeError(f"give a Query or its fields ({sorted(qfields)}), not both")
        q = query if query is not None else Query(**qfields)
        parsed = parse_query(q)
        core_ids: set[str] = set()
        with LakeCatalog(lake) as cat:
            hits = cat.search(parsed, scenes_only=True)
            if hits and core_filters:
                core_q = replace(q, filters=(*_as_tuple(q.filters), *core_filters))
                core_ids = {h.id for h in cat.search(parse_query(core_q), scenes_only=True)}
        if not hits:
            raise ProductError(f"the search found no scene in the catalog of {lake} ({_query_text(q)}); widen it")
        curriculum = None
        if core_filters:
            curriculum = Curriculum(core_epochs, frozenset(core_ids))
            log.info("curriculum: %d of %d scenes form the core for %d epochs", len(core_ids), len(hits), core_epochs)
        if curriculum is not None and kwargs.get("curriculum") is not None:
            raise TypeError("give core_filters or a curriculum, not both")
        kwargs["curriculum"] = curriculum if curriculum is not None else kwargs.get("curriculum")
        ds = cls(hits, lake=lake, aoi=parsed.geometry, aoi_rule=aoi_rule, **kwargs)
        if curriculum is not None:  # hits and sources are in the same order; the core is named by scene id
            core = frozenset(s.scene_id for s, h in zip(ds.sources, hits, strict=True) if h.id in core_ids)
            ds._tables.curriculum = Curriculum(core_epochs, core)
        return ds

    # -- set-up -------------------------------------------------------------------------------------

    def _load_labels(self) -> list[np.ndarray | None]:
        need = self.sampler.needs_labels or self.sampling.labels != "none"
        out = [s.labels() if need else None for s in self.sources]
        if self.sampler.needs_labels:
            missing = [s.scene_id for s, lab in zip(self.sources, out, strict=True) if lab is None]
            if missing:
                raise ProductError(f"sampling mode 'labels' needs a label raster, and scenes {missing} have none; "
                                   "ingest with --labels, or pass labels=[...] on each scene's grid")
        return out

    def _scene_views(self) -> list[SceneView]:
        return [SceneView(i, s.grid, s.valid_chunks(), self._labels[i]) for i, s in enumerate(self.sources)]

    def _regions(self, aoi: Any) -> list[Region | None]:
        """The area in each scene's pixels (``None``: the scene misses it)."""
        import shapely
        from shapely.geometry import shape

        area = aoi if isinstance(aoi, shapely.Geometry) else shape(aoi.get("geometry", aoi) if isinstance(aoi, dict) else aoi)
        out: list[Region | None] = []
        for s, g in zip(self.sources, self.georefs, strict=True):
            if g is None:
                raise ProductError(f"{s.url}: the scene has no CRS or geotransform, so an area of interest cannot be "
                                   "placed on it; leave aoi out, or use georeferenced scenes")
            region = region_of(area, s.grid, g.crs_wkt, g.transform)
            out.append(region if region.n_chunks else None)
            log.info("%s: %d of %d chunks meet the area of interest", s.scene_id, region.n_chunks, s.grid.n_chunks)
        return out

    def table(self, epoch: int = 0) -> SampleTable:
        """The epoch's samples, all shards (fixed unless the sampler draws per epoch, or regions are downsampled)."""
        return self._tables.epoch(epoch).table

    def epoch_table(self, epoch: int = 0) -> EpochTable:
        """The epoch's samples with their loss weights, geohash cells, curriculum stage and region counts."""
        return self._tables.epoch(epoch)

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
        et = self._tables.epoch(epoch)
        return plan_epoch(self.grids, et.table, self.plan_spec, epoch, rank=rank, world_size=world_size,
                          worker=worker, num_workers=num_workers, cells=et.cells)

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
            self._reader = ChunkReader(self.sources + self._aux_sources, self.reader_config, metrics, disk)
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
        et = self._tables.epoch(epoch)
        plan = plan_epoch(self.grids, et.table, self.plan_spec, epoch, rank=rank, world_size=world,
                          worker=wid, num_workers=nw, cells=et.cells)
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
        et = self._tables.epoch(epoch)
        metrics.stage, metrics.shared_chunks = et.stage, plan.shared_chunks
        if et.regions is not None:
            metrics.regions = int(et.regions[0].size)
            metrics.region_samples_before, metrics.region_samples_after = int(et.regions[1].sum()), int(et.regions[2].sum())
        bs = self.plan_spec.batch_size
        n = len(plan) if not self.plan_spec.drop_last else nbatches[wid] * bs
        feed = ChunkFeed(plan, bs, skip * bs, max(s.chunk_nbytes for s in self.sources), len(self.sources),
                         len(self.aux))
        t_start = time.perf_counter()
        busy = 0.0
        last_save = t_start
        path = Path(self._metrics_dir) / f"epoch{epoch}-worker{wid}.json"
        for b in range(skip, nbatches[wid]):
            t0 = time.perf_counter()
            lo, hi = b * bs, min((b + 1) * bs, n)
            # the batch's chunks, then up to `prefetch` beyond them (more when the adaptive reader wants more in flight)
            feed.before(lo, hi, reader, max(self.prefetch, reader.chunks_ahead))
            batch = self._cutter.cut(plan, et, lo, hi, feed.chunks, reader, metrics, self.spectral)
            feed.after(lo, hi, reader)
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
