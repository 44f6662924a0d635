"""Chunk-grid and window math: pure numpy-free integer arithmetic, no I/O.

Axis order is always ``(band, y, x)`` for cubes and ``(row, col)`` / ``(y, x)`` for the
spatial grid. A :class:`ChunkGrid` tiles a ``height × width`` raster into square-ish
``chunk_y × chunk_x`` chunks; the last row/column of chunks may be partial. The same grid
describes the COG's internal tiles and the Zarr chunks, which is what keeps them aligned.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "ChunkGrid",
    "ChunkIndex",
    "Window",
    "parse_chunk_size",
]


@dataclass(frozen=True, slots=True, order=True)
class Window:
    """A pixel rectangle: rows ``[row_off, row_off + height)``, cols ``[col_off, col_off + width)``."""

    row_off: int
    col_off: int
    height: int
    width: int

    def __post_init__(self) -> None:
        if self.height < 0 or self.width < 0:
            raise ValueError(f"window size must be >= 0, got {self.height}x{self.width}")

    @property
    def row_end(self) -> int:
        return self.row_off + self.height

    @property
    def col_end(self) -> int:
        return self.col_off + self.width

    @property
    def size(self) -> int:
        """Number of pixels."""
        return self.height * self.width

    def slices(self) -> tuple[slice, slice]:
        """``(row_slice, col_slice)`` for numpy indexing of a ``(y, x)`` array."""
        return slice(self.row_off, self.row_end), slice(self.col_off, self.col_end)

    def intersection(self, other: Window) -> Window | None:
        """The overlap of two windows, or ``None`` when they do not overlap."""
        r0 = max(self.row_off, other.row_off)
        c0 = max(self.col_off, other.col_off)
        r1 = min(self.row_end, other.row_end)
        c1 = min(self.col_end, other.col_end)
        if r1 <= r0 or c1 <= c0:
            return None
        return Window(r0, c0, r1 - r0, c1 - c0)

    def relative_to(self, outer: Window) -> Window:
        """This window in the coordinates of ``outer`` (which must contain it)."""
        if self.intersection(outer) != self:
            raise ValueError(f"{self} is not inside {outer}")
        return Window(self.row_off - outer.row_off, self.col_off - outer.col_off, self.height, self.width)


@dataclass(frozen=True, slots=True, order=True)
class ChunkIndex:
    """Position of a chunk in the grid: chunk row ``iy`` and chunk column ``ix``."""

    iy: int
    ix: int


@dataclass(frozen=True, slots=True)
class ChunkGrid:
    """A regular grid of ``chunk_y × chunk_x`` chunks over a ``height × width`` raster."""

    height: int
    width: int
    chunk_y: int
    chunk_x: int

    def __post_init__(self) -> None:
        if self.height <= 0 or self.width <= 0:
            raise ValueError(f"raster size must be > 0, got {self.height}x{self.width}")
        if self.chunk_y <= 0 or self.chunk_x <= 0:
            raise ValueError(f"chunk size must be > 0, got {self.chunk_y}x{self.chunk_x}")

    @classmethod
    def square(cls, height: int, width: int, chunk: int) -> ChunkGrid:
        return cls(height, width, chunk, chunk)

    @property
    def n_rows(self) -> int:
        """Number of chunk rows."""
        return math.ceil(self.height / self.chunk_y)

    @property
    def n_cols(self) -> int:
        """Number of chunk columns."""
        return math.ceil(self.width / self.chunk_x)

    @property
    def n_chunks(self) -> int:
        return self.n_rows * self.n_cols

    @property
    def extent(self) -> Window:
        return Window(0, 0, self.height, self.width)

    def chunk_window(self, idx: ChunkIndex) -> Window:
        """The pixel window of one chunk, clipped at the raster edge."""
        if not (0 <= idx.iy < self.n_rows and 0 <= idx.ix < self.n_cols):
            raise IndexError(f"chunk {idx} outside a {self.n_rows}x{self.n_cols} grid")
        r0 = idx.iy * self.chunk_y
        c0 = idx.ix * self.chunk_x
        return Window(r0, c0, min(self.chunk_y, self.height - r0), min(self.chunk_x, self.width - c0))

    def chunks(self) -> Iterator[ChunkIndex]:
        """Every chunk, row-major (the order of tiles in a TIFF and of a raster scan)."""
        for iy in range(self.n_rows):
            for ix in range(self.n_cols):
                yield ChunkIndex(iy, ix)

    def chunks_for_window(self, window: Window) -> list[ChunkIndex]:
        """The chunks a pixel window touches, row-major. Windows may extend past the edge."""
        clipped = window.intersection(self.extent)
        if clipped is None:
            return []
        iy0 = clipped.row_off // self.chunk_y
        iy1 = (clipped.row_end - 1) // self.chunk_y
        ix0 = clipped.col_off // self.chunk_x
        ix1 = (clipped.col_end - 1) // self.chunk_x
        return [ChunkIndex(iy, ix) for iy in range(iy0, iy1 + 1) for ix in range(ix0, ix1 + 1)]

    def coarsened(self, factor: int) -> ChunkGrid:
        """The grid of ``factor × factor`` blocks of chunks (e.g. Zarr shards); its cells are chunk-aligned."""
        if factor < 1:
            raise ValueError(f"factor must be >= 1, got {factor}")
        return ChunkGrid(self.height, self.width, self.chunk_y * factor, self.chunk_x * factor)

    def is_aligned(self, window: Window) -> bool:
        """True when ``window`` starts on a chunk boundary and ends on one or at the edge."""
        return (
            window.row_off % self.chunk_y == 0
            and window.col_off % self.chunk_x == 0
            and (window.row_end % self.chunk_y == 0 or window.row_end == self.height)
            and (window.col_end % self.chunk_x == 0 or window.col_end == self.width)
            and window.row_end <= self.height
            and window.col_end <= self.width
        )


def parse_chunk_size(value: int, *, multiple_of: int = 16) -> int:
    """Check a spatial chunk size (pixels): positive and a multiple of ``multiple_of``.

    TIFF requires tile sizes that are multiples of 16, and the COG tiles are the chunks.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"chunk size must be an integer number of pixels, got {value!r}")
    if value <= 0 or value % multiple_of:
        raise ValueError(
            f"chunk size must be a positive multiple of {multiple_of} pixels (TIFF tile rule), "
            f"got {value}; try {max(multiple_of, round(value / multiple_of) * multiple_of)}"
        )
    return value
