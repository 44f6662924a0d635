"""The EMIT reader's parts, pinned exactly: the GLT lookup and its bounds, the slab budget and how a window is
split under it, the bands, the map grid, the metadata defaults and which files are EMIT cubes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from cubelake.errors import SceneReadError, UnsupportedFormatError
from cubelake.grid import Window
from cubelake.ingest.sources.emit import _halves, emit_product, glt_lookup, open_emit, read_ortho
from cubelake.testing.emit import WGS84_WKT, apply_glt, make_glt, write_emit

NAME = "EMIT_L2A_RFL_001_20230217T064052_2304804_005.nc"
MIB = 1024 * 1024


class RecordingCube:
    """A swath cube that records every slab read from it, as ``(r0, r1, c0, c1)``; ``data=None``: all zeros,
    made on demand (a large cube costs nothing until a slab of it is read)."""

    def __init__(self, data: np.ndarray | None = None, *, shape: tuple[int, int, int] = (0, 0, 0),
                 dtype: Any = np.float32) -> None:
        self.data = data
        self.shape = data.shape if data is not None else shape
        self.dtype = data.dtype if data is not None else np.dtype(dtype)
        self.reads: list[tuple[int, int, int, int]] = []

    def __getitem__(self, key: tuple[slice, slice, slice]) -> np.ndarray:
        rs, cs, bs = key
        assert (bs, rs.step, cs.step) == (slice(None), None, None)
        self.reads.append((rs.start, rs.stop, cs.start, cs.stop))
        if self.data is not None:
            return self.data[key]
        return np.zeros((rs.stop - rs.start, cs.stop - cs.start, self.shape[2]), dtype=self.dtype)

    def slab_bytes(self) -> list[int]:
        return [(r1 - r0) * (c1 - c0) * self.shape[2] * self.dtype.itemsize for r0, r1, c0, c1 in self.reads]


def _swath(n_down: int = 12, n_cross: int = 10, n_bands: int = 3) -> np.ndarray:
    return np.arange(n_down * n_cross * n_bands, dtype=np.float32).reshape(n_down, n_cross, n_bands) + 1


# -- glt_lookup -------------------------------------------------------------------------------------------


def test_the_glt_is_one_based_and_its_upper_bounds_are_swath_pixels() -> None:
    gx = np.array([[1, 30], [7, 30]], dtype=np.int32)
    gy = np.array([[1, 40], [40, 1]], dtype=np.int32)
    valid, rows, cols = glt_lookup(gx, gy, 40, 30, "g.nc")
    assert valid.tolist() == [[True, True], [True, True]]
    assert rows.tolist() == [0, 39, 39, 0]
    assert cols.tolist() == [0, 29, 6, 29]
    assert (rows.dtype, cols.dtype) == (np.int64, np.int64)


def test_a_zero_in_either_glt_array_is_fill_whatever_the_other_holds() -> None:
    gx = np.array([[0, 7, 2], [0, 0, 1]], dtype=np.int32)
    gy = np.array([[9, 0, 2], [0, 9, 1]], dtype=np.int32)  # 9 and 7 lie outside the 4 x 3 swath: not looked at
    valid, rows, cols = glt_lookup(gx, gy, 4, 3, "g.nc")
    assert valid.tolist() == [[False, False, True], [False, False, True]]
    assert rows.tolist() == [1, 0]
    assert cols.tolist() == [1, 0]


def test_an_all_fill_glt_window_has_no_swath_pixels() -> None:
    valid, rows, cols = glt_lookup(np.zeros((2, 3), np.int32), np.array([[0, 7, 0], [1, 0, 0]], np.int32), 4, 3, "g")
    assert valid.tolist() == [[False] * 3] * 2
    assert (rows.size, cols.size) == (0, 0)


@pytest.mark.parametrize(("gx", "gy", "message"), [
    ([[1, 2]], [[3, 41]], "location/glt_y holds 41, outside the swath's 1..40"),
    ([[31, 2]], [[3, 4]], "location/glt_x holds 31, outside the swath's 1..30"),
    ([[1, 2, 3]], [[44, 43, 45]], "location/glt_y holds 45, outside the swath's 1..40"),  # the largest is named
    ([[1, 2]], [[-3, 5]], "location/glt_y holds -3, outside the swath's 1..40"),
    ([[2, -1]], [[3, 4]], "location/glt_x holds -1, outside the swath's 1..30"),
    ([[2, 3, 4]], [[-3, 50, -7]], "location/glt_y holds -7, outside the swath's 1..40"),  # the smallest, first
    ([[40, 2]], [[3, 30]], "location/glt_x holds 40, outside the swath's 1..30"),  # each axis has its own bound
])
def test_a_glt_entry_outside_the_swath_is_named_with_its_axis_and_bound(gx: list[list[int]], gy: list[list[int]],
                                                                         message: str) -> None:
    with pytest.raises(SceneReadError) as info:
        glt_lookup(np.array(gx, np.int32), np.array(gy, np.int32), 40, 30, "g.nc")
    assert str(info.value) == f"g.nc: {message}; the GLT is damaged (0 is the only fill value)"


# -- read_ortho: the slab budget ---------------------------------------------------------------------------


def test_a_small_budget_splits_into_slabs_under_it_and_reads_the_same() -> None:
    swath = _swath()
    gx, gy = make_glt(12, 10, angle_deg=35.0)
    win = Window(0, 0, *gx.shape)
    ref = apply_glt(swath, gx, gy, fill=-5.0)
    whole = RecordingCube(swath)
    np.testing.assert_array_equal(read_ortho(whole, gx, gy, win, -5.0, "g"), ref)
    assert whole.reads == [(0, 12, 0, 10)]  # one slab: every swath pixel the GLT reaches

    budget = 5 * 3 * 4  # five swath pixels of all bands
    split = RecordingCube(swath)
    out = read_ortho(split, gx, gy, win, -5.0, "g", budget=budget)
    np.testing.assert_array_equal(out, ref)
    assert len(split.reads) > 1
    assert max(split.slab_bytes()) <= budget


def test_a_budget_of_one_byte_reads_every_swath_pixel_alone() -> None:
    swath = _swath()
    gx, gy = make_glt(12, 10, angle_deg=20.0)
    cube = RecordingCube(swath)
    out = read_ortho(cube, gx, gy, Window(0, 0, *gx.shape), -9999.0, "g", budget=1)
    np.testing.assert_array_equal(out, apply_glt(swath, gx, gy))
    assert len(cube.reads) == int(((gx != 0) & (gy != 0)).sum())  # a 1-pixel window is read, whatever its slab
    assert set(cube.slab_bytes()) == {3 * 4}


@pytest.mark.parametrize(("budget", "reads"), [
    (4 * 5 * 3 * 4, [(0, 4, 0, 5)]),  # the slab's bytes exactly: read whole
    (4 * 5 * 3 * 4 - 1, [(0, 1, 0, 1), (3, 4, 4, 5)]),  # one byte less: split, each half its own pixel
])
def test_a_slab_of_exactly_the_budget_is_not_split(budget: int, reads: list[tuple[int, ...]]) -> None:
    swath = _swath(4, 5, 3)
    gx, gy = np.array([[1, 5]], np.int32), np.array([[1, 4]], np.int32)  # two map pixels, opposite swath corners
    cube = RecordingCube(swath)
    out = read_ortho(cube, gx, gy, Window(0, 0, 1, 2), -9999.0, "g", budget=budget)
    assert cube.reads == reads
    np.testing.assert_array_equal(out, swath[[0, 3], [0, 4], :].T.reshape(3, 1, 2))


@pytest.mark.parametrize(("n_cross", "reads"), [
    (64 * MIB, [(0, 1, 0, 64 * MIB)]),  # 64 MiB: one slab
    (64 * MIB + 1, [(0, 1, 0, 1), (0, 1, 64 * MIB, 64 * MIB + 1)]),  # a byte more: split
])
def test_the_default_budget_is_64_mib(n_cross: int, reads: list[tuple[int, ...]]) -> None:
    cube = RecordingCube(shape=(1, n_cross, 1), dtype=np.uint8)
    gx, gy = np.array([[1, n_cross]], np.int32), np.array([[1, 1]], np.int32)
    out = read_ortho(cube, gx, gy, Window(0, 0, 1, 2), 255.0, "g")
    assert cube.reads == reads
    assert out.tolist() == [[[0, 0]]]


def test_a_window_without_swath_pixels_is_fill_and_reads_nothing() -> None:
    swath = _swath()
    gx, gy = make_glt(12, 10, angle_deg=35.0)
    assert gx[0, 0] == 0
    cube = RecordingCube(swath)
    out = read_ortho(cube, gx, gy, Window(0, 0, 1, 1), -7.0, "g")
    assert cube.reads == []
    assert out.tolist() == [[[-7.0]]] * 3


def test_read_ortho_gives_band_y_x_of_the_window_with_fill_where_the_glt_is_zero() -> None:
    swath = _swath(4, 3, 2)
    gx = np.array([[0, 1, 2, 3], [3, 0, 1, 2], [9, 9, 9, 9]], np.int32)
    gy = np.array([[0, 1, 2, 3], [4, 4, 0, 1], [9, 9, 9, 9]], np.int32)  # the last row is out of the window
    cube = RecordingCube(swath)
    out = read_ortho(cube, gx, gy, Window(0, 1, 2, 3), -1.5, "g")
    assert (out.shape, out.dtype, out.flags.c_contiguous) == ((2, 2, 3), np.float32, True)
    expect = np.array([[swath[0, 0], swath[1, 1], swath[2, 2]],
                       [[-1.5, -1.5], [-1.5, -1.5], swath[0, 1]]], np.float32).transpose(2, 0, 1)
    np.testing.assert_array_equal(out, expect)
    assert cube.reads == [(0, 3, 0, 3)]


# -- _halves ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("window", "halves"), [
    (Window(6, 9, 5, 4), [(Window(6, 9, 2, 4), (slice(0, 2), slice(0, 4))),
                          (Window(8, 9, 3, 4), (slice(2, 5), slice(0, 4)))]),
    (Window(3, 7, 4, 4), [(Window(3, 7, 2, 4), (slice(0, 2), slice(0, 4))),  # a tie: rows
                          (Window(5, 7, 2, 4), (slice(2, 4), slice(0, 4)))]),
    (Window(6, 9, 3, 7), [(Window(6, 9, 3, 3), (slice(0, 3), slice(0, 3))),
                          (Window(6, 12, 3, 4), (slice(0, 3), slice(3, 7)))]),
    (Window(5, 2, 2, 1), [(Window(5, 2, 1, 1), (slice(0, 1), slice(0, 1))),
                          (Window(6, 2, 1, 1), (slice(1, 2), slice(0, 1)))]),
    (Window(5, 2, 1, 2), [(Window(5, 2, 1, 1), (slice(0, 1), slice(0, 1))),
                          (Window(5, 3, 1, 1), (slice(0, 1), slice(1, 2)))]),
])
def test_a_window_is_halved_across_its_longer_side(window: Window, halves: list[Any]) -> None:
    got = list(_halves(window))
    assert got == halves
    for part, (ys, xs) in got:  # each half's slices are its place in the window
        assert (part.row_off - window.row_off, part.col_off - window.col_off) == (ys.start, xs.start)
        assert (part.height, part.width) == (ys.stop - ys.start, xs.stop - xs.start)
        assert all(type(v) is int for v in (part.row_off, part.col_off, part.height, part.width))


# -- the granule: bands, grid, metadata ------------------------------------------------------------------


def _granule(tmp_path: Path, **kw: Any) -> Any:
    return write_emit(tmp_path / NAME, **kw)


def _replace(h: Any, key: str, data: np.ndarray) -> None:
    del h[key]
    h.create_dataset(key, data=data)


def _open_direct(path: Path, variable: str = "reflectance") -> Any:
    return open_emit(path, h5py.File(path, "r"), variable)


def _refusal(path: Path) -> str:
    """The message of the SceneReadError opening ``path`` raises (the file closed after it)."""
    with h5py.File(path, "r") as h, pytest.raises(SceneReadError) as info:
        open_emit(path, h, "reflectance")
    return str(info.value)


def test_bands_are_numbered_named_and_flagged_from_the_granule(tmp_path: Path) -> None:
    g = _granule(tmp_path)
    flags = np.array([1, 2, 0, 1, -1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0], np.int8)  # any non-zero value is good
    with h5py.File(g.path, "r+") as h:
        _replace(h, "sensor_band_parameters/good_wavelengths", flags)
    src = _open_direct(g.path)
    bands = src.meta.bands
    assert [b.number for b in bands] == list(range(1, 17))
    assert [b.name for b in bands] == [f"band {i}" for i in range(1, 17)]
    assert [b.wavelength_nm for b in bands] == [float(v) for v in g.wavelengths]
    assert [b.fwhm_nm for b in bands] == [float(v) for v in g.fwhm]
    assert [b.number for b in bands if b.flagged_bad] == [3, 6, 16]
    src.close()


def test_emits_285_bands_are_read(tmp_path: Path) -> None:
    g = _granule(tmp_path, n_cross=6, n_bands=285)  # counts past CPython's cached small ints
    src = _open_direct(g.path)
    assert [b.number for b in src.meta.bands if b.flagged_bad] == [143, 144]
    assert src.read(Window(0, 0, 1, 1)).shape == (285, 1, 1)
    src.close()


@pytest.mark.parametrize("key", ["wavelengths", "fwhm", "good_wavelengths"])
@pytest.mark.parametrize("n", [15, 17])
def test_a_band_table_of_another_length_is_refused(tmp_path: Path, key: str, n: int) -> None:
    g = _granule(tmp_path)
    with h5py.File(g.path, "r+") as h:
        _replace(h, f"sensor_band_parameters/{key}", np.ones(n, np.float32))
    message = _refusal(g.path)
    tail = "; the granule is inconsistent" if key != "good_wavelengths" else ""
    assert message == f"{g.path}: 'sensor_band_parameters/{key}' has {n} values for 16 bands{tail}"


def test_l1b_has_no_good_wavelengths_and_flags_nothing(tmp_path: Path) -> None:
    g = _granule(tmp_path, level="L1B")
    src = _open_direct(g.path, "radiance")
    assert [b.flagged_bad for b in src.meta.bands] == [False] * 16
    src.close()


def test_the_metadata_of_an_l2a_granule(tmp_path: Path) -> None:
    g = _granule(tmp_path)
    src = _open_direct(g.path)
    m = src.meta
    h, w = g.glt_x.shape
    assert (m.path, m.files, m.format, m.count, m.height, m.width, m.dtype) == (
        str(g.path), (str(g.path),), "EMIT-L2A", 16, h, w, "float32")
    assert (m.block_shape, m.interleave, m.crs_wkt, m.crs_epsg) == ((h, w), "bip", WGS84_WKT, 4326)
    assert (m.nodata, m.datetime) == (-9999.0, "2023-02-17T06:40:52Z")
    assert m.tags == {
        "cubelake:product": "emit-l2a",
        "emit:variable": "reflectance",
        "emit:orthorectification": "GLT nearest neighbour: location/glt_x, location/glt_y (1-based, 0 = fill)",
        "emit:swath_shape": "40x30",
        "emit:ortho_shape": f"{h}x{w}",
        "emit:title": "EMIT L2A Estimated Surface Reflectance 60 m V001",
        "emit:product_version": "V001",
        "emit:flight_line": "emit20230217t064052_o04805_s000",
        "emit:platform": "ISS",
        "emit:instrument": "EMIT",
        "emit:time_coverage_end": "2023-02-17T06:41:04+0000",
        "emit:software_build_version": "010621",
        "emit:identifier_product_doi": "10.5067/EMIT/EMITL2ARFL.001",
        "units": "unitless",
    }
    src.close()


def test_l1b_metadata_names_its_product(tmp_path: Path) -> None:
    g = _granule(tmp_path, level="L1B")
    src = _open_direct(g.path, "radiance")
    assert src.meta.format == "EMIT-L1B"
    assert (src.meta.tags["cubelake:product"], src.meta.tags["emit:variable"]) == ("emit-l1b", "radiance")
    src.close()


def test_long_tags_are_cut_to_500_characters_and_empty_or_missing_ones_left_out(tmp_path: Path) -> None:
    g = _granule(tmp_path)
    with h5py.File(g.path, "r+") as h:
        h.attrs["title"] = "T" * 499 + "xyz"
        h.attrs["product_version"] = ""
        del h.attrs["flight_line"]
        del h["reflectance"].attrs["units"]
    src = _open_direct(g.path)
    tags = src.meta.tags
    assert tags["emit:title"] == "T" * 499 + "x"
    assert not {"emit:product_version", "emit:flight_line", "units"} & set(tags)
    src.close()


def test_without_a_fill_value_nodata_is_minus_9999(tmp_path: Path) -> None:
    g = _granule(tmp_path)
    with h5py.File(g.path, "r+") as h:
        del h["reflectance"].attrs["_FillValue"]
    src = _open_direct(g.path)
    assert src.meta.nodata == -9999.0
    np.testing.assert_array_equal(src.read(Window(0, 0, *g.glt_x.shape)), apply_glt(g.swath, g.glt_x, g.glt_y))
    src.close()


def test_the_fill_value_is_nodata_and_fills_the_map_where_the_glt_is_zero(tmp_path: Path) -> None:
    g = _granule(tmp_path)
    with h5py.File(g.path, "r+") as h:
        h["reflectance"].attrs["_FillValue"] = np.array([-2.5], np.float32)
    src = _open_direct(g.path)
    assert src.meta.nodata == -2.5
    ref = apply_glt(g.swath, g.glt_x, g.glt_y, fill=-2.5)
    np.testing.assert_array_equal(src.read(Window(0, 0, *g.glt_x.shape)), ref)
    src.close()


def test_a_granule_without_a_start_time_has_no_datetime(tmp_path: Path) -> None:
    g = _granule(tmp_path, drop=("time_coverage_start",))
    src = _open_direct(g.path)
    assert src.meta.datetime is None
    src.close()


def test_the_transform_is_the_geotransform_in_affine_order(tmp_path: Path) -> None:
    g = _granule(tmp_path)
    with h5py.File(g.path, "r+") as h:
        h.attrs["geotransform"] = np.array([10.0, 2.0, 0.0, 50.0, 0.0, -3.0])
    src = _open_direct(g.path)
    assert src.meta.transform == (2.0, 0.0, 10.0, 0.0, -3.0, 50.0)
    src.close()


@pytest.mark.parametrize("gt", [
    [10.0, 2.0, 0.5, 50.0, 0.0, -3.0],  # rotated
    [10.0, 2.0, -0.5, 50.0, 0.0, -3.0],
    [10.0, 2.0, 0.0, 50.0, 0.5, -3.0],
    [10.0, 2.0, 0.0, 50.0, -0.5, -3.0],
    [10.0, 0.0, 0.0, 50.0, 0.0, -3.0],  # no pixel width
    [10.0, -2.0, 0.0, 50.0, 0.0, -3.0],
    [10.0, 2.0, 0.0, 50.0, 0.0, 0.0],  # no pixel height
    [10.0, 2.0, 0.0, 50.0, 0.0, 3.0],  # south-up
    [float("nan"), 2.0, 0.0, 50.0, 0.0, -3.0],
    [10.0, 2.0, 0.0, float("inf"), 0.0, -3.0],
])
def test_a_geotransform_that_is_not_north_up_is_refused(tmp_path: Path, gt: list[float]) -> None:
    g = _granule(tmp_path)
    with h5py.File(g.path, "r+") as h:
        h.attrs["geotransform"] = np.array(gt)
    message = _refusal(g.path)
    assert message == (f"{g.path}: geotransform {gt} is not a north-up grid with positive pixel size; "
                       "EMIT map grids are")


@pytest.mark.parametrize("key", ["glt_x", "glt_y"])
def test_glt_arrays_of_different_shapes_are_refused(tmp_path: Path, key: str) -> None:
    g = _granule(tmp_path)
    with h5py.File(g.path, "r+") as h:
        _replace(h, f"location/{key}", getattr(g, key)[:-1])
    message = _refusal(g.path)
    h_, w_ = g.glt_x.shape
    x, y = ((h_ - 1, w_), (h_, w_)) if key == "glt_x" else ((h_, w_), (h_ - 1, w_))
    assert message == (f"{g.path}: location/glt_x {x} and location/glt_y {y} differ in shape; the GLT is "
                       "damaged")


@pytest.mark.parametrize("key", ["glt_x", "glt_y"])
def test_a_glt_of_floats_is_refused(tmp_path: Path, key: str) -> None:
    g = _granule(tmp_path)
    with h5py.File(g.path, "r+") as h:
        _replace(h, f"location/{key}", getattr(g, key).astype(np.float32))
    message = _refusal(g.path)
    assert message == f"{g.path}: 'location/{key}' is float32; a GLT holds integer swath indices"


def test_an_unsigned_glt_is_read(tmp_path: Path) -> None:
    g = _granule(tmp_path)
    with h5py.File(g.path, "r+") as h:
        _replace(h, "location/glt_x", g.glt_x.astype(np.uint16))
        _replace(h, "location/glt_y", g.glt_y.astype(np.uint32))
    src = _open_direct(g.path)
    np.testing.assert_array_equal(src.read(Window(0, 0, *g.glt_x.shape)), apply_glt(g.swath, g.glt_x, g.glt_y))
    src.close()


# -- emit_product ----------------------------------------------------------------------------------------


def _mem(name: str, attrs: dict[str, Any], datasets: tuple[str, ...]) -> Any:
    h = h5py.File(name, "w", driver="core", backing_store=False)
    h.attrs.update(attrs)
    for d in datasets:
        h.create_dataset(d, data=np.zeros((1, 1, 1), np.float32))
    return h


@pytest.mark.parametrize(("attrs", "datasets", "product"), [
    ({"instrument": "EMIT"}, ("reflectance",), "reflectance"),
    ({"instrument": np.bytes_(b"EMIT")}, ("radiance",), "radiance"),
    ({"title": "EMIT L1B At-Sensor Calibrated Radiance"}, ("radiance",), "radiance"),
    ({"title": np.bytes_(b"EMIT L2A")}, ("reflectance",), "reflectance"),
    ({"instrument": "EMIT"}, ("radiance", "reflectance"), "reflectance"),  # reflectance first
    ({"instrument": "AVIRIS", "title": "AVIRIS-NG L2"}, ("reflectance",), None),
    ({}, ("reflectance", "radiance"), None),
    ({"instrument": "emit"}, ("reflectance",), None),  # the name as EMIT spells it
])
def test_an_emit_cube_is_known_by_its_attributes_and_variable(attrs: dict[str, Any], datasets: tuple[str, ...],
                                                             product: str | None) -> None:
    with _mem("g.nc", attrs, datasets) as h:
        assert emit_product(h) == product


def test_an_emit_file_without_a_cube_is_refused_by_name() -> None:
    with (_mem("EMIT_L2A_MASK.nc", {"instrument": "EMIT", "title": "EMIT L2A Masks"}, ("mask",)) as h,
          pytest.raises(UnsupportedFormatError) as info):
        emit_product(h)
    assert str(info.value) == ("EMIT_L2A_MASK.nc: an EMIT granule ('EMIT L2A Masks') without a 'reflectance' or "
                               "'radiance' cube; cubelake ingests the L1B RAD and L2A RFL granules (masks and "
                               "uncertainties are not scenes)")
    with (_mem("x.nc", {"instrument": "EMIT"}, ()) as h,
          pytest.raises(UnsupportedFormatError, match=re.escape("x.nc: an EMIT granule (b'') without"))):
        emit_product(h)
