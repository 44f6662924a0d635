"""An epoch's sample table: the sampler's windows, limited to an area, staged by a curriculum, balanced by
region, with a loss weight per sample. Pure (numpy, shapely, pyproj), no I/O.

Order of the steps, each optional:

1. the :class:`~cubelake.loaders.samplers.Sampler` gives every scene's windows (built once, or per epoch
   for samplers that draw anew);
2. :func:`~cubelake.loaders.samplers.restrict` keeps the windows in the area of interest;
3. a :class:`~cubelake.loaders.samplers.Curriculum` keeps the core scenes' windows in stage 1;
4. :class:`RegionBalance`: samples are binned by the geohash cell of their centre, hot cells are
   downsampled for the epoch with ``p = 1 / (1 + log1p(n_cell))`` (or a given function), seeded by
   ``(seed, epoch)``, and every kept sample gets ``weight = 1 + alpha * (1 - n_cell / max n_cell)``.

``PlanSpec(shard_by="geohash")`` shards by the geohash of the *chunk* holding each window's centre
(:func:`chunk_cells`, full precision): all windows centred in one chunk go to one rank, so two ranks
share a chunk only where a window straddles a chunk border; cells of a window's own centre would cut
chunks wherever a cell border crosses one. The planner gives ranks whole cells of
``geohash_precision`` characters, and cuts one at a chunk border only where whole cells cannot balance. Every step is a function of ``(seed, epoch)``,
so all ranks and workers build the same table without talking, and a resumed epoch is the same epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from . import geo
from .plan import COL, ROW, SCENE, SampleTable
from .samplers import Curriculum, Region, Sampler, SceneView, WindowRule, restrict

__all__ = ["CHUNK_PRECISION", "EpochTable", "RegionBalance", "TableBuilder", "centre_labels", "chunk_cells"]

CHUNK_PRECISION = 12  # geohash characters naming a chunk's centre (~4 cm): one cell per chunk in practice


@dataclass(frozen=True, slots=True)
class RegionBalance:
    """Balance regions: downsample hot geohash cells each epoch and weight sparse ones in the loss.

    ``precision``: geohash characters (6 = cells of ~1.2 x 0.6 km). ``downsample``: keep each sample with
    its cell's probability (default ``1 / (1 + log1p(n))``, or ``keep(counts) -> probabilities``).
    ``alpha``: the loss-weight strength (0 = every weight 1).
    """

    precision: int = 6
    downsample: bool = True
    keep: Callable[[np.ndarray], np.ndarray] | None = None
    alpha: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.precision <= 12:
            raise ValueError(f"geohash precision is 1..12 characters, got {self.precision}")
        if not (self.alpha >= 0 and np.isfinite(self.alpha)):
            raise ValueError(f"alpha must be a finite number >= 0, got {self.alpha}")


@dataclass(slots=True)
class EpochTable:
    """The samples one epoch serves (all shards), each with its loss ``weight`` and geohash ``cells``
    (``None`` when nothing needed them); ``regions`` = cell names with samples before/after downsampling."""

    table: SampleTable
    weight: np.ndarray
    cells: np.ndarray | None = None
    stage: int = 2
    regions: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # (cell names, before, after)

    def region_counts(self) -> dict[str, tuple[int, int]]:
        """``{cell: (samples before, samples kept)}`` of the epoch (empty without region balance)."""
        if self.regions is None:
            return {}
        names, before, after = self.regions
        return {str(n): (int(b), int(a)) for n, b, a in zip(names, before, after, strict=True)}


def centre_labels(table: SampleTable, labels: Sequence[np.ndarray | None]) -> np.ndarray:
    """The class of each window's centre pixel (``-1`` outside the raster or without labels)."""
    out = np.full(len(table), -1, np.int64)
    for i, lab in enumerate(labels):
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


def chunk_cells(table: SampleTable, scenes: Sequence[SceneView], georefs: Sequence[geo.Georef | None],
                precision: int) -> np.ndarray:
    """The geohash cell of the centre of the chunk that holds each window's centre pixel."""
    rows = np.empty_like(table.rows)
    rows[:, SCENE] = table.rows[:, SCENE]
    for sc in scenes:
        m = table.rows[:, SCENE] == sc.index
        g = sc.grid
        for ax, col, n, step in ((0, ROW, g.height, g.chunk_y), (1, COL, g.width, g.chunk_x)):
            start = np.clip(table.rows[m, col] + table.size[ax] // 2, 0, n - 1) // step * step
            rows[m, col] = start + (np.minimum(step, n - start) - 1) // 2
    return geo.sample_cells(SampleTable((1, 1), rows, table.labels), georefs, precision)


@dataclass
class TableBuilder:
    """Builds :class:`EpochTable` s for a dataset's scenes (cached: the last epoch, and the base table when
    the sampler does not change it per epoch)."""

    sampler: Sampler
    scenes: Sequence[SceneView]
    scene_ids: Sequence[str]
    georefs: Sequence[geo.Georef | None]
    seed: int = 0
    centre_labels: bool = False
    regions: Sequence[Region | None] | None = None
    window_rule: WindowRule = "center"
    curriculum: Curriculum | None = None
    balance: RegionBalance | None = None
    shard_by_geohash: bool = False  # the planner shards by the cells of the chunks (PlanSpec(shard_by="geohash"))
    _base: SampleTable | None = field(default=None, repr=False)
    _last: tuple[int, EpochTable] | None = field(default=None, repr=False)

    def base(self, epoch: int) -> SampleTable:
        """The sampler's windows, limited to the area."""
        if self._base is not None and not self.sampler.per_epoch:
            return self._base
        tables = []
        for sc in self.scenes:
            t = self.sampler.windows(sc, epoch, self.seed)
            region = self.regions[sc.index] if self.regions is not None else None
            if self.regions is not None:
                t = restrict(t, sc.grid, region, self.window_rule) if region is not None else t.take(np.zeros(0, np.int64))
            tables.append(t)
        table = SampleTable.concat(self.sampler.size, tables)
        if self.centre_labels:
            table.labels = centre_labels(table, [sc.labels for sc in self.scenes])
        if not self.sampler.per_epoch:
            self._base = table
        return table

    def epoch(self, epoch: int) -> EpochTable:
        if self._last is not None and self._last[0] == epoch:
            return self._last[1]
        table = self.base(epoch)
        stage = 2
        if self.curriculum is not None:
            stage = self.curriculum.stage(epoch)
            table = self.curriculum.filter(table, self.scene_ids, epoch)
        out = self._balanced(table, epoch)
        out.stage = stage
        self._last = (epoch, out)
        return out

    def _balanced(self, table: SampleTable, epoch: int) -> EpochTable:
        weight = np.ones(len(table), np.float32)
        bal = self.balance
        if bal is None:
            cells = chunk_cells(table, self.scenes, self.georefs, CHUNK_PRECISION) if self.shard_by_geohash else None
            return EpochTable(table, weight, cells)
        cells = geo.sample_cells(table, self.georefs, bal.precision)
        names, counts, inverse = geo.cell_counts(cells)
        keep = np.ones(len(table), bool)
        if bal.downsample:
            rng = np.random.default_rng([self.seed, epoch, 7])
            keep = geo.downsample(inverse, geo.keep_probability(counts, bal.keep), rng)
        if bal.alpha > 0:
            weight = geo.loss_weights(counts, inverse, bal.alpha).astype(np.float32)
        after = np.bincount(inverse[keep], minlength=names.size)
        idx = np.flatnonzero(keep)
        table, weight = table.take(idx), weight[idx]
        shard = chunk_cells(table, self.scenes, self.georefs, CHUNK_PRECISION) if self.shard_by_geohash else None
        return EpochTable(table, weight, shard, regions=(names, counts, after))
