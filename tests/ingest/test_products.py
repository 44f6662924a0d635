"""What the products look like to the tools users read them with: GDAL (CLI), rasterio, xarray, rioxarray."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import rasterio
import rioxarray  # noqa: F401  (registers the .rio accessor)
import xarray as xr
import zarr
from rio_cogeo.cogeo import cog_info, cog_validate

from cubelake.ingest import IngestOptions, Outcome, ingest, load_profile
from cubelake.lake import Lake
from tests.conftest import hsi_cube, write_geotiff


def _products(lake: Lake, scene_id: str | None) -> tuple[Path, Path]:
    assert scene_id is not None
    d = lake.scene_dir(scene_id)
    return d / f"{scene_id}.tif", d / f"{scene_id}.zarr"


@pytest.fixture(scope="module")
def enmap(tmp_path_factory: pytest.TempPathFactory, real: Path) -> tuple[Lake, str]:
    lake = Lake(tmp_path_factory.mktemp("enmap") / "lake")
    (r,) = ingest([real / "hsi_enmap_potsdam/enmap_potsdam_tile_96_0.tif"], lake)
    assert r.outcome is Outcome.INGESTED, r.message
    assert r.scene_id is not None
    return lake, r.scene_id


def test_gdal_cli_reads_the_cog_and_its_band_metadata(enmap: tuple[Lake, str]) -> None:
    lake, sid = enmap
    cog, _ = _products(lake, sid)
    info = json.loads(subprocess.run(["gdalinfo", "-json", "-mdd", "all", str(cog)], check=True,
                                     capture_output=True, text=True).stdout)
    b1 = info["bands"][0]
    assert b1["description"] == "band 1 (418.24 nm)"
    assert b1["metadata"][""]["wavelength"] == "418.24"
    assert b1["metadata"][""]["fwhm"] == "6.99561"
    assert b1["metadata"][""]["wavelength_units"] == "Nanometers"
    assert b1["metadata"]["IMAGERY"]["CENTRAL_WAVELENGTH_UM"] == "0.41824"
    assert b1["noDataValue"] == -32768
    assert b1["scale"] == pytest.approx(1e-4)
    assert info["metadata"]["IMAGE_STRUCTURE"]["COMPRESSION"] == "ZSTD"
    assert info["metadata"]["IMAGE_STRUCTURE"]["INTERLEAVE"] == "PIXEL"
    cal = json.loads(info["metadata"][""]["CUBELAKE_CALIBRATION"])
    assert cal["quantity"] == "reflectance"


def test_gdal_cli_decodes_the_same_pixels(enmap: tuple[Lake, str], tmp_path: Path) -> None:
    lake, sid = enmap
    cog, zpath = _products(lake, sid)
    plain = tmp_path / "plain.tif"
    subprocess.run(["gdal_translate", "-q", "-of", "GTiff", str(cog), str(plain)], check=True)  # Debian GDAL 3.6
    with rasterio.open(plain) as ds:
        np.testing.assert_array_equal(ds.read(), zarr.open_group(str(zpath), mode="r")["data"][:])


def test_cog_is_valid_with_chunk_tiles(enmap: tuple[Lake, str]) -> None:
    lake, sid = enmap
    cog, _ = _products(lake, sid)
    assert cog_validate(str(cog), quiet=True)[0]
    info = cog_info(str(cog))
    assert info.COG
    assert info.Profile.Interleave == "PIXEL"


def test_xarray_and_rioxarray_read_the_zarr(enmap: tuple[Lake, str], real: Path) -> None:
    lake, sid = enmap
    _cog, zpath = _products(lake, sid)
    ds = xr.open_zarr(zpath)
    da = ds["data"]
    assert da.dims == ("band", "y", "x")
    with rasterio.open(real / "hsi_enmap_potsdam/enmap_potsdam_tile_96_0.tif") as src:
        assert da.rio.crs == src.crs
        assert tuple(da.rio.transform())[:6] == pytest.approx(tuple(src.transform)[:6])
        # cell centres from the transform
        assert float(ds.x[0]) == pytest.approx(src.transform.c + src.transform.a / 2)
        assert float(ds.y[0]) == pytest.approx(src.transform.f + src.transform.e / 2)
        raw = src.read(1)
    assert ds.wavelength.attrs["units"] == "nm"
    assert float(ds.wavelength[0]) == pytest.approx(418.24)
    assert int(ds.band[0]) == 1
    # CF decoding: int16 x 1e-4 -> reflectance, fill -> NaN
    np.testing.assert_allclose(da.isel(band=0).values, np.where(raw == -32768, np.nan, raw * 1e-4), rtol=0, atol=1e-7)
    assert ds["labels"].dtype == np.uint8
    stats = json.loads(da.attrs["cubelake:band_stats"])
    assert stats["mean"][0] == pytest.approx(float(np.nanmean(da.isel(band=0).values)), rel=1e-6)


def test_labels_are_stored_beside_the_cube(enmap: tuple[Lake, str], real: Path) -> None:
    lake, sid = enmap
    with rasterio.open(real / "hsi_enmap_potsdam/labels/enmap_potsdam_tile_96_0.tif") as ds:
        labels = ds.read(1).astype(np.uint8)
    _, zpath = _products(lake, sid)
    np.testing.assert_array_equal(zarr.open_group(str(zpath), mode="r")["labels"][:], labels)
    with rasterio.open(lake.scene_dir(sid) / f"{sid}.labels.tif") as ds:
        np.testing.assert_array_equal(ds.read(1), labels)


def test_rotated_transform_kept_in_cog_and_as_geotransform(real: Path, lake: Lake) -> None:
    (r,) = ingest([real / "geotiff_rioxarray/2d_test.tif"], lake)
    assert r.outcome is Outcome.INGESTED
    cog, zpath = _products(lake, r.scene_id)
    with rasterio.open(real / "geotiff_rioxarray/2d_test.tif") as src, rasterio.open(cog) as out:
        assert out.transform == src.transform
        t = src.transform
    ds = xr.open_zarr(zpath)
    assert "x" not in ds.coords
    assert ds["data"].rio.transform() == t
    assert "rotated_transform" in [w.code.value for w in r.report.warnings]


def test_sharded_zarr_same_values(tmp_path: Path, lake: Lake) -> None:
    cube = hsi_cube(5, 100, 130, "int16")
    src = write_geotiff(tmp_path / "s.tif", cube, nodata=-32768)
    (r,) = ingest([src], lake, IngestOptions(chunk=32, shard=2))
    _, zpath = _products(lake, r.scene_id)
    meta = json.loads((zpath / "data" / "zarr.json").read_text())
    assert meta["codecs"][0]["name"] == "sharding_indexed"
    assert meta["codecs"][0]["configuration"]["chunk_shape"] == [5, 32, 32]
    np.testing.assert_array_equal(zarr.open_group(str(zpath), mode="r")["data"][:], cube)


def test_deflate_and_overviews_profile(tmp_path: Path, lake: Lake) -> None:
    cube = hsi_cube(3, 300, 280, "float32")
    src = write_geotiff(tmp_path / "f.tif", cube)
    prof = tmp_path / "p.yaml"
    prof.write_text("name: d\nproducts: {chunk: 64, compression: deflate, overviews: true}\n")
    (r,) = ingest([src], lake, IngestOptions(profile=load_profile(prof)))
    cog, _ = _products(lake, r.scene_id)
    with rasterio.open(cog) as ds:
        assert ds.compression.value == "DEFLATE"
        assert ds.overviews(1)
        assert ds.block_shapes[0] == (64, 64)
        np.testing.assert_array_equal(ds.read(), cube)
    assert cog_validate(str(cog), quiet=True)[0]


def test_pixel_grid_product_without_georeferencing(real: Path, lake: Lake) -> None:
    (r,) = ingest([real / "hsi_abu_anomaly/sandiego_plane.mat"], lake)
    assert r.outcome is Outcome.INGESTED
    cog, zpath = _products(lake, r.scene_id)
    ds = xr.open_zarr(zpath)
    assert "spatial_ref" not in ds.coords
    assert ds.x.attrs["units"] == "pixel"
    assert float(ds.x[0]) == 0.5
    assert int(ds["labels"].sum()) == 134  # the anomaly map: 134 plane pixels
    with rasterio.open(cog) as out:
        assert out.crs is None
