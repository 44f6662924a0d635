"""Geohash encoding, cell bounds, prefix parsing and the compact footprint cover."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from shapely.geometry import MultiPolygon, Polygon, box
from shapely.geometry.base import BaseGeometry

from cubelake.catalog import geohash
from cubelake.catalog.geohash import cell_bounds, cover, encode, expand, parse_prefix

# Bits per axis at precision p: longitude takes the first (odd-numbered) bit of every pair.
P6_LON_STEP = 360.0 / 2**15
P6_LAT_STEP = 180.0 / 2**15


@pytest.mark.parametrize(
    ("lon", "lat", "precision", "expected"),
    [
        (-5.6, 42.6, 5, "ezs42"),  # the Wikipedia example
        (10.40744, 57.64911, 11, "u4pruydqqvj"),  # the Wikipedia example (Jutland)
        (-0.1278, 51.5074, 6, "gcpvj0"),  # London
        (-122.4194, 37.7749, 7, "9q8yyk8"),  # San Francisco
        (0.0, 0.0, 5, "s0000"),  # every bisection takes the upper half at the midpoint
        (-180.0, -90.0, 6, "000000"),
        (180.0, 90.0, 6, "zzzzzz"),
        (179.999, 89.999, 4, "zzzz"),
        (-0.000001, -0.000001, 4, "7zzz"),
    ],
)
def test_encode_known_geohashes(lon: float, lat: float, precision: int, expected: str) -> None:
    assert encode(lon, lat, precision) == expected


def test_encode_default_precision_is_6_and_prefixes_are_coarser_cells() -> None:
    full = encode(10.40744, 57.64911, 12)
    assert len(full) == 12
    assert encode(10.40744, 57.64911) == full[:6]
    for p in range(1, 12):
        assert encode(10.40744, 57.64911, p) == full[:p]


def test_cell_bounds_of_known_cell() -> None:
    assert cell_bounds("ezs42") == pytest.approx((-5.625, 42.5830078125, -5.5810546875, 42.626953125))
    assert cell_bounds("") == (-180.0, -90.0, 180.0, 90.0)
    assert cell_bounds("s") == (0.0, 0.0, 45.0, 45.0)
    assert cell_bounds("0") == (-180.0, -90.0, -135.0, -45.0)
    assert cell_bounds("z") == (135.0, 45.0, 180.0, 90.0)


@pytest.mark.parametrize("precision", range(1, 13))
def test_cell_bounds_size_per_precision(precision: int) -> None:
    lon_bits = math.ceil(5 * precision / 2)
    lat_bits = 5 * precision // 2
    w, s, e, n = cell_bounds(encode(10.40744, 57.64911, precision))
    assert e - w == pytest.approx(360.0 / 2**lon_bits, rel=1e-12)
    assert n - s == pytest.approx(180.0 / 2**lat_bits, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    lon=st.floats(-180.0, 180.0, allow_nan=False),
    lat=st.floats(-90.0, 90.0, allow_nan=False),
    precision=st.integers(1, 12),
)
def test_cell_bounds_contain_the_encoded_point(lon: float, lat: float, precision: int) -> None:
    cell = encode(lon, lat, precision)
    w, s, e, n = cell_bounds(cell)
    assert w <= lon <= e
    assert s <= lat <= n
    # a point inside the cell (its centre) encodes back to the same cell
    assert encode((w + e) / 2, (s + n) / 2, precision) == cell


@pytest.mark.parametrize(
    ("text", "expected"),
    [("ezs42", "ezs42"), ("EZS42", "ezs42"), ("  u4pr  ", "u4pr"), ("0", "0"), ("z" * 12, "z" * 12)],
)
def test_parse_prefix_accepts_and_normalises(text: str, expected: str) -> None:
    assert parse_prefix(text) == expected


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("ezsa2", ["'ezsa2'", "not 'a'"]),
        ("i", ["not 'i'"]),
        ("ul", ["not 'l'"]),
        ("o0", ["not 'o'"]),
        ("aioL", ["not 'a', 'i', 'l', 'o'"]),
        ("u4-p", ["not '-'"]),
        ("", ["1-12 characters", geohash.BASE32]),
        ("   ", ["1-12 characters"]),
        ("u" * 13, ["longer than 12"]),
    ],
)
def test_parse_prefix_errors_name_the_problem(text: str, fragments: list[str]) -> None:
    with pytest.raises(ValueError, match=re.escape(fragments[0])) as info:
        parse_prefix(text)
    for fragment in fragments:
        assert fragment in str(info.value)


def _brute_cells(geom: BaseGeometry) -> set[str]:
    """Precision-6 cells meeting ``geom``, from the regular 2^15 x 2^15 grid (not via cell_bounds/cover)."""
    w, s, e, n = geom.bounds
    i0, i1 = math.floor((w + 180) / P6_LON_STEP), math.floor((e + 180) / P6_LON_STEP)
    j0, j1 = math.floor((s + 90) / P6_LAT_STEP), math.floor((n + 90) / P6_LAT_STEP)
    out = set()
    for i in range(max(i0 - 1, 0), min(i1 + 1, 2**15 - 1) + 1):
        for j in range(max(j0 - 1, 0), min(j1 + 1, 2**15 - 1) + 1):
            cw, cs = -180 + i * P6_LON_STEP, -90 + j * P6_LAT_STEP
            cb = box(cw, cs, cw + P6_LON_STEP, cs + P6_LAT_STEP)
            if geom.intersects(cb):
                out.add(encode(cw + P6_LON_STEP / 2, cs + P6_LAT_STEP / 2, 6))
    return out


# An irregular quadrilateral (no edge on a cell boundary) large enough to hold whole precision-5 cells.
QUAD = Polygon([(11.0031, 47.0017), (11.3127, 47.0423), (11.2713, 47.2291), (10.9517, 47.1839)])
TRIANGLE = Polygon([(-3.7011, 40.4013), (-3.5217, 40.4109), (-3.6093, 40.5521)])
TWO_PARTS = MultiPolygon([
    Polygon([(2.3011, 48.8013), (2.3917, 48.8109), (2.3593, 48.8921)]),
    box(2.5031, 48.9017, 2.5523, 48.9411),
])


@pytest.mark.parametrize("geom", [QUAD, TRIANGLE, TWO_PARTS], ids=["quad", "triangle", "two-parts"])
def test_cover_expands_to_exactly_the_intersecting_precision6_cells(geom: BaseGeometry) -> None:
    cells = cover(geom)
    assert cells == sorted(cells)
    assert len(set(cells)) == len(cells)
    assert all(1 <= len(c) <= 6 for c in cells)
    expanded = set(expand(cells))
    brute = _brute_cells(geom)
    assert len(brute) > 100
    # complete: every precision-6 cell meeting the footprint is covered ...
    assert brute <= expanded
    # ... and exact: no covered cell is disjoint from the footprint
    assert expanded == brute
    for c in cells:
        assert geom.intersects(box(*cell_bounds(c))), c


@pytest.mark.parametrize("geom", [QUAD, TRIANGLE], ids=["quad", "triangle"])
def test_cover_compact_cells_lie_inside_the_footprint(geom: BaseGeometry) -> None:
    cells = cover(geom)
    short = [c for c in cells if len(c) < 6]
    assert short, "the footprint holds whole precision-5 cells; the cover should use them"
    for c in short:
        assert geom.covers(box(*cell_bounds(c))), c
    # and no two cover cells overlap (none is a prefix of another)
    for a in cells:
        assert not any(b != a and b.startswith(a) for b in cells)


def test_cover_of_a_large_footprint_is_much_shorter_than_its_expansion() -> None:
    footprint = box(10.00013, 50.00021, 12.00017, 52.00029)  # about 2 x 2 degrees
    cells = cover(footprint)
    expanded = expand(cells)
    assert len(expanded) > 30_000
    assert len(cells) * 10 < len(expanded)
    assert min(len(c) for c in cells) <= 4
    # the interior is covered by coarse cells: the footprint's centre cell at precision 4 is in the cover
    assert encode(11.0, 51.0, 4) in cells


@pytest.mark.parametrize(
    ("footprint", "max_cells", "expected_precision"),
    [
        # 2 x 2 degrees: 2470 compact cells at precision 6, 659 at 5, 84 at 4
        (box(10.00013, 50.00021, 12.00017, 52.00029), geohash.MAX_CELLS, 6),
        (box(10.00013, 50.00021, 12.00017, 52.00029), 1000, 5),
        (box(10.00013, 50.00021, 12.00017, 52.00029), 100, 4),
        # 40 x 30 degrees: 89587 at 6, 9095 at 5, 2172 at 4 -> the default cap gives precision 4
        (box(-100.0003, 20.0007, -60.0011, 50.0013), geohash.MAX_CELLS, 5),
        (box(-100.0003, 20.0007, -60.0011, 50.0013), 30, 2),
    ],
)
def test_cover_coarsens_a_level_at_a_time_when_over_max_cells(
    footprint: Polygon, max_cells: int, expected_precision: int
) -> None:
    cells = cover(footprint, max_cells=max_cells)
    assert len(cells) <= max_cells
    assert max(len(c) for c in cells) == expected_precision
    # the first precision (from 6 down) whose compact cover fits
    assert cells == cover(footprint, precision=expected_precision, max_cells=10**6)
    if expected_precision < 6:
        assert len(cover(footprint, precision=expected_precision + 1, max_cells=10**6)) > max_cells
    # still a true cover: every precision-6 cell meeting a corner of the footprint is inside a cell
    w, s, e, n = footprint.bounds
    for probe in (box(w, s, w + 0.1, s + 0.05), box(e - 0.1, n - 0.05, e, n)):
        for code in _brute_cells(probe):
            assert any(code.startswith(c) for c in cells), code


def test_cover_of_empty_geometry_is_empty() -> None:
    assert cover(Polygon()) == []


def test_expand_names_every_child() -> None:
    assert expand(["ezs42"], 5) == ["ezs42"]
    kids = expand(["ezs4"], 5)
    assert kids == sorted("ezs4" + ch for ch in geohash.BASE32)
    assert len(expand(["ezs4", "u4pr"], 6)) == 2 * 32 * 32


def test_intersects_cells() -> None:
    assert geohash.intersects_cells(QUAD, cover(QUAD))
    assert not geohash.intersects_cells(QUAD, ["0", "z"])


@settings(max_examples=60, deadline=None)
@given(
    west=st.floats(-179.9, 179.6, allow_nan=False),
    south=st.floats(-89.9, 89.6, allow_nan=False),
    width=st.floats(1e-6, 0.3, allow_nan=False),
    height=st.floats(1e-6, 0.3, allow_nan=False),
    fx=st.floats(0.0, 1.0),
    fy=st.floats(0.0, 1.0),
)
def test_points_inside_a_rectangle_have_a_prefix_in_its_cover(
    west: float, south: float, width: float, height: float, fx: float, fy: float
) -> None:
    rect = box(west, south, west + width, south + height)
    cells = cover(rect)
    assert cells
    for lon, lat in ((west + width / 2, south + height / 2), (west + fx * width, south + fy * height)):
        code = encode(lon, lat, 6)
        assert any(code.startswith(c) for c in cells), (lon, lat, code)
