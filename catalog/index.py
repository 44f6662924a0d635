"""The catalog's SQLite index: derived from the item JSON, rebuilt by ``cubelake catalog reindex``.

Tables (``SCHEMA_VERSION`` 5):

- ``items``: one row per item: id, collection, time interval as UTC epoch seconds (``NULL``
  when the acquisition time is unknown, so no datetime filter matches it), bbox, footprint
  WKB, band count, item href, the properties JSON (without the calibration and geohash cover;
  the bands, on the item's data assets in STAC 1.1, are in ``bands``),
  and promoted property columns (``eo:cloud_cover``, ``cubelake:quality``, ``gsd``,
  ``platform``) with their own indexes.
- ``items_rtree``: a 3-D R*Tree of (longitude, latitude, time) boxes, so a bbox + datetime
  search reads only the items near in both; an item crossing the antimeridian has two boxes
  (``id = rowid*2 + part``); an item of unknown time sits at a far-past sentinel instant. Time
  is in units of 10 days there: the R*Tree splits nodes by area and margin, and in seconds the
  time axis (3e8 for a decade) outweighs degrees (360) so badly that leaves end up a few hours
  thin and world-wide; a bbox + datetime search then visits thousands of nodes (6.7 ms against
  0.2 ms in 10-day units, 1M items, ``bench/catalog.py`` queries). R*Tree coordinates are 32-bit
  floats rounded outwards: a prefilter, exact tests follow.
- ``bands``: the band table, one row per item: names (JSON) and centre/FWHM in nm as packed
  float64 arrays (NaN = unknown) — per-band rows would be ~120 rows per hyperspectral item,
  120 million for a million items, for no query that needs them; ``coverage``: the merged
  wavelength intervals the bands cover, which answer "covers 400-2400 nm" with one indexed
  lookup.
- ``geohash``: the footprint's compact geohash-6 cover; ``queryables``: every scalar property
  seen, with each JSON type it has had, so a filter on an unknown or mistyped property is an
  error (a comparison only ever matches values of its own type).

SQLite errors leave as :class:`CatalogError`; a damaged file (SQLite's ``SQLITE_CORRUPT`` or
``SQLITE_NOTADB``) or another schema version as :class:`CorruptIndexError`, which
``LakeCatalog`` answers by rebuilding the index from the item files.

Writers serialise on SQLite's own lock (``BEGIN IMMEDIATE``, WAL journal, a 60 s busy
timeout); readers never block. Search drives from the R*Tree when a bbox/geometry is given,
then checks time, wavelength, band count, geohash and property filters in SQL and the exact
footprint with shapely.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, cast

import numpy as np
import shapely
from shapely.geometry import shape

from cubelake.errors import CatalogError, CatalogQueryError, CorruptIndexError

from .coverage import merged_coverage
from .derived import DERIVED_ROOTS
from .items import CollectionSummary, item_bands
from .query import BUILTIN_SORT, ParsedQuery, Query, epoch, iso, parse_query
from .schema import (
    BANDS,
    CB_BAND_COUNT,
    CB_CALIBRATION,
    CB_COVERAGE,
    CB_DATETIME_SOURCE,
    CB_GEOHASH,
    CB_QUALITY,
    EO_CENTER,
    EO_CLOUD,
    EO_FWHM,
    PROMOTED,
)

__all__ = ["SCHEMA_VERSION", "CatalogIndex", "SearchHit", "index_error", "index_rows"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 5
_BULKY = (BANDS, CB_CALIBRATION, CB_GEOHASH)
_NO_TIME = -1e30  # R*Tree time of items with no known time: before anything a search can ask for
_FAR = 1e29
_MMAP_BYTES = 16 * 1024**3  # address space only; the OS pages in what searches touch
_T_UNIT = 864_000.0  # seconds per R*Tree time unit (10 days; see the module docstring)
# a scene's href is scenes/<id>/item.json; a derived product's <root>/<name>/item.json (see .derived)
_NOT_DERIVED = (f"coalesce(substr(i.href, 1, instr(i.href, '/')), '') NOT IN "
                f"({', '.join(repr(r + '/') for r in DERIVED_ROOTS)})")

_PROMOTED_COLUMNS = ", ".join(
    f"{col} GENERATED ALWAYS AS (json_extract(properties, '$.\"{key}\"')) VIRTUAL" for key, col in PROMOTED.items()
)
_PROMOTED_INDEXES = "".join(f"CREATE INDEX IF NOT EXISTS items_{col} ON items({col});" for col in PROMOTED.values())
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
    href TEXT,
    properties TEXT NOT NULL,
    {_PROMOTED_COLUMNS}
);
CREATE INDEX IF NOT EXISTS items_time ON items(t0, t1);
CREATE INDEX IF NOT EXISTS items_collection ON items(collection, t0);
{_PROMOTED_INDEXES}
CREATE VIRTUAL TABLE IF NOT EXISTS items_rtree USING rtree(id, minx, maxx, miny, maxy, mint, maxt);
CREATE TABLE IF NOT EXISTS bands(
    item INTEGER PRIMARY KEY, names TEXT NOT NULL, center_nm BLOB NOT NULL, fwhm_nm BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS coverage(item INTEGER NOT NULL, lo_nm REAL NOT NULL, hi_nm REAL NOT NULL,
    PRIMARY KEY(item, lo_nm)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS geohash(cell TEXT NOT NULL, item INTEGER NOT NULL, PRIMARY KEY(cell, item)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS geohash_item ON geohash(item);
CREATE TABLE IF NOT EXISTS queryables(key TEXT NOT NULL, type TEXT NOT NULL, PRIMARY KEY(key, type)) WITHOUT ROWID;
"""


def _busy_or(path: Path, exc: sqlite3.Error) -> str:
    if "locked" in str(exc) or "busy" in str(exc):
        return (f"{path}: the catalog index stayed locked by another process for 60 s ({exc}); "
                "a long ingest or reindex holds it: try again when it is done")
    return f"{path}: the catalog index cannot be used ({exc}); rebuild it with 'cubelake catalog reindex'"


def _is_corrupt(exc: sqlite3.Error) -> bool:
    """SQLite says the file is damaged or not a database (flipped pages, a truncated or foreign file)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def index_error(path: Path, exc: sqlite3.Error) -> CatalogError:
    """The :class:`CatalogError` for an SQLite error on the index at ``path`` (corruption: ``CorruptIndexError``)."""
    if _is_corrupt(exc):
        return CorruptIndexError(f"{path}: the catalog index is damaged ({exc})")
    return CatalogError(_busy_or(path, exc))


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


def _json_type(v: Any) -> str | None:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int | float):
        return "number"
    if isinstance(v, str):
        return "string"
    return None


def _interval(props: dict[str, Any]) -> tuple[float | None, float | None]:
    """The item's time interval (epoch seconds); every time it gives must parse, even one not used."""
    start, end, dt = props.get("start_datetime"), props.get("end_datetime"), props.get("datetime")
    times = {k: epoch(v) for k, v in (("start", start), ("end", end), ("datetime", dt)) if v}
    if props.get(CB_DATETIME_SOURCE) == "unknown":
        return None, None
    if "start" in times and "end" in times:
        return times["start"], times["end"]
    if "datetime" in times:
        return times["datetime"], times["datetime"]
    return None, None


def _geometry(geom: dict[str, Any]) -> shapely.Geometry:
    if geom.get("type") == "Polygon" and len(geom["coordinates"]) == 1:  # the common case, 3x faster than shape()
        return shapely.polygons(np.asarray(geom["coordinates"][0], dtype=np.float64))
    return shape(geom)


@dataclass(slots=True)
class _Rows:
    item: tuple[Any, ...]
    boxes: list[tuple[float, float, float, float, float, float]]
    bands: tuple[str, bytes, bytes]
    coverage: list[tuple[float, float]]
    cells: list[str]
    queryables: dict[str, str]


def index_rows(item: dict[str, Any], href: str | None) -> _Rows:
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
    boxes: list[tuple[float, float, float, float, float, float]] = []
    wkb = None
    if bbox and geom:
        w, s, e, n = (float(v) for v in (bbox[:2] + bbox[3:5] if len(bbox) == 6 else bbox))
        tb = (t0 / _T_UNIT, t1 / _T_UNIT) if t0 is not None and t1 is not None else (_NO_TIME, _NO_TIME)
        boxes = [(w, 180.0, s, n, *tb), (-180.0, e, s, n, *tb)] if w > e else [(w, e, s, n, *tb)]
        wkb = shapely.to_wkb(_geometry(geom))
    else:
        w = s = e = n = None  # type: ignore[assignment]
    bands_in = item_bands(item)
    c_nm = [None if (v := b.get(EO_CENTER)) is None else v * 1000.0 for b in bands_in]
    f_nm = [None if (v := b.get(EO_FWHM)) is None else v * 1000.0 for b in bands_in]
    merged = merged_coverage(c_nm, f_nm)
    band_row = (json.dumps([b.get("name") for b in bands_in]),
                np.array(c_nm, dtype="<f8").tobytes(), np.array(f_nm, dtype="<f8").tobytes())
    slim = {k: v for k, v in props.items() if k not in _BULKY}
    q = {k: t for k, v in slim.items() if (t := _json_type(v)) is not None}
    n_bands = int(props.get(CB_BAND_COUNT, len(bands_in)))
    row = (iid, coll, props.get("datetime"), t0, t1, w, s, e, n, wkb, n_bands, href, json.dumps(slim))
    return _Rows(row, boxes, band_row, merged, list(props.get(CB_GEOHASH) or []), q)


class CatalogIndex:
    """The SQLite index of a catalog (created if missing). Thread-confined: one per thread."""

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        self.path = Path(path)
        try:
            if readonly:
                self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=60, isolation_level=None)
            else:
                self.db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            self.db.execute("PRAGMA busy_timeout=60000")
            # searches read pages at random: map the file (no read() per page) and keep 64 MiB of pages
            self.db.execute(f"PRAGMA mmap_size={_MMAP_BYTES}")
            self.db.execute("PRAGMA cache_size=-65536")
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
                                    f"{SCHEMA_VERSION}")

    def _create(self) -> None:
        with self.transaction():
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    self.db.execute(stmt)
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

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
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise index_error(self.path, exc) from exc
        try:
            yield self.db
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):  # a damaged file can refuse the rollback too
                self.db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                if _is_corrupt(exc):
                    raise index_error(self.path, exc) from exc
                raise CatalogError(f"{self.path}: writing the catalog index failed ({exc})") from exc
            raise
        try:
            self.db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise index_error(self.path, exc) from exc

    def _delete(self, rowid: int) -> None:
        db = self.db
        db.execute("DELETE FROM items_rtree WHERE id IN (?, ?)", (rowid * 2, rowid * 2 + 1))
        db.execute("DELETE FROM bands WHERE item=?", (rowid,))
        db.execute("DELETE FROM coverage WHERE item=?", (rowid,))
        db.execute("DELETE FROM geohash WHERE item=?", (rowid,))
        db.execute("DELETE FROM items WHERE rowid=?", (rowid,))

    def _insert(self, r: _Rows) -> None:
        db = self.db
        old = db.execute("SELECT rowid FROM items WHERE id=?", (r.item[0],)).fetchone()
        if old is not None:
            self._delete(old[0])
        cur = db.execute(
            "INSERT INTO items(id, collection, datetime, t0, t1, west, south, east, north, geometry, band_count, "
            "href, properties) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", r.item)
        rowid = int(cur.lastrowid or 0)
        db.executemany("INSERT INTO items_rtree VALUES (?,?,?,?,?,?,?)",
                       [(rowid * 2 + k, *b) for k, b in enumerate(r.boxes)])
        db.execute("INSERT INTO bands VALUES (?,?,?,?)", (rowid, *r.bands))
        db.executemany("INSERT OR IGNORE INTO coverage VALUES (?,?,?)", [(rowid, lo, hi) for lo, hi in r.coverage])
        db.executemany("INSERT OR IGNORE INTO geohash VALUES (?,?)", [(c, rowid) for c in r.cells])

    def upsert(self, item: dict[str, Any], href: str | None = None) -> None:
        """Insert or replace one item, in its own transaction."""
        r = index_rows(item, href)
        with self.transaction():
            self._insert(r)
            self._add_queryables(set(r.queryables.items()))

    def _add_queryables(self, pairs: set[tuple[str, str]]) -> None:
        self.db.executemany("INSERT OR IGNORE INTO queryables VALUES (?, ?)", sorted(pairs))

    def insert_items(self, items: Iterable[dict[str, Any]], batch_size: int = 10_000,
                     href: Callable[[dict[str, Any]], str | None] | None = None) -> int:
        """Bulk insert (or replace) item dicts, ``batch_size`` per transaction; returns how many.

        ``href(item)`` gives each item's JSON path relative to the lake (``None``: no file).
        """
        n = 0
        batch: list[_Rows] = []
        seen: set[tuple[str, str]] = set()

        def flush() -> None:
            with self.transaction():
                for r in batch:
                    self._insert(r)
                self._add_queryables(seen)
            batch.clear()
            seen.clear()

        for item in items:
            r = index_rows(item, href(item) if href is not None else None)
            seen.update(r.queryables.items())
            batch.append(r)
            n += 1
            if len(batch) >= batch_size:
                flush()
        if batch:
            flush()
        return n

    def delete(self, item_id: str) -> bool:
        with self.transaction():
            row = self.db.execute("SELECT rowid FROM items WHERE id=?", (item_id,)).fetchone()
            if row is None:
                return False
            self._delete(row[0])
        return True

    def clear(self) -> None:
        with self.transaction():
            for t in ("items_rtree", "bands", "coverage", "geohash", "items", "queryables"):
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
        row = self.db.execute("SELECT b.names, b.center_nm, b.fwhm_nm FROM bands b JOIN items i ON i.rowid = b.item "
                              "WHERE i.id = ?", (item_id,)).fetchone()
        if row is None:
            return []
        names = json.loads(row[0])
        c, f = np.frombuffer(row[1], dtype="<f8"), np.frombuffer(row[2], dtype="<f8")
        return [(n, None if math.isnan(a) else float(a), None if math.isnan(b) else float(b))
                for n, a, b in zip(names, c, f, strict=True)]

    @_reads
    def __len__(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM items").fetchone()[0])

    @_reads
    def get(self, item_id: str) -> SearchHit | None:
        rows = list(self._select("i.id = ?", [item_id], "", None))
        return rows[0] if rows else None

    def _property_sql(self, key: str, known: dict[str, set[str]], what: str) -> tuple[str, list[Any]]:
        """The SQL expression of a property (and its parameters); unknown properties are an error."""
        if key not in known and key not in PROMOTED:
            raise CatalogQueryError(
                f"unknown property {key!r} in {what}; the catalog's queryable properties are: "
                f"{', '.join(sorted(known)) or '(none yet)'}"
            )
        if key in PROMOTED:
            return f"i.{PROMOTED[key]}", []
        return "json_extract(i.properties, ?)", ['$."' + key.replace('"', '\\"') + '"']

    @_reads
    def holds(self, item: dict[str, Any], href: str | None) -> bool:
        """Whether the index holds ``item`` at ``href`` exactly as indexing it now would store it."""
        r = index_rows(item, href)
        row = self.db.execute("SELECT rowid, id, collection, datetime, t0, t1, west, south, east, north, geometry, "
                              "band_count, href, properties FROM items WHERE id=?", (r.item[0],)).fetchone()
        if row is None or tuple(row[1:]) != r.item:
            return False
        bands = self.db.execute("SELECT names, center_nm, fwhm_nm FROM bands WHERE item=?", (row[0],)).fetchone()
        cells = [c for (c,) in self.db.execute("SELECT cell FROM geohash WHERE item=? ORDER BY cell", (row[0],))]
        return bands is not None and tuple(bands) == r.bands and cells == sorted(set(r.cells))

    @_reads
    def search(self, query: Query | ParsedQuery, *, scenes_only: bool = False) -> list[SearchHit]:
        """Every item matching ``query``, sorted and limited as it asks; ``scenes_only``: no derived products."""
        q = parse_query(query) if isinstance(query, Query) else query
        conds: list[str] = [_NOT_DERIVED] if scenes_only else []
        params: list[Any] = []
        if q.boxes:
            rt = " OR ".join("(minx <= ? AND maxx >= ? AND miny <= ? AND maxy >= ? AND mint <= ? AND maxt >= ?)"
                             for _ in q.boxes)
            conds.append(f"i.rowid IN (SELECT id >> 1 FROM items_rtree WHERE {rt})")
            t_lo = q.t_start / _T_UNIT if q.t_start is not None else (-_FAR if q.has_time else -math.inf)
            t_hi = q.t_end / _T_UNIT if q.t_end is not None else math.inf
            if q.has_time:
                t_lo = max(t_lo, -_FAR)  # above the unknown-time sentinel
            for w, s, e, n in q.boxes:
                params += [e, w, n, s, t_hi, t_lo]
        if q.has_time:
            # with a bbox the R*Tree drives ("+" keeps SQLite off the time index); alone, items_time does
            t = "+i" if q.boxes else "i"
            conds.append(f"{t}.t0 IS NOT NULL")
            if q.t_end is not None:
                conds.append(f"{t}.t0 <= ?")
                params.append(q.t_end)
            if q.t_start is not None:
                conds.append(f"{t}.t1 >= ?")
                params.append(q.t_start)
        if q.collections:
            conds.append(f"i.collection IN ({','.join('?' * len(q.collections))})")
            params += list(q.collections)
        if q.ids:
            conds.append(f"i.id IN ({','.join('?' * len(q.ids))})")
            params += list(q.ids)
        if q.wavelength_nm is not None:
            conds.append("EXISTS (SELECT 1 FROM coverage c WHERE c.item = i.rowid AND c.lo_nm <= ? AND c.hi_nm >= ?)")
            params += [q.wavelength_nm[0], q.wavelength_nm[1]]
        if q.min_bands is not None:
            conds.append("i.band_count >= ?")
            params.append(q.min_bands)
        if q.geohash is not None:
            p = q.geohash
            prefixes = [p[:k] for k in range(1, len(p))]
            sub = "SELECT item FROM geohash WHERE cell >= ? AND cell < ?"
            params += [p, p + "~"]
            if prefixes:
                sub += f" UNION SELECT item FROM geohash WHERE cell IN ({','.join('?' * len(prefixes))})"
                params += prefixes
            conds.append(f"i.rowid IN ({sub})")
        known: dict[str, set[str]] = {}
        if q.filters or any(k not in BUILTIN_SORT for k, _ in q.sort):
            known = self.queryables()
        for f in q.filters:
            col, cparams = self._property_sql(f.key, known, "a filter")
            kinds = known.get(f.key, set())
            value: Any = f.value
            if isinstance(value, bool) or (f.op in ("=", "!=") and "boolean" in kinds and value in ("true", "false")):
                if "boolean" not in kinds:
                    raise CatalogQueryError(f"filter {f}: {f.key} is {' or '.join(sorted(kinds))}, not true/false")
                guard, value = "typeof({c}) = 'integer'", 1 if value in (True, "true") else 0
            elif isinstance(value, float):
                if "number" not in kinds:
                    if f.op in ("<", "<=", ">", ">="):
                        raise CatalogQueryError(f"filter {f}: {f.key} is text; use = or != with it")
                    guard, value = "typeof({c}) = 'text'", str(int(value)) if value.is_integer() else str(value)
                else:
                    guard = "typeof({c}) IN ('integer', 'real')"
            else:
                if "string" not in kinds:
                    raise CatalogQueryError(f"filter {f}: {f.key} is a number; got {value!r}")
                guard = "typeof({c}) = 'text'"
            # SQL semantics, as CQL2: an item without the property (or of another type) matches no comparison
            conds.append(f"({guard.format(c=col)} AND {col} {f.op} ?)")
            params += [*cparams, *cparams, value]
        order = []
        order_params: list[Any] = []
        for key, desc in q.sort or (("datetime", False), ("id", False)):
            if key == "datetime":
                col, cparams = "i.t0", []
            elif key in ("id", "collection", "band_count"):
                col, cparams = f"i.{key}", []
            else:
                col, cparams = self._property_sql(key, known, "sort")
            order.append(f"{col} IS NULL, {col} {'DESC' if desc else 'ASC'}")
            order_params += [*cparams, *cparams]
        if ("id", False) not in q.sort and ("id", True) not in q.sort:
            order.append("i.id")
        where = " AND ".join(conds) or "1"
        exact = q.geometry is not None
        limit = q.limit
        return list(self._select(where, params + order_params, " ORDER BY " + ", ".join(order), limit,
                                 q.geometry if exact else None))

    def _select(self, where: str, params: list[Any], order: str, limit: int | None,
                geometry: Any = None) -> Iterator[SearchHit]:
        sql = ("SELECT i.id, i.collection, i.datetime, i.t0, i.t1, i.west, i.south, i.east, i.north, i.band_count, "
               f"i.href, i.properties, i.geometry FROM items i WHERE {where}{order}")
        if limit is not None and geometry is None:
            sql += f" LIMIT {int(limit)}"
        try:
            rows = self.db.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if _is_corrupt(exc):
                raise
            raise CatalogError(f"{self.path}: query failed ({exc})") from exc
        if geometry is not None and rows:
            geoms = shapely.from_wkb([r[12] for r in rows])
            keep = shapely.intersects(geoms, geometry)
            rows = [r for r, k in zip(rows, keep, strict=True) if k]
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
        lo, hi = db.execute("SELECT min(c.lo_nm), max(c.hi_nm) FROM coverage c JOIN items i ON i.rowid = c.item "
                            "WHERE i.collection=?", (collection,)).fetchone()
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
