"""The sampler seam, areas of interest, the curriculum and region balance, end to end on ingested products."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import shapely
import torch
from pyproj import Transformer
from shapely.geometry import box, mapping, shape
from torch.utils.data import DataLoader

from cubelake.catalog import LakeCatalog, Query
from cubelake.geohash import encode
from cubelake.grid import ChunkGrid
from cubelake.loaders import CubeDataset, PlanSpec, ProductError, Sampling, Spectral
from cubelake.loaders.epoch import RegionBalance
from cubelake.loaders.plan import SampleTable
from cubelake.loaders.samplers import (
    Curriculum,
    LabelSampler,
    RandomSampler,
    Sampler,
    SceneView,
    SlidingSampler,
    region_of,
    restrict,
)

from .conftest import expected_window

RAW = Spectral(normalize="none")
UTM33 = "EPSG:32633"
ORIGIN = (500000.0, 5800000.0)  # write_geotiff's upper-left corner, 30 m pixels
TO_LONLAT = Transformer.from_crs(UTM33, "EPSG:4326", always_xy=True)
TO_UTM = Transformer.from_crs("EPSG:4326", UTM33, always_xy=True)


def served(batches: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    return [(s, int(w[0]), int(w[1])) for b in batches for s, w in zip(b["scene"], b["window"], strict=True)]


def lonlat(row: float, col: float) -> tuple[float, float]:
    x, y = ORIGIN[0] + 30.0 * col, ORIGIN[1] - 30.0 * row
    lon, lat = TO_LONLAT.transform(x, y)
    return float(lon), float(lat)


def area(rows: tuple[float, float], cols: tuple[float, float]) -> shapely.Geometry:
    """A lon/lat rectangle around the given pixel span of the synthetic scenes (their grids share an origin)."""
    corners = [lonlat(r, c) for r in rows for c in cols]
    return box(min(p[0] for p in corners), min(p[1] for p in corners), max(p[0] for p in corners),
               max(p[1] for p in corners))


@dataclass(frozen=True)
class DiagonalSampler:
    """A strategy the loader has never heard of: windows along the scene's diagonal, every ``step`` pixels."""

    size: tuple[int, int] = (16, 16)
    step: int = 40
    needs_labels: bool = False
    per_epoch: bool = False

    def windows(self, scene: SceneView, epoch: int, seed: int) -> SampleTable:
        n = min(scene.grid.height, scene.grid.width) - self.size[0]
        pos = np.arange(0, n + 1, self.step, dtype=np.int64)
        rows = np.stack([np.full(pos.size, scene.index, np.int64), pos, pos], axis=1)
        return SampleTable(self.size, rows, np.full(pos.size, -1, np.int64))


def test_built_in_strategies_are_samplers_and_a_new_one_plugs_in(synth_lake: dict[str, Any]) -> None:
    for s in (SlidingSampler.of(32, 16), RandomSampler.of(32, 10), LabelSampler.of(9), DiagonalSampler()):
        assert isinstance(s, Sampler)
    assert isinstance(Sampling(mode="random", size=8, count=3).sampler(), RandomSampler)
    ds = CubeDataset(synth_lake["scenes"], sampler=DiagonalSampler(), sampling=Sampling(labels="none"), spectral=RAW,
                     plan=PlanSpec(batch_size=4))
    got = sorted(served(list(ds)))
    want = sorted([("scene_a", p, p) for p in range(0, 260 - 16 + 1, 40)] + [("scene_b", p, p) for p in range(0, 200 - 16 + 1, 40)])
    assert got == want
    for b in DataLoader(ds, batch_size=None):
        for i, (sid, w) in enumerate(zip(b["scene"], b["window"].tolist(), strict=True)):
            np.testing.assert_array_equal(b["image"][i].numpy(), expected_window(synth_lake[sid[-1]], *w))
        assert b["weight"].dtype.is_floating_point
        assert b["weight"].tolist() == [1.0] * len(b["scene"])
    with pytest.raises(TypeError, match="Sampler protocol"):
        CubeDataset(synth_lake["scenes"], sampler=object())  # type: ignore[arg-type]


def test_region_in_pixels_matches_a_brute_force_footprint_check() -> None:
    grid = ChunkGrid(300, 260, 64, 64)
    aoi = area((70, 190), (40, 150))
    reg = region_of(aoi, grid, UTM33, (30.0, 0.0, ORIGIN[0], 0.0, -30.0, ORIGIN[1]))
    for cy in range(grid.n_rows):
        for cx in range(grid.n_cols):  # the chunk's footprint, densified, in lon/lat
            r0, r1 = cy * 64, min(cy * 64 + 64, 300)
            c0, c1 = cx * 64, min(cx * 64 + 64, 260)
            ring = [lonlat(r, c0) for r in np.linspace(r0, r1, 9)] + [lonlat(r1, c) for c in np.linspace(c0, c1, 9)] + \
                   [lonlat(r, c1) for r in np.linspace(r1, r0, 9)] + [lonlat(r0, c) for c in np.linspace(c1, c0, 9)]
            assert bool(reg.chunks[cy, cx]) == shapely.Polygon(ring).intersects(aoi), (cy, cx)
    assert 0 < reg.n_chunks < grid.n_chunks
    table = SlidingSampler.of(16, 8).windows(SceneView(0, grid), 0, 0)
    kept = restrict(table, grid, reg, "within")
    for r, c in kept.rows[:, 1:]:
        assert aoi.buffer(1e-9).covers(shapely.Polygon([lonlat(r, c), lonlat(r, c + 16), lonlat(r + 16, c + 16),
                                                        lonlat(r + 16, c)]))
    with pytest.raises(ValueError, match="window rule"):
        restrict(table, grid, reg, "overlaps")  # type: ignore[arg-type]


def _expected_aoi_windows(shape: tuple[int, int], aoi: shapely.Geometry, size: int, stride: int,
                          chunks: np.ndarray) -> set[tuple[int, int]]:
    """Brute force: sliding windows whose centre lies in the area and whose chunks all meet it."""
    out = set()
    for r in range(0, shape[0] - size + 1, stride):
        for c in range(0, shape[1] - size + 1, stride):
            lon, lat = lonlat(r + size // 2 + 0.5, c + size // 2 + 0.5)
            cys = range(r // 64, (r + size - 1) // 64 + 1)
            cxs = range(c // 64, (c + size - 1) // 64 + 1)
            if aoi.intersects(shapely.Point(lon, lat)) and all(chunks[y, x] for y in cys for x in cxs):
                out.add((r, c))
    return out


def test_an_area_limits_windows_and_only_chunks_meeting_it_are_read(synth_lake: dict[str, Any]) -> None:
    aoi = area((70, 190), (40, 150))
    ds = CubeDataset(synth_lake["scenes"], sampling=Sampling(size=16, stride=8, labels="none"), spectral=RAW,
                     plan=PlanSpec(batch_size=32), aoi=mapping(aoi), prefer=("cog",))
    batches = list(ds)
    got = served(batches)
    for sid, hw, i in (("scene_a", (300, 260), 0), ("scene_b", (200, 330), 1)):
        reg = ds.regions[i]
        assert reg is not None
        want = _expected_aoi_windows(hw, aoi, 16, 8, reg.chunks)
        assert {(r, c) for s, r, c in got if s == sid} == want
        assert len(want) > 0
    assert len(got) == len(set(got)) == ds.n_samples()
    for b in batches:
        for i, (sid, w) in enumerate(zip(b["scene"], b["window"].tolist(), strict=True)):
            np.testing.assert_array_equal(b["image"][i].numpy(), expected_window(synth_lake[sid[-1]], *w))
    m = ds.metrics()
    meeting = sum(r.n_chunks for r in ds.regions if r is not None)
    assert m.chunks_decoded == ds.plan(0).chunks.shape[0] <= meeting
    plan_chunks = {(int(s), int(c)) for s, c in ds.plan(0).chunks}
    for s, c in plan_chunks:  # every chunk read meets the area
        g = ds.grids[s]
        assert ds.regions[s] is not None
        assert ds.regions[s].chunks[c // g.n_cols, c % g.n_cols]
    whole = CubeDataset(synth_lake["scenes"], sampling=Sampling(size=16, stride=8, labels="none"), spectral=RAW,
                        plan=PlanSpec(batch_size=32), prefer=("cog",))
    list(whole)
    assert whole.metrics().chunks_decoded > 2 * m.chunks_decoded
    assert whole.metrics().bytes_fetched > 2 * m.bytes_fetched


def test_from_search_is_one_call_from_a_bbox_to_area_limited_batches(synth_lake: dict[str, Any]) -> None:
    aoi = area((70, 190), (40, 150))
    ds = CubeDataset.from_search(synth_lake["lake"], bbox=aoi.bounds, sampling=Sampling(size=16, stride=8, labels="none"),
                                 spectral=RAW, plan=PlanSpec(batch_size=32))
    direct = CubeDataset(synth_lake["scenes"], sampling=Sampling(size=16, stride=8, labels="none"), spectral=RAW,
                         plan=PlanSpec(batch_size=32), aoi=aoi)
    assert sorted(served(list(ds))) == sorted(served(list(direct)))
    far = (0.0, 0.0, 0.1, 0.1)
    with pytest.raises(ProductError, match="found no scene"):
        CubeDataset.from_search(synth_lake["lake"], bbox=far)
    with pytest.raises(TypeError, match="not both"):
        CubeDataset.from_search(synth_lake["lake"], Query(bbox=aoi.bounds), ids=["scene_a"])


def test_curriculum_serves_the_core_first_then_all_and_keeps_its_guarantees(synth_lake: dict[str, Any]) -> None:
    # scene_a has a nodata corner and a nodata chunk: its quality (valid share) is below scene_b's 1.0
    def make() -> CubeDataset:
        return CubeDataset.from_search(synth_lake["lake"], core_filters=["cubelake:quality>=0.99"], core_epochs=2,
                                       sampling=Sampling(size=32, stride=24, labels="none"), spectral=RAW,
                                       plan=PlanSpec(seed=5, batch_size=8))

    ds = make()
    stage1 = served(list(ds))
    assert {s for s, _, _ in stage1} == {"scene_b"}
    assert ds.metrics().stage == 1
    assert ds.metrics().redecodes == 0
    assert ds.metrics().chunks_decoded == ds.plan(0).chunks.shape[0]
    list(ds)  # epoch 1: still the core
    assert ds.metrics().stage == 1
    stage2 = served(list(ds))  # epoch 2: everything
    assert {s for s, _, _ in stage2} == {"scene_a", "scene_b"}
    assert ds.metrics().stage == 2
    assert len(stage2) > len(stage1)
    # resume in stage 1: the rest of the epoch, no repeats
    ds = make()
    first = []
    for i, b in enumerate(ds):
        first.append(b)
        if i == 2:
            state = ds.state_dict(b)
            break
    resumed = make()
    resumed.load_state_dict(state)
    assert served(first) + served(list(resumed)) == stage1
    with pytest.raises(ValueError, match="core holds none"):
        Curriculum(1, frozenset({"nope"})).filter(ds.table(5), ["scene_a", "scene_b"], 0)
    with pytest.raises(ValueError, match="core_epochs"):
        Curriculum(-1)


def test_region_balance_downsamples_hot_cells_and_weights_sparse_ones(synth_lake: dict[str, Any]) -> None:
    bal = RegionBalance(precision=5, alpha=0.5)
    ds = CubeDataset(synth_lake["scenes"], sampling=Sampling(size=16, stride=16, labels="none"), spectral=RAW,
                     plan=PlanSpec(seed=2, batch_size=64), balance=bal)
    et = ds.epoch_table(0)
    full = CubeDataset(synth_lake["scenes"], sampling=Sampling(size=16, stride=16, labels="none"), spectral=RAW)
    base = full.table(0)
    cells = np.array([encode(*lonlat(r + 8, c + 8), precision=5) for r, c in base.rows[:, 1:]])  # the window's centre
    names, counts = np.unique(cells, return_counts=True)
    before = dict(zip(names.tolist(), counts.tolist(), strict=True))
    regions = et.region_counts()
    assert {k: v[0] for k, v in regions.items()} == before
    assert sum(v[1] for v in regions.values()) == len(et.table) < len(base)
    batches = list(ds)
    m = ds.metrics()
    assert (m.regions, m.region_samples_before, m.region_samples_after) == (len(before), len(base), len(et.table))
    assert f"regions: {len(before)} geohash cells, {len(base)} samples before downsampling, {len(et.table)} kept" in m.report()
    top = max(counts)
    for b in batches:
        for sid, w, wt in zip(b["scene"], b["window"].tolist(), b["weight"].tolist(), strict=True):
            n = before[encode(*lonlat(w[0] + 8, w[1] + 8), precision=5)]
            assert wt == pytest.approx(1 + 0.5 * (1 - n / top), rel=1e-6), (sid, w)
    assert sum(len(b["scene"]) for b in batches) == len(et.table)
    assert ds.epoch_table(1).table.rows.tolist() != et.table.rows.tolist()  # drawn anew each epoch


def test_geohash_ranks_get_whole_cells_balanced_and_report_shared_chunks(synth_lake: dict[str, Any]) -> None:
    from cubelake.loaders import shard_report
    from cubelake.loaders.epoch import chunk_cells

    def make(rank: int) -> CubeDataset:
        return CubeDataset(synth_lake["scenes"], sampling=Sampling(size=16, stride=12, labels="none"), spectral=RAW,
                           plan=PlanSpec(seed=1, batch_size=64, shard_by="geohash", geohash_precision=6),
                           rank=rank, world_size=3)

    per_rank, cells_of = [], []
    for rank in range(3):
        ds = make(rank)
        got = served(list(ds))
        per_rank.append(got)
        et = ds.epoch_table(0)
        cell = dict(zip(map(tuple, et.table.rows.tolist()), et.cells.tolist(), strict=True))
        sid = {s.scene_id: i for i, s in enumerate(ds.sources)}
        cells_of.append({cell[(sid[s], r, c)] for s, r, c in got})
        plan = ds.plan(0, rank=rank, world_size=3)
        assert set(plan.cells) == {c[:6] for c in cells_of[-1]}  # the plan names its geohash-6 cells
        assert ds.metrics().shared_chunks == plan.shared_chunks
    shared = [c for a in range(3) for b in range(a + 1, 3) for c in cells_of[a] & cells_of[b]]
    assert len(shared) <= 2  # ranks hold whole chunk cells, but where a cut had to fall inside one to balance
    assert len({len(g) for g in per_rank}) == 1  # every rank serves the same count
    assert not set(per_rank[0]) & set(per_rank[1])
    # the cell is the chunk's: every window centred in one chunk is served by one rank
    ds = make(0)
    table = ds.table(0)
    cells = ds.epoch_table(0).cells
    assert cells is not None
    np.testing.assert_array_equal(cells, chunk_cells(table, ds._tables.scenes, ds.georefs, 12))
    centre_chunk = {}
    for (s, r, c), cell in zip(table.rows.tolist(), cells.tolist(), strict=True):
        g = ds.grids[s]
        key = (s, (r + 8) // g.chunk_y, (c + 8) // g.chunk_x)
        assert centre_chunk.setdefault(key, cell) == cell
    rep = shard_report(ds.grids, table, ds.plan_spec, 0, 3, cells=cells)
    assert rep["max_min_samples"] <= 1.05
    assert rep["cells_multi_rank"] <= 2  # whole geohash-6 cells but where a cut must fall inside one to balance
    assert 0 <= rep["chunks_multi_rank"] < rep["chunks"]


def test_real_enmap_tiles_an_area_search_balance_and_geohash_shards(enmap_lake: dict[str, Any]) -> None:
    """The four real EnMAP L2A tiles over Potsdam: a bbox over the western pair, checked against the items' footprints."""
    with LakeCatalog(enmap_lake["lake"]) as cat:
        items = {h.id: shape(h.geometry) for h in cat.search(Query())}
    aoi = box(13.018, 52.407, 13.027, 52.421)
    want_scenes = {sid for sid, fp in items.items() if fp.intersects(aoi)}
    assert want_scenes == {"enmap_potsdam_tile_96_0", "enmap_potsdam_tile_96_32"}
    ds = CubeDataset.from_search(enmap_lake["lake"], bbox=aoi.bounds, sampling=Sampling(size=5, stride=2, labels="none"),
                                 plan=PlanSpec(batch_size=32, shard_by="geohash"), balance=RegionBalance(alpha=1.0))
    assert {s.scene_id for s in ds.sources} == want_scenes
    batches = list(ds)
    assert {s for b in batches for s in b["scene"]} == want_scenes
    for src, reg, g in zip(ds.sources, ds.regions, ds.georefs, strict=True):
        assert reg is not None
        assert g is not None
        rc = np.array([w[:2] for b in batches for s, w in zip(b["scene"], b["window"].tolist(), strict=True)
                       if s == src.scene_id])
        lon, lat = g.to_lonlat(rc[:, 0] + 2, rc[:, 1] + 2)  # the centre pixel's centre
        assert shapely.contains_xy(aoi.buffer(1e-9), lon, lat).all()
    m = ds.metrics()
    assert 0 < m.chunks_decoded <= sum(r.n_chunks for r in ds.regions if r is not None)
    assert m.region_samples_after < m.region_samples_before
    weights = torch.cat([b["weight"] for b in batches])
    assert float(weights.min()) >= 1.0
    assert float(weights.max()) <= 2.0



def test_sizes_and_strides_are_an_int_or_a_height_width_pair() -> None:
    from cubelake.loaders.samplers import RandomSampler, SlidingSampler

    s = SlidingSampler.of((16, 32), (8, 24))
    assert (s.size, s.stride) == ((16, 32), (8, 24))
    assert SlidingSampler.of(np.int64(20)).stride == (20, 20)  # the stride defaults to the size
    assert RandomSampler.of([12, 40], 5).size == (12, 40)
    for bad in (0, (16, 0), (-8, 8)):
        with pytest.raises(ValueError, match="window size must be positive"):
            SlidingSampler.of(bad)


@pytest.mark.parametrize("rule", ["center", "intersects", "within"])
def test_each_window_rule_keeps_exactly_the_brute_force_windows(rule: str) -> None:
    """Per window, in the region's own pixel space: the rule's test on one shapely geometry at a time, and every
    chunk the window touches meeting the area."""
    grid = ChunkGrid(300, 260, 64, 64)
    aoi = shapely.Polygon([lonlat(*p) for p in [(40, 30), (60, 200), (230, 170), (250, 60), (120, 100)]])
    reg = region_of(aoi, grid, UTM33, (30.0, 0.0, ORIGIN[0], 0.0, -30.0, ORIGIN[1]))
    table = SlidingSampler.of((16, 24), (8, 12)).windows(SceneView(0, grid), 0, 0)
    want = set()
    for r, c in table.rows[:, 1:].tolist():
        if rule == "center":
            ok = reg.shape.intersects(shapely.Point(c + 12 + 0.5, r + 8 + 0.5))
        elif rule == "intersects":
            ok = reg.shape.intersects(box(c, r, c + 24, r + 16))
        else:
            ok = reg.shape.covers(box(c, r, c + 24, r + 16))
        chunks = [(y, x) for y in range(r // 64, min(r + 15, 299) // 64 + 1) for x in range(c // 64, min(c + 23, 259) // 64 + 1)]
        if ok and all(reg.chunks[y, x] for y, x in chunks):
            want.add((r, c))
    got = {(int(r), int(c)) for r, c in restrict(table, grid, reg, rule).rows[:, 1:]}  # type: ignore[arg-type]
    assert got == want
    assert 0 < len(got) < len(table)


def test_an_invalid_area_is_made_valid_before_it_is_used() -> None:
    """A self-crossing (bow-tie) area: its two triangles, not GEOS's undefined answers on an invalid ring."""
    grid = ChunkGrid(300, 260, 64, 64)
    tie = shapely.Polygon([lonlat(*p) for p in [(20, 20), (280, 240), (280, 20), (20, 240)]])
    assert not tie.is_valid
    reg = region_of(tie, grid, UTM33, (30.0, 0.0, ORIGIN[0], 0.0, -30.0, ORIGIN[1]))
    assert reg.shape.is_valid
    assert reg.shape.area == pytest.approx(2 * 0.5 * 220 * 130, rel=0.02)  # two triangles: base 220 px, height 130 px
    assert not reg.chunks[2, 0]  # left of the crossing point: outside both triangles
    assert reg.chunks[0, 1]  # the upper triangle
    assert reg.chunks[4, 1]  # and the lower one (segmentize kept only one of the two)


def test_random_windows_need_no_labels() -> None:
    from cubelake.loaders.samplers import RandomSampler

    assert RandomSampler.of(8, 4).needs_labels is False
    assert SlidingSampler.of(8).needs_labels is False
