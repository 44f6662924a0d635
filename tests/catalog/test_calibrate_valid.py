"""CalibrationPlan.valid_pixels: where any kept band holds a valid value (the footprint's input)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cubelake.cube import CFEncoder
from cubelake.ingest.calibrate import BandSelection, CalibrationPlan, LinearCoder


def plan(dtype: str, n_source: int, keep: tuple[int, ...], nodata: float | None) -> CalibrationPlan:
    n = len(keep)
    return CalibrationPlan(dtype, BandSelection(n_source, keep), nodata, LinearCoder((1.0,) * n, (0.0,) * n),
                           CFEncoder("float32", fill_value=math.nan))


def test_all_valid_is_none() -> None:
    raw = np.arange(1, 3 * 2 * 4 + 1, dtype=np.uint16).reshape(3, 2, 4)
    assert plan("uint16", 3, (0, 1, 2), 0.0).valid_pixels(raw) is None


def test_integer_nodata_any_kept_band_valid() -> None:
    raw = np.array([
        [[0, 0, 5], [0, 7, 0]],  # band 1 (kept)
        [[9, 9, 9], [9, 9, 9]],  # band 2 (removed): all valid, must not count
        [[0, 3, 0], [0, 0, 0]],  # band 3 (kept)
    ], dtype=np.uint16)
    got = plan("uint16", 3, (0, 2), 0.0).valid_pixels(raw)
    assert got is not None
    assert got.dtype == bool
    assert got.shape == (2, 3)
    assert got.tolist() == [[False, True, True], [False, True, False]]


def test_only_kept_bands_count() -> None:
    raw = np.zeros((2, 2, 2), dtype=np.int16)
    raw[1] = 4  # the removed band is valid everywhere
    got = plan("int16", 2, (0,), 0.0).valid_pixels(raw)
    assert got is not None
    assert not got.any()


def test_float_nan_and_infinities_are_invalid_without_nodata() -> None:
    raw = np.array([
        [[np.nan, 1.0, np.inf], [-np.inf, np.nan, 0.0]],
        [[np.nan, np.nan, np.nan], [np.nan, 2.0, np.nan]],
    ], dtype=np.float32)
    got = plan("float32", 2, (0, 1), None).valid_pixels(raw)
    assert got is not None
    assert got.tolist() == [[False, True, False], [False, True, True]]


def test_float_nodata_and_nan_are_invalid() -> None:
    raw = np.array([[[-9999.0, np.nan, 0.5, -9999.5]]], dtype=np.float64)
    got = plan("float64", 1, (0,), -9999.0).valid_pixels(raw)
    assert got is not None
    assert got.tolist() == [[False, False, True, True]]


def test_float_with_nan_nodata_masks_nan_only() -> None:
    raw = np.array([[[np.nan, 0.0, -9999.0]]], dtype=np.float32)
    got = plan("float32", 1, (0,), math.nan).valid_pixels(raw)
    assert got is not None
    assert got.tolist() == [[False, True, True]]


@pytest.mark.parametrize(
    ("dtype", "nodata"),
    [
        ("uint16", None),  # integers without nodata: every value is valid
        ("int16", None),
        ("uint16", -9999.0),  # nodata outside the type never occurs
        ("uint8", 300.0),
        ("int16", 0.5),  # a fractional nodata never equals an integer
        ("uint16", math.nan),
    ],
)
def test_integers_that_cannot_hold_nodata_are_all_valid(dtype: str, nodata: float | None) -> None:
    raw = np.zeros((2, 3, 3), dtype=dtype)
    assert plan(dtype, 2, (0, 1), nodata).valid_pixels(raw) is None


@pytest.mark.parametrize("keep", [(0, 5, 2), (2, 0, 1), (5, 3, 4), (1, 3)])
def test_kept_bands_in_any_order(keep: tuple[int, ...]) -> None:
    # (0, 5, 2) spans 0..5 in three bands like a contiguous run would, but skips bands 1, 3 and 4
    raw = np.zeros((6, 1, 6), dtype=np.int16)
    for b in range(6):
        raw[b, 0, b] = 1  # pixel b is valid in band b only
    got = plan("int16", 6, keep, 0.0).valid_pixels(raw)
    assert got is not None
    assert got[0].tolist() == [b in keep for b in range(6)]


def test_a_pixel_valid_only_in_a_late_band_group() -> None:
    # more kept bands than one calibration group: the later groups must still be looked at
    n = 40
    raw = np.zeros((n, 2, 2), dtype=np.int16)
    raw[:, 0, 0] = 1  # valid in every band
    raw[n - 1, 1, 1] = 1  # valid only in the last band
    got = plan("int16", n, tuple(range(n)), 0.0).valid_pixels(raw)
    assert got is not None
    assert got.tolist() == [[True, False], [False, True]]


def test_all_valid_in_first_group_is_none_even_if_later_bands_are_empty() -> None:
    n = 40
    raw = np.zeros((n, 2, 2), dtype=np.int16)
    raw[0] = 1
    assert plan("int16", n, tuple(range(n)), 0.0).valid_pixels(raw) is None


@st.composite
def cases(draw: st.DrawFn) -> tuple[np.ndarray, tuple[int, ...], float | None]:
    n_source = draw(st.integers(1, 40))
    keep = tuple(draw(st.lists(st.integers(0, n_source - 1), min_size=1, max_size=n_source, unique=True)))
    h, w = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**32 - 1))
    density = draw(st.sampled_from([0.0, 0.05, 0.5, 0.95, 1.0]))
    dtype = draw(st.sampled_from(["uint16", "int16", "float32"]))
    rng = np.random.default_rng(seed)
    valid = rng.random((n_source, h, w)) < density
    if dtype == "float32":
        nodata = draw(st.sampled_from([None, -9999.0]))
        bad = rng.choice(np.array([np.nan, np.inf, -9999.0 if nodata is not None else np.nan], dtype=np.float32),
                         size=valid.shape)
        raw = np.where(valid, rng.random(valid.shape).astype(np.float32), bad).astype(np.float32)
    else:
        nodata = 0.0
        raw = np.where(valid, rng.integers(1, 100, valid.shape), 0).astype(dtype)
    return raw, keep, nodata


@settings(max_examples=300, deadline=None)
@given(cases())
def test_valid_pixels_matches_brute_force(case: tuple[np.ndarray, tuple[int, ...], float | None]) -> None:
    raw, keep, nodata = case
    kept = raw[list(keep)]
    ok = np.isfinite(kept) if kept.dtype.kind == "f" else np.ones(kept.shape, dtype=bool)
    if nodata is not None:
        ok &= kept != nodata
    expected = ok.any(axis=0)
    got = plan(str(raw.dtype), raw.shape[0], keep, nodata).valid_pixels(raw)
    if expected.all():
        assert got is None
    else:
        assert got is not None
        np.testing.assert_array_equal(got, expected)
