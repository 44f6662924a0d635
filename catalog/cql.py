"""CQL2 filters (OGC CQL2, the STAC API Filter extension) on the catalog index. Pure: no connection.

Text and JSON are parsed and checked by the ``cql2`` library (developmentseed's cql2-rs bindings);
this module bounds what it is given (an untrusted filter can be deep or huge), then turns the CQL2
JSON tree into SQL over ``items i`` (see ``catalog/index.py``). Supported:

- logic: ``and``, ``or``, ``not``; ``true``/``false``
- comparisons ``= <> < <= > >=``, ``between``, ``in``, ``like`` (case-sensitive, ``%`` and ``_``),
  ``isNull`` on any queryable property, ``id``, ``collection`` and ``datetime`` (its start);
  a property compared with a value of another type, or missing, does not match (so ``not`` of it does)
- spatial: ``s_intersects s_disjoint s_within s_contains s_equals s_touches s_crosses s_overlaps`` of
  ``geometry`` (the footprint) with a GeoJSON geometry or ``BBOX(...)`` literal, in WGS84 lon/lat
- temporal: ``t_intersects t_disjoint t_equals t_before t_after t_meets t_metby t_overlaps
  t_overlappedby t_starts t_startedby t_during t_contains t_finishes t_finishedby`` of ``datetime``
  (the item's instant, or its ``start_datetime``/``end_datetime`` interval) with a ``TIMESTAMP``,
  ``DATE`` (the whole day) or ``INTERVAL`` (``'..'`` for an open end)
- ``cubelake:covers_wavelength(lo_nm, hi_nm)``: the item's kept bands cover every part of the range
  (their centre ± FWHM/2), as the CLI's ``--wavelength lo:hi``

Anything else (arithmetic, ``casei``/``accenti``, array operators, property-to-property comparisons)
is refused with a :class:`CatalogQueryError` naming it.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable
from typing import Any

from cubelake.errors import CatalogQueryError

from .query import PropertyFilter, epoch, parse_datetime_interval, parse_intersects

__all__ = ["FUNCTIONS", "MAX_FILTER_BYTES", "MAX_FILTER_DEPTH", "SPATIAL_OPS", "TEMPORAL_OPS", "filter_sql",
           "parse_cql2", "spatial_predicate"]

MAX_FILTER_BYTES = 64 * 1024  # a filter is a query, not a data set
MAX_FILTER_DEPTH = 64  # nesting of objects/arrays (JSON)
MAX_FILTER_NESTING = 128  # parentheses, NOTs and arithmetic operators (text; see _text_depth)
COVERS_WAVELENGTH = "cubelake:covers_wavelength"
FUNCTIONS = (COVERS_WAVELENGTH,)
SPATIAL_OPS = ("s_intersects", "s_disjoint", "s_within", "s_contains", "s_equals", "s_touches", "s_crosses",
               "s_overlaps")
# each relation of the item's [a0, a1] to the literal's [b0, b1] (Allen's interval algebra, as CQL2 defines them)
TEMPORAL_OPS: dict[str, str] = {
    "t_intersects": "{a0} <= {b1} AND {a1} >= {b0}",
    "t_disjoint": "({a0} > {b1} OR {a1} < {b0})",
    "t_equals": "{a0} = {b0} AND {a1} = {b1}",
    "t_before": "{a1} < {b0}",
    "t_after": "{a0} > {b1}",
    "t_meets": "{a1} = {b0}",
    "t_metby": "{a0} = {b1}",
    "t_overlaps": "{a0} < {b0} AND {a1} > {b0} AND {a1} < {b1}",
    "t_overlappedby": "{a0} > {b0} AND {a0} < {b1} AND {a1} > {b1}",
    "t_starts": "{a0} = {b0} AND {a1} < {b1}",
    "t_startedby": "{a0} = {b0} AND {a1} > {b1}",
    "t_during": "{a0} > {b0} AND {a1} < {b1}",
    "t_contains": "{a0} < {b0} AND {a1} > {b1}",
    "t_finishes": "{a1} = {b1} AND {a0} > {b0}",
    "t_finishedby": "{a1} = {b1} AND {a0} < {b0}",
}
_COMPARE = {"=": "=", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_FLIP = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_COLUMNS = {"id": "i.id", "collection": "i.collection"}
_TIME_COLUMNS = {"datetime": "i.t0", "start_datetime": "i.t0", "end_datetime": "i.t1"}

Sql = tuple[str, list[Any]]
Known = dict[str, set[str]]


_QUOTED = re.compile(r"'(?:[^']|'')*'")
_GEOMETRY = re.compile(r"\b(?:POINT|LINESTRING|POLYGON|MULTIPOINT|MULTILINESTRING|MULTIPOLYGON|GEOMETRYCOLLECTION|BBOX)"
                       r"\s*(?:Z\s*)?\(", re.IGNORECASE)
_NESTING = re.compile(r"\(|\bnot\b|[-+*/%^]", re.IGNORECASE)


_WKT_DEPTH = 4  # GEOMETRYCOLLECTION(MULTIPOLYGON(((x y, ...)))): the deepest a geometry literal nests


def _without_geometries(text: str) -> str:
    """``text`` with each geometry literal reduced to ``G``; a literal nested deeper than any geometry
    type nests is refused (cql2-rs takes time exponential in that depth: 18 extra levels, 2 s)."""
    out, pos = [], 0
    for m in _GEOMETRY.finditer(text):
        if m.start() < pos:
            continue
        depth = deepest = 1
        i = m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            deepest = max(deepest, depth)
            i += 1
        if deepest > _WKT_DEPTH:
            raise CatalogQueryError(f"filter: the geometry literal at character {m.start() + 1} nests "
                                    f"{deepest} parentheses deep; no geometry type nests more than {_WKT_DEPTH}")
        out.append(text[pos:m.start()] + "G")
        pos = i
    return "".join(out) + text[pos:]


def _text_depth(text: str) -> int:
    """An upper bound of how deep the parser recurses on ``text``: every parenthesis, NOT and arithmetic
    operator outside quoted strings and geometry literals. cql2-rs's recursive-descent parser overflows the
    stack (and the process dies with it) near 500 nested NOTs or 1,500 chained additions: far beyond any
    real filter, so this bound refuses them first."""
    return len(_NESTING.findall(_without_geometries(_QUOTED.sub("''", text))))


def _json_depth(node: Any, depth: int = 0) -> int:
    if depth > MAX_FILTER_DEPTH:
        return depth
    if isinstance(node, dict):
        return max((_json_depth(v, depth + 1) for v in node.values()), default=depth + 1)
    if isinstance(node, list):
        return max((_json_depth(v, depth + 1) for v in node), default=depth + 1)
    return depth


def _bounded(kind: str, size: int, depth: int, limit: int = MAX_FILTER_DEPTH) -> None:
    if size > MAX_FILTER_BYTES:
        raise CatalogQueryError(f"filter: {kind} of {size} bytes is over the limit of {MAX_FILTER_BYTES}; "
                                "split the query or search by bbox/intersects")
    if depth > limit:
        raise CatalogQueryError(f"filter: {kind} nested too deeply ({depth} parentheses, NOTs and operators; "
                                f"at most {limit})" if kind == "cql2-text" else
                                f"filter: {kind} nested deeper than {limit} levels")


def parse_cql2(value: str | dict[str, Any], lang: str | None = None) -> dict[str, Any]:
    """The CQL2 JSON of a filter given as CQL2 text or JSON (``lang``: ``cql2-text``/``cql2-json``, else guessed)."""
    import cql2  # the Rust parser: imported on first use, the CLI's start-up stays light

    if lang not in (None, "cql2-text", "cql2-json"):
        raise CatalogQueryError(f"filter-lang {lang!r} is not supported; use cql2-text or cql2-json")
    if isinstance(value, str) and (lang == "cql2-json" or (lang is None and value.lstrip().startswith("{"))):
        _bounded("cql2-json", len(value.encode()), 0)
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise CatalogQueryError("filter: not valid JSON (filter-lang cql2-json)") from None
    try:
        if isinstance(value, str):
            _bounded("cql2-text", len(value.encode()), _text_depth(value), MAX_FILTER_NESTING)
            expr = cql2.parse_text(value)
        elif isinstance(value, dict):
            _bounded("cql2-json", len(json.dumps(value)), _json_depth(value))
            expr = cql2.Expr(value)
        else:
            raise CatalogQueryError(f"filter: expected CQL2 text or a CQL2 JSON object, got a JSON {type(value).__name__}")
        # no expr.validate(): it compiles the CQL2 JSON Schema on every call (30-50 ms); the text grammar holds
        # already, and the translation below checks every operator, arity and literal it takes
        out = expr.to_json()
    except CatalogQueryError:
        raise
    except Exception as exc:  # cql2 raises its own ParseError/ValidationError (and ValueError)
        raise CatalogQueryError(f"filter: not valid CQL2 ({_short(exc)})") from None
    if not isinstance(out, (dict, bool)) or (isinstance(out, dict) and "op" not in out):
        raise CatalogQueryError(f"filter: a CQL2 filter is a condition (e.g. eo:cloud_cover < 10), not {_show(out)}")
    return out if isinstance(out, dict) else {"op": "=", "args": [1, 1 if out else 0]}


def _short(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def filter_sql(expr: Any, known: Known, property_sql: Callable[[str, Known, str], tuple[str, list[Any]]],
               compare_sql: Callable[[PropertyFilter, Known], tuple[list[str], list[Any]]]) -> Sql:
    """The SQL condition (over ``items i``) of a CQL2 JSON boolean expression, and its parameters.

    ``property_sql``/``compare_sql`` are the index's own (see ``catalog/_search_sql.py``), so a CQL2
    comparison and a ``--filter`` one mean the same.
    """
    try:
        return _Translator(known, property_sql, compare_sql).node(expr)
    except CatalogQueryError:
        raise
    except (ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:  # a malformed CQL2 JSON tree
        raise CatalogQueryError(f"filter: malformed CQL2 ({type(exc).__name__}: {_short(exc)}); see "
                                "https://docs.ogc.org/is/21-065r2/21-065r2.html for the JSON encoding") from None


class _Translator:
    def __init__(self, known: Known, property_sql: Callable[[str, Known, str], tuple[str, list[Any]]],
                 compare_sql: Callable[[PropertyFilter, Known], tuple[list[str], list[Any]]]) -> None:
        self.known, self.property_sql, self.compare_sql = known, property_sql, compare_sql

    def node(self, expr: Any) -> Sql:
        if isinstance(expr, bool):
            return ("1" if expr else "0"), []
        if not isinstance(expr, dict) or "op" not in expr:
            raise CatalogQueryError(f"filter: expected a boolean expression, got {_show(expr)}")
        op, args = str(expr["op"]), list(expr.get("args") or [])
        if op in ("and", "or"):
            parts = [self.node(a) for a in args]
            return "(" + f" {op.upper()} ".join(p[0] for p in parts) + ")", [x for p in parts for x in p[1]]
        if op == "not":
            inner, params = self.node(args[0])
            return f"(NOT {inner})", params
        if op in _COMPARE:
            return self.compare(op, args)
        if op in SPATIAL_OPS:
            return self.spatial(op, args)
        if op in TEMPORAL_OPS:
            return self.temporal(op, args)
        handler = {"between": self.between, "in": self.in_list, "like": self.like, "isNull": self.is_null,
                   COVERS_WAVELENGTH: self.covers}.get(op)
        if handler is None:
            raise CatalogQueryError(
                f"filter: operator or function {op!r} is not supported; supported: and, or, not, = <> < <= > >=, "
                f"between, in, like, isNull, {', '.join(SPATIAL_OPS)}, {', '.join(TEMPORAL_OPS)}, {COVERS_WAVELENGTH}")
        return handler(args)

    # -- comparisons ----------------------------------------------------------
    def _property(self, arg: Any, op: str) -> str:
        if isinstance(arg, dict) and "op" in arg:
            raise CatalogQueryError(f"filter: {arg['op']!r} inside {op} is not supported (arithmetic, CASEI/ACCENTI "
                                    "and functions of properties are not); compare a property with a value")
        if not (isinstance(arg, dict) and set(arg) == {"property"} and isinstance(arg["property"], str)):
            raise CatalogQueryError(f"filter: {op} needs a property on one side, e.g. eo:cloud_cover < 10; "
                                    f"got {_show(arg)}")
        return arg["property"]

    def compare(self, op: str, args: list[Any]) -> Sql:
        a, b = args
        if not _is_property(a) and _is_property(b):
            a, b, op = b, a, _FLIP[op]
        key = self._property(a, op)
        if _is_property(b):
            raise CatalogQueryError(f"filter: comparing two properties ({key} {op} {b['property']}) is not supported")
        if key in _TIME_COLUMNS:
            return self.time_compare(key, op, b)
        value = _literal(b, op)
        if key in _COLUMNS:
            if not isinstance(value, str):
                raise CatalogQueryError(f"filter: {key} is text; compare it with a 'quoted' string")
            return f"{_COLUMNS[key]} {_COMPARE[op]} ?", [value]
        conds, params = self.compare_sql(PropertyFilter(key, _COMPARE[op], value), self.known)  # type: ignore[arg-type]
        return conds[0], params

    def time_compare(self, key: str, op: str, literal: Any) -> Sql:
        lo, hi = _interval(literal, f"{key} {op}")
        if lo is None or hi is None or (lo != hi and op not in ("<", "<=", ">", ">=")):
            raise CatalogQueryError(f"filter: compare {key} with a TIMESTAMP or DATE, or use T_INTERSECTS for intervals")
        col = _TIME_COLUMNS[key]
        # a DATE is its whole day: datetime < DATE d means before the day starts, > after it ends
        value = lo if op in ("<", ">=") else hi
        if op in ("=", "<>") and lo != hi:
            raise CatalogQueryError(f"filter: {key} = DATE(...) is ambiguous; use T_INTERSECTS({key}, DATE(...))")
        return f"({col} IS NOT NULL AND {col} {_COMPARE[op]} ?)", [value]

    def between(self, args: list[Any]) -> Sql:
        prop, lo, hi = args
        a, pa = self.compare(">=", [prop, lo])
        b, pb = self.compare("<=", [prop, hi])
        return f"({a} AND {b})", pa + pb

    def in_list(self, args: list[Any]) -> Sql:
        prop, values = args
        if not isinstance(values, list) or not values:
            raise CatalogQueryError("filter: IN needs a non-empty list of values")
        parts = [self.compare("=", [prop, v]) for v in values]
        return "(" + " OR ".join(p[0] for p in parts) + ")", [x for p in parts for x in p[1]]

    def like(self, args: list[Any]) -> Sql:
        key = self._property(args[0], "like")
        pattern = args[1]
        if not isinstance(pattern, str):
            raise CatalogQueryError("filter: LIKE needs a 'quoted' pattern")
        col, params = self._column(key, "like")
        # GLOB, not LIKE: SQLite's LIKE ignores ASCII case, CQL2's does not
        return f"(typeof({col}) = 'text' AND {col} GLOB ?)", [*params, *params, _glob(pattern)]

    def is_null(self, args: list[Any]) -> Sql:
        key = self._property(args[0], "isNull")
        col, params = self._column(key, "isNull")
        return f"({col} IS NULL)", params

    def _column(self, key: str, what: str) -> tuple[str, list[Any]]:
        if key in _COLUMNS:
            return _COLUMNS[key], []
        if key in _TIME_COLUMNS:
            return _TIME_COLUMNS[key], []
        return self.property_sql(key, self.known, f"a filter's {what}")

    # -- space, time, wavelength ------------------------------------------------
    def spatial(self, op: str, args: list[Any]) -> Sql:
        a, b = args
        if not _is_property(a) and _is_property(b):
            a, b = b, a
            op = {"s_within": "s_contains", "s_contains": "s_within"}.get(op, op)
        key = self._property(a, op)
        if key != "geometry":
            raise CatalogQueryError(f"filter: {op} applies to the item geometry ('geometry'), not {key!r}")
        wkb, (w, s, e, n) = _geometry_wkb(b, op)
        exact = "cl_spatial(?, i.geometry, ?)"
        if op == "s_disjoint":
            return f"(i.geometry IS NOT NULL AND {exact})", [op, wkb]
        # every other relation needs the boxes to meet: the footprint's box first (columns, cheap), then the
        # exact test (shapely); an item across the antimeridian (west > east) goes straight to the exact test
        box_sql = "(i.west > i.east OR (i.west <= ? AND i.east >= ? AND i.south <= ? AND i.north >= ?))"
        return f"(i.geometry IS NOT NULL AND {box_sql} AND {exact})", [e, w, n, s, op, wkb]

    def temporal(self, op: str, args: list[Any]) -> Sql:
        a, b = args
        if not _is_property(a) and _is_property(b):
            a, b = b, a
            op = _TEMPORAL_FLIP.get(op, op)
        key = self._property(a, op)
        if key not in _TIME_COLUMNS:
            raise CatalogQueryError(f"filter: {op} applies to datetime (or start_datetime/end_datetime), not {key!r}")
        lo, hi = _interval(b, op)
        a0, a1 = ("i.t0", "i.t1") if key == "datetime" else (_TIME_COLUMNS[key],) * 2
        sql = TEMPORAL_OPS[op].format(a0=a0, a1=a1, b0="?", b1="?")
        params = _temporal_params(TEMPORAL_OPS[op], -math.inf if lo is None else lo, math.inf if hi is None else hi)
        return f"({a0} IS NOT NULL AND {sql})", params

    def covers(self, args: list[Any]) -> Sql:
        if len(args) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in args):
            raise CatalogQueryError(f"filter: {COVERS_WAVELENGTH}(lo_nm, hi_nm) needs two numbers (nanometres)")
        lo, hi = float(args[0]), float(args[1])
        if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
            raise CatalogQueryError(f"filter: {COVERS_WAVELENGTH}({args[0]}, {args[1]}): need 0 < lo <= hi (nm)")
        return "(i.band_set IN (SELECT band_set FROM band_coverage WHERE lo_nm <= ? AND hi_nm >= ?))", [lo, hi]


_TEMPORAL_FLIP = {"t_before": "t_after", "t_after": "t_before", "t_meets": "t_metby", "t_metby": "t_meets",
                  "t_overlaps": "t_overlappedby", "t_overlappedby": "t_overlaps", "t_starts": "t_startedby",
                  "t_startedby": "t_starts", "t_during": "t_contains", "t_contains": "t_during",
                  "t_finishes": "t_finishedby", "t_finishedby": "t_finishes"}


def _temporal_params(template: str, b0: float, b1: float) -> list[Any]:
    """The parameters of ``template`` in the order its ``{b0}``/``{b1}`` placeholders appear."""
    return [b0 if m == "{b0}" else b1 for m in re.findall(r"\{b[01]\}", template)]


def _is_property(arg: Any) -> bool:
    return isinstance(arg, dict) and "property" in arg


def _show(node: Any) -> str:
    text = json.dumps(node, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def _literal(arg: Any, op: str) -> float | str | bool:
    if isinstance(arg, bool):
        return arg
    if isinstance(arg, (int, float)):
        if not math.isfinite(arg):
            raise CatalogQueryError(f"filter: {op} needs a finite number")
        return float(arg)
    if isinstance(arg, str):
        return arg
    raise CatalogQueryError(f"filter: {op} needs a number, 'string' or true/false, got {_show(arg)}")


def _interval(arg: Any, where: str) -> tuple[float | None, float | None]:
    """Epoch seconds (start, end) of a TIMESTAMP (an instant), DATE (its day) or INTERVAL (``..`` open)."""
    if isinstance(arg, dict) and isinstance(arg.get("timestamp"), str):
        t = epoch(arg["timestamp"])
        return t, t
    if isinstance(arg, dict) and isinstance(arg.get("date"), str):
        return parse_datetime_interval(arg["date"])
    if isinstance(arg, dict) and isinstance(arg.get("interval"), list) and len(arg["interval"]) == 2:
        ends = [_end(v, i == 1) for i, v in enumerate(arg["interval"])]
        if ends[0] is not None and ends[1] is not None and ends[0] > ends[1]:
            raise CatalogQueryError(f"filter: {where}: the interval starts after it ends")
        return ends[0], ends[1]
    raise CatalogQueryError(f"filter: {where} needs TIMESTAMP('...'), DATE('...') or INTERVAL('...', '...'), "
                            f"got {_show(arg)}")


def _end(value: Any, is_end: bool) -> float | None:
    if isinstance(value, dict):
        value = value.get("timestamp", value.get("date"))
    if not isinstance(value, str):
        raise CatalogQueryError(f"filter: an INTERVAL end must be a time or '..', got {_show(value)}")
    if value == "..":
        return None
    lo, hi = parse_datetime_interval(value)
    return hi if is_end else lo


def _geometry_wkb(arg: Any, op: str) -> tuple[bytes, tuple[float, float, float, float]]:
    """The WKB of a GeoJSON geometry or BBOX literal, and its bounds."""
    import shapely
    from shapely.geometry import box

    if isinstance(arg, dict) and isinstance(arg.get("bbox"), list):
        nums = arg["bbox"]
        if len(nums) == 6:
            nums = [nums[0], nums[1], nums[3], nums[4]]
        if len(nums) != 4 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in nums):
            raise CatalogQueryError(f"filter: {op}: BBOX needs 4 finite numbers west, south, east, north")
        geom = box(*nums)
    else:
        geom = parse_intersects(arg, source=f"filter {op}")
    return bytes(shapely.to_wkb(geom)), tuple(geom.bounds)


@functools.lru_cache(maxsize=64)
def _literal_geometry(wkb: bytes) -> Any:
    import shapely

    geom = shapely.from_wkb(wkb)
    shapely.prepare(geom)
    return geom


def spatial_predicate(op: str, footprint: bytes | None, literal: bytes) -> int:
    """``cl_spatial(op, footprint_wkb, literal_wkb)``, the SQL function the index registers: 1 if the relation holds."""
    import shapely

    if footprint is None:
        return 0
    name = op.removeprefix("s_")
    fn = getattr(shapely, "equals" if name == "equals" else name)
    return int(bool(fn(shapely.from_wkb(footprint), _literal_geometry(literal))))


def _glob(pattern: str) -> str:
    """A CQL2 LIKE pattern (``%`` any run, ``_`` one character, ``\\`` escapes) as an SQLite GLOB."""
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            i += 1
            ch = pattern[i]
            out.append(f"[{ch}]" if ch in "*?[" else ch)
        elif ch == "%":
            out.append("*")
        elif ch == "_":
            out.append("?")
        else:
            out.append(f"[{ch}]" if ch in "*?[" else ch)
        i += 1
    return "".join(out)
