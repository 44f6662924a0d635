"""CQL2 filters on the index agree with cql2-rs's own evaluator (``Expr.matches``) item by item, and
hostile or unsupported filters are refused by name before they reach the parser."""

from __future__ import annotations

import random
import time

import cql2
import pytest
from shapely.geometry import Point, box

from cubelake.catalog import CatalogIndex, Query
from cubelake.catalog.cql import parse_cql2
from cubelake.errors import CatalogQueryError

from .conftest import Synth

PLATFORMS = ("enmap", "prisma", "desis", "EnMAP", "landsat-8")


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
