"""Catalog query parsing: bbox, datetime intervals, property filters, sort keys, and parse_query's errors."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from shapely.geometry import MultiPolygon, box

from cubelake.catalog.query import (
    ParsedQuery,
    PropertyFilter,
    Query,
    epoch,
    iso,
    parse_bbox,
    parse_datetime_interval,
    parse_filter,
    parse_intersects,
    parse_query,
    parse_sort,
)
from cubelake.errors import CatalogError, CatalogQueryError


def ts(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()  # type: ignore[misc]


# --- bbox -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ((1, 2, 3, 4), (1.0, 2.0, 3.0, 4.0)),
        ([-10.5, -20.25, 30, 40], (-10.5, -20.25, 30.0, 40.0)),
        # a 3D bbox drops its heights: west, south, zmin, east, north, zmax
        ((1, 2, -100, 3, 4, 5000), (1.0, 2.0, 3.0, 4.0)),
        ("1,2,3,4", (1.0, 2.0, 3.0, 4.0)),
        (" -180 , -90 , 180 , 90 ", (-180.0, -90.0, 180.0, 90.0)),
        ("1,2,0,3,4,10", (1.0, 2.0, 3.0, 4.0)),
        # west > east is allowed: it crosses the antimeridian
        ((170, -10, -170, 10), (170.0, -10.0, -170.0, 10.0)),
        ((5, 5, 5, 5), (5.0, 5.0, 5.0, 5.0)),
    ],
)
def test_parse_bbox(value: Any, expected: tuple[float, float, float, float]) -> None:
    assert parse_bbox(value) == expected


@pytest.mark.parametrize(
    ("value", "fragments"),
    [
        ((0, 10, 1, 5), ["south 10.0 is north of north 5.0", "west,south,east,north"]),
        ("0,10,1,5", ["south 10.0 is north of north 5.0", "west,south,east,north"]),
        ((181, 0, 182, 1), ["longitudes must be within -180..180", "west 181.0", "west,south,east,north"]),
        ((0, 0, -180.5, 1), ["longitudes must be within -180..180", "east -180.5"]),
        # lat,lon order by mistake: a latitude of 120 is out of range
        ((10, 120, 20, 130), ["latitudes must be within -90..90", "south 120.0", "west,south,east,north"]),
        ((0, -91, 1, 0), ["latitudes must be within -90..90"]),
        (("a", "b", "c", "d"), ["expected 4 numbers west,south,east,north"]),
        ("1,2,x,4", ["expected 4 numbers"]),
        ("", ["expected 4 numbers"]),
        ((1, None, 3, 4), ["expected 4 numbers"]),
        ((1, 2, 3), ["expected 4 finite numbers"]),
        ((1, 2, 3, 4, 5), ["expected 4 finite numbers"]),
        ((), ["expected 4 finite numbers"]),
        ((1, 2, float("nan"), 4), ["expected 4 finite numbers"]),
        ((1, 2, float("inf"), 4), ["expected 4 finite numbers"]),
    ],
)
def test_parse_bbox_errors(value: Any, fragments: list[str]) -> None:
    with pytest.raises(CatalogQueryError) as info:
        parse_bbox(value)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_antimeridian_bbox_splits_into_two_boxes() -> None:
    pq = parse_query(Query(bbox=(170, -10, -170, 10)))
    assert pq.boxes == ((170.0, -10.0, 180.0, 10.0), (-180.0, -10.0, -170.0, 10.0))
    assert isinstance(pq.geometry, MultiPolygon)
    assert pq.geometry.area == pytest.approx(2 * 10 * 20)
    assert pq.geometry.contains(box(175, -5, 179, 5))
    assert pq.geometry.contains(box(-179, -5, -175, 5))
    assert not pq.geometry.intersects(box(0, -5, 10, 5))


def test_plain_bbox_is_one_box() -> None:
    pq = parse_query(Query(bbox="10,40,12,42"))
    assert pq.boxes == ((10.0, 40.0, 12.0, 42.0),)
    assert pq.geometry is not None
    assert pq.geometry.equals(box(10, 40, 12, 42))


# --- datetime ---------------------------------------------------------------------------------

T = ts(2022, 7, 24, 10, 45, 26)


@pytest.mark.parametrize(
    "text",
    [
        "2022-07-24T10:45:26Z",
        "2022-07-24T10:45:26z",
        "2022-07-24T10:45:26+00:00",
        "2022-07-24T12:45:26+02:00",
        "2022-07-24T05:45:26-05:00",
        "2022-07-24T10:45:26",  # naive = UTC
        " 2022-07-24T10:45:26Z ",
    ],
)
def test_datetime_instant(text: str) -> None:
    assert parse_datetime_interval(text) == (T, T)


def test_datetime_fraction_of_a_second() -> None:
    start, end = parse_datetime_interval("2022-07-24T10:45:26.250Z")
    assert start == end == pytest.approx(T + 0.25, abs=1e-6)


@pytest.mark.parametrize(
    ("text", "start", "next_start"),
    [
        ("2022", ts(2022, 1, 1), ts(2023, 1, 1)),
        ("2022-07", ts(2022, 7, 1), ts(2022, 8, 1)),
        ("2022-12", ts(2022, 12, 1), ts(2023, 1, 1)),  # December ends at the next year
        ("2024-02", ts(2024, 2, 1), ts(2024, 3, 1)),  # leap February
        ("2022-07-24", ts(2022, 7, 24), ts(2022, 7, 25)),
        ("2022-12-31", ts(2022, 12, 31), ts(2023, 1, 1)),
        ("2022-06/2022-08", ts(2022, 6, 1), ts(2022, 9, 1)),
        ("2022-07-24/2022-07-24", ts(2022, 7, 24), ts(2022, 7, 25)),
        ("2021/2022-02-28T12:00:00Z", ts(2021, 1, 1), ts(2022, 2, 28, 12)),
    ],
)
def test_datetime_partial_dates_mean_their_whole_span(text: str, start: float, next_start: float) -> None:
    a, b = parse_datetime_interval(text)
    assert a == start
    assert b is not None
    if "T" in text:
        assert b == next_start  # a full time is an instant, not a span
    else:
        # the last instant of the span: within a microsecond of the next one, and before it
        assert b < next_start
        assert b == pytest.approx(next_start, abs=2e-6)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("../2020-01-01", (None, ts(2020, 1, 2) - 1e-6)),
        ("/2020-01-01", (None, ts(2020, 1, 2) - 1e-6)),
        ("2020-01-01/..", (ts(2020, 1, 1), None)),
        ("2020-01-01/", (ts(2020, 1, 1), None)),
        ("2020-01-01T00:00:00Z/..", (ts(2020, 1, 1), None)),
        ((None, "2020"), (None, ts(2021, 1, 1) - 1e-6)),
        (("2020-03", None), (ts(2020, 3, 1), None)),
        (("2020-03", ".."), (ts(2020, 3, 1), None)),
        (("2020-03-01", "2020-03-02"), (ts(2020, 3, 1), ts(2020, 3, 3) - 1e-6)),
    ],
)
def test_datetime_open_ends(value: Any, expected: tuple[float | None, float | None]) -> None:
    got = parse_datetime_interval(value)
    for g, e in zip(got, expected, strict=True):
        if e is None:
            assert g is None
        else:
            assert g == pytest.approx(e, abs=2e-6)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("../..", "both ends are open"),
        ("/", "both ends are open"),
        ((None, None), "both ends are open"),
        (("..", ""), "both ends are open"),
        ("2022-08-01/2022-07-01", "the start is after the end"),
        ("2022-07-24T11:00:00Z/2022-07-24T10:00:00Z", "the start is after the end"),
        ("2023/2022", "the start is after the end"),
        ("yesterday", "not ISO 8601"),
        ("2022-07-24 noon", "not ISO 8601"),
        ("24/07/2022", "not ISO 8601"),
        ("2022-13", "month must be in 1..12"),
        ("2022-02-30", "day is out of range"),
        ("2022-07-24T25:00:00Z", "not ISO 8601"),
    ],
)
def test_datetime_errors(value: Any, fragment: str) -> None:
    with pytest.raises(CatalogQueryError) as info:
        parse_datetime_interval(value)
    assert fragment in str(info.value)


def test_datetime_error_explains_the_accepted_forms() -> None:
    with pytest.raises(CatalogQueryError) as info:
        parse_datetime_interval("last tuesday")
    message = str(info.value)
    assert "'last tuesday'" in message
    assert "2022-07-24T10:45:26Z" in message
    assert "'..'" in message


def test_epoch_and_iso_round_trip() -> None:
    assert epoch("2022-07-24T10:45:26Z") == T
    assert epoch("2022-07-24") == ts(2022, 7, 24)
    assert iso(T) == "2022-07-24T10:45:26Z"
    assert epoch(iso(T + 0.5)) == T + 0.5


# --- filters and sort -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("eo:cloud_cover<10", PropertyFilter("eo:cloud_cover", "<", 10.0)),
        ("cubelake:quality>=0.8", PropertyFilter("cubelake:quality", ">=", 0.8)),
        ("eo:cloud_cover <= 5", PropertyFilter("eo:cloud_cover", "<=", 5.0)),
        ("  view:sun_elevation > -5  ", PropertyFilter("view:sun_elevation", ">", -5.0)),
        ("x<-5", PropertyFilter("x", "<", -5.0)),
        ("gsd>=1e1", PropertyFilter("gsd", ">=", 10.0)),
        ("platform=enmap", PropertyFilter("platform", "=", "enmap")),
        ("platform==enmap", PropertyFilter("platform", "=", "enmap")),
        ("platform!=enmap", PropertyFilter("platform", "!=", "enmap")),
        ("platform='landsat-8'", PropertyFilter("platform", "=", "landsat-8")),
        ('platform="landsat 8"', PropertyFilter("platform", "=", "landsat 8")),
        # quotes keep a number-looking value a string
        ("landsat:wrs_path='106'", PropertyFilter("landsat:wrs_path", "=", "106")),
        ("landsat:wrs_path=106", PropertyFilter("landsat:wrs_path", "=", 106.0)),
        ("sar:on=true", PropertyFilter("sar:on", "=", True)),
        ("sar:on!=False", PropertyFilter("sar:on", "!=", False)),
        ("proj.code=EPSG:32633", PropertyFilter("proj.code", "=", "EPSG:32633")),
    ],
)
def test_parse_filter(text: str, expected: PropertyFilter) -> None:
    got = parse_filter(text)
    assert got == expected
    assert type(got.value) is type(expected.value)


def test_parse_filter_passes_a_property_filter_through() -> None:
    f = PropertyFilter("eo:cloud_cover", "<", 10.0)
    assert parse_filter(f) is f
    assert str(f) == "eo:cloud_cover<10.0"


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("eo:cloud_cover", ["expected PROPERTY OP VALUE", "< <= > >= = !="]),
        ("eo:cloud_cover 10", ["expected PROPERTY OP VALUE"]),
        ("<10", ["expected PROPERTY OP VALUE"]),
        ("eo:cloud_cover<", ["expected PROPERTY OP VALUE"]),
        ("", ["expected PROPERTY OP VALUE"]),
        ("9lives=1", ["expected PROPERTY OP VALUE"]),
        ("platform<enmap", ["< needs a number", "'enmap'"]),
        ("platform>='5'", [">= needs a number", "\"'5'\""]),
        ("sar:on>true", ["> needs a number"]),
    ],
)
def test_parse_filter_errors(text: str, fragments: list[str]) -> None:
    with pytest.raises(CatalogQueryError) as info:
        parse_filter(text)
    assert repr(text) in str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ((), ()),
        (("datetime",), (("datetime", False),)),
        (
            ("-datetime", "+id", " -eo:cloud_cover ", "collection"),
            (("datetime", True), ("id", False), ("eo:cloud_cover", True), ("collection", False)),
        ),
    ],
)
def test_parse_sort(keys: tuple[str, ...], expected: tuple[tuple[str, bool], ...]) -> None:
    assert parse_sort(keys) == expected


@pytest.mark.parametrize("key", ["", "-", "+", "  "])
def test_parse_sort_rejects_empty_keys(key: str) -> None:
    with pytest.raises(CatalogQueryError, match="is empty"):
        parse_sort([key])


# --- parse_query ------------------------------------------------------------------------------

SQUARE = {"type": "Polygon", "coordinates": [[[10, 40], [12, 40], [12, 42], [10, 42], [10, 40]]]}


def test_parse_query_canonicalises_every_part() -> None:
    pq = parse_query(Query(
        bbox=[10, 40, 12, 42], datetime="2022-07", collections=["enmap-l2a"], ids=("a", "b"),
        wavelength_nm="0.4:2.4um", min_bands=50, geohash=" SR2 ",
        filters=("eo:cloud_cover<10",), sort=("-datetime",), limit=5,
    ))
    assert pq.boxes == ((10.0, 40.0, 12.0, 42.0),)
    assert (pq.t_start, pq.has_time) == (ts(2022, 7, 1), True)
    assert pq.t_end == pytest.approx(ts(2022, 8, 1), abs=2e-6)
    assert pq.collections == ("enmap-l2a",)
    assert pq.ids == ("a", "b")
    assert pq.wavelength_nm == pytest.approx((400.0, 2400.0))
    assert pq.min_bands == 50
    assert pq.geohash == "sr2"
    assert pq.filters == (PropertyFilter("eo:cloud_cover", "<", 10.0),)
    assert pq.sort == (("datetime", True),)
    assert pq.limit == 5


def test_parse_query_empty() -> None:
    pq = parse_query(Query())
    assert pq.boxes == ()
    assert pq.geometry is None
    assert (pq.t_start, pq.t_end, pq.has_time) == (None, None, False)
    assert pq.limit is None


@pytest.mark.parametrize("value", [(400, 2400), (400.0, 2400.0), "400:2400"])
def test_parse_query_wavelength_forms(value: Any) -> None:
    assert parse_query(Query(wavelength_nm=value)).wavelength_nm == (400.0, 2400.0)


@pytest.mark.parametrize("intersects", [SQUARE, json.dumps(SQUARE), {"type": "Feature", "properties": {}, "geometry": SQUARE}])
def test_parse_query_intersects_forms(intersects: Any) -> None:
    pq = parse_query(Query(intersects=intersects))
    assert pq.geometry is not None
    assert pq.geometry.equals(box(10, 40, 12, 42))
    assert pq.boxes == ((10.0, 40.0, 12.0, 42.0),)


def test_parse_query_bbox_and_intersects_intersect() -> None:
    pq = parse_query(Query(bbox=(11, 41, 20, 50), intersects=SQUARE))
    assert pq.geometry is not None
    assert pq.geometry.equals(box(11, 41, 12, 42))
    assert pq.boxes == ((11.0, 41.0, 20.0, 50.0),)


def _index_would_match(pq: Any, item: Any) -> bool:
    """What the index does with a ParsedQuery: an R*Tree test on the boxes, then the exact geometry test."""
    w, s, e, n = item.bounds
    in_boxes = not pq.boxes or any(bw <= e and be >= w and bs <= n and bn >= s for bw, bs, be, bn in pq.boxes)
    return in_boxes and (pq.geometry is None or pq.geometry.intersects(item))


BIG = {"type": "Polygon", "coordinates": [[[-5, -5], [5, -5], [5, 5], [-5, 5], [-5, -5]]]}


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (box(-1, -1, 1, 1), False),  # covers 0°, 0° and meets the geometry, but not the bbox
        (box(10.2, 10.2, 10.4, 10.4), False),  # inside the bbox, not the geometry
        (box(2, 2, 3, 3), False),
        (box(-50, -50, 50, 50), False),  # meets both, but they are disjoint: nothing is in both
    ],
)
def test_disjoint_bbox_and_intersects_match_nothing(item: Any, expected: bool) -> None:
    pq = parse_query(Query(bbox=(10, 10, 11, 11), intersects=BIG))
    assert pq.geometry is not None
    assert pq.geometry.is_empty
    assert _index_would_match(pq, item) is expected


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (box(-1, -1, 1, 1), True),
        (box(3.5, 3.5, 4.5, 4.5), False),  # meets the geometry outside the bbox
        (box(-3, -3, -2.5, -2.5), True),
        (box(10, 10, 11, 11), False),
    ],
)
def test_overlapping_bbox_and_intersects_match_their_intersection(item: Any, expected: bool) -> None:
    pq = parse_query(Query(bbox=(-3, -3, 3, 3), intersects=BIG))
    assert _index_would_match(pq, item) is expected


@pytest.mark.parametrize(
    ("query", "fragment"),
    [
        (Query(wavelength_nm="2400:400"), "wavelength range '2400:400' is not valid"),
        (Query(wavelength_nm="abc"), "wavelength range 'abc' is not valid"),
        (Query(wavelength_nm=(2400, 400)), "LO <= HI"),
        (Query(wavelength_nm=("a", "b")), "could not convert"),
        (Query(wavelength_nm=(-5, 10)), "is not valid"),
        (Query(geohash="ezsa"), "not 'a'"),
        (Query(geohash=""), "1-12 characters"),
        (Query(geohash="u" * 13), "longer than 12"),
        (Query(limit=-1), "limit must be >= 0, got -1"),
        (Query(min_bands=0), "min_bands must be >= 1, got 0"),
        (Query(min_bands=-3), "min_bands must be >= 1"),
        (Query(bbox=(0, 10, 1, 5)), "west,south,east,north"),
        (Query(datetime="../.."), "both ends are open"),
        (Query(filters=("cloud",)), "expected CQL2 text (e.g. \"eo:cloud_cover < 10 AND platform IN ('enmap')\") or PROPERTY OP VALUE"),
        (Query(sort=("-",)), "is empty"),
        (Query(intersects="not json"), "intersects: not usable as a search geometry"),
        (Query(intersects="[1, 2]"), "intersects: not usable as a search geometry"),
        (Query(intersects={"type": "Point"}), "intersects: not usable as a search geometry"),
        (Query(intersects={"foo": 1}), "intersects: not usable as a search geometry"),
        (Query(intersects={"type": "Feature"}), "intersects: not usable as a search geometry"),
        (Query(intersects={"type": "Polygon", "coordinates": []}), "intersects: the geometry is empty"),
        (Query(intersects={"type": "Point", "coordinates": [200, 10]}), "must be WGS84 lon/lat degrees"),
        (Query(intersects={"type": "Point", "coordinates": [10, -95]}), "must be WGS84 lon/lat degrees"),
        (
            Query(intersects={"type": "Polygon", "coordinates": [[[500000, 4000000], [500100, 4000000],
                                                                  [500100, 4000100], [500000, 4000000]]]}),
            "must be WGS84 lon/lat degrees",
        ),
    ],
)
def test_parse_query_errors_are_catalog_query_errors(query: Query, fragment: str) -> None:
    with pytest.raises(CatalogQueryError) as info:
        parse_query(query)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, CatalogError)


def test_parse_query_limit_zero_is_allowed() -> None:
    assert parse_query(Query(limit=0)).limit == 0


def test_parse_query_repairs_an_invalid_polygon() -> None:
    bowtie = {"type": "Polygon", "coordinates": [[[0, 0], [2, 2], [2, 0], [0, 2], [0, 0]]]}
    pq = parse_query(Query(intersects=bowtie))
    assert pq.geometry is not None
    assert pq.geometry.is_valid
    assert pq.geometry.area == pytest.approx(2.0)


# -- --intersects: the GeoJSON a user has (a Feature, a FeatureCollection, a bare geometry) ----------------
def _feature(geometry: dict[str, Any] | None) -> dict[str, Any]:
    return {"type": "Feature", "properties": {"name": "field"}, "geometry": geometry}


OTHER = {"type": "Polygon", "coordinates": [[[20, 40], [21, 40], [21, 41], [20, 41], [20, 40]]]}


@pytest.mark.parametrize("doc", [
    {"type": "FeatureCollection", "features": [_feature(SQUARE), _feature(OTHER)]},
    {"type": "FeatureCollection", "features": [_feature(SQUARE), _feature(None), _feature(OTHER)]},
    {"type": "GeometryCollection", "geometries": [SQUARE, OTHER]},
    {"type": "MultiPolygon", "coordinates": [SQUARE["coordinates"], OTHER["coordinates"]]},
])
def test_intersects_takes_the_union_of_a_collection(doc: dict[str, Any]) -> None:
    for value in (doc, json.dumps(doc)):
        geom = parse_intersects(value)
        assert geom.equals(box(10, 40, 12, 42).union(box(20, 40, 21, 41)))
        pq = parse_query(Query(intersects=value))
        assert pq.geometry is not None
        assert pq.geometry.equals(geom)


@pytest.mark.parametrize(("doc", "needle"), [
    ({"type": "FeatureCollection", "features": []}, "no feature geometry"),
    ({"type": "FeatureCollection", "features": [_feature(None)]}, "no feature geometry"),
    ({"type": "FeatureCollection"}, "without a 'features' list"),
    ({"type": "FeatureCollection", "features": {"a": 1}}, "without a 'features' list"),
    (_feature(None), "a Feature without a geometry"),
    ({"type": "Topology", "objects": {}}, "'Topology' is not a GeoJSON geometry, Feature or FeatureCollection"),
    ([1, 2], "expected a GeoJSON object, got a JSON list"),
    ('{"type": "FeatureCollection", "features": [', "not usable as a search geometry"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ({"type": "FeatureCollection", "features": [_feature({"type": "Point", "coordinates": [200, 0]})]},
     "must be WGS84 lon/lat degrees"),
])
def test_intersects_errors_name_the_source(doc: Any, needle: str) -> None:
    with pytest.raises(CatalogQueryError) as exc:
        parse_intersects(doc if isinstance(doc, str) else json.dumps(doc), "fields/field.geojson")
    assert str(exc.value).startswith("fields/field.geojson: ")
    assert needle in str(exc.value)


def test_one_band_is_the_smallest_min_bands() -> None:
    assert parse_query(Query(min_bands=1)).min_bands == 1


def test_a_query_is_an_immutable_value() -> None:
    import dataclasses

    q = Query(ids=["a"], limit=5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.limit = 6  # type: ignore[misc]
    assert q == Query(ids=["a"], limit=5)
    f = parse_filter("eo:cloud_cover < 5")
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.value = 50  # type: ignore[misc]
    pq = parse_query(q)
    with pytest.raises(dataclasses.FrozenInstanceError):
        pq.limit = 6  # type: ignore[misc]


@pytest.mark.parametrize(("doc", "match"), [
    ({"type": "Box", "coordinates": [0, 0]}, "type 'Box' is not a GeoJSON geometry, Feature or FeatureCollection"),
    ({"type": "Polygon", "coordinates": [[[-190, 0], [-170, 0], [-170, 10], [-190, 0]]]}, "bounds are"),
    ({"type": "Polygon", "coordinates": [[[10, 80], [20, 80], [20, 95], [10, 80]]]}, "bounds are"),
])
def test_a_search_geometry_must_be_geojson_in_lon_lat(doc: dict[str, Any], match: str) -> None:
    with pytest.raises(CatalogQueryError, match=match):
        parse_intersects(doc)


def test_a_parsed_query_built_by_hand_constrains_nothing_as_an_empty_query_does() -> None:
    # index.search takes a ParsedQuery as is: its defaults must mean "everything", as parse_query(Query()) does
    assert parse_query(Query()) == ParsedQuery()


def test_the_offset_skips_matches_and_is_never_negative() -> None:
    assert parse_query(Query(offset=25)).offset == 25
    with pytest.raises(CatalogQueryError, match="offset must be >= 0, got -1"):
        parse_query(Query(offset=-1))
