"""Tiles for whole-scene prediction and how their outputs are stitched: pure planning, no I/O, no torch.

A tile's *core* is a block of ``tile_chunks`` x ``tile_chunks`` chunks of the scene's grid; its
*window* is the core grown by ``halo`` pixels each side, clipped to the scene. The model sees the
window; its output over the window is blended into the map:

* ``center``: only the core is kept. With ``halo`` >= the model's receptive-field radius every core
  pixel sees all the context it would see in a whole-scene run, so the map equals the whole-scene
  prediction (to float rounding), with no seam.
* ``mean``: every tile's whole window counts, overlapping outputs averaged with equal weight.
* ``cosine``: weight 1 over the core, falling as a raised cosine across the halo (a pixel the model
  saw near its window's edge, with less context, counts less); scene edges are not tapered.

Outputs are accumulated per tile row; a tile row is final once the rows whose windows reach it are
done (``lag`` rows later), then its chunks are emitted in row-major order. Memory is
``(2 * lag + 1)`` tile rows of the map, never the whole scene.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

__all__ = ["BLENDS", "Blend", "Stitcher", "Tile", "TilePlan", "blend_weights", "plan_tiles"]

Blend = Literal["center", "mean", "cosine"]
BLENDS: tuple[Blend, ...] = ("center", "mean", "cosine")
Box = tuple[int, int, int, int]  # y0, y1, x0, x1 (end-exclusive)


@dataclass(frozen=True, slots=True)
class Tile:
    row: int
    col: int
    core: Box
    window: Box  # core + halo, clipped to the scene


@dataclass(frozen=True)
class TilePlan:
    """The tiles over a ``height`` x ``width`` scene of ``chunk_y`` x ``chunk_x`` chunks."""

    height: int
    width: int
    chunk_y: int
    chunk_x: int
    halo: int
    tile_chunks: int = 1
    tiles: list[list[Tile]] = field(default_factory=list, repr=False)

    @property
    def core_y(self) -> int:
        return self.chunk_y * self.tile_chunks

    @property
    def core_x(self) -> int:
        return self.chunk_x * self.tile_chunks

    @property
    def lag(self) -> int:
        """Tile rows after which a row's outputs are final (its neighbours' windows reach ``halo`` into it)."""
        return math.ceil(self.halo / self.core_y) if self.halo else 0

    @property
    def n_chunk_cols(self) -> int:
        return -(-self.width // self.chunk_x)

    def chunks_of(self, box: Box) -> list[tuple[int, int]]:
        """The grid chunks ``(cy, cx)`` a box touches, row-major."""
        y0, y1, x0, x1 = box
        return [(cy, cx) for cy in range(y0 // self.chunk_y, -(-y1 // self.chunk_y))
                for cx in range(x0 // self.chunk_x, -(-x1 // self.chunk_x))]

    def core_chunks(self, tile: Tile) -> list[tuple[int, int]]:
        return self.chunks_of(tile.core)


def plan_tiles(height: int, width: int, chunk_y: int, chunk_x: int, halo: int, tile_chunks: int = 1) -> TilePlan:
    """Tiles of ``tile_chunks`` x ``tile_chunks`` chunks, each with a ``halo``-pixel window around it."""
    if height <= 0 or width <= 0 or chunk_y <= 0 or chunk_x <= 0:
        raise ValueError(f"scene {height}x{width} with chunks {chunk_y}x{chunk_x}: sizes must be > 0")
    if halo < 0 or tile_chunks < 1:
        raise ValueError(f"halo={halo} must be >= 0 and tile_chunks={tile_chunks} >= 1")
    cy, cx = chunk_y * tile_chunks, chunk_x * tile_chunks
    rows = []
    for r, y0 in enumerate(range(0, height, cy)):
        y1 = min(y0 + cy, height)
        row = []
        for c, x0 in enumerate(range(0, width, cx)):
            x1 = min(x0 + cx, width)
            window = (max(y0 - halo, 0), min(y1 + halo, height), max(x0 - halo, 0), min(x1 + halo, width))
            row.append(Tile(r, c, (y0, y1, x0, x1), window))
        rows.append(row)
    return TilePlan(height, width, chunk_y, chunk_x, halo, tile_chunks, rows)


def _ramp(n_before: int, n_core: int, n_after: int, halo: int, blend: Blend) -> np.ndarray:
    """Weights along one axis of a window: ``n_before`` halo pixels, the core, ``n_after`` halo pixels."""
    w = np.zeros(n_before + n_core + n_after, np.float32)
    w[n_before:n_before + n_core] = 1.0
    if blend == "center":
        return w
    if blend == "mean":
        w[:] = 1.0
        return w
    d = np.arange(1, halo + 1, dtype=np.float64)  # distance from the core, in pixels
    taper = (0.5 * (1.0 + np.cos(np.pi * d / (halo + 1)))).astype(np.float32)  # in (0, 1), falling outwards
    if n_before:
        w[:n_before] = taper[:n_before][::-1]
    if n_after:
        w[n_before + n_core:] = taper[:n_after]
    return w


def blend_weights(plan: TilePlan, tile: Tile, blend: Blend) -> np.ndarray:
    """``(window_h, window_w)`` weights of the tile's output (see the module docstring)."""
    if blend not in BLENDS:
        raise ValueError(f"blend {blend!r}: one of {', '.join(BLENDS)}")
    (wy0, wy1, wx0, wx1), (y0, y1, x0, x1) = tile.window, tile.core
    wy = _ramp(y0 - wy0, y1 - y0, wy1 - y1, plan.halo, blend)
    wx = _ramp(x0 - wx0, x1 - x0, wx1 - x1, plan.halo, blend)
    return wy[:, None] * wx[None, :]


class Stitcher:
    """Accumulates weighted tile outputs ``(K, h, w)`` per tile row and hands out finished chunks."""

    def __init__(self, plan: TilePlan, channels: int) -> None:
        self.plan, self.channels = plan, channels
        self._rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # tile row -> (sum (K, h, W), weight (h, W))
        self._next = 0  # the first tile row not yet emitted

    def _buffer(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        if r not in self._rows:
            y0, y1 = self.plan.tiles[r][0].core[:2]
            self._rows[r] = (np.zeros((self.channels, y1 - y0, self.plan.width), np.float32),
                             np.zeros((y1 - y0, self.plan.width), np.float32))
        return self._rows[r]

    def add(self, tile: Tile, out: np.ndarray, weights: np.ndarray) -> None:
        """Add ``out`` (``(K, window_h, window_w)``) with ``weights`` (``(window_h, window_w)``)."""
        wy0, wy1, wx0, wx1 = tile.window
        cy = self.plan.core_y
        for r in range(wy0 // cy, -(-wy1 // cy)):
            acc, wsum = self._buffer(r)
            ry0 = r * cy
            a, b = max(wy0, ry0), min(wy1, ry0 + acc.shape[1])
            wpart = weights[a - wy0:b - wy0]
            if not wpart.any():
                continue
            acc[:, a - ry0:b - ry0, wx0:wx1] += out[:, a - wy0:b - wy0] * wpart
            wsum[a - ry0:b - ry0, wx0:wx1] += wpart

    def finished(self, done_row: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Tile rows final once tile row ``done_row`` was added: ``(tile row, blended (K, h, W), weight (h, W))``."""
        last = len(self.plan.tiles) - 1
        upto = last if done_row >= last else done_row - self.plan.lag
        while self._next <= upto:
            acc, wsum = self._buffer(self._next)
            del self._rows[self._next]
            np.divide(acc, wsum, out=acc, where=wsum > 0)
            yield self._next, acc, wsum
            self._next += 1
