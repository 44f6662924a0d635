"""Generated GeoTIFF fixtures, layout x codec x dtype, each ingested through the real pipeline.

Every case is written with rasterio, ingested into a fresh lake with a small chunk (so edge
tiles are exercised: 70x90 is no multiple of 32 or 16), and the products are compared value
for value with what the stored cube must be. That expectation is derived here from rasterio's
own read of the source, independently of cubelake's code: with the generic profile and no
wavelengths, an integer source is stored unchanged in its own dtype (its nodata value is the
fill value), a float source is stored as float32 with NaN where the source is nodata or
non-finite.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
import rioxarray  # noqa: F401  (registers the .rio accessor)
import tifffile
import xarray as xr
import zarr
from rasterio.enums import Interleaving
from rasterio.errors import NotGeoreferencedWarning
from rio_cogeo.cogeo import cog_validate

from cubelake.ingest import IngestOptions, Outcome, ingest
from tests.conftest import hsi_cube, write_geotiff

CHUNK = 32
OPTIONS = IngestOptions(chunk=CHUNK, workers=2)
HEIGHT, WIDTH = 70, 90


@dataclass(frozen=True)
class Case:
    """One generated source: dtype, band count and GTiff creation options."""

    id: str
    dtype: str
    bands: int
    layout: str  # "strip" or "tile<N>"
    interleave: str  # "pixel" or "band"
    compress: str | None = None
    predictor: int | None = None
    bigtiff: bool = False
    big_endian: bool = False
    nodata: float | None = None
    nonfinite: bool = False  # sprinkle NaN / +inf / -inf (floats only)
    extra: dict[str, Any] = field(default_factory=dict)

    def profile(self) -> dict[str, Any]:
        p: dict[str, Any] = {"interleave": self.interleave}
        if self.layout == "strip":
            p.update(tiled=False, blockysize=8)  # 9 strips of 8 rows, the last one ragged (JPEG needs 8s)
        else:
            size = int(self.layout.removeprefix("tile"))
            p.update(tiled=True, blockxsize=size, blockysize=size)
        if self.compress:
            p["compress"] = self.compress
        if self.predictor:
            p["predictor"] = self.predictor
        if self.bigtiff:
            p["BIGTIFF"] = "YES"
        if self.big_endian:
            p["ENDIANNESS"] = "BIG"
        if self.nodata is not None:
            p["nodata"] = self.nodata
        p.update(self.extra)
        return p


CASES = [
    # uint8: every codec, including the lossy 8-bit ones (pixel interleave, 1/3/4 bands)
    Case("u8-strip-pixel-none", "uint8", 5, "strip", "pixel"),
    Case("u8-tile32-band-deflate-nodata", "uint8", 6, "tile32", "band", "DEFLATE", 2, nodata=255),
    Case("u8-tile16-pixel-zstd-be", "uint8", 5, "tile16", "pixel", "ZSTD", 2, big_endian=True),
    Case("u8-jpeg-1band-tile16", "uint8", 1, "tile16", "pixel", "JPEG"),
    Case("u8-jpeg-3band-ycbcr-tile32", "uint8", 3, "tile32", "pixel", "JPEG", extra={"photometric": "YCBCR"}),
    Case("u8-jpeg-3band-rgb-strip", "uint8", 3, "strip", "pixel", "JPEG", extra={"JPEG_QUALITY": 90}),
    Case("u8-webp-3band-lossless-tile32", "uint8", 3, "tile32", "pixel", "WEBP", extra={"WEBP_LOSSLESS": "TRUE"}),
    Case("u8-webp-4band-lossy-strip", "uint8", 4, "strip", "pixel", "WEBP", bigtiff=True),
    # int8
    Case("i8-strip-band-lzw-be-nodata", "int8", 5, "strip", "band", "LZW", 2, big_endian=True, nodata=-128),
    Case("i8-tile32-pixel-zstd-bigtiff", "int8", 7, "tile32", "pixel", "ZSTD", 2, bigtiff=True),
    # int16
    Case("i16-tile32-band-zstd-bigtiff-nodata", "int16", 6, "tile32", "band", "ZSTD", 2, bigtiff=True, nodata=-9999),
    Case("i16-strip-pixel-none-be", "int16", 5, "strip", "pixel", big_endian=True),
    Case("i16-tile16-band-deflate-be-nodata", "int16", 7, "tile16", "band", "DEFLATE", 2, big_endian=True, nodata=-32768),
    # more bands than cubelake calibrates/transposes in one group (16), nodata in the last group
    Case("i16-tile32-band-deflate-20bands-nodata", "int16", 20, "tile32", "band", "DEFLATE", 2, nodata=-1),
    # uint16
    Case("u16-tile16-band-lzw-be-nodata", "uint16", 5, "tile16", "band", "LZW", 2, big_endian=True, nodata=0),
    Case("u16-strip-pixel-zstd-bigtiff", "uint16", 6, "strip", "pixel", "ZSTD", 2, bigtiff=True),
    # int32 / uint32
    Case("i32-tile32-band-deflate-be-nodata", "int32", 5, "tile32", "band", "DEFLATE", 2, big_endian=True, nodata=-1),
    Case("u32-strip-pixel-zstd-bigtiff-be", "uint32", 6, "strip", "pixel", "ZSTD", 2, bigtiff=True, big_endian=True),
    # float32
    Case("f32-tile32-band-deflate-nodata-nan", "float32", 6, "tile32", "band", "DEFLATE", 3, nodata=-9999.0, nonfinite=True),
    Case("f32-strip-pixel-zstd-be-nan", "float32", 5, "strip", "pixel", "ZSTD", 3, big_endian=True, nonfinite=True),
    Case("f32-tile16-pixel-lzw-bigtiff-nodata_is_nan", "float32", 7, "tile16", "pixel", "LZW", 3, bigtiff=True,
         nodata=math.nan, nonfinite=True),
    Case("f32-tile16-band-none-nodata", "float32", 5, "tile16", "band", nodata=-1.0),
    # float64
    Case("f64-tile32-band-zstd-be-nodata-nan", "float64", 5, "tile32", "band", "ZSTD", 3, big_endian=True,
         nodata=-9999.0, nonfinite=True),
    Case("f64-strip-pixel-none-nan", "float64", 6, "strip", "pixel", nonfinite=True),
    Case("f64-tile16-band-deflate-bigtiff-be", "float64", 7, "tile16", "band", "DEFLATE", 3, bigtiff=True,
         big_endian=True),
]


def make_source(case: Case, folder: Path) -> Path:
    """Write the case's GeoTIFF: a smooth seeded cube, with nodata and non-finite values planted."""
    data = hsi_cube(case.bands, HEIGHT, WIDTH, case.dtype, seed=len(case.id))
    if case.nodata is not None:
        nd = np.asarray(case.nodata).astype(case.dtype)
        data[0, :9, :13] = nd  # a corner of the first band (crosses no chunk edge)
        data[-1, 30:40, 25:40] = nd  # straddles the chunk edge at row/col 32
        data[:, HEIGHT - 1, WIDTH - 1] = nd  # the last pixel of the ragged edge tile, every band
    if case.nonfinite:
        data[1, 5, 5] = np.nan
        data[1, 33, 60:65] = np.inf
        data[0, 69, 0:3] = -np.inf
        data[-1, 10:14, 88] = np.nan
    path = folder / f"{case.id}.tif"
    write_geotiff(path, data, **case.profile())
    return path


def expected_store(src: Path) -> tuple[np.ndarray, float | None]:
    """The cube the products must hold, from rasterio's read of the source, and the fill value."""
    with rasterio.open(src) as ds:
        raw = ds.read()
        nodata = ds.nodata
    if raw.dtype.kind == "f":
        out = raw.astype(np.float32)
        bad = ~np.isfinite(raw)
        if nodata is not None and not math.isnan(nodata):
            bad |= raw == nodata
        out[bad] = np.nan
        return out, math.nan
    return raw, nodata


def decoded(expected: np.ndarray, fill: float | None) -> np.ndarray:
    """What a CF-decoding reader (xarray) must return: float with NaN at the fill value."""
    if expected.dtype.kind == "f":
        return expected.astype(np.float64)
    if fill is None:
        return expected
    out = expected.astype(np.float64)
    out[expected == fill] = np.nan
    return out


@dataclass
class Built:
    case: Case
    src: Path
    lake: Path
    result: Any
    expected: np.ndarray
    fill: float | None

    @property
    def scene_dir(self) -> Path:
        return self.lake / "scenes" / self.result.scene_id

    @property
    def cog(self) -> Path:
        return self.scene_dir / f"{self.result.scene_id}.tif"

    @property
    def zarr(self) -> Path:
        return self.scene_dir / f"{self.result.scene_id}.zarr"


@pytest.fixture(scope="module", params=CASES, ids=[c.id for c in CASES])
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Built:
    case: Case = request.param
    folder = tmp_path_factory.mktemp(case.id)
    src = make_source(case, folder)
    lake = folder / "lake"
    results = ingest([src], lake, OPTIONS)
    expected, fill = expected_store(src)
    assert len(results) == 1
    return Built(case, src, lake, results[0], expected, fill)


def test_fixture_has_the_requested_layout(built: Built) -> None:
    """Guard against a degenerate matrix: the source really is in the layout/codec/dtype asked for."""
    case = built.case
    with tifffile.TiffFile(built.src) as tif:
        page = tif.pages.first
        assert tif.byteorder == (">" if case.big_endian else "<")
        assert tif.is_bigtiff == case.bigtiff
        assert page.is_tiled == case.layout.startswith("tile")
        if page.is_tiled:
            size = int(case.layout.removeprefix("tile"))
            assert (page.tilelength, page.tilewidth) == (size, size)
        if case.bands > 1:
            want = tifffile.PLANARCONFIG.CONTIG if case.interleave == "pixel" else tifffile.PLANARCONFIG.SEPARATE
            assert page.planarconfig == want
        codec = {None: "NONE", "DEFLATE": "ADOBE_DEFLATE", "LZW": "LZW", "ZSTD": "ZSTD", "JPEG": "JPEG",
                 "WEBP": "WEBP"}[case.compress]
        assert page.compression == tifffile.COMPRESSION[codec]
        if case.predictor:
            assert page.predictor == case.predictor
    with rasterio.open(built.src) as ds:
        assert ds.dtypes[0] == case.dtype
        assert (ds.count, ds.height, ds.width) == (case.bands, HEIGHT, WIDTH)
        if case.nodata is not None:
            assert ds.nodata is not None
            assert (math.isnan(ds.nodata) and math.isnan(case.nodata)) or ds.nodata == case.nodata
    if case.nonfinite:
        assert np.isnan(built.expected).any()
    if case.nodata is not None and case.dtype[0] in "iu":
        assert (built.expected == built.fill).any()


def test_ingested(built: Built) -> None:
    r = built.result
    assert r.outcome is Outcome.INGESTED, r.message
    assert r.report.ok
    assert sorted(r.products) == ["cog", "zarr"]
    assert Path(r.products["cog"]).resolve() == built.cog.resolve()
    assert Path(r.products["zarr"]).resolve() == built.zarr.resolve()
    assert built.cog.is_file()
    assert (built.zarr / "zarr.json").is_file()
    # nothing left behind while building
    assert list((built.lake / ".staging").iterdir()) == []
    assert list((built.lake / "rejected").iterdir()) == []
    record = json.loads((built.scene_dir / "scene.json").read_text())
    assert [b["source_band"] for b in record["bands"]] == list(range(1, built.case.bands + 1))


def test_cog_values_exact(built: Built) -> None:
    with rasterio.open(built.cog) as ds:
        got = ds.read()
        nodata = ds.nodata
        crs, transform = ds.crs, ds.transform
    exp = built.expected
    assert got.dtype == exp.dtype
    assert got.shape == exp.shape
    np.testing.assert_array_equal(got, exp)  # NaN == NaN here, bit-identical otherwise
    if built.fill is None:
        assert nodata is None
    elif math.isnan(built.fill):
        assert nodata is not None
        assert math.isnan(nodata)
    else:
        assert nodata == built.fill
    with rasterio.open(built.src) as src:
        assert crs == src.crs
        assert transform == src.transform


def test_cog_structure(built: Built) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        valid, errors, _ = cog_validate(str(built.cog), quiet=True)
    assert valid, errors
    assert errors == []
    with rasterio.open(built.cog) as ds:
        assert ds.block_shapes == [(CHUNK, CHUNK)] * ds.count
        if ds.count > 1:
            assert ds.interleaving is Interleaving.pixel
    with tifffile.TiffFile(built.cog) as tif:
        page = tif.pages.first
        assert page.is_tiled
        assert (page.tilelength, page.tilewidth) == (CHUNK, CHUNK)
        assert page.planarconfig == tifffile.PLANARCONFIG.CONTIG
        assert page.compression == tifffile.COMPRESSION.ZSTD
        want = tifffile.PREDICTOR.FLOATINGPOINT if built.expected.dtype.kind == "f" else tifffile.PREDICTOR.HORIZONTAL
        assert page.predictor == want


def test_zarr_values_exact(built: Built) -> None:
    arr = zarr.open_group(str(built.zarr), mode="r")["data"]
    nb = built.expected.shape[0]
    assert arr.chunks == (nb, CHUNK, CHUNK)
    got = arr[:]
    assert got.dtype == built.expected.dtype
    np.testing.assert_array_equal(got, built.expected)
    if built.fill is not None:
        fv = arr.fill_value
        assert (math.isnan(built.fill) and math.isnan(fv)) or fv == built.fill


def test_xarray_decodes_fill_as_nan(built: Built) -> None:
    with xr.open_zarr(built.zarr) as ds:
        da = ds["data"]
        assert da.dims == ("band", "y", "x")
        got = da.values
    want = decoded(built.expected, built.fill)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got) if got.dtype.kind == "f" else np.zeros(got.shape, bool),
                                  np.isnan(want) if want.dtype.kind == "f" else np.zeros(want.shape, bool))
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def test_rioxarray_georeferencing(built: Built) -> None:
    with rasterio.open(built.src) as src:
        crs, transform = src.crs, src.transform
    with xr.open_zarr(built.zarr) as ds:
        da = ds["data"]
        assert da.rio.crs == crs
        assert da.rio.transform() == transform
        assert da.rio.shape == (HEIGHT, WIDTH)


# -- spectral metadata -----------------------------------------------------------------------


def _tagged_source(folder: Path, wavelengths: list[float], fwhm: list[float], dtype: str = "int16") -> tuple[Path, np.ndarray]:
    data = hsi_cube(len(wavelengths), HEIGHT, WIDTH, dtype, seed=7)
    tags = [{"wavelength": f"{w:g}", "fwhm": f"{f:g}", "wavelength_units": "nm"} for w, f in zip(wavelengths, fwhm, strict=True)]
    path = write_geotiff(folder / "tagged.tif", data, tiled=True, blockxsize=16, blockysize=16, compress="DEFLATE",
                         band_tags=tags)
    return path, data


def test_band_wavelengths_survive_into_cog_tags_and_zarr_coordinate(tmp_path: Path) -> None:
    wl = [500.0 + 100.0 * i for i in range(6)]  # 500..1000 nm, clear of every default bad-band window
    fw = [90.0 + i for i in range(6)]
    src, data = _tagged_source(tmp_path, wl, fw)
    (r,) = ingest([src], tmp_path / "lake", OPTIONS)
    assert r.outcome is Outcome.INGESTED, r.message
    assert not [i for i in r.report.warnings if i.code == "no_wavelengths"]
    cog = Path(r.products["cog"])
    with rasterio.open(cog) as ds:
        assert ds.count == 6
        np.testing.assert_array_equal(ds.read(), data)
        for i in range(6):
            tags = ds.tags(i + 1)
            assert float(tags["wavelength"]) == wl[i]
            assert float(tags["fwhm"]) == fw[i]
            assert tags["wavelength_units"].lower() in ("nm", "nanometers", "nanometres")
    with xr.open_zarr(r.products["zarr"]) as ds:
        assert "wavelength" in ds.coords
        assert ds["wavelength"].dims == ("band",)
        np.testing.assert_array_equal(ds["wavelength"].values, wl)
        assert ds["wavelength"].attrs.get("units") == "nm"
        np.testing.assert_array_equal(ds["fwhm"].values, fw)
        # selecting by wavelength picks the right band's values
        np.testing.assert_array_equal(ds["data"].swap_dims(band="wavelength").sel(wavelength=800.0).values,
                                      data[wl.index(800.0)])
    record = json.loads((cog.parent / "scene.json").read_text())
    assert [b["wavelength_nm"] for b in record["bands"]] == wl


def test_band_in_water_vapour_window_is_removed_by_default(tmp_path: Path) -> None:
    wl = [1000.0 + 100.0 * i for i in range(7)]  # 1000..1600 nm; 1400 nm lies in 1350-1450
    fw = [100.0] * 7
    src, data = _tagged_source(tmp_path, wl, fw, dtype="uint16")
    kept = [i + 1 for i, w in enumerate(wl) if not 1350.0 <= w <= 1450.0]
    assert len(kept) == len(wl) - 1  # the fixture does put exactly one band in the window
    (r,) = ingest([src], tmp_path / "lake", OPTIONS)
    assert r.outcome is Outcome.INGESTED, r.message
    scene = Path(r.products["cog"]).parent
    record = json.loads((scene / "scene.json").read_text())
    assert [b["source_band"] for b in record["bands"]] == kept
    assert [b["wavelength_nm"] for b in record["bands"]] == [wl[k - 1] for k in kept]
    want = data[[k - 1 for k in kept]]
    with rasterio.open(r.products["cog"]) as ds:
        assert ds.count == len(kept)
        np.testing.assert_array_equal(ds.read(), want)
        assert [int(ds.tags(i)["source_band"]) for i in range(1, ds.count + 1)] == kept
        assert [float(ds.tags(i)["wavelength"]) for i in range(1, ds.count + 1)] == [wl[k - 1] for k in kept]
    z = zarr.open_group(r.products["zarr"], mode="r")
    assert z["data"].shape == (len(kept), HEIGHT, WIDTH)
    assert z["data"].chunks == (len(kept), CHUNK, CHUNK)
    np.testing.assert_array_equal(z["data"][:], want)
    with xr.open_zarr(r.products["zarr"]) as ds:
        np.testing.assert_array_equal(ds["band"].values, kept)
        np.testing.assert_array_equal(ds["wavelength"].values, [wl[k - 1] for k in kept])


def test_float64_beyond_float32_range_is_clipped_and_reported(tmp_path: Path) -> None:
    """A finite float64 value that float32 cannot hold is clipped to float32's range and reported.

    The generic profile stores float sources as float32; publishing ``inf`` for a finite source
    value would be data corruption that no reader could tell from a real infinity.
    """
    data = hsi_cube(5, HEIGHT, WIDTH, "float64", seed=11)
    top = float(np.finfo(np.float32).max)
    data[2, 40:45, 50:55] = top * 10.0
    data[2, 0, 0] = -top * 10.0
    src = write_geotiff(tmp_path / "f64_wide.tif", data, tiled=True, blockxsize=32, blockysize=32)
    assert np.isfinite(data).all()
    (r,) = ingest([src], tmp_path / "lake", OPTIONS)
    assert r.outcome is Outcome.INGESTED, r.message
    (flag,) = [i for i in r.report.warnings if i.code == "encoding_clipped"]
    assert flag.bands == (3,)
    assert "26 value(s)" in flag.message
    with rasterio.open(r.products["cog"]) as ds:
        stored = ds.read()
    assert np.isfinite(stored).all()
    assert stored[2, 40, 50] == np.float32(top)
    assert stored[2, 0, 0] == np.float32(-top)
    expected = data.astype(np.float32)
    expected[2, 40:45, 50:55] = top
    expected[2, 0, 0] = -top
    np.testing.assert_array_equal(stored, expected)
