"""One generated fixture per validation error and warning, checked two ways.

Each damaged or odd input goes through ``validate_scene`` (the report: ``ok`` and the codes)
and through ``ingest`` into a fresh lake: an error rejects the scene (nothing published, a
report in ``rejected/``, nothing left in ``.staging/``); a warning is recorded and the scene
is still ingested with the right values. Messages must say where the problem is and, where
cubelake has a fix to suggest, how to fix it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
import tifffile
import zarr
from rasterio.transform import Affine, from_origin

from cubelake.ingest import (
    Code,
    IngestOptions,
    Issue,
    Limits,
    Outcome,
    ValidationReport,
    ingest,
    validate_scene,
)
from tests.conftest import hsi_cube, write_geotiff

CHUNK = 32
OPTIONS = IngestOptions(chunk=CHUNK, workers=2)
H, W = 70, 90
_ORIGIN = (500000.0, 5800000.0)
#: Bombs are validated with the default 256-pixel chunk: should a regression start a pixel pass,
#: the unit list stays small enough that ``no_pixel_pass`` fails the test at once instead of hanging.
BOMB_OPTIONS = IngestOptions(workers=2)


# -- helpers ---------------------------------------------------------------------------------


def codes(issues: list[Issue]) -> list[Code]:
    return [i.code for i in issues]


def only(issues: list[Issue], code: Code) -> Issue:
    found = [i for i in issues if i.code == code]
    assert len(found) == 1, f"expected one {code}, got {found}"
    return found[0]


def located(issue: Issue, *needles: str) -> bool:
    """The issue names one of ``needles`` in its message or its location."""
    text = f"{issue.message} {issue.where or ''}"
    return any(n in text for n in needles)


def validate(path: Path, options: IngestOptions = OPTIONS, progress: Any = None) -> ValidationReport:
    report = validate_scene(path, options, progress)
    assert report.path == str(path)
    assert str(path) in report.summary().splitlines()[0]  # the readable report names the file
    for issue in report.issues:
        assert f"{issue.code.value}: {issue.message}" in report.summary()
    return report


def no_pixel_pass(event: Any) -> None:
    """Progress callback that fails the test as soon as pixels are scanned (instead of hanging on a bomb)."""
    if event.stage not in ("open", "done"):
        raise AssertionError(f"{event.path}: pixel pass started ({event.stage} {event.done}/{event.total})")


def ingest_rejected(src: Path, lake: Path, options: IngestOptions = OPTIONS,
                    progress: Any = None) -> tuple[Any, dict[str, Any]]:
    """Ingest ``src`` alone; it must be rejected cleanly. Returns the result and the rejection record."""
    results = ingest([src], lake, options, progress)
    assert len(results) == 1
    r = results[0]
    assert r.outcome is Outcome.REJECTED, r.message
    assert not r.report.ok
    assert r.products == {}
    assert list((lake / "scenes").iterdir()) == [], "a rejected scene must publish nothing"
    assert list((lake / ".staging").iterdir()) == [], "a rejected scene must leave no staging folder"
    rejected = sorted((lake / "rejected").iterdir())
    assert [p.suffix for p in rejected] == [".json"]
    record = json.loads(rejected[0].read_text())
    assert record["report"]["ok"] is False
    assert [e["code"] for e in record["report"]["errors"]] == [str(c) for c in codes(r.report.errors)]
    want_path = str(src.resolve()) if src.exists() else str(src)
    assert record["source"]["path"] == want_path
    assert str(rejected[0]) in r.message  # the result says where the report is
    n = len(r.report.errors)
    assert f"{n} error{'s' if n != 1 else ''}" in r.message  # the errors themselves are in the report, listed once
    for issue in r.report.errors:
        assert issue.message not in r.message
    return r, record


def ingest_ok(src: Path, lake: Path, options: IngestOptions = OPTIONS) -> tuple[Any, Path]:
    (r,) = ingest([src], lake, options)
    assert r.outcome is Outcome.INGESTED, r.message
    assert list((lake / ".staging").iterdir()) == []
    scene = lake / "scenes" / r.scene_id
    assert (scene / "scene.json").is_file()
    return r, scene


def read_cog(scene: Path) -> tuple[np.ndarray, Any]:
    with rasterio.open(scene / f"{scene.name}.tif") as ds:
        return ds.read(), ds.transform


def read_zarr(scene: Path) -> np.ndarray:
    return zarr.open_group(str(scene / f"{scene.name}.zarr"), mode="r")["data"][:]


ENVI_CODES = {"uint8": 1, "int16": 2, "int32": 3, "float32": 4, "float64": 5, "uint16": 12}


def write_envi(folder: Path, name: str, cube: np.ndarray, *, data: bool = True, data_bytes: int | None = None,
               declare: tuple[int, int, int] | None = None, **fields: Any) -> Path:
    """An ENVI BSQ scene: ``name.hdr`` plus ``name.img`` (numpy ``tofile``, little-endian).

    ``fields`` become header lines (lists as ``{a, b}``; ``wavelength_units`` -> ``wavelength units``);
    ``declare=(bands, lines, samples)`` overrides the declared size; ``data_bytes`` cuts the data file.
    """
    nb, ny, nx = declare or cube.shape
    lines = [
        "ENVI",
        "description = {cubelake test fixture}",
        f"samples = {nx}",
        f"lines = {ny}",
        f"bands = {nb}",
        "header offset = 0",
        "file type = ENVI Standard",
        f"data type = {ENVI_CODES[cube.dtype.name]}",
        "interleave = bsq",
        "byte order = 0",
    ]
    for key, value in fields.items():
        if isinstance(value, list | tuple):
            value = "{" + ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) + "}"
        lines.append(f"{key.replace('_', ' ')} = {value}")
    header = folder / f"{name}.hdr"
    header.write_text("\n".join(lines) + "\n")
    if data:
        img = folder / f"{name}.img"
        cube.astype(cube.dtype.newbyteorder("<")).tofile(img)
        if data_bytes is not None:
            img.write_bytes(img.read_bytes()[:data_bytes])
    return header


# -- damaged files ---------------------------------------------------------------------------


def test_truncated_tiff_is_rejected_with_the_blocks_past_the_end(tmp_path: Path) -> None:
    data = hsi_cube(5, H, W, "int16")
    src = write_geotiff(tmp_path / "cut.tif", data, tiled=True, blockxsize=16, blockysize=16, compress="DEFLATE")
    with tifffile.TiffFile(src) as tif:
        page = tif.pages.first
        offsets = np.asarray(page.dataoffsets, dtype=np.int64)
        counts = np.asarray(page.databytecounts, dtype=np.int64)
        n_cols = -(-W // page.tilewidth)
    full = src.read_bytes()
    keep = int(len(full) * 0.6)
    src.write_bytes(full[:keep])
    beyond = np.flatnonzero(offsets + counts > keep)
    assert 0 < len(beyond) < len(offsets)  # the cut really lands inside the tile data

    report = validate(src)
    assert not report.ok
    assert Code.TRUNCATED in codes(report.errors)
    trunc = only(report.errors, Code.TRUNCATED)
    assert f"{len(beyond)} of {len(offsets)} blocks" in trunc.message
    assert str(keep) in trunc.message  # the actual file size
    assert located(trunc, f"#{beyond[0]}")  # the first block past the end
    assert "re-copy" in trunc.message.lower()
    # every block that cannot be read is named, and only those
    decode = [i for i in report.errors if i.code == Code.BLOCK_DECODE]
    named = set()
    for issue in decode:
        assert issue.where is not None
        assert issue.where.startswith("block ")
        r, c = map(int, issue.where.removeprefix("block ").split(","))
        named.add(r * n_cols + c)
        assert f"rows {r * 16}-" in issue.message
    assert named == set(beyond.tolist())

    r, record = ingest_rejected(src, tmp_path / "lake")
    assert Code.TRUNCATED in codes(r.report.errors)
    assert "truncated" in [e["code"] for e in record["report"]["errors"]]


@pytest.mark.parametrize(
    ("compress", "interleave", "dtype", "bands"),
    [("DEFLATE", "pixel", "int16", 5), ("DEFLATE", "band", "int16", 5), ("LZW", "band", "float32", 5),
     ("JPEG", "pixel", "uint8", 3)],
    ids=["deflate-pixel", "deflate-band", "lzw-band", "jpeg-pixel"],
)
def test_garbage_tile_is_rejected_naming_that_block(tmp_path: Path, compress: str, interleave: str, dtype: str,
                                                   bands: int) -> None:
    data = hsi_cube(bands, H, W, dtype, seed=3)
    src = write_geotiff(tmp_path / "garbage.tif", data, tiled=True, blockxsize=16, blockysize=16,
                        compress=compress, interleave=interleave)
    n_rows, n_cols = -(-H // 16), -(-W // 16)
    row, col = 2, 3  # a tile inside the scene, in chunk (1, 1) of the 32-pixel ingest grid
    tile = row * n_cols + col
    plane = 2 if interleave == "band" else 0  # the third band's plane when band-interleaved
    with tifffile.TiffFile(src) as tif:
        page = tif.pages.first
        assert len(page.dataoffsets) == n_rows * n_cols * (bands if interleave == "band" else 1)
        k = plane * n_rows * n_cols + tile
        off, cnt = int(page.dataoffsets[k]), int(page.databytecounts[k])
    raw = bytearray(src.read_bytes())
    garbage = np.random.default_rng(42).integers(0, 256, cnt, dtype=np.uint8)
    garbage[0] = 0xFF  # not a zlib header nor a JPEG SOI (FF D8) whatever the seed gives
    garbage[1] = 0x00
    raw[off : off + cnt] = garbage.tobytes()
    src.write_bytes(bytes(raw))

    report = validate(src)
    assert not report.ok
    assert codes(report.errors) == [Code.BLOCK_DECODE]
    issue = report.errors[0]
    assert issue.where is not None
    assert issue.where.replace(" ", "").endswith(f"{row},{col}")
    assert f"row {row}, col {col}" in issue.message
    assert f"rows {row * 16}-{row * 16 + 15}" in issue.message
    assert f"cols {col * 16}-{col * 16 + 15}" in issue.message
    assert "re-copy" in issue.message.lower() or "re-export" in issue.message.lower()
    assert report.blocks_checked > 0

    r, _ = ingest_rejected(src, tmp_path / "lake")
    assert codes(r.report.errors) == [Code.BLOCK_DECODE]
    assert r.report.errors[0].where == issue.where


# -- spectral metadata errors ----------------------------------------------------------------


def test_band_tags_with_wavelengths_on_some_bands_only(tmp_path: Path) -> None:
    data = hsi_cube(5, H, W, "int16")
    tags = [{"wavelength": str(500 + 10 * i), "wavelength_units": "nm"} for i in range(3)] + [{}, {}]
    src = write_geotiff(tmp_path / "partial_wl.tif", data, band_tags=tags)
    missing = tuple(i + 1 for i, t in enumerate(tags) if "wavelength" not in t)

    report = validate(src)
    assert not report.ok
    issue = only(report.errors, Code.WAVELENGTH_COUNT)
    assert issue.bands == missing
    assert located(issue, str(src))
    assert "one per band" in issue.message

    r, _ = ingest_rejected(src, tmp_path / "lake")
    assert Code.WAVELENGTH_COUNT in codes(r.report.errors)


def test_envi_header_with_wrong_wavelength_count(tmp_path: Path) -> None:
    cube = hsi_cube(5, H, W, "int16")
    wl = [450.0, 500.0, 550.0, 600.0]  # four wavelengths for five bands
    hdr = write_envi(tmp_path, "short_wl", cube, wavelength=wl, wavelength_units="Nanometers")

    report = validate(hdr)
    assert not report.ok
    issue = only(report.errors, Code.WAVELENGTH_COUNT)
    assert f"{len(wl)} wavelengths for {cube.shape[0]} bands" in issue.message
    assert located(issue, str(hdr))
    assert "one per band" in issue.message

    r, _ = ingest_rejected(hdr, tmp_path / "lake")
    assert Code.WAVELENGTH_COUNT in codes(r.report.errors)


def test_envi_non_monotonic_wavelengths(tmp_path: Path) -> None:
    cube = hsi_cube(6, H, W, "int16")
    wl = [500.0, 510.0, 505.0, 520.0, 530.0, 525.0]
    steps = tuple(i + 1 for i in range(1, len(wl)) if not wl[i] > wl[i - 1])
    hdr = write_envi(tmp_path, "unordered", cube, wavelength=wl, wavelength_units="Nanometers")

    report = validate(hdr)
    assert not report.ok
    issue = only(report.errors, Code.WAVELENGTH_ORDER)
    assert issue.bands == steps
    assert located(issue, str(hdr))
    for b in steps:  # names each offending pair
        assert f"band {b - 1} ({wl[b - 2]:g} nm) -> band {b} ({wl[b - 1]:g} nm)" in issue.message
    assert "fix the header" in issue.message or "overlap" in issue.message
    assert Code.WAVELENGTH_NONPOSITIVE not in codes(report.errors)

    r, _ = ingest_rejected(hdr, tmp_path / "lake")
    assert codes(r.report.errors) == [Code.WAVELENGTH_ORDER]


@pytest.mark.parametrize("first", [0.0, -420.0])
def test_envi_non_positive_wavelength(tmp_path: Path, first: float) -> None:
    cube = hsi_cube(5, H, W, "float32")
    wl = [first, 500.0, 600.0, 700.0, 800.0]
    hdr = write_envi(tmp_path, "nonpos", cube, wavelength=wl, wavelength_units="Nanometers")

    report = validate(hdr)
    assert not report.ok
    issue = only(report.errors, Code.WAVELENGTH_NONPOSITIVE)
    assert issue.bands == (1,)
    assert located(issue, str(hdr))
    assert Code.WAVELENGTH_ORDER not in codes(report.errors)

    r, _ = ingest_rejected(hdr, tmp_path / "lake")
    assert Code.WAVELENGTH_NONPOSITIVE in codes(r.report.errors)


# -- decompression bombs and size limits -----------------------------------------------------


def test_bomb_sized_geotiff_is_rejected_without_reading_pixels(tmp_path: Path) -> None:
    src = tmp_path / "bomb.tif"
    side = 200_000
    with rasterio.open(src, "w", driver="GTiff", width=side, height=side, count=1, dtype="float32",
                       crs="EPSG:32633", transform=from_origin(500000.0, 5800000.0, 30.0, 30.0),
                       tiled=True, blockxsize=1024, blockysize=1024, compress="DEFLATE", SPARSE_OK="TRUE",
                       BIGTIFF="YES"):
        pass  # nothing is written: every tile is absent
    declared = side * side * np.dtype("float32").itemsize
    assert src.stat().st_size * 1000 < declared  # a tiny file declaring a huge raster
    assert declared > Limits().max_bytes

    report = validate(src, BOMB_OPTIONS, progress=no_pixel_pass)
    assert not report.ok
    assert report.shape == (1, side, side)
    issue = only(report.errors, Code.TOO_LARGE)
    assert f"{side}x{side}" in issue.message  # the declared size
    assert "--max-bytes" in issue.message
    assert report.blocks_checked == 0  # rejected from the header alone

    r, _ = ingest_rejected(src, tmp_path / "lake", BOMB_OPTIONS, progress=no_pixel_pass)
    assert Code.TOO_LARGE in codes(r.report.errors)
    assert r.report.blocks_checked == 0


def test_bomb_sized_envi_header_on_a_tiny_data_file(tmp_path: Path) -> None:
    tiny = np.zeros((1, 2, 2), dtype=np.int16)
    declare = (500, 400_000, 400_000)  # within the per-dimension limit, 160 TB decoded
    hdr = write_envi(tmp_path, "envibomb", tiny, declare=declare)
    assert (tmp_path / "envibomb.img").stat().st_size == tiny.nbytes

    report = validate(hdr, BOMB_OPTIONS, progress=no_pixel_pass)
    assert not report.ok
    assert report.shape == declare
    assert Code.TOO_LARGE in codes(report.errors)
    assert report.blocks_checked == 0

    r, _ = ingest_rejected(hdr, tmp_path / "lake", BOMB_OPTIONS, progress=no_pixel_pass)
    assert Code.TOO_LARGE in codes(r.report.errors)
    assert r.report.blocks_checked == 0


@pytest.mark.parametrize(
    ("limit", "value_at_limit"),
    [("max_bytes", lambda nb, h, w, item: nb * h * w * item), ("max_bands", lambda nb, h, w, item: nb),
     ("max_dimension", lambda nb, h, w, item: max(h, w))],
)
def test_limits_passed_through_ingest_options_control_rejection(tmp_path: Path, limit: str, value_at_limit: Any) -> None:
    data = hsi_cube(5, H, W, "int16")
    src = write_geotiff(tmp_path / "sized.tif", data)
    exact = int(value_at_limit(*data.shape, data.dtype.itemsize))
    tight = IngestOptions(chunk=CHUNK, workers=2, limits=Limits(**{limit: exact - 1}))
    enough = IngestOptions(chunk=CHUNK, workers=2, limits=Limits(**{limit: exact}))

    report = validate(src, tight, progress=no_pixel_pass)
    assert codes(report.errors) == [Code.TOO_LARGE]
    assert report.blocks_checked == 0
    assert validate(src, enough).ok

    r, _ = ingest_rejected(src, tmp_path / "lake_tight", tight)
    assert codes(r.report.errors) == [Code.TOO_LARGE]
    r, scene = ingest_ok(src, tmp_path / "lake_enough", enough)
    np.testing.assert_array_equal(read_cog(scene)[0], data)


# -- band-level findings of the pixel pass ---------------------------------------------------


def test_nan_band_and_nonfinite_values_are_warnings_and_stored_as_nan(tmp_path: Path) -> None:
    data = hsi_cube(6, H, W, "float32")
    data[1] = np.nan  # band 2: all NaN
    data[3, 5:9, 40] = np.nan  # band 4: NaN and ±inf sprinkled, across chunk edges
    data[3, 31:34, 31:34] = np.inf
    data[3, H - 1, W - 1] = -np.inf
    src = write_geotiff(tmp_path / "nans.tif", data, tiled=True, blockxsize=16, blockysize=16, compress="ZSTD",
                        predictor=3)
    all_nan = tuple(b + 1 for b in range(6) if np.isnan(data[b]).all())
    nonfinite = tuple(b + 1 for b in range(6) if not np.isfinite(data[b]).all())
    assert all_nan == (2,)
    assert nonfinite == (2, 4)

    report = validate(src)
    assert report.ok, report.summary()
    assert only(report.warnings, Code.ALL_NODATA_BAND).bands == all_nan
    nf = only(report.warnings, Code.NONFINITE_VALUES)
    assert nf.bands == nonfinite
    n_nan, n_inf = int(np.isnan(data).sum()), int(np.isinf(data).sum())
    assert f"{n_nan} NaN and {n_inf} infinite" in nf.message
    assert report.blocks_checked > 0

    r, scene = ingest_ok(src, tmp_path / "lake")
    assert {Code.ALL_NODATA_BAND, Code.NONFINITE_VALUES} <= set(codes(r.report.warnings))
    want = np.where(np.isfinite(data), data, np.nan).astype(np.float32)
    for got in (read_cog(scene)[0], read_zarr(scene)):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
        assert np.isnan(got[1]).all()
        assert np.isnan(got[3][~np.isfinite(data[3])]).all()
    record = json.loads((scene / "scene.json").read_text())
    assert {w["code"] for w in record["validation"]["warnings"]} >= {"all_nodata_band", "nonfinite_values"}


def test_constant_band_is_a_warning(tmp_path: Path) -> None:
    data = hsi_cube(5, H, W, "int16")
    data[2] = 1234
    src = write_geotiff(tmp_path / "const.tif", data, nodata=-9999)
    const = tuple(b + 1 for b in range(5) if data[b].min() == data[b].max())

    report = validate(src)
    assert report.ok
    issue = only(report.warnings, Code.CONSTANT_BAND)
    assert issue.bands == const
    assert "1234" in issue.message

    r, scene = ingest_ok(src, tmp_path / "lake")
    assert Code.CONSTANT_BAND in codes(r.report.warnings)
    np.testing.assert_array_equal(read_cog(scene)[0], data)
    np.testing.assert_array_equal(read_zarr(scene), data)


@pytest.mark.parametrize("kind", ["int16-nodata", "float32-all-nan", "sparse-no-blocks"])
def test_entirely_nodata_scene_is_rejected(tmp_path: Path, kind: str) -> None:
    src = tmp_path / "empty.tif"
    if kind == "int16-nodata":
        data = np.full((4, H, W), -9999, dtype=np.int16)
        write_geotiff(src, data, nodata=-9999, tiled=True, blockxsize=32, blockysize=32, compress="DEFLATE")
    elif kind == "float32-all-nan":
        data = np.full((4, H, W), np.nan, dtype=np.float32)
        write_geotiff(src, data)
    else:  # a sparse GeoTIFF in which no block was ever written
        with rasterio.open(src, "w", driver="GTiff", width=W, height=H, count=4, dtype="int16", crs="EPSG:32633",
                           transform=from_origin(*_ORIGIN, 30.0, 30.0), tiled=True, blockxsize=16, blockysize=16,
                           compress="DEFLATE", SPARSE_OK="TRUE"):
            pass
        with tifffile.TiffFile(src) as tif:
            assert not any(tif.pages.first.databytecounts)

    report = validate(src)
    assert not report.ok
    issue = only(report.errors, Code.NO_VALID_DATA)
    if kind == "sparse-no-blocks":
        assert report.blocks_checked == 0  # known from the block table alone
    else:
        assert "profile" in issue.message  # how to fix a wrong nodata value
        assert report.blocks_checked > 0  # found by the pixel pass

    r, _ = ingest_rejected(src, tmp_path / "lake")
    assert codes(r.report.errors) == [Code.NO_VALID_DATA]


# -- georeferencing warnings -----------------------------------------------------------------

GEOREF_CASES = {
    "no_crs": ({"crs": None}, Code.NO_CRS),
    "no_transform": ({"transform": Affine.identity()}, Code.NO_TRANSFORM),
    "rotated": ({"transform": Affine(30.0, 8.0, _ORIGIN[0], 8.0, -30.0, _ORIGIN[1])}, Code.ROTATED_TRANSFORM),
    "y_up": ({"transform": Affine(30.0, 0.0, _ORIGIN[0], 0.0, 30.0, _ORIGIN[1])}, Code.Y_UP_TRANSFORM),
}


@pytest.mark.parametrize("case", list(GEOREF_CASES))
def test_georeferencing_warnings_still_ingest(tmp_path: Path, case: str) -> None:
    profile, code = GEOREF_CASES[case]
    data = hsi_cube(5, H, W, "uint16")
    src = write_geotiff(tmp_path / f"{case}.tif", data, **profile)
    with rasterio.open(src) as ds:
        src_transform = ds.transform

    report = validate(src)
    assert report.ok, report.summary()
    assert code in codes(report.warnings)
    transform_codes = {Code.NO_TRANSFORM, Code.ROTATED_TRANSFORM, Code.Y_UP_TRANSFORM}
    assert set(codes(report.warnings)) & transform_codes == ({code} & transform_codes)
    if code == Code.ROTATED_TRANSFORM:
        assert "gdalwarp" in only(report.warnings, code).message

    r, scene = ingest_ok(src, tmp_path / "lake")
    assert code in codes(r.report.warnings)
    got, transform = read_cog(scene)
    np.testing.assert_array_equal(got, data)
    np.testing.assert_array_equal(read_zarr(scene), data)
    assert transform == src_transform  # rotated and y-up grids are kept as they are
    record = json.loads((scene / "scene.json").read_text())
    assert code.value in {w["code"] for w in record["validation"]["warnings"]}


# -- unreadable or unsupported inputs --------------------------------------------------------


def test_complex_dtype_is_unsupported(tmp_path: Path) -> None:
    data = (hsi_cube(3, 20, 30, "float32") + 1j * hsi_cube(3, 20, 30, "float32", seed=1)).astype(np.complex64)
    src = write_geotiff(tmp_path / "complex.tif", data)
    with rasterio.open(src) as ds:
        assert ds.dtypes[0] == "complex64"

    report = validate(src)
    assert not report.ok
    issue = only(report.errors, Code.UNSUPPORTED_DTYPE)
    assert "complex64" in issue.message
    assert "gdal_translate" in issue.message
    assert report.blocks_checked == 0

    r, _ = ingest_rejected(src, tmp_path / "lake")
    assert codes(r.report.errors) == [Code.UNSUPPORTED_DTYPE]


def test_envi_header_without_data_file(tmp_path: Path) -> None:
    hdr = write_envi(tmp_path, "lonely", hsi_cube(5, H, W, "int16"), data=False)
    assert not any(p.name != "lonely.hdr" for p in tmp_path.iterdir())

    report = validate(hdr)
    assert not report.ok
    issue = only(report.errors, Code.DATA_FILE_MISSING)
    assert located(issue, str(hdr))
    assert "next to the header" in issue.message
    assert report.blocks_checked == 0

    r, _ = ingest_rejected(hdr, tmp_path / "lake")
    assert Code.DATA_FILE_MISSING in codes(r.report.errors)


def test_envi_data_file_shorter_than_header_says(tmp_path: Path) -> None:
    cube = hsi_cube(5, H, W, "int16")
    keep = cube.nbytes // 3
    hdr = write_envi(tmp_path, "short", cube, data_bytes=keep)
    img = tmp_path / "short.img"

    report = validate(hdr)
    assert not report.ok
    issue = only(report.errors, Code.TRUNCATED)
    assert located(issue, str(img))
    assert str(cube.nbytes - keep) in issue.message  # how many bytes are missing
    assert str(keep) in issue.message

    r, _ = ingest_rejected(hdr, tmp_path / "lake")
    assert Code.TRUNCATED in codes(r.report.errors)


def test_text_file_named_tif_is_a_content_mismatch(tmp_path: Path) -> None:
    src = tmp_path / "notes.tif"
    src.write_text("these are field notes, not a raster\n" * 20)

    report = validate(src)
    assert not report.ok
    issue = only(report.errors, Code.CONTENT_MISMATCH)
    assert located(issue, str(src))
    assert "rename" in issue.message or "re-export" in issue.message

    r, _ = ingest_rejected(src, tmp_path / "lake")
    assert codes(r.report.errors) == [Code.CONTENT_MISMATCH]


def test_missing_path_is_not_found(tmp_path: Path) -> None:
    src = tmp_path / "nowhere" / "scene.tif"

    report = validate(src)
    assert not report.ok
    issue = only(report.errors, Code.NOT_FOUND)
    assert located(issue, str(src))
    assert "check the path" in issue.message

    r, _ = ingest_rejected(src, tmp_path / "lake")
    assert codes(r.report.errors) == [Code.NOT_FOUND]


# -- spectral warnings -----------------------------------------------------------------------


def test_envi_fwhm_in_micrometres_is_implausible(tmp_path: Path) -> None:
    cube = hsi_cube(6, H, W, "int16")
    wl = [500.0 + 10.0 * i for i in range(6)]
    fwhm_um = [0.011] * 6  # micrometres, while the header says nanometres
    hdr = write_envi(tmp_path, "fwhm", cube, wavelength=wl, fwhm=fwhm_um, wavelength_units="Nanometers")

    report = validate(hdr)
    assert report.ok, report.summary()
    issue = only(report.warnings, Code.FWHM_IMPLAUSIBLE)
    assert issue.bands == tuple(range(1, 7))
    assert "units" in issue.message
    assert located(issue, str(hdr))

    r, scene = ingest_ok(hdr, tmp_path / "lake")
    assert Code.FWHM_IMPLAUSIBLE in codes(r.report.warnings)
    np.testing.assert_array_equal(read_cog(scene)[0], cube)
    np.testing.assert_array_equal(read_zarr(scene), cube)


def test_envi_bbl_flagged_bands_are_removed(tmp_path: Path) -> None:
    cube = hsi_cube(6, H, W, "int16")
    wl = [500.0 + 10.0 * i for i in range(6)]
    bbl = [1, 0, 1, 1, 0, 1]
    hdr = write_envi(tmp_path, "bbl", cube, wavelength=wl, fwhm=[10.0] * 6, wavelength_units="Nanometers", bbl=bbl)
    flagged = tuple(i + 1 for i, f in enumerate(bbl) if f == 0)
    kept = [i + 1 for i, f in enumerate(bbl) if f == 1]

    report = validate(hdr)
    assert report.ok, report.summary()
    assert only(report.warnings, Code.BANDS_FLAGGED_BAD).bands == flagged

    r, scene = ingest_ok(hdr, tmp_path / "lake")
    assert Code.BANDS_FLAGGED_BAD in codes(r.report.warnings)
    record = json.loads((scene / "scene.json").read_text())
    assert [b["source_band"] for b in record["bands"]] == kept
    assert [b["wavelength_nm"] for b in record["bands"]] == [wl[k - 1] for k in kept]
    want = cube[[k - 1 for k in kept]]
    np.testing.assert_array_equal(read_cog(scene)[0], want)
    np.testing.assert_array_equal(read_zarr(scene), want)
    group = zarr.open_group(str(scene / f"{scene.name}.zarr"), mode="r")
    np.testing.assert_array_equal(group["band"][:], kept)


# -- several inputs, one bad ----------------------------------------------------------------


def test_one_bad_input_among_good_ones(tmp_path: Path) -> None:
    a = hsi_cube(5, H, W, "int16", seed=1)
    b = hsi_cube(5, H, W, "float32", seed=2)
    good_a = write_geotiff(tmp_path / "a_good.tif", a)
    bad = tmp_path / "b_bad.tif"
    bad.write_text("not a tiff")
    good_b = write_geotiff(tmp_path / "c_good.tif", b, tiled=True, blockxsize=16, blockysize=16)
    hdr = write_envi(tmp_path, "d_bad", a, data=False)
    inputs = [good_b, bad, good_a, hdr]  # not in name order: results follow the inputs
    lake = tmp_path / "lake"

    results = ingest(inputs, lake, OPTIONS)
    assert [Path(r.path) for r in results] == inputs
    assert [r.outcome for r in results] == [Outcome.INGESTED, Outcome.REJECTED, Outcome.INGESTED, Outcome.REJECTED]
    assert codes(results[1].report.errors) == [Code.CONTENT_MISMATCH]
    assert Code.DATA_FILE_MISSING in codes(results[3].report.errors)
    published = sorted(p.name for p in (lake / "scenes").iterdir())
    assert published == sorted([results[0].scene_id, results[2].scene_id])
    rejected = sorted(p.stem for p in (lake / "rejected").iterdir())
    assert rejected == sorted([results[1].scene_id, results[3].scene_id])
    assert list((lake / ".staging").iterdir()) == []
    np.testing.assert_array_equal(read_cog(lake / "scenes" / results[2].scene_id)[0], a)
    got_b = read_zarr(lake / "scenes" / results[0].scene_id)
    assert got_b.dtype == np.float32
    np.testing.assert_array_equal(got_b, b)
    assert not math.isnan(float(got_b.sum()))


def test_many_garbage_tiles_are_listed_up_to_twenty_and_counted(tmp_path: Path) -> None:
    """A file whose tiles are nearly all damaged: each failing block is named once, the first 20 by position,
    then one line saying how many more fail (not hundreds of lines)."""
    data = hsi_cube(5, H, W, "int16", seed=5)
    src = write_geotiff(tmp_path / "garbage.tif", data, tiled=True, blockxsize=16, blockysize=16, compress="DEFLATE")
    with tifffile.TiffFile(src) as tif:
        page = tif.pages.first
        spans = list(zip(page.dataoffsets, page.databytecounts, strict=True))
    raw = bytearray(src.read_bytes())
    bad = spans[1:]  # every tile but the first
    for off, cnt in bad:
        raw[off:off + cnt] = b"\xff\x00" * (cnt // 2) + b"\xff" * (cnt % 2)
    src.write_bytes(bytes(raw))
    assert len(bad) > 20

    report = validate(src)
    decode = [i for i in report.errors if i.code == Code.BLOCK_DECODE]
    named = [i for i in decode if (i.where or "").startswith("block ")]
    assert len(named) == 20
    assert len({i.where for i in named}) == 20
    assert [i.where for i in named] == sorted(str(i.where) for i in named)
    more = [i for i in decode if i not in named]
    assert len(more) == 1
    assert f"... and {len(bad) - 20} more blocks fail to decode" in more[0].message
    assert more[0].where == str(src)  # the file is named


@pytest.mark.parametrize(("rows", "cols", "bands", "too_large"), [
    (100, 1, 1, False), (101, 1, 1, True),  # a tall, thin bomb: only the rows are over
    (1, 100, 1, False), (1, 101, 1, True),
    (101, 101, 1, True), (1, 1, 10, False), (1, 1, 11, True),
])
def test_each_declared_dimension_is_held_to_its_limit_on_its_own(rows: int, cols: int, bands: int,
                                                                 too_large: bool) -> None:
    from cubelake.ingest.sources import SceneMetadata
    from cubelake.ingest.validate import check_dimensions

    meta = SceneMetadata(path="x.tif", files=("x.tif",), format="GTiff", count=bands, height=rows, width=cols,
                         dtype="uint8")
    issues = check_dimensions(meta, Limits(max_dimension=100, max_bands=10))
    assert [i.code for i in issues] == ([Code.TOO_LARGE] if too_large else [])
    if too_large and bands == 1:
        assert f"declared size {rows} rows x {cols} columns exceeds the 100-pixel limit" in issues[0].message


def test_the_default_limits_are_the_ones_the_readme_states() -> None:
    from tests.conftest import ROOT

    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "size over the limits (64 GiB, 10⁶ rows/columns, 10⁴ bands by default" in readme
    assert (Limits().max_bytes, Limits().max_dimension, Limits().max_bands) == (64 * 1024**3, 10**6, 10**4)


@pytest.mark.parametrize(("bands", "rows", "cols"), [(0, 5, 5), (5, 0, 5), (5, 5, 0), (-1, 5, 5), (5, -1, 5),
                                                     (5, 5, -1)])
def test_a_dimension_of_zero_or_less_is_named(bands: int, rows: int, cols: int) -> None:
    from cubelake.ingest.sources import SceneMetadata
    from cubelake.ingest.validate import check_dimensions

    meta = SceneMetadata(path="x.tif", files=("x.tif",), format="GTiff", count=bands, height=rows, width=cols,
                         dtype="uint8")
    (issue,) = check_dimensions(meta, Limits())
    assert issue.code is Code.BAD_DIMENSIONS
    assert f"declared size is {bands} bands x {rows} rows x {cols} columns; every dimension must be > 0" in issue.message


@pytest.mark.parametrize(("dtype", "itemsize"), [("int16", 2), ("float64", 8), ("not-a-dtype", 8)])
def test_the_byte_limit_counts_each_sample_at_its_size_and_an_unknown_type_at_8(tmp_path: Path, dtype: str,
                                                                               itemsize: int) -> None:
    from cubelake.ingest.sources import SceneMetadata
    from cubelake.ingest.validate import check_dimensions

    on_disk = tmp_path / "x.tif"
    on_disk.write_bytes(b"\0" * (3 * 1024**2 // 2))  # 1.5 MiB
    meta = SceneMetadata(path=str(on_disk), files=(str(on_disk),), format="GTiff", count=3, height=1024,
                         width=1024 * 1024, dtype=dtype)  # 3 Gi samples
    decoded = 3 * 1024 * 1024 * 1024 * itemsize
    assert check_dimensions(meta, Limits(max_bytes=decoded, max_dimension=2**40)) == []
    (issue,) = check_dimensions(meta, Limits(max_bytes=decoded - 1, max_dimension=2**40))
    assert issue.code is Code.TOO_LARGE
    assert issue.message == (
        f"declared size 3x1024x1048576 {dtype} decodes to {3 * itemsize:.1f} GiB, over the {3 * itemsize:.1f} GiB "
        "limit (the file is 1.5 MiB on disk). If the scene is genuine, raise --max-bytes")
    (issue,) = check_dimensions(meta, Limits(max_bytes=decoded // 3 + decoded // 6, max_dimension=2**40))
    assert f"decodes to {3 * itemsize:.1f} GiB, over the {1.5 * itemsize:.1f} GiB limit" in issue.message
