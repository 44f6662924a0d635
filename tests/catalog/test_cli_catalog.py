"""``cubelake catalog`` through typer's test runner, on the real lake: formats, exit codes, messages,
and the files ``reindex`` and ``export`` write (read back with geopandas and DuckDB)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import geopandas
import pyarrow.parquet as pq
import pystac
import pytest
import rasterio
import stac_geoparquet.arrow as sga
import zarr
from shapely.geometry import shape
from typer.testing import CliRunner

from cubelake.catalog import Query
from cubelake.catalog.lake import LakeCatalog
from cubelake.cli import app

from .conftest import RealLake, bands_of

runner = CliRunner()


def cli(*args: str) -> Any:
    return runner.invoke(app, ["catalog", *args], catch_exceptions=False)


def item_files(lake: Path) -> dict[str, dict[str, Any]]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted((lake / "scenes").glob("*/item.json"))}


def search_json(lake: Path, *args: str) -> list[dict[str, Any]]:
    """The compact per-item records of ``--format summary``."""
    res = cli("search", "--lake", str(lake), "--format", "summary", *args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def with_absolute_hrefs(item: dict[str, Any], scene_dir: Path) -> dict[str, Any]:
    """What search and export should make of an item file: hrefs absolute, a self link first."""
    out = json.loads(json.dumps(item))
    for a in out["assets"].values():
        if not os.path.isabs(a["href"]):
            a["href"] = os.path.normpath(scene_dir / a["href"])
    for lk in out["links"]:
        lk["href"] = os.path.normpath(scene_dir / lk["href"])
    out["links"].insert(0, {"rel": "self", "href": str(scene_dir / "item.json"), "type": "application/geo+json"})
    return out


# -- search --------------------------------------------------------------------------------------------
def test_search_summary_json_and_table_agree(real_lake: Path, real_ingest: RealLake) -> None:
    hits = search_json(real_lake)
    ids = [h["id"] for h in hits]
    assert sorted(ids) == real_ingest.all_ids
    with LakeCatalog(real_lake) as cat:
        assert ids == [h.id for h in cat.search(Query())]
    files = item_files(real_lake)
    for h in hits:
        assert h["collection"] == files[h["id"]]["collection"]
        assert h["href"] == f"scenes/{h['id']}/item.json"
        assert h["band_count"] == len(bands_of(files[h["id"]]))

    for fmt in ("json", "geojson"):  # the same STAC ItemCollection
        res = cli("search", "--lake", str(real_lake), "--format", fmt)
        assert res.exit_code == 0, res.output
        fc = json.loads(res.stdout)
        assert fc["type"] == "FeatureCollection"
        assert fc["numberMatched"] == fc["numberReturned"] == len(ids)
        assert [f["id"] for f in fc["features"]] == ids
        # the items as on disk, with absolute hrefs and a self link
        assert fc["features"] == [with_absolute_hrefs(files[i], real_lake.resolve() / "scenes" / i) for i in ids]

    res = cli("search", "--lake", str(real_lake))
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["id", "collection", "datetime"]
    assert set(lines[1]) == {"─"}
    assert lines[-1] == f"{len(ids)} item(s)"
    rows = {line.split()[0]: line for line in lines[2:-1]}
    assert list(rows) == ids
    for sid in real_ingest.ids["enmap"]:
        assert " 2022-07-24T10:45:26Z " in rows[sid]
        assert f" {len(bands_of(files[sid]))} " in rows[sid]
    assert " unknown " in rows[real_ingest.ids["samson"][0]]
    for sid in real_ingest.ids["landsat"]:
        assert f"{files[sid]['properties']['eo:cloud_cover']:g}" in rows[sid].split()


def test_table_shows_full_datetimes(real_lake: Path, real_ingest: RealLake) -> None:
    """Landsat times have microseconds (27 characters); the table once cut them at 20."""
    files = item_files(real_lake)
    res = cli("search", "--lake", str(real_lake), "--collection", "landsat8-oli")
    assert res.exit_code == 0, res.output
    rows = res.stdout.strip().splitlines()[2:-1]
    assert len(rows) == len(real_ingest.ids["landsat"]) == 2
    for row in rows:
        sid, _, when = row.split()[:3]
        assert when == files[sid]["properties"]["datetime"]
        assert len(when) == len("2014-10-22T04:37:48.705294Z")
        assert "…" not in row


def test_search_json_is_an_item_collection_usable_from_anywhere(real_lake: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # the lake given relative to where the command runs; the hrefs must not depend on it
    monkeypatch.chdir(real_lake.parent)
    res = cli("search", "--lake", real_lake.name, "--format", "json", "--collection", "enmap-l2a")
    assert res.exit_code == 0, res.output
    ic = pystac.ItemCollection.from_dict(json.loads(res.stdout))
    assert len(ic) == 4
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for item in ic:
        assert item.get_self_href() == str(real_lake.resolve() / "scenes" / item.id / "item.json")
        for key, asset in item.assets.items():
            assert os.path.isabs(asset.href), (item.id, key, asset.href)
            assert os.path.exists(asset.href), (item.id, key, asset.href)
        with rasterio.open(item.assets["cog"].href) as src:
            assert src.count == len(item.assets["cog"].extra_fields["bands"])
        group = zarr.open_group(item.assets["zarr"].href, mode="r")
        assert group["data"].shape[0] == src.count
        # pystac resolves the links: the collection it names is the one on disk
        coll = item.get_collection()
        assert coll is not None
        assert coll.id == "enmap-l2a"


def test_search_options_reach_the_query(real_lake: Path, real_ingest: RealLake) -> None:
    enmap = set(real_ingest.ids["enmap"])
    w, s, e, n = item_files(real_lake)[real_ingest.ids["enmap"][0]]["bbox"]
    assert {h["id"] for h in search_json(real_lake, "--wavelength", "450:1300", "--filter", "platform=enmap")} == enmap
    assert {h["id"] for h in search_json(real_lake, "--datetime", "2022-07-24")} == enmap
    got = search_json(real_lake, "--bbox", f"{w},{s},{e},{n}", "--collection", "enmap-l2a")
    assert real_ingest.ids["enmap"][0] in {h["id"] for h in got}
    assert {h["id"] for h in got} <= enmap
    # a negative west is given as --bbox=...; the AVIRIS scene lies west of Greenwich
    aviris = real_ingest.ids["aviris"][0]
    aw, as_, ae, an = item_files(real_lake)[aviris]["bbox"]
    assert [h["id"] for h in search_json(real_lake, f"--bbox={aw},{as_},{ae},{an}")] == [aviris]
    landsat = search_json(real_lake, "-f", "eo:cloud_cover<10", "--sort", "-eo:cloud_cover", "--limit", "1")
    assert len(landsat) == 1
    covers = {h["id"]: h["properties"]["eo:cloud_cover"] for h in search_json(real_lake, "-f", "eo:cloud_cover<10")}
    assert landsat[0]["id"] == max(covers, key=covers.__getitem__)


@pytest.mark.parametrize("bbox", ["13.0,52.5,13.1,52.4", "52.4,13.0,52.5,200"])
def test_search_bad_bbox_exits_2_and_names_the_order(real_lake: Path, bbox: str) -> None:
    res = cli("search", "--lake", str(real_lake), "--bbox", bbox)
    assert res.exit_code == 2
    assert "west,south,east,north" in res.output
    assert bbox in res.output


@pytest.mark.parametrize("value", ["yesterday", "2022-13-45", "2022-08/2022-07"])
def test_search_bad_datetime_exits_2(real_lake: Path, value: str) -> None:
    res = cli("search", "--lake", str(real_lake), "--datetime", value)
    assert res.exit_code == 2
    assert value in res.output
    assert res.stdout == ""


def test_search_unknown_property_exits_2_and_lists_the_known_ones(real_lake: Path) -> None:
    res = cli("search", "--lake", str(real_lake), "--filter", "eo:cloudiness<10")
    assert res.exit_code == 2
    assert "eo:cloudiness" in res.output
    with LakeCatalog(real_lake) as cat:
        known = cat.index.queryables()
    assert {"eo:cloud_cover", "platform", "cubelake:quality"} <= set(known)
    for key in known:
        assert key in res.output


# -- show ----------------------------------------------------------------------------------------------
def test_show_prints_the_item_file(real_lake: Path, real_ingest: RealLake) -> None:
    for sid in (real_ingest.ids["enmap"][0], real_ingest.ids["samson"][0]):
        res = cli("show", sid, "--lake", str(real_lake))
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout) == json.loads((real_lake / "scenes" / sid / "item.json").read_text())


def test_show_unknown_id_exits_1_with_a_clear_message(real_lake: Path) -> None:
    res = cli("show", "no-such-scene", "--lake", str(real_lake))
    assert res.exit_code == 1
    assert "no item 'no-such-scene'" in res.output
    assert "cubelake catalog search" in res.output
    assert res.stdout == ""


# -- stats ---------------------------------------------------------------------------------------------
def test_stats_json_and_text_equal_the_index(real_lake: Path) -> None:
    res = cli("stats", "--lake", str(real_lake), "--format", "json")
    assert res.exit_code == 0, res.output
    stats = json.loads(res.stdout)
    with LakeCatalog(real_lake) as cat:
        direct = cat.stats()
    assert {k: v for k, v in stats.items() if k != "index_bytes"} == \
        {k: v for k, v in direct.items() if k != "index_bytes"}
    assert stats["index_bytes"] > 0
    # and the index itself agrees with the item files
    files = item_files(real_lake)
    assert stats["items"] == len(files)
    assert stats["bands"] == sum(len(bands_of(it)) for it in files.values())
    assert stats["geohash_cells"] == sum(len(it["properties"]["cubelake:geohash6"]) for it in files.values())
    for coll, c in stats["collections"].items():
        members = [it for it in files.values() if it["collection"] == coll]
        assert c["items"] == len(members)
        assert c["georeferenced"] == sum(it["geometry"] is not None for it in members)
        assert c["unknown_time"] == sum(it["properties"]["cubelake:datetime_source"] == "unknown" for it in members)
        counts = [len(bands_of(it)) for it in members]
        assert c["bands"] == [min(counts), max(counts)]

    res = cli("stats", "--lake", str(real_lake))
    assert res.exit_code == 0, res.output
    text = res.stdout
    assert (f"{stats['items']} item(s) in {len(stats['collections'])} collection(s); {stats['bands']} bands, "
            f"{stats['geohash_cells']} geohash cells, {stats['queryables']} queryable properties") in text
    for coll, c in stats["collections"].items():
        assert f"  {coll}: {c['items']} item(s), " in text
        assert f"{c['bands'][0]}-{c['bands'][1]} bands, {c['georeferenced']} georeferenced, " \
               f"{c['unknown_time']} with unknown time" in text


# -- reindex -----------------------------------------------------------------------------------------------
def test_reindex_after_deleting_the_index_restores_identical_results(lake_copy: Path) -> None:
    before = search_json(lake_copy)
    before_sorted = search_json(lake_copy, "--sort", "-eo:cloud_cover", "--wavelength", "500:590")
    for suffix in ("", "-wal", "-shm"):
        (lake_copy / f"catalog.sqlite{suffix}").unlink(missing_ok=True)
    res = cli("reindex", "--lake", str(lake_copy))
    assert res.exit_code == 0, res.output
    assert f"indexed {len(before)} item(s)" in res.stdout
    assert search_json(lake_copy) == before
    assert search_json(lake_copy, "--sort", "-eo:cloud_cover", "--wavelength", "500:590") == before_sorted


def test_reindex_with_a_corrupt_item_exits_1_names_it_and_keeps_the_others(
        lake_copy: Path, real_ingest: RealLake) -> None:
    before = [h["id"] for h in search_json(lake_copy)]
    bad_id = real_ingest.ids["enmap"][2]
    bad = lake_copy / "scenes" / bad_id / "item.json"
    bad.write_bytes(b"\x00\xff\xfe garbage {{{ \x89PNG\r\n")
    res = cli("reindex", "--lake", str(lake_copy))
    assert res.exit_code == 1
    assert str(bad) in res.stderr
    assert f"indexed {len(before) - 1} item(s)" in res.stdout
    assert [h["id"] for h in search_json(lake_copy)] == [i for i in before if i != bad_id]
    assert {h["id"] for h in search_json(lake_copy, "--datetime", "2022-07-24")} == \
        set(real_ingest.ids["enmap"]) - {bad_id}
    # its collection no longer links it, and show says it is not there
    coll = json.loads((lake_copy / "collections" / "enmap-l2a" / "collection.json").read_text())
    assert f"../../scenes/{bad_id}/item.json" not in [lk["href"] for lk in coll["links"] if lk["rel"] == "item"]
    assert len([lk for lk in coll["links"] if lk["rel"] == "item"]) == len(real_ingest.ids["enmap"]) - 1
    assert cli("show", bad_id, "--lake", str(lake_copy)).exit_code == 1
    # the JSON report names it too
    res = cli("reindex", "--lake", str(lake_copy), "--format", "json")
    assert res.exit_code == 1
    report = json.loads(res.stdout)
    assert [c["path"] for c in report["corrupt"]] == [str(bad)]
    assert report["indexed"] == len(before) - 1


# -- export ----------------------------------------------------------------------------------------------
def test_export_geoparquet_reads_back_in_geopandas_and_duckdb(real_lake: Path, tmp_path: Path,
                                                               real_ingest: RealLake) -> None:
    out = tmp_path / "x.parquet"
    res = cli("export", "--lake", str(real_lake), "-o", str(out))
    assert res.exit_code == 0, res.output
    files = item_files(real_lake)
    assert f"{len(files)} item(s)" in res.stdout

    df = geopandas.read_parquet(out)
    assert len(df) == len(files)
    assert sorted(df["id"]) == sorted(files)
    assert df.crs is not None
    assert df.crs.to_epsg() == 4326
    for sid, geom in zip(df["id"], df.geometry, strict=True):
        item = files[sid]
        if item["geometry"] is None:
            assert geom is None or geom.is_empty, sid
        else:
            assert geom.equals_exact(shape(item["geometry"]), 1e-9), sid
    for sid in (real_ingest.ids["aviris"][1], real_ingest.ids["samson"][0]):
        assert files[sid]["geometry"] is None  # these two have no location, and still are exported

    con = duckdb.connect()
    try:
        ids = [r[0] for r in con.execute(f"SELECT id FROM '{out}'").fetchall()]
    finally:
        con.close()
    assert sorted(ids) == sorted(files)
    assert ids == list(df["id"])


def test_export_hrefs_are_absolute_and_resolve(real_lake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               real_ingest: RealLake) -> None:
    monkeypatch.chdir(real_lake.parent)
    out = tmp_path / "lake.parquet"
    res = cli("export", "--lake", real_lake.name, "-o", str(out))
    assert res.exit_code == 0, res.output
    monkeypatch.chdir(tmp_path)
    items = list(sga.stac_table_to_items(pq.read_table(out)))
    assert sorted(it["id"] for it in items) == real_ingest.all_ids
    files = item_files(real_lake)
    for it in items:
        self_links = [lk["href"] for lk in it["links"] if lk["rel"] == "self"]
        assert self_links == [str(real_lake.resolve() / "scenes" / it["id"] / "item.json")]
        assert json.loads(Path(self_links[0]).read_text())["id"] == it["id"]
        assert it["assets"].keys() == files[it["id"]]["assets"].keys()
        for key, asset in it["assets"].items():
            assert os.path.isabs(asset["href"]), (it["id"], key)
            assert os.path.exists(asset["href"]), (it["id"], key, asset["href"])
        for lk in it["links"]:
            assert os.path.isfile(lk["href"]), (it["id"], lk)


def test_export_of_an_empty_lake_is_a_clear_error_and_writes_nothing(tmp_path: Path) -> None:
    from cubelake.lake import Lake

    Lake(tmp_path / "empty")
    out = tmp_path / "x.parquet"
    res = cli("export", "--lake", str(tmp_path / "empty"), "-o", str(out))
    assert res.exit_code == 1
    assert "has no items: nothing to export" in res.stderr
    assert str(tmp_path / "empty") in res.stderr
    assert not out.exists()
    assert list(tmp_path.glob("*.parquet*")) == []


# -- --intersects with a file ------------------------------------------------------------------------------
def _fc(*polygons: list[list[float]]) -> dict[str, Any]:
    return {"type": "FeatureCollection", "features": [
        {"type": "Feature", "properties": {"field": k}, "geometry": {"type": "Polygon", "coordinates": [ring]}}
        for k, ring in enumerate(polygons)]}


def test_intersects_a_feature_collection_file(real_lake: Path, real_ingest: RealLake, tmp_path: Path) -> None:
    files = item_files(real_lake)
    enmap = shape(files[real_ingest.ids["enmap"][0]]["geometry"]).representative_point()
    aviris = shape(files[real_ingest.ids["aviris"][0]]["geometry"]).representative_point()
    rings = [[[p.x - 1e-4, p.y - 1e-4], [p.x + 1e-4, p.y - 1e-4], [p.x + 1e-4, p.y + 1e-4], [p.x - 1e-4, p.y + 1e-4],
              [p.x - 1e-4, p.y - 1e-4]] for p in (enmap, aviris)]
    field = tmp_path / "field.geojson"
    field.write_text(json.dumps(_fc(*rings)))
    got = {h["id"] for h in search_json(real_lake, "--intersects", str(field))}
    expected = {sid for sid, it in files.items() if it["geometry"] and any(
        shape(it["geometry"]).intersects(shape({"type": "Polygon", "coordinates": [r]})) for r in rings)}
    assert real_ingest.ids["enmap"][0] in got
    assert real_ingest.ids["aviris"][0] in got
    assert got == expected
    # one Feature of it, and its bare geometry, find their part only
    one = _fc(rings[0])["features"][0]
    for doc in (one, one["geometry"]):
        field.write_text(json.dumps(doc))
        assert real_ingest.ids["aviris"][0] not in {h["id"] for h in search_json(real_lake, "--intersects", str(field))}


@pytest.mark.parametrize(("content", "needle"), [
    (b'{"type": "FeatureCollection", "features": []}', "no feature geometry"),
    (b'{"type": "Feature"}', "a Feature without a geometry"),
    (b"\xff\xfe{not text", "cannot be read as GeoJSON text"),
    (b"", "not usable as a search geometry"),
    (b'{"type": "Point", "coordinates": [13.0, 95.0]}', "must be WGS84 lon/lat degrees"),
])
def test_intersects_a_bad_file_exits_2_naming_it(real_lake: Path, tmp_path: Path, content: bytes, needle: str) -> None:
    field = tmp_path / "field.geojson"
    field.write_bytes(content)
    res = subprocess.run([sys.executable, "-m", "cubelake.cli", "catalog", "search", "--lake", str(real_lake),
                          "--intersects", str(field)], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert f"error: {field}: " in res.stderr
    assert needle in " ".join(res.stderr.split())
    assert res.stdout == ""


def test_intersects_a_fifo_or_a_folder_is_refused_without_reading(real_lake: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "field.geojson"
    os.mkfifo(fifo)
    for path, why in ((fifo, "not a regular file"), (tmp_path, "not a regular file"),
                      (tmp_path / "missing.geojson", "no such file")):
        res = subprocess.run([sys.executable, "-m", "cubelake.cli", "catalog", "search", "--lake", str(real_lake),
                              "--intersects", str(path)], capture_output=True, text=True, timeout=120, check=False)
        assert res.returncode == 2, res.stderr
        assert "Traceback" not in res.stderr
        assert f"--intersects {path}: neither GeoJSON text nor a GeoJSON file ({why})" in " ".join(res.stderr.split())
