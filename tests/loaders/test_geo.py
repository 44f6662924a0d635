"""Geo-aware training: sample cells, hot-region downsampling, loss weights, cell balancing, geohash sharding."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pyproj import Transformer
from rasterio.transform import Affine, xy

from cubelake.geohash import encode
from cubelake.grid import ChunkGrid, Window
from cubelake.loaders import geo
from cubelake.loaders.plan import (
    PlanSpec,
    SampleTable,
    plan_epoch,
    residency,
    shard_report,
    sliding_windows,
)

UTM33 = "EPSG:32633"


def _utm(x0: float, y0: float, gsd: float = 10.0) -> geo.Georef:
    return geo.Georef(UTM33, (gsd, 0.0, x0, 0.0, -gsd, y0))


def _regions() -> tuple[list[ChunkGrid], list[geo.Georef | None], SampleTable]:
    """A hot region (one dense 10 m scene near Berlin) and a sparse one (three scenes, windows 4.5x further
    apart: ~20x fewer samples per cell), a lon/lat scene and a small scene with no georeference."""
    grids: list[ChunkGrid] = []
    georefs: list[geo.Georef | None] = []
    tables = []

    def add(g: ChunkGrid, ref: geo.Georef | None, stride: int) -> None:
        grids.append(g)
        georefs.append(ref)
        tables.append(sliding_windows(len(grids) - 1, g, (32, 32), (stride, stride)))

    add(ChunkGrid(1024, 1024, 128, 128), _utm(390_000, 5_830_000), 8)  # hot
    for x0, y0 in [(500_000, 5_500_000), (600_000, 5_300_000), (450_000, 5_100_000)]:
        add(ChunkGrid(1024, 1024, 128, 128), _utm(x0, y0), 36)  # sparse
    add(ChunkGrid(512, 512, 128, 128), geo.Georef("EPSG:4326", (0.0001, 0.0, 13.0, 0.0, -0.0001, 52.0)), 36)
    add(ChunkGrid(256, 256, 128, 128), None, 36)
    return grids, georefs, SampleTable.concat((32, 32), tables)


# -- georeference and cells ----------------------------------------------------------------------------


@pytest.mark.parametrize(("crs", "transform"), [
    (UTM33, (10.0, 0.0, 390_000.0, 0.0, -10.0, 5_830_000.0)),
    ("EPSG:4326", (0.0001, 0.0, 13.0, 0.0, -0.0001, 52.0)),
    (UTM33, (8.0, 3.0, 500_000.0, 2.5, -9.0, 5_500_000.0)),  # rotated and sheared
])
def test_to_lonlat_matches_rasterio_and_pyproj(crs: str, transform: tuple[float, ...]) -> None:
    ref = geo.Georef(crs, transform)  # type: ignore[arg-type]
    rows = np.array([0, 0, 511, 1023, 17, -3])
    cols = np.array([0, 1023, 200, 1023, 999, 5])
    lon, lat = ref.to_lonlat(rows, cols)
    x, y = xy(Affine(*transform), rows, cols, offset="center")
    want_lon, want_lat = Transformer.from_crs(crs, "EPSG:4326", always_xy=True).transform(np.asarray(x), np.asarray(y))
    np.testing.assert_allclose(lon, want_lon, rtol=0, atol=1e-9)
    np.testing.assert_allclose(lat, want_lat, rtol=0, atol=1e-9)
    assert 12.0 < lon.mean() < 16.0  # all of them lie in Germany / Poland
    assert 45.0 < lat.mean() < 53.0


def test_georef_refuses_bad_input_and_of_gives_none_without_crs_or_transform() -> None:
    with pytest.raises(ValueError, match="non-empty CRS"):
        geo.Georef("", (1.0, 0.0, 0.0, 0.0, -1.0, 0.0))
    with pytest.raises(ValueError, match="6 finite numbers"):
        geo.Georef(UTM33, (1.0, 0.0, 0.0, 0.0, -1.0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="6 finite numbers"):
        geo.Georef(UTM33, (1.0, 0.0, math.nan, 0.0, -1.0, 0.0))
    with pytest.raises(ValueError, match="degenerate"):
        geo.Georef(UTM33, (1.0, 2.0, 0.0, 0.5, 1.0, 0.0))
    with pytest.raises(ValueError, match="'EPSG:999999' is not a CRS pyproj can read"):
        geo.Georef("EPSG:999999", (1.0, 0.0, 0.0, 0.0, -1.0, 0.0)).to_lonlat(np.zeros(1), np.zeros(1))
    assert geo.Georef.of(None, (1, 0, 0, 0, -1, 0)) is None
    assert geo.Georef.of(UTM33, None) is None
    g = geo.Georef.of(UTM33, [10, 0, 1, 0, -10, 2])
    assert g == geo.Georef(UTM33, (10.0, 0.0, 1.0, 0.0, -10.0, 2.0))
    assert isinstance(hash(g), int)
    with pytest.raises(ValueError, match="6 numbers"):
        geo.Georef.of(UTM33, [1, 0, 0, 0, -1, 0, 0, 0, 1])


def test_sample_cells_name_window_centres_and_scenes_without_georef() -> None:
    _grids, georefs, table = _regions()
    cells = geo.sample_cells(table, georefs, 6)
    assert cells.shape == (len(table),)
    # lon/lat scene: the centre of window (r, c) of size 32 is pixel (r + 16, c + 16)'s top-left corner
    sel = np.flatnonzero(table.rows[:, 0] == 4)[::7]
    for i in sel:
        _, r, c = table.rows[i]
        assert cells[i] == encode(13.0 + 0.0001 * (c + 16), 52.0 - 0.0001 * (r + 16), 6)
    # UTM scene: the same through pyproj
    to_ll = Transformer.from_crs(UTM33, "EPSG:4326", always_xy=True)
    for i in np.flatnonzero(table.rows[:, 0] == 1)[::97]:
        _, r, c = table.rows[i]
        lon, lat = to_ll.transform(500_000 + 10.0 * (c + 16), 5_500_000 - 10.0 * (r + 16))
        assert cells[i] == encode(lon, lat, 6)
    assert set(cells[table.rows[:, 0] == 5].tolist()) == {"~scene5"}  # no georef: one pseudo-cell
    assert all(len(c) == 6 for c in cells[table.rows[:, 0] != 5])
    assert geo.sample_cells(table, georefs, 4).tolist() == [c if c.startswith("~") else c[:4] for c in cells.tolist()]
    with pytest.raises(ValueError, match="names scene 5 but georefs has 5 entries"):
        geo.sample_cells(table, georefs[:5])
    names, counts, inverse = geo.cell_counts(cells)
    assert names.tolist() == sorted(set(cells.tolist()))
    assert np.array_equal(names[inverse], cells)
    assert counts.sum() == len(table)
    assert np.array_equal(counts, np.bincount(inverse))


# -- downsampling and weights --------------------------------------------------------------------------


def test_keep_probability_is_the_seed_formula_or_a_checked_user_function() -> None:
    n = np.array([0, 1, 10, 1000])
    np.testing.assert_allclose(geo.keep_probability(n), [1.0, 1 / (1 + math.log(2)), 1 / (1 + math.log(11)),
                                                         1 / (1 + math.log(1001))])
    np.testing.assert_allclose(geo.keep_probability(n, lambda c: np.minimum(1.0, 10.0 / np.maximum(c, 1))),
                               [1.0, 1.0, 1.0, 0.01])

    def too_big(c: np.ndarray) -> np.ndarray:
        return c

    with pytest.raises(ValueError, match=r"'too_big' returned values outside \[0, 1\]"):
        geo.keep_probability(n, too_big)
    with pytest.raises(ValueError, match="one probability per cell"):
        geo.keep_probability(n, lambda c: np.ones(2))
    with pytest.raises(ValueError, match="not finite"):
        geo.keep_probability(n, lambda c: c * np.nan)
    with pytest.raises(ValueError, match="finite numbers >= 0"):
        geo.keep_probability(np.array([3, -1]))


def test_downsampling_frequencies_match_the_formula_over_200_epochs() -> None:
    counts = np.array([1, 3, 20, 150, 900])
    inverse = np.repeat(np.arange(counts.size), counts)
    p = geo.keep_probability(counts)
    kept = np.zeros(counts.size, np.int64)
    for epoch in range(200):
        mask = geo.downsample(inverse, p, np.random.default_rng([7, epoch]))
        before, k = geo.downsample_counts(inverse, mask, counts.size)
        assert np.array_equal(before, counts)
        assert k.sum() == mask.sum()
        kept += k
    trials = 200 * counts
    sigma = np.sqrt(trials * p * (1 - p))
    assert (np.abs(kept - trials * p) <= 4 * sigma).all(), (kept / trials, p)
    # hot cells lose a larger share: the kept fraction falls with the cell's count
    assert np.all(np.diff(kept / trials) < 0)
    # seeded: the same epoch draws the same mask
    a = geo.downsample(inverse, p, np.random.default_rng([7, 3]))
    assert np.array_equal(a, geo.downsample(inverse, p, np.random.default_rng([7, 3])))
    with pytest.raises(ValueError, match="probs has 2 cells"):
        geo.downsample(inverse, p[:2], np.random.default_rng(0))
    with pytest.raises(ValueError, match="one flag per sample"):
        geo.downsample_counts(inverse, a[:-1], counts.size)


def test_loss_weights_follow_the_density_formula() -> None:
    counts = np.array([400, 100, 20, 1])
    inverse = np.array([0, 1, 2, 3, 3, 0])
    w = geo.loss_weights(counts, inverse, 0.5)
    density = counts / 400
    np.testing.assert_allclose(w, 1 + 0.5 * (1 - density[inverse]))
    assert w[0] == 1.0  # the densest cell keeps weight 1
    assert w[3] == pytest.approx(1.5 - 0.5 / 400)
    assert np.array_equal(geo.loss_weights(counts, inverse, 0), np.ones(6))
    for bad in (-0.1, math.nan, math.inf, "1"):
        with pytest.raises(ValueError, match="alpha must be a finite number >= 0"):
            geo.loss_weights(counts, inverse, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="counts has 4 cells"):
        geo.loss_weights(counts, np.array([4]), 1.0)


# -- balancing -----------------------------------------------------------------------------------------


def test_cells_of_a_20_to_1_hot_sparse_table_balance_over_4_ranks_within_5_percent() -> None:
    _grids, georefs, table = _regions()
    cells = geo.sample_cells(table, georefs)
    _names, counts, inverse = geo.cell_counts(cells)
    geo_cells = counts[~np.char.startswith(_names, "~")]
    hot = np.median(counts[np.unique(inverse[table.rows[:, 0] == 0])])
    sparse = np.median(counts[np.unique(inverse[np.isin(table.rows[:, 0], [1, 2, 3])])])
    assert 15 <= hot / sparse <= 25  # the imbalance the case is about
    assert geo_cells.size > 100
    lab = np.sort(cells)
    bounds = np.flatnonzero(np.r_[True, lab[1:] != lab[:-1], True])
    cuts = geo.balanced_cuts(0, lab.size, 4, [bounds])
    assert cuts[0] == 0
    assert cuts[-1] == lab.size
    assert cuts == sorted(cuts)
    assert geo.load_ratio(np.diff(cuts)) <= 1.05
    assert set(cuts) <= set(bounds.tolist())  # whole cells: every cut falls between two cells
    assert cuts == geo.balanced_cuts(0, lab.size, 4, [bounds])  # deterministic


def test_balanced_cuts_prefer_coarse_boundaries_then_fine_then_exact() -> None:
    # 100 items in 4 coarse groups of 40/10/10/40 and fine groups of 5: two bins
    coarse = np.array([0, 40, 50, 60, 100])
    fine = np.arange(0, 101, 5)
    assert geo.balanced_cuts(0, 100, 2, [coarse, fine]) == [0, 50, 100]  # a coarse boundary balances
    assert geo.balanced_cuts(0, 100, 4, [coarse, fine]) == [0, 25, 50, 75, 100]  # fine ones where coarse cannot
    assert geo.balanced_cuts(0, 100, 3, [np.array([0, 100])]) == [0, 33, 67, 100]  # exact where none can
    assert geo.balanced_cuts(10, 10, 3, [coarse]) == [10, 10, 10, 10]  # nothing to cut
    assert geo.load_ratio([0, 3]) == math.inf
    assert geo.load_ratio([0, 0]) == 1.0
    with pytest.raises(ValueError, match="bins must be an integer >= 1"):
        geo.balanced_cuts(0, 10, 0, [coarse])


# -- geohash sharding in the planner -------------------------------------------------------------------


def _chunks_of_window(g: ChunkGrid, scene: int, row: int, col: int, size: tuple[int, int]) -> set[tuple[int, int]]:
    return {(scene, c.iy * g.n_cols + c.ix) for c in g.chunks_for_window(Window(row, col, *size))}


def test_geohash_shards_serve_each_sample_once_and_ranks_read_only_their_cells() -> None:
    grids, georefs, table = _regions()
    cells = geo.sample_cells(table, georefs)
    spec = PlanSpec(seed=3, shard_by="geohash")
    # one rank, 4 workers: no trim, so the shards partition the table exactly
    plans = [plan_epoch(grids, table, spec, 0, worker=w, num_workers=4, cells=cells) for w in range(4)]
    assert np.array_equal(np.sort(np.concatenate([p.order for p in plans])), np.arange(len(table)))
    assert geo.load_ratio([len(p) for p in plans]) <= 1.05
    # 4 ranks x 2 workers: disjoint, equal per rank, served + dropped = all
    served, per_rank, rank_cells = [], [], []
    for r in range(4):
        ps = [plan_epoch(grids, table, spec, 0, rank=r, world_size=4, worker=w, num_workers=2, cells=cells)
              for w in range(2)]
        for p in ps:
            assert set(cells[p.order].tolist()) <= set(p.cells)  # a shard serves only its cells
            served.append(p.order)
        per_rank.append(sum(len(p) for p in ps))
        rank_cells.append(set(ps[0].cells) | set(ps[1].cells))
        assert not set(ps[0].cells) & set(ps[1].cells)
        assert sum(len(p) + p.dropped for p in ps) == sum(int((np.isin(cells, p.cells)).sum()) for p in ps)
    allserved = np.concatenate(served)
    assert allserved.size == np.unique(allserved).size  # no sample twice
    assert len(set(per_rank)) == 1  # DDP: equal steps
    assert allserved.size >= 0.97 * len(table)
    assert set().union(*rank_cells) == set(cells.tolist())
    assert sum(len(c) for c in rank_cells) == len(set(cells.tolist()))  # every cell on exactly one rank


def test_geohash_plan_is_deterministic_and_keeps_the_plan_invariants() -> None:
    grids, georefs, table = _regions()
    cells = geo.sample_cells(table, georefs)
    spec = PlanSpec(seed=11, shard_by="geohash", chunks_per_round=6, scenes_in_flight=2)
    plans = [plan_epoch(grids, table, spec, 2, worker=w, num_workers=3, cells=cells) for w in range(3)]
    again = plan_epoch(grids, table, spec, 2, worker=1, num_workers=3, cells=cells)
    assert np.array_equal(again.order, plans[1].order)  # a resumed epoch is the same epoch
    assert np.array_equal(again.chunks, plans[1].chunks)
    assert not np.array_equal(plan_epoch(grids, table, spec, 3, worker=1, num_workers=3, cells=cells).order,
                              plans[1].order)
    for i, p in enumerate(plans):
        keys = [tuple(c) for c in p.chunks.tolist()]
        assert len(keys) == len(set(keys))  # each chunk listed once
        assert (p.first_use <= p.last_use).all()
        for pos in range(0, len(p), 5):
            s, r, c = (int(v) for v in table.rows[p.order[pos]])
            got = {tuple(int(v) for v in p.chunks[j]) for j in p.chunks_of(pos)}
            assert got == _chunks_of_window(grids[s], s, r, c, table.size)
            assert all(p.first_use[j] <= pos <= p.last_use[j] for j in p.chunks_of(pos))
        assert residency(p) < p.chunks.shape[0]  # served in chunk order, not all at once
        others = set().union(*({tuple(c) for c in q.chunks.tolist()} for j, q in enumerate(plans) if j != i))
        assert p.shared_chunks == len(set(keys) & others)


def test_geohash_sharding_keeps_regions_on_one_rank_and_reads_fewer_shared_chunks_when_scenes_split() -> None:
    # three overlapping scenes of one region: strips keeps scenes whole, so ranks share cells
    grids = [ChunkGrid(1024, 1024, 128, 128)] * 3
    georefs = [_utm(390_000, 5_830_000), _utm(392_000, 5_831_000), _utm(394_000, 5_829_000)]
    table = SampleTable.concat((32, 32), [sliding_windows(i, g, (32, 32), (16, 16)) for i, g in enumerate(grids)])
    cells = geo.sample_cells(table, georefs)
    strips = shard_report(grids, table, PlanSpec(shard_by="strips"), 0, 4, cells=cells)
    by_cell = shard_report(grids, table, PlanSpec(shard_by="geohash"), 0, 4, cells=cells)
    assert strips["cells_multi_rank"] > 100
    assert by_cell["cells_multi_rank"] == 0  # each region is read by one rank
    assert by_cell["max_min_samples"] <= 1.05
    # one large scene over 8 ranks: strips must cut it into 8 strips; contiguous cells share fewer chunks
    grids = [ChunkGrid(2048, 2048, 128, 128)]
    table = sliding_windows(0, grids[0], (32, 32), (16, 16))
    cells = geo.sample_cells(table, [_utm(390_000, 5_830_000)])
    strips = shard_report(grids, table, PlanSpec(shard_by="strips"), 0, 8, cells=cells)
    by_cell = shard_report(grids, table, PlanSpec(shard_by="geohash"), 0, 8, cells=cells)
    assert 0 < by_cell["chunks_multi_rank"] < strips["chunks_multi_rank"]
    assert by_cell["chunks_multi_rank_fraction"] < 0.35  # whole cells in geohash order, not scattered
    assert by_cell["max_min_samples"] <= 1.05
    assert by_cell["served"] + by_cell["dropped"] == len(table)
    assert [r["samples"] for r in by_cell["ranks"]] == [by_cell["served"] // 8] * 8


def test_geohash_sharding_refuses_missing_or_mismatched_cells_and_bad_specs() -> None:
    grids, georefs, table = _regions()
    spec = PlanSpec(shard_by="geohash")
    with pytest.raises(ValueError, match="needs cells="):
        plan_epoch(grids, table, spec, 0)
    with pytest.raises(ValueError, match=rf"cells has shape \(3,\), the sample table has {len(table)} rows"):
        plan_epoch(grids, table, spec, 0, cells=np.array(["a", "b", "c"]))
    with pytest.raises(ValueError, match="shard_by must be 'strips' or 'geohash'"):
        PlanSpec(shard_by="scenes")  # type: ignore[arg-type]
    for bad in (0, 13, 6.0, True):
        with pytest.raises(ValueError, match="geohash_precision must be an integer from 1 to 12"):
            PlanSpec(geohash_precision=bad)  # type: ignore[arg-type]
    # strips ignores cells for the split, and reports them
    cells = geo.sample_cells(table, georefs)
    p = plan_epoch(grids, table, PlanSpec(seed=1), 0, cells=cells)
    assert np.array_equal(p.order, plan_epoch(grids, table, PlanSpec(seed=1), 0).order)
    assert p.cells == sorted(set(cells.tolist()))
    # an empty table plans an empty epoch
    empty = table.take(np.zeros(0, np.int64))
    e = plan_epoch(grids, empty, spec, 0, rank=1, world_size=2, cells=np.zeros(0, "<U6"))
    assert (len(e), e.chunks.shape, e.cells) == (0, (0, 2), [])
