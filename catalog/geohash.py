"""Geohash cells: encode points, cell bounds, and the compact cell cover of a footprint. Pure.

A geohash cell of precision ``p`` is a lon/lat rectangle named by ``p`` base-32 characters; a
cell's children share its name as prefix, so "every item in this area" is a prefix query.

The footprint's cover is *compact*: it holds cells of at most ``precision`` characters such
that every precision-``precision`` cell meeting the footprint is one of them or a child of one,
and a shorter cell appears only when all of its children meet the footprint. A 185 km Landsat
scene is ~45,000 precision-6 cells but a few hundred compact ones; :func:`expand` gives the
full precision-6 list back. Hand-written because the geohash libraries on PyPI encode points
only; the cover (a quad-tree descent tested with shapely) is ~40 lines.
"""

from __future__ import annotations

from collections.abc import Iterable

import shapely
from shapely.geometry import box
from shapely.geometry.base import BaseGeometry
from shapely.prepared import prep

__all__ = ["BASE32", "cell_bounds", "cover", "encode", "expand", "parse_prefix"]

BASE32 = "0123456789bcdefghjkmnpqrstuvwxyz"
_INDEX = {c: i for i, c in enumerate(BASE32)}
MAX_CELLS = 16384
"""A cover is coarsened (a level at a time) until it holds at most this many cells."""


def encode(lon: float, lat: float, precision: int = 6) -> str:
    """The geohash of a point (degrees, WGS84)."""
    lo_lon, hi_lon, lo_lat, hi_lat = -180.0, 180.0, -90.0, 90.0
    out: list[str] = []
    bits = 0
    n = 0
    even = True
    while len(out) < precision:
        if even:
            mid = (lo_lon + hi_lon) / 2
            bit = lon >= mid
            lo_lon, hi_lon = (mid, hi_lon) if bit else (lo_lon, mid)
        else:
            mid = (lo_lat + hi_lat) / 2
            bit = lat >= mid
            lo_lat, hi_lat = (mid, hi_lat) if bit else (lo_lat, mid)
        bits = (bits << 1) | int(bit)
        even = not even
        n += 1
        if n == 5:
            out.append(BASE32[bits])
            bits = n = 0
    return "".join(out)


def cell_bounds(cell: str) -> tuple[float, float, float, float]:
    """``(west, south, east, north)`` of a cell, degrees."""
    lo_lon, hi_lon, lo_lat, hi_lat = -180.0, 180.0, -90.0, 90.0
    even = True
    for ch in cell:
        v = _INDEX[ch]
        for shift in range(4, -1, -1):
            bit = (v >> shift) & 1
            if even:
                mid = (lo_lon + hi_lon) / 2
                lo_lon, hi_lon = (mid, hi_lon) if bit else (lo_lon, mid)
            else:
                mid = (lo_lat + hi_lat) / 2
                lo_lat, hi_lat = (mid, hi_lat) if bit else (lo_lat, mid)
            even = not even
    return lo_lon, lo_lat, hi_lon, hi_lat


def parse_prefix(prefix: str) -> str:
    """A geohash prefix, lower-cased; raises ``ValueError`` naming any character outside base-32."""
    p = prefix.strip().lower()
    bad = sorted({c for c in p if c not in _INDEX})
    if not p or bad:
        raise ValueError(
            f"geohash prefix {prefix!r} is not valid: use 1-12 characters of {BASE32!r}"
            + (f" (not {', '.join(map(repr, bad))})" if bad else "")
        )
    if len(p) > 12:
        raise ValueError(f"geohash prefix {prefix!r} is longer than 12 characters")
    return p


def cover(geometry: BaseGeometry, precision: int = 6, max_cells: int = MAX_CELLS) -> list[str]:
    """The compact cover of a WGS84 footprint (see the module docstring), sorted.

    If even the compact cover at ``precision`` exceeds ``max_cells`` (a continent-sized
    footprint), the cover is computed at a coarser precision; every cell is still a true
    cover, so prefix queries stay correct (they may only match a little more).
    """
    if geometry.is_empty:
        return []
    for p in range(precision, 0, -1):
        cells = _cover(geometry, p, max_cells)
        if cells is not None:
            return cells
    return [""]  # pragma: no cover - precision 1 holds at most 32 cells


def _cover(geometry: BaseGeometry, precision: int, max_cells: int) -> list[str] | None:
    g = prep(geometry)
    out: list[str] = []
    stack = [""]
    while stack:
        cell = stack.pop()
        for ch in BASE32:
            child = cell + ch
            cb = box(*cell_bounds(child))
            if not g.intersects(cb):
                continue
            if len(child) == precision or g.contains(cb):
                out.append(child)
                if len(out) > max_cells:
                    return None
            else:
                stack.append(child)
    return sorted(out)


def expand(cells: Iterable[str], precision: int = 6) -> list[str]:
    """Every precision-``precision`` cell named by a compact cover."""
    out: list[str] = []
    for c in cells:
        level = [c]
        while len(level[0]) < precision:
            level = [x + ch for x in level for ch in BASE32]
        out.extend(level)
    return sorted(out)


def intersects_cells(geometry: BaseGeometry, cells: Iterable[str]) -> bool:
    """Whether ``geometry`` meets any of ``cells`` (used by tests and sanity checks)."""
    return any(shapely.intersects(geometry, box(*cell_bounds(c))) for c in cells)
