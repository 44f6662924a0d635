"""Property tests of the chunk-grid and window math (pure, no I/O)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cubelake.grid import ChunkGrid, ChunkIndex, Window, parse_chunk_size

sizes = st.integers(min_value=1, max_value=700)
chunks = st.integers(min_value=8, max_value=300)
FAST = settings(deadline=None, max_examples=60)


@st.composite
def grids(draw: st.DrawFn) -> ChunkGrid:
    return ChunkGrid(draw(sizes), draw(sizes), draw(chunks), draw(chunks))


@FAST
@given(grids())
def test_chunks_tile_the_raster_exactly(grid: ChunkGrid) -> None:
    covered = 0
    seen: set[tuple[int, int]] = set()
    for c in grid.chunks():
        w = grid.chunk_window(c)
        assert w.height > 0
        assert w.width > 0
        assert w.row_end <= grid.height
        assert w.col_end <= grid.width
        assert grid.is_aligned(w)
        covered += w.size
        seen.add((c.iy, c.ix))
    assert covered == grid.height * grid.width  # no gaps, no overlaps
    assert len(seen) == grid.n_chunks == grid.n_rows * grid.n_cols


@FAST
@given(grids(), st.data())
def test_chunks_for_window_is_exactly_the_intersecting_chunks(grid: ChunkGrid, data: st.DataObject) -> None:
    r0 = data.draw(st.integers(-50, grid.height + 50))
    c0 = data.draw(st.integers(-50, grid.width + 50))
    h = data.draw(st.integers(0, 200))
    w = data.draw(st.integers(0, 200))
    win = Window(r0, c0, h, w)
    got = grid.chunks_for_window(win)
    brute = [c for c in grid.chunks() if grid.chunk_window(c).intersection(win) is not None]
    assert got == brute


@FAST
@given(grids(), st.data())
def test_relative_window_roundtrip(grid: ChunkGrid, data: st.DataObject) -> None:
    c = ChunkIndex(data.draw(st.integers(0, grid.n_rows - 1)), data.draw(st.integers(0, grid.n_cols - 1)))
    win = grid.chunk_window(c)
    rel = win.relative_to(grid.extent)
    assert rel == win
    inner = Window(win.row_off, win.col_off, max(1, win.height // 2), max(1, win.width // 2))
    r = inner.relative_to(win)
    assert (r.row_off, r.col_off) == (0, 0)
    assert (r.height, r.width) == (inner.height, inner.width)


@FAST
@given(grids(), st.integers(1, 6))
def test_coarsened_grid_partitions_the_chunks(grid: ChunkGrid, factor: int) -> None:
    units = grid.coarsened(factor)
    seen: list[ChunkIndex] = []
    for u in units.chunks():
        w = units.chunk_window(u)
        assert grid.is_aligned(w)  # a shard holds whole chunks
        inside = grid.chunks_for_window(w)
        assert len(inside) <= factor * factor
        assert all(grid.chunk_window(c).intersection(w) == grid.chunk_window(c) for c in inside)
        seen.extend(inside)
    assert sorted(seen) == list(grid.chunks())  # every chunk in exactly one unit


def test_chunk_window_outside_grid_raises() -> None:
    grid = ChunkGrid(100, 100, 32, 32)
    with pytest.raises(IndexError):
        grid.chunk_window(ChunkIndex(4, 0))


@pytest.mark.parametrize("bad", [0, -16, 17, 250, 1.5, True, "256"])
def test_parse_chunk_size_rejects_non_multiples_of_16(bad: object) -> None:
    with pytest.raises(ValueError, match="chunk size"):
        parse_chunk_size(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("good", [16, 32, 256, 512, 1024])
def test_parse_chunk_size_accepts_multiples_of_16(good: int) -> None:
    assert parse_chunk_size(good) == good


def test_window_rejects_negative_size() -> None:
    with pytest.raises(ValueError, match="window size"):
        Window(0, 0, -1, 5)
