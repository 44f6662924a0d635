"""Spectral coverage: band intervals, merging across small gaps, range queries and their parsing."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cubelake.catalog.coverage import (
    band_intervals,
    covers,
    merge_arrays,
    merge_intervals,
    merged_coverage,
    parse_wavelength_range,
)


def assert_intervals(got: list[tuple[float, float]], expected: list[tuple[float, float]]) -> None:
    """Same length and the same ``(lo, hi)`` pairs to 1e-9 nm (pytest.approx does not nest)."""
    assert len(got) == len(expected), (got, expected)
    for g, e in zip(got, expected, strict=True):
        assert g == pytest.approx(e, abs=1e-9), (got, expected)


@pytest.mark.parametrize(
    ("centres", "fwhm", "expected"),
    [
        # FWHM given: centre +- FWHM/2
        ([500.0, 510.0], [10.0, 12.0], [(495.0, 505.0), (504.0, 516.0)]),
        # no FWHM: the distance to the nearest neighbouring band
        ([400.0, 410.0, 430.0], [], [(395.0, 405.0), (405.0, 415.0), (420.0, 440.0)]),
        # unsorted centres: the neighbour is the nearest in wavelength, the order is the band order
        ([430.0, 400.0, 410.0], [], [(420.0, 440.0), (395.0, 405.0), (405.0, 415.0)]),
        # a missing or non-positive FWHM falls back to the spacing, the others are kept
        ([400.0, 410.0, 430.0], [6.0, None, 0.0], [(397.0, 403.0), (405.0, 415.0), (420.0, 440.0)]),
        # a FWHM list shorter than the bands: the rest use the spacing
        ([400.0, 410.0], [4.0], [(398.0, 402.0), (405.0, 415.0)]),
        # a lone band without a FWHM covers only its centre
        ([865.0], [], [(865.0, 865.0)]),
        ([865.0], [None], [(865.0, 865.0)]),
        # a lone band with a FWHM
        ([865.0], [40.0], [(845.0, 885.0)]),
        # bands without a centre wavelength are left out
        ([None, 500.0, None, 520.0], [], [(490.0, 510.0), (510.0, 530.0)]),
        ([None], [None], []),
        ([], [], []),
    ],
)
def test_band_intervals(
    centres: list[float | None], fwhm: list[float | None], expected: list[tuple[float, float]]
) -> None:
    assert_intervals(band_intervals(centres, fwhm), expected)


LANDSAT8 = {  # centre, FWHM (nm)
    "B1": (443.0, 20.0), "B2": (482.0, 65.0), "B3": (561.0, 75.0), "B4": (655.0, 50.0),
    "B5": (865.0, 40.0), "B6": (1609.0, 100.0), "B7": (2201.0, 200.0),
}


@pytest.mark.parametrize(
    ("intervals", "expected"),
    [
        ([], []),
        ([(0.0, 10.0)], [(0.0, 10.0)]),
        # overlap
        ([(0.0, 10.0), (5.0, 15.0)], [(0.0, 15.0)]),
        # touching
        ([(0.0, 10.0), (10.0, 20.0)], [(0.0, 20.0)]),
        # unsorted input
        ([(10.0, 20.0), (0.0, 10.0)], [(0.0, 20.0)]),
        # EnMAP SWIR: 0.4 nm between 10 nm bands is no hole
        ([(1000.0, 1010.0), (1010.4, 1020.4), (1020.8, 1030.8)], [(1000.0, 1030.8)]),
        # just under / just over half the narrower FWHM (both 10 nm wide -> limit 5 nm)
        ([(0.0, 10.0), (14.9, 24.9)], [(0.0, 24.9)]),
        ([(0.0, 10.0), (15.1, 25.1)], [(0.0, 10.0), (15.1, 25.1)]),
        # the narrower neighbour decides: a 2 nm band 3 nm away from a 100 nm band stays apart
        ([(0.0, 100.0), (103.0, 105.0)], [(0.0, 100.0), (103.0, 105.0)]),
        # ... and joins when 0.9 nm away
        ([(0.0, 100.0), (100.9, 102.9)], [(0.0, 102.9)]),
        # a removed water-vapour window (~100 nm) stays a hole
        (
            [(1330.0, 1340.0), (1340.0, 1350.0), (1450.0, 1460.0), (1460.0, 1470.0)],
            [(1330.0, 1350.0), (1450.0, 1470.0)],
        ),
        # a band inside another does not shorten it; the next gap is judged by the band reaching the end
        ([(0.0, 100.0), (10.0, 20.0), (101.0, 110.0)], [(0.0, 110.0)]),
    ],
)
def test_merge_intervals(intervals: list[tuple[float, float]], expected: list[tuple[float, float]]) -> None:
    assert_intervals(merge_intervals(intervals), expected)


def test_merge_intervals_landsat_sparse_bands_keep_their_holes() -> None:
    intervals = band_intervals([c for c, _ in LANDSAT8.values()], [w for _, w in LANDSAT8.values()])
    merged = merge_intervals(intervals)
    # B1/B2/B3 overlap; B3 (523.5-598.5) and B4 (630-680) leave 31.5 nm > 25 (half of B4's 50 nm)
    assert_intervals(merged, [
        (433.0, 598.5),
        (630.0, 680.0),
        (845.0, 885.0),
        (1559.0, 1659.0),
        (2101.0, 2301.0),
    ])
    assert covers(merged, 450.0, 590.0)
    assert not covers(merged, 590.0, 640.0)  # the B3/B4 hole
    assert not covers(merged, 400.0, 2400.0)


def test_merge_intervals_gap_fraction() -> None:
    assert merge_intervals([(0.0, 10.0), (12.0, 22.0)], gap_fraction=0.0) == [(0.0, 10.0), (12.0, 22.0)]
    assert merge_intervals([(0.0, 10.0), (10.0, 22.0)], gap_fraction=0.0) == [(0.0, 22.0)]
    assert merge_intervals([(0.0, 10.0), (19.0, 29.0)], gap_fraction=1.0) == [(0.0, 29.0)]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(300.0, 2500.0), st.floats(0.0, 60.0)).map(lambda t: (t[0], t[0] + t[1])),
        max_size=40,
    )
)
def test_merge_intervals_is_sorted_disjoint_and_covers_every_band(intervals: list[tuple[float, float]]) -> None:
    merged = merge_intervals(intervals)
    assert all(lo <= hi for lo, hi in merged)
    assert all(a[1] < b[0] for a, b in pairwise(merged))
    for lo, hi in intervals:
        assert covers(merged, lo, hi)
    # merging never invents coverage outside the bands' overall extent
    if intervals:
        assert merged[0][0] == min(lo for lo, _ in intervals)
        assert merged[-1][1] == max(hi for _, hi in intervals)


def _reference_merge(intervals: list[tuple[float, float]], gap_fraction: float = 0.5) -> list[tuple[float, float]]:
    """The rule, band by band: a gap up to gap_fraction x the narrower of the band and the band reaching the end."""
    merged: list[list[float]] = []
    end_width = 0.0
    for lo, hi in sorted(intervals):
        if merged and lo <= merged[-1][1] + gap_fraction * min(hi - lo, end_width):
            if hi >= merged[-1][1]:
                merged[-1][1] = hi
                end_width = hi - lo
        else:
            merged.append([lo, hi])
            end_width = hi - lo
    return [(a, b) for a, b in merged]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 400), st.integers(0, 30)).map(lambda t: (float(t[0]), float(t[0] + t[1]))),
        max_size=30,
    ),
    st.sampled_from([0.0, 0.5, 1.0]),
)
def test_merge_intervals_matches_a_band_by_band_merge(
    intervals: list[tuple[float, float]], gap_fraction: float
) -> None:
    # integer nm make exact ties (touching bands, gaps of exactly half a width) common
    assert merge_intervals(intervals, gap_fraction) == _reference_merge(intervals, gap_fraction)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.floats(350.0, 2500.0)), max_size=30),
    st.lists(st.one_of(st.none(), st.floats(0.0, 40.0)), max_size=30),
)
def test_merged_coverage_is_merge_of_band_intervals(
    centres: list[float | None], fwhm: list[float | None]
) -> None:
    assert_intervals(merged_coverage(centres, fwhm), merge_intervals(band_intervals(centres, fwhm)))


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        (450.0, 850.0, True),
        (400.0, 900.0, True),  # the ends are inclusive
        (1000.0, 1000.0, True),  # a point
        (850.0, 1050.0, False),  # spans the hole
        (950.0, 950.0, False),  # a point in the hole
        (399.9, 500.0, False),
        (1200.0, 1300.1, False),
    ],
)
def test_covers(lo: float, hi: float, expected: bool) -> None:
    merged = [(400.0, 900.0), (1000.0, 1300.0)]
    assert covers(merged, lo, hi) is expected


def test_covers_nothing_when_empty() -> None:
    assert not covers([], 500.0, 500.0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400:2400", (400.0, 2400.0)),
        (" 400 : 2400 ", (400.0, 2400.0)),
        ("400:2400nm", (400.0, 2400.0)),
        ("0.4:2.4um", (400.0, 2400.0)),
        ("0.4:2.4UM", (400.0, 2400.0)),
        ("0.4:2.4µm", (400.0, 2400.0)),
        ("865", (865.0, 865.0)),
        ("0.865um", (865.0, 865.0)),
        ("500:500", (500.0, 500.0)),
    ],
)
def test_parse_wavelength_range(text: str, expected: tuple[float, float]) -> None:
    assert parse_wavelength_range(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["2400:400", "abc", "-5:10", "1:2:3", "", ":", "0:10", "400:", "nan:nan", "4e2:x"])
def test_parse_wavelength_range_errors(text: str) -> None:
    with pytest.raises(ValueError, match="LO:HI in nm") as info:
        parse_wavelength_range(text)
    message = str(info.value)
    assert repr(text) in message
    assert "LO:HI in nm" in message
    assert "LO <= HI" in message
    assert "0.4:2.4um" in message


def test_a_band_open_towards_short_wavelengths_starts_the_first_interval() -> None:
    """A band whose lower edge is -inf (nothing precedes it): the first interval starts there, merged or not."""
    assert merge_arrays(np.array([-np.inf, 400.0]), np.array([300.0, 500.0])) == [(-np.inf, 300.0), (400.0, 500.0)]
    assert merge_arrays(np.array([-np.inf, 100.0]), np.array([300.0, 500.0])) == [(-np.inf, 500.0)]
