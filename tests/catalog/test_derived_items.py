"""Derived products in the catalog: prediction and datacube items under ``predictions/<name>/`` and
``datacubes/<name>/`` are indexed (``publish_derived``), searched, shown, exported, reindexed, synced by
gc and removed like scene items, on disk and on the S3 test server; hostile keys and ids are refused."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from cubelake.catalog import LakeCatalog, Query
from cubelake.catalog.validate import stac_registry, validate_stac
from cubelake.errors import CatalogError, CorruptItemError, ItemNotFoundError
from cubelake.ingest import IngestOptions, ingest
from cubelake.object_lake import ObjectLake

from ..conftest import REAL, S3Server, no_traceback, run_cli
from .conftest import SHARED_SCHEMAS

TILE = REAL / "hsi_enmap_potsdam" / "enmap_potsdam_tile_96_0.tif"
SCENE = "enmap_potsdam_tile_96_0"
KEY = "predictions/map1/item.json"
COG = "image/tiff; application=geotiff; profile=cloud-optimized"


def prediction_item(scene: dict[str, Any], name: str, collection: str | None = None) -> dict[str, Any]:
    """A minimal valid derived item over ``scene``: no bands, eo, wavelengths or cloud cover."""
    item: dict[str, Any] = {
        "type": "Feature", "stac_version": "1.1.0", "stac_extensions": [], "id": name,
        "geometry": scene["geometry"], "bbox": scene["bbox"],
        "properties": {"datetime": scene["properties"]["datetime"], "title": f"land cover of {scene['id']}"},
        "links": [{"rel": "root", "href": "../../catalog.json", "type": "application/json"},
                  {"rel": "derived_from", "href": f"../../scenes/{scene['id']}/item.json",
                   "type": "application/geo+json"}],
        "assets": {"classes": {"href": "./v/1/classes.tif", "type": COG, "roles": ["data"]}},
    }
    if collection is not None:  # STAC 1.1: an item names its collection only with a link to it
        item["collection"] = collection
        item["links"].append({"rel": "collection", "href": f"../../collections/{collection}/collection.json",
                              "type": "application/json"})
    assert validate_stac(item) == []
    return item


@pytest.fixture(scope="module")
def one_scene_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("derived") / "lake"
    res = ingest([TILE], root, IngestOptions(products=("cog",)))
    assert (res[0].outcome.value, res[0].scene_id) == ("ingested", SCENE), res[0].message
    return root


@pytest.fixture
def lake(one_scene_lake: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "lake"
    shutil.copytree(one_scene_lake, dst, symlinks=True)
    return dst


def scene_item(lake: Path) -> dict[str, Any]:
    return dict(json.loads((lake / "scenes" / SCENE / "item.json").read_text()))


def write_item(lake: Path, key: str, item: dict[str, Any]) -> Path:
    path = lake / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(item))
    return path


def ids(hits: list[Any]) -> list[str]:
    return sorted(h.id for h in hits)


def test_a_prediction_item_is_searchable_shown_exported_and_removed(lake: Path, tmp_path: Path) -> None:
    scene = scene_item(lake)
    path = write_item(lake, KEY, prediction_item(scene, "map1"))  # no collection: indexed in "predictions"
    with LakeCatalog(lake) as cat:
        indexed = cat.publish_derived(KEY)
        assert indexed["collection"] == "predictions"
        assert "collection" not in json.loads(path.read_text())  # the file is not rewritten
        # a second publish of the same item writes nothing
        stamps = [(lake / f).stat().st_mtime_ns for f in ("catalog.json", "collections/predictions/collection.json")]
        cat.publish_derived(KEY)
        assert stamps == [(lake / f).stat().st_mtime_ns for f in ("catalog.json",
                                                                  "collections/predictions/collection.json")]
        assert ids(cat.search(Query(bbox=tuple(scene["bbox"])))) == sorted(["map1", SCENE])
        assert ids(cat.search(Query(datetime="2022-07-24"))) == sorted(["map1", SCENE])
        assert ids(cat.search(Query(datetime="2023"))) == []
        assert ids(cat.search(Query(bbox=(0.0, 0.0, 1.0, 1.0)))) == []
        [hit] = cat.search(Query(collections=["predictions"]))
        assert (hit.id, hit.href, hit.band_count) == ("map1", KEY, 0)
        assert ids(cat.search(Query(), scenes_only=True)) == [SCENE]
        assert cat.get("map1") == json.loads(path.read_text())
        assert cat.validate([SHARED_SCHEMAS]).to_dict()["invalid"] == []  # the derived item is checked too
        assert cat.export_geoparquet(tmp_path / "all.parquet") == 2
    table = pq.read_table(tmp_path / "all.parquet").to_pydict()
    assert sorted(table["id"]) == sorted(["map1", SCENE])
    # rows are the item files: this one names no collection (the index files it under "predictions")
    assert sorted(str(c) for c in table["collection"]) == ["None", "enmap-l2a"]

    coll = json.loads((lake / "collections" / "predictions" / "collection.json").read_text())
    assert validate_stac(coll, stac_registry([SHARED_SCHEMAS])) == []
    assert "model predictions" in coll["description"]
    assert coll["extent"]["spatial"]["bbox"] == [scene["bbox"]]
    assert coll["extent"]["temporal"]["interval"] == [[scene["properties"]["datetime"]] * 2]
    assert [ln["href"] for ln in coll["links"] if ln["rel"] == "item"] == [f"../../{KEY}"]
    root = json.loads((lake / "catalog.json").read_text())
    assert "./collections/predictions/collection.json" in [ln["href"] for ln in root["links"] if ln["rel"] == "child"]

    # the CLI: search by collection (absolute hrefs), show
    res = run_cli("catalog", "search", "--lake", str(lake), "--collection", "predictions", "--format", "json")
    assert res.returncode == 0, no_traceback(res)
    [feature] = json.loads(res.stdout)["features"]
    assert feature["id"] == "map1"
    assert feature["links"][0] == {"rel": "self", "href": str(path.resolve()), "type": "application/geo+json"}
    assert feature["assets"]["classes"]["href"] == str(path.parent.resolve() / "v" / "1" / "classes.tif")
    shown = run_cli("catalog", "show", "map1", "--lake", str(lake))
    assert shown.returncode == 0, no_traceback(shown)
    assert json.loads(shown.stdout) == json.loads(path.read_text())

    # reindex from scratch keeps it
    (lake / "catalog.sqlite").unlink()
    with LakeCatalog(lake) as cat:
        assert ids(cat.search(Query(collections=["predictions"]))) == ["map1"]
        report = cat.reindex()
        assert (report.indexed, report.corrupt) == (2, [])
        assert cat.search(Query(ids=["map1"]))[0].href == KEY

        # unpublish: gone from search and from the STAC tree; the scene's id is refused
        assert cat.unpublish_derived("map1") is True
        assert cat.unpublish_derived("map1") is False
        assert ids(cat.search(Query())) == [SCENE]
        with pytest.raises(CatalogError, match="is a scene's"):
            cat.unpublish_derived(SCENE)
        with pytest.raises(ItemNotFoundError):
            cat.get("map1")
    assert not (lake / "collections" / "predictions" / "collection.json").exists()
    root = json.loads((lake / "catalog.json").read_text())
    assert [ln["href"] for ln in root["links"] if ln["rel"] == "child"] == ["./collections/enmap-l2a/collection.json"]


def test_gc_indexes_committed_derived_items_and_drops_gone_ones(lake: Path) -> None:
    scene = scene_item(lake)
    path = write_item(lake, KEY, prediction_item(scene, "map1", collection="landcover"))
    with LakeCatalog(lake) as cat:
        # a publisher killed between its commit and the catalog: gc finishes it (a dry run only says so)
        assert cat.gc(dry_run=True) == [f"would index derived item {KEY}: committed but not in the catalog index as "
                                        "it is"]
        assert cat.search(Query(ids=["map1"])) == []
        assert cat.gc() == [f"indexed derived item {KEY}: committed but not in the catalog index as it is"]
        [hit] = cat.search(Query(collections=["landcover"]))  # its own collection is kept
        assert hit.id == "map1"
        assert cat.gc() == []
        # a rewritten item is reindexed as it is now
        changed = prediction_item(scene, "map1", collection="landcover")
        changed["properties"]["title"] = "second version"
        path.write_text(json.dumps(changed))
        assert len(cat.gc()) == 1
        assert cat.search(Query(ids=["map1"]))[0].properties["title"] == "second version"
        # its product deleted: gc drops it from the index
        shutil.rmtree(path.parent)
        assert cat.gc() == ["removed derived item map1 from the catalog index: predictions/map1/item.json is gone"]
        assert cat.search(Query()) == cat.search(Query(), scenes_only=True)


@pytest.mark.parametrize(("key", "why"), [
    ("../scenes/x/item.json", "'..' is not a derived products' folder"),
    ("predictions/a/b/item.json", "not three parts ending in item.json"),
    ("/tmp/predictions/a/item.json", "an absolute path or URL"),
    ("s3://bucket/predictions/a/item.json", "an absolute path or URL"),
    ("predictions/../item.json", "'..' is not a safe name"),
    ("predictions/a/other.json", "not three parts ending in item.json"),
    ("scenes/x/item.json", "'scenes' is not a derived products' folder"),
    ("predictions\\a\\item.json", "backslashes"),
    ("", "not a key"),
])
def test_hostile_keys_are_refused_with_the_expected_form(tmp_path: Path, key: str, why: str) -> None:
    with LakeCatalog(tmp_path / "lake", create=True) as cat, pytest.raises(CatalogError) as exc:
        cat.publish_derived(key)
    msg = str(exc.value)
    assert f"derived item key {key!r}: {why}" in msg, msg
    assert "<root>/<name>/item.json with <root> one of datacubes, predictions" in msg


def test_an_absolute_path_inside_the_lake_is_refused(lake: Path) -> None:
    path = write_item(lake, KEY, prediction_item(scene_item(lake), "map1"))
    with LakeCatalog(lake) as cat, pytest.raises(CatalogError, match="an absolute path or URL"):
        cat.publish_derived(str(path))


def test_unusable_items_and_taken_ids_are_refused_and_reported_by_reindex(lake: Path) -> None:
    scene = scene_item(lake)
    with LakeCatalog(lake) as cat:
        with pytest.raises(ItemNotFoundError, match="no derived item there"):
            cat.publish_derived("predictions/none/item.json")
        write_item(lake, "predictions/wrong/item.json", prediction_item(scene, "other"))
        with pytest.raises(CorruptItemError, match="item id 'other' differs from its folder 'wrong'"):
            cat.publish_derived("predictions/wrong/item.json")
        write_item(lake, f"datacubes/{SCENE}/item.json", prediction_item(scene, SCENE))  # a scene's id
        with pytest.raises(CatalogError, match=re.escape(f"item id '{SCENE}' is already that of the catalog's item "
                                                         f"scenes/{SCENE}/item.json")):
            cat.publish_derived(f"datacubes/{SCENE}/item.json")
        unsafe = prediction_item(scene, "unsafe", collection="landcover")
        unsafe["collection"] = "../x"
        write_item(lake, "predictions/unsafe/item.json", unsafe)
        with pytest.raises(CorruptItemError, match=re.escape("collection '../x' is not a safe collection id")):
            cat.publish_derived("predictions/unsafe/item.json")
        bad_time = prediction_item(scene, "badtime")
        bad_time["properties"]["datetime"] = "yesterday"
        write_item(lake, "predictions/badtime/item.json", bad_time)
        with pytest.raises(CorruptItemError, match="not indexable"):
            cat.publish_derived("predictions/badtime/item.json")
        assert ids(cat.search(Query())) == [SCENE]  # nothing of these was indexed
        write_item(lake, KEY, prediction_item(scene, "map1"))
        report = cat.reindex()
    assert report.indexed == 2  # the scene and map1
    problems = {Path(p).relative_to(lake).as_posix(): why for p, why in report.corrupt}
    assert set(problems) == {"predictions/wrong/item.json", f"datacubes/{SCENE}/item.json",
                             "predictions/unsafe/item.json", "predictions/badtime/item.json"}
    assert f"already that of the item scenes/{SCENE}/item.json" in problems[f"datacubes/{SCENE}/item.json"]
    res = run_cli("catalog", "reindex", "--lake", str(lake))
    out = no_traceback(res)
    assert res.returncode == 1, out
    assert "predictions/wrong/item.json" in out


@pytest.mark.s3
def test_derived_items_on_an_object_store_lake(s3_server: S3Server, s3_bucket: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {"AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                 "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
                 "CUBELAKE_CACHE": str(tmp_path / "cache"), "CUBELAKE_STAGING": str(tmp_path / "staging")}.items():
        monkeypatch.setenv(k, v)
    url = f"s3://{s3_bucket}/lake"
    res = ingest([TILE], url, IngestOptions(products=("cog",)))
    assert res[0].outcome.value == "ingested", res[0].message
    store = ObjectLake(url).store
    scene = json.loads(store.get_text(f"scenes/{SCENE}/item.json"))
    item = prediction_item(scene, "map1")
    store.put(KEY, json.dumps(item).encode())
    with LakeCatalog(url) as cat:
        assert type(cat).__name__ == "ObjectLakeCatalog"
        cat.publish_derived(KEY)
        generation = json.loads(store.get_text("catalog/index.json"))["generation"]
        cat.publish_derived(KEY)  # as indexed: no new generation
        assert json.loads(store.get_text("catalog/index.json"))["generation"] == generation
        cat.refresh()
        assert ids(cat.search(Query(bbox=tuple(scene["bbox"]), datetime="2022-07"))) == sorted(["map1", SCENE])
        [hit] = cat.search(Query(collections=["predictions"]))
        assert hit.href == KEY
        assert ids(cat.search(Query(), scenes_only=True)) == [SCENE]
        assert cat.get("map1") == item
        with pytest.raises(CatalogError, match="not three parts"):
            cat.publish_derived("predictions/a/b/item.json")
        with pytest.raises(CatalogError, match="is a scene's"):
            cat.unpublish_derived(SCENE)
        report = cat.reindex()
        assert (report.indexed, report.corrupt) == (2, [])
        assert cat.validate([SHARED_SCHEMAS]).ok
    coll = json.loads(store.get_text("collections/predictions/collection.json"))
    assert [ln["href"] for ln in coll["links"] if ln["rel"] == "item"] == [f"../../{KEY}"]
    assert validate_stac({k: v for k, v in coll.items() if k != "cubelake:index_generation"},
                         stac_registry([SHARED_SCHEMAS])) == []

    # a fresh process reading the lake: search by collection, show
    found = run_cli("catalog", "search", "--lake", url, "--collection", "predictions", "--format", "json",
                    env={"CUBELAKE_CACHE": str(tmp_path / "fresh")})
    assert found.returncode == 0, no_traceback(found)
    [feature] = json.loads(found.stdout)["features"]
    assert feature["links"][0]["href"] == f"{url}/{KEY}"
    assert feature["assets"]["classes"]["href"] == f"{url}/predictions/map1/v/1/classes.tif"

    with LakeCatalog(url) as cat:
        assert cat.unpublish_derived("map1") is True
        cat.refresh()
        assert ids(cat.search(Query())) == [SCENE]
        # the item is still committed: gc indexes it again; deleted, gc drops it
        assert any(f"indexed derived item {KEY}" in line for line in cat.gc())
        cat.refresh()
        assert ids(cat.search(Query(collections=["predictions"]))) == ["map1"]
        store.delete(KEY)
        assert any("removed derived item map1" in line for line in cat.gc())
        cat.refresh()
        assert ids(cat.search(Query())) == [SCENE]


def test_a_built_datacube_is_found_by_catalog_search(tmp_path: Path) -> None:
    from cubelake.datacube import build_cube
    from tests.test_datacube import given_settings, ingest_scenes

    lake = tmp_path / "lake"
    ingest_scenes(lake, tmp_path / "src", ["scene_a", "scene_b"])
    out = build_cube(lake, "ab", ["scene_a", "scene_b"], settings=given_settings(chunk=64))
    item = json.loads(Path(out.item_url).read_text())
    res = run_cli("catalog", "search", "--lake", str(lake), "--collection", "cubelake-datacubes", "--format", "json")
    assert res.returncode == 0, no_traceback(res)
    [feature] = json.loads(res.stdout)["features"]
    assert feature["id"] == "ab"
    assert feature["links"][0]["href"] == str(Path(out.item_url).resolve())
    assert feature["assets"]["zarr"]["href"] == str(Path(out.zarr_url).resolve())
    table = run_cli("catalog", "search", "--lake", str(lake), "--bbox", ",".join(map(str, item["bbox"])))
    assert table.returncode == 0, no_traceback(table)
    assert "ab" in table.stdout.split()
    with LakeCatalog(lake) as cat:
        assert ids(cat.search(Query(bbox=tuple(item["bbox"])))) == ["ab", "scene_a", "scene_b"]
        [hit] = cat.search(Query(datetime="2022-07-02"))  # inside the cube's interval, between the scenes
        assert (hit.id, hit.href, hit.collection) == ("ab", "datacubes/ab/item.json", "cubelake-datacubes")
        assert ids(cat.search(Query(), scenes_only=True)) == ["scene_a", "scene_b"]
        assert ids(cat.search(Query(wavelength_nm=(446, 454)))) == ["ab", "scene_a", "scene_b"]  # its bands count
        assert cat.validate([SHARED_SCHEMAS]).to_dict()["invalid"] == []
        assert cat.export_geoparquet(tmp_path / "all.parquet") == 3
    assert sorted(pq.read_table(tmp_path / "all.parquet").to_pydict()["id"]) == ["ab", "scene_a", "scene_b"]
    coll = json.loads((lake / "collections" / "cubelake-datacubes" / "collection.json").read_text())
    assert validate_stac(coll, stac_registry([SHARED_SCHEMAS])) == []
    assert "datacubes built with 'cubelake cube build'" in coll["description"]

    # a build choosing scenes by search takes scenes only, though the cube matches the search too
    chosen = build_cube(lake, "q", query=Query(bbox=tuple(item["bbox"]), datetime="2022-07"),
                        settings=given_settings(chunk=64))
    assert chosen.scenes == ("scene_a", "scene_b")
    # a build killed between its commit and the catalog: the next run (up to date) indexes the cube
    with LakeCatalog(lake) as cat:
        assert cat.unpublish_derived("ab") is True
        assert ids(cat.search(Query(collections=["cubelake-datacubes"]))) == ["q"]
    again = build_cube(lake, "ab", ["scene_a", "scene_b"], settings=given_settings(chunk=64))
    assert again.status == "up to date"
    with LakeCatalog(lake) as cat:
        assert ids(cat.search(Query(collections=["cubelake-datacubes"]))) == ["ab", "q"]
