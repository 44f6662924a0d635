"""Aux layers in the STAC item: each aux COG is an asset of its scene's item, validated offline, found by search.

The expected values are read back independently: the COG's pixels and profile (rasterio), the Zarr
store's arrays (zarr), the aux rasters' own tags, and the scene record the ingest wrote.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
import zarr
from rasterio.transform import from_origin
from rasterio.warp import transform_bounds

from cubelake.catalog import LakeCatalog, validate_stac
from cubelake.catalog.items import item_bands, item_from_record
from cubelake.catalog.validate import stac_registry
from cubelake.ingest import AuxSpec, IngestOptions, Outcome, ingest
from cubelake.lake import Lake
from cubelake.record import SCENE_RECORD_FILE, SceneRecord, read_scene_record
from tests.conftest import hsi_cube, no_traceback, run_cli, write_geotiff

H, W = 80, 96
SCENE_T = from_origin(500000.0, 5800000.0, 30.0, 30.0)
SCENE_BOUNDS = (500000.0, 5800000.0 - H * 30, 500000.0 + W * 30, 5800000.0)
SCENE_TIME = datetime(2022, 7, 24, 10, 45, 26, tzinfo=UTC)
DSM_TIME = "2022-07-22T08:00:00Z"


def _raster(path: Path, data: np.ndarray, crs: str, transform: Any, nodata: float | None,
            tags: dict[str, str] | None = None, descriptions: tuple[str, ...] = ()) -> Path:
    nb, h, w = data.shape
    with rasterio.open(path, "w", driver="GTiff", width=w, height=h, count=nb, dtype=data.dtype.name, crs=crs,
                       transform=transform, nodata=nodata) as ds:
        ds.write(data)
        if tags:
            ds.update_tags(**tags)
        for i, d in enumerate(descriptions, start=1):
            ds.set_band_description(i, d)
    return path


def _dsm(path: Path) -> Path:
    """A float32 DSM in EPSG:4326 over the scene's west half, dated two days before the scene."""
    left, bottom, right, top = transform_bounds("EPSG:32633", "EPSG:4326", *SCENE_BOUNDS)
    res = 0.0005
    w, h = int(((left + right) / 2 - left + 0.005) / res), int((top - bottom + 0.01) / res)
    dem = (120 + np.add.outer(np.arange(h), np.arange(w)))[None].astype("float32")
    return _raster(path, dem, "EPSG:4326", from_origin(left - 0.005, top + 0.005, res, res), -9999.0,
                   tags={"ACQUISITION_DATETIME": DSM_TIME})


def _classes(path: Path) -> Path:
    """A static two-band uint8 class map (classes 2, 5; nodata 0) in EPSG:32633 at 60 m over the whole scene."""
    x0, y0 = SCENE_BOUNDS[0] - 300, SCENE_BOUNDS[3] + 300
    h, w = H // 2 + 10, W // 2 + 10
    cls = np.where(np.add.outer(np.arange(h), np.arange(w)) % 2 == 0, 2, 5).astype("uint8")
    return _raster(path, np.stack([cls, cls[::-1]]), "EPSG:32633", from_origin(x0, y0, 60.0, 60.0), 0,
                   descriptions=("landcover", "landcover_flipped"))


@pytest.fixture(scope="module")
def aux_lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[Lake, str]:
    """A lake of one scene ingested with a dated DSM and a static two-band class map."""
    tmp = tmp_path_factory.mktemp("aux_items")
    scene = write_geotiff(tmp / "scene.tif", hsi_cube(3, H, W), nodata=-32768, transform=SCENE_T,
                          band_tags=[{"wavelength": str(500 + 100 * b), "wavelength_units": "nm"} for b in range(3)])
    with rasterio.open(scene, "r+") as ds:
        ds.update_tags(start_time=SCENE_TIME.strftime("%Y-%m-%dT%H:%M:%S"))
    lake = Lake(tmp / "lake")
    specs = (AuxSpec("dsm", _dsm(tmp / "dsm.tif")), AuxSpec("lc", _classes(tmp / "lc.tif"), kind="categorical"))
    (r,) = ingest([scene], lake, IngestOptions(products=("cog", "zarr"), chunk=32, aux=specs))
    assert r.outcome is Outcome.INGESTED, r.message
    assert r.scene_id is not None
    assert [a.aligned for a in r.aux] == [True, True], [a.message for a in r.aux]
    return lake, r.scene_id


def _item(lake: Lake, sid: str) -> dict[str, Any]:
    return dict(json.loads((lake.scene_dir(sid) / "item.json").read_text()))


def _record(lake: Lake, sid: str) -> SceneRecord:
    return read_scene_record(lake.scene_dir(sid) / SCENE_RECORD_FILE)


def test_each_aux_cog_is_an_asset_inside_the_scene_folder(aux_lake: tuple[Lake, str]) -> None:
    lake, sid = aux_lake
    item, folder = _item(lake, sid), lake.scene_dir(sid)
    aux_keys = sorted(k for k, a in item["assets"].items() if "auxiliary" in a["roles"])
    assert aux_keys == ["aux_dsm", "aux_lc"]
    for name in ("dsm", "lc"):
        a = item["assets"][f"aux_{name}"]
        assert a["href"] == f"./{sid}.aux_{name}.tif"
        assert (folder / a["href"][2:]).is_file()
        assert a["type"] == "image/tiff; application=geotiff; profile=cloud-optimized"
        assert a["roles"] == ["data", "auxiliary"]
        assert a["title"].startswith(f"auxiliary layer {name} (")
        assert a["cubelake:aux_name"] == name
        with rasterio.open(folder / a["href"][2:]) as ds:  # the asset says what the file holds
            assert ds.dtypes[0] == a["data_type"]
            assert ds.count == len(a.get("bands", [None]))
            assert (ds.width, ds.height) == (W, H)  # on the scene's grid: the item's proj: fields hold
            assert ds.transform == SCENE_T


def test_the_dsm_asset_describes_the_layer(aux_lake: tuple[Lake, str]) -> None:
    lake, sid = aux_lake
    a = _item(lake, sid)["assets"]["aux_dsm"]
    (layer,) = [x for x in _record(lake, sid).aux if x.name == "dsm"]
    assert "dsm.tif" in a["title"]
    assert "continuous, bilinear" in a["title"]
    assert (a["cubelake:kind"], a["cubelake:resampling"]) == ("continuous", "bilinear")
    assert a["cubelake:source"] == layer.source
    assert Path(a["cubelake:source"]).name == "dsm.tif"
    assert a["data_type"] == "float32"
    assert a["nodata"] == "nan"
    assert a["datetime"] == DSM_TIME  # the DSM's own acquisition, from its tag
    expected_delta = (datetime.fromisoformat(DSM_TIME) - SCENE_TIME).total_seconds()
    assert a["cubelake:time_delta_s"] == pytest.approx(expected_delta)
    assert "bands" not in a  # one band: data_type and nodata on the asset say it all
    assert a["cubelake:zarr_array"] == "aux_dsm"
    with rasterio.open(lake.scene_dir(sid) / a["href"][2:]) as ds:
        values = ds.read(1)
    valid = float(np.isfinite(values).mean())
    assert 0.2 < valid < 0.9  # the west half only
    assert a["statistics"]["valid_percent"] == pytest.approx(100 * valid, abs=1e-3)
    assert a["cubelake:valid_fraction"] == pytest.approx(valid, abs=1e-5)


def test_the_class_map_asset_lists_classes_bands_and_no_time(aux_lake: tuple[Lake, str]) -> None:
    lake, sid = aux_lake
    a = _item(lake, sid)["assets"]["aux_lc"]
    assert (a["cubelake:kind"], a["cubelake:resampling"]) == ("categorical", "nearest")
    assert a["data_type"] == "uint8"
    assert a["nodata"] == 0
    with rasterio.open(lake.scene_dir(sid) / a["href"][2:]) as ds:
        values = ds.read()
        assert ds.nodata == 0
    assert a["cubelake:classes"] == sorted(int(v) for v in np.unique(values[values != 0]))
    assert a["cubelake:classes"] == [2, 5]
    assert [b["name"] for b in a["bands"]] == ["landcover", "landcover_flipped"]
    assert "statistics" not in a  # the valid share is of pixels with any band valid, not STAC's per-value one
    assert not {"datetime", "start_datetime", "cubelake:time_delta_s"} & set(a)  # static: no time


def test_the_zarr_asset_names_the_aux_arrays_the_store_holds(aux_lake: tuple[Lake, str]) -> None:
    lake, sid = aux_lake
    item = _item(lake, sid)
    z = item["assets"]["zarr"]
    assert z["cubelake:aux_arrays"] == ["aux_dsm", "aux_lc"]
    group = zarr.open_group(str(lake.scene_dir(sid) / z["href"][2:]), mode="r")
    assert set(z["cubelake:aux_arrays"]) <= set(group.array_keys())
    assert "cubelake:aux_arrays" not in item["assets"]["cog"]
    # the cube's bands stay the cube's: the aux layers' bands are not taken for them
    assert [b["name"] for b in item_bands(item)] == [b["name"] for b in item["assets"]["cog"]["bands"]]
    assert len(item_bands(item)) == 3


def test_the_item_validates_against_the_official_schemas(aux_lake: tuple[Lake, str], shared_schemas: Path) -> None:
    lake, sid = aux_lake
    item = _item(lake, sid)
    assert validate_stac(item) == []
    assert validate_stac(item, stac_registry([shared_schemas])) == []
    res = run_cli("catalog", "validate", "--lake", str(lake.root), timeout=120)
    assert res.returncode == 0, no_traceback(res)


def test_a_broken_aux_asset_is_caught_by_validation(aux_lake: tuple[Lake, str]) -> None:
    """The schemas do check the aux asset's fields (a passing validation above means something)."""
    lake, sid = aux_lake
    item = _item(lake, sid)
    item["assets"]["aux_dsm"]["nodata"] = "missing"
    item["assets"]["aux_lc"]["datetime"] = "2022-07-22 08:00"
    problems = validate_stac(item)
    assert any("$.assets.aux_dsm.nodata" in p for p in problems), problems
    assert any("$.assets.aux_lc.datetime" in p for p in problems), problems


def test_catalog_get_and_search_return_the_aux_assets(aux_lake: tuple[Lake, str]) -> None:
    lake, sid = aux_lake
    with LakeCatalog(lake.root) as cat:
        got = cat.get(sid)
    assert got["assets"]["aux_dsm"]["href"] == f"./{sid}.aux_dsm.tif"
    res = run_cli("catalog", "search", "--lake", str(lake.root), "--id", sid, "--format", "json", timeout=120)
    assert res.returncode == 0, no_traceback(res)
    (feature,) = json.loads(res.stdout)["features"]
    href = feature["assets"]["aux_lc"]["href"]  # absolute in search output, usable from anywhere
    assert Path(href) == (lake.scene_dir(sid) / f"{sid}.aux_lc.tif").resolve()
    with rasterio.open(href) as ds:
        assert ds.count == 2


def test_a_record_without_aux_layers_gives_no_aux_assets(aux_lake: tuple[Lake, str]) -> None:
    lake, sid = aux_lake
    item = item_from_record(_record(lake, sid).model_copy(update={"aux": []}))
    assert set(item["assets"]) == set(_item(lake, sid)["assets"]) - {"aux_dsm", "aux_lc"}
    assert "cubelake:aux_arrays" not in item["assets"]["zarr"]
    assert validate_stac(item) == []
