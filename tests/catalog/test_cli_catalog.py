"""``cubelake catalog`` through typer's test runner, on the real lake: formats, exit codes, messages,
and the files ``reindex`` and ``export`` write (read back with geopandas and DuckDB)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import geopandas
import pytest
from shapely.geometry import shape
from typer.testing import CliRunner

from cubelake.catalog import Query
from cubelake.catalog.lake import LakeCatalog
from cubelake.cli import app

from .conftest import RealLake

runner = CliRunner()


def cli(*args: str) -> Any:
    return runner.invoke(app, ["catalog", *args], catch_exceptions=False)


def item_files(lake: Path) -> dict[str, dict[str, Any]]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted((lake / "scenes").glob("*/item.json"))}


def search_json(lake: Path, *args: str) -> list[dict[str, Any]]:
    res = cli("search", "--lake", str(lake), "--format", "json", *args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


# -- search --------------------------------------------------------------------------------------------
def test_search_json_geojson_and_table_agree(real_lake: Path, real_ingest: RealLake) -> None:
    hits = search_json(real_lake)
    ids = [h["id"] for h in hits]
    assert sorted(ids) == real_ingest.all_ids
    with LakeCatalog(real_lake) as cat:
        assert ids == [h.id for h in cat.search(Query())]
    files = item_files(real_lake)
    for h in hits:
        assert h["collection"] == files[h["id"]]["collection"]
        assert h["href"] == f"scenes/{h['id']}/item.json"
        assert h["band_count"] == len(files[h["id"]]["properties"]["bands"])

    res = cli("search", "--lake", str(real_lake), "--format", "geojson")
    assert res.exit_code == 0, res.output
    fc = json.loads(res.stdout)
    assert fc["type"] == "FeatureCollection"
    assert fc["numberMatched"] == fc["numberReturned"] == len(ids)
    assert [f["id"] for f in fc["features"]] == ids
    assert fc["features"] == [files[i] for i in ids]  # the full items, as on disk

    res = cli("search", "--lake", str(real_lake))
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["id", "collection", "datetime"]
    assert lines[-1] == f"{len(ids)} item(s)"
    rows = {line.split()[0]: line for line in lines[1:-1]}
    assert list(rows) == ids
    for sid in real_ingest.ids["enmap"]:
        assert "2022-07-24T10:45:26Z" in rows[sid]
        assert f" {len(files[sid]['properties']['bands'])} " in rows[sid]
    assert " unknown " in rows[real_ingest.ids["samson"][0]]
    for sid in real_ingest.ids["landsat"]:
        assert f"{files[sid]['properties']['eo:cloud_cover']:g}" in rows[sid].split()


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
    assert stats["bands"] == sum(len(it["properties"]["bands"]) for it in files.values())
    assert stats["geohash_cells"] == sum(len(it["properties"]["cubelake:geohash6"]) for it in files.values())
    for coll, c in stats["collections"].items():
        members = [it for it in files.values() if it["collection"] == coll]
        assert c["items"] == len(members)
        assert c["georeferenced"] == sum(it["geometry"] is not None for it in members)
        assert c["unknown_time"] == sum(it["properties"]["cubelake:datetime_source"] == "unknown" for it in members)
        counts = [len(it["properties"]["bands"]) for it in members]
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
