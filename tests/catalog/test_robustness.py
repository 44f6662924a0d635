"""Hard cases: odd values, damaged leftovers, busy writers, and items the index cannot take."""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest
import rasterio
from shapely.geometry import MultiPolygon, box

from cubelake.catalog import CatalogIndex, LakeCatalog, Query
from cubelake.catalog.items import item_from_record
from cubelake.catalog.validate import validate_stac
from cubelake.ingest import IngestOptions, ingest

from ..conftest import hsi_cube, write_geotiff
from .conftest import synth_item


def _one_scene_lake(tmp_path: Path, name: str = "a") -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    write_geotiff(src / f"{name}.tif", hsi_cube(4, 32, 32), nodata=-9999)
    lake = tmp_path / "lake"
    [r] = ingest([src / f"{name}.tif"], lake, IngestOptions(products=("cog",), workers=1))
    assert r.outcome == "ingested", r.message
    return lake


def test_a_nan_tag_becomes_text_and_the_item_stays_json(tmp_path: Path) -> None:
    lake = _one_scene_lake(tmp_path)
    record = json.loads((lake / "scenes" / "a" / "scene.json").read_text())
    record["tags"] = {"CLOUD": "nan", "SUN": "inf", "WRS": "-1", "AZ": "-120.5", "EL": "33.25"}
    record["profile"]["settings"]["stac"] = {"tag_properties": {
        "eo:cloud_cover": "WRS", "x:cloud": "CLOUD", "view:sun_elevation": "SUN", "view:sun_azimuth": "AZ",
        "view:off_nadir": "EL", "view:azimuth": "CLOUD"}}
    item = item_from_record(record)
    text = json.dumps(item, allow_nan=False)  # raises on NaN/Infinity
    props = json.loads(text)["properties"]
    assert props["x:cloud"] == "nan"
    # values their extension's schema forbids are left out, never published invalid
    assert "view:sun_elevation" not in props  # "inf" is no angle
    assert "view:azimuth" not in props  # nor is "nan"
    assert "eo:cloud_cover" not in props  # -1 (Landsat's "not computed") is outside 0..100
    assert props["view:sun_azimuth"] == 239.5  # Landsat's -180..180 as the view extension's 0..360
    assert props["view:off_nadir"] == 33.25
    assert validate_stac(item) == []
    with CatalogIndex(tmp_path / "i.sqlite") as idx:
        idx.upsert(item)
        assert [h.id for h in idx.search(Query(filters=("x:cloud=nan",)))] == ["a"]


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("datetime", "yesterday", "yesterday"),
    ("bbox", [1, 2, 3], "not indexable"),
])
def test_reindex_names_and_skips_an_item_the_index_cannot_take(tmp_path: Path, field: str, value: object,
                                                               needle: str) -> None:
    lake = _one_scene_lake(tmp_path)
    shutil.copytree(lake / "scenes" / "a", lake / "scenes" / "b")
    path = lake / "scenes" / "b" / "item.json"
    item = json.loads(path.read_text())
    item["id"] = "b"
    if field == "datetime":
        item["properties"]["datetime"] = value
        item["properties"]["cubelake:datetime_source"] = "metadata"
    else:
        item["bbox"] = value
        item["geometry"] = {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 0]]]}
    path.write_text(json.dumps(item))
    with LakeCatalog(lake) as cat:
        report = cat.reindex()
        assert [p for p, _ in report.corrupt] == [str(path)]
        assert needle in report.corrupt[0][1]
        assert [h.id for h in cat.search(Query())] == ["a"]
    assert not list(lake.glob(".catalog.sqlite.*"))  # no temporary index left behind


def test_a_markers_temp_file_left_by_a_kill_does_not_stop_ingest(tmp_path: Path) -> None:
    lake = _one_scene_lake(tmp_path)
    leftover = lake / ".pending" / ".a.999999.deadbeef.tmp"  # atomic_write_text's name, pid long gone
    leftover.write_text("999999\n")
    src = tmp_path / "src"
    write_geotiff(src / "b.tif", hsi_cube(4, 32, 32, seed=1), nodata=-9999)
    [r] = ingest([src / "b.tif"], lake, IngestOptions(products=("cog",), workers=1))
    assert r.outcome == "ingested", r.message
    assert not leftover.exists()
    with LakeCatalog(lake) as cat:
        assert [h.id for h in cat.search(Query())] == ["a", "b"]


def test_a_search_does_not_wait_for_a_writer(tmp_path: Path) -> None:
    lake = _one_scene_lake(tmp_path)
    writer = sqlite3.connect(lake / "catalog.sqlite", isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # another process in the middle of publishing
    found: list[list[str]] = []
    t0 = time.perf_counter()
    thread = threading.Thread(target=lambda: found.append([h.id for h in LakeCatalog(lake).search(Query())]))
    thread.start()
    thread.join(timeout=10)
    waited = time.perf_counter() - t0
    writer.execute("ROLLBACK")
    writer.close()
    assert found == [["a"]]
    assert waited < 5


def test_collection_extent_holds_items_across_the_antimeridian(tmp_path: Path) -> None:
    with CatalogIndex(tmp_path / "i.sqlite") as idx:
        idx.upsert(synth_item("plain", geometry=box(10, 10, 11, 11), datetime="2020-01-01T00:00:00Z"))
        crossing = MultiPolygon([box(179, 0, 180, 1), box(-180, 0, -179, 1)])
        idx.upsert(synth_item("crossing", geometry=crossing, bbox=(179, 0, -179, 1), datetime="2020-01-01T00:00:00Z"))
        w, s, e, n = idx.collection_summary("synth").bbox or (0, 0, 0, 0)
    assert (w, e) == (-180.0, 180.0)
    assert s <= 0
    assert n >= 11


def test_query_takes_a_lone_string_as_one_value(tmp_path: Path) -> None:
    with CatalogIndex(tmp_path / "i.sqlite") as idx:
        idx.upsert(synth_item("x", collection="enmap-l2a", datetime="2020-01-01T00:00:00Z",
                              properties={"eo:cloud_cover": 5}))
        idx.upsert(synth_item("y", collection="other", datetime="2021-01-01T00:00:00Z",
                              properties={"eo:cloud_cover": 50}))
        assert [h.id for h in idx.search(Query(collections="enmap-l2a"))] == ["x"]
        assert [h.id for h in idx.search(Query(ids="y"))] == ["y"]
        assert [h.id for h in idx.search(Query(sort="-datetime"))] == ["y", "x"]
        assert [h.id for h in idx.search(Query(filters="eo:cloud_cover<10"))] == ["x"]


def test_source_asset_describes_its_own_file(tmp_path: Path, real: Path) -> None:
    """A scene with a labels file: the source asset's size and checksum are those of the scene file."""
    from blake3 import blake3

    src = real / "hsi_enmap_potsdam" / "enmap_potsdam_tile_128_0.tif"  # its labels are found in labels/
    lake = tmp_path / "lake"
    [r] = ingest([src], lake, IngestOptions(products=("cog",), workers=1))
    assert r.outcome == "ingested", r.message
    item = json.loads((lake / "scenes" / r.scene_id / "item.json").read_text())
    a = item["assets"]["source"]
    assert a["file:size"] == src.stat().st_size
    assert a["file:checksum"] == "1e20" + blake3(src.read_bytes()).hexdigest()
    assert len(a["cubelake:files"]) == 2  # the scene and its labels
    with rasterio.open(src) as ds:
        assert a["cubelake:band_count"] == ds.count
        assert a["data_type"] == ds.dtypes[0]
    assert item["properties"]["cubelake:band_count"] < a["cubelake:band_count"]  # bad bands removed


def test_an_unknown_time_is_a_validation_warning(tmp_path: Path) -> None:
    lake = _one_scene_lake(tmp_path)
    record = json.loads((lake / "scenes" / "a" / "scene.json").read_text())
    codes = [w["code"] for w in record["validation"]["warnings"]]
    assert "unknown_time" in codes
    item = json.loads((lake / "scenes" / "a" / "item.json").read_text())
    assert item["properties"]["cubelake:datetime_source"] == "unknown"
    assert "unknown_time" in [w["code"] for w in item["properties"]["cubelake:validation"]["warnings"]]
