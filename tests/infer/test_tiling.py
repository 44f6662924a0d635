"""Tile planning and stitching (pure)."""

from __future__ import annotations

import numpy as np
import pytest

from cubelake.infer.tiling import Stitcher, blend_weights, plan_tiles


def test_tiles_are_chunk_aligned_cores_with_clipped_halo_windows() -> None:
    plan = plan_tiles(50, 70, 16, 16, halo=5, tile_chunks=2)
    assert [len(r) for r in plan.tiles] == [3, 3]  # 32-px cores: rows 0-32, 32-50; cols 0-32, 32-64, 64-70
    t = plan.tiles[1][1]
    assert t.core == (32, 50, 32, 64)
    assert t.window == (27, 50, 27, 69)  # clipped at the scene's bottom edge
    assert plan.tiles[0][0].window == (0, 37, 0, 37)
    assert plan.lag == 1
    assert plan.chunks_of(t.window) == [(cy, cx) for cy in (1, 2, 3) for cx in (1, 2, 3, 4)]
    covered = np.zeros((50, 70), int)
    for row in plan.tiles:
        for tile in row:
            y0, y1, x0, x1 = tile.core
            covered[y0:y1, x0:x1] += 1
    assert (covered == 1).all()


def test_a_halo_wider_than_a_tile_row_waits_more_rows() -> None:
    assert plan_tiles(100, 100, 8, 8, halo=20).lag == 3


@pytest.mark.parametrize("blend", ["center", "mean", "cosine"])
def test_stitching_equal_tile_outputs_gives_the_map_back(blend: str) -> None:
    """Every tile predicting the true map over its window: any blend must return that map exactly (no seams)."""
    plan = plan_tiles(45, 61, 8, 8, halo=6)
    truth = np.random.default_rng(1).random((3, 45, 61)).astype(np.float32)
    st = Stitcher(plan, 3)
    rows = []
    for row in plan.tiles:
        for tile in row:
            y0, y1, x0, x1 = tile.window
            st.add(tile, truth[:, y0:y1, x0:x1], blend_weights(plan, tile, blend))  # type: ignore[arg-type]
        rows += [(r, acc.copy(), w.copy()) for r, acc, w in st.finished(row[0].row)]
    assert [r for r, _, _ in rows] == list(range(len(plan.tiles)))
    out = np.concatenate([acc for _, acc, _ in rows], axis=1)
    np.testing.assert_allclose(out, truth, rtol=1e-6)
    assert all((w > 0).all() for _, _, w in rows)


def test_blend_weights() -> None:
    plan = plan_tiles(64, 64, 16, 16, halo=4)
    tile = plan.tiles[1][1]  # interior: a full halo on each side
    w = {b: blend_weights(plan, tile, b) for b in ("center", "mean", "cosine")}  # type: ignore[misc]
    assert w["center"].shape == (24, 24)
    assert w["center"].sum() == 16 * 16
    assert (w["mean"] == 1).all()
    cos = w["cosine"]
    assert (cos[4:20, 4:20] == 1).all()
    ramp = cos[12, :4]
    assert np.all(np.diff(ramp) > 0)  # rising towards the core
    assert 0 < ramp[0] < 0.2
    edge = blend_weights(plan, plan.tiles[0][0], "cosine")  # the scene edge is not tapered
    assert (edge[:16, :16] == 1).all()
    with pytest.raises(ValueError, match="blend"):
        blend_weights(plan, tile, "gauss")  # type: ignore[arg-type]
