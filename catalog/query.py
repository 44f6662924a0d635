"""Catalog queries: the typed request and its parsing, with clear errors. Pure (no database).

``Query`` takes what a user types (``bbox=(w, s, e, n)``, ``datetime="2022-06/2022-08"``,
``wavelength_nm=(400, 2400)``, ``filters=("eo:cloud_cover<10",)``, ``sort=("-datetime",)``) and
:func:`parse_query` turns it into a :class:`ParsedQuery` of canonical values (UTC epoch
seconds, a shapely geometry, typed filters), raising :class:`QueryError` naming the bad part.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import shapely
from shapely.geometry import box, shape
from shapely.geometry.base import BaseGeometry

from cubelake.errors import CatalogQueryError

from . import geohash
from .coverage import parse_wavelength_range

__all__ = ["Op", "ParsedQuery", "PropertyFilter", "Query", "parse_bbox", "parse_datetime_interval",
           "parse_filter", "parse_intersects", "parse_query", "parse_sort"]

Op = Literal["<", "<=", ">", ">=", "=", "!="]
_FILTER = re.compile(r"^\s*([A-Za-z_][\w:.\-]*)\s*(<=|>=|!=|==|=|<|>)\s*(.+?)\s*$")
# the CLI's own form, one PROPERTY OP VALUE with a bare word as a string ("platform=enmap"): kept as a subset;
# anything else a --filter holds is CQL2 text
_SIMPLE = re.compile(r"^\s*([A-Za-z_][\w:.\-]*)\s*(<=|>=|!=|==|=|<|>)\s*([^\s()'\"]+|'[^']*'|\"[^\"]*\")\s*$")
BUILTIN_SORT = {"datetime", "id", "collection", "band_count"}
_GEOMETRY_TYPES = {"Point", "MultiPoint", "LineString", "MultiLineString", "Polygon", "MultiPolygon",
                   "GeometryCollection"}


@dataclass(frozen=True, slots=True)
class PropertyFilter:
    key: str
    op: Op
    value: float | str | bool

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value}"


@dataclass(frozen=True, slots=True)
class Query:
    """A catalog search; every part is optional and all given parts must hold."""

    bbox: Sequence[float] | str | None = None  # west, south, east, north (degrees); west > east crosses 180°
    intersects: BaseGeometry | dict[str, Any] | str | None = None  # GeoJSON geometry/Feature(Collection) or text, WGS84
    datetime: str | tuple[str | None, str | None] | None = None  # "a/b", "../b", "a/..", "2022-07"
    collections: Sequence[str] | str = ()
    ids: Sequence[str] | str = ()
    wavelength_nm: tuple[float, float] | str | None = None  # every part covered by the kept bands
    min_bands: int | None = None
    geohash: str | None = None  # footprint meets a cell with this prefix
    filters: Sequence[PropertyFilter | str] | str = ()  # "eo:cloud_cover<10", or CQL2 text: "platform IN ('enmap')"
    filter: str | dict[str, Any] | None = None  # a CQL2 filter, text or JSON (the STAC API Filter extension)
    filter_lang: str | None = None  # "cql2-text" or "cql2-json"; None: JSON if it is an object, else text
    sort: Sequence[str] | str = ()  # "datetime", "-eo:cloud_cover", "id"
    limit: int | None = None
    offset: int = 0  # skip this many matches first (paging)


@dataclass(frozen=True, slots=True)
class ParsedQuery:
    boxes: tuple[tuple[float, float, float, float], ...] = ()  # split at the antimeridian
    geometry: BaseGeometry | None = None  # exact test for bbox/intersects
    t_start: float | None = None
    t_end: float | None = None
    has_time: bool = False
    collections: tuple[str, ...] = ()
    ids: tuple[str, ...] = ()
    wavelength_nm: tuple[float, float] | None = None
    min_bands: int | None = None
    geohash: str | None = None
    filters: tuple[PropertyFilter, ...] = ()
    cql2: dict[str, Any] | None = None  # the CQL2 JSON every item must also satisfy (see .cql)
    sort: tuple[tuple[str, bool], ...] = ()  # (key, descending)
    limit: int | None = None
    offset: int = 0
    warnings: tuple[str, ...] = field(default_factory=tuple)


def parse_bbox(value: Sequence[float] | str) -> tuple[float, float, float, float]:
    """``west,south,east,north`` in degrees (a 6-number 3D bbox drops its heights)."""
    raw = value.split(",") if isinstance(value, str) else list(value)
    try:
        nums = [float(v) for v in raw]
    except (TypeError, ValueError):
        raise CatalogQueryError(f"bbox {value!r}: expected 4 numbers west,south,east,north (degrees)") from None
    if len(nums) == 6:
        nums = [nums[0], nums[1], nums[3], nums[4]]
    if len(nums) != 4 or not all(math.isfinite(v) for v in nums):
        raise CatalogQueryError(f"bbox {value!r}: expected 4 finite numbers west,south,east,north (degrees)")
    w, s, e, n = nums
    if not (-180 <= w <= 180 and -180 <= e <= 180):
        raise CatalogQueryError(f"bbox {value!r}: longitudes must be within -180..180 (got west {w}, east {e}); "
                                "the order is west,south,east,north")
    if not (-90 <= s <= 90 and -90 <= n <= 90):
        raise CatalogQueryError(f"bbox {value!r}: latitudes must be within -90..90 (got south {s}, north {n}); "
                                "the order is west,south,east,north")
    if s > n:
        raise CatalogQueryError(f"bbox {value!r}: south {s} is north of north {n}; the order is west,south,east,north")
    return w, s, e, n


def _boxes(w: float, s: float, e: float, n: float) -> tuple[tuple[float, float, float, float], ...]:
    if w > e:  # crosses the antimeridian, as STAC allows
        return ((w, s, 180.0, n), (-180.0, s, e, n))
    return ((w, s, e, n),)


_PARTIAL = (
    (re.compile(r"^\d{4}$"), "year"),
    (re.compile(r"^\d{4}-\d{2}$"), "month"),
    (re.compile(r"^\d{4}-\d{2}-\d{2}$"), "day"),
)


def _instant(text: str, end: bool) -> float:
    """Epoch seconds; a year/month/day alone means its first (start) or last (end) instant."""
    t = text.strip()
    for rx, unit in _PARTIAL:
        if rx.match(t):
            parts = [int(p) for p in t.split("-")]
            y, m, d = parts[0], parts[1] if len(parts) > 1 else 1, parts[2] if len(parts) > 2 else 1
            try:
                first = datetime(y, m, d, tzinfo=UTC)
            except ValueError as exc:
                raise CatalogQueryError(f"datetime {text!r}: {exc}") from None
            if not end:
                return first.timestamp()
            if unit == "year":
                nxt = datetime(y + 1, 1, 1, tzinfo=UTC)
            elif unit == "month":
                nxt = datetime(y + (m == 12), m % 12 + 1, 1, tzinfo=UTC)
            else:
                nxt = datetime.fromtimestamp(first.timestamp() + 86400, UTC)
            return nxt.timestamp() - 1e-6
    iso = t[:-1] + "+00:00" if t.endswith(("Z", "z")) else t
    try:
        value = datetime.fromisoformat(iso)
    except ValueError:
        raise CatalogQueryError(
            f"datetime {text!r} is not ISO 8601: use e.g. 2022-07-24T10:45:26Z, 2022-07-24, 2022-07 or 2022, "
            "and START/END with '..' for an open end"
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def parse_datetime_interval(value: str | tuple[str | None, str | None]) -> tuple[float | None, float | None]:
    """``(start, end)`` epoch seconds, ``None`` for an open end; a single value is its own interval."""
    if isinstance(value, tuple):
        a, b = value
    elif "/" in value:
        a, _, b = value.partition("/")
    else:
        a = b = value
    a = None if a is None or a.strip() in ("", "..") else a
    b = None if b is None or b.strip() in ("", "..") else b
    if a is None and b is None:
        raise CatalogQueryError(f"datetime {value!r}: both ends are open; give at least one, e.g. 2022-06-01/..")
    start = _instant(a, end=False) if a is not None else None
    end = _instant(b, end=True) if b is not None else None
    if start is not None and end is not None and start > end:
        raise CatalogQueryError(f"datetime {value!r}: the start is after the end")
    return start, end


def _scalar(text: str) -> float | str | bool:
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    try:
        return float(t)
    except ValueError:
        return t


def parse_filter(value: PropertyFilter | str) -> PropertyFilter:
    """``"eo:cloud_cover<10"`` -> ``PropertyFilter("eo:cloud_cover", "<", 10.0)``."""
    if isinstance(value, PropertyFilter):
        return value
    m = _FILTER.match(value)
    if m is None:
        raise CatalogQueryError(
            f"filter {value!r}: expected PROPERTY OP VALUE with OP one of < <= > >= = !=, e.g. eo:cloud_cover<10"
        )
    key, op, raw = m.groups()
    op = "=" if op == "==" else op
    v = _scalar(raw)
    if op in ("<", "<=", ">", ">=") and not isinstance(v, float):
        raise CatalogQueryError(f"filter {value!r}: {op} needs a number, got {raw!r}")
    return PropertyFilter(key, op, v)  # type: ignore[arg-type]


def is_simple_filter(text: str) -> bool:
    """Whether ``text`` is the CLI's own ``PROPERTY OP VALUE`` form (``eo:cloud_cover<10``, ``platform=enmap``)."""
    return _SIMPLE.match(text) is not None


def _filters(q: Query) -> tuple[tuple[PropertyFilter, ...], dict[str, Any] | None]:
    """The simple property filters and the CQL2 JSON (all ANDed) of ``q``'s ``filters`` and ``filter``."""
    simple, exprs = [], []
    for f in _strings(q.filters):
        m = None if isinstance(f, PropertyFilter) else _SIMPLE.match(f)
        if m is not None and m.group(1) in _ITEM_FIELDS:  # not properties: the CQL2 translation knows them
            exprs.append(_item_field_filter(*m.groups()))
        elif isinstance(f, PropertyFilter) or m is not None:
            simple.append(parse_filter(f))
        else:
            exprs.append(_cli_cql2(f))
    if q.filter is not None:
        exprs.append(_cql2(q.filter, q.filter_lang))
    cql = exprs[0] if len(exprs) == 1 else {"op": "and", "args": exprs} if exprs else None
    return tuple(simple), cql


_ITEM_FIELDS = {"id", "collection", "datetime", "start_datetime", "end_datetime"}
_CQL2_OPS = {"=": "=", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def _item_field_filter(key: str, op: str, raw: str) -> dict[str, Any]:
    """``id=x``, ``collection!=y``, ``datetime>=2022-06-01`` as CQL2 JSON."""
    value: Any = _scalar(raw)
    if "datetime" in key:
        text = str(value)
        value = {"date": text} if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text) else {"timestamp": text}
    elif not isinstance(value, str):
        value = raw.strip()
    return {"op": _CQL2_OPS["=" if op == "==" else op], "args": [{"property": key}, value]}


def _cli_cql2(text: str) -> dict[str, Any]:
    """A ``--filter`` that is not ``PROPERTY OP VALUE``: CQL2 text; an error names both forms."""
    try:
        return _cql2(text, "cql2-text")
    except CatalogQueryError as exc:
        raise CatalogQueryError(
            f"filter {text!r}: {str(exc).removeprefix('filter: ')}; expected CQL2 text (e.g. \"eo:cloud_cover < 10 "
            "AND platform IN ('enmap')\") or PROPERTY OP VALUE with OP one of < <= > >= = !=") from None


def _cql2(value: str | dict[str, Any], lang: str | None) -> dict[str, Any]:
    from .cql import parse_cql2  # cql imports this module

    return parse_cql2(value, lang)


def parse_sort(keys: Sequence[str]) -> tuple[tuple[str, bool], ...]:
    out = []
    for k in keys:
        k = k.strip()
        desc = k.startswith("-")
        name = k.lstrip("+-")
        if not name:
            raise CatalogQueryError(f"sort key {k!r} is empty; use e.g. datetime, -datetime, -eo:cloud_cover")
        out.append((name, desc))
    return tuple(out)


def _geojson_shape(doc: Any) -> BaseGeometry:
    """A shapely geometry of a GeoJSON geometry, Feature or FeatureCollection (the union of its geometries)."""
    if not isinstance(doc, dict):
        raise ValueError(f"expected a GeoJSON object, got a JSON {type(doc).__name__}")
    kind = doc.get("type")
    if kind == "FeatureCollection":
        features = doc.get("features")
        if not isinstance(features, list):
            raise ValueError("a FeatureCollection without a 'features' list")
        parts = [_geojson_shape(f) for f in features if isinstance(f, dict) and f.get("geometry") is not None]
        if not parts:
            raise ValueError("a FeatureCollection with no feature geometry")
        return shapely.union_all(parts)
    if kind == "Feature":
        if not isinstance(doc.get("geometry"), dict):
            raise ValueError("a Feature without a geometry")
        return _geojson_shape(doc["geometry"])
    if kind not in _GEOMETRY_TYPES:
        raise ValueError(f"type {kind!r} is not a GeoJSON geometry, Feature or FeatureCollection")
    return shape(doc)


def parse_intersects(value: dict[str, Any] | str, source: str = "intersects") -> BaseGeometry:
    """The search geometry of GeoJSON (object or text): a geometry, a Feature or a FeatureCollection (their union).

    ``source`` names where it came from (a file name) in the error.
    """
    try:
        doc = json.loads(value) if isinstance(value, str) else value
        geom = _geojson_shape(doc)
    except RecursionError:
        raise CatalogQueryError(f"{source}: GeoJSON nested too deeply to be a geometry") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, shapely.errors.ShapelyError) as exc:
        raise CatalogQueryError(f"{source}: not usable as a search geometry ({exc}); give a GeoJSON geometry, "
                                "Feature or FeatureCollection in WGS84 lon/lat") from None
    if geom.is_empty:
        raise CatalogQueryError(f"{source}: the geometry is empty")
    if not geom.is_valid:
        geom = shapely.make_valid(geom)
    w, s, e, n = geom.bounds
    if not all(math.isfinite(v) for v in (w, s, e, n)) or w < -180 or e > 180 or s < -90 or n > 90:
        raise CatalogQueryError(f"{source}: coordinates must be WGS84 lon/lat degrees; bounds are {geom.bounds}")
    return geom


def _strings(value: Sequence[Any] | str) -> tuple[Any, ...]:
    """A lone string is one value, not a sequence of characters (``collections="enmap-l2a"``)."""
    return (value,) if isinstance(value, str) else tuple(value)


def parse_query(q: Query) -> ParsedQuery:
    """Check and canonicalise every part of ``q``; raises :class:`CatalogQueryError` on the first bad one."""
    boxes: tuple[tuple[float, float, float, float], ...] = ()
    geom: BaseGeometry | None = None
    if q.bbox is not None:
        w, s, e, n = parse_bbox(q.bbox)
        boxes = _boxes(w, s, e, n)
        geom = shapely.union_all([box(*b) for b in boxes])
    if q.intersects is not None:
        g = q.intersects if isinstance(q.intersects, BaseGeometry) else parse_intersects(q.intersects)
        geom = g if geom is None else shapely.intersection(geom, g)
        # a bbox disjoint from the geometry matches nothing: the empty geometry fails every exact test
        # (the point box alone would still let through items covering 0°, 0°)
        boxes = ((0.0, 0.0, -0.0, -0.0),) if geom.is_empty else boxes or _boxes(*g.bounds)
    t0 = t1 = None
    if q.datetime is not None:
        t0, t1 = parse_datetime_interval(q.datetime)
    wl = None
    if q.wavelength_nm is not None:
        try:
            if isinstance(q.wavelength_nm, str):
                wl = parse_wavelength_range(q.wavelength_nm)
            else:
                lo, hi = (float(v) for v in q.wavelength_nm)
                wl = parse_wavelength_range(f"{lo}:{hi}")
        except (ValueError, TypeError) as exc:
            raise CatalogQueryError(str(exc)) from None
    if q.min_bands is not None and int(q.min_bands) < 1:
        raise CatalogQueryError(f"min_bands must be >= 1, got {q.min_bands}")
    gh = None
    if q.geohash is not None:
        try:
            gh = geohash.parse_prefix(q.geohash)
        except ValueError as exc:
            raise CatalogQueryError(str(exc)) from None
    if q.limit is not None and int(q.limit) < 0:
        raise CatalogQueryError(f"limit must be >= 0, got {q.limit}")
    filters, cql = _filters(q)
    return ParsedQuery(
        boxes=boxes, geometry=geom, t_start=t0, t_end=t1, has_time=q.datetime is not None,
        collections=_strings(q.collections), ids=_strings(q.ids), wavelength_nm=wl,
        min_bands=int(q.min_bands) if q.min_bands is not None else None, geohash=gh,
        filters=filters, cql2=cql, sort=parse_sort(_strings(q.sort)),
        limit=int(q.limit) if q.limit is not None else None, offset=_offset(q.offset),
    )


def _offset(value: int) -> int:
    if int(value) < 0:
        raise CatalogQueryError(f"offset must be >= 0, got {value}")
    return int(value)


def epoch(text: str) -> float:
    """Epoch seconds of an ISO time (naive = UTC)."""
    return _instant(text, end=False)


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")
