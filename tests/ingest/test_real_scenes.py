"""Every real scene in the shared data: ingested value-exact, or rejected for the right reason.

The expected stored cube is recomputed here from an independent read of the source (rasterio,
scipy, h5py) and the calibration recorded in the product, with plain numpy.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
import scipy.io
import zarr
from rio_cogeo.cogeo import cog_validate

from cubelake.ingest import Code, IngestResult, Outcome, ingest
from cubelake.lake import Lake

REJECTED: dict[str, set[Code]] = {
    "bad_inputs/image_tiff_fuzz/divide_by_zero_sample.tif": {Code.UNREADABLE},
    "bad_inputs/image_tiff_fuzz/inf_loop_sample.tif": {Code.TRUNCATED, Code.BLOCK_DECODE},
    "bad_inputs/image_tiff_fuzz/oom_crash_sample.tif": {Code.TRUNCATED, Code.BLOCK_DECODE},  # a tag value past the end
    "bad_inputs/image_tiff_fuzz/oor_panic_sample.tif": {Code.UNREADABLE},
    "bad_inputs/mat/Indian_pines_gt_nul_bytes_replaced.mat": {Code.UNREADABLE},
    "bad_inputs/rasterio/corrupt.tif": {Code.TRUNCATED, Code.BLOCK_DECODE},
    "bad_inputs/rio_pansharpen/corrupt.TIF": {Code.CONTENT_MISMATCH},
    "bad_inputs/rio_pansharpen/corrupt_image.TIF": {Code.CONTENT_MISMATCH},
    "geotiff_cogeotiff/sparse.tiff": {Code.NO_VALID_DATA},
    "geotiff_rasterio/all-nodata.tif": {Code.NO_VALID_DATA},
    "hsi_ground_truth/Indian_pines_gt.mat": {Code.NO_CUBE},
    "hsi_ground_truth/PaviaU_gt.mat": {Code.NO_CUBE},
    "hsi_ground_truth/Salinas_gt.mat": {Code.NO_CUBE},
    "hsi_ground_truth/v73_hdf5/Indian_pines_gt.mat": {Code.NO_CUBE},
    "hsi_ground_truth/v73_hdf5/KSC_gt.mat": {Code.NO_CUBE},
    "hsi_ground_truth/v73_hdf5/PaviaU_gt.mat": {Code.NO_CUBE},
    "hsi_ground_truth/v73_hdf5/Salinas_gt.mat": {Code.NO_CUBE},
    "hsi_indian_pines_purdue/indianpines_ds_raw.hdr": {Code.DATA_FILE_MISSING, Code.WAVELENGTH_ORDER},
    "other_formats/modis_hdf4/MOD09GA.A2008296.h14v17.006.2015181011753.hdf": {Code.NOT_A_RASTER},
}


@pytest.fixture(scope="module")
def real_lake(tmp_path_factory: pytest.TempPathFactory, real: Path) -> tuple[Lake, list[IngestResult]]:
    lake = Lake(tmp_path_factory.mktemp("real") / "lake")
    return lake, ingest([real], lake)


def _rel(r: IngestResult, real: Path) -> str:
    return str(Path(r.path).resolve().relative_to(real))


def _source_cube(path: Path, record: dict[str, Any]) -> np.ndarray:
    """All source bands ``(band, y, x)``, read without cubelake."""
    fmt = record["source"]["format"]
    files = [f["path"] for f in record["source"]["files"]]
    if fmt == "Landsat-MTL":
        arrs = []
        for f in files[1:]:
            with rasterio.open(f) as ds:
                arrs.append(ds.read())
        return np.concatenate(arrs)
    if fmt == "ENVI":
        with rasterio.open(files[1]) as ds:
            return ds.read()
    if fmt == "MAT-v5":
        d = scipy.io.loadmat(path)
        name = {"jasperRidge2_R198.mat": "Y", "samson_1.mat": "V", "houston_dataset.mat": "hyprImg"}.get(path.name, "data")
        a = d[name]
        if a.ndim == 2:  # bands x pixels, pixels column-major
            nrow, ncol = int(d["nRow"].squeeze()), int(d["nCol"].squeeze())
            return a.reshape(a.shape[0], ncol, nrow).transpose(0, 2, 1)
        return a.transpose(2, 0, 1)
    with rasterio.open(path) as ds:
        return ds.read()


def _expected(raw: np.ndarray, calibration: dict[str, Any]) -> np.ndarray:
    steps = {s["step"]: s for s in calibration["steps"]}
    keep = [k - 1 for k in steps["select_bands"]["keep"]]
    nd = steps["nodata_mask"]["nodata"]
    gain = np.asarray(steps["linear"]["gain"])[:, None, None]
    offset = np.asarray(steps["linear"]["offset"])[:, None, None]
    enc = steps["cf_encode"]
    sel = raw[keep]
    invalid = ~np.isfinite(sel.astype(np.float64))
    if nd is not None and nd != "NaN":
        invalid |= sel == nd
    fill = enc["_FillValue"]
    if enc["dtype"] == "float32":
        out = (sel.astype(np.float64) * gain + offset).astype(np.float32)
        out[invalid] = np.nan
        return out
    if "scale_factor" not in enc and np.all(gain == 1) and np.all(offset == 0) and enc["dtype"] == raw.dtype.name:
        out = sel.copy()
        if fill is not None:
            out[invalid] = fill
        return out
    value = sel.astype(np.float64) * gain + offset
    q = np.rint((value - enc.get("add_offset", 0.0)) / enc.get("scale_factor", 1.0))
    info = np.iinfo(enc["dtype"])
    lo, hi = info.min + (fill == info.min), info.max - (fill == info.max)
    q = np.clip(q, lo, hi)
    q[invalid] = fill
    return q.astype(enc["dtype"])


@pytest.mark.slow
def test_every_real_input_is_ingested_or_rejected_for_its_reason(real_lake: tuple[Lake, list[IngestResult]],
                                                                 real: Path) -> None:
    lake, results = real_lake
    by_rel = {_rel(r, real): r for r in results}
    assert set(REJECTED) <= set(by_rel), sorted(set(REJECTED) - set(by_rel))
    for rel, r in by_rel.items():
        if rel in REJECTED:
            assert r.outcome is Outcome.REJECTED, (rel, r.message)
            assert {i.code for i in r.report.errors} == REJECTED[rel], (rel, r.report.summary())
            assert lake.rejected_path(r.scene_id).is_file()  # type: ignore[arg-type]
            assert not lake.scene_dir(r.scene_id).exists()  # type: ignore[arg-type]
            for issue in r.report.errors:
                assert Path(r.path).name in issue.message or issue.where, issue
        else:
            assert r.outcome is Outcome.INGESTED, (rel, r.message)
    ingested = [r for r in results if r.outcome is Outcome.INGESTED]
    assert len(ingested) >= 40
    assert not list((lake.root / ".staging").iterdir())


@pytest.mark.slow
def test_real_products_equal_the_calibrated_cube(real_lake: tuple[Lake, list[IngestResult]], real: Path) -> None:
    lake, results = real_lake
    checked = 0
    for r in results:
        if r.outcome is not Outcome.INGESTED:
            continue
        assert r.scene_id is not None
        record = json.loads((lake.scene_dir(r.scene_id) / "scene.json").read_text())
        expected = _expected(_source_cube(Path(r.path), record), record["calibration"])
        cog = lake.scene_dir(r.scene_id) / f"{r.scene_id}.tif"
        with rasterio.open(cog) as ds:
            np.testing.assert_array_equal(ds.read(), expected, err_msg=f"COG of {r.path}")
            assert ds.block_shapes[0] == (record["grid"]["chunk_shape"][1],) * 2
        assert cog_validate(str(cog), quiet=True)[0], r.path
        z = zarr.open_group(str(lake.scene_dir(r.scene_id) / f"{r.scene_id}.zarr"), mode="r")
        np.testing.assert_array_equal(z["data"][:], expected, err_msg=f"Zarr of {r.path}")
        assert z["data"].chunks == tuple(record["grid"]["chunk_shape"])
        checked += 1
    assert checked >= 40


@pytest.mark.slow
def test_real_calibrations_worked_cases(real_lake: tuple[Lake, list[IngestResult]], real: Path) -> None:
    lake, results = real_lake
    by_rel = {_rel(r, real): r for r in results}

    def record(rel: str) -> dict[str, Any]:
        sid = by_rel[rel].scene_id
        assert sid is not None
        return json.loads((lake.scene_dir(sid) / "scene.json").read_text())

    # EnMAP: reflectance x 1e4 -> int16 with scale_factor 1e-4 is lossless; bbl bands, the VNIR/SWIR
    # overlap and the 1800-1960 nm window are removed, and each removal is recorded
    enmap = record("hsi_enmap_potsdam/enmap_potsdam_tile_96_0.tif")
    removed = enmap["calibration"]["steps"][0]["removed"]
    assert {k for k, v in removed.items() if v == "file bbl"} == {str(b) for b in range(130, 136)}
    assert any(v == "spectrometer overlap" for v in removed.values())
    wl = [b["wavelength_nm"] for b in enmap["bands"]]
    assert all(b > a for a, b in itertools.pairwise(wl))
    assert not any(1350 <= w <= 1450 or 1800 <= w <= 1960 or w >= 2450 for w in wl)
    assert enmap["encoding"] == {"step": "cf_encode", "dtype": "int16",
                                 "formula": "stored = round((value - add_offset) / scale_factor)",
                                 "scale_factor": 0.0001, "add_offset": 0.0, "_FillValue": -32768.0}
    assert enmap["labels"]["classes"]
    # Landsat 8: DN -> TOA reflectance with the MTL's REFLECTANCE_MULT/ADD and the sun elevation
    l8 = record("landsat8_rio_toa/LC81060712016134LGN00_MTL.txt")
    lin = l8["calibration"]["steps"][2]
    s = math.sin(math.radians(45.66897551))
    assert lin["gain"][0] == pytest.approx(2.0e-05 / s)
    assert lin["offset"][0] == pytest.approx(-0.1 / s)
    mean = l8["bands"][0]["mean"]
    assert 0.0 < mean < 0.5  # a plausible TOA reflectance, not DN
    # Landsat 5: thermal B6 dropped, six reflective bands with wavelengths
    l5 = record("landsat5_tm_rstoolbox/LT52240631988227CUB02_MTL.txt")
    assert [b["name"] for b in l5["bands"]] == ["B1", "B2", "B3", "B4", "B5", "B7"]
    assert l5["calibration"]["steps"][0]["removed"] == {"6": "profile name B6"}
