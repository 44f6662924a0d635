"""Catalog search, checked against a brute-force filter written here from the documented semantics.

Synthetic items go into a temporary ``CatalogIndex``; the real lake is searched through
``LakeCatalog``. Every answer (ids *and* order) must equal what a plain Python loop over the same
item dicts gives, with shapely for geometry and this module's own time/wavelength parsing.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import shapely
from shapely.geometry import MultiPolygon, Polygon, box, mapping, shape

from cubelake.catalog import CatalogIndex, Query
from cubelake.catalog.lake import LakeCatalog
from cubelake.errors import CatalogQueryError

from .conftest import RealLake, Synth, bands_of, gh_bounds, spectrometer_um

# -- the synthetic catalog -----------------------------------------------------------------------
HSI_GAPPED = spectrometer_um(420, 2450, 10, gaps_nm=[(1340, 1450), (1800, 1960)])  # water-vapour gaps
SYNTH = [
    Synth("s01-triangle", "hsi-a", Polygon([(13.0, 52.0), (14.0, 52.0), (13.0, 53.0)]),
          datetime="2022-07-24T10:45:26Z", bands_um=HSI_GAPPED,
          properties={"eo:cloud_cover": 5.0, "cubelake:quality": 0.95, "platform": "enmap", "sensor_mode": "push"}),
    Synth("s02-berlin", "hsi-a", box(13.2, 52.3, 13.6, 52.6), datetime="2022-07-25T09:00:00Z", bands_um=HSI_GAPPED,
          properties={"eo:cloud_cover": 20.0, "cubelake:quality": 0.7, "platform": "enmap",
                      "view:sun_elevation": 45.5}),
    Synth("s03-fiji", "msi", MultiPolygon([box(179.2, -17.5, 180.0, -16.5), box(-180.0, -17.5, -179.6, -16.5)]),
          bbox=[179.2, -17.5, -179.6, -16.5], datetime="2021-01-15T00:00:00Z",
          bands_um=[(0.49, 0.065), (0.56, 0.035), (0.665, 0.03), (0.842, 0.115)],
          properties={"eo:cloud_cover": 50.0, "cubelake:quality": 0.9, "platform": "sentinel-2a"}),
    Synth("s04-aviris-interval", "hsi-b", box(-118.7, 34.4, -118.5, 34.5), start="2016-09-10T00:00:00Z",
          end="2016-09-10T23:59:59Z", bands_um=spectrometer_um(380, 2500, 5, gaps_nm=[(1340, 1450), (1800, 1960)]),
          properties={"cubelake:quality": 0.85, "platform": "aviris-ng", "view:sun_elevation": 60.0}),
    Synth("s05-unknown-time", "hsi-b", box(13.3, 52.1, 13.5, 52.2), bands_um=spectrometer_um(400, 1000, 10),
          properties={"cubelake:quality": 0.5}),
    Synth("s06-no-geometry", "hsi-a", None, datetime="2022-07-24T12:00:00Z", bands_um=spectrometer_um(450, 540, 10),
          properties={"cubelake:quality": 1.0, "platform": "enmap"}),
    Synth("s07-landsat", "msi", box(128.7, -17.0, 129.0, -16.7), datetime="2016-05-13T01:23:31Z",
          bands_um=[(0.561, 0.075)], properties={"eo:cloud_cover": 0.02, "cubelake:quality": 0.7,
                                                 "platform": "landsat-8"}),
    Synth("s08-no-wavelengths", "msi", box(85.9, 20.6, 86.2, 20.9), datetime="2014-10-22T04:37:48Z",
          bands_um=[(None, None)] * 3, properties={"eo:cloud_cover": 0.38, "platform": "landsat-8"}),
    Synth("s09-tie", "hsi-a", box(12.5, 52.5, 12.6, 52.6), datetime="2022-07-24T10:45:26Z",
          bands_um=spectrometer_um(450, 1300, 10),
          properties={"eo:cloud_cover": 5.0, "cubelake:quality": 0.8, "platform": "enmap", "sensor_mode": "whisk"}),
    Synth("s10-equator", "hsi-b", box(-60.2, -0.1, -59.9, 0.2), datetime="2023-12-31T23:59:59Z",
          bands_um=spectrometer_um(395, 2405, 10),
          properties={"eo:cloud_cover": 9.999, "cubelake:quality": 0.79, "platform": "prisma"}),
    Synth("s11-midnight", "hsi-a", box(2.2, 48.8, 2.5, 48.9), datetime="2022-07-25T00:00:00Z", bands_um=HSI_GAPPED,
          properties={"eo:cloud_cover": 10.0, "cubelake:quality": 0.8, "platform": "enmap"}),
    Synth("s12-no-fwhm", "msi", box(-3.8, 40.3, -3.6, 40.5), datetime="2020-02-29T12:00:00Z",
          bands_um=[(0.49, None), (0.56, None), (0.665, None), (0.705, None)],
          properties={"eo:cloud_cover": 12.5, "platform": "sentinel-2b"}),
]
ITEMS = [s.to_item() for s in SYNTH]


# -- the brute force ------------------------------------------------------------------------------
def _utc(text: str) -> float:
    v = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (v if v.tzinfo else v.replace(tzinfo=UTC)).timestamp()


def _bound(text: str | None, end: bool) -> tuple[float | None, bool]:
    """(epoch, exclusive?) of one end of a datetime query; a partial date spans its whole unit."""
    if text is None or text.strip() in ("", ".."):
        return None, False
    t = text.strip()
    parts = t.split("-")
    if len(t) in (4, 7, 10) and all(p.isdigit() for p in parts):
        y, m, d = int(parts[0]), int(parts[1]) if len(parts) > 1 else 1, int(parts[2]) if len(parts) > 2 else 1
        first = datetime(y, m, d, tzinfo=UTC)
        if not end:
            return first.timestamp(), False
        if len(parts) == 1:
            nxt = datetime(y + 1, 1, 1, tzinfo=UTC)
        elif len(parts) == 2:
            nxt = datetime(y + m // 12, m % 12 + 1, 1, tzinfo=UTC)
        else:
            nxt = datetime.fromtimestamp(first.timestamp() + 86400, UTC)
        return nxt.timestamp(), True
    return _utc(t), False


def _query_time(value: Any) -> tuple[float | None, float | None, bool]:
    if isinstance(value, tuple):
        a, b = value
    elif "/" in value:
        a, b = value.split("/")
    else:
        a = b = value
    lo, _ = _bound(a, end=False)
    hi, exclusive = _bound(b, end=True)
    return lo, hi, exclusive


def _item_time(props: dict[str, Any]) -> tuple[float, float] | None:
    if props.get("cubelake:datetime_source") == "unknown":
        return None
    if props.get("start_datetime"):
        return _utc(props["start_datetime"]), _utc(props["end_datetime"])
    if props.get("datetime"):
        t = _utc(props["datetime"])
        return t, t
    return None


def _coverage(item: dict[str, Any]) -> list[tuple[float, float]]:
    """Merged [lo, hi] nm covered by the bands: centre ± fwhm/2 (no fwhm: the nearest band's distance);
    neighbours merge across a gap of at most half the narrower band's width."""
    bands = bands_of(item)
    centres = [b["eo:center_wavelength"] * 1000 for b in bands if "eo:center_wavelength" in b]
    widths = [b.get("eo:full_width_half_max") for b in bands if "eo:center_wavelength" in b]
    spans = []
    for c, w in zip(centres, widths, strict=True):
        width = w * 1000 if w else min((abs(c - o) for o in centres if o != c), default=0.0)
        spans.append((c - width / 2, c + width / 2))
    merged: list[list[float]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1] + 0.5 * min(hi - lo, merged[-1][2]):
            if hi >= merged[-1][1]:
                merged[-1][1], merged[-1][2] = hi, hi - lo
        else:
            merged.append([lo, hi, hi - lo])
    return [(a, b) for a, b, _ in merged]


def _wavelength(value: Any) -> tuple[float, float]:
    if not isinstance(value, str):
        return float(value[0]), float(value[1])
    text, f = value.strip(), 1.0
    if text.endswith("um"):
        text, f = text[:-2], 1000.0
    parts = [float(p) * f for p in text.split(":")]
    return (parts[0], parts[-1])


def _query_geometry(q: Query) -> Any:
    geom = None
    if q.bbox is not None:
        w, s, e, n = (float(v) for v in (q.bbox.split(",") if isinstance(q.bbox, str) else q.bbox))
        geom = shapely.union_all([box(w, s, 180, n), box(-180, s, e, n)]) if w > e else box(w, s, e, n)
    if q.intersects is not None:
        g = shape(json.loads(q.intersects) if isinstance(q.intersects, str) else q.intersects)
        geom = g if geom is None else geom.intersection(g)
    return geom


def _matches_filter(props: dict[str, Any], text: str) -> bool:
    for op in ("<=", ">=", "!=", "<", ">", "="):
        if op in text:
            key, raw = (t.strip() for t in text.split(op, 1))
            raw = raw.strip("'\"")
            break
    v = props.get(key)
    if v is None:
        return False  # a missing property matches no comparison (SQL, CQL2)
    target: Any = float(raw) if isinstance(v, int | float) else raw
    return {"<": v < target, "<=": v <= target, ">": v > target, ">=": v >= target,
            "=": v == target, "!=": v != target}[op]


def brute_force(items: list[dict[str, Any]], q: Query) -> list[str]:
    """The ids ``q`` should find in ``items``, in the order it should give them."""
    qgeom = _query_geometry(q)
    qtime = _query_time(q.datetime) if q.datetime is not None else None
    out = []
    for it in items:
        p = it["properties"]
        if qgeom is not None and (it.get("geometry") is None or not shape(it["geometry"]).intersects(qgeom)):
            continue
        if qtime is not None:
            t = _item_time(p)
            lo, hi, exclusive = qtime
            if t is None or (lo is not None and t[1] < lo):
                continue
            if hi is not None and (t[0] >= hi if exclusive else t[0] > hi):
                continue
        if q.collections and it["collection"] not in q.collections:
            continue
        if q.ids and it["id"] not in q.ids:
            continue
        if q.wavelength_nm is not None:
            lo, hi = _wavelength(q.wavelength_nm)
            if not any(a <= lo and hi <= b for a, b in _coverage(it)):
                continue
        if q.min_bands is not None and p["cubelake:band_count"] < q.min_bands:
            continue
        if q.geohash is not None:
            if it.get("geometry") is None:
                continue
            cell = q.geohash.lower()[:6]  # the cover is at precision 6: a longer prefix matches its precision-6 cell
            if not box(*gh_bounds(cell)).intersects(shape(it["geometry"])):
                continue
        if not all(_matches_filter(p, f) for f in q.filters):
            continue
        out.append(it)

    def value(it: dict[str, Any], key: str) -> Any:
        if key == "datetime":
            t = _item_time(it["properties"])
            return None if t is None else t[0]
        if key in ("id", "collection"):
            return it[key]
        return it["properties"].get(key)

    keys = [(k.lstrip("-"), k.startswith("-")) for k in (q.sort or ("datetime",))]
    if not any(k == "id" for k, _ in keys):
        keys.append(("id", False))
    for key, desc in reversed(keys):  # stable sorts, last key first; missing values always last
        present = [it for it in out if value(it, key) is not None]
        missing = [it for it in out if value(it, key) is None]
        out = sorted(present, key=functools.partial(value, key=key), reverse=desc) + missing
    ids = [it["id"] for it in out]
    return ids if q.limit is None else ids[: q.limit]


# -- fixtures ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CatalogIndex]:
    idx = CatalogIndex(tmp_path_factory.mktemp("index") / "catalog.sqlite")
    assert idx.insert_items(ITEMS) == len(ITEMS)
    yield idx
    idx.close()


@pytest.fixture
def fresh_index(tmp_path: Path) -> Iterator[CatalogIndex]:
    idx = CatalogIndex(tmp_path / "catalog.sqlite")
    idx.insert_items(ITEMS)
    yield idx
    idx.close()


def _item(sid: str) -> dict[str, Any]:
    return next(it for it in ITEMS if it["id"] == sid)


def _geohash_queries() -> list[Query]:
    """Prefixes taken from the items' own covers: a short prefix of a cover cell, and a prefix longer
    than a compact (coarser than 6) cell, under it."""
    cells = _item("s02-berlin")["properties"]["cubelake:geohash6"]
    coarse = next(c for c in cells if len(c) < 6)
    tri = _item("s01-triangle")["properties"]["cubelake:geohash6"]
    return [Query(geohash=cells[0][:3]), Query(geohash=coarse + "zz"), Query(geohash=coarse + "0"),
            Query(geohash=tri[-1]), Query(geohash=tri[0][:5].upper()),
            Query(geohash=cells[0][:4], filters=("eo:cloud_cover<10",))]


CASES: list[Query] = [
    Query(),
    # bbox: overlap, partial overlap, bbox-but-not-footprint, antimeridian
    Query(bbox=(12.9, 52.3, 13.25, 52.5)),
    Query(bbox=(13.55, 52.55, 13.7, 52.7)),
    Query(bbox=(13.8, 52.8, 13.95, 52.95)),
    Query(bbox=(178.5, -17.2, -179.0, -16.8)),
    Query(bbox=(-179.9, -17.0, -179.7, -16.9)),
    Query(bbox=(179.5, -17.0, 179.9, -16.9)),
    Query(bbox=(-179.5, -17.0, -179.0, -16.9)),
    Query(bbox=(170.0, -18.0, 175.0, -16.0)),
    Query(bbox="-180,-90,180,90"),
    # intersects
    Query(intersects={"type": "Point", "coordinates": [13.4, 52.45]}),
    Query(intersects=json.dumps(mapping(box(2.0, 48.7, 2.3, 48.85)))),
    Query(intersects={"type": "Polygon", "coordinates": [[[13.7, 52.7], [13.9, 52.7], [13.9, 52.9], [13.7, 52.7]]]}),
    Query(intersects={"type": "LineString", "coordinates": [[179.0, -17.0], [179.9, -17.0]]}),
    Query(bbox=(12.0, 52.0, 14.0, 53.0), intersects={"type": "Point", "coordinates": [12.55, 52.55]}),
    Query(bbox=(0.0, 0.0, 1.0, 1.0), intersects={"type": "Point", "coordinates": [12.55, 52.55]}),
    # datetime
    Query(datetime="2022-07-24"),
    Query(datetime="2022-07-24/2022-07-25"),
    Query(datetime="../2016-12-31"),
    Query(datetime="2022-07-25/.."),
    Query(datetime="2016-09-10T12:00:00Z"),
    Query(datetime="2016-09-11/2016-09-12"),
    Query(datetime="2016"),
    Query(datetime="2022-07"),
    Query(datetime="2020-02-29"),
    Query(datetime=("2022-07-24T10:45:26Z", None)),
    Query(datetime=(None, "2022-07-24T10:45:26Z")),
    Query(datetime="1970/.."),
    # collections, ids
    Query(collections=("msi",)),
    Query(collections=("hsi-a", "msi")),
    Query(collections=("nope",)),
    Query(ids=("s03-fiji", "s07-landsat", "nope")),
    # wavelength coverage
    Query(wavelength_nm="450:1300"),
    Query(wavelength_nm="400:2400"),
    Query(wavelength_nm=(450.0, 1300.0)),
    Query(wavelength_nm="1300:1500"),
    Query(wavelength_nm="1500:1700"),
    Query(wavelength_nm="0.5:0.59um"),
    Query(wavelength_nm="560"),
    Query(wavelength_nm="500:700"),
    Query(wavelength_nm="650:720"),
    # band count
    Query(min_bands=100),
    Query(min_bands=1),
    Query(min_bands=4),
    # geohash
    *_geohash_queries(),
    # property filters
    Query(filters=("eo:cloud_cover<10",)),
    Query(filters=("cubelake:quality>=0.8",)),
    Query(filters=("platform=enmap",)),
    Query(filters=("platform!=enmap",)),
    Query(filters=("platform = 'landsat-8'",)),
    Query(filters=("eo:cloud_cover>=5", "eo:cloud_cover<=10")),
    Query(filters=("eo:cloud_cover=5",)),
    Query(filters=("eo:cloud_cover!=5",)),
    Query(filters=("sensor_mode=push",)),
    Query(filters=("view:sun_elevation>50",)),
    Query(filters=("platform=enmap", "cubelake:quality>0.9")),
    # sort and limit
    Query(sort=("datetime",)),
    Query(sort=("-datetime",)),
    Query(sort=("-eo:cloud_cover",)),
    Query(sort=("eo:cloud_cover",)),
    Query(sort=("id",)),
    Query(sort=("-id",)),
    Query(sort=("-cubelake:quality", "id")),
    Query(sort=("collection", "-datetime")),
    Query(sort=("-view:sun_elevation",)),
    Query(sort=("-datetime",), limit=3),
    Query(limit=0),
    Query(bbox="-180,-90,180,90", sort=("-eo:cloud_cover",), limit=2),
    Query(filters=("platform=enmap",), sort=("datetime",), limit=1),
    # everything at once
    Query(bbox=(12.0, 52.0, 15.0, 53.0), datetime="2022-07", wavelength_nm="450:1300", filters=("eo:cloud_cover<10",),
          collections=("hsi-a",), min_bands=50, sort=("-datetime",)),
]


def _case_id(q: Query) -> str:
    parts = [f"{k}={v}" for k, v in (
        ("bbox", q.bbox), ("intersects", q.intersects and "geom"), ("datetime", q.datetime),
        ("collections", q.collections), ("ids", q.ids), ("wl", q.wavelength_nm), ("min_bands", q.min_bands),
        ("geohash", q.geohash), ("filters", q.filters), ("sort", q.sort), ("limit", q.limit)) if v not in (None, ())]
    return ";".join(parts) or "all"


# -- synthetic: every case against the brute force ---------------------------------------------------------
def test_synthetic_covers_are_at_precision_6() -> None:
    # the brute force assumes the covers were not coarsened (geohash.MAX_CELLS)
    for it in ITEMS:
        cells = it["properties"]["cubelake:geohash6"]
        assert (max(map(len, cells)) == 6) if it["geometry"] else cells == [], it["id"]


@pytest.mark.parametrize("q", CASES, ids=[_case_id(q) for q in CASES])
def test_search_equals_brute_force(index: CatalogIndex, q: Query) -> None:
    assert [h.id for h in index.search(q)] == brute_force(ITEMS, q)


def test_the_cases_are_not_trivial() -> None:
    # most cases must select a proper, non-empty subset, or the comparison proves little
    sizes = [len(brute_force(ITEMS, q)) for q in CASES if q.limit is None and not q.sort]
    assert sum(0 < n < len(ITEMS) for n in sizes) >= 0.75 * len(sizes)


def test_documented_examples(index: CatalogIndex) -> None:
    def ids(q: Query) -> set[str]:
        return {h.id for h in index.search(q)}

    # exact footprint test: in the triangle's bbox but off its hypotenuse
    assert ids(Query(bbox=(13.8, 52.8, 13.95, 52.95))) == set()
    assert ids(Query(bbox=(13.05, 52.05, 13.1, 52.1))) == {"s01-triangle"}
    # across the antimeridian, from either side and across it
    for bbox in ((178.5, -17.2, -179.0, -16.8), (-179.9, -17.0, -179.7, -16.9), (179.5, -17.0, 179.9, -16.9)):
        assert ids(Query(bbox=bbox)) == {"s03-fiji"}
    # unknown time: never matches a time filter, always matches without one
    assert "s05-unknown-time" in ids(Query())
    assert "s05-unknown-time" in ids(Query(bbox=(13.3, 52.1, 13.5, 52.2)))
    assert "s05-unknown-time" not in ids(Query(datetime="1970/.."))
    assert "s05-unknown-time" not in ids(Query(datetime="1970-01-01/2100-01-01"))
    # no location: never matches a spatial filter
    assert "s06-no-geometry" not in ids(Query(bbox=(-180, -90, 180, 90)))
    assert "s06-no-geometry" in ids(Query(datetime="2022-07-24"))
    # water-vapour gaps split coverage
    assert "s01-triangle" in ids(Query(wavelength_nm="450:1300"))
    assert "s01-triangle" not in ids(Query(wavelength_nm="400:2400"))
    assert "s01-triangle" not in ids(Query(wavelength_nm="1300:1500"))
    assert "s10-equator" in ids(Query(wavelength_nm="400:2400"))
    assert "s07-landsat" not in ids(Query(wavelength_nm="450:1300"))
    # a missing property matches no comparison, = or != (SQL and CQL2 semantics)
    assert "s05-unknown-time" not in ids(Query(filters=("platform=enmap",)))
    assert "s05-unknown-time" not in ids(Query(filters=("platform!=enmap",)))


def test_hits_carry_the_item_fields(index: CatalogIndex) -> None:
    for hit in index.search(Query()):
        it = _item(hit.id)
        assert hit.collection == it["collection"]
        assert hit.datetime == it["properties"]["datetime"]
        assert hit.band_count == len(bands_of(it))
        if it["geometry"] is None:
            assert hit.bbox is None
            assert hit.geometry is None
        else:
            assert list(hit.bbox) == it["bbox"]
            assert shape(hit.geometry).equals_exact(shape(it["geometry"]), 1e-12)
        # the index keeps the properties without the bulky per-band list and geohash cover
        assert hit.properties == {k: v for k, v in it["properties"].items()
                                  if k not in ("bands", "cubelake:geohash6")}
        assert index.get(hit.id) == hit
    assert index.get("nope") is None


def test_queryables_list_the_scalar_properties(index: CatalogIndex) -> None:
    q = index.queryables()
    assert q["eo:cloud_cover"] == {"number"}
    assert q["view:sun_elevation"] == {"number"}
    assert q["platform"] == {"string"}
    assert q["sensor_mode"] == {"string"}
    assert "bands" not in q
    assert "cubelake:geohash6" not in q


def test_a_property_of_mixed_types_compares_each_type_apart(tmp_path: Path) -> None:
    """Ingest order must not decide whether eo:cloud_cover<10 is allowed; text never matches a number."""
    idx = CatalogIndex(tmp_path / "mixed.sqlite")
    base = {"type": "Feature", "collection": "c", "geometry": None, "assets": {}, "links": []}
    for i, cloud in enumerate(["n/a", 5, 50, "7"]):
        idx.upsert({**base, "id": f"m{i}", "properties": {"datetime": "2020-01-01T00:00:00Z", "eo:cloud_cover": cloud}})
    assert idx.queryables()["eo:cloud_cover"] == {"number", "string"}
    assert [h.id for h in idx.search(Query(filters=("eo:cloud_cover<10",)))] == ["m1"]
    assert [h.id for h in idx.search(Query(filters=("eo:cloud_cover>10",)))] == ["m2"]  # "n/a" is not > 10
    assert [h.id for h in idx.search(Query(filters=("eo:cloud_cover=n/a",)))] == ["m0"]
    assert [h.id for h in idx.search(Query(filters=("eo:cloud_cover!=5",)))] == ["m2"]
    idx.close()


# -- errors ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("q", "needles"), [
    (Query(filters=("eo:cloudcover<10",)), ["eo:cloudcover", "eo:cloud_cover", "cubelake:quality", "platform",
                                             "sensor_mode", "view:sun_elevation"]),
    (Query(sort=("-nope",)), ["nope", "eo:cloud_cover"]),
    (Query(filters=("eo:cloud_cover=abc",)), ["eo:cloud_cover", "number", "abc"]),
    (Query(filters=("view:sun_elevation=high",)), ["view:sun_elevation", "number"]),
    (Query(filters=("sensor_mode<3",)), ["sensor_mode", "text", "="]),
    (Query(filters=("platform>=enmap",)), ["needs a number", "enmap"]),
    (Query(filters=("cloudy",)), ["PROPERTY OP VALUE"]),
    (Query(bbox=(13.0, 53.0, 14.0, 52.0)), ["west,south,east,north", "south"]),
    (Query(bbox=(52.0, 13.0, 200.0, 14.0)), ["west,south,east,north", "-180..180"]),
    (Query(bbox=(1.0, 2.0, 3.0)), ["4 finite numbers"]),
    (Query(datetime="2022-08/2022-07"), ["start is after the end"]),
    (Query(datetime="yesterday"), ["ISO 8601", "yesterday"]),
    (Query(datetime="2022-13-45"), ["2022-13-45"]),
    (Query(datetime="../.."), ["open"]),
    (Query(wavelength_nm="2400:400"), ["2400:400", "LO:HI"]),
    (Query(geohash="ab!"), ["ab!", "'a'"]),
    (Query(intersects='{"type": "Polygon"'), ["GeoJSON"]),
    (Query(min_bands=0), ["min_bands"]),
])
def test_bad_queries_raise_naming_the_problem(index: CatalogIndex, q: Query, needles: list[str]) -> None:
    with pytest.raises(CatalogQueryError) as exc:
        index.search(q)
    assert isinstance(exc.value, ValueError)
    for needle in needles:
        assert needle in str(exc.value), (needle, str(exc.value))


# -- writes ------------------------------------------------------------------------------------------------
def test_upsert_replaces_without_duplicating(fresh_index: CatalogIndex) -> None:
    before = fresh_index.stats()
    moved = replace(SYNTH[1], geometry=box(-70.1, -33.5, -70.0, -33.4),
                    properties={**SYNTH[1].properties, "eo:cloud_cover": 1.0})
    fresh_index.upsert(moved.to_item())
    assert len(fresh_index) == len(ITEMS)
    assert fresh_index.ids().count("s02-berlin") == 1
    assert fresh_index.stats()["bands"] == before["bands"]
    assert "s02-berlin" not in {h.id for h in fresh_index.search(Query(bbox=(13.2, 52.3, 13.6, 52.6)))}
    assert [h.id for h in fresh_index.search(Query(bbox=(-70.2, -33.6, -69.9, -33.3)))] == ["s02-berlin"]
    assert "s02-berlin" in {h.id for h in fresh_index.search(Query(filters=("eo:cloud_cover<2",)))}
    items = [moved.to_item() if it["id"] == "s02-berlin" else it for it in ITEMS]
    for q in CASES:
        assert [h.id for h in fresh_index.search(q)] == brute_force(items, q), _case_id(q)
    # geohash rows follow the move
    old_cell = SYNTH[1].to_item()["properties"]["cubelake:geohash6"][0]
    assert "s02-berlin" not in {h.id for h in fresh_index.search(Query(geohash=old_cell))}


def test_insert_items_again_replaces(fresh_index: CatalogIndex) -> None:
    before = fresh_index.stats()
    assert fresh_index.insert_items(ITEMS, batch_size=5) == len(ITEMS)
    assert len(fresh_index) == len(ITEMS)
    after = fresh_index.stats()
    assert (after["bands"], after["geohash_cells"]) == (before["bands"], before["geohash_cells"])


def test_delete_removes_every_trace(fresh_index: CatalogIndex) -> None:
    before = fresh_index.stats()
    gone = _item("s01-triangle")
    assert fresh_index.delete("s01-triangle") is True
    assert fresh_index.delete("s01-triangle") is False
    assert fresh_index.get("s01-triangle") is None
    after = fresh_index.stats()
    assert after["items"] == before["items"] - 1
    assert after["bands"] == before["bands"] - len(bands_of(gone))
    assert after["geohash_cells"] == before["geohash_cells"] - len(gone["properties"]["cubelake:geohash6"])
    rest = [it for it in ITEMS if it["id"] != "s01-triangle"]
    for q in CASES:
        assert [h.id for h in fresh_index.search(q)] == brute_force(rest, q), _case_id(q)


def test_stats_count_what_was_inserted(index: CatalogIndex) -> None:
    s = index.stats()
    assert s["items"] == len(ITEMS)
    assert s["bands"] == sum(len(bands_of(it)) for it in ITEMS)
    assert s["geohash_cells"] == sum(len(it["properties"]["cubelake:geohash6"]) for it in ITEMS)
    for coll in {it["collection"] for it in ITEMS}:
        members = [it for it in ITEMS if it["collection"] == coll]
        c = s["collections"][coll]
        assert c["items"] == len(members)
        assert c["georeferenced"] == sum(it["geometry"] is not None for it in members)
        assert c["unknown_time"] == sum(_item_time(it["properties"]) is None for it in members)
        counts = [len(bands_of(it)) for it in members]
        assert c["bands"] == [min(counts), max(counts)]
        known = [t for it in members if (t := _item_time(it["properties"])) is not None]
        assert _utc(c["start"]) == min(a for a, _ in known)
        assert _utc(c["end"]) == max(b for _, b in known)


# -- the real lake ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_items(real_lake: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((real_lake / "scenes").glob("*/item.json"))]


@pytest.fixture(scope="module")
def real_catalog(real_lake: Path) -> Iterator[LakeCatalog]:
    cat = LakeCatalog(real_lake)
    yield cat
    cat.close()


def _real_cases(items: list[dict[str, Any]]) -> list[Query]:
    enmap = next(it for it in items if it["collection"] == "enmap-l2a")
    w, s, e, n = enmap["bbox"]
    c = shape(enmap["geometry"]).centroid
    cell = enmap["properties"]["cubelake:geohash6"][0]
    return [
        Query(),
        Query(wavelength_nm="450:1300"),
        Query(wavelength_nm="400:2400"),
        Query(wavelength_nm="1300:1500"),
        Query(wavelength_nm="1500:1700"),
        Query(wavelength_nm="550:590"),
        Query(datetime="2022-07-24"),
        Query(datetime="1970/.."),
        Query(datetime="../2016-12-31", sort=("-datetime",)),
        Query(bbox=(w, s, e, n)),
        Query(bbox=((w + e) / 2, (s + n) / 2, (w + e) / 2 + 1e-4, (s + n) / 2 + 1e-4)),
        Query(intersects={"type": "Point", "coordinates": [c.x, c.y]}),
        Query(geohash=cell[:4]),
        Query(geohash=cell),
        Query(filters=("platform=enmap",)),
        Query(filters=("eo:cloud_cover<0.1",)),
        Query(filters=("eo:cloud_cover<10",), sort=("-eo:cloud_cover",)),
        Query(filters=("cubelake:quality>=0.8",)),
        Query(min_bands=200),
        Query(collections=("aviris-ng-radiance", "generic")),
        Query(sort=("-datetime",), limit=4),
        Query(bbox="-180,-90,180,90", datetime="2010/2020", sort=("id",)),
    ]


def test_real_lake_search_equals_brute_force(real_catalog: LakeCatalog, real_items: list[dict[str, Any]]) -> None:
    for q in _real_cases(real_items):
        assert [h.id for h in real_catalog.search(q)] == brute_force(real_items, q), _case_id(q)


def test_real_lake_spectral_temporal_and_property_answers(real_catalog: LakeCatalog, real_ingest: RealLake) -> None:
    def ids(q: Query) -> set[str]:
        return {h.id for h in real_catalog.search(q)}

    enmap, landsat, aviris = set(real_ingest.ids["enmap"]), set(real_ingest.ids["landsat"]), set(real_ingest.ids["aviris"])
    samson = real_ingest.ids["samson"][0]
    # EnMAP's first kept band starts at ~415 nm: 450-1300 is covered, 400-2400 is not (nor the 1400 gap)
    assert enmap | aviris <= ids(Query(wavelength_nm="450:1300"))
    assert not (enmap | landsat) & ids(Query(wavelength_nm="400:2400"))
    assert not enmap & ids(Query(wavelength_nm="1350:1450"))
    assert not landsat & ids(Query(wavelength_nm="450:1300"))  # one band is no spectrum
    assert ids(Query(datetime="2022-07-24")) == enmap
    assert samson in ids(Query())
    assert samson not in ids(Query(datetime="1970/.."))
    assert ids(Query(filters=("platform=enmap",))) == enmap
    cloud = {h.id: h.properties["eo:cloud_cover"] for h in real_catalog.search(Query(filters=("eo:cloud_cover<10",)))}
    assert set(cloud) == landsat
    assert ids(Query(filters=(f"eo:cloud_cover<{(min(cloud.values()) + max(cloud.values())) / 2}",))) == \
        {min(cloud, key=cloud.__getitem__)}
    assert [h.id for h in real_catalog.search(Query(filters=("eo:cloud_cover<10",), sort=("-eo:cloud_cover",)))] == \
        sorted(cloud, key=lambda k: -cloud[k])
