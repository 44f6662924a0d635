"""The pure planner: windows, chunk sets, epoch order, residency, sharding, randomness."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cubelake.grid import Window
from cubelake.loaders import (
    ChunkGrid,
    PlanSpec,
    SampleTable,
    coalesce,
    plan_epoch,
    randomness,
)
from cubelake.loaders.cache import Range
from cubelake.loaders.plan import (
    NextUse,
    _sample_chunk_ids,
    label_windows,
    random_windows,
    residency,
    shard_report,
    sliding_windows,
    windows_in_chunks,
)

grids_st = st.builds(ChunkGrid, st.integers(20, 300), st.integers(20, 300), st.sampled_from([16, 32, 64]),
                     st.sampled_from([16, 32, 64]))


def window_chunks(g: ChunkGrid, row: int, col: int, size: tuple[int, int]) -> list[tuple[int, int]]:
    return [(c.iy, c.ix) for c in g.chunks_for_window(Window(row, col, *size))]


@given(grids_st, st.integers(-40, 320), st.integers(-40, 320), st.integers(1, 80), st.integers(1, 80))
def test_planned_chunks_of_a_window_are_exactly_the_overlapped_chunks(g: ChunkGrid, row: int, col: int, h: int,
                                                                       w: int) -> None:
    assume(row < g.height and col < g.width and row + h > 0 and col + w > 0)  # samples overlap their raster
    indptr, keys = _sample_chunk_ids([g], SampleTable((h, w), np.array([[0, row, col]]), np.array([-1])))
    got = {divmod(int(k), g.n_cols) for k in keys[indptr[0]:indptr[1]]}  # the planner's vectorised chunk sets
    assert got == set(window_chunks(g, row, col, (h, w)))  # agree with the grid's scalar answer
    want = {(cy, cx) for cy in range(g.n_rows) for cx in range(g.n_cols)
            if row < (cy + 1) * g.chunk_y and row + h > cy * g.chunk_y and row < g.height and row + h > 0
            and col < (cx + 1) * g.chunk_x and col + w > cx * g.chunk_x and col < g.width and col + w > 0}
    assert got == want


@given(grids_st, st.integers(4, 40), st.integers(1, 40), st.sampled_from(["drop", "pad"]))
def test_sliding_windows_cover_the_raster(g: ChunkGrid, size: int, stride: int, edge: str) -> None:
    t = sliding_windows(0, g, (size, size), (stride, stride), edge)  # type: ignore[arg-type]
    r, c = t.rows[:, 1], t.rows[:, 2]
    if edge == "drop":
        assert (r >= 0).all()
        assert (r + size <= g.height).all()
        assert (c + size <= g.width).all()
        assert len(t) == (len(range(0, g.height - size + 1, stride)) * len(range(0, g.width - size + 1, stride)))
    elif stride <= size:  # padded windows reach every pixel
        cover = np.zeros((g.height, g.width), bool)
        for y, x in zip(r, c, strict=True):
            cover[y:y + size, x:x + size] = True
        assert cover.all()


def _table(grids: list[ChunkGrid], size: int = 32, stride: int = 16) -> SampleTable:
    return SampleTable.concat((size, size), [sliding_windows(i, g, (size, size), (stride, stride)) for i, g in enumerate(grids)])


def _traversal_spread(g: ChunkGrid, size: int) -> int:
    """Traversal steps between the first and last chunk of a ``size`` window, chunks visited row by row
    along the grid's shorter side (either side when square), the window placed worst."""
    span_y = min((size - 1) // g.chunk_y + 2, g.n_rows)
    span_x = min((size - 1) // g.chunk_x + 2, g.n_cols)
    spreads = []
    if g.n_rows >= g.n_cols:
        spreads.append((span_y - 1) * g.n_cols + span_x - 1)
    if g.n_rows <= g.n_cols:
        spreads.append((span_x - 1) * g.n_rows + span_y - 1)
    return max(spreads)


def _simulate_decodes(plan, resident: int) -> int:
    """Decodes an LRU of ``resident`` chunks needs to serve ``plan`` in order (releasing after last use)."""
    held: dict[int, None] = {}
    decodes = 0
    for pos in range(len(plan)):
        for c in plan.chunks_of(pos):
            c = int(c)
            if c in held:
                held.pop(c)
            else:
                decodes += 1
                if len(held) >= resident:
                    held.pop(next(iter(held)))
            held[c] = None
        for c in np.flatnonzero(plan.last_use == pos):
            held.pop(int(c), None)
    return decodes


@settings(deadline=None, max_examples=40)
@given(st.lists(grids_st, min_size=1, max_size=4), st.integers(0, 2**31), st.integers(1, 12), st.integers(1, 3))
def test_epoch_serves_every_sample_once_and_each_chunk_once_within_its_residency(grids, seed, k, flight) -> None:
    table = _table(grids)
    plan = plan_epoch(grids, table, PlanSpec(seed=seed, chunks_per_round=k, scenes_in_flight=flight), 0)
    assert np.array_equal(np.sort(plan.order), np.arange(len(table)))
    # every chunk a sample needs is listed for it, and first/last use bracket all its uses
    for pos in range(0, len(plan), max(1, len(plan) // 50)):
        s, r, c = table.rows[plan.order[pos]]
        want = {(int(s), cy * grids[s].n_cols + cx) for cy, cx in window_chunks(grids[s], int(r), int(c), table.size)}
        got = {tuple(int(v) for v in plan.chunks[i]) for i in plan.chunks_of(pos)}
        assert got == want
        assert all(plan.first_use[i] <= pos <= plan.last_use[i] for i in plan.chunks_of(pos))
    peak = residency(plan)
    assert _simulate_decodes(plan, peak) == plan.chunks.shape[0]  # a resident set of `peak` decodes each once
    # ... and that set is small: a round of k chunks plus, per scene in flight, the chunks between a window's
    # first and last in the traversal (a shuffled serving order needs far more, and fails here)
    assert peak <= k + flight * (max(_traversal_spread(g, 32) for g in grids) + 1)


def test_local_order_needs_a_small_resident_set_and_random_order_a_large_one() -> None:
    grids = [ChunkGrid(2048, 2048, 256, 256)] * 3
    table = _table(grids)
    local = plan_epoch(grids, table, PlanSpec(seed=1, chunks_per_round=8, scenes_in_flight=1), 0)
    rand = plan_epoch(grids, table, PlanSpec(seed=1, chunks_per_round=8, scenes_in_flight=1, order="random"), 0)
    assert residency(local) <= 8 + 2 * 8 + 2  # a round plus one chunk row of carry-over
    assert residency(rand) > 2 * residency(local)


def test_plan_is_deterministic_per_seed_and_epoch() -> None:
    grids = [ChunkGrid(500, 700, 64, 64), ChunkGrid(300, 300, 64, 64)]
    table = _table(grids)
    spec = PlanSpec(seed=7)
    a, b = plan_epoch(grids, table, spec, 3), plan_epoch(grids, table, spec, 3)
    assert np.array_equal(a.order, b.order)
    assert not np.array_equal(a.order, plan_epoch(grids, table, spec, 4).order)
    assert not np.array_equal(a.order, plan_epoch(grids, table, PlanSpec(seed=8), 3).order)


@pytest.mark.parametrize(("world", "workers"), [(1, 2), (1, 3), (2, 1), (2, 2), (3, 2)])
def test_shards_are_disjoint_and_ranks_serve_equal_counts(world: int, workers: int) -> None:
    grids = [ChunkGrid(400 + 37 * i, 300 + 53 * i, 64, 64) for i in range(7)]
    table = _table(grids)
    spec = PlanSpec(seed=2)
    seen: list[int] = []
    owned: list[set[tuple[int, int]]] = []
    per_rank = []
    for r in range(world):
        n = 0
        for w in range(workers):
            p = plan_epoch(grids, table, spec, 0, rank=r, world_size=world, worker=w, num_workers=workers)
            seen.extend(p.order.tolist())
            owned.append({(int(s), int(c)) for s, c in p.chunks})
            assert p.worker_sizes[w] == len(p)
            n += len(p)
        per_rank.append(n)
    assert len(seen) == len(set(seen))  # no sample twice
    assert len(set(per_rank)) == 1  # DDP: every rank takes the same number of steps
    assert len(seen) >= 0.97 * len(table)  # balanced: little is dropped to equalise ranks
    # uneven scenes are cut into strips to balance; only chunks on a strip seam are read twice
    overlap = sum(len(owned[i] & owned[j]) for i in range(len(owned)) for j in range(i + 1, len(owned)))
    assert overlap <= 2 * (world * workers) * max(g.n_cols for g in grids)


@pytest.mark.parametrize("shards", [2, 3, 4, 6])
def test_whole_scenes_go_to_shards_when_they_balance(shards: int) -> None:
    grids = [ChunkGrid(512, 512, 64, 64)] * 12
    table = _table(grids)
    owned = [{(int(s), int(c)) for s, c in plan_epoch(grids, table, PlanSpec(seed=5), 1, worker=w, num_workers=shards).chunks}
             for w in range(shards)]
    for i in range(shards):
        for j in range(i + 1, shards):
            assert not owned[i] & owned[j]  # no chunk is fetched by two workers
    assert sum(len(o) for o in owned) == 12 * 64


def test_one_scene_split_across_workers_shares_only_seam_chunks() -> None:
    grids = [ChunkGrid(1024, 1024, 128, 128)]
    table = _table(grids)
    plans = [plan_epoch(grids, table, PlanSpec(seed=0), 0, worker=w, num_workers=2) for w in range(2)]
    assert sum(len(p) for p in plans) == len(table)
    shared = {tuple(c) for c in plans[0].chunks.tolist()} & {tuple(c) for c in plans[1].chunks.tolist()}
    assert 0 < len(shared) <= 2 * grids[0].n_cols  # the strip seam, no more
    assert plans[0].shared_chunks + plans[1].shared_chunks == len(shared)


def test_rounds_mix_more_chunks_per_batch_as_k_grows() -> None:
    grids = [ChunkGrid(1024, 1024, 128, 128)] * 2
    table = _table(grids)
    mix = [randomness(plan_epoch(grids, table, PlanSpec(seed=0, chunks_per_round=k), 0), table, grids, 64)
           for k in (1, 4, 16)]
    dc = [m.distinct_chunks_per_batch for m in mix]
    assert dc[0] < dc[1] < dc[2]
    assert mix[2].lag1_autocorrelation < mix[0].lag1_autocorrelation
    assert abs(mix[2].shuffle_lag1_autocorrelation) < 0.1  # the full-shuffle reference
    assert mix[2].shuffle_distinct_chunks_per_batch > dc[2]


def test_min_chunks_per_batch_raises_k() -> None:
    grids = [ChunkGrid(1024, 1024, 128, 128)]
    table = _table(grids)
    p = plan_epoch(grids, table, PlanSpec(seed=0, chunks_per_round=1, min_chunks_per_batch=12), 0)
    assert randomness(p, table, grids, 64).distinct_chunks_per_batch >= 8


def test_label_and_random_windows() -> None:
    g = ChunkGrid(50, 60, 16, 16)
    t = label_windows(0, g, (9, 9), np.array([0, 25, 49]), np.array([0, 30, 59]), np.array([3, 4, 5]), edge="drop")
    assert t.rows.tolist() == [[0, 21, 26]]
    assert t.labels.tolist() == [4]
    t = label_windows(0, g, (9, 9), np.array([0, 25]), np.array([0, 30]), np.array([3, 4]), edge="pad")
    assert t.rows.tolist() == [[0, -4, -4], [0, 21, 26]]
    r = random_windows(0, g, (8, 8), 500, np.random.default_rng(0))
    assert len(r) == 500
    assert (r.rows[:, 1] + 8 <= 50).all()
    assert (r.rows[:, 2] + 8 <= 60).all()
    valid = np.zeros((g.n_rows, g.n_cols), bool)
    valid[0, 0] = True
    kept = sliding_windows(0, g, (8, 8), (8, 8), valid_chunks=valid)
    assert kept.rows[:, 1:].tolist() == [[0, 0], [0, 8], [8, 0], [8, 8]]


def test_invalid_specs_are_refused() -> None:
    with pytest.raises(ValueError, match="order"):
        PlanSpec(order="sorted")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        sliding_windows(0, ChunkGrid(10, 10, 4, 4), (0, 4), (1, 1))
    with pytest.raises(ValueError, match="out of range"):
        plan_epoch([ChunkGrid(10, 10, 4, 4)], _table([ChunkGrid(10, 10, 4, 4)], 4, 4), PlanSpec(), 0, worker=2, num_workers=2)


def test_coalesce_merges_adjacent_ranges_up_to_the_gap() -> None:
    rs = [Range(100, 200, "b"), Range(0, 100, "a"), Range(250, 300, "c"), Range(1000, 1100, "d")]
    assert [(s, e, [m.tag for m in ms]) for s, e, ms in coalesce(rs)] == [(0, 200, ["a", "b"]), (250, 300, ["c"]), (1000, 1100, ["d"])]
    assert [(s, e) for s, e, _ in coalesce(rs, max_gap=50)] == [(0, 300), (1000, 1100)]
    assert [(s, e) for s, e, _ in coalesce(rs, max_gap=10_000, max_size=300)] == [(0, 300), (1000, 1100)]


@settings(max_examples=60, deadline=None)
@given(st.integers(-20, 120), st.integers(-20, 120), st.integers(1, 70), st.integers(1, 70), st.integers(0, 2**9 - 1))
def test_windows_in_chunks_equals_brute_force(r: int, c: int, h: int, w: int, bits: int) -> None:
    """Whether every / any chunk a window touches (clipped to the raster) is in the mask, against a pixel walk."""
    grid = ChunkGrid(100, 90, 40, 32)  # 3 x 3 chunks, partial ones at the edges
    mask = np.array([(bits >> i) & 1 for i in range(9)], bool).reshape(3, 3)
    rows = np.array([[0, r, c]], np.int64)
    ys = np.clip(np.arange(r, r + h), 0, grid.height - 1) // grid.chunk_y
    xs = np.clip(np.arange(c, c + w), 0, grid.width - 1) // grid.chunk_x
    touched = {(int(y), int(x)) for y in ys for x in xs}
    assert windows_in_chunks(grid, rows, (h, w), mask, every=True)[0] == all(mask[t] for t in touched)
    assert windows_in_chunks(grid, rows, (h, w), mask, every=False)[0] == any(mask[t] for t in touched)
    assert windows_in_chunks(grid, rows[:0], (h, w), mask, every=True).shape == (0,)


@settings(deadline=None, max_examples=25)
@given(st.lists(grids_st, min_size=1, max_size=3), st.integers(0, 2**31), st.integers(0, 400))
def test_next_use_is_the_first_use_at_or_after_a_position(grids, seed, at) -> None:
    plan = plan_epoch(grids, _table(grids), PlanSpec(seed=seed, chunks_per_round=4), 0)
    position = at % (len(plan) + 1)
    chunks = np.arange(plan.chunks.shape[0])
    want = np.full(chunks.size, len(plan))
    for pos in range(len(plan) - 1, position - 1, -1):  # brute force: walk back from the end
        want[plan.chunks_of(pos)] = pos
    np.testing.assert_array_equal(NextUse(plan).after(chunks, position), want)


@pytest.mark.parametrize(("height", "width", "bands_of"), [(1024, 256, "rows"), (256, 1024, "cols"),
                                                            (512, 512, "rows")])
def test_strips_run_across_the_shorter_side(height: int, width: int, bands_of: str) -> None:
    """A scene split between shards is cut into bands of whole chunk rows (tall or square scenes) or whole
    chunk columns (wide ones): the seam is the short side."""
    grids = [ChunkGrid(height, width, 64, 64)]
    table = _table(grids)
    for w in range(2):
        plan = plan_epoch(grids, table, PlanSpec(seed=3), 0, worker=w, num_workers=2)
        rows, cols = np.divmod(plan.chunks[:, 1], grids[0].n_cols)
        across, along = (cols, rows) if bands_of == "rows" else (rows, cols)
        assert set(across.tolist()) == set(range(grids[0].n_cols if bands_of == "rows" else grids[0].n_rows))
        assert np.ptp(along) + 1 < (grids[0].n_rows if bands_of == "rows" else grids[0].n_cols)  # a band, not all


def test_the_shard_report_counts_what_the_plans_serve_and_drop() -> None:
    grids = [ChunkGrid(400 + 37 * i, 300 + 53 * i, 64, 64) for i in range(5)]
    table = _table(grids)
    spec = PlanSpec(seed=4, drop_last=True)
    rep = shard_report(grids, table, spec, 0, world_size=2, num_workers=2)
    plans = [[plan_epoch(grids, table, spec, 0, rank=r, world_size=2, worker=w, num_workers=2) for w in range(2)]
             for r in range(2)]
    for r, ps in enumerate(plans):
        row = rep["ranks"][r]
        assert row["samples"] == sum(len(p) for p in ps)
        assert row["dropped"] == sum(p.dropped for p in ps) == row["samples_before_trim"] - row["samples"]
    assert rep["served"] + rep["dropped"] == rep["samples"] == len(table)
    assert rep["ranks"][0]["samples"] == rep["ranks"][1]["samples"]
    assert rep["dropped"] > 0  # the uneven scenes do not split exactly: the larger rank gives some up
    # brute force over the plans' own chunk sets
    shard_sets = [{(int(a), int(b)) for a, b in p.chunks} for ps in plans for p in ps]
    rank_sets = [shard_sets[0] | shard_sets[1], shard_sets[2] | shard_sets[3]]
    assert rep["chunks"] == len(set().union(*shard_sets))
    assert rep["chunks_multi_rank"] == len(rank_sets[0] & rank_sets[1])
    assert rep["chunks_multi_shard"] == sum(
        sum(key in other for other in shard_sets) > 1 for key in set().union(*shard_sets))
    assert [p.shard for ps in plans for p in ps] == [0, 1, 2, 3]
    assert {p.num_shards for ps in plans for p in ps} == {4}
    assert rep["chunks_multi_rank_fraction"] == rep["chunks_multi_rank"] / rep["chunks"]
    assert rep["chunks_multi_shard_fraction"] == rep["chunks_multi_shard"] / rep["chunks"]
    assert 0 < rep["chunks_multi_shard"] < rep["chunks"]


def test_geohash_shards_of_several_scenes_serve_each_sample_once_in_rounds() -> None:
    grids = [ChunkGrid(512, 512, 64, 64), ChunkGrid(384, 640, 64, 64), ChunkGrid(448, 448, 64, 64)]
    table = _table(grids)
    s, r, c = table.rows[:, 0], table.rows[:, 1], table.rows[:, 2]
    cells = np.array([f"u{a}{b // 96}{d // 96}zz" for a, b, d in zip(s, r, c, strict=True)])
    spec = PlanSpec(seed=6, chunks_per_round=4, scenes_in_flight=2, shard_by="geohash")
    served: list[int] = []
    for w in range(2):
        plan = plan_epoch(grids, table, spec, 0, worker=w, num_workers=2, cells=cells)
        served.extend(plan.order.tolist())
        for pos in range(len(plan)):
            sc, row, col = table.rows[plan.order[pos]]
            want = {(int(sc), cy * grids[sc].n_cols + cx) for cy, cx in window_chunks(grids[sc], int(row), int(col),
                                                                                     table.size)}
            assert {tuple(int(v) for v in plan.chunks[i]) for i in plan.chunks_of(pos)} == want
        assert residency(plan) <= 4 + 2 * (max(_traversal_spread(g, 32) for g in grids) + 1)
    assert sorted(served) == list(range(len(table)))


def test_a_shard_left_without_chunks_serves_nothing() -> None:
    grids = [ChunkGrid(64, 64, 64, 64)]  # one chunk: one worker gets it, the others nothing
    table = _table(grids)
    sizes = [len(plan_epoch(grids, table, PlanSpec(seed=1), 0, worker=w, num_workers=3)) for w in range(3)]
    assert sorted(sizes) == [0, 0, len(table)]


def test_an_empty_table_plans_an_empty_epoch() -> None:
    """Backs the justification of the empty-table mutant in mutation/equivalent.toml."""
    grids = [ChunkGrid(64, 64, 32, 32)]
    plan = plan_epoch(grids, sliding_windows(0, grids[0], (128, 128), (128, 128)), PlanSpec(), 0)
    assert len(plan) == 0
    assert plan.indptr.tolist() == [0]
    assert plan.chunks.shape == (0, 2)
    assert residency(plan) == 0
