"""Bulk inserts: ``insert_items`` (batches written by a writer thread while the next is built, each
batch in a few multi-row statements, R*Tree boxes in Morton order) leaves exactly the index that
inserting the items one by one leaves, and fails as writing batch after batch would: every batch
before the failure committed, nothing after it, the error raised, the writer thread gone."""

from __future__ import annotations

import random
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from shapely.geometry import MultiPolygon, box

from cubelake.catalog import CatalogIndex, Query
from cubelake.catalog._writer import connect, morton_order, transaction, write_rows
from cubelake.catalog.index import index_rows
from cubelake.errors import CatalogError

from .conftest import Synth, spectrometer_um

BAND_TABLES = [spectrometer_um(400, 1000, 10), spectrometer_um(400, 2500, 10, gaps_nm=[(1350, 1450)]),
               [(0.49, 0.065), (0.56, 0.035), (0.665, 0.03)], [(None, None)] * 2]


def _synth(k: int, rng: random.Random) -> dict[str, Any]:
    """A varied item: plain, across the antimeridian, without location, of unknown time; mixed properties."""
    kind = k % 7
    x, y = rng.uniform(-170, 170), rng.uniform(-60, 70)
    geom: Any = box(x, y, x + rng.uniform(0.01, 0.1), y + rng.uniform(0.01, 0.1))  # small: short geohash covers
    bbox = None
    if kind == 3:
        geom = MultiPolygon([box(179.95, y, 180.0, y + 0.1), box(-180.0, y, -179.95, y + 0.1)])
        bbox = [179.95, y, -179.95, y + 0.1]
    elif kind == 4:
        geom = None
    day = rng.randint(1, 28)
    props: dict[str, Any] = {"eo:cloud_cover": round(rng.uniform(0, 100), 2), "platform": rng.choice(["a", "b"])}
    if kind == 5:
        props["gsd"] = rng.choice([30, 30.0, "30 m"])  # a property of two JSON types
    s = Synth(f"item-{k:04d}", collection=f"c{k % 3}", geometry=geom, bbox=bbox,
              datetime=None if kind == 6 else f"2021-03-{day:02d}T10:{k % 60:02d}:00Z",
              bands_um=BAND_TABLES[k % len(BAND_TABLES)], properties=props)
    return s.to_item()


def _items(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    items = [_synth(k, rng) for k in range(n)]
    # ids given again later (in the same batch and in later ones), with other content
    for k in (3, 10, 11, n - 2):
        again = _synth(k + 1000, rng)
        again["id"] = items[k]["id"]
        items.append(again)
    return items


def _contents(idx: CatalogIndex) -> dict[str, Any]:
    """Every table's rows, keyed by item id and band-set digest (rowids and band-set ids are internal)."""
    db = idx.db
    ids = dict(db.execute("SELECT rowid, id FROM items"))
    digests = dict(db.execute("SELECT id, digest FROM band_sets"))
    items = sorted((r[0], *r[1:-1], digests[r[-1]]) for r in db.execute(
        "SELECT id, collection, datetime, t0, t1, west, south, east, north, geometry, band_count, href, "
        "properties, band_set FROM items"))
    rtree = sorted((ids[r[0] // 2], r[0] % 2, *r[1:-1], digests[r[-1]]) for r in db.execute(
        "SELECT id, minx, maxx, miny, maxy, mint, maxt, band_set FROM items_rtree"))
    cells = sorted((c, ids[i]) for c, i in db.execute("SELECT cell, item FROM geohash"))
    sets = sorted(db.execute("SELECT digest, names, center_nm, fwhm_nm FROM band_sets"))
    coverage = sorted((digests[b], lo, hi) for b, lo, hi in db.execute("SELECT * FROM band_coverage"))
    queryables = sorted(db.execute("SELECT key, type FROM queryables"))
    return {"items": items, "rtree": rtree, "geohash": cells, "band_sets": sets, "coverage": coverage,
            "queryables": queryables}


def _upserted(path: Path, items: list[dict[str, Any]]) -> CatalogIndex:
    idx = CatalogIndex(path)
    for it in items:
        idx.upsert(it, f"scenes/{it['id']}/item.json")
    return idx


def _href(item: dict[str, Any]) -> str:
    return f"scenes/{item['id']}/item.json"


QUERIES = [Query(), Query(bbox=(-180, -90, 180, 90)), Query(bbox=(170, -60, -170, 75)),
           Query(bbox=(-20, 0, 60, 60), datetime="2021-03-05T00:00:00Z/2021-03-20T00:00:00Z"),
           Query(wavelength_nm="450:900"), Query(bbox=(0, 0, 100, 70), wavelength_nm="1500:1700"),
           Query(collections=["c1"], sort=["-datetime"], limit=7), Query(filters=["eo:cloud_cover<30"])]


@pytest.mark.parametrize("batch_size", [1, 7, 64, 10_000])
def test_bulk_insert_leaves_the_index_one_by_one_upserts_leave(tmp_path: Path, batch_size: int) -> None:
    items = _items(150)
    with _upserted(tmp_path / "one.sqlite", items) as one, CatalogIndex(tmp_path / "bulk.sqlite") as bulk:
        assert bulk.insert_items(items, batch_size=batch_size, href=_href) == len(items)
        assert _contents(bulk) == _contents(one)
        assert len(bulk) == 150
        for q in QUERIES:
            assert bulk.search(q) == one.search(q), q
        assert bulk.search(Query(limit=None))  # (the queries find something)


def test_a_bulk_insert_into_a_full_index_replaces_as_upserts_do(tmp_path: Path) -> None:
    first, second = _items(80, seed=1), _items(120, seed=2)  # the same ids, other content
    with _upserted(tmp_path / "one.sqlite", first + second) as one, CatalogIndex(tmp_path / "bulk.sqlite") as bulk:
        bulk.insert_items(first, batch_size=9, href=_href)
        bulk.insert_items(second, batch_size=13, href=_href)
        assert _contents(bulk) == _contents(one)
        for q in QUERIES:
            assert bulk.search(q) == one.search(q), q


def _writers_seen(items: list[dict[str, Any]], seen: list[int]) -> Iterator[dict[str, Any]]:
    """The items, noting how many writer threads run each time one is read."""
    for it in items:
        seen.append(len(_writer_threads()))
        yield it


def test_an_in_memory_index_is_written_from_the_calling_thread(tmp_path: Path) -> None:
    items = _items(30)
    seen: list[int] = []
    with CatalogIndex(":memory:") as idx:
        assert idx.insert_items(_writers_seen(items, seen), batch_size=4) == len(items)
        assert len(idx) == 30
        assert idx.holds(items[-1], None)
    assert len(seen) == len(items)
    assert max(seen) == 0
    seen.clear()  # while a file index is loaded, its writer thread runs
    with CatalogIndex(tmp_path / "i.sqlite") as idx:
        idx.insert_items(_writers_seen(items, seen), batch_size=4)
    assert max(seen) == 1


def test_statements_split_where_sqlite_allows_few_parameters(tmp_path: Path) -> None:
    items = _items(60)
    rows = {r.item[0]: r for r in (index_rows(it, _href(it)) for it in items)}  # the last of each id
    with _upserted(tmp_path / "one.sqlite", items) as one, CatalogIndex(tmp_path / "split.sqlite") as split:
        db = connect(split.path)
        db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 40)  # two items rows, four R*Tree rows a statement
        with transaction(db, split.path):
            write_rows(db, list(rows.values()))
        db.close()
        assert _contents(split) == _contents(one)


# -- failures --------------------------------------------------------------------------------------------
def _writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("index writer")]


def _counted(items: list[dict[str, Any]], seen: list[int]) -> Iterator[dict[str, Any]]:
    for it in items:
        seen.append(1)
        yield it


def test_a_bad_item_leaves_the_batches_before_it_and_nothing_after(tmp_path: Path) -> None:
    items = _items(40)[:40]
    bad = [*items[:10], {"id": "no-properties"}, *items[10:]]
    with CatalogIndex(tmp_path / "i.sqlite") as idx:
        with pytest.raises(CatalogError, match="not a STAC item"):
            idx.insert_items(bad, batch_size=4)
        # batches [0-3] and [4-7] were written; 8 and 9 were in the batch of the bad item
        assert idx.ids() == sorted(it["id"] for it in items[:8])
        assert not _writer_threads()
        # the search-only indexes dropped for the bulk load are back, and the index takes writes
        names = {n for (n,) in idx.db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert {"items_time", "items_collection", "items_cloud_cover"} <= names
        idx.upsert(items[20])
        assert idx.get(items[20]["id"]) is not None


def test_a_batch_sqlite_refuses_rolls_back_alone_and_stops_the_load(tmp_path: Path) -> None:
    items = _items(40)[:40]
    broken = dict(items[5], id="upside-down", bbox=[10.0, 5.0, 11.0, 4.0])  # south > north: the R*Tree refuses it
    seen: list[int] = []
    with CatalogIndex(tmp_path / "i.sqlite") as idx:
        with pytest.raises(CatalogError, match=r"i\.sqlite: writing the catalog index failed .*rtree constraint"):
            idx.insert_items(_counted([*items[:5], broken, *items[5:]], seen), batch_size=4)
        assert idx.ids() == sorted(it["id"] for it in items[:4])  # batch [4-7] failed whole
        assert len(seen) <= 12  # read ahead one batch at most, never the whole stream
        assert not _writer_threads()
        assert idx.insert_items(items[4:], batch_size=8) == 36
        assert len(idx) == 40


class _Interrupt(BaseException):
    """Stands in for KeyboardInterrupt."""


def test_an_interrupt_finishes_the_batch_in_flight_and_goes_through(tmp_path: Path) -> None:
    items = _items(40)[:40]

    def stream() -> Iterator[dict[str, Any]]:
        yield from items[:10]
        raise _Interrupt

    with CatalogIndex(tmp_path / "i.sqlite") as idx:
        with pytest.raises(_Interrupt):
            idx.insert_items(stream(), batch_size=4)
        assert idx.ids() == sorted(it["id"] for it in items[:8])
        assert not _writer_threads()


def test_a_failing_href_callback_is_raised_as_it_is(tmp_path: Path) -> None:
    items = _items(20)[:20]

    def href(item: dict[str, Any]) -> str:
        if item["id"] == items[13]["id"]:
            raise KeyError(item["id"])
        return _href(item)

    with CatalogIndex(tmp_path / "i.sqlite") as idx:
        with pytest.raises(KeyError, match=items[13]["id"]):
            idx.insert_items(items, batch_size=5, href=href)
        assert idx.ids() == sorted(it["id"] for it in items[:10])


# -- the R*Tree insertion order -----------------------------------------------------------------------
def test_boxes_go_in_z_order_of_their_centres() -> None:
    t = (0.0, 1.0)
    sw, se, nw, ne = (-100, -99, -50, -49, *t), (100, 101, -50, -49, *t), (-100, -99, 50, 51, *t), (100, 101, 50, 51, *t)
    assert morton_order([ne, nw, se, sw]) == [3, 2, 1, 0]  # z order: SW, SE, NW, NE
    # within a quadrant the same order again, at every scale; ties keep their order
    near = [(1.0, 1.1, 1.0, 1.1, *t), (0.1, 0.2, 0.1, 0.2, *t), (1.0, 1.1, 1.0, 1.1, *t), (1.0, 1.1, 0.1, 0.2, *t)]
    assert morton_order(near) == [1, 3, 0, 2]
    # no location a number can give (NaN, beyond the globe) breaks the order
    odd = [(float("nan"), 1.0, 0.0, 1.0, *t), (500.0, 600.0, -300.0, -200.0, *t), sw]
    assert sorted(morton_order(odd)) == [0, 1, 2]
    assert morton_order([]) == []
    assert morton_order([sw]) == [0]
