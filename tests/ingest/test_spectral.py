"""Wavelength parsing and spectral checks (pure)."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cubelake.ingest.report import Code
from cubelake.ingest.spectral import (
    DEFAULT_BAD_WINDOWS_NM,
    bands_in_windows,
    check_fwhm,
    check_wavelengths,
    overlap_drops,
    parse_float_list,
    parse_wavelength_text,
)


@pytest.mark.parametrize(
    ("text", "nm"),
    [
        ("376.44 Nanometers", 376.44),
        ("band 1 (418.24 Nanometers)", 418.24),
        ("0.865 um", 865.0),
        ("Band 5 (1.6 micrometers)", 1600.0),
        ("2500.12 nm", 2500.12),
        ("NIR", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_wavelength_text(text: str | None, nm: float | None) -> None:
    got = parse_wavelength_text(text)
    if nm is None:
        assert got is None
    else:
        assert got == pytest.approx(nm)


def test_parse_float_list_envi_style() -> None:
    assert parse_float_list("{5.57 , 5.58 ,\n 5.6}") == [5.57, 5.58, 5.6]
    assert parse_float_list("1,2,3") == [1.0, 2.0, 3.0]


def test_count_mismatch_is_an_error_naming_counts() -> None:
    issues = check_wavelengths([400.0, 500.0], 3, where="x.hdr")
    assert [i.code for i in issues] == [Code.WAVELENGTH_COUNT]
    assert "2 wavelengths for 3 bands" in issues[0].message


def test_non_monotonic_reports_every_step() -> None:
    wl = [400.0, 410.0, 405.0, 420.0, 419.0, 430.0]
    (issue,) = check_wavelengths(wl, 6, where="x")
    assert issue.code is Code.WAVELENGTH_ORDER
    assert issue.bands == (3, 5)
    assert "band 2 (410 nm) -> band 3 (405 nm)" in issue.message


def test_non_positive_is_an_error() -> None:
    issues = check_wavelengths([-1.0, 0.0, 500.0], 3, where="x")
    assert Code.WAVELENGTH_NONPOSITIVE in [i.code for i in issues]


def test_ignored_bands_are_skipped_by_the_order_check() -> None:
    # Landsat TM: the thermal band 6 sits between 5 and 7
    wl = [485, 560, 660, 830, 1650, 11450, 2215]
    assert check_wavelengths([float(w) for w in wl], 7, where="x")  # an error without ignoring B6
    assert check_wavelengths([float(w) for w in wl], 7, where="x", ignore=frozenset({5})) == []


@settings(max_examples=100)
@given(st.lists(st.floats(min_value=300, max_value=2600, allow_nan=False), min_size=1, max_size=60))
def test_overlap_drops_leave_a_strictly_increasing_axis(wl: list[float]) -> None:
    found = overlap_drops(wl, max_seams=len(wl), max_share=1.0)
    assert found is not None
    drops = set(found)
    kept = [w for i, w in enumerate(wl) if i not in drops]
    assert all(b > a for a, b in itertools.pairwise(kept))
    assert 0 not in drops  # the first band is always kept


def test_overlap_drops_enmap_like_seam() -> None:
    vnir = [420.0 + 6 * i for i in range(96)]  # ... up to 990
    swir = [902.0 + 9 * i for i in range(20)]
    drops = overlap_drops(vnir + swir)
    assert drops == [96 + i for i, w in enumerate(swir) if w <= vnir[-1]]


def test_overlap_drops_refuse_what_is_not_a_seam() -> None:
    ascending = [420.0 + 6 * i for i in range(224)]
    assert overlap_drops(ascending[::-1]) is None  # reversed: dropping would keep 1 of 224 bands
    zigzag = [w + (30.0 if i % 2 else 0.0) for i, w in enumerate(ascending)]
    assert overlap_drops(zigzag) is None  # a step back every other band is no detector seam
    assert overlap_drops(ascending) == []


def test_fwhm_plausibility() -> None:
    wl = [400.0 + 10 * i for i in range(10)]
    assert check_fwhm(wl, [10.0] * 10, where="x") == []
    (issue,) = check_fwhm(wl, [0.01] * 10, where="x")  # micrometres given as nm
    assert issue.code is Code.FWHM_IMPLAUSIBLE
    assert issue.bands == tuple(range(1, 11))


def test_default_windows_select_water_bands() -> None:
    wl = [1000.0, 1360.0, 1400.0, 1700.0, 1900.0, 2300.0, 2460.0]
    assert bands_in_windows(wl, DEFAULT_BAD_WINDOWS_NM) == [1, 2, 4, 6]
    assert math.isinf(DEFAULT_BAD_WINDOWS_NM[-1][1])
