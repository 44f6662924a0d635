"""The STAC items, collections and root catalog of a lake of real scenes, checked against the products.

Every expected value is read back independently from what the item describes: the COG (rasterio),
the Zarr store (zarr), the source metadata (the MTL text, the GeoTIFF tags, the file name), the
files' bytes (BLAKE3), and a textbook geohash decoder in ``conftest``.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pystac
import pytest
import rasterio
import shapely
import zarr
from blake3 import blake3
from rasterio.errors import NotGeoreferencedWarning
from rasterio.warp import transform, transform_geom
from scipy import ndimage
from shapely.geometry import box, shape
from stac_pydantic import Catalog, Collection, Item

from .conftest import REAL_SCENES, RealLake, gh_bounds, gh_encode

SCENES = [(kind, i) for kind, paths in REAL_SCENES.items() for i in range(len(paths))]
SCENE_IDS = [f"{kind}{i}" for kind, i in SCENES]
GEOREFERENCED = [s for s in SCENES if s not in (("aviris", 1), ("samson", 0))]
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def items(real_lake: Path) -> dict[str, dict[str, Any]]:
    return {p.parent.name: _load(p) for p in sorted((real_lake / "scenes").glob("*/item.json"))}


@pytest.fixture(scope="module")
def collections(real_lake: Path) -> dict[str, dict[str, Any]]:
    return {p.parent.name: _load(p) for p in sorted((real_lake / "collections").glob("*/collection.json"))}


def scene_id(real_ingest: RealLake, kind: str, i: int) -> str:
    return real_ingest.ids[kind][i]


@contextmanager
def open_cog(path: Path) -> Iterator[rasterio.DatasetReader]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)  # pixel-grid products, on purpose
        with rasterio.open(path) as src:
            yield src


def asset_path(real_lake: Path, sid: str, item: dict[str, Any], key: str) -> Path:
    href = item["assets"][key]["href"]
    assert href.startswith("./"), href
    return real_lake / "scenes" / sid / href[2:]


def valid_mask(src: rasterio.DatasetReader) -> np.ndarray:
    """``(y, x)``: pixels valid in any band (not nodata, finite), from the COG's own values."""
    a = src.read()
    ok = np.isfinite(a) if a.dtype.kind == "f" else np.ones(a.shape, dtype=bool)
    if src.nodata is not None and not np.isnan(src.nodata):
        ok &= a != src.nodata
    return np.asarray(ok.any(axis=0))


def utc(text: str) -> datetime:
    v = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC)


def b3(path: Path) -> str:
    return blake3(path.read_bytes()).hexdigest()


# -- validation by third-party readers ------------------------------------------------------------
def test_every_item_collection_and_the_root_validate_with_stac_pydantic(
        real_lake: Path, real_ingest: RealLake, items: dict[str, dict[str, Any]],
        collections: dict[str, dict[str, Any]]) -> None:
    assert sorted(items) == real_ingest.all_ids
    for item in items.values():
        Item.model_validate(item)
        assert item["stac_version"] == "1.1.0"
    assert collections
    for coll in collections.values():
        Collection.model_validate(coll)
    Catalog.model_validate(_load(real_lake / "catalog.json"))


def test_pystac_walks_the_static_catalog_and_every_asset_exists(real_lake: Path, real_ingest: RealLake) -> None:
    cat = pystac.Catalog.from_file(str(real_lake / "catalog.json"))
    seen: dict[str, str] = {}
    for child in cat.get_children():
        assert isinstance(child, pystac.Collection)
        for item in child.get_items():
            assert item.id not in seen
            seen[item.id] = child.id
            assert item.collection_id == child.id
            for key, asset in item.assets.items():
                href = asset.get_absolute_href()
                assert href is not None, f"{item.id}: asset {key}"
                assert os.path.exists(href), f"{item.id}: asset {key} -> {href}"
            cog = item.assets["cog"].get_absolute_href()
            assert cog == str(real_lake / "scenes" / item.id / f"{item.id}.tif")
    assert sorted(seen) == real_ingest.all_ids
    assert len(seen) == sum(len(v) for v in REAL_SCENES.values())


def test_ids_are_safe_and_name_their_scene_folder(items: dict[str, dict[str, Any]]) -> None:
    for folder, item in items.items():
        assert item["id"] == folder
        assert SAFE_ID.match(item["id"]), item["id"]
        assert ".." not in item["id"], item["id"]
        assert SAFE_ID.match(item["collection"]), item["collection"]


# -- geometry --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kind", "i"), GEOREFERENCED, ids=[f"{k}{i}" for k, i in GEOREFERENCED])
def test_footprint_is_wgs84_and_holds_every_valid_pixel_centre(
        real_lake: Path, real_ingest: RealLake, items: dict[str, dict[str, Any]], kind: str, i: int) -> None:
    sid = scene_id(real_ingest, kind, i)
    item = items[sid]
    geom = shape(item["geometry"])
    assert item["geometry"]["type"] in ("Polygon", "MultiPolygon")
    assert geom.is_valid
    assert not geom.is_empty
    w, s, e, n = geom.bounds
    assert -180 <= w <= e <= 180
    assert -90 <= s <= n <= 90
    assert item["bbox"] == pytest.approx(list(geom.bounds), abs=1e-12)

    with open_cog(asset_path(real_lake, sid, item, "cog")) as src:
        valid = valid_mask(src)
        rows, cols = np.nonzero(valid)
        xs, ys = rasterio.transform.xy(src.transform, rows, cols, offset="center")
        lon, lat = transform(src.crs, "EPSG:4326", xs, ys)
        # invalid pixels well away (> 4 px) from any valid one must lie outside the footprint
        far = ndimage.distance_transform_edt(~valid) > 4
        frows, fcols = np.nonzero(far)
        fx, fy = rasterio.transform.xy(src.transform, frows, fcols, offset="center") if far.any() else ([], [])
        flon, flat = transform(src.crs, "EPSG:4326", fx, fy) if far.any() else ([], [])
        raster = shape(transform_geom(src.crs, "EPSG:4326", shapely.geometry.mapping(
            shapely.segmentize(box(*src.bounds), max_segment_length=abs(src.transform.a) * 4))))
    assert len(lon) == int(valid.sum()) > 0
    inside = shapely.intersects_xy(geom, np.asarray(lon), np.asarray(lat))
    assert inside.all(), f"{sid}: {int((~inside).sum())} of {inside.size} valid pixel centres outside the footprint"
    if far.any():
        assert not shapely.intersects_xy(geom, np.asarray(flon), np.asarray(flat)).any()
    # never bigger than the raster itself (a hair of slack for the 7-digit coordinates)
    assert geom.difference(raster.buffer(1e-6)).area == pytest.approx(0, abs=1e-12)
    if valid.all():
        assert geom.area == pytest.approx(raster.area, rel=0.01)


def test_non_georeferenced_scenes_have_no_location(
        real_lake: Path, real_ingest: RealLake, items: dict[str, dict[str, Any]]) -> None:
    for sid in (scene_id(real_ingest, "aviris", 1), scene_id(real_ingest, "samson", 0)):
        item = items[sid]
        with open_cog(asset_path(real_lake, sid, item, "cog")) as src:
            assert src.crs is None
        assert item["geometry"] is None
        assert "bbox" not in item
        assert item["properties"]["cubelake:geohash6"] == []
        assert item["properties"]["proj:code"] is None
        assert "proj:transform" not in item["properties"]


# -- time --------------------------------------------------------------------------------------
def test_enmap_time_comes_from_the_start_time_tag(real_ingest: RealLake, items: dict[str, dict[str, Any]]) -> None:
    for sid in real_ingest.ids["enmap"]:
        with rasterio.open(real_ingest.sources[sid]) as src:
            tag = src.tags()["start_time"]
        props = items[sid]["properties"]
        assert props["datetime"] == "2022-07-24T10:45:26Z"
        assert utc(props["datetime"]) == utc(tag)
        assert props["cubelake:datetime_source"] == "metadata"
        assert "start_datetime" not in props


def _mtl_values(path: Path) -> dict[str, str]:
    """KEY -> value of a Landsat MTL file, text (``KEY = value``) or JSON (nested groups)."""
    if path.suffix.lower() == ".json":
        out: dict[str, str] = {}

        def walk(d: Any) -> None:
            if isinstance(d, dict):
                for k, v in d.items():
                    if isinstance(v, dict | list):
                        walk(v)
                    else:
                        out[k] = str(v)
            elif isinstance(d, list):
                for v in d:
                    walk(v)

        walk(json.loads(path.read_text()))
        return out
    return {m[1]: m[2].strip().strip('"') for m in re.finditer(r"^\s*(\w+)\s*=\s*(.+?)\s*$", path.read_text(), re.M)}


def test_landsat_time_and_cloud_cover_come_from_the_mtl(real_ingest: RealLake,
                                                        items: dict[str, dict[str, Any]]) -> None:
    for sid in real_ingest.ids["landsat"]:
        mtl = _mtl_values(real_ingest.sources[sid])
        props = items[sid]["properties"]
        assert props["eo:cloud_cover"] == pytest.approx(float(mtl["CLOUD_COVER"]), abs=0)
        hh, mm, ss = mtl["SCENE_CENTER_TIME"].rstrip("Z").split(":")
        y, mo, d = (int(v) for v in mtl["DATE_ACQUIRED"].split("-"))
        expected = datetime(y, mo, d, int(hh), int(mm), tzinfo=UTC).timestamp() + float(ss)
        assert utc(props["datetime"]).timestamp() == pytest.approx(expected, abs=1e-6)
        assert props["cubelake:datetime_source"] == "metadata"
        assert props["platform"] == "landsat-8"


def test_aviris_time_comes_from_the_file_name(real_ingest: RealLake, items: dict[str, dict[str, Any]]) -> None:
    for sid in real_ingest.ids["aviris"]:
        m = re.match(r"ang(\d{4})(\d{2})(\d{2})t(\d{2})(\d{2})(\d{2})", real_ingest.sources[sid].name)
        assert m, real_ingest.sources[sid]
        y, mo, d, hh, mm, ss = (int(g) for g in m.groups())
        expected = datetime(y, mo, d, hh, mm, ss, tzinfo=UTC)
        props = items[sid]["properties"]
        assert utc(props["datetime"]) == expected
        assert props["cubelake:datetime_source"] == "filename"


def test_samson_time_is_unknown(real_ingest: RealLake, items: dict[str, dict[str, Any]]) -> None:
    props = items[real_ingest.ids["samson"][0]]["properties"]
    assert props["datetime"] is None
    assert props["cubelake:datetime_source"] == "unknown"
    assert props["start_datetime"] == "1970-01-01T00:00:00Z"
    # the widest honest interval: up to when it was ingested
    assert props["end_datetime"] == props["created"]
    assert utc(props["end_datetime"]) <= datetime.now(UTC)


# -- bands, projection, assets ------------------------------------------------------------------------
def _coordinate(group: zarr.Group, name: str, n: int) -> np.ndarray:
    """A ``(band,)`` coordinate of the Zarr product; all NaN when the product has none."""
    if name not in group:
        return np.full(n, np.nan)
    arr = group[name]
    assert isinstance(arr, zarr.Array)
    return np.asarray(arr[:], dtype="float64")


DATA_ASSETS = ("cog", "zarr", "refs")


@pytest.mark.parametrize(("kind", "i"), SCENES, ids=SCENE_IDS)
def test_bands_match_the_cog_and_zarr(real_lake: Path, real_ingest: RealLake, items: dict[str, dict[str, Any]],
                                      kind: str, i: int) -> None:
    sid = scene_id(real_ingest, kind, i)
    item = items[sid]
    assert "bands" not in item["properties"]  # STAC 1.1: on the data assets
    assets = item["assets"]
    bands = assets["cog"]["bands"]
    group = zarr.open_group(str(asset_path(real_lake, sid, item, "zarr")), mode="r")
    data = group[assets["zarr"]["cubelake:array"]]
    assert isinstance(data, zarr.Array)
    nb = data.shape[0]
    wl, fwhm = (_coordinate(group, name, nb) for name in ("wavelength", "fwhm"))
    with open_cog(asset_path(real_lake, sid, item, "cog")) as src:
        assert len(bands) == src.count == data.shape[0] == item["properties"]["cubelake:band_count"]
        # every data asset describes the same (band, y, x) cube: same bands and shared fields
        for key in DATA_ASSETS:
            a = assets[key]
            assert [{k: v for k, v in b.items() if k != "statistics"} for b in a["bands"]] == \
                [{k: v for k, v in b.items() if k != "statistics"} for b in bands], key
            assert ("statistics" in a["bands"][0]) == (key == "cog"), key  # statistics once, on the COG
            if src.nodata is not None and np.isnan(src.nodata):
                assert a["nodata"] == "nan"
            else:
                assert a["nodata"] == src.nodata
            assert a["data_type"] == src.dtypes[0]
            assert a.get("raster:scale", 1.0) == src.scales[0]
            assert a.get("raster:offset", 0.0) == src.offsets[0]
        assert "bands" not in assets["source"]
        cube = src.read()
        for k, band in enumerate(bands):
            tags = src.tags(k + 1)
            assert (src.dtypes[k], src.scales[k], src.offsets[k]) == (src.dtypes[0], src.scales[0], src.offsets[0])
            if np.isfinite(wl[k]):
                assert band["eo:center_wavelength"] == pytest.approx(wl[k] / 1000, abs=1e-7)
                assert band["eo:center_wavelength"] == pytest.approx(float(tags["wavelength"]) / 1000, abs=1e-7)
            else:
                assert "eo:center_wavelength" not in band
            if np.isfinite(fwhm[k]):
                assert band["eo:full_width_half_max"] == pytest.approx(fwhm[k] / 1000, abs=1e-7)
                assert band["eo:full_width_half_max"] == pytest.approx(float(tags["fwhm"]) / 1000, abs=1e-7)
            else:
                assert "eo:full_width_half_max" not in band
            # statistics in physical units, from the stored values (7 significant digits)
            dn = cube[k]
            ok = np.isfinite(dn) if dn.dtype.kind == "f" else np.ones(dn.shape, dtype=bool)
            if src.nodata is not None and not np.isnan(src.nodata):
                ok &= dn != src.nodata
            stats = band["statistics"]
            assert stats["valid_percent"] == pytest.approx(100.0 * ok.mean(), abs=1e-4)
            phys = dn[ok].astype("float64") * src.scales[k] + src.offsets[k]
            # statistics are of the calibrated values; integer storage rounds them to half a step
            step = abs(src.scales[k]) / 2 if dn.dtype.kind in "iu" else 0.0
            assert stats["minimum"] == pytest.approx(phys.min(), rel=1e-6, abs=step + 1e-9)
            assert stats["maximum"] == pytest.approx(phys.max(), rel=1e-6, abs=step + 1e-9)
            assert stats["mean"] == pytest.approx(phys.mean(), rel=1e-5, abs=step + 1e-9)


@pytest.mark.parametrize(("kind", "i"), SCENES, ids=SCENE_IDS)
def test_projection_matches_the_cog(real_lake: Path, real_ingest: RealLake, items: dict[str, dict[str, Any]],
                                    kind: str, i: int) -> None:
    sid = scene_id(real_ingest, kind, i)
    props = items[sid]["properties"]
    with open_cog(asset_path(real_lake, sid, items[sid], "cog")) as src:
        assert props["proj:shape"] == [src.height, src.width]
        if src.crs is None:
            assert props["proj:code"] is None
            assert "proj:transform" not in props
        else:
            assert props["proj:code"] == f"EPSG:{src.crs.to_epsg()}"
            assert props["proj:transform"] == list(src.transform)[:6]
            if kind in ("enmap", "aviris"):  # gsd is the pixel size for these (the profile sets no nominal one)
                assert props["gsd"] == pytest.approx(abs(src.transform.a))


def tree_checksum(root: Path) -> str:
    """BLAKE3 over a folder: each file's relative path, size and BLAKE3, in path order (as documented)."""
    h = blake3()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(f"{p.relative_to(root).as_posix()}\0{p.stat().st_size}\0{b3(p)}\n".encode())
    return "1e20" + h.hexdigest()


@pytest.mark.parametrize(("kind", "i"), SCENES, ids=SCENE_IDS)
def test_asset_sizes_and_checksums(real_lake: Path, real_ingest: RealLake, items: dict[str, dict[str, Any]],
                                   kind: str, i: int) -> None:
    sid = scene_id(real_ingest, kind, i)
    item = items[sid]
    assets = item["assets"]
    assert {"cog", "zarr", "refs", "source", "scene", "validation"} <= set(assets)
    for key, asset in assets.items():
        if key == "source":
            continue
        path = asset_path(real_lake, sid, item, key)
        assert path.exists(), f"{sid}: {key} -> {path}"
        if path.is_file() and "file:size" in asset:
            assert asset["file:size"] == os.path.getsize(path)
            assert asset["file:checksum"] == "1e20" + b3(path)
    zpath = asset_path(real_lake, sid, item, "zarr")
    assert assets["zarr"]["file:size"] == sum(p.stat().st_size for p in zpath.rglob("*") if p.is_file())
    assert assets["zarr"]["cubelake:tree_checksum"] == tree_checksum(zpath)
    for key in ("cog", "refs"):
        assert "file:checksum" in assets[key]
    # the source files, where they are
    src = assets["source"]
    assert src["href"] == str(real_ingest.sources[sid].resolve())
    files = src["cubelake:files"]
    assert str(real_ingest.sources[sid].resolve()) in [f["href"] for f in files]
    for f in files:
        assert f["file:size"] == os.path.getsize(f["href"])
        assert f["file:checksum"] == "1e20" + b3(Path(f["href"]))
    # the asset's own size and checksum are those of the file it points at
    assert src["file:size"] == os.path.getsize(src["href"])
    assert src["file:checksum"] == "1e20" + b3(Path(src["href"]))


@pytest.mark.parametrize(("kind", "i"), SCENES, ids=SCENE_IDS)
def test_cubelake_fields(real_lake: Path, real_ingest: RealLake, items: dict[str, dict[str, Any]],
                         kind: str, i: int) -> None:
    sid = scene_id(real_ingest, kind, i)
    item = items[sid]
    props = item["properties"]
    scene = _load(real_lake / "scenes" / sid / "scene.json")
    report = _load(real_lake / "scenes" / sid / "validation.json")
    with open_cog(asset_path(real_lake, sid, item, "cog")) as src:
        assert props["cubelake:chunk_shape"] == [src.count, *src.block_shapes[0]]
        assert props["cubelake:config_hash"] == src.tags()["CUBELAKE_CONFIG_HASH"]
    assert props["cubelake:config_hash"] == scene["config_hash"]
    assert props["cubelake:content_hash"] == scene["content_hash"]
    warned = [w["code"] for w in report["warnings"]]
    assert report["ok"] is True
    assert props["cubelake:validation"]["status"] == ("passed_with_warnings" if warned else "passed")
    assert [w["code"] for w in props["cubelake:validation"]["warnings"]] == warned
    assert props["cubelake:profile"] == scene["profile"]["name"]


# -- geohash cover -----------------------------------------------------------------------------------
def _expand(cells: list[str], precision: int) -> list[str]:
    b32 = "0123456789bcdefghjkmnpqrstuvwxyz"
    out: list[str] = []
    for c in cells:
        level = [c]
        while len(level[0]) < precision:
            level = [x + ch for x in level for ch in b32]
        out += level
    return out


@pytest.mark.parametrize(("kind", "i"), GEOREFERENCED, ids=[f"{k}{i}" for k, i in GEOREFERENCED])
def test_geohash_cover_meets_the_footprint_and_covers_it(
        real_lake: Path, real_ingest: RealLake, items: dict[str, dict[str, Any]], kind: str, i: int) -> None:
    sid = scene_id(real_ingest, kind, i)
    item = items[sid]
    geom = shape(item["geometry"])
    cells = item["properties"]["cubelake:geohash6"]
    assert cells
    assert all(1 <= len(c) <= 6 for c in cells)
    cellset = set(cells)
    assert len(cellset) == len(cells)
    assert not any(c[:k] in cellset for c in cells for k in range(1, len(c))), "a cell and its parent both listed"
    # every real scene's compact cover fits geohash.MAX_CELLS at precision 6; each precision-6 cell
    # it stands for meets the footprint
    precision = max(map(len, cells))
    assert precision == 6, (sid, precision)
    full = _expand(cells, precision)
    assert len(set(full)) == len(full)
    bounds = np.array([gh_bounds(c) for c in full])
    boxes = shapely.box(bounds[:, 0], bounds[:, 1], bounds[:, 2], bounds[:, 3])
    meets = shapely.intersects(boxes, geom)
    assert meets.all(), f"{sid}: {int((~meets).sum())} precision-{precision} cells miss the footprint"
    full_set = {c[:6] for c in _expand(cells, 6)}
    c = geom.centroid
    assert gh_encode(c.x, c.y, 6) in full_set
    # every vertex of the footprint, and a sample of points inside it, lie in covered cells
    rng = np.random.default_rng(0)
    w, s, e, n = geom.bounds
    pts = rng.uniform((w, s), (e, n), size=(400, 2))
    pts = pts[shapely.contains_xy(geom, pts[:, 0], pts[:, 1])]
    verts = shapely.get_coordinates(geom)
    for x, y in np.vstack([pts, verts]):
        assert gh_encode(x, y, 6) in full_set, (sid, x, y)


# -- collections and the root ------------------------------------------------------------------------
def _interval(props: dict[str, Any]) -> tuple[datetime, datetime] | None:
    if props["cubelake:datetime_source"] == "unknown":
        return None
    if props.get("start_datetime"):
        return utc(props["start_datetime"]), utc(props["end_datetime"])
    t = utc(props["datetime"])
    return t, t


def test_collections_summarise_their_items(real_lake: Path, items: dict[str, dict[str, Any]],
                                           collections: dict[str, dict[str, Any]]) -> None:
    by_coll: dict[str, list[dict[str, Any]]] = {}
    for item in items.values():
        by_coll.setdefault(item["collection"], []).append(item)
    assert sorted(by_coll) == sorted(collections)
    for cid, coll in collections.items():
        members = by_coll[cid]
        assert coll["id"] == cid
        counts = [m["properties"]["cubelake:band_count"] for m in members]
        assert coll["summaries"]["cubelake:band_count"] == {"minimum": min(counts), "maximum": max(counts)}
        platforms = sorted({m["properties"]["platform"] for m in members if "platform" in m["properties"]})
        if platforms:
            assert coll["summaries"]["platform"] == platforms
        else:
            assert "platform" not in coll["summaries"]
        (ext,) = coll["extent"]["spatial"]["bbox"]
        located = [m for m in members if m.get("bbox")]
        for m in located:
            assert box(*ext).covers(box(*m["bbox"])), (cid, m["id"])
        if located:  # and tight: each side is some item's side
            assert ext == [min(m["bbox"][0] for m in located), min(m["bbox"][1] for m in located),
                           max(m["bbox"][2] for m in located), max(m["bbox"][3] for m in located)]
        (interval,) = coll["extent"]["temporal"]["interval"]
        known = [iv for m in members if (iv := _interval(m["properties"])) is not None]
        if known:
            assert utc(interval[0]) == min(a for a, _ in known)
            assert utc(interval[1]) == max(b for _, b in known)
        else:
            assert interval == [None, None]
        # item links resolve to exactly this collection's items
        folder = real_lake / "collections" / cid
        linked = [(folder / link["href"]).resolve() for link in coll["links"] if link["rel"] == "item"]
        assert all(p.is_file() for p in linked)
        assert sorted(_load(p)["id"] for p in linked) == sorted(m["id"] for m in members)
        for rel in ("root", "parent"):
            (link,) = [lk for lk in coll["links"] if lk["rel"] == rel]
            assert (folder / link["href"]).resolve() == (real_lake / "catalog.json").resolve()


def test_root_catalog_links_every_collection(real_lake: Path, collections: dict[str, dict[str, Any]]) -> None:
    root = _load(real_lake / "catalog.json")
    children = [(real_lake / lk["href"]).resolve() for lk in root["links"] if lk["rel"] == "child"]
    assert all(p.is_file() for p in children)
    assert sorted(_load(p)["id"] for p in children) == sorted(collections)


def test_item_links_point_at_their_collection_and_root(real_lake: Path, items: dict[str, dict[str, Any]]) -> None:
    for sid, item in items.items():
        folder = real_lake / "scenes" / sid
        rels = {lk["rel"]: (folder / lk["href"]).resolve() for lk in item["links"]}
        assert rels["root"] == (real_lake / "catalog.json").resolve()
        assert rels["collection"] == rels["parent"]
        assert _load(rels["collection"])["id"] == item["collection"]
