"""Valid-data footprints: the coarse valid mask, its WGS84 outline, and the STAC bbox."""

from __future__ import annotations

import json
import math
from itertools import pairwise
from typing import Any

import numpy as np
import pytest
import shapely
from affine import Affine
from hypothesis import given, settings
from hypothesis import strategies as st
from rasterio.crs import CRS
from rasterio.features import shapes
from rasterio.transform import from_origin, xy
from rasterio.warp import transform, transform_bounds
from shapely.geometry import MultiPolygon, Polygon, box, mapping, shape

from cubelake.grid import Window
from cubelake.ingest.footprint import (
    MAX_VERTICES,
    Footprint,
    ValidMask,
    footprint_from_mask,
    geometry_bbox,
)

# --- ValidMask --------------------------------------------------------------------------------


def brute_coarse(full: np.ndarray, factor: int) -> np.ndarray:
    """Coarse cell (i, j) is valid when any pixel of full[i*f:(i+1)*f, j*f:(j+1)*f] is."""
    h, w = full.shape
    out = np.zeros((math.ceil(h / factor), math.ceil(w / factor)), dtype=bool)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = full[i * factor : (i + 1) * factor, j * factor : (j + 1) * factor].any()
    return out


def windows_from_cuts(rows: list[int], cols: list[int]) -> list[Window]:
    return [Window(r0, c0, r1 - r0, c1 - c0)
            for r0, r1 in pairwise(rows) for c0, c1 in pairwise(cols)]


@pytest.mark.parametrize(
    ("height", "width", "max_side", "factor", "shape"),
    [
        (100, 70, 1024, 1, (100, 70)),
        (1000, 3000, 1024, 3, (334, 1000)),
        (1024, 1024, 1024, 1, (1024, 1024)),
        (1025, 10, 1024, 2, (513, 5)),
        (100, 70, 16, 7, (15, 10)),
    ],
)
def test_valid_mask_factor_and_shape(height: int, width: int, max_side: int, factor: int, shape: tuple[int, int]) -> None:
    vm = ValidMask(height, width, max_side=max_side)
    assert vm.factor == factor
    assert vm.mask.shape == shape
    assert not vm.mask.any()
    assert vm.valid_fraction == 0.0


def test_valid_mask_factor_one_copies_the_window() -> None:
    rng = np.random.default_rng(3)
    vm = ValidMask(10, 12)
    valid = rng.random((4, 5)) < 0.5
    vm.add(Window(2, 3, 4, 5), valid)
    expected = np.zeros((10, 12), dtype=bool)
    expected[2:6, 3:8] = valid
    np.testing.assert_array_equal(vm.mask, expected)
    vm.add(Window(0, 0, 2, 2), None)  # None: every pixel valid
    expected[0:2, 0:2] = True
    np.testing.assert_array_equal(vm.mask, expected)
    assert vm.valid_fraction == pytest.approx(expected.mean())


def test_valid_mask_add_ors_and_never_clears() -> None:
    vm = ValidMask(4, 4)
    vm.add(Window(0, 0, 4, 4), np.eye(4, dtype=bool))
    vm.add(Window(0, 0, 4, 4), np.zeros((4, 4), dtype=bool))
    np.testing.assert_array_equal(vm.mask, np.eye(4, dtype=bool))


def test_valid_mask_coarse_with_unaligned_windows() -> None:
    rng = np.random.default_rng(7)
    full = rng.random((100, 70)) < 0.02
    vm = ValidMask(100, 70, max_side=16)
    assert vm.factor == 7
    for win in windows_from_cuts([0, 13, 40, 41, 77, 100], [0, 9, 33, 34, 70]):
        vm.add(win, full[win.slices()])
    np.testing.assert_array_equal(vm.mask, brute_coarse(full, 7))


def test_valid_mask_coarse_all_valid_window() -> None:
    vm = ValidMask(100, 70, max_side=16)
    vm.add(Window(13, 9, 30, 25), None)
    full = np.zeros((100, 70), dtype=bool)
    full[13:43, 9:34] = True
    np.testing.assert_array_equal(vm.mask, brute_coarse(full, 7))


@st.composite
def masks_and_cuts(draw: st.DrawFn) -> tuple[np.ndarray, int, list[int], list[int]]:
    h = draw(st.integers(1, 60))
    w = draw(st.integers(1, 60))
    max_side = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    density = draw(st.sampled_from([0.0, 0.01, 0.1, 0.5, 1.0]))
    full = np.random.default_rng(seed).random((h, w)) < density
    rows = sorted({0, h, *draw(st.lists(st.integers(1, max(1, h - 1)), max_size=5))})
    cols = sorted({0, w, *draw(st.lists(st.integers(1, max(1, w - 1)), max_size=5))})
    return full, max_side, rows, cols


@settings(max_examples=150, deadline=None)
@given(masks_and_cuts())
def test_valid_mask_equals_brute_force_coarsening(case: tuple[np.ndarray, int, list[int], list[int]]) -> None:
    full, max_side, rows, cols = case
    h, w = full.shape
    vm = ValidMask(h, w, max_side=max_side)
    for win in windows_from_cuts(rows, cols):
        vm.add(win, full[win.slices()])
    np.testing.assert_array_equal(vm.mask, brute_coarse(full, vm.factor))


# --- footprint_from_mask ----------------------------------------------------------------------

UTM33 = CRS.from_epsg(32633)
UTM33_T = from_origin(500000.0, 5000000.0, 30.0, 30.0)  # 30 m pixels at about 45° N, 15° E


def build(full: np.ndarray, t: Affine, crs: CRS, max_side: int = 64, block: int = 64) -> tuple[ValidMask, Footprint]:
    """The footprint of a scene whose valid pixels are ``full``, gathered block by block like the pixel pass."""
    h, w = full.shape
    vm = ValidMask(h, w, max_side=max_side)
    for r in range(0, h, block):
        for c in range(0, w, block):
            win = Window(r, c, min(block, h - r), min(block, w - c))
            vm.add(win, full[win.slices()])
    fp = footprint_from_mask(vm, tuple(t)[:6], crs.to_wkt())
    assert fp is not None
    return vm, fp


def pixel_centres_wgs84(rows: np.ndarray, cols: np.ndarray, t: Affine, crs: CRS) -> np.ndarray:
    xs, ys = xy(t, rows, cols, offset="center")
    lon, lat = transform(crs, "EPSG:4326", np.ravel(xs).tolist(), np.ravel(ys).tolist())
    return shapely.points(lon, lat)


RR, CC = np.mgrid[0:200, 0:300]
VALID_SHAPES = {
    # valid data in a sub-rectangle only
    "rectangle": (RR >= 20) & (RR < 150) & (CC >= 50) & (CC < 250),
    # a triangle inside it (45° hypotenuse)
    "triangle": (CC >= RR + 30) & (RR >= 20) & (RR < 150) & (CC < 250),
    # a triangle with a steep hypotenuse
    "steep": (CC >= 50 + 1.7 * (RR - 20)) & (RR >= 20) & (RR < 150) & (CC < 280),
}
NODATA_PROBES = {  # (row, col) of pixels deep in each shape's nodata region
    "rectangle": [(5, 150), (180, 150), (80, 10), (80, 290)],
    "triangle": [(140, 60), (120, 40), (190, 280)],
    "steep": [(140, 60), (100, 100), (5, 5)],
}


@pytest.mark.parametrize("name", list(VALID_SHAPES))
def test_utm_footprint_holds_valid_pixels_and_excludes_nodata(name: str) -> None:
    full = VALID_SHAPES[name]
    vm, fp = build(full, UTM33_T, UTM33)
    assert vm.factor == 5
    geom = shape(fp.geometry)
    assert geom.geom_type == "Polygon"
    assert geom.is_valid
    rows, cols = np.nonzero(full)
    centres = pixel_centres_wgs84(rows, cols, UTM33_T, UTM33)
    inside = shapely.covers(geom, centres)
    assert inside.all(), f"{int((~inside).sum())} of {inside.size} valid pixel centres outside the footprint"
    probes = np.array(NODATA_PROBES[name])
    assert not full[probes[:, 0], probes[:, 1]].any()
    outside = pixel_centres_wgs84(probes[:, 0], probes[:, 1], UTM33_T, UTM33)
    assert not shapely.intersects(geom, outside).any()


@pytest.mark.parametrize("name", list(VALID_SHAPES))
def test_utm_footprint_bbox_is_tight(name: str) -> None:
    full = VALID_SHAPES[name]
    vm, fp = build(full, UTM33_T, UTM33)
    cell = 30.0 * vm.factor
    assert fp.cell_size == pytest.approx(cell)
    rows, cols = np.nonzero(full)
    # the valid pixels' extent in the scene CRS (pixel edges)
    x0, x1 = 500000.0 + 30.0 * cols.min(), 500000.0 + 30.0 * (cols.max() + 1)
    y0, y1 = 5000000.0 - 30.0 * (rows.max() + 1), 5000000.0 - 30.0 * rows.min()
    nw, ns, ne, nn = fp.native_bbox
    assert (nw, ns, ne, nn) == pytest.approx((x0, y0, x1, y1), abs=cell)  # coarsening grows by under one cell
    assert nw <= x0
    assert ns <= y0
    assert ne >= x1
    assert nn >= y1
    # in WGS84: around the valid pixel centres, and inside their extent grown by two coarse cells
    centres = pixel_centres_wgs84(rows, cols, UTM33_T, UTM33)
    cw, cs, ce, cn = shapely.total_bounds(centres)
    ow, os_, oe, on = transform_bounds(UTM33, "EPSG:4326", x0 - 2 * cell, y0 - 2 * cell, x1 + 2 * cell,
                                       y1 + 2 * cell, densify_pts=50)
    w, s, e, n = fp.bbox
    assert ow <= w <= cw
    assert os_ <= s <= cs
    assert ce <= e <= oe
    assert cn <= n <= on
    assert fp.bbox == pytest.approx(shape(fp.geometry).bounds, abs=1e-12)


def test_footprint_is_plain_json() -> None:
    _, fp = build(VALID_SHAPES["triangle"], UTM33_T, UTM33)
    assert json.loads(json.dumps(fp.geometry)) == fp.geometry
    d = fp.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["bbox"] == list(fp.bbox)
    assert d["native_bbox"] == list(fp.native_bbox)


# A thin line at a shallow angle: Douglas-Peucker with a tolerance of half a coarse cell would cut the
# outline's staircase corners, and with them valid pixels, without the buffer taken first.
THIN_SHALLOW = np.abs(np.mgrid[0:300, 0:300][0] - 0.13 * np.mgrid[0:300, 0:300][1] - 60) < 0.6


def test_simplification_keeps_valid_pixels_of_a_thin_shallow_line() -> None:
    full = THIN_SHALLOW
    _, fp = build(full, UTM33_T, UTM33, max_side=43)
    rows, cols = np.nonzero(full)
    inside = shapely.covers(shape(fp.geometry), pixel_centres_wgs84(rows, cols, UTM33_T, UTM33))
    assert inside.all(), f"{int((~inside).sum())} of {inside.size} valid pixel centres outside the footprint"


def test_noisy_mask_is_simplified_to_at_most_max_vertices() -> None:
    rng = np.random.default_rng(11)
    full = rng.random((128, 128)) < 0.5
    raw_vertices = sum(
        shapely.get_num_coordinates(shape(g))
        for g, v in shapes(full.astype(np.uint8), mask=full, transform=UTM33_T, connectivity=8) if v
    )
    assert raw_vertices > MAX_VERTICES  # the outline before simplification is over the limit
    vm, fp = build(full, UTM33_T, UTM33, max_side=1024)
    assert vm.factor == 1
    geom = shape(fp.geometry)
    assert shapely.get_num_coordinates(geom) <= MAX_VERTICES
    assert geom.is_valid
    # the coarser (buffered) outline still holds every valid pixel
    rows, cols = np.nonzero(full)
    assert shapely.covers(geom, pixel_centres_wgs84(rows, cols, UTM33_T, UTM33)).all()


def test_no_footprint_without_georeferencing_or_valid_pixels() -> None:
    vm = ValidMask(20, 20)
    vm.add(Window(0, 0, 20, 20), None)
    wkt = UTM33.to_wkt()
    assert footprint_from_mask(vm, None, wkt) is None
    assert footprint_from_mask(vm, tuple(UTM33_T)[:6], None) is None
    assert footprint_from_mask(vm, tuple(UTM33_T)[:6], "") is None
    empty = ValidMask(20, 20)
    empty.add(Window(0, 0, 20, 20), np.zeros((20, 20), dtype=bool))
    assert footprint_from_mask(empty, tuple(UTM33_T)[:6], wkt) is None
    assert footprint_from_mask(vm, tuple(UTM33_T)[:6], wkt) is not None


def test_geographic_raster_keeps_its_degrees() -> None:
    t = from_origin(10.0, 50.0, 0.01, 0.01)
    full = np.zeros((100, 200), dtype=bool)
    full[10:60, 20:180] = True
    vm, fp = build(full, t, CRS.from_epsg(4326))
    assert vm.factor == 4
    assert fp.cell_size == pytest.approx(0.04)
    w, s, e, n = fp.bbox
    # the valid pixels span 10.2-11.8° E, 49.4-49.9° N; coarse cells of 0.04° and the simplification's
    # buffer (half a cell) grow that by under a cell and a half
    assert 10.2 - 0.06 < w <= 10.2
    assert 49.4 - 0.06 < s <= 49.4
    assert 11.8 <= e < 11.8 + 0.06
    assert 49.9 <= n < 49.9 + 0.06
    assert shape(fp.geometry).covers(box(10.2, 49.4, 11.8, 49.9))


# --- the antimeridian -------------------------------------------------------------------------


def test_utm60_scene_across_the_antimeridian_is_split() -> None:
    crs = CRS.from_epsg(32660)  # zone 60N, central meridian 177° E
    t = from_origin(780000.0, 1000000.0, 1000.0, 1000.0)  # 120 km wide: 179.5° E to 179.4° W
    full = np.ones((100, 120), dtype=bool)
    _, fp = build(full, t, crs)
    geom = shape(fp.geometry)
    assert isinstance(geom, MultiPolygon)
    w, s, e, n = fp.bbox
    assert w > e
    assert 179.4 < w < 179.6
    assert -179.5 < e < -179.3
    assert 8.0 < s < n < 9.1
    assert all(-180.0 <= x <= 180.0 for x, _ in shapely.get_coordinates(geom))
    rows, cols = np.nonzero(full[::7, ::7])
    centres = pixel_centres_wgs84(rows * 7, cols * 7, t, crs)
    assert shapely.covers(geom, centres).all()


def test_pacific_mercator_scene_across_the_antimeridian_is_split() -> None:
    crs = CRS.from_epsg(3832)  # PDC Mercator, centred on 150° E
    (x,), (y,) = transform("EPSG:4326", crs, [179.0], [-17.0])
    t = from_origin(x, y, 1000.0, 1000.0)  # 250 km east from 179° E
    full = np.ones((100, 250), dtype=bool)
    _, fp = build(full, t, crs)
    geom = shape(fp.geometry)
    assert isinstance(geom, MultiPolygon)
    w, _, e, n = fp.bbox
    assert w > e
    assert w == pytest.approx(179.0, abs=1e-6)
    assert -179.0 < e < -178.5
    assert n == pytest.approx(-17.0, abs=1e-6)


def test_geographic_raster_past_180_is_wrapped_and_split() -> None:
    t = from_origin(179.5, 10.0, 0.01, 0.01)  # 179.5° E to 180.5° E (= 179.5° W)
    _, fp = build(np.ones((100, 100), dtype=bool), t, CRS.from_epsg(4326))
    assert all(-180.0 <= x <= 180.0 for x, _ in shapely.get_coordinates(shape(fp.geometry)))
    w, _, e, _ = fp.bbox
    assert w > e
    assert w == pytest.approx(179.5)
    assert e == pytest.approx(-179.5)


@pytest.mark.parametrize(
    ("geom", "expected"),
    [
        (mapping(box(10, 40, 12, 42)), (10.0, 40.0, 12.0, 42.0)),
        # cut at 180°: west > east
        (mapping(MultiPolygon([box(179.5, 8, 180, 9), box(-180, 8.1, -179.4, 9.2)])), (179.5, 8.0, -179.4, 9.2)),
        # two parts that do not touch the antimeridian: ordinary bounds
        (mapping(MultiPolygon([box(10, 40, 11, 41), box(-20, 30, -19, 31)])), (-20.0, 30.0, 11.0, 41.0)),
        # parts on both sides of the globe but not cut at 180°
        (mapping(MultiPolygon([box(170, 0, 179, 1), box(-179, 0, -170, 1)])), (-179.0, 0.0, 179.0, 1.0)),
        (mapping(Polygon([(0, 0), (2, 0), (1, 3)])), (0.0, 0.0, 2.0, 3.0)),
    ],
)
def test_geometry_bbox(geom: dict[str, Any], expected: tuple[float, float, float, float]) -> None:
    assert geometry_bbox(geom) == pytest.approx(expected)
