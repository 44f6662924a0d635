"""Epoch planning: windows -> chunks -> a shuffled, chunk-ordered, sharded sample sequence. Pure, no I/O.

The loader's speed comes from here. A 32x32 window out of a 256x256x128 chunk uses 1/64 of what
decoding that chunk costs, so the plan makes every chunk's windows be served while the chunk is
decoded, once per epoch:

1. *Samples* are windows ``(scene, row, col)`` of one size (sliding, label-centred or random).
2. Each scene's chunks are *traversed* in a seeded order that keeps neighbours close in time
   (row-major along the shorter side, random orientation), so a window straddling a chunk border
   finds the chunks it needs resident. ``order="random"`` shuffles chunks fully instead.
3. Scenes are traversed ``scenes_in_flight`` at a time, their chunks interleaved at random.
4. The chunk sequence is cut into *rounds* of ``K`` chunks; a sample belongs to the round of the
   last chunk it needs, and the samples of one round are shuffled together, spread evenly across
   the round's chunks (stratified), so a batch mixes many chunks.
5. *Shards* (``world_size x num_workers``) get disjoint sets of scene strips, or of whole geohash
   cells (``shard_by="geohash"``, see :mod:`cubelake.loaders.geo`), balanced by sample count;
   every rank gets the same number of samples (the surplus is dropped, reported). A geohash
   shard's chunk sequence is the chunks its samples need, traversed as in steps 2-4.
   :func:`shard_report` sums up a split: samples and chunks per rank, chunks read by two ranks.

Randomness is reported as numbers (:func:`randomness`): distinct chunks/scenes per batch and the
lag-1 autocorrelation of sample positions, next to the same figures for a full shuffle.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from cubelake.grid import ChunkGrid

from .geo import balanced_cuts, load_ratio

__all__ = [
    "EpochPlan",
    "PlanSpec",
    "Randomness",
    "SampleTable",
    "batch_count",
    "chunk_sequence",
    "label_windows",
    "plan_epoch",
    "random_windows",
    "randomness",
    "residency",
    "shard_report",
    "sliding_windows",
    "windows_in_chunks",
]

Edge = Literal["drop", "pad"]
Order = Literal["local", "random"]
ShardBy = Literal["strips", "geohash"]

# sample table columns
SCENE, ROW, COL = 0, 1, 2


@dataclass(slots=True)
class SampleTable:
    """Windows of one size ``(size_h, size_w)``: ``rows`` of ``(scene, row, col)`` int64, and labels.

    ``row``/``col`` is the window's top-left pixel; it may be negative or reach past the raster
    when edges are padded. ``labels`` is ``-1`` where a sample has no class label.
    """

    size: tuple[int, int]
    rows: np.ndarray  # (n, 3) int64
    labels: np.ndarray  # (n,) int64

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    @classmethod
    def concat(cls, size: tuple[int, int], tables: Sequence[SampleTable]) -> SampleTable:
        if not tables:
            return cls(size, np.zeros((0, 3), np.int64), np.zeros(0, np.int64))
        return cls(size, np.concatenate([t.rows for t in tables]), np.concatenate([t.labels for t in tables]))

    def take(self, idx: np.ndarray) -> SampleTable:
        return SampleTable(self.size, self.rows[idx], self.labels[idx])


def _positions(extent: int, size: int, stride: int, edge: Edge) -> np.ndarray:
    if edge == "drop":
        return np.arange(0, extent - size + 1, stride, dtype=np.int64)
    # pad: start positions until the raster's last pixel is covered
    last = max(extent - size, 0)
    pos = np.arange(0, last + stride, stride, dtype=np.int64)
    return pos[pos < extent] if pos.size else pos


def _check_size(size: tuple[int, int], stride: tuple[int, int] | None = None) -> None:
    if min(size) <= 0:
        raise ValueError(f"window size must be positive, got {size}")
    if stride is not None and min(stride) <= 0:
        raise ValueError(f"stride must be positive, got {stride}")


def sliding_windows(scene: int, grid: ChunkGrid, size: tuple[int, int], stride: tuple[int, int], edge: Edge = "drop",
                    valid_chunks: np.ndarray | None = None) -> SampleTable:
    """Windows every ``stride`` pixels; ``edge="pad"`` adds windows reaching past the raster (padded later).

    ``valid_chunks`` (``(ny, nx)`` bool) drops windows whose every chunk holds no valid pixel.
    """
    _check_size(size, stride)
    ys = _positions(grid.height, size[0], stride[0], edge)
    xs = _positions(grid.width, size[1], stride[1], edge)
    yy, xx = np.meshgrid(ys, xs, indexing="ij")
    rows = np.stack([np.full(yy.size, scene, np.int64), yy.ravel(), xx.ravel()], axis=1)
    table = SampleTable(size, rows, np.full(yy.size, -1, np.int64))
    return _keep_valid(table, grid, valid_chunks)


def label_windows(scene: int, grid: ChunkGrid, size: tuple[int, int], label_rows: np.ndarray, label_cols: np.ndarray,
                  label_values: np.ndarray, edge: Edge = "pad") -> SampleTable:
    """Windows centred on labelled pixels (``size`` odd: the pixel is the centre; even: the centre's lower right)."""
    _check_size(size)
    r = np.asarray(label_rows, np.int64) - size[0] // 2
    c = np.asarray(label_cols, np.int64) - size[1] // 2
    lab = np.asarray(label_values, np.int64)
    if edge == "drop":
        ok = (r >= 0) & (c >= 0) & (r + size[0] <= grid.height) & (c + size[1] <= grid.width)
        r, c, lab = r[ok], c[ok], lab[ok]
    rows = np.stack([np.full(r.size, scene, np.int64), r, c], axis=1)
    return SampleTable(size, rows, lab)


def random_windows(scene: int, grid: ChunkGrid, size: tuple[int, int], count: int, rng: np.random.Generator,
                   valid_chunks: np.ndarray | None = None) -> SampleTable:
    """``count`` windows at uniform random positions inside the raster (before dropping invalid chunks)."""
    _check_size(size)
    if size[0] > grid.height or size[1] > grid.width:
        return SampleTable.concat(size, [])
    r = rng.integers(0, grid.height - size[0] + 1, count, dtype=np.int64)
    c = rng.integers(0, grid.width - size[1] + 1, count, dtype=np.int64)
    rows = np.stack([np.full(count, scene, np.int64), r, c], axis=1)
    return _keep_valid(SampleTable(size, rows, np.full(count, -1, np.int64)), grid, valid_chunks)


def _chunk_span(grid: ChunkGrid, rows: np.ndarray, size: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """First and last chunk row/col each window touches (clipped to the raster)."""
    r0 = np.clip(rows[:, ROW], 0, grid.height - 1)
    r1 = np.clip(rows[:, ROW] + size[0] - 1, 0, grid.height - 1)
    c0 = np.clip(rows[:, COL], 0, grid.width - 1)
    c1 = np.clip(rows[:, COL] + size[1] - 1, 0, grid.width - 1)
    return r0 // grid.chunk_y, r1 // grid.chunk_y, c0 // grid.chunk_x, c1 // grid.chunk_x


def windows_in_chunks(grid: ChunkGrid, rows: np.ndarray, size: tuple[int, int], mask: np.ndarray,
                      every: bool) -> np.ndarray:
    """Per window (``rows`` of a sample table), whether every (``every``) or any chunk it touches, clipped to
    the raster, is set in ``mask`` ``(n_rows, n_cols)``."""
    cy0, cy1, cx0, cx1 = _chunk_span(grid, rows, size)
    out = np.full(len(rows), every, bool)
    if len(rows) == 0:
        return out
    for dy in range(int((cy1 - cy0).max()) + 1):
        for dx in range(int((cx1 - cx0).max()) + 1):
            y, x = cy0 + dy, cx0 + dx
            inside = (y <= cy1) & (x <= cx1)
            hit = mask[np.minimum(y, grid.n_rows - 1), np.minimum(x, grid.n_cols - 1)]
            if every:
                out &= ~inside | hit
            else:
                out |= inside & hit
    return out


def _keep_valid(table: SampleTable, grid: ChunkGrid, valid_chunks: np.ndarray | None) -> SampleTable:
    if valid_chunks is None or len(table) == 0:
        return table
    if valid_chunks.shape != (grid.n_rows, grid.n_cols):
        raise ValueError(f"valid_chunks has shape {valid_chunks.shape}, the grid has {(grid.n_rows, grid.n_cols)} chunks")
    return table.take(np.flatnonzero(windows_in_chunks(grid, table.rows, table.size, valid_chunks, every=False)))


# -- traversal ----------------------------------------------------------------------------------------


def _scene_traversal(grid: ChunkGrid, rng: np.random.Generator, order: Order) -> np.ndarray:
    """Flat chunk ids (``cy * nx + cx``) of one scene in visiting order."""
    ids = np.arange(grid.n_chunks, dtype=np.int64).reshape(grid.n_rows, grid.n_cols)
    if order == "random":
        return rng.permutation(ids.ravel())
    # row-major along the shorter side keeps a straddling window's chunks at most (short side + 1) apart
    if grid.n_rows < grid.n_cols or (grid.n_rows == grid.n_cols and rng.random() < 0.5):
        ids = ids.T
    if rng.random() < 0.5:
        ids = ids[::-1]
    if rng.random() < 0.5:
        ids = ids[:, ::-1]
    return np.ascontiguousarray(ids).ravel()


def chunk_sequence(units: Sequence[tuple[int, np.ndarray]], scenes_in_flight: int, rng: np.random.Generator) -> np.ndarray:
    """Interleave per-scene chunk traversals: ``(n, 2)`` of ``(scene, flat chunk id)``.

    ``units`` are ``(scene, traversal)`` in the order scenes start; at most ``scenes_in_flight``
    are interleaved at a time, each step drawing from an active one with probability
    proportional to its remaining chunks (so they finish together).
    """
    total = sum(len(t) for _, t in units)
    out = np.empty((total, 2), np.int64)
    queue = list(units)[::-1]
    active: list[tuple[int, np.ndarray]] = []
    pos: list[int] = []
    k = 0
    while k < total:
        while queue and len(active) < max(1, scenes_in_flight):
            s, t = queue.pop()
            if len(t):
                active.append((s, t))
                pos.append(0)
        remaining = np.array([len(t) - p for (_, t), p in zip(active, pos, strict=True)], np.float64)
        # draw a run of picks at once: one rng call per chunk is the cost of a million-chunk epoch
        picks = rng.choice(len(active), size=min(int(remaining.min()), 64) or 1, p=remaining / remaining.sum())
        for i in picks:
            s, t = active[i]
            if pos[i] >= len(t):
                continue
            out[k] = (s, t[pos[i]])
            pos[i] += 1
            k += 1
        alive = [i for i in range(len(active)) if pos[i] < len(active[i][1])]
        active, pos = [active[i] for i in alive], [pos[i] for i in alive]
    return out


# -- the epoch plan ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlanSpec:
    """How an epoch is ordered and split.

    ``chunks_per_round`` (K): chunks whose samples are shuffled together (the resident set).
    ``min_chunks_per_batch``: raises K to at least this. ``scenes_in_flight``: scenes traversed
    at once. ``order``: ``"local"`` (decode each chunk once with a small resident set) or
    ``"random"`` (full chunk shuffle: more random, needs a resident set near the whole scene).
    ``shard_by``: ``"strips"`` (scenes, cut into strips of chunk rows where needed to balance) or
    ``"geohash"`` (whole geohash cells of ``geohash_precision`` characters, 1-12: a rank reads
    its own regions; :func:`plan_epoch` then needs the samples' cells).
    """

    seed: int = 0
    chunks_per_round: int = 8
    min_chunks_per_batch: int = 1
    scenes_in_flight: int = 2
    order: Order = "local"
    batch_size: int = 64
    drop_last: bool = False
    shard_by: ShardBy = "strips"
    geohash_precision: int = 6

    def __post_init__(self) -> None:
        if self.chunks_per_round < 1 or self.scenes_in_flight < 1 or self.batch_size < 1:
            raise ValueError(f"chunks_per_round, scenes_in_flight and batch_size must be >= 1: {self}")
        if self.order not in ("local", "random"):
            raise ValueError(f"order must be 'local' or 'random', got {self.order!r}")
        if self.shard_by not in ("strips", "geohash"):
            raise ValueError(f"shard_by must be 'strips' or 'geohash', got {self.shard_by!r}")
        p = self.geohash_precision
        if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 12:
            raise ValueError(f"geohash_precision must be an integer from 1 to 12 (6 is ~1.2 x 0.6 km), got {p!r}")

    @property
    def k(self) -> int:
        return max(self.chunks_per_round, self.min_chunks_per_batch)


@dataclass(slots=True)
class EpochPlan:
    """One shard's epoch: samples in serving order and the chunks they need.

    ``order``: indices into the dataset's sample table, in serving order. ``chunks``: ``(m, 2)``
    ``(scene, flat chunk id)`` in first-use order. ``first_use``/``last_use``: the serving
    position of the first and last sample needing each chunk. ``sample_chunks``: CSR
    (``indptr`` into ``indices`` of chunk positions) of every served sample's chunks.
    """

    shard: int
    num_shards: int
    order: np.ndarray
    chunks: np.ndarray
    first_use: np.ndarray
    last_use: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    worker_sizes: list[int] = field(default_factory=list)  # samples of each worker of this rank (this one included)
    dropped: int = 0  # samples left out to give every rank the same count
    shared_chunks: int = 0  # chunks this shard needs that another shard also reads (see plan_epoch)
    stats: dict[str, float] = field(default_factory=dict)
    cells: list[str] = field(default_factory=list)  # sorted cells of this shard's samples (when cells were given)

    def __len__(self) -> int:
        return int(self.order.size)

    def chunks_of(self, position: int) -> np.ndarray:
        """Positions (in ``chunks``) of the chunks the ``position``-th served sample needs."""
        return self.indices[self.indptr[position]: self.indptr[position + 1]]



class NextUse:
    """For each of a plan's chunks, the served positions that use it: the next use after a point, for the
    reader's eviction (the chunk needed last goes first)."""

    def __init__(self, plan: EpochPlan) -> None:
        counts = np.diff(plan.indptr)
        order = np.argsort(plan.indices, kind="stable")  # by chunk, each chunk's positions ascending
        self._pos = np.repeat(np.arange(counts.size), counts)[order]
        self._starts = np.searchsorted(plan.indices[order], np.arange(plan.chunks.shape[0] + 1))
        self._end = counts.size

    def after(self, chunks: np.ndarray, position: int) -> np.ndarray:
        """The first position at or after ``position`` that uses each of ``chunks`` (past the end: none)."""
        out = np.full(chunks.size, self._end, np.int64)
        for i, k in enumerate(chunks.tolist()):
            p = self._pos[self._starts[k]:self._starts[k + 1]]
            j = int(np.searchsorted(p, position))
            if j < p.size:
                out[i] = p[j]
        return out


def batch_count(samples: int, batch_size: int, drop_last: bool) -> int:
    """Batches ``samples`` make: the last partial one kept unless ``drop_last``."""
    return samples // batch_size if drop_last else -(-samples // batch_size)


def _sample_chunk_ids(grids: Sequence[ChunkGrid], table: SampleTable) -> tuple[np.ndarray, np.ndarray]:
    """CSR of every sample's global chunk keys (``scene << 32 | flat id``)."""
    n = len(table)
    if n == 0:
        return np.zeros(1, np.int64), np.zeros(0, np.int64)
    spans = np.zeros((n, 4), np.int64)
    for s in np.unique(table.rows[:, SCENE]):
        m = table.rows[:, SCENE] == s
        spans[m] = np.stack(_chunk_span(grids[int(s)], table.rows[m], table.size), axis=1)
    nx = np.array([g.n_cols for g in grids], np.int64)[table.rows[:, SCENE]]
    hy = spans[:, 1] - spans[:, 0] + 1
    wx = spans[:, 3] - spans[:, 2] + 1
    counts = hy * wx
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    sample = np.repeat(np.arange(n), counts)
    local = np.arange(indptr[-1]) - indptr[sample]
    cy = spans[sample, 0] + local // wx[sample]
    cx = spans[sample, 2] + local % wx[sample]
    keys = (table.rows[sample, SCENE] << 32) | (cy * nx[sample] + cx)
    return indptr, keys


def _strip_units(grids: Sequence[ChunkGrid], scenes: np.ndarray, counts: dict[int, np.ndarray], bins: int,
                 tolerance: float = 0.1) -> list[tuple[int, np.ndarray]]:
    """Scenes, split into strips of chunk rows until ``bins`` shards balance within ``tolerance``.

    Every split adds a seam whose straddling windows make two shards read the same chunks, so
    scenes stay whole as long as whole scenes balance.
    """
    units: list[tuple[int, np.ndarray, float]] = []
    for s in scenes:
        g = grids[int(s)]
        ids = np.arange(g.n_chunks, dtype=np.int64).reshape(g.n_rows, g.n_cols)
        ids = ids if g.n_rows >= g.n_cols else ids.T  # strips run across the shorter side
        units.append((int(s), ids, float(counts[int(s)].sum())))
    while units:
        loads = [sum(units[i][2] for i in b) for b in _lpt([u[2] for u in units], bins)]
        mean = sum(loads) / bins
        if mean == 0 or (max(loads) - min(loads)) <= tolerance * mean:
            break
        i = max(range(len(units)), key=lambda j: units[j][2])
        s, ids, _w = units[i]
        if ids.shape[0] < 2:
            break
        h = ids.shape[0] // 2
        c = counts[s]
        units[i:i + 1] = [(s, ids[:h], float(c[ids[:h]].sum())), (s, ids[h:], float(c[ids[h:]].sum()))]
    return [(s, ids) for s, ids, _ in units]


def _lpt(weights: Sequence[float], bins: int) -> list[list[int]]:
    """Longest-processing-time assignment of items to ``bins`` (balanced sums, deterministic)."""
    load = [0.0] * bins
    out: list[list[int]] = [[] for _ in range(bins)]
    for i in sorted(range(len(weights)), key=lambda j: (-weights[j], j)):
        b = min(range(bins), key=lambda j: (load[j], j))
        out[b].append(i)
        load[b] += weights[i]
    return out


def plan_epoch(grids: Sequence[ChunkGrid], table: SampleTable, spec: PlanSpec, epoch: int, *, rank: int = 0,
               world_size: int = 1, worker: int = 0, num_workers: int = 1,
               cells: np.ndarray | None = None) -> EpochPlan:
    """The epoch plan of shard ``rank * num_workers + worker``.

    Every shard computes the same global split (cheap, deterministic in ``(seed, epoch)``), so
    shards agree without talking: ranks get disjoint strips of scenes (``shard_by="strips"``) or
    whole geohash cells (``"geohash"``) balanced by sample count, then each rank's share goes to
    its workers the same way. All ranks serve the same number of samples.

    ``cells``: one cell label per table row (:func:`cubelake.loaders.geo.sample_cells`); required
    by ``shard_by="geohash"``; with ``"strips"`` it only fills :attr:`EpochPlan.cells`.
    ``EpochPlan.shared_chunks``: with strips, chunks this shard needs that another shard traverses
    (strip seams, each counted by one shard); with geohash, chunks this shard needs that samples
    of another shard's cells need too (counted by both shards).
    """
    if not (0 <= rank < world_size and 0 <= worker < num_workers):
        raise ValueError(f"rank {rank}/{world_size}, worker {worker}/{num_workers} out of range")
    labels = _check_cells(cells, len(table), spec.shard_by)
    rng = np.random.default_rng([spec.seed, epoch])
    indptr, keys = _sample_chunk_ids(grids, table)
    # a sample is served in the round of the last chunk it needs; which chunk is "last" depends on
    # the traversal, so first fix the traversal of every chunk of every scene
    n = len(table)
    scenes = np.unique(table.rows[:, SCENE]) if n else np.zeros(0, np.int64)
    rank_of: dict[int, np.ndarray] = {}
    for s in scenes:
        trav = _scene_traversal(grids[int(s)], rng, spec.order)
        r = np.empty(trav.size, np.int64)
        r[trav] = np.arange(trav.size)
        rank_of[int(s)] = r
    trig_key = _trigger_keys(indptr, keys, rank_of)
    shard = _Shard(rank, world_size, worker, num_workers)
    if spec.shard_by == "geohash" and labels is not None:  # _check_cells refused geohash without cells
        split = _split_cells(labels, indptr, keys, trig_key, scenes, rank_of, spec, rng, shard)
    else:
        split = _split_strips(grids, trig_key, scenes, rank_of, spec, rng, shard)
    order = _serving_order(split.samples, split.trig, spec.k, rng)
    # -- equal counts across ranks: every shard computes every rank's total
    target_rank = int(min(split.rank_totals))
    if spec.drop_last and world_size > 1:
        target_rank -= target_rank % spec.batch_size
    dropped = 0
    sizes = [int(t) for t in split.worker_totals]
    if world_size > 1:
        sizes = _trim(sizes, target_rank)
        dropped = int(order.size - sizes[worker])
        order = order[:sizes[worker]]
    plan = _finish(order, indptr, keys, spec, epoch, rank * num_workers + worker, world_size * num_workers, dropped,
                   split.seq_keys, split.foreign)
    plan.worker_sizes = sizes
    if labels is not None:
        plan.cells = sorted(str(c) for c in np.unique(_coarse(np.unique(labels[split.samples]), spec.geohash_precision)))
    return plan


@dataclass(frozen=True, slots=True)
class _Shard:
    rank: int
    world_size: int
    worker: int
    num_workers: int


@dataclass(slots=True)
class _Split:
    """One shard's share: its samples (ascending), their trigger chunks' positions in its chunk sequence."""

    samples: np.ndarray
    trig: np.ndarray
    seq_keys: np.ndarray
    rank_totals: list[float]  # samples of every rank
    worker_totals: list[float]  # samples of every worker of this shard's rank
    foreign: np.ndarray | None = None  # sorted chunk keys other shards' samples need (None: count strip seams)


def _check_cells(cells: np.ndarray | None, n: int, shard_by: str) -> np.ndarray | None:
    if cells is None:
        if shard_by == "geohash":
            raise ValueError("plan_epoch: PlanSpec(shard_by='geohash') needs cells=, one geohash cell per sample "
                             "table row (cubelake.loaders.geo.sample_cells(table, georefs, precision))")
        return None
    labels = np.asarray(cells)
    if labels.shape != (n,):
        raise ValueError(f"plan_epoch: cells has shape {labels.shape}, the sample table has {n} rows: pass one cell "
                         "label per row (sample_cells of this same table)")
    return labels


def _trigger_keys(indptr: np.ndarray, keys: np.ndarray, rank_of: dict[int, np.ndarray]) -> np.ndarray:
    """Each sample's trigger chunk: its chunk with the highest traversal rank."""
    scene_of = keys >> 32
    flat = keys & 0xFFFFFFFF
    key_rank = np.empty(keys.size, np.int64)
    for s, r in rank_of.items():
        m = scene_of == s
        key_rank[m] = r[flat[m]]
    return keys[_argmax_segments(key_rank, indptr)] if indptr.size > 1 else keys[:0]


def _split_strips(grids: Sequence[ChunkGrid], trig_key: np.ndarray, scenes: np.ndarray, rank_of: dict[int, np.ndarray],
                  spec: PlanSpec, rng: np.random.Generator, shard: _Shard) -> _Split:
    """Scenes (or strips of scenes) -> ranks -> workers; a shard serves the samples whose trigger chunk it traverses."""
    # samples per chunk (by trigger), per scene
    per_scene: dict[int, np.ndarray] = {}
    for s in scenes:
        m = (trig_key >> 32) == s
        per_scene[int(s)] = np.bincount(trig_key[m] & 0xFFFFFFFF, minlength=grids[int(s)].n_chunks).astype(float)
    units = _strip_units(grids, rng.permutation(scenes), per_scene, shard.world_size * shard.num_workers)
    weights = [float(per_scene[s][ids.ravel()].sum()) for s, ids in units]
    by_rank = _lpt(weights, shard.world_size)
    mine_rank = by_rank[shard.rank]
    by_worker = _lpt([weights[i] for i in mine_rank], shard.num_workers)
    mine = [units[mine_rank[i]] for i in by_worker[shard.worker]]
    # my chunk sequence: each unit traversed in the scene's order, units interleaved
    trav_units = []
    for s, ids in mine:
        chunk_ids = ids.ravel()
        trav_units.append((s, chunk_ids[np.argsort(rank_of[s][chunk_ids], kind="stable")]))
    seq = chunk_sequence(trav_units, spec.scenes_in_flight, rng)
    seq_keys = (seq[:, 0] << 32) | seq[:, 1]
    # my samples: those whose trigger chunk is mine; trig = its position in my sequence
    trig_seq = _lookup(seq_keys, trig_key)
    my_samples = np.flatnonzero(trig_seq >= 0)
    rank_totals = [sum(weights[i] for i in by_rank[r]) for r in range(shard.world_size)]
    worker_totals = [sum(weights[mine_rank[i]] for i in ws) for ws in by_worker]
    return _Split(my_samples, trig_seq[my_samples], seq_keys, rank_totals, worker_totals)


def _coarse(cells: np.ndarray, precision: int) -> np.ndarray:
    """The geohash cells of ``precision`` characters holding ``cells`` (pseudo-cells ``~...`` stay whole)."""
    c = np.asarray(cells).astype(str)
    return np.where(np.char.startswith(c, "~"), c, c.astype(f"<U{precision}"))


def _split_cells(labels: np.ndarray, indptr: np.ndarray, keys: np.ndarray, trig_key: np.ndarray, scenes: np.ndarray,
                 rank_of: dict[int, np.ndarray], spec: PlanSpec, rng: np.random.Generator, shard: _Shard) -> _Split:
    """Samples in geohash order -> contiguous runs for ranks, then for each rank's workers; a shard serves its run.

    A run is cut between whole cells of ``geohash_precision`` characters where the shards balance
    within 5 %, else between chunks (``labels`` name each sample's chunk at full precision), else
    inside a chunk (which two shards then read). Its chunk sequence is every chunk its samples need,
    each scene's in that scene's traversal order, scenes started in a seeded order and interleaved
    ``scenes_in_flight`` at a time.
    """
    n = labels.size
    z = np.argsort(labels, kind="stable")  # geohash (Z-order) order: neighbours close together
    lab = labels[z]
    coarse = _coarse(lab, spec.geohash_precision)
    levels = [_boundaries(coarse), _boundaries(lab)]
    rank_cuts = balanced_cuts(0, n, shard.world_size, levels)
    lo, hi = rank_cuts[shard.rank], rank_cuts[shard.rank + 1]
    worker_cuts = balanced_cuts(lo, hi, shard.num_workers, levels)
    mine = np.zeros(n, bool)
    mine[z[worker_cuts[shard.worker]:worker_cuts[shard.worker + 1]]] = True
    entry_mine = np.repeat(mine, np.diff(indptr))
    my_keys = np.unique(keys[entry_mine])
    units = []
    for s in rng.permutation(scenes):
        ids = my_keys[(my_keys >> 32) == s] & 0xFFFFFFFF
        units.append((int(s), ids[np.argsort(rank_of[int(s)][ids], kind="stable")]))
    seq = chunk_sequence(units, spec.scenes_in_flight, rng)
    seq_keys = (seq[:, 0] << 32) | seq[:, 1]
    my_samples = np.flatnonzero(mine)
    return _Split(my_samples, _lookup(seq_keys, trig_key[my_samples]), seq_keys,
                  [float(v) for v in np.diff(rank_cuts)], [float(v) for v in np.diff(worker_cuts)],
                  foreign=np.unique(keys[~entry_mine]))


def _boundaries(sorted_labels: np.ndarray) -> np.ndarray:
    """Positions where the label changes in a sorted sequence (with 0 and its end)."""
    return np.flatnonzero(np.r_[True, sorted_labels[1:] != sorted_labels[:-1], True]) if sorted_labels.size else \
        np.zeros(1, np.int64)


def _serving_order(my_samples: np.ndarray, trig: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Rounds of ``k`` chunks in sequence order; inside a round, samples shuffled and stratified over its chunks."""
    rounds = trig // k
    # stratified shuffle inside a round: a chunk's j-th of n samples gets key (j + u) / n
    jitter = rng.random(my_samples.size)
    perm = rng.permutation(my_samples.size)  # shuffle each chunk's own samples
    trig_of = trig[perm]
    o = np.lexsort((perm, trig_of))
    sorted_trig = trig_of[o]
    starts = np.searchsorted(sorted_trig, sorted_trig, side="left")
    ends = np.searchsorted(sorted_trig, sorted_trig, side="right")
    strat = np.empty(my_samples.size)
    strat[o] = (np.arange(o.size) - starts + jitter[: o.size]) / np.maximum(ends - starts, 1)
    served = perm[np.lexsort((strat, rounds[perm]))]
    return my_samples[served]


def _argmax_segments(values: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    """Index of each CSR segment's first maximum."""
    n = indptr.size - 1
    seg = np.repeat(np.arange(n), np.diff(indptr))
    o = np.lexsort((np.arange(values.size), -values, seg))
    return o[indptr[:-1]]


def _lookup(table: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Position of each of ``keys`` in ``table`` (unique values), -1 where absent."""
    if table.size == 0:
        return np.full(keys.size, -1, np.int64)
    o = np.argsort(table, kind="stable")
    i = np.minimum(np.searchsorted(table[o], keys), table.size - 1)
    return np.where(table[o][i] == keys, o[i], -1).astype(np.int64)


def _trim(totals: Sequence[float], target: int) -> list[int]:
    """Per-worker counts summing to ``target``, taking the surplus from the fullest workers."""
    keep = [int(t) for t in totals]
    surplus = sum(keep) - target
    while surplus > 0:
        i = max(range(len(keep)), key=lambda j: (keep[j], -j))
        take = max(1, min(surplus, keep[i] - (sorted(keep)[-2] if len(keep) > 1 else 0)))
        keep[i] -= take
        surplus -= take
    return keep


def _finish(order: np.ndarray, indptr: np.ndarray, keys: np.ndarray, spec: PlanSpec, epoch: int, shard: int,
            num_shards: int, dropped: int, seq_keys: np.ndarray, foreign: np.ndarray | None = None) -> EpochPlan:
    counts = indptr[order + 1] - indptr[order]
    sub_indptr = np.zeros(order.size + 1, np.int64)
    np.cumsum(counts, out=sub_indptr[1:])
    sample_keys = keys[np.repeat(indptr[order] - sub_indptr[:-1], counts) + np.arange(sub_indptr[-1])]
    uniq, first_idx, inverse = np.unique(sample_keys, return_index=True, return_inverse=True)
    # chunk positions in first-use order
    first_sample = np.searchsorted(sub_indptr, first_idx, side="right") - 1
    by_first = np.argsort(first_sample, kind="stable")
    pos = np.empty(uniq.size, np.int64)
    pos[by_first] = np.arange(uniq.size)
    chunk_keys = uniq[by_first]
    sample_of_entry = np.repeat(np.arange(order.size), counts)
    entries = pos[inverse]
    last_use = np.full(uniq.size, -1, np.int64)
    np.maximum.at(last_use, entries, sample_of_entry)
    first_use = first_sample[by_first]
    # strips: chunks needed but traversed by another shard (a seam); cells: chunks other shards' samples need too
    shared = int((_lookup(seq_keys, chunk_keys) < 0).sum()) if foreign is None else int(np.isin(chunk_keys, foreign).sum())
    chunks = np.stack([chunk_keys >> 32, chunk_keys & 0xFFFFFFFF], axis=1) if chunk_keys.size else np.zeros((0, 2), np.int64)
    plan = EpochPlan(shard, num_shards, order, chunks, first_use, last_use, sub_indptr, entries,
                     dropped=dropped, shared_chunks=shared)
    plan.stats = {"samples": float(order.size), "chunks": float(uniq.size), "k": float(spec.k),
                  "peak_resident": float(residency(plan)), "epoch": float(epoch)}
    return plan


def shard_report(grids: Sequence[ChunkGrid], table: SampleTable, spec: PlanSpec, epoch: int, world_size: int,
                 num_workers: int = 1, cells: np.ndarray | None = None) -> dict[str, Any]:
    """How one epoch's split spreads over ranks: samples, chunks, and chunks read by more than one rank.

    Counts, not bytes. Per rank: ``samples`` served, ``samples_before_trim`` (its cells' or strips'
    samples before ranks are equalised), ``dropped``, ``chunks`` (distinct chunks it decodes),
    ``chunk_reads`` (summed over its workers: a chunk two workers need counts twice) and ``cells``.
    Globally: ``chunks`` (distinct), ``chunks_multi_rank`` (read by two or more ranks) and its
    ``_fraction`` of ``chunks``, the same for shards (``chunks_multi_shard``), and
    ``max_min_samples`` (max/min of ``samples_before_trim``; ``inf`` when a rank has none) and,
    when ``cells`` are given, ``cells_multi_rank``: cells whose samples more than one rank serves
    (0 for ``shard_by="geohash"``: each rank reads its own regions).
    Plans every shard, so it costs ``world_size * num_workers`` :func:`plan_epoch` calls.
    """
    ranks: list[dict[str, Any]] = []
    rank_cells: list[set[str]] = []
    rank_keys: list[np.ndarray] = []
    shard_keys: list[np.ndarray] = []
    for r in range(world_size):
        plans = [plan_epoch(grids, table, spec, epoch, rank=r, world_size=world_size, worker=w, num_workers=num_workers,
                            cells=cells) for w in range(num_workers)]
        keys = [(p.chunks[:, 0] << 32) | p.chunks[:, 1] for p in plans]
        shard_keys.extend(keys)
        rank_keys.append(np.unique(np.concatenate(keys)))
        rank_cells.append(set().union(*(p.cells for p in plans)))
        ranks.append({"rank": r, "samples": sum(len(p) for p in plans),
                      "samples_before_trim": sum(len(p) + p.dropped for p in plans),
                      "dropped": sum(p.dropped for p in plans), "chunks": int(rank_keys[-1].size),
                      "chunk_reads": sum(int(k.size) for k in keys),
                      "cells": len(rank_cells[-1])})
    multi_rank, total = _multi_read(rank_keys)
    multi_shard, _ = _multi_read(shard_keys)
    return {"shard_by": spec.shard_by, "epoch": epoch, "world_size": world_size, "num_workers": num_workers,
            "samples": len(table), "served": sum(x["samples"] for x in ranks),
            "dropped": sum(x["dropped"] for x in ranks), "chunks": total, "chunks_multi_rank": multi_rank,
            "chunks_multi_rank_fraction": multi_rank / total if total else 0.0, "chunks_multi_shard": multi_shard,
            "chunks_multi_shard_fraction": multi_shard / total if total else 0.0,
            "chunk_reads": sum(x["chunk_reads"] for x in ranks),
            "cells_multi_rank": sum(n > 1 for n in Counter(c for cs in rank_cells for c in cs).values()),
            "max_min_samples": load_ratio([x["samples_before_trim"] for x in ranks]), "ranks": ranks}


def _multi_read(key_sets: Sequence[np.ndarray]) -> tuple[int, int]:
    """``(keys in two or more of the sets, distinct keys)``; each set holds unique keys."""
    if not key_sets:
        return 0, 0
    _, n = np.unique(np.concatenate(key_sets), return_counts=True)
    return int((n > 1).sum()), int(n.size)


def residency(plan: EpochPlan) -> int:
    """The most chunks that must be held at once to decode each chunk once (first to last use)."""
    if plan.chunks.shape[0] == 0:
        return 0
    events = np.zeros(len(plan) + 1, np.int64)
    np.add.at(events, plan.first_use, 1)
    np.add.at(events, plan.last_use + 1, -1)
    return int(np.cumsum(events).max())


# -- randomness ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Randomness:
    """How mixed batches are, and the same figures for a full shuffle of the same samples."""

    distinct_chunks_per_batch: float
    distinct_scenes_per_batch: float
    lag1_autocorrelation: float  # of sample positions in serving order; ~0 for a full shuffle
    shuffle_distinct_chunks_per_batch: float
    shuffle_distinct_scenes_per_batch: float
    shuffle_lag1_autocorrelation: float

    def to_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__slots__}


def _lag1(x: np.ndarray) -> float:
    if x.size < 3 or float(x.std()) == 0.0:
        return 0.0
    return float(np.corrcoef(x[:-1], x[1:])[0, 1])


def _batch_mix(order: np.ndarray, table: SampleTable, grids: Sequence[ChunkGrid], batch: int) -> tuple[float, float, float]:
    rows = table.rows[order]
    cy = np.clip(rows[:, ROW] + table.size[0] // 2, 0, None)
    cx = np.clip(rows[:, COL] + table.size[1] // 2, 0, None)
    ch = np.array([g.chunk_y for g in grids])[rows[:, SCENE]]
    cw = np.array([g.chunk_x for g in grids])[rows[:, SCENE]]
    chunk = (rows[:, SCENE] << 40) | ((cy // ch) << 20) | (cx // cw)
    nb = max(1, order.size // batch)
    dc = [np.unique(chunk[i * batch:(i + 1) * batch]).size for i in range(nb)]
    ds = [np.unique(rows[i * batch:(i + 1) * batch, SCENE]).size for i in range(nb)]
    # position as one number: scene-major, then row, then col (what a sequential reader walks)
    hmax = max(g.height for g in grids) + 1
    wmax = max(g.width for g in grids) + 1
    lin = (rows[:, SCENE].astype(float) * hmax + cy) * wmax + cx
    ac = (_lag1(cy.astype(float)) + _lag1(cx.astype(float)) + _lag1(lin)) / 3
    return float(np.mean(dc)), float(np.mean(ds)), ac


def randomness(plan: EpochPlan, table: SampleTable, grids: Sequence[ChunkGrid], batch_size: int, seed: int = 0) -> Randomness:
    """Mixing of ``plan``'s serving order against a full shuffle of the same samples."""
    a = _batch_mix(plan.order, table, grids, batch_size)
    b = _batch_mix(np.random.default_rng(seed).permutation(plan.order), table, grids, batch_size)
    return Randomness(a[0], a[1], a[2], b[0], b[1], b[2])
