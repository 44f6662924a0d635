"""The index stores each distinct band table once (schema 6) and writes items in bulk: every item
still answers ``band_table``, searches and ``holds`` as if it had its own; footprints are stored
byte for byte as shapely writes them; an index of schema 5 (a band table row per item) is rebuilt
from the item files, saying so."""

from __future__ import annotations

import copy
import json
import logging
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import shapely
from shapely.geometry import box, shape

from cubelake.catalog import CatalogIndex, LakeCatalog, Query
from cubelake.catalog._bandsets import BandSetMemo, band_set_of
from cubelake.catalog.index import SCHEMA_VERSION, _footprint_wkb
from cubelake.errors import CorruptIndexError

from ..conftest import no_traceback
from ..conftest import run_cli as cubelake
from .conftest import RealLake, spectrometer_um, synth_item
from .test_search import ITEMS, brute_force

VNIR = spectrometer_um(400, 1000, 10)  # 61 bands
FULL = spectrometer_um(400, 2500, 10, gaps_nm=[(1350, 1450)])


def _expected_table(item: dict[str, Any]) -> list[tuple[Any, Any, Any]]:
    """``band_table`` computed from the item dict itself (µm -> nm, None where missing)."""
    out = []
    for b in item["properties"]["bands"]:
        c, f = b.get("eo:center_wavelength"), b.get("eo:full_width_half_max")
        out.append((b.get("name"), None if c is None else c * 1000.0, None if f is None else f * 1000.0))
    return out


def _band_sets(idx: CatalogIndex) -> int:
    return int(idx.db.execute("SELECT count(*) FROM band_sets").fetchone()[0])


@pytest.fixture
def idx(tmp_path: Path) -> Any:
    with CatalogIndex(tmp_path / "i.sqlite") as index:
        yield index


def _scene(sid: str, x: float, bands: list[tuple[float, float]], **kw: Any) -> dict[str, Any]:
    return synth_item(sid, geometry=box(x, 10.0, x + 0.5, 10.5), datetime="2022-07-24T10:45:26Z",
                      bands_um=bands, **kw)


def test_items_of_one_band_table_share_one_row_and_each_answers_its_table(idx: CatalogIndex) -> None:
    items = [_scene(f"v{i}", i, VNIR) for i in range(20)] + [_scene(f"f{i}", i, FULL) for i in range(20)]
    # a third table: the VNIR one with a single centre moved by 0.1 nm
    shifted = copy.deepcopy(items[0])
    shifted["id"] = "shifted"
    shifted["properties"]["bands"][30]["eo:center_wavelength"] += 0.0001
    items.append(shifted)
    assert idx.insert_items(items, batch_size=7) == len(items)
    assert _band_sets(idx) == 3
    for it in items:
        assert idx.band_table(it["id"]) == _expected_table(it), it["id"]
    assert idx.band_table("shifted")[30] != idx.band_table("v0")[30]
    assert idx.band_table("nope") == []
    assert idx.stats()["bands"] == sum(len(it["properties"]["bands"]) for it in items)
    # equal content in other dict objects (as read from another file) finds the same row
    again = copy.deepcopy(items[5])
    again["id"] = "copy"
    idx.upsert(again)
    assert _band_sets(idx) == 3
    assert idx.holds(again, None)


def test_deleting_and_replacing_items_leaves_the_shared_tables_whole(idx: CatalogIndex) -> None:
    items = [_scene(f"v{i}", i, VNIR) for i in range(5)] + [_scene(f"f{i}", i, FULL) for i in range(5)]
    idx.insert_items(items)
    assert idx.delete("v0") is True
    idx.upsert(_scene("f1", 1, VNIR))  # f1 now has the VNIR bands
    assert idx.band_table("v1") == _expected_table(items[1])
    assert idx.band_table("f1") == _expected_table(_scene("f1", 1, VNIR))
    full = Query(bbox=(-1, 9, 20, 11), wavelength_nm="450:1300")
    assert [h.id for h in idx.search(full)] == ["f0", "f2", "f3", "f4"]
    vnir = Query(wavelength_nm="450:900")
    assert sorted(h.id for h in idx.search(vnir)) == ["f0", "f1", "f2", "f3", "f4", "v1", "v2", "v3", "v4"]


def test_an_id_given_twice_in_one_batch_keeps_its_last_item(idx: CatalogIndex) -> None:
    first, last = _scene("a", 0, VNIR), _scene("a", 50, FULL)
    assert idx.insert_items([first, _scene("b", 1, VNIR), last]) == 3
    assert idx.ids() == ["a", "b"]
    assert idx.holds(last, None)
    assert not idx.holds(first, None)
    assert idx.band_table("a") == _expected_table(last)
    assert [h.id for h in idx.search(Query(bbox=(49.9, 9.9, 50.6, 10.6)))] == ["a"]


def test_bbox_and_wavelength_together_equal_brute_force(tmp_path: Path) -> None:
    with CatalogIndex(tmp_path / "s.sqlite") as index:
        index.insert_items(ITEMS, batch_size=3)
        for bbox in ((-180, -90, 180, 90), (12.9, 52.3, 13.95, 52.95), (170.0, -18.0, -170.0, -16.0)):
            for wl in ("450:1300", "400:2400", "1500:1700", "560"):
                q = Query(bbox=bbox, wavelength_nm=wl)
                assert [h.id for h in index.search(q)] == brute_force(ITEMS, q), (bbox, wl)


# -- the band-set memo ------------------------------------------------------------------------------------
def test_the_memo_never_answers_for_a_changed_list() -> None:
    memo = BandSetMemo(limit=4)
    bands = _scene("x", 0, VNIR)["properties"]["bands"]
    assert memo.get(bands) == band_set_of(bands)
    bands[3]["eo:center_wavelength"] = 0.7777  # the caller changes its own dict afterwards
    assert memo.get(bands) == band_set_of(bands)
    assert memo.get(bands).center_nm != band_set_of(_scene("x", 0, VNIR)["properties"]["bands"]).center_nm
    # True == 1, but a band named True is not a band named 1
    one, true = [{"name": 1, "eo:center_wavelength": 0.5}], [{"name": True, "eo:center_wavelength": 0.5}]
    assert memo.get(one).names == "[1]"
    assert memo.get(true).names == "[true]"
    # past its limit it starts over, still right
    for k in range(10):
        b = [{"name": f"b{k}", "eo:center_wavelength": 0.4 + k / 100}]
        assert memo.get(b) == band_set_of(b)


def test_a_band_set_covers_what_its_bands_cover() -> None:
    bs = band_set_of(_scene("x", 0, FULL)["properties"]["bands"])
    assert len(bs.coverage) == 2
    assert bs.coverage[0][0] == pytest.approx(395.0)
    assert bs.coverage[-1][1] == pytest.approx(2505.0)
    assert band_set_of([]).coverage == ()


# -- footprints as WKB -------------------------------------------------------------------------------------
def _shapely_wkb(geom: dict[str, Any]) -> bytes:
    """What schema 5 stored: shapely's WKB of the GeoJSON footprint."""
    if geom["type"] == "Polygon" and len(geom["coordinates"]) == 1:
        return shapely.to_wkb(shapely.polygons(np.asarray(geom["coordinates"][0], dtype=np.float64)))
    return shapely.to_wkb(shape(geom))


@pytest.mark.parametrize("geom", [
    {"type": "Polygon", "coordinates": [[[1.5, 2.0], [3.0, 2.0], [3.0, 4.25], [1.5, 2.0]]]},
    {"type": "Polygon", "coordinates": [[[1, 2], [3, 2], [3, 4], [1, 4], [1, 2]]]},  # integers
    {"type": "Polygon", "coordinates": [[[1.0, 2.0], [3.0, 2.0], [3.0, 4.0], [1.0, 4.0]]]},  # not closed
    {"type": "Polygon", "coordinates": [[[1.0, 2.0, 5.0], [3.0, 2.0, 5.0], [3.0, 4.0, 5.0], [1.0, 2.0, 5.0]]]},
    {"type": "Polygon", "coordinates": [[["1", "2"], ["3", "2"], ["3", "4"], ["1", "2"]]]},  # text numbers
    {"type": "Polygon", "coordinates": [[[-0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]]},  # -0.0 closes
    {"type": "Polygon", "coordinates": [[[0, 0], [9, 0], [9, 9], [0, 9], [0, 0]], [[1, 1], [2, 1], [2, 2], [1, 1]]]},
    {"type": "MultiPolygon", "coordinates": [[[[179.5, 1], [180, 1], [180, 2], [179.5, 1]]],
                                             [[[-180, 1], [-179.5, 1], [-180, 2], [-180, 1]]]]},
])
def test_footprints_are_stored_as_shapely_writes_them(geom: dict[str, Any]) -> None:
    assert _footprint_wkb(geom) == _shapely_wkb(geom)


def _outcome(fn: Any, geom: dict[str, Any]) -> Any:
    try:
        return fn(geom)
    except (ValueError, TypeError, shapely.errors.GEOSException) as exc:
        return type(exc)


@pytest.mark.parametrize("coords", [
    [[[1.0, 2.0], [3.0, 2.0], [1.0, 2.0]]],  # three points
    [[[1.0, 2.0], [3.0, 2.0]]],
    [[["a", "b"], [3, 2], [3, 4], ["a", "b"]]],  # not numbers
    [[1.0, 2.0, 3.0, 4.0]],  # not points
    [[[1.0, 2.0], [3.0], [3.0, 4.0], [1.0, 2.0]]],  # ragged
])
def test_a_bad_ring_fares_as_it_did_through_shapely(coords: Any) -> None:
    geom = {"type": "Polygon", "coordinates": coords}
    assert _outcome(_footprint_wkb, geom) == _outcome(_shapely_wkb, geom)


# -- an index of the previous schema --------------------------------------------------------------------
_V5 = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE items(rowid INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, collection TEXT NOT NULL, datetime TEXT,
    t0 REAL, t1 REAL, west REAL, south REAL, east REAL, north REAL, geometry BLOB, band_count INTEGER NOT NULL,
    href TEXT, properties TEXT NOT NULL);
CREATE VIRTUAL TABLE items_rtree USING rtree(id, minx, maxx, miny, maxy, mint, maxt);
CREATE TABLE bands(item INTEGER PRIMARY KEY, names TEXT NOT NULL, center_nm BLOB NOT NULL, fwhm_nm BLOB NOT NULL);
CREATE TABLE coverage(item INTEGER NOT NULL, lo_nm REAL NOT NULL, hi_nm REAL NOT NULL,
    PRIMARY KEY(item, lo_nm)) WITHOUT ROWID;
CREATE TABLE geohash(cell TEXT NOT NULL, item INTEGER NOT NULL, PRIMARY KEY(cell, item)) WITHOUT ROWID;
CREATE TABLE queryables(key TEXT NOT NULL, type TEXT NOT NULL, PRIMARY KEY(key, type)) WITHOUT ROWID;
INSERT INTO meta VALUES ('schema_version', '5');
"""


def _write_v5(path: Path, item_id: str) -> None:
    """An index as cubelake wrote it before band sets: one item, its band table in its own row."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    db = sqlite3.connect(path)
    db.executescript(_V5)
    db.execute("INSERT INTO items VALUES (1, ?, 'c', NULL, NULL, NULL, 0, 0, 1, 1, NULL, 1, NULL, '{}')", (item_id,))
    db.execute("INSERT INTO bands VALUES (1, '[\"b1\"]', ?, ?)",
               (np.array([500.0]).tobytes(), np.array([10.0]).tobytes()))
    db.commit()
    db.close()


def test_an_index_of_schema_5_is_refused_naming_both_versions_and_the_fix(tmp_path: Path) -> None:
    _write_v5(tmp_path / "old.sqlite", "x")
    with pytest.raises(CorruptIndexError) as exc:
        CatalogIndex(tmp_path / "old.sqlite")
    msg = str(exc.value)
    assert f"index schema version 5, expected {SCHEMA_VERSION}" in msg
    assert "cubelake catalog reindex" in msg
    assert str(tmp_path / "old.sqlite") in msg


def test_a_lake_with_a_schema_5_index_rebuilds_it_and_says_so(lake_copy: Path, real_ingest: RealLake,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    _write_v5(lake_copy / "catalog.sqlite", "stale-item")
    with caplog.at_level(logging.WARNING, logger="cubelake.catalog"), LakeCatalog(lake_copy) as cat:
        hits = cat.search(Query())
        assert sorted(h.id for h in hits) == sorted(real_ingest.all_ids)
        sid = real_ingest.ids["enmap"][0]
        table = cat.index.band_table(sid)
        assert len(table) == cat.index.get(sid).band_count  # type: ignore[union-attr]
    assert f"index schema version 5, expected {SCHEMA_VERSION}" in caplog.text
    assert "rebuilding the catalog index from the item files" in caplog.text
    with sqlite3.connect(lake_copy / "catalog.sqlite") as db:
        assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (str(SCHEMA_VERSION),)
        assert db.execute("SELECT count(*) FROM band_sets").fetchone()[0] >= 1


@pytest.mark.integration
def test_the_cli_on_a_schema_5_index_rebuilds_it_without_a_traceback(lake_copy: Path, real_ingest: RealLake) -> None:
    _write_v5(lake_copy / "catalog.sqlite", "stale-item")
    res = cubelake("catalog", "search", "--lake", str(lake_copy), "--format", "json")
    no_traceback(res)
    assert res.returncode == 0, res.stderr
    assert sorted(f["id"] for f in json.loads(res.stdout)["features"]) == sorted(real_ingest.all_ids)
    err = " ".join(res.stderr.replace("│", " ").split())
    assert "index schema version 5" in err
    assert "rebuilding the catalog index from the item files" in err
