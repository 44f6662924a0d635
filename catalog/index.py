"""The catalog's SQLite index: derived from the item JSON, rebuilt by ``cubelake catalog reindex``.

Tables (``SCHEMA_VERSION`` 6):

- ``items``: one row per item: id, collection, time interval as UTC epoch seconds (``NULL``
  when the acquisition time is unknown, so no datetime filter matches it), bbox, footprint
  WKB, band count, its band set, item href, the properties JSON (without the calibration and
  geohash cover; the bands, on the item's data assets in STAC 1.1, are in ``band_sets``),
  and promoted property columns (``eo:cloud_cover``, ``cubelake:quality``, ``gsd``,
  ``platform``) with their own indexes.
- ``items_rtree``: a 3-D R*Tree of (longitude, latitude, time) boxes, so a bbox + datetime
  search reads only the items near in both; an item crossing the antimeridian has two boxes
  (``id = rowid*2 + part``); an item of unknown time sits at a far-past sentinel instant. Time
  is in units of 10 days there: the R*Tree splits nodes by area and margin, and in seconds the
  time axis (3e8 for a decade) outweighs degrees (360) so badly that leaves end up a few hours
  thin and world-wide; a bbox + datetime search then visits thousands of nodes (6.7 ms against
  0.2 ms in 10-day units, 1M items, ``bench/catalog.py`` queries). R*Tree coordinates are 32-bit
  floats rounded outwards: a prefilter, exact tests follow. Each entry carries the item's band
  set (an auxiliary column), so a bbox + wavelength search drops the items whose bands do not
  cover the range without reading their rows (``bench/catalog.py``, 0.45-2.4 µm queries: 5 of
  6 R*Tree candidates).
- ``band_sets``: each distinct band table once (names as JSON, centre/FWHM in nm as packed
  float64 arrays, NaN = unknown), keyed by a digest of that content (see ``._bandsets``): the
  items of a sensor share a few tables, and a hyperspectral one is ~3 KB (a row per item made
  the index 3.9 GB at a million items, 6x the rest). Band sets are never deleted with items
  (another item may share one; ``reindex`` starts afresh). ``band_coverage``: the merged
  wavelength intervals each band set covers, which answer "covers 400-2400 nm" for every
  item at once.
- ``geohash``: the footprint's compact geohash-6 cover; ``queryables``: every scalar property
  seen, with each JSON type it has had, so a filter on an unknown or mistyped property is an
  error (a comparison only ever matches values of its own type).

SQLite errors leave as :class:`CatalogError`; a damaged file (SQLite's ``SQLITE_CORRUPT`` or
``SQLITE_NOTADB``) or another schema version as :class:`CorruptIndexError`, which
``LakeCatalog`` answers by rebuilding the index from the item files (an index of an older
cubelake, version 5 with a band table row per item, is rebuilt that way: no migration).

Writers serialise on SQLite's own lock (``BEGIN IMMEDIATE``, WAL journal, a 60 s busy
timeout); readers never block. A batch of items goes in with a handful of statements of
thousands of rows each (rowids assigned under the write lock; see ``._writer``), and
``insert_items`` writes each batch on a thread of its own while it builds the next one. Search
drives from the R*Tree when a bbox/geometry is given, then checks time, wavelength, band count,
geohash and property filters in SQL and the exact footprint with shapely.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import sqlite3
import struct
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, cast

import numpy as np
import shapely
from shapely.geometry import shape

from cubelake.errors import CatalogError, CorruptIndexError

from ._bandsets import BandSetMemo, band_table_of
from ._search_sql import NO_TIME, T_UNIT, needs_queryables, order_sql, where_sql
from ._writer import (
    BatchWriter,
    Box,
    Rows,
    connect,
    delete_rows,
    index_error,
    is_corrupt,
    param_limit,
    plan_batch,
    rowids_of,
    transaction,
    write_rows,
)
from .cql import spatial_predicate
from .items import CollectionSummary, item_bands
from .query import ParsedQuery, Query, epoch, iso, parse_query
from .schema import (
    BANDS,
    CB_BAND_COUNT,
    CB_CALIBRATION,
    CB_COVERAGE,
    CB_DATETIME_SOURCE,
    CB_GEOHASH,
    CB_QUALITY,
    EO_CLOUD,
    PROMOTED,
)

__all__ = ["SCHEMA_VERSION", "CatalogIndex", "SearchHit", "index_error", "index_rows"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 6
_BULKY = (BANDS, CB_CALIBRATION, CB_GEOHASH)
# the bulk writer's page cache: more of the R*Tree nodes a batch descends through stay cached as
# the tree grows (R*Tree inserts, 1M items in item order: 34 µs with 64 MiB, 30 µs with 256 MiB)
_BULK_CACHE_KIB = 256 * 1024
# and its WAL checkpoints: every 32 MiB, not 4 MiB, so a page changed by consecutive batches is
# copied into the database once (1M items: commits 6.3 -> 5.0 µs per item)
_BULK_CHECKPOINT_PAGES = 8192
_MEMO = BandSetMemo()  # content -> band set: pure, so one for every index and thread

_PROMOTED_COLUMNS = ", ".join(
    f"{col} GENERATED ALWAYS AS (json_extract(properties, '$.\"{key}\"')) VIRTUAL" for key, col in PROMOTED.items()
)
# indexes that only make searches faster (no constraint hangs on them): a bulk load into an empty
# index builds them at its end, one sort each, instead of row by row (at a million items, row by row
# rewrote most of their pages at every commit: 2.5x the insert cost at the end of the load)
_SEARCH_INDEXES = {"items_time": "items(t0, t1)", "items_collection": "items(collection, t0)",
                   **{f"items_{col}": f"items({col})" for col in PROMOTED.values()}}
_SEARCH_INDEX_SQL = "".join(f"CREATE INDEX IF NOT EXISTS {name} ON {on};" for name, on in _SEARCH_INDEXES.items())
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS items(
    rowid INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    collection TEXT NOT NULL,
    datetime TEXT,
    t0 REAL,
    t1 REAL,
    west REAL, south REAL, east REAL, north REAL,
    geometry BLOB,
    band_count INTEGER NOT NULL,
    band_set INTEGER NOT NULL,
    href TEXT,
    properties TEXT NOT NULL,
    {_PROMOTED_COLUMNS}
);
{_SEARCH_INDEX_SQL}
CREATE VIRTUAL TABLE IF NOT EXISTS items_rtree USING rtree(id, minx, maxx, miny, maxy, mint, maxt, +band_set);
CREATE TABLE IF NOT EXISTS band_sets(id INTEGER PRIMARY KEY, digest BLOB NOT NULL UNIQUE, names TEXT NOT NULL,
    center_nm BLOB NOT NULL, fwhm_nm BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS band_coverage(band_set INTEGER NOT NULL, lo_nm REAL NOT NULL, hi_nm REAL NOT NULL,
    PRIMARY KEY(band_set, lo_nm)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS geohash(cell TEXT NOT NULL, item INTEGER NOT NULL, PRIMARY KEY(cell, item)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS geohash_item ON geohash(item);
CREATE TABLE IF NOT EXISTS queryables(key TEXT NOT NULL, type TEXT NOT NULL, PRIMARY KEY(key, type)) WITHOUT ROWID;
"""


_P = ParamSpec("_P")
_T = TypeVar("_T")


def _reads(method: Callable[_P, _T]) -> Callable[_P, _T]:
    """SQLite errors of a reading method leave as the index's :class:`CatalogError` (see ``index_error``)."""

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return method(*args, **kwargs)
        except sqlite3.Error as exc:
            raise index_error(cast("CatalogIndex", args[0]).path, exc) from exc

    return wrapper


class SearchHit:
    """One matching item, as the index holds it (``properties`` without bands/calibration/geohash).

    ``properties`` and ``geometry`` are decoded on first use: a search returning a hundred ids
    should not pay for a hundred JSON documents and footprints nobody reads.
    """

    __slots__ = ("_geometry", "_properties", "_raw_geometry", "_raw_properties", "band_count", "bbox",
                 "collection", "datetime", "end", "href", "id", "start")

    def __init__(self, id: str, collection: str, datetime: str | None, start: float | None, end: float | None,
                 bbox: tuple[float, float, float, float] | None, band_count: int, href: str | None,
                 raw_properties: str, raw_geometry: bytes | None) -> None:
        self.id, self.collection, self.datetime, self.start, self.end = id, collection, datetime, start, end
        self.bbox, self.band_count, self.href = bbox, band_count, href
        self._raw_properties, self._raw_geometry = raw_properties, raw_geometry
        self._properties: dict[str, Any] | None = None
        self._geometry: dict[str, Any] | None = None

    @property
    def properties(self) -> dict[str, Any]:
        if self._properties is None:
            self._properties = json.loads(self._raw_properties)
        return self._properties

    @property
    def geometry(self) -> dict[str, Any] | None:
        """The footprint as GeoJSON (WGS84), or ``None`` for a scene without location."""
        if self._geometry is None and self._raw_geometry is not None:
            self._geometry = shapely.geometry.mapping(shapely.from_wkb(self._raw_geometry))
        return self._geometry

    def __repr__(self) -> str:
        return f"SearchHit(id={self.id!r}, collection={self.collection!r}, datetime={self.datetime!r})"

    def _key(self) -> tuple[Any, ...]:
        return (self.id, self.collection, self.datetime, self.start, self.end, self.bbox, self.band_count, self.href,
                self._raw_properties, self._raw_geometry)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SearchHit) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # equal by value, mutable cache: not hashable

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "collection": self.collection, "datetime": self.datetime,
                "bbox": list(self.bbox) if self.bbox else None, "band_count": self.band_count,
                "href": self.href, "properties": self.properties}


_JSON_TYPES = {bool: "boolean", int: "number", float: "number", str: "string"}
_JSON = json.JSONEncoder()  # json.dumps(x) is this encoder's encode(x), less the argument checks
_QUERYABLES: dict[tuple[tuple[str, ...], tuple[type, ...]], dict[str, str]] = {}


def _json_type(v: Any) -> str | None:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int | float):
        return "number"
    if isinstance(v, str):
        return "string"
    return None


_EPOCH = datetime(1970, 1, 1)


def _queryables_of(props: dict[str, Any]) -> dict[str, str]:
    """``{key: JSON type}`` of the scalar properties: remembered by (keys, Python types), all it depends on
    (the items of a collection share a handful of those). Callers must not change the dict."""
    key = (tuple(props), tuple(map(type, props.values())))
    q = _QUERYABLES.get(key)
    if q is None:
        q = {k: t for k, v in props.items() if (t := _JSON_TYPES.get(type(v)) or _json_type(v)) is not None}
        if len(_QUERYABLES) >= 1024:  # bounded: (an odd lake may have many property layouts)
            _QUERYABLES.clear()
        _QUERYABLES[key] = q
    return q


def _epoch(text: Any) -> float:
    """``query.epoch``, with a shortcut for the form items use (``2024-05-01T10:45:26Z``)."""
    if type(text) is str and len(text) == 20 and text[10] == "T" and text[19] == "Z":
        try:
            naive = datetime.fromisoformat(text[:19])
        except ValueError:  # not a time after all: epoch() says what is wrong
            return epoch(text)
        if naive.tzinfo is None:  # (an offset inside the 19 characters: epoch() decides)
            return (naive - _EPOCH).total_seconds()  # exact for whole seconds, as .timestamp() in UTC
    return epoch(text)


def _interval(props: dict[str, Any]) -> tuple[float | None, float | None]:
    """The item's time interval (epoch seconds); every time it gives must parse, even one not used."""
    start, end, dt = props.get("start_datetime"), props.get("end_datetime"), props.get("datetime")
    t_start = _epoch(start) if start else None
    t_end = _epoch(end) if end else None
    t_dt = _epoch(dt) if dt else None
    if props.get(CB_DATETIME_SOURCE) == "unknown":
        return None, None
    if t_start is not None and t_end is not None:
        return t_start, t_end
    return t_dt, t_dt


_SEQUENCES = frozenset({list, tuple})
_HEAD = struct.Struct("<BII")  # byte order (1: little-endian), geometry type, number of rings or parts


@functools.cache
def _ring_struct(points: int, head: bool) -> struct.Struct:
    """A ring's WKB (point count, then x y pairs), after a one-ring polygon's header if ``head``."""
    return struct.Struct(f"<{'BII' if head else ''}I{2 * points}d")


def _closed_pairs(ring: Any) -> bool:
    """A closed ring of 4 or more points, each a list or tuple of two values (else shapely decides)."""
    return (type(ring) in _SEQUENCES and len(ring) >= 4 and _SEQUENCES.issuperset(map(type, ring))
            and set(map(len, ring)) == {2} and ring[0] == ring[-1])


def _polygon_wkb(rings: Any) -> bytes | None:
    if type(rings) not in _SEQUENCES or not rings or not all(map(_closed_pairs, rings)):
        return None
    if len(rings) == 1:  # nearly every footprint: one struct call
        ring = rings[0]
        return _ring_struct(len(ring), True).pack(1, 3, 1, len(ring), *itertools.chain.from_iterable(ring))
    return _HEAD.pack(1, 3, len(rings)) + b"".join(
        _ring_struct(len(r), False).pack(len(r), *itertools.chain.from_iterable(r)) for r in rings)


def _packed_wkb(geom: dict[str, Any]) -> bytes | None:
    """WKB of a polygon or multipolygon of closed 2-D rings, packed directly; ``None`` for anything else."""
    kind, coords = geom.get("type"), geom.get("coordinates")
    try:
        if kind == "Polygon":
            return _polygon_wkb(coords)
        if kind == "MultiPolygon" and type(coords) in _SEQUENCES and coords:
            parts = [_polygon_wkb(p) for p in coords]
            return None if None in parts else _HEAD.pack(1, 6, len(parts)) + b"".join(cast(list[bytes], parts))
    except struct.error:  # not numbers (text, say): numpy converts or refuses them
        pass
    return None


def _footprint_wkb(geom: dict[str, Any]) -> bytes:
    """The footprint as WKB, byte for byte what ``shapely.to_wkb(shape(geom))`` gives.

    Polygons and multipolygons of closed 2-D rings of numbers (nearly every footprint; an item
    across the antimeridian has two parts) are packed directly, 5-30x faster than through shapely,
    which is asked for everything else (rings to close, 3-D points, text).
    """
    packed = _packed_wkb(geom)
    if packed is not None:
        return packed
    if geom.get("type") == "Polygon" and len(geom["coordinates"]) == 1:
        ring = geom["coordinates"][0]
        return cast(bytes, shapely.to_wkb(shapely.polygons(np.asarray(ring, dtype=np.float64))))
    return cast(bytes, shapely.to_wkb(shape(geom)))


def _boxes(bbox: list[Any], t0: float | None, t1: float | None) -> tuple[tuple[float, ...], tuple[Box, ...]]:
    """``(west, south, east, north)`` and the item's R*Tree boxes (two across the antimeridian)."""
    w, s, e, n = (float(v) for v in (bbox[:2] + bbox[3:5] if len(bbox) == 6 else bbox))
    t, u = (t0 / T_UNIT, t1 / T_UNIT) if t0 is not None and t1 is not None else (NO_TIME, NO_TIME)
    return (w, s, e, n), (((w, 180.0, s, n, t, u), (-180.0, e, s, n, t, u)) if w > e else ((w, e, s, n, t, u),))


def index_rows(item: dict[str, Any], href: str | None) -> Rows:
    """Everything the index stores for one item dict; raises ``CatalogError`` if it is not an item."""
    try:
        iid = item["id"]
        props = item["properties"]
        coll = item.get("collection") or ""
    except (KeyError, TypeError) as exc:
        raise CatalogError(f"not a STAC item (missing {exc})") from None
    if not isinstance(iid, str) or not iid or "/" in iid or iid in (".", ".."):
        raise CatalogError(f"item id {iid!r} is not a safe id")
    t0, t1 = _interval(props)
    bbox = item.get("bbox")
    geom = item.get("geometry")
    boxes: tuple[Box, ...] = ()
    wkb = None
    wsen: tuple[float | None, ...] = (None, None, None, None)
    if bbox and geom:
        wsen, boxes = _boxes(bbox, t0, t1)
        wkb = _footprint_wkb(geom)
    bands_in = item_bands(item)
    band_set = _MEMO.get(bands_in)
    slim = {k: v for k, v in props.items() if k not in _BULKY}
    q = _queryables_of(slim)
    n_bands = int(props.get(CB_BAND_COUNT, len(bands_in)))
    row = (iid, coll, props.get("datetime"), t0, t1, *wsen, wkb, n_bands, href, _JSON.encode(slim))
    return Rows(row, boxes, band_set, tuple(props.get(CB_GEOHASH) or ()), q)


class CatalogIndex:
    """The SQLite index of a catalog (created if missing). Thread-confined: one per thread."""

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        self.path = Path(path)
        try:
            self.db = connect(self.path, readonly=readonly)
            # CQL2's spatial operators (catalog/cql.py): SQLite has no geometry functions of its own
            self.db.create_function("cl_spatial", 3, spatial_predicate, deterministic=True)
            # a reader must not take the write lock: the schema is created only where it is missing
            if not readonly and self.db.execute("SELECT 1 FROM sqlite_master WHERE name='meta'").fetchone() is None:
                self.db.execute("PRAGMA journal_mode=WAL")
                self._create()
            if not readonly:
                self.db.execute("PRAGMA synchronous=NORMAL")
            version = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.Error as exc:
            with contextlib.suppress(AttributeError, sqlite3.Error):
                self.db.close()
            raise index_error(self.path, exc) from exc
        if version is None or str(version[0]) != str(SCHEMA_VERSION):
            self.db.close()
            raise CorruptIndexError(f"{self.path}: index schema version {version[0] if version else None}, expected "
                                    f"{SCHEMA_VERSION} (written by another cubelake version; 'cubelake catalog reindex' "
                                    "rebuilds it from the item files)")
        if not readonly:
            try:
                self._create_search_indexes()  # a bulk load that died before building them left them out
            except CatalogError:
                self.db.close()
                raise

    def _create(self) -> None:
        with self.transaction():
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    self.db.execute(stmt)
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

    def _create_search_indexes(self) -> None:
        have = {r[0] for r in self._try(lambda: self.db.execute("SELECT name FROM sqlite_master WHERE type='index'"))}
        missing = [name for name in _SEARCH_INDEXES if name not in have]
        if missing:
            with self.transaction():
                for name in missing:
                    self.db.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {_SEARCH_INDEXES[name]}")

    def _drop_search_indexes_if_empty(self) -> bool:
        """Before a bulk load: drop the search-only indexes if the index holds no item (see ``_SEARCH_INDEXES``)."""
        with self.transaction():
            if self.db.execute("SELECT 1 FROM items LIMIT 1").fetchone() is not None:
                return False
            for name in _SEARCH_INDEXES:
                self.db.execute(f"DROP INDEX IF EXISTS {name}")
        return True

    def _try(self, op: Callable[[], _T]) -> _T:
        try:
            return op()
        except sqlite3.Error as exc:
            raise index_error(self.path, exc) from exc

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> CatalogIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``): all of it or none of it.

        SQLite's errors leave as :class:`CatalogError` naming the index file.
        """
        with transaction(self.db, self.path) as db:
            yield db

    def _write(self, rows: list[Rows]) -> None:
        """Insert (or replace) items with distinct ids, in one transaction: a few statements per batch."""
        with self.transaction():
            write_rows(self.db, rows)

    def upsert(self, item: dict[str, Any], href: str | None = None) -> None:
        """Insert or replace one item, in its own transaction."""
        self._write([index_rows(item, href)])

    def insert_items(self, items: Iterable[dict[str, Any]], batch_size: int = 10_000,
                     href: Callable[[dict[str, Any]], str | None] | None = None) -> int:
        """Bulk insert (or replace) item dicts, ``batch_size`` per transaction; returns how many.

        ``href(item)`` gives each item's JSON path relative to the lake (``None``: no file). An id
        given twice keeps its last item, as inserting the items one by one would. Into an empty
        index (a reindex), the search-only indexes are built once at the end.

        Items are read and turned into rows in the calling thread; each full batch is written on a
        second connection by a writer thread meanwhile, one batch in flight at most. The outcome is
        that of writing batch after batch: when an item is bad (``CatalogError``) or a batch fails,
        every batch before it is committed and nothing after it; the batch in flight is finished
        before the error leaves.
        """
        deferred = self._drop_search_indexes_if_empty()
        try:
            return self._insert_batches(items, batch_size, href)
        finally:
            if deferred:
                self._create_search_indexes()

    def _batch_writer(self) -> BatchWriter | None:
        """A writer thread with its own connection (``None`` for an in-memory index, which has no second one)."""
        if str(self.path) in ("", ":memory:"):
            return None
        db = self._try(lambda: connect(self.path, check_same_thread=False))
        try:
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(f"PRAGMA cache_size=-{_BULK_CACHE_KIB}")
            db.execute(f"PRAGMA wal_autocheckpoint={_BULK_CHECKPOINT_PAGES}")
        except sqlite3.Error as exc:
            db.close()
            raise index_error(self.path, exc) from exc
        return BatchWriter(db, self.path)

    def _insert_batches(self, items: Iterable[dict[str, Any]], batch_size: int,
                        href: Callable[[dict[str, Any]], str | None] | None) -> int:
        writer = self._batch_writer()
        limit = param_limit(self.db)

        def write(rows: list[Rows]) -> None:
            if writer is None:
                self._write(rows)
            else:  # the statements are built here, the writer thread only runs them
                writer.submit(plan_batch(rows, limit))

        try:
            n = 0
            batch: dict[str, Rows] = {}
            for item in items:
                r = index_rows(item, href(item) if href is not None else None)
                batch.pop(r.item[0], None)
                batch[r.item[0]] = r
                n += 1
                if len(batch) >= batch_size:
                    write(list(batch.values()))
                    batch = {}
            if batch:
                write(list(batch.values()))
            if writer is not None:
                writer.finish()
            return n
        except Exception:
            if writer is not None:
                writer.close()
                if writer.failure is not None:  # a batch before failed first: that is the error
                    raise writer.failure from None
            raise
        finally:
            if writer is not None:
                writer.close()

    def delete(self, item_id: str) -> bool:
        with self.transaction():
            rowids = rowids_of(self.db, [item_id])
            if not rowids:
                return False
            delete_rows(self.db, rowids)
        return True

    def clear(self) -> None:
        with self.transaction():
            for t in ("items_rtree", "band_coverage", "band_sets", "geohash", "items", "queryables"):
                self.db.execute(f"DELETE FROM {t}")

    @_reads
    def analyze(self) -> None:
        self.db.execute("ANALYZE")

    # -- reading -------------------------------------------------------------
    @_reads
    def queryables(self) -> dict[str, set[str]]:
        """Every scalar property seen, with the JSON types its values have had."""
        out: dict[str, set[str]] = {}
        for key, kind in self.db.execute("SELECT key, type FROM queryables ORDER BY key"):
            out.setdefault(key, set()).add(kind)
        return out

    @_reads
    def ids(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT id FROM items ORDER BY id")]

    @_reads
    def hrefs(self) -> dict[str, str | None]:
        return dict(self.db.execute("SELECT id, href FROM items ORDER BY id").fetchall())

    @_reads
    def band_table(self, item_id: str) -> list[tuple[str | None, float | None, float | None]]:
        """``(name, centre_nm, fwhm_nm)`` per band of an item (``None`` where unknown)."""
        row = self.db.execute("SELECT b.names, b.center_nm, b.fwhm_nm FROM band_sets b JOIN items i "
                              "ON b.id = i.band_set WHERE i.id = ?", (item_id,)).fetchone()
        return [] if row is None else band_table_of(*row)

    @_reads
    def __len__(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM items").fetchone()[0])

    @_reads
    def get(self, item_id: str) -> SearchHit | None:
        rows = list(self._select("i.id = ?", [item_id], "", None))
        return rows[0] if rows else None

    @_reads
    def holds(self, item: dict[str, Any], href: str | None) -> bool:
        """Whether the index holds ``item`` at ``href`` exactly as indexing it now would store it."""
        r = index_rows(item, href)
        row = self.db.execute("SELECT i.rowid, i.id, i.collection, i.datetime, i.t0, i.t1, i.west, i.south, i.east, "
                              "i.north, i.geometry, i.band_count, i.href, i.properties, b.digest FROM items i "
                              "LEFT JOIN band_sets b ON b.id = i.band_set WHERE i.id=?", (r.item[0],)).fetchone()
        if row is None or tuple(row[1:-1]) != r.item or row[-1] != r.band_set.digest:
            return False
        cells = [c for (c,) in self.db.execute("SELECT cell FROM geohash WHERE item=? ORDER BY cell", (row[0],))]
        return cells == sorted(set(r.cells))

    @_reads
    def search(self, query: Query | ParsedQuery, *, scenes_only: bool = False) -> list[SearchHit]:
        """Every item matching ``query``, sorted and limited as it asks; ``scenes_only``: no derived products."""
        q = parse_query(query) if isinstance(query, Query) else query
        known = self.queryables() if needs_queryables(q) else {}
        where, params = where_sql(q, known, scenes_only=scenes_only)
        order, order_params = order_sql(q, known)
        return list(self._select(where, params + order_params, order, q.limit, q.geometry, q.offset))

    def _select(self, where: str, params: list[Any], order: str, limit: int | None,
                geometry: Any = None, offset: int = 0) -> Iterator[SearchHit]:
        sql = ("SELECT i.id, i.collection, i.datetime, i.t0, i.t1, i.west, i.south, i.east, i.north, i.band_count, "
               f"i.href, i.properties, i.geometry FROM items i WHERE {where}{order}")
        if geometry is None and (limit is not None or offset):
            sql += f" LIMIT {int(limit) if limit is not None else -1} OFFSET {int(offset)}"
        try:
            rows = self.db.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if is_corrupt(exc):
                raise
            raise CatalogError(f"{self.path}: query failed ({exc})") from exc
        if geometry is not None and rows:
            geoms = shapely.from_wkb([r[12] for r in rows])
            keep = shapely.intersects(geoms, geometry)
            rows = [r for r, k in zip(rows, keep, strict=True) if k][offset:]
            if limit is not None:
                rows = rows[:limit]
        for r in rows:
            yield SearchHit(
                id=r[0], collection=r[1], datetime=r[2], start=r[3], end=r[4],
                bbox=(r[5], r[6], r[7], r[8]) if r[5] is not None else None, band_count=r[9], href=r[10],
                raw_properties=r[11], raw_geometry=r[12],
            )

    # -- summaries -------------------------------------------------------------
    @_reads
    def collections(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT DISTINCT collection FROM items ORDER BY collection")]

    @_reads
    def collection_summary(self, collection: str) -> CollectionSummary:
        db = self.db
        s = CollectionSummary(collection)
        rows = db.execute("SELECT id, href FROM items WHERE collection=? ORDER BY id", (collection,)).fetchall()
        s.item_ids = [r[0] for r in rows]
        s.item_hrefs = [r[1] for r in rows if r[1]]
        b = db.execute("SELECT min(west), min(south), max(east), max(north), sum(west > east) FROM items "
                       "WHERE collection=? AND west IS NOT NULL", (collection,)).fetchone()
        if b[1] is not None:
            # an item across the antimeridian spans the date line: the extent then takes every longitude
            s.bbox = (-180.0, b[1], 180.0, b[3]) if b[4] else (b[0], b[1], b[2], b[3])
        t = db.execute("SELECT min(t0), max(t1) FROM items WHERE collection=?", (collection,)).fetchone()
        s.start = iso(t[0]) if t[0] is not None else None
        s.end = iso(t[1]) if t[1] is not None else None
        for key in ("platform", "constellation", "proj:code"):
            vals = [r[0] for r in db.execute(
                f"SELECT DISTINCT json_extract(properties, '$.\"{key}\"') FROM items WHERE collection=?", (collection,))
                if r[0] is not None]
            if vals:
                s.values[key] = vals
        inst = set()
        for (v,) in db.execute("SELECT DISTINCT json_extract(properties, '$.instruments') FROM items WHERE collection=?",
                               (collection,)):
            if v:
                inst.update(json.loads(v))
        if inst:
            s.values["instruments"] = sorted(inst)
        for key in ("gsd", EO_CLOUD, CB_QUALITY, CB_BAND_COUNT):
            lo, hi = db.execute(f"SELECT min(v), max(v) FROM (SELECT json_extract(properties, '$.\"{key}\"') AS v "
                                "FROM items WHERE collection=?) WHERE v IS NOT NULL", (collection,)).fetchone()
            if lo is not None:
                s.ranges[key] = (lo, hi)
        lo, hi = db.execute("SELECT min(lo_nm), max(hi_nm) FROM band_coverage WHERE band_set IN "
                            "(SELECT band_set FROM items WHERE collection=?)", (collection,)).fetchone()
        if lo is not None:
            s.ranges[CB_COVERAGE] = (round(lo, 4), round(hi, 4))
        return s

    @_reads
    def stats(self) -> dict[str, Any]:
        """Counts per collection, time span, bands and spatial extent: ``cubelake catalog stats``."""
        db = self.db
        out: dict[str, Any] = {"items": len(self), "collections": {}}
        for coll, n, t0, t1, bmin, bmax, geo in db.execute(
            "SELECT collection, count(*), min(t0), max(t1), min(band_count), max(band_count), count(geometry) "
            "FROM items GROUP BY collection ORDER BY collection"
        ):
            out["collections"][coll] = {
                "items": n, "start": iso(t0) if t0 is not None else None, "end": iso(t1) if t1 is not None else None,
                "bands": [bmin, bmax], "georeferenced": geo, "unknown_time": 0,
            }
        for coll, n in db.execute("SELECT collection, count(*) FROM items WHERE t0 IS NULL GROUP BY collection"):
            out["collections"][coll]["unknown_time"] = n
        out["bands"] = db.execute("SELECT coalesce(sum(band_count), 0) FROM items").fetchone()[0]
        out["geohash_cells"] = db.execute("SELECT count(*) FROM geohash").fetchone()[0]
        out["queryables"] = len(self.queryables())
        out["index_bytes"] = self.path.stat().st_size if self.path.exists() else 0
        return out
