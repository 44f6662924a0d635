"""``ingest --products refs``: in place when the source allows, else a COG written for the refs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import rasterio
import rasterio.windows
import xarray as xr

from cubelake.errors import UntrustedTargetError
from cubelake.ingest import IngestOptions, ingest
from cubelake.ingest.pipeline import Outcome
from cubelake.lake import Lake
from cubelake.refs import open_array, open_dataset
from tests.conftest import hsi_cube

REFS_ZARR = IngestOptions(products=("refs", "zarr"))


def _scene_json(lake: Lake, scene_id: str) -> dict:
    return json.loads((lake.scene_dir(scene_id) / "scene.json").read_text())


def test_tiled_source_is_referenced_in_place_and_reads_like_native_zarr(lake: Lake, geotiff) -> None:
    data = hsi_cube(9, 300, 520)
    src = geotiff("tiled.tif", data, tiled=True, blockxsize=256, blockysize=256, compress="zstd", predictor=2,
                  nodata=-32768)
    (res,) = ingest([src], lake, REFS_ZARR)
    assert res.outcome is Outcome.INGESTED, res.message
    assert "in place" in res.message
    rec = _scene_json(lake, res.scene_id)
    info = rec["products"]["refs"]
    assert info["in_place"] is True
    assert info["target"]["url"] == str(src.resolve())
    assert info["chunks"] == 2 * 3
    assert "cog" not in rec["products"]  # nothing copied
    assert str(src.parent.resolve()) in lake.allowed_roots
    with pytest.raises(UntrustedTargetError, match="outside the allowed roots"):
        open_dataset(res.products["refs"])  # the source's folder is trusted only through the lake, named by the caller
    ref = open_dataset(res.products["refs"], lake=lake)
    nat = xr.open_zarr(res.products["zarr"])
    assert ref["data"].dims == nat["data"].dims == ("band", "y", "x")
    np.testing.assert_array_equal(ref["data"].values, nat["data"].values)
    for c in ("x", "y", "band", "wavelength"):
        if c in nat.coords:
            np.testing.assert_array_equal(ref[c].values, nat[c].values)
    assert ref["spatial_ref"].attrs["crs_wkt"] == nat["spatial_ref"].attrs["crs_wkt"]
    np.testing.assert_array_equal(open_array(res.products["refs"], lake=lake.root)[:], data)


def test_striped_source_is_cogified_and_the_reason_is_given(lake: Lake, geotiff) -> None:
    data = hsi_cube(5, 200, 300)
    src = geotiff("striped.tif", data, tiled=False, compress="deflate")
    (res,) = ingest([src], lake, IngestOptions(products=("refs",)))
    assert res.outcome is Outcome.INGESTED, res.message
    assert "striped" in res.message
    assert "COG" in res.message
    rec = _scene_json(lake, res.scene_id)
    info = rec["products"]["refs"]
    assert info["in_place"] is False
    assert "striped" in info["reason_not_in_place"]
    cog = lake.scene_dir(res.scene_id) / rec["products"]["cog"]["path"]
    assert info["target"]["url"] == cog.name  # relative to the refs file: the lake can be moved
    with rasterio.open(cog) as ds:
        expected = ds.read()
    np.testing.assert_array_equal(open_array(res.products["refs"])[:], expected)
    np.testing.assert_array_equal(expected, data)


def test_calibration_a_reference_cannot_express_forces_a_cog(lake: Lake, geotiff, tmp_path: Path) -> None:
    # a profile that removes a band: the reference would have to drop it from every tile
    data = hsi_cube(6, 128, 128)
    src = geotiff("calib.tif", data, tiled=True, blockxsize=128, blockysize=128, compress="zstd")
    prof = tmp_path / "p.yaml"
    prof.write_text("name: dropper\nbad_bands:\n  indices: [3]\n  wavelength_windows_nm: []\n")
    from cubelake.ingest.profile import load_profile

    (res,) = ingest([src], lake, IngestOptions(products=("refs",), profile=load_profile(str(prof))))
    assert res.outcome is Outcome.INGESTED, res.message
    assert "removes bands (3)" in res.message
    arr = open_array(res.products["refs"], lake=lake)
    assert arr.shape == (5, 128, 128)
    np.testing.assert_array_equal(arr[:], data[[0, 1, 3, 4, 5]])


def test_cf_scale_offset_is_expressed_as_attributes_not_copied(lake: Lake, geotiff, tmp_path: Path) -> None:
    data = hsi_cube(4, 128, 256)
    src = geotiff("scaled.tif", data, tiled=True, blockxsize=128, blockysize=128, compress="deflate", nodata=-32768)
    prof = tmp_path / "s.yaml"
    prof.write_text("name: scaled\nnodata: -32768\ncalibration:\n  source: none\n  scale: 0.0001\n"
                    "encoding:\n  dtype: int16\n  scale_factor: 0.0001\n  fill_value: -32768\n")
    from cubelake.ingest.profile import load_profile

    (res,) = ingest([src], lake, IngestOptions(products=("refs", "zarr"), profile=load_profile(str(prof))))
    assert res.outcome is Outcome.INGESTED, res.message
    assert "in place" in res.message
    ref = open_dataset(res.products["refs"], lake=lake)
    nat = xr.open_zarr(res.products["zarr"])
    assert ref["data"].encoding["scale_factor"] == 0.0001
    np.testing.assert_allclose(ref["data"].values, nat["data"].values)
    np.testing.assert_allclose(ref["data"].values, data * 0.0001, rtol=1e-6)


def test_cli_ingest_refs_and_plain_xarray_in_a_fresh_process(tmp_path: Path, geotiff) -> None:
    src = geotiff("a.tif", hsi_cube(3, 100, 140), tiled=True, blockxsize=64, blockysize=64, compress="lzw",
                  predictor=2)
    lake = tmp_path / "lk"
    run = subprocess.run([sys.executable, "-m", "cubelake.cli", "ingest", str(src), "--lake", str(lake),
                          "--products", "refs", "--chunk", "64", "--format", "json"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    refs = json.loads(run.stdout)["results"][0]["products"]["refs"]
    code = f"""
import sys, numpy as np, xarray as xr, rasterio
assert "cubelake" not in sys.modules
ds = xr.open_dataset("reference://", engine="zarr", backend_kwargs={{"consolidated": True,
     "storage_options": {{"fo": {refs!r}}}}}, zarr_format=2)
with rasterio.open({str(src)!r}) as s:
    assert (ds["data"].values == s.read()).all()
assert ds["data"].dims == ("band", "y", "x")
assert "cubelake.refs.codec" in sys.modules  # found through the numcodecs entry point
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_real_scenes_ingested_with_refs_read_exactly_like_their_cogs(real: Path, tmp_path: Path) -> None:
    """Every chunk of every real scene's refs equals rasterio's read of the same window of its COG."""
    lake = Lake(tmp_path / "lake")
    results = ingest([real / "hsi_enmap_potsdam", real / "hsi_jasper_ridge", real / "landsat5_tm_rstoolbox"], lake,
                     IngestOptions(products=("cog", "refs")))
    done = [r for r in results if r.outcome is Outcome.INGESTED]
    assert len(done) >= 6
    for r in done:
        arr = open_array(r.products["refs"], lake=lake)
        _, ch, cw = arr.chunks
        with rasterio.open(r.products["cog"]) as cog:
            assert arr.shape == (cog.count, cog.height, cog.width)
            for y in range(0, cog.height, ch):
                for x in range(0, cog.width, cw):
                    win = rasterio.windows.Window(x, y, min(cw, cog.width - x), min(ch, cog.height - y))
                    np.testing.assert_array_equal(arr[:, y:y + win.height, x:x + win.width], cog.read(window=win),
                                                  err_msg=f"{r.path} chunk at row {y}, col {x}")


def test_the_loader_trusts_in_place_targets_through_the_lake_its_caller_names(lake: Lake, geotiff) -> None:
    from cubelake.loaders.sources import open_source

    data = hsi_cube(3, 128, 128)
    src = geotiff("inplace.tif", data, tiled=True, blockxsize=64, blockysize=64, compress="zstd")
    (res,) = ingest([src], lake, IngestOptions(products=("refs",)))
    assert "in place" in res.message
    folder = lake.scene_dir(res.scene_id)
    with pytest.raises(UntrustedTargetError, match="outside the allowed roots"):
        open_source(folder, prefer=("refs",))  # the lake.json above the scene is not trusted by itself
    with pytest.raises(UntrustedTargetError, match="outside the allowed roots"):
        open_source(folder / f"{res.scene_id}.refs.json")
    s = open_source(folder, prefer=("refs",), lake=lake.root)
    assert s.kind == "refs"
    url, off, n = s.locate(0, 1, 1)
    assert url == str(src.resolve())
    tile = s.decoder(src.read_bytes()[off:off + n], None)
    np.testing.assert_array_equal(tile, data[:, 64:128, 64:128])
    assert open_source(folder / f"{res.scene_id}.refs.json", lake=lake.root).version == s.version
