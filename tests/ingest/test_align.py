"""Aux rasters on other grids warped onto the scene grid at ingest (``--aux``, ``cubelake.ingest.align``).

The expected layers are GDAL's own warp of the aux raster onto the whole scene grid: ``gdalwarp -et 0``
(Debian's GDAL, a separate build from the one in rasterio) when it is installed, else one read of a
whole-grid rasterio ``WarpedVRT``; the stored layer, warped window by window, must equal it exactly.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
import zarr
from rasterio.crs import CRS
from rasterio.enums import Resampling
from rasterio.transform import from_origin
from rasterio.vrt import WarpedVRT
from rasterio.warp import transform_bounds
from rio_cogeo.cogeo import cog_validate
from typer.testing import CliRunner

from cubelake.cli import app
from cubelake.grid import ChunkGrid, Window
from cubelake.ingest import AuxSpec, Code, IngestOptions, Outcome, ingest
from cubelake.ingest.align import (
    LayerTarget,
    output_encoding,
    parse_aux_arg,
    parse_time_delta,
    plan_aux,
    raster_time,
    select_candidate,
    warp_windows,
    write_aux,
)
from cubelake.ingest.sources import SceneMetadata
from cubelake.ingest.validate import Limits
from cubelake.lake import Lake
from cubelake.record import SCENE_RECORD_FILE, read_scene_record
from tests.conftest import hsi_cube, no_traceback, run_cli, write_geotiff

runner = CliRunner()

H, W, CHUNK = 150, 170, 64
ORIGIN = (500000.0, 5800000.0)
SCENE_T = from_origin(*ORIGIN, 30.0, 30.0)
SCENE_BOUNDS = (ORIGIN[0], ORIGIN[1] - H * 30, ORIGIN[0] + W * 30, ORIGIN[1])
SCENE_TIME = "2022-07-24T10:45:26"


# -- fixtures: a scene in EPSG:32633 at 30 m, aux rasters in EPSG:4326 / 3857 ----------------------
def write_scene(path: Path, tags: dict[str, str] | None = None, **profile: Any) -> Path:
    write_geotiff(path, hsi_cube(3, H, W), nodata=-32768, transform=SCENE_T, **profile)
    if tags:
        with rasterio.open(path, "r+") as ds:
            ds.update_tags(**tags)
    return path


def write_raster(path: Path, data: np.ndarray, crs: str | None, transform: Any, nodata: float | None = None,
              tags: dict[str, str] | None = None) -> Path:
    nb, h, w = data.shape
    profile: dict[str, Any] = {"driver": "GTiff", "width": w, "height": h, "count": nb, "dtype": data.dtype.name,
                               "tiled": True, "blockxsize": 32, "blockysize": 32}
    if crs is not None:
        profile.update(crs=crs, transform=transform)
    if nodata is not None:
        profile["nodata"] = nodata
    with rasterio.open(path, "w", **profile) as ds:
        ds.write(data)
        if tags:
            ds.update_tags(**tags)
    return path


def dsm_4326(path: Path, *, shift_deg: float = 0.0, value: float | None = None, bands: int = 1,
             tags: dict[str, str] | None = None) -> Path:
    """A float32 DSM in EPSG:4326 at ~0.0007° (coarser than the scene) over the scene's west half and beyond,
    with a nodata hole; ``shift_deg`` moves it east."""
    left, bottom, right, top = transform_bounds("EPSG:32633", "EPSG:4326", *SCENE_BOUNDS)
    res = 0.0007
    x0, y0 = left - 0.01 + shift_deg, top + 0.01
    w, h = int(((left + right) / 2 - (left - 0.01)) / res), int((y0 - bottom - 0.005) / res)
    rng = np.random.default_rng(7)
    dem = (100 + 50 * rng.random((bands, h, w)) + np.add.outer(np.arange(h), np.arange(w))[None]).astype("float32")
    if value is not None:
        dem[:] = value
    dem[:, 20:26, 20:26] = -9999  # a hole of nodata inside the scene
    return write_raster(path, dem, "EPSG:4326", from_origin(x0, y0, res, res), nodata=-9999, tags=tags)


def classes_3857(path: Path) -> Path:
    """A uint8 class map (classes 1, 3, 7; no nodata) in EPSG:3857 at 20 m covering the scene's south-east."""
    left, bottom, right, top = transform_bounds("EPSG:32633", "EPSG:3857", *SCENE_BOUNDS)
    res = 20.0
    x0, y0 = (left + right) / 2, (bottom + top) / 2 + 1000
    w, h = int((right - x0 + 2000) / res), int((y0 - bottom + 2000) / res)
    rng = np.random.default_rng(3)
    cls = np.array([1, 3, 7], dtype="uint8")[rng.integers(0, 3, (1, h // 8 + 1, w // 8 + 1))]
    cls = np.repeat(np.repeat(cls, 8, axis=1), 8, axis=2)[:, :h, :w]
    return write_raster(path, np.ascontiguousarray(cls), "EPSG:3857", from_origin(x0, y0, res, res))


def gdal_warp(src: Path, tmp: Path, method: str, dtype: str, nodata: float,
              grid: tuple[Any, int, int] = (SCENE_T, H, W)) -> np.ndarray:
    """GDAL's warp of ``src`` onto a whole EPSG:32633 grid ``(transform, height, width)`` (exact
    transformations), as a ``(band, y, x)`` array."""
    t, h, w = grid
    if shutil.which("gdalwarp"):
        out = tmp / f"expected_{src.stem}_{method}.tif"
        bounds = (t.c, t.f + h * t.e, t.c + w * t.a, t.f)
        subprocess.run(["gdalwarp", "-q", "-overwrite", "-et", "0", "-r", {"nearest": "near"}.get(method, method),
                        "-t_srs", "EPSG:32633", "-te", *map(str, bounds), "-ts", str(w), str(h), "-ot",
                        {"float32": "Float32", "uint16": "UInt16"}[dtype], "-dstnodata", str(nodata),
                        str(src), str(out)], check=True)
        with rasterio.open(out) as ds:
            return ds.read()
    with rasterio.open(src) as s, WarpedVRT(s, crs=CRS.from_epsg(32633), transform=t, width=w, height=h,
                                             resampling=Resampling[method], nodata=nodata, dtype=dtype,
                                             tolerance=1e-12) as vrt:
        return vrt.read()


def stored(lake: Lake, sid: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The layer as the Zarr array and as the COG beside the cube."""
    d = lake.scene_dir(sid)
    z = np.asarray(zarr.open_array(str(d / f"{sid}.zarr"), path=f"aux_{name}", mode="r")[...])
    with rasterio.open(d / f"{sid}.aux_{name}.tif") as ds:
        return z, ds.read()


# -- values: GDAL's warp, window by window ---------------------------------------------------------
@pytest.mark.parametrize("method", ["bilinear", "nearest", "cubic"])
def test_dsm_in_4326_stored_equals_gdal_warp(tmp_path: Path, method: str) -> None:
    src, lake = dsm_4326(tmp_path / "dsm.tif"), Lake(tmp_path / "lake")
    (r,) = ingest([write_scene(tmp_path / "scene.tif")], lake, IngestOptions(chunk=CHUNK),
                  aux=[AuxSpec("dsm", src, resampling=method)])
    assert r.outcome is Outcome.INGESTED, r.message
    assert r.scene_id is not None
    z, cog = stored(lake, r.scene_id, "dsm")
    expected = gdal_warp(src, tmp_path, method, "float32", math.nan)[0]
    assert z.dtype == np.float32
    np.testing.assert_array_equal(z, expected)  # NaN where GDAL gives NaN, the same values elsewhere
    np.testing.assert_array_equal(cog[0], z)
    covered = ~np.isnan(z)
    assert 0.2 < covered.mean() < 0.7  # the west part only: outside is NaN, never 0
    assert not (z[covered] < 100).any()  # the nodata -9999 never leaks into the values
    assert np.isnan(z[:, -20:]).all()
    (a,) = r.aux
    assert a.aligned
    assert a.valid_fraction == pytest.approx(covered.mean(), abs=1e-6)


def test_windows_narrower_than_the_grid_give_the_same_layer(tmp_path: Path) -> None:
    src = dsm_4326(tmp_path / "dsm.tif")
    meta = SceneMetadata(path="s.tif", files=("s.tif",), format="GTiff", count=1, height=H, width=W, dtype="int16",
                         crs_wkt=CRS.from_epsg(32633).to_wkt(), transform=tuple(SCENE_T)[:6])
    (plan,), failed = plan_aux([AuxSpec("dsm", src)], meta, None, Limits())
    assert not failed
    layers = []
    for budget in (1, 10**9):  # one chunk per window, and whole chunk rows
        staged = tmp_path / f"staged_{budget}"
        staged.mkdir()
        target = LayerTarget(staged, "s", None, True, CHUNK, H, W, meta.transform, meta.crs_wkt,
                             window_bytes=budget)
        layer = write_aux(plan, target)
        assert layer.zarr_array is None
        with rasterio.open(staged / "s.aux_dsm.tif") as ds:
            layers.append(ds.read(1))
            assert ds.block_shapes == [(CHUNK, CHUNK)]
    np.testing.assert_array_equal(layers[0], layers[1])
    np.testing.assert_array_equal(layers[0], gdal_warp(src, tmp_path, "bilinear", "float32", math.nan)[0])


def test_categorical_layer_nearest_only_source_classes(tmp_path: Path) -> None:
    src, lake = classes_3857(tmp_path / "lc.tif"), tmp_path / "lake"
    scene = write_scene(tmp_path / "scene.tif")
    res = runner.invoke(app, ["ingest", "--lake", str(lake), "--chunk", str(CHUNK), "--aux", f"lc={src}:categorical",
                              str(scene)])
    assert res.exit_code == 0, res.output
    assert "aux 'lc' aligned from" in res.output
    assert "aux layers: 1 aligned" in res.output
    z, cog = stored(Lake(lake), "scene", "lc")
    assert z.dtype == np.uint16  # uint8 without nodata: one type wider, fill 65535 no class can take
    np.testing.assert_array_equal(z, gdal_warp(src, tmp_path, "nearest", "uint16", 65535)[0])
    np.testing.assert_array_equal(cog[0], z)
    assert set(np.unique(z)) == {1, 3, 7, 65535}
    rec = read_scene_record(Lake(lake).scene_dir("scene") / SCENE_RECORD_FILE)
    (layer,) = rec.aux
    assert (layer.kind, layer.resampling, layer.dtype, layer.fill_value) == ("categorical", "nearest", "uint16", 65535)
    assert layer.classes == [1, 3, 7]
    assert layer.source == str(src.resolve())
    assert CRS.from_wkt(layer.source_crs or "") == CRS.from_epsg(3857)
    assert layer.zarr_array == "aux_lc"
    assert layer.cog == "scene.aux_lc.tif"


def test_multiband_aux_is_band_y_x(tmp_path: Path) -> None:
    src, lake = dsm_4326(tmp_path / "s2.tif", bands=2), Lake(tmp_path / "lake")
    (r,) = ingest([write_scene(tmp_path / "scene.tif")], lake, IngestOptions(chunk=CHUNK),
                  aux=[AuxSpec("s2", src)])
    assert r.scene_id is not None
    arr = zarr.open_array(str(lake.scene_dir(r.scene_id) / f"{r.scene_id}.zarr"), path="aux_s2", mode="r")
    assert arr.shape == (2, H, W)
    assert arr.chunks == (2, CHUNK, CHUNK)
    assert json.loads((lake.scene_dir(r.scene_id) / f"{r.scene_id}.zarr/aux_s2/zarr.json").read_text())[
        "dimension_names"] == ["aux_s2_band", "y", "x"]
    z, cog = stored(lake, r.scene_id, "s2")
    np.testing.assert_array_equal(z, gdal_warp(src, tmp_path, "bilinear", "float32", math.nan))
    np.testing.assert_array_equal(cog, z)


# -- the products open in the usual tools, in a fresh process ---------------------------------------
_READER = """
import json, sys, rasterio, xarray as xr, zarr
zpath, cog = sys.argv[1], sys.argv[2]
ds = xr.open_zarr(zpath)
v = ds["aux_dsm"]
arr = zarr.open_group(zpath, mode="r")["aux_dsm"]
with rasterio.open(cog) as c:
    info = {"crs": c.crs.to_epsg(), "nodata": str(c.nodata), "blocks": c.block_shapes, "transform": list(c.transform)[:6]}
print(json.dumps({"vars": sorted(ds.data_vars), "dims": list(v.dims), "dtype": str(v.dtype), "chunks": list(arr.chunks),
                  "fill": str(arr.fill_value), "attrs": {k: v.attrs[k] for k in v.attrs if k.startswith("cubelake:")},
                  "grid_mapping": v.attrs.get("grid_mapping"), "data_dims": list(ds["data"].dims),
                  "nan_count": int(v.isnull().sum()), "cog": info}))
"""


def test_layer_opens_in_xarray_zarr_and_rasterio_in_a_fresh_process(tmp_path: Path) -> None:
    src, lake = dsm_4326(tmp_path / "dsm.tif"), Lake(tmp_path / "lake")
    (r,) = ingest([write_scene(tmp_path / "scene.tif")], lake, IngestOptions(chunk=CHUNK), aux=[AuxSpec("dsm", src)])
    assert r.scene_id is not None
    d = lake.scene_dir(r.scene_id)
    cog = d / f"{r.scene_id}.aux_dsm.tif"
    out = subprocess.run([sys.executable, "-c", _READER, str(d / f"{r.scene_id}.zarr"), str(cog)],
                         capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    assert doc["vars"] == ["aux_dsm", "data"]
    assert doc["dims"] == ["y", "x"]
    assert doc["data_dims"] == ["band", "y", "x"]
    assert doc["dtype"] == "float32"
    assert doc["chunks"] == [CHUNK, CHUNK]
    assert doc["fill"] == "nan"
    assert doc["grid_mapping"] == "spatial_ref"
    attrs = doc["attrs"]
    assert attrs["cubelake:source"] == str(src.resolve())
    assert (attrs["cubelake:kind"], attrs["cubelake:resampling"]) == ("continuous", "bilinear")
    assert CRS.from_wkt(attrs["cubelake:source_crs"]) == CRS.from_epsg(4326)
    assert 0 < attrs["cubelake:valid_fraction"] < 1
    z, _ = stored(lake, r.scene_id, "dsm")
    assert doc["nan_count"] == int(np.isnan(z).sum())
    assert doc["cog"] == {"crs": 32633, "nodata": "nan", "blocks": [[CHUNK, CHUNK]], "transform": list(SCENE_T)[:6]}
    assert cog_validate(str(cog), quiet=True)[0]


# -- choosing among dated candidates ---------------------------------------------------------------
def dated_candidates(folder: Path) -> dict[str, Path]:
    folder.mkdir()
    return {
        "a": dsm_4326(folder / "dsm_20220720.tif", value=120.0),
        "b": dsm_4326(folder / "dsm_2022-07-23.tif", value=123.0),
        "c": dsm_4326(folder / "dsm_20220801.tif", value=101.0),
        "d": dsm_4326(folder / "dsm_tagged.tif", value=125.0, tags={"TIFFTAG_DATETIME": "2022:07:25 06:00:00"}),
    }


def test_time_matching_takes_the_nearest_and_reports_the_others(tmp_path: Path) -> None:
    cands = dated_candidates(tmp_path / "dsms")
    scene = write_scene(tmp_path / "scene.tif", tags={"start_time": SCENE_TIME})
    res = runner.invoke(app, ["ingest", "--lake", str(tmp_path / "lake"), "--chunk", str(CHUNK), "--aux",
                              f"dsm={tmp_path / 'dsms'}/dsm_*.tif", "--aux-max-time-delta", "3d", str(scene)])
    assert res.exit_code == 0, res.output
    assert f"aux 'dsm' aligned from {cands['b'].resolve()}" in res.output
    z, _ = stored(Lake(tmp_path / "lake"), "scene", "dsm")
    assert set(np.unique(z[~np.isnan(z)])) == {123.0}  # 2022-07-23 is 0.45 d before the scene
    rec = read_scene_record(Lake(tmp_path / "lake").scene_dir("scene") / SCENE_RECORD_FILE)
    (layer,) = rec.aux
    assert layer.time_delta_s == pytest.approx(-(10 * 3600 + 45 * 60 + 27))  # end of 07-23 to 10:45:26
    assert layer.source_datetime == "2022-07-23T00:00:00Z/2022-07-23T23:59:59Z"
    why = {Path(c.path).name: (c.code, c.reason or "") for c in layer.candidates_rejected}
    assert set(why) == {"dsm_20220720.tif", "dsm_20220801.tif", "dsm_tagged.tif"}
    assert why["dsm_20220720.tif"][0] == "aux_no_time_match"
    assert "more than 3 d" in why["dsm_20220720.tif"][1]
    assert "more than 3 d" in why["dsm_20220801.tif"][1]
    assert "further than the one taken" in why["dsm_tagged.tif"][1]  # TIFFTAG_DATETIME 07-25 06:00: +0.80 d
    assert "passed over" in res.output
    assert "dsm_tagged.tif" in res.output


def test_no_candidate_in_time_is_a_warning_and_the_scene_is_published(tmp_path: Path) -> None:
    dated_candidates(tmp_path / "dsms")
    scene = write_scene(tmp_path / "scene.tif", tags={"start_time": SCENE_TIME})
    lake = Lake(tmp_path / "lake")
    (r,) = ingest([scene], lake, IngestOptions(chunk=CHUNK),
                  aux=[AuxSpec("dsm", tmp_path / "dsms", max_time_delta=timedelta(hours=6))])
    assert r.outcome is Outcome.INGESTED
    (w,) = [i for i in r.report.warnings if i.code is Code.AUX_NO_TIME_MATCH]
    assert "none of 4 candidate(s) fits" in w.message
    assert "published without it" in w.message
    (a,) = r.aux
    assert not a.aligned
    assert len(a.rejected) == 4
    assert r.scene_id is not None
    assert "aux_dsm" not in zarr.open_group(str(lake.scene_dir(r.scene_id) / "scene.zarr"), mode="r")
    assert not list(lake.scene_dir(r.scene_id).glob("*.aux_*"))


# -- layers that cannot be aligned: reported, the scene still published ----------------------------
def test_not_overlapping_and_not_georeferenced_are_warnings(tmp_path: Path) -> None:
    far = dsm_4326(tmp_path / "far.tif", shift_deg=0.5)
    plain = write_raster(tmp_path / "plain.tif", np.ones((1, 40, 40), "float32"), None, None)
    scene = write_scene(tmp_path / "scene.tif")
    lake = tmp_path / "lake"
    res = runner.invoke(app, ["ingest", "--lake", str(lake), "--chunk", str(CHUNK), "--format", "text",
                              "--aux", f"far={far}", "--aux", f"plain={plain}:nearest", str(scene)])
    assert res.exit_code == 0, res.output  # warnings do not fail the run
    assert "warning: aux_no_overlap: aux 'far' not aligned" in res.output
    assert "warning: aux_not_georeferenced: aux 'plain' not aligned" in res.output
    assert "has no CRS" in res.output
    assert "aux layers: 0 aligned, 2 not aligned" in res.output
    d = Lake(lake).scene_dir("scene")
    assert sorted(p.name for p in d.iterdir()) == ["item.json", "scene.json", "scene.tif", "scene.zarr",
                                                   "thumbnail.png", "validation.json"]
    report = json.loads((d / "validation.json").read_text())
    assert {w["code"] for w in report["warnings"]} >= {"aux_no_overlap", "aux_not_georeferenced"}
    rec = read_scene_record(d / SCENE_RECORD_FILE)
    assert rec.aux == []
    assert "aux" not in json.loads((d / SCENE_RECORD_FILE).read_text())


def test_json_output_lists_each_layer(tmp_path: Path) -> None:
    src, far = dsm_4326(tmp_path / "dsm.tif"), dsm_4326(tmp_path / "far.tif", shift_deg=0.5)
    res = runner.invoke(app, ["ingest", "--lake", str(tmp_path / "lake"), "--chunk", str(CHUNK), "--format", "json",
                              "--aux", f"dsm={src}:cubic", "--aux", f"far={far}", str(write_scene(tmp_path / "s.tif"))])
    assert res.exit_code == 0, res.output
    (result,) = json.loads(res.output)["results"]
    layers = {a["name"]: a for a in result["aux"]}
    assert layers["far"]["aligned"] is False
    assert layers["far"]["code"] == "aux_no_overlap"
    assert layers["dsm"]["aligned"] is True
    assert layers["dsm"]["source"] == str(src.resolve())


def test_scene_without_georeferencing_cannot_take_aux(tmp_path: Path) -> None:
    scene = tmp_path / "pixels.tif"
    with rasterio.open(scene, "w", driver="GTiff", width=W, height=H, count=3, dtype="int16") as ds:
        ds.write(hsi_cube(3, H, W))
    (r,) = ingest([scene], Lake(tmp_path / "lake"), IngestOptions(chunk=CHUNK),
                  aux=[AuxSpec("dsm", dsm_4326(tmp_path / "dsm.tif"))])
    assert r.outcome is Outcome.INGESTED
    (w,) = [i for i in r.report.warnings if i.code is Code.AUX_NOT_GEOREFERENCED]
    assert "the scene has no geotransform" in w.message


def test_damaged_aux_leaves_nothing_half_written(tmp_path: Path) -> None:
    src = dsm_4326(tmp_path / "dsm.tif")
    os.truncate(src, src.stat().st_size // 2)  # the header reads; half of the tiles are gone
    good = dsm_4326(tmp_path / "good.tif")
    lake = Lake(tmp_path / "lake")
    (r,) = ingest([write_scene(tmp_path / "scene.tif")], lake, IngestOptions(chunk=CHUNK),
                  aux=[AuxSpec("bad", src), AuxSpec("good", good)])
    assert r.outcome is Outcome.INGESTED, r.message
    (w,) = [i for i in r.report.warnings if i.code is Code.AUX_UNREADABLE]
    assert "damaged or truncated" in w.message
    assert r.scene_id is not None
    d = lake.scene_dir(r.scene_id)
    group = zarr.open_group(str(d / f"{r.scene_id}.zarr"), mode="r")
    assert "aux_bad" not in group
    assert "aux_good" in group
    assert not (d / f"{r.scene_id}.aux_bad.tif").exists()
    assert [a.name for a in read_scene_record(d / SCENE_RECORD_FILE).aux] == ["good"]


def test_other_scenes_go_on_and_adding_aux_rebuilds(tmp_path: Path) -> None:
    lake = Lake(tmp_path / "lake")
    scenes = [write_scene(tmp_path / "one.tif"), write_scene(tmp_path / "two.tif")]
    first = ingest(scenes, lake, IngestOptions(chunk=CHUNK))
    assert [r.outcome for r in first] == [Outcome.INGESTED] * 2
    spec = AuxSpec("dsm", dsm_4326(tmp_path / "dsm.tif"))
    again = ingest(scenes, lake, IngestOptions(chunk=CHUNK), aux=[spec])
    assert [r.outcome for r in again] == [Outcome.INGESTED] * 2  # the aux layer changes the config: rebuilt
    assert all(a.aligned for r in again for a in r.aux)
    third = ingest(scenes, lake, IngestOptions(chunk=CHUNK), aux=[spec])
    assert [r.outcome for r in third] == [Outcome.UNCHANGED] * 2


def test_hostile_aux_inputs_are_refused_per_layer(tmp_path: Path) -> None:
    text = tmp_path / "notes.tif"
    text.write_text("not a raster")
    fifo = tmp_path / "pipe.tif"
    os.mkfifo(fifo)  # opening it for reading would block forever
    big = write_raster(tmp_path / "big.tif", np.zeros((1, 400, 400), "float32"), "EPSG:32633", SCENE_T)
    (r,) = ingest([write_scene(tmp_path / "scene.tif")], Lake(tmp_path / "lake"),
                  IngestOptions(chunk=CHUNK, limits=Limits(max_bytes=200_000)),
                  aux=[AuxSpec("text", text), AuxSpec("fifo", fifo), AuxSpec("big", big)])
    assert r.outcome is Outcome.INGESTED, r.message
    why = {a.name: (a.code, a.message) for a in r.aux}
    assert why["text"][0] is Code.AUX_UNREADABLE
    assert "GDAL cannot read it as a raster" in why["text"][1]
    assert why["fifo"][0] is Code.AUX_UNREADABLE
    assert "not a regular file" in why["fifo"][1]
    assert why["big"][0] is Code.AUX_TOO_LARGE
    assert "640000 bytes" in why["big"][1]
    assert not any(a.aligned for a in r.aux)


def test_usage_error_in_a_real_process_has_no_traceback(tmp_path: Path) -> None:
    res = run_cli("ingest", "--lake", str(tmp_path / "lake"), "--aux", "dsm:/x.tif", str(tmp_path / "scene.tif"))
    assert res.returncode == 2
    out = no_traceback(res)
    assert "--aux" in out
    assert "expected NAME=PATH" in " ".join(re.sub(r"[│╭╮╰╯─]", " ", out).split())


# -- usage errors: exit 2, the option named, no traceback -------------------------------------------
@pytest.mark.parametrize(
    ("aux", "extra", "needle"),
    [
        ("dsm", [], "expected NAME=PATH"),
        ("dsm=", [], "expected NAME=PATH"),
        ("DSM={dsm}", [], "a-z, 0-9 and _"),
        ("data={dsm}", [], "reserved"),
        ("a_name_much_longer_than_thirty_two_chars={dsm}", [], "1-32 characters"),
        ("lc={dsm}:bilinear:categorical", [], "categorical layer is resampled with nearest"),
        ("dsm={missing}", [], "does not exist"),
        ("dsm={folder}/*.nothing", [], "matches no file"),
        ("dsm={dsm}", ["--aux", "dsm={dsm}"], "given twice"),
        ("dsm={dsm}", ["--aux-max-time-delta", "soon"], "give a duration"),
    ],
)
def test_bad_aux_option_is_a_usage_error(tmp_path: Path, aux: str, extra: list[str], needle: str) -> None:
    dsm = write_raster(tmp_path / "dsm.tif", np.ones((1, 8, 8), "float32"), "EPSG:4326", from_origin(15, 52, 0.01, 0.01))
    values = {"dsm": dsm, "missing": tmp_path / "nope.tif", "folder": tmp_path}
    args = [a.format(**values) for a in ["--aux", aux, *extra]]
    res = runner.invoke(app, ["ingest", "--lake", str(tmp_path / "lake"), *args, str(tmp_path / "scene.tif")])
    assert res.exit_code == 2, res.output
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", res.output).split())  # rich wraps the message in a box
    assert "--aux" in text
    assert needle in text
    assert "Traceback" not in text
    assert not (tmp_path / "lake").exists()


# -- pure parts ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "name", "path", "method", "kind"),
    [
        ("dsm=/d/dsm.tif", "dsm", "/d/dsm.tif", "bilinear", "continuous"),
        ("dsm=/d/dsm.tif:cubic", "dsm", "/d/dsm.tif", "cubic", "continuous"),
        ("lc=/d/lc.tif:categorical", "lc", "/d/lc.tif", "nearest", "categorical"),
        ("lc=/d/lc.tif:nearest:categorical", "lc", "/d/lc.tif", "nearest", "categorical"),
        ("s2=/d/a:b/s2.tif:nearest", "s2", "/d/a:b/s2.tif", "nearest", "continuous"),
        ("x=/d/x.tif:notamethod", "x", "/d/x.tif:notamethod", "bilinear", "continuous"),
    ],
)
def test_parse_aux_arg(text: str, name: str, path: str, method: str, kind: str) -> None:
    spec = parse_aux_arg(text)
    assert (spec.name, str(spec.path), spec.method, spec.kind) == (name, path, method, kind)


@pytest.mark.parametrize(("text", "seconds"), [("3d", 259200), ("12h", 43200), ("1d12h", 129600), ("90m", 5400),
                                                 ("30s", 30), ("2w", 1209600), ("45", 45), ("1.5d", 129600)])
def test_parse_time_delta(text: str, seconds: float) -> None:
    assert parse_time_delta(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["", "soon", "3x", "-3d", "3d soon"])
def test_parse_time_delta_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_time_delta(text)


def test_raster_time_sources() -> None:
    day = datetime(2022, 7, 23, tzinfo=UTC)
    assert raster_time({"ACQUISITION_DATETIME": "2022-07-24T10:00:00Z"}, "x_20200101.tif").start == \
        datetime(2022, 7, 24, 10, tzinfo=UTC)  # the tag wins over the name
    assert raster_time({"TIFFTAG_DATETIME": "2022:07:25 06:00:00"}, "x.tif").start == datetime(2022, 7, 25, 6, tzinfo=UTC)
    span = raster_time({}, "dem_20220723.tif")
    assert span is not None
    assert (span.start, span.end) == (day, day + timedelta(days=1, seconds=-1))
    assert raster_time({}, "dem_2022-07-23.tif") == span
    assert raster_time({}, "S2_20220723T104031_B04.tif").start == datetime(2022, 7, 23, 10, 40, 31, tzinfo=UTC)
    assert raster_time({}, "copernicus_dsm_30m.tif") is None
    assert raster_time({}, "tile_20221340.tif") is None  # month 13: no date
    assert raster_time({"TIFFTAG_DATETIME": "garbage"}, "x.tif") is None


def test_select_candidate_rules() -> None:
    from cubelake.ingest._aux_candidates import AuxSource, Probed, TimeSpan

    def cand(name: str, when: datetime | None, overlap: float = 0.5) -> Probed:
        src = AuxSource(name, 1, 1, "", (1, 0, 0, 0, -1, 0), 1, 1, 1, "float32", None, ("b",),
                        TimeSpan(when, when) if when else None, (0, 0, 1, 1))
        return Probed(name, src, None, overlap)

    t = datetime(2022, 7, 24, 12, tzinfo=UTC)
    scene = TimeSpan(t, t)
    near, far, static = cand("near", t + timedelta(hours=5)), cand("far", t - timedelta(days=4)), cand("dem", None)
    c = select_candidate([far, near, static], scene, timedelta(days=3), several=True)
    assert c.chosen is near
    assert c.time_delta_s == 5 * 3600
    assert {r.path: r.code for r in c.rejected} == {"far": "aux_no_time_match", "dem": "aux_no_time_match"}
    c = select_candidate([far, static], scene, timedelta(hours=1), several=True)
    assert c.chosen is static  # undated layers are always acceptable
    c = select_candidate([far], scene, None, several=False)
    assert c.chosen is far  # a single file with no limit: any time
    assert c.time_delta_s == -4 * 86400
    c = select_candidate([far], None, None, several=True)
    assert c.chosen is None
    assert c.code is Code.AUX_NO_TIME_MATCH
    assert "acquisition time is unknown" in (c.reason or "")
    c = select_candidate([cand("a", None, 0.2), cand("b", None, 0.9), cand("off", None, 0.0)], scene, None, True)
    assert c.chosen is not None
    assert c.chosen.path == "b"
    assert {r.path: r.code for r in c.rejected} == {"a": "aux_no_overlap", "off": "aux_no_overlap"}


@pytest.mark.parametrize(
    ("kind", "dtype", "nodata", "expected"),
    [
        ("continuous", "int16", -9999.0, ("float32", math.nan)),
        ("continuous", "float64", None, ("float64", math.nan)),
        ("categorical", "uint8", 0.0, ("uint8", 0.0)),
        ("categorical", "uint8", None, ("uint16", 65535.0)),
        ("categorical", "int16", None, ("int32", -(2.0**31))),
        ("categorical", "uint8", 300.0, ("uint16", 65535.0)),  # a nodata the type cannot hold
        ("categorical", "float32", None, ("float32", math.nan)),
    ],
)
def test_output_encoding(kind: str, dtype: str, nodata: float | None, expected: tuple[str, float]) -> None:
    got = output_encoding(kind, dtype, nodata)
    assert got[0] == expected[0]
    assert (math.isnan(got[1]) and math.isnan(expected[1])) or got[1] == expected[1]


def test_warp_windows_cover_the_grid_once_chunk_aligned() -> None:
    grid = ChunkGrid.square(150, 170, 64)
    for budget in (1, 64 * 64 * 4 * 2, 10**9):
        wins = list(warp_windows(grid, 4, budget))
        seen = np.zeros((150, 170), int)
        for w in wins:
            assert grid.is_aligned(w)
            seen[w.slices()] += 1
        assert (seen == 1).all()
    assert next(iter(warp_windows(grid, 4, 10**9))) == Window(0, 0, 64, 170)
    assert len(list(warp_windows(grid, 4, 1))) == grid.n_chunks


# -- a real scene ----------------------------------------------------------------------------------
def test_real_enmap_tile_with_real_landcover_and_a_synthetic_dsm(tmp_path: Path, real: Path) -> None:
    tile = real / "hsi_enmap_potsdam/enmap_potsdam_tile_96_0.tif"
    landcover = real / "hsi_enmap_potsdam/enmap_landcover_unstyled.tif"
    with rasterio.open(tile) as ds:
        bounds, t = ds.bounds, ds.transform
    left, bottom, right, top = transform_bounds("EPSG:32633", "EPSG:4326", *bounds)
    dsm = write_raster(tmp_path / "dsm.tif", np.arange(1, 41 * 31 + 1, dtype="float32").reshape(1, 41, 31),
                    "EPSG:4326", from_origin(left - 0.002, top + 0.001, (right - left) / 20, (top - bottom) / 30))
    lake = Lake(tmp_path / "lake")
    (r,) = ingest([tile], lake, IngestOptions(chunk=16),
                  aux=[AuxSpec("landcover", landcover, kind="categorical"), AuxSpec("dsm", dsm)])
    assert r.outcome is Outcome.INGESTED, r.message
    assert [a.aligned for a in r.aux] == [True, True]
    assert r.scene_id is not None
    lc, lc_cog = stored(lake, r.scene_id, "landcover")
    with rasterio.open(landcover) as ds:  # same CRS and pixel grid: nearest is a plain cut-out
        col, row = (~ds.transform) @ (t.c, t.f)
        expected = ds.read(1)[int(row) : int(row) + 32, int(col) : int(col) + 32]
    np.testing.assert_array_equal(lc, expected)
    np.testing.assert_array_equal(lc_cog[0], expected)
    rec = read_scene_record(lake.scene_dir(r.scene_id) / SCENE_RECORD_FILE)
    assert rec.aux[0].classes == sorted(np.unique(expected).tolist())
    z, _ = stored(lake, r.scene_id, "dsm")
    assert z.shape == (32, 32)
    np.testing.assert_array_equal(z, gdal_warp(dsm, tmp_path, "bilinear", "float32", math.nan, (t, 32, 32))[0])
    assert not np.isnan(z).any()  # the DSM covers the tile
    assert rec.aux[1].valid_fraction == 1.0
