"""CQL2 filters on the index agree with cql2-rs's own evaluator (``Expr.matches``) item by item, and
hostile or unsupported filters are refused by name before they reach the parser."""

from __future__ import annotations

import random
import time
from pathlib import Path

import cql2
import pytest
from shapely.geometry import Point, box

from cubelake.catalog import CatalogIndex, Query
from cubelake.catalog.cql import parse_cql2
from cubelake.errors import CatalogQueryError

from .conftest import Synth

PLATFORMS = ("enmap", "prisma", "desis", "EnMAP", "landsat-8")
VNIR = [(0.40 + 0.01 * k, 0.012) for k in range(61)]  # 0.394-1.006 um, no gaps
SWIR = [(1.50 + 0.01 * k, 0.012) for k in range(101)]  # 1.494-2.506 um


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[CatalogIndex, list[dict]]:
    rng = random.Random(7)
    items = []
    for n in range(120):
        # small footprints (<= 0.4 degrees): each item's geohash cover stays a few thousand cells
        x, y = rng.uniform(-2, 2), rng.uniform(-1, 1)
        geom = Point(x, y) if n % 3 == 0 else box(x, y, x + rng.uniform(0.01, 0.4), y + rng.uniform(0.01, 0.4))
        day = rng.randrange(1, 29)
        items.append(Synth(f"i{n:03d}", collection=("a", "b")[n % 2], geometry=geom,
                           datetime=f"2022-{1 + n % 12:02d}-{day:02d}T{n % 24:02d}:00:00Z",
                           bands_um=VNIR if n % 2 else SWIR,
                           properties={"eo:cloud_cover": rng.randrange(0, 100), "platform": PLATFORMS[n % 5],
                                       "gsd": (30, 60, 5.5)[n % 3], "cubelake:quality": round(rng.random(), 3),
                                       "sat:ok": n % 4 == 0}).to_item())
    idx = CatalogIndex(tmp_path_factory.mktemp("cql2") / "index.sqlite")
    idx.insert_items(items)
    return idx, items


EXPRESSIONS = [
    "eo:cloud_cover < 30", "eo:cloud_cover <= 30 AND gsd = 30", "eo:cloud_cover > 90 OR gsd = 5.5",
    "NOT (eo:cloud_cover >= 50)", "gsd <> 30", "platform = 'enmap'", "platform <> 'enmap'",
    "platform IN ('enmap', 'desis')", "eo:cloud_cover BETWEEN 10 AND 20", "platform LIKE 'en%'",
    "platform LIKE 'En%'", "platform LIKE '_andsat-_'", "collection = 'a' AND id LIKE 'i0%'", "id = 'i007'",
    "sat:ok = true", "sat:ok = false AND cubelake:quality > 0.5", "20 > eo:cloud_cover",
    "S_INTERSECTS(geometry, BBOX(-0.5, -0.5, 0.5, 0.5))", "S_WITHIN(geometry, POLYGON((-1 -1, 1 -1, 1 1, -1 1, -1 -1)))",
    "S_CONTAINS(geometry, POINT(0.05 0.05))", "S_DISJOINT(geometry, BBOX(-0.5, -0.5, 0.5, 0.5))",
    "S_INTERSECTS(geometry, POINT(0.1 0.1)) OR S_OVERLAPS(geometry, BBOX(0, 0, 1, 1))",
    "T_INTERSECTS(datetime, INTERVAL('2022-03-01T00:00:00Z', '2022-05-31T23:59:59Z'))",
    "T_BEFORE(datetime, TIMESTAMP('2022-04-01T00:00:00Z'))", "T_AFTER(datetime, TIMESTAMP('2022-10-15T00:00:00Z'))",
    "T_DURING(datetime, INTERVAL('2022-02-01T00:00:00Z', '2022-03-01T00:00:00Z'))",
    "T_DISJOINT(datetime, INTERVAL('2022-01-01T00:00:00Z', '2022-06-30T00:00:00Z'))",
    "T_INTERSECTS(datetime, INTERVAL('..', '2022-02-10T00:00:00Z'))",
    "datetime >= TIMESTAMP('2022-06-01T00:00:00Z') AND datetime < TIMESTAMP('2022-07-01T00:00:00Z')",
    "T_EQUALS(datetime, TIMESTAMP('2022-01-15T00:00:00Z'))",
    "(eo:cloud_cover < 50 OR platform = 'prisma') AND NOT (collection = 'b' AND gsd > 40)",
    "eo:cloud_cover IS NULL OR id = 'i001'",
]


@pytest.mark.parametrize("text", EXPRESSIONS)
def test_the_index_agrees_with_cql2_rs_item_by_item(corpus: tuple[CatalogIndex, list[dict]], text: str) -> None:
    idx, items = corpus
    expr = cql2.parse_text(text)
    want = sorted(i["id"] for i in items if expr.matches(i))
    got = sorted(h.id for h in idx.search(Query(filter=text)))
    assert got == want
    assert sorted(h.id for h in idx.search(Query(filter=expr.to_json(), filter_lang="cql2-json"))) == want
    # and the same through the CLI's --filter (CQL2 text), ANDed with nothing
    assert sorted(h.id for h in idx.search(Query(filters=(text,)))) == want


def test_most_expressions_select_some_but_not_all(corpus: tuple[CatalogIndex, list[dict]]) -> None:
    idx, items = corpus
    sizes = {t: len(idx.search(Query(filter=t))) for t in EXPRESSIONS}
    vacuous = [t for t, n in sizes.items() if not 0 < n < len(items)]
    assert vacuous == ["S_CONTAINS(geometry, POINT(0.05 0.05))", "T_EQUALS(datetime, TIMESTAMP('2022-01-15T00:00:00Z'))"], sizes


def test_contains_and_equals_find_the_item_they_name(corpus: tuple[CatalogIndex, list[dict]]) -> None:
    idx, items = corpus
    item = next(i for i in items if i["geometry"]["type"] == "Polygon")
    (x0, y0), (x1, y1) = item["geometry"]["coordinates"][0][0], item["geometry"]["coordinates"][0][2]
    for text in (f"S_CONTAINS(geometry, POINT({(x0 + x1) / 2} {(y0 + y1) / 2}))",
                 f"T_EQUALS(datetime, TIMESTAMP('{item['properties']['datetime']}'))"):
        want = sorted(i["id"] for i in items if cql2.parse_text(text).matches(i))
        assert item["id"] in want
        assert sorted(h.id for h in idx.search(Query(filter=text))) == want


def test_cql2_and_the_simple_form_and_the_other_options_all_hold(corpus: tuple[CatalogIndex, list[dict]]) -> None:
    idx, items = corpus
    got = {h.id for h in idx.search(Query(filters=("eo:cloud_cover<50", "platform IN ('enmap')"), collections="a",
                                          filter="gsd = 30"))}
    want = {i["id"] for i in items if i["properties"]["eo:cloud_cover"] < 50 and i["properties"]["platform"] == "enmap"
            and i["collection"] == "a" and i["properties"]["gsd"] == 30}
    assert got == want


@pytest.mark.parametrize(("text", "words"), [
    ("NOT " * 600 + "a = 1", "nested too deeply"),
    ("a = " + "1 + " * 2000 + "1", "nested too deeply"),
    ("S_INTERSECTS(geometry, POLYGON(" + "(" * 40 + "0 0" + ")" * 40 + "))", "no geometry type nests more"),
    ("x" * 70_000 + " = 1", "over the limit"),
    ("eo:cloud_cover <", "not valid CQL2"),
    ("eo:cloud_cover + 1 > 3", "not supported"),
    ("CASEI(platform) = 'enmap'", "not supported"),
    ("A_CONTAINS(instruments, ('hsi'))", "not supported"),
    ("eo:cloud_cover = gsd", "two properties"),
    ("S_INTERSECTS(platform, POINT(0 0))", "geometry"),
    ("T_AFTER(gsd, TIMESTAMP('2022-01-01T00:00:00Z'))", "datetime"),
    ("cubelake:covers_wavelength(900, 400)", "lo <= hi"),
    ("cubelake:covers_wavelength('a', 2)", "two numbers"),
])
@pytest.mark.serial  # a time bound: run alone
def test_hostile_and_unsupported_filters_are_refused_by_name(corpus: tuple[CatalogIndex, list[dict]], text: str,
                                                             words: str) -> None:
    t0 = time.perf_counter()
    with pytest.raises(CatalogQueryError, match=words):
        corpus[0].search(Query(filter=text))
    assert time.perf_counter() - t0 < 5  # refused up front: cql2-rs is never left to recurse or backtrack


def test_json_filters_are_bounded_too() -> None:
    deep: dict = {"op": "=", "args": [{"property": "a"}, 1]}
    for _ in range(100):
        deep = {"op": "not", "args": [deep]}
    with pytest.raises(CatalogQueryError, match="nested deeper"):
        parse_cql2(deep)
    with pytest.raises(CatalogQueryError, match="not valid JSON"):
        parse_cql2("{not json", "cql2-json")
    with pytest.raises(CatalogQueryError, match="filter-lang"):
        parse_cql2("a = 1", "cql-text")


def test_covers_wavelength_is_the_bands_coverage(corpus: tuple[CatalogIndex, list[dict]]) -> None:
    idx, items = corpus
    vnir = sorted(i["id"] for n, i in enumerate(items) if n % 2)
    swir = sorted(i["id"] for n, i in enumerate(items) if not n % 2)
    assert sorted(h.id for h in idx.search(Query(filter="cubelake:covers_wavelength(450, 900)"))) == vnir
    assert sorted(h.id for h in idx.search(Query(filter="cubelake:covers_wavelength(1600, 2400)"))) == swir
    assert idx.search(Query(filter="cubelake:covers_wavelength(900, 1600)")) == []
    with pytest.raises(CatalogQueryError, match=r"need 0 < lo <= hi"):
        idx.search(Query(filter="cubelake:covers_wavelength(-5, 900)"))


def test_interval_items_and_their_start_and_end(tmp_path: Path) -> None:
    idx = CatalogIndex(tmp_path / "i.sqlite")
    idx.insert_items([Synth("span", geometry=box(0, 0, 1, 1), start="2022-03-01T00:00:00Z",
                            end="2022-03-31T00:00:00Z").to_item(),
                      Synth("instant", geometry=box(0, 0, 1, 1), datetime="2022-03-15T00:00:00Z").to_item()])

    def ids(text: str) -> list[str]:
        return sorted(h.id for h in idx.search(Query(filter=text)))

    # the span's end lies in the interval, its start does not: it intersects
    assert ids("T_INTERSECTS(datetime, INTERVAL('2022-03-20T00:00:00Z', '2022-04-10T00:00:00Z'))") == ["span"]
    assert ids("T_AFTER(end_datetime, TIMESTAMP('2022-03-20T00:00:00Z'))") == ["span"]
    assert ids("T_BEFORE(start_datetime, TIMESTAMP('2022-03-10T00:00:00Z'))") == ["span"]
    with pytest.raises(CatalogQueryError, match="starts after it ends"):
        ids("T_INTERSECTS(datetime, INTERVAL('2022-05-01T00:00:00Z', '2022-01-01T00:00:00Z'))")
    # a DATE given as a full time is that instant (JSON is not checked against the CQL2 schema)
    at = {"op": "=", "args": [{"property": "datetime"}, {"date": "2022-03-15T00:00:00Z"}]}
    assert sorted(h.id for h in idx.search(Query(filter=at))) == ["instant"]


def test_bbox_literals_with_heights_and_their_size() -> None:
    from shapely import from_wkb

    from cubelake.catalog.cql import _geometry_wkb

    wkb, bounds = _geometry_wkb({"bbox": [-0.5, -0.4, 0, 0.5, 0.6, 10]}, "s_intersects")
    assert bounds == (-0.5, -0.4, 0.5, 0.6)
    assert from_wkb(wkb).equals(box(-0.5, -0.4, 0.5, 0.6))
    for bad in ([0, 0, 1, 1, 2], [0, 0, 1], [0, 0, 1, float("nan")]):
        with pytest.raises(CatalogQueryError, match="BBOX needs 4 finite numbers"):
            _geometry_wkb({"bbox": bad}, "s_intersects")


def test_like_patterns_escape_and_globs_are_literal() -> None:
    from cubelake.catalog.cql import _glob

    assert _glob("a%b_c") == "a*b?c"
    assert _glob("50\\%\\_x") == "50%_x"
    assert _glob("a*b?[c") == "a[*]b[?][[]c"
    assert _glob("end\\") == "end\\"  # a trailing backslash escapes nothing


def test_the_spatial_function_never_matches_a_scene_without_footprint() -> None:
    import shapely

    from cubelake.catalog.cql import spatial_predicate

    wkb = bytes(shapely.to_wkb(box(0, 0, 1, 1)))
    assert spatial_predicate("s_intersects", None, wkb) == 0
    assert spatial_predicate("s_intersects", bytes(shapely.to_wkb(Point(0.5, 0.5))), wkb) == 1
    assert spatial_predicate("s_disjoint", bytes(shapely.to_wkb(Point(5, 5))), wkb) == 1


def test_errors_name_the_place_and_the_value(corpus: tuple[CatalogIndex, list[dict]]) -> None:
    idx = corpus[0]
    with pytest.raises(CatalogQueryError, match=r"at character 24 nests 5 parentheses deep; no geometry type nests more than 4$"):
        idx.search(Query(filter="S_INTERSECTS(geometry, POLYGON(((((0 0, 1 0, 1 1, 0 0))))))"))
    ok = "S_INTERSECTS(geometry, GEOMETRYCOLLECTION(MULTIPOLYGON(((0 0, 1 0, 1 1, 0 0))), POINT(1 1)))"
    assert isinstance(idx.search(Query(filter=ok)), list)  # 4 deep: the deepest a geometry nests
    with pytest.raises(CatalogQueryError, match=r"got 5\.0$"):
        idx.search(Query(filter="T_AFTER(datetime, 5)"))
    with pytest.raises(CatalogQueryError, match="needs a property on one side"):
        idx.search(Query(filter="TIMESTAMP('2022-01-01T00:00:00Z') = TIMESTAMP('2022-01-01T00:00:00Z')"))
    deep: dict = {"x": 1}
    for _ in range(100):
        deep = {"x": deep}  # objects inside objects, no list between them
    with pytest.raises(CatalogQueryError, match="nested deeper"):
        parse_cql2({"op": "=", "args": [{"property": "a"}, deep]})
