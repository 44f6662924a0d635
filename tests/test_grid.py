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


def test_relative_to_subtracts_the_outer_origin() -> None:
    assert Window(10, 20, 5, 6).relative_to(Window(8, 16, 10, 10)) == Window(2, 4, 5, 6)
    with pytest.raises(ValueError, match="is not inside"):
        Window(10, 20, 5, 6).relative_to(Window(12, 16, 10, 10))


@pytest.mark.parametrize("idx", [ChunkIndex(0, 4), ChunkIndex(4, 0), ChunkIndex(-1, 0), ChunkIndex(0, -1)])
def test_every_chunk_index_off_the_grid_raises(idx: ChunkIndex) -> None:
    grid = ChunkGrid(100, 100, 32, 32)
    with pytest.raises(IndexError, match="outside a 4x4 grid"):
        grid.chunk_window(idx)
    assert grid.chunk_window(ChunkIndex(3, 3)) == Window(96, 96, 4, 4)  # the last chunk, clipped at the edge


@pytest.mark.parametrize(("bad", "hint"), [(100, 96), (120, 128), (5, 16), (250, 256)])
def test_a_bad_chunk_size_suggests_the_nearest_multiple(bad: int, hint: int) -> None:
    with pytest.raises(ValueError, match=f"got {bad}; try {hint}$"):
        parse_chunk_size(bad)


def test_windows_sort_by_position_then_size() -> None:
    ws = [Window(1, 0, 1, 1), Window(0, 5, 1, 1), Window(0, 2, 3, 3), Window(0, 2, 2, 9)]
    assert sorted(ws) == [Window(0, 2, 2, 9), Window(0, 2, 3, 3), Window(0, 5, 1, 1), Window(1, 0, 1, 1)]


@pytest.mark.parametrize(("window", "aligned"), [
    (Window(0, 0, 32, 32), True), (Window(64, 96, 36, 4), True),  # ends at the raster's edge
    (Window(5, 0, 27, 32), False), (Window(0, 5, 32, 27), False),  # a start off the grid, every other edge on it
    (Window(0, 0, 31, 32), False), (Window(0, 0, 32, 31), False), (Window(96, 0, 8, 32), False),  # past the edge
])
def test_aligned_needs_every_edge_on_the_grid(window: Window, aligned: bool) -> None:
    assert ChunkGrid(100, 100, 32, 32).is_aligned(window) is aligned
