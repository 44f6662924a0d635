"""The scene thumbnail: band choice and stretch (pure), the sink that bins it during the pixel pass, and end
to end on a real EnMAP tile, where the PNG is compared with a rendering computed here from the source alone."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from cubelake.catalog import validate_stac
from cubelake.catalog.validate import stac_registry
from cubelake.copy import copy_lake
from cubelake.grid import Window
from cubelake.ingest import IngestOptions, Outcome, ThumbnailSpec, ingest
from cubelake.ingest.thumbnail import (
    BandChoice,
    BinnedMean,
    candidate_bands,
    choose_accumulated,
    choose_bands,
    compose,
    stored_valid,
    stretch,
    thumbnail_shape,
)
from cubelake.ingest.thumbnail_writer import ThumbnailSink
from cubelake.record import read_scene_record

from ..conftest import REAL, hsi_cube, write_geotiff

ENMAP = REAL / "hsi_enmap_potsdam" / "enmap_potsdam_tile_96_0.tif"
SHARED_SCHEMAS = REAL.parent.parent / "schemas" / "stac-extensions"
SPEC = ThumbnailSpec()


# -- band choice ---------------------------------------------------------------------------------------

def _grid(lo: float, hi: float, step: float) -> list[float | None]:
    return [float(w) for w in np.arange(lo, hi + step / 2, step)]


@pytest.mark.parametrize(("wavelengths", "want"), [
    (_grid(400, 1000, 10), (640.0, 550.0, 470.0)),                 # a regular hyperspectral grid
    (_grid(403, 1003, 7), (641.0, 550.0, 473.0)),                  # no band on a target: the nearest
    ([443.0, 482.0, 561.0, 655.0, 865.0, 1609.0, 2201.0], (655.0, 561.0, 482.0)),  # Landsat 8 OLI
    ([2201.0, 865.0, 655.0, 561.0, 482.0, 443.0], (655.0, 561.0, 482.0)),           # any band order
    ([490.0, 560.0, 665.0, 842.0], (665.0, 560.0, 490.0)),        # Sentinel-2 10 m bands: 25 nm from red
])
def test_true_colour_picks_the_bands_nearest_640_550_470(wavelengths: list[float | None],
                                                         want: tuple[float, ...]) -> None:
    choice = choose_bands(wavelengths, SPEC)
    assert choice.mode == "true_colour"
    assert choice.wavelengths_nm == want
    assert tuple(wavelengths[i] for i in choice.indices) == want


def test_a_tie_goes_to_the_lower_band_and_a_band_without_valid_pixels_is_never_chosen() -> None:
    wl: list[float | None] = [465.0, 475.0, 545.0, 555.0, 635.0, 645.0]
    assert choose_bands(wl, SPEC).indices == (4, 2, 0)
    counts: list[int | None] = [10, 10, 10, 10, 0, None]  # the 635 nm band is all nodata; None: not counted
    assert choose_bands(wl, SPEC, counts).indices == (5, 2, 0)


def test_a_band_beyond_the_tolerance_is_not_called_red() -> None:
    # 600 and 700 nm are 40 and 60 nm from 640: no true colour, no NIR near 860 either
    choice = choose_bands([500.0, 600.0, 700.0, 800.0, 900.0], SPEC)
    assert choice.mode == "false_colour"
    wider = choose_bands([470.0, 550.0, 600.0, 900.0], ThumbnailSpec(tolerance_nm=45))
    assert wider.mode == "true_colour"
    assert wider.wavelengths_nm == (600.0, 550.0, 470.0)


def test_without_blue_colour_infrared_is_the_fallback() -> None:
    choice = choose_bands([550.0, 650.0, 860.0, 1600.0], SPEC)
    assert choice.mode == "colour_infrared"
    assert choice.wavelengths_nm == (860.0, 650.0, 550.0)


def test_a_swir_only_sensor_gets_three_bands_spread_over_its_range_longest_in_red() -> None:
    wl = _grid(1000, 2500, 10)
    choice = choose_bands(wl, SPEC)
    assert choice.mode == "false_colour"
    assert choice.wavelengths_nm == (2250.0, 1750.0, 1250.0)
    assert choice.title(SPEC) == "False colour (R 2250 nm, G 1750 nm, B 1250 nm), 2–98 % stretch"


def test_bands_bunched_at_one_end_still_give_three_distinct_bands() -> None:
    choice = choose_bands([400.0, 2400.0, 2450.0], SPEC)
    assert choice.mode == "false_colour"
    assert choice.wavelengths_nm == (2450.0, 2400.0, 400.0)


@pytest.mark.parametrize(("wavelengths", "counts", "want_index", "title"), [
    ([None], None, 0, "Greyscale (band 1), 2–98 % stretch"),
    ([None] * 5, None, 2, "Greyscale (band 3), 2–98 % stretch"),                     # the middle band
    ([None] * 5, [1, 1, 0, 1, 1], 3, "Greyscale (band 4), 2–98 % stretch"),          # the middle usable one
    ([820.0], None, 0, "Greyscale (band 1, 820 nm), 2–98 % stretch"),
    ([480.0, 560.0], None, 1, "Greyscale (band 2, 560 nm), 2–98 % stretch"),         # two: the one nearest 550
    ([None, 560.0, None, 700.0], None, 1, "Greyscale (band 2, 560 nm), 2–98 % stretch"),
])
def test_one_band_or_no_wavelengths_is_greyscale(wavelengths: list[float | None], counts: list[int | None] | None,
                                                  want_index: int, title: str) -> None:
    choice = choose_bands(wavelengths, SPEC, counts)
    assert choice == BandChoice("greyscale", (want_index,), (wavelengths[want_index],))
    assert choice.title(SPEC) == title


def test_no_band_with_a_valid_pixel_is_an_error() -> None:
    with pytest.raises(ValueError, match="no band has a valid pixel"):
        choose_bands([470.0, 550.0, 640.0], SPEC, [0, 0, 0])
    with pytest.raises(ValueError, match="3 wavelengths but 2 valid counts"):
        choose_bands([470.0, 550.0, 640.0], SPEC, [1, 1])


@given(st.lists(st.one_of(st.none(), st.floats(300, 2600)), min_size=1, max_size=40))
def test_any_sensor_gets_distinct_bands_in_channel_order(wavelengths: list[float | None]) -> None:
    choice = choose_bands(wavelengths, SPEC)
    assert len(set(choice.indices)) == len(choice.indices) in (1, 3)
    assert all(0 <= i < len(wavelengths) for i in choice.indices)
    assert choice.wavelengths_nm == tuple(wavelengths[i] for i in choice.indices)
    if choice.mode == "true_colour":
        for w, target in zip(choice.wavelengths_nm, (640, 550, 470), strict=True):
            assert w is not None
            assert abs(w - target) <= SPEC.tolerance_nm
    if choice.mode == "false_colour":
        r, g, b = choice.wavelengths_nm
        assert r is not None
        assert g is not None
        assert b is not None
        assert r >= g >= b  # spectral order: the longest wavelength in red


def test_the_candidates_are_the_choice_then_the_choice_without_it() -> None:
    wl: list[float | None] = [465.0, 475.0, 545.0, 555.0, 635.0, 645.0, 860.0]
    assert candidate_bands(wl, SPEC) == (4, 2, 0, 5, 3, 1)
    assert candidate_bands(wl, SPEC, rounds=1) == choose_bands(wl, SPEC).indices
    assert candidate_bands([None] * 5, SPEC) == (2, 3)          # greyscale: the middle band, then the next middle
    assert candidate_bands([550.0], SPEC) == (0,)               # nothing left for a second round


@pytest.mark.parametrize("counts", [
    None,
    [10, 10, 10, 10, 10, 10, 10],
    [10, 10, 10, 10, 0, 10, 10],     # red empty: its replacement 645 nm was accumulated
    [0, 10, 10, 10, 0, 10, 10],      # red and blue empty: both replacements accumulated
])
def test_the_choice_among_candidates_is_choose_bands_when_its_bands_were_accumulated(
        counts: list[int | None] | None) -> None:
    wl: list[float | None] = [465.0, 475.0, 545.0, 555.0, 635.0, 645.0, 860.0]
    assert choose_accumulated(wl, candidate_bands(wl, SPEC), SPEC, counts) == choose_bands(wl, SPEC, counts)


def test_when_the_replacement_was_not_accumulated_the_best_candidate_is_shown() -> None:
    wl: list[float | None] = [470.0, 550.0, 640.0, 641.0, 642.0]
    accumulated = candidate_bands(wl, SPEC, rounds=1)
    assert accumulated == (2, 1, 0)
    counts: list[int | None] = [5, 5, 0, 5, 5]  # red empty; 641 nm would replace it but was not binned
    assert choose_bands(wl, SPEC, counts).indices == (3, 1, 0)
    choice = choose_accumulated(wl, accumulated, SPEC, counts)
    assert choice.mode == "greyscale"  # two bands with data among those binned: the one nearest 550 nm
    assert choice.indices == (1,)
    with pytest.raises(ValueError, match=r"none of the bands accumulated for the thumbnail \(1, 2, 3, 1-based\)"):
        choose_accumulated(wl, accumulated, SPEC, [0, 0, 0, 5, 5])


# -- size ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("shape", "max_side", "want"), [
    ((32, 32), 512, (32, 32)),        # small scenes are not upscaled
    ((512, 300), 512, (512, 300)),
    ((1000, 2000), 512, (256, 512)),
    ((2000, 1000), 512, (512, 256)),
    ((1000, 3), 512, (512, 2)),       # 1.536 px, rounded
    ((10000, 1), 512, (512, 1)),      # never 0 px wide
    ((32, 32), 16, (16, 16)),
    ((25, 30), 16, (13, 16)),
])
def test_thumbnail_shape_keeps_the_aspect_ratio_within_max_side(shape: tuple[int, int], max_side: int,
                                                                want: tuple[int, int]) -> None:
    assert thumbnail_shape(*shape, max_side) == want


# -- binned mean -----------------------------------------------------------------------------------------

def test_binned_mean_is_the_block_mean_of_valid_pixels_whatever_the_windows() -> None:
    rng = np.random.default_rng(2)
    data = rng.uniform(0, 100, (2, 12, 18))
    valid = rng.uniform(size=data.shape) > 0.3
    valid[0, :4, :6] = False  # one bin with no valid pixel
    want_sum = (data * valid).reshape(2, 3, 4, 3, 6).sum(axis=(2, 4))
    want_n = valid.reshape(2, 3, 4, 3, 6).sum(axis=(2, 4))
    for rows, cols in ((12, 18), (5, 7), (1, 18), (12, 1)):  # windows not aligned with the bins
        acc = BinnedMean(2, (12, 18), (3, 3))
        for r in range(0, 12, rows):
            for c in range(0, 18, cols):
                acc.add(data[:, r:r + rows, c:c + cols], valid[:, r:r + rows, c:c + cols], r, c)
        mean, ok = acc.mean()
        assert np.array_equal(ok, want_n > 0)
        assert np.allclose(mean[ok], (want_sum / np.maximum(want_n, 1))[ok])
        assert np.isnan(mean[0, 0, 0])


def test_binned_mean_bins_are_within_a_pixel_of_each_other_when_sizes_do_not_divide() -> None:
    acc = BinnedMean(1, (10, 7), (3, 2))
    acc.add(np.ones((1, 10, 7)), np.ones((1, 10, 7), bool), 0, 0)
    # rows 0-3, 4-6, 7-9 and columns 0-3, 4-6
    assert acc.counts[0].tolist() == [[4 * 4, 4 * 3], [3 * 4, 3 * 3], [3 * 4, 3 * 3]]
    assert acc.counts.sum() == 70


# -- stretch -------------------------------------------------------------------------------------------

def test_percentiles_are_taken_over_valid_pixels_only() -> None:
    rng = np.random.default_rng(0)
    channel = rng.uniform(100, 200, (40, 50))
    valid = np.ones(channel.shape, bool)
    valid[:, :10] = False
    channel[:, :10] = 1e9  # what nodata or NaN would be if it counted: every valid pixel near 0
    out = stretch(channel, valid)
    lo, hi = np.percentile(channel[valid], [2, 98])
    want = np.rint(np.clip((channel - lo) / (hi - lo) * 255, 0, 255)).astype(np.uint8)
    assert np.array_equal(out[valid], want[valid])
    assert (out[~valid] == 0).all()
    assert out[valid].min() == 0
    assert out[valid].max() == 255
    # the top and bottom 2 % of the valid pixels saturate (with the invalid ones counted, 20 % would be 255)
    assert 0.015 < (out[valid] == 255).mean() < 0.03
    assert 0.015 < (out[valid] == 0).mean() < 0.03


def test_a_constant_channel_is_mid_grey() -> None:
    valid = np.ones((8, 8), bool)
    valid[0, 0] = False
    with np.errstate(all="raise"):
        out = stretch(np.full((8, 8), 7.0), valid)
    assert (out[valid] == 128).all()
    assert out[0, 0] == 0


def test_no_valid_pixel_gives_zeros() -> None:
    assert not stretch(np.ones((4, 4)), np.zeros((4, 4), bool)).any()


@pytest.mark.parametrize(("fill", "want"), [
    (-32768.0, [[False, True, True], [True, False, True]]),
    (float("nan"), [[True, True, True], [True, False, True]]),
    (None, [[True, True, True], [True, False, True]]),
])
def test_nodata_and_nan_are_not_valid(fill: float | None, want: list[list[bool]]) -> None:
    stored = np.array([[-32768.0, 1.0, 2.0], [3.0, np.nan, 5.0]])
    assert stored_valid(stored, fill).tolist() == want


def test_a_pixel_invalid_in_any_channel_is_transparent_and_counts_in_no_percentile() -> None:
    rng = np.random.default_rng(1)
    channels = rng.uniform(0, 1, (3, 20, 20))
    valid = np.ones(channels.shape, bool)
    valid[2, :5] = False           # nodata in blue only
    channels[0, 5:7] = np.nan      # NaN in red only
    channels[1, :5] = 1e6          # outliers in green where blue is nodata: must not shift green's stretch
    image = compose(channels, valid, SPEC)
    assert image.shape == (20, 20, 4)
    assert image.dtype == np.uint8
    shown = np.ones((20, 20), bool)
    shown[:7] = False
    assert np.array_equal(image[..., 3] == 255, shown)
    assert not image[~shown].any()  # colour 0 and alpha 0
    for c in range(3):
        assert np.array_equal(image[..., c][shown], stretch(channels[c], shown)[shown])
    grey = compose(channels[:1], valid[:1], SPEC)
    assert grey.shape == (20, 20, 2)
    with pytest.raises(ValueError, match="expected channels"):
        compose(channels[:2], valid[:2], SPEC)


# -- the pixel-pass sink ------------------------------------------------------------------------------

def _feed(sink: ThumbnailSink, data: np.ndarray, block: int, workers: int = 4, reverse: bool = True) -> None:
    """Write ``data`` (band, y, x) into ``sink`` in ``block`` px windows, from ``workers`` threads, last first."""
    _, ny, nx = data.shape
    windows = [Window(r, c, min(block, ny - r), min(block, nx - c))
               for r in range(0, ny, block) for c in range(0, nx, block)]
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda w: sink.write(w, data[:, w.row_off:w.row_end, w.col_off:w.col_end]),
                      windows[::-1] if reverse else windows))


@pytest.mark.parametrize("block", [2, 3, 8])  # aligned with the bins, not aligned, the whole scene at once
def test_the_sink_averages_the_valid_pixels_of_the_candidate_bands_only(block: int) -> None:
    data = np.arange(4 * 8 * 8, dtype="int16").reshape(4, 8, 8)
    data[1, 0, 0] = -1             # one nodata pixel in a 2x2 bin
    data[1, 6:, 6:] = -1           # a bin of nodata only
    sink = ThumbnailSink((2, 1), (8, 8), ThumbnailSpec(max_side=4), -1.0)
    _feed(sink, data, block)
    got, valid = sink.means([2, 1])  # stored bands 2 and 1 (0-based)
    assert got.shape == valid.shape == (2, 4, 4)
    assert got.dtype == np.float64
    want = data.astype(np.float64).reshape(4, 4, 2, 4, 2).mean(axis=(2, 4))
    assert np.allclose(got[0], want[2])
    assert got[1, 0, 0] == pytest.approx(np.mean([data[1, 0, 1], data[1, 1, 0], data[1, 1, 1]]))
    assert not valid[1, 3, 3]  # nodata only: no value
    assert np.isnan(got[1, 3, 3])
    assert valid.sum() == 31
    assert np.allclose(got[1, 1:3], want[1, 1:3])
    assert np.array_equal(sink.means([1])[0], got[1:], equal_nan=True)  # any subset, in any order
    with pytest.raises(ValueError, match=r"bands \[0\] \(0-based\) were not accumulated"):
        sink.means([0])


def test_the_sink_skips_nan_and_takes_pixel_interleaved_views() -> None:
    data = np.arange(3 * 8 * 8, dtype="float32").reshape(3, 8, 8)
    data[0, 0, 0] = np.nan
    data[0, 6:, 6:] = np.nan
    pixels = np.ascontiguousarray(data.transpose(1, 2, 0)).transpose(2, 0, 1)  # as the pass reads such a COG
    sink = ThumbnailSink((0,), (8, 8), ThumbnailSpec(max_side=4), None)
    _feed(sink, pixels, 4)
    got, valid = sink.means([0])
    assert got[0, 0, 0] == pytest.approx(np.mean([1.0, 8.0, 9.0]))  # the NaN pixel left out of the mean
    assert np.isnan(got[0, 3, 3])
    assert valid.sum() == 15


def test_a_small_scene_is_binned_pixel_for_pixel() -> None:
    data = hsi_cube(5, 30, 20)
    sink = ThumbnailSink((4, 0), (30, 20), SPEC, -32768.0)
    _feed(sink, data, 7, workers=2)
    got, valid = sink.means([0, 4])
    assert valid.all()
    assert np.array_equal(got, data[[0, 4]].astype(np.float64))


# -- end to end: a real EnMAP tile ---------------------------------------------------------------------

def _source_rgb(path: Path) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """The source's bands nearest 640/550/470 nm at full resolution, read here with rasterio: (3, y, x) float64,
    where all three are valid, and their wavelengths."""
    with rasterio.open(path) as ds:
        wl = np.array([float(ds.tags(b)["wavelength"]) for b in range(1, ds.count + 1)])
        numbers = [int(np.argmin(np.abs(wl - t))) + 1 for t in (640, 550, 470)]
        data = ds.read(numbers).astype(np.float64)
        nodata = ds.nodata
    valid = (data != nodata).all(axis=0) & np.isfinite(data).all(axis=0)
    return data, valid, [float(wl[n - 1]) for n in numbers]


def reference_rendering(path: Path, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The thumbnail as it should look, computed independently: a 2-98 % stretch of the full-resolution source
    bands over their valid pixels, then block means down to ``shape``. (3, h, w) grey levels, and where valid."""
    data, valid, _ = _source_rgb(path)
    out = np.zeros(data.shape)
    for c in range(3):
        lo, hi = np.percentile(data[c][valid], [2, 98])
        out[c] = np.clip((data[c] - lo) / (hi - lo) * 255, 0, 255)
    (h, w), (_, y, x) = shape, out.shape
    fy, fx = y // h, x // w
    assert (fy * h, fx * w) == (y, x), "the reference downsamples by whole blocks"
    weights = valid.reshape(h, fy, w, fx).sum(axis=(1, 3))
    sums = (out * valid).reshape(3, h, fy, w, fx).sum(axis=(2, 4))
    return sums / np.maximum(weights, 1), weights > 0


def similarity(image: np.ndarray, ref: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per channel: Pearson correlation and mean absolute difference (grey levels) of ``image`` (y, x, 4) with
    ``ref`` (3, y, x); and the 3x3 cross-correlation matrix (thumbnail channel x reference channel)."""
    px = image[..., :3][valid].astype(np.float64).T
    rf = ref[:, valid]
    cross = np.corrcoef(px, rf)[:3, 3:]
    return np.diag(cross), np.abs(px - rf).mean(axis=1), cross


def assert_looks_like(image: np.ndarray, ref: np.ndarray, valid: np.ndarray, max_mad: float) -> None:
    corr, mad, cross = similarity(image, ref, valid)
    assert (corr > 0.95).all(), f"per-channel correlation {corr}"
    assert (mad < max_mad).all(), f"per-channel mean absolute difference {mad} grey levels"
    # each channel resembles its own reference channel more than any other: swapped channels fail here
    for c in range(3):
        others = [cross[c, k] for k in range(3) if k != c]
        assert cross[c, c] > max(others), f"channel {'RGB'[c]} correlates {cross[c]} with R, G, B"


@pytest.fixture(scope="module")
def enmap_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert ENMAP.is_file(), f"real test data not found at {ENMAP}; set CUBELAKE_REAL_DATA"
    root = tmp_path_factory.mktemp("thumb") / "lake"
    (result,) = ingest([ENMAP], root, IngestOptions(workers=2))
    assert result.outcome is Outcome.INGESTED, result.message
    return root / "scenes" / str(result.scene_id)


def _png(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        im.verify()  # a complete, uncorrupted PNG (verify leaves the image unusable: reopen it)
    with Image.open(path) as im:
        assert im.format == "PNG"
        assert im.mode in ("RGBA", "LA")
        return np.asarray(im)


def test_the_enmap_tile_gets_a_true_colour_png_beside_its_products(enmap_lake: Path) -> None:
    scene = enmap_lake
    record = read_scene_record(scene / "scene.json")
    thumb = record.thumbnail
    assert thumb is not None
    image = _png(scene / "thumbnail.png")
    assert image.shape == (record.grid.height, record.grid.width, 4) == (32, 32, 4)  # 32 px: not upscaled
    assert (thumb.height, thumb.width) == (32, 32)
    assert thumb.bytes == (scene / "thumbnail.png").stat().st_size
    _, _, source_wl = _source_rgb(ENMAP)
    assert thumb.mode == "true_colour"
    assert thumb.wavelengths_nm == source_wl == [641.1, 550.525, 468.265]
    assert [record.bands[i].wavelength_nm for i in thumb.bands] == source_wl
    assert (image[..., 3] == 255).all()  # the tile has no nodata pixel in these bands
    item = json.loads((scene / "item.json").read_text())
    asset = item["assets"]["thumbnail"]
    assert asset["href"] == "./thumbnail.png"
    assert asset["type"] == "image/png"
    assert asset["roles"] == ["thumbnail"]
    assert asset["title"] == "True colour (R 641 nm, G 551 nm, B 468 nm), 2–98 % stretch"
    assert "stored bands 44, 28, 11 of 206" in asset["description"]
    assert validate_stac(item, stac_registry([SHARED_SCHEMAS])) == []


def test_the_enmap_thumbnail_looks_like_the_scene(enmap_lake: Path) -> None:
    image = _png(enmap_lake / "thumbnail.png")
    ref, valid = reference_rendering(ENMAP, image.shape[:2])
    assert valid.all()
    assert_looks_like(image, ref, valid, max_mad=1.0)  # 0.24 measured: int16 rounding


def test_the_likeness_check_fails_for_swapped_channels(enmap_lake: Path) -> None:
    image = _png(enmap_lake / "thumbnail.png")
    ref, valid = reference_rendering(ENMAP, image.shape[:2])
    swapped = image[..., [2, 1, 0, 3]]
    with pytest.raises(AssertionError, match="correlat"):
        assert_looks_like(swapped, ref, valid, max_mad=255.0)
    # red and blue of a real scene correlate well (about 0.9 here), yet each channel resembles its own more
    _, _, cross = similarity(image, ref, valid)
    _, _, cross_swapped = similarity(swapped, ref, valid)
    assert cross[0, 0] > cross[0, 2] + 0.05
    assert cross_swapped[0, 0] < cross_swapped[0, 2]
    # an inverted or flipped image is not "like" the scene either
    with pytest.raises(AssertionError, match="correlation"):
        assert_looks_like(np.concatenate([255 - image[..., :3], image[..., 3:]], axis=-1), ref, valid, 255.0)
    with pytest.raises(AssertionError, match="correlation"):
        assert_looks_like(image[::-1], ref, valid, 255.0)


@pytest.mark.parametrize("products", [("cog",), ("zarr",)])
def test_a_smaller_max_side_is_binned_in_the_pass_whatever_the_products(tmp_path: Path, products: tuple[str, ...]) -> None:
    (result,) = ingest([ENMAP], tmp_path / "lake", IngestOptions(products=products, workers=2,
                                                                   thumbnail=ThumbnailSpec(max_side=16)))
    assert result.outcome is Outcome.INGESTED, result.message
    scene = tmp_path / "lake" / "scenes" / str(result.scene_id)
    image = _png(scene / "thumbnail.png")
    assert image.shape == (16, 16, 4)
    ref, valid = reference_rendering(ENMAP, (16, 16))
    # the sink averages 2x2 blocks like the reference, but before the stretch, not after: averaging
    # narrows the spread, so the 2-98 % range is narrower and the contrast a little higher (about 8 grey
    # levels on red here)
    assert_looks_like(image, ref, valid, max_mad=10.0)


def test_refs_in_place_render_from_the_pixel_pass(tmp_path: Path) -> None:
    """Only references to a tiled source: no COG or Zarr in the lake, the thumbnail is binned all the same.

    The source is the tile's first 60 bands (418-800 nm, none removed by the calibration, which references
    in place cannot do) rewritten with 64 px tiles."""
    tiled = tmp_path / "src" / "enmap_tiled.tif"
    tiled.parent.mkdir()
    with rasterio.open(ENMAP) as ds:
        profile = {**ds.profile, "count": 60, "tiled": True, "blockxsize": 64, "blockysize": 64, "interleave": "band"}
        with rasterio.open(tiled, "w", **profile) as dst:
            dst.write(ds.read(list(range(1, 61))))
            dst.update_tags(**ds.tags())
            for b in range(1, 61):
                dst.update_tags(b, **ds.tags(b))
                dst.set_band_description(b, ds.descriptions[b - 1])
    (result,) = ingest([tiled], tmp_path / "lake", IngestOptions(products=("refs",), workers=2))
    assert result.outcome is Outcome.INGESTED, result.message
    assert "in place" in result.message, result.message
    scene = tmp_path / "lake" / "scenes" / str(result.scene_id)
    assert not list(scene.glob("*.tif"))
    assert not list(scene.glob("*.zarr"))
    image = _png(scene / "thumbnail.png")
    ref, valid = reference_rendering(tiled, image.shape[:2])
    assert_looks_like(image, ref, valid, max_mad=1.0)  # 0.24 measured: int16 rounding


def test_a_band_found_empty_by_the_pass_is_replaced_by_a_candidate(tmp_path: Path) -> None:
    """The 635 nm band, nearest red, is all nodata: only the pass can tell, and the 645 nm band binned beside
    it is shown instead."""
    wl = [465.0, 475.0, 545.0, 555.0, 635.0, 645.0]
    data = hsi_cube(6, 40, 48)
    data[4] = -32768
    src = write_geotiff(tmp_path / "src.tif", data, nodata=-32768,
                        band_tags=[{"wavelength": str(w), "wavelength_units": "Nanometers"} for w in wl])
    (result,) = ingest([src], tmp_path / "lake", IngestOptions(products=("cog",), workers=2))
    assert result.outcome is Outcome.INGESTED, result.message
    scene = tmp_path / "lake" / "scenes" / str(result.scene_id)
    thumb = read_scene_record(scene / "scene.json").thumbnail
    assert thumb is not None
    assert (thumb.mode, thumb.bands, thumb.wavelengths_nm) == ("true_colour", [5, 2, 0], [645.0, 545.0, 465.0])
    image = _png(scene / "thumbnail.png")
    assert image.shape == (40, 48, 4)
    assert (image[..., 3] == 255).all()
    for c, band in enumerate(thumb.bands):  # each channel is its band, stretched (full size: no binning)
        assert np.array_equal(image[..., c], stretch(data[band].astype(np.float64), np.ones((40, 48), bool)))


def test_reingesting_an_unchanged_scene_leaves_the_thumbnail_alone(tmp_path: Path) -> None:
    (first,) = ingest([ENMAP], tmp_path / "lake", IngestOptions(products=("cog",), workers=2))
    png = tmp_path / "lake" / "scenes" / str(first.scene_id) / "thumbnail.png"
    before = png.stat().st_mtime_ns, png.read_bytes()
    (again,) = ingest([ENMAP], tmp_path / "lake", IngestOptions(products=("cog",), workers=2))
    assert again.outcome is Outcome.UNCHANGED, again.message
    assert (png.stat().st_mtime_ns, png.read_bytes()) == before


def test_turned_off_there_is_no_thumbnail_and_the_item_is_still_valid(tmp_path: Path) -> None:
    (result,) = ingest([ENMAP], tmp_path / "lake", IngestOptions(products=("cog",), workers=2, thumbnail=None))
    assert result.outcome is Outcome.INGESTED, result.message
    scene = tmp_path / "lake" / "scenes" / str(result.scene_id)
    assert not (scene / "thumbnail.png").exists()
    record: dict[str, Any] = json.loads((scene / "scene.json").read_text())
    assert "thumbnail" not in record  # as a record from before thumbnails
    item = json.loads((scene / "item.json").read_text())
    assert "thumbnail" not in item["assets"]
    assert validate_stac(item, stac_registry([SHARED_SCHEMAS])) == []


def test_a_copy_checks_the_thumbnail_against_its_recorded_hash(tmp_path: Path, enmap_lake: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(enmap_lake.parent.parent, src)
    report = copy_lake(src, tmp_path / "good")
    assert not report.failed, report.failed
    copied = tmp_path / "good" / "scenes" / enmap_lake.name / "thumbnail.png"
    assert copied.read_bytes() == (enmap_lake / "thumbnail.png").read_bytes()
    png = src / "scenes" / enmap_lake.name / "thumbnail.png"
    png.write_bytes(png.read_bytes()[:-1] + b"\x00")
    report = copy_lake(src, tmp_path / "bad")
    assert "thumbnail differs from its recorded BLAKE3" in report.failed[enmap_lake.name]
    assert not (tmp_path / "bad" / "scenes" / enmap_lake.name).exists()  # nothing of the damaged scene published
