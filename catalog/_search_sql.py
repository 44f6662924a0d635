"""The SQL of a catalog search: a :class:`ParsedQuery` to a WHERE clause, ORDER BY and parameters.

Pure: no connection. ``known`` is the index's queryables (property -> JSON types seen), which
decide how a property filter compares. See ``catalog/index.py`` for the tables named here.
"""

from __future__ import annotations

import math
from typing import Any

from cubelake.errors import CatalogQueryError

from .cql import filter_sql
from .derived import DERIVED_ROOTS
from .query import BUILTIN_SORT, ParsedQuery, PropertyFilter
from .schema import PROMOTED

__all__ = ["FAR", "NO_TIME", "T_UNIT", "needs_queryables", "order_sql", "property_sql", "where_sql"]

NO_TIME = -1e30  # R*Tree time of items with no known time: before anything a search can ask for
FAR = 1e29
T_UNIT = 864_000.0  # seconds per R*Tree time unit (10 days; see catalog/index.py)
# a scene's href is scenes/<id>/item.json; a derived product's <root>/<name>/item.json (see .derived)
_NOT_DERIVED = (f"coalesce(substr(i.href, 1, instr(i.href, '/')), '') NOT IN "
                f"({', '.join(repr(r + '/') for r in DERIVED_ROOTS)})")
_BUILTIN_COLUMNS = {"id", "collection", "band_count"}

Sql = tuple[list[str], list[Any]]


def needs_queryables(q: ParsedQuery) -> bool:
    """Whether building ``q``'s SQL needs the index's queryables (a filter or a property sort)."""
    return bool(q.filters) or q.cql2 is not None or any(k not in BUILTIN_SORT for k, _ in q.sort)


def property_sql(key: str, known: dict[str, set[str]], what: str) -> tuple[str, list[Any]]:
    """The SQL expression of a property (and its parameters); unknown properties are an error."""
    if key not in known and key not in PROMOTED:
        raise CatalogQueryError(
            f"unknown property {key!r} in {what}; the catalog's queryable properties are: "
            f"{', '.join(sorted(known)) or '(none yet)'}"
        )
    if key in PROMOTED:
        return f"i.{PROMOTED[key]}", []
    return "json_extract(i.properties, ?)", ['$."' + key.replace('"', '\\"') + '"']


def _box_sql(q: ParsedQuery) -> Sql:
    """The R*Tree (longitude, latitude, time) prefilter; exact tests follow."""
    if not q.boxes:
        return [], []
    rt = " OR ".join("(minx <= ? AND maxx >= ? AND miny <= ? AND maxy >= ? AND mint <= ? AND maxt >= ?)"
                     for _ in q.boxes)
    t_lo = q.t_start / T_UNIT if q.t_start is not None else (-FAR if q.has_time else -math.inf)
    t_hi = q.t_end / T_UNIT if q.t_end is not None else math.inf
    if q.has_time:
        t_lo = max(t_lo, -FAR)  # above the unknown-time sentinel
    params: list[Any] = []
    for w, s, e, n in q.boxes:
        params += [e, w, n, s, t_hi, t_lo]
    if q.wavelength_nm is not None:
        # the band set rides along in the R*Tree: items of the wrong bands are never looked up
        rt = f"({rt}) AND band_set IN (SELECT band_set FROM band_coverage WHERE lo_nm <= ? AND hi_nm >= ?)"
        params += [q.wavelength_nm[0], q.wavelength_nm[1]]
    return [f"i.rowid IN (SELECT id >> 1 FROM items_rtree WHERE {rt})"], params


def _time_sql(q: ParsedQuery) -> Sql:
    if not q.has_time:
        return [], []
    # with a bbox the R*Tree drives ("+" keeps SQLite off the time index); alone, items_time does
    t = "+i" if q.boxes else "i"
    conds, params = [f"{t}.t0 IS NOT NULL"], []
    if q.t_end is not None:
        conds.append(f"{t}.t0 <= ?")
        params.append(q.t_end)
    if q.t_start is not None:
        conds.append(f"{t}.t1 >= ?")
        params.append(q.t_start)
    return conds, params


def _item_sql(q: ParsedQuery) -> Sql:
    """Collections, ids, wavelength coverage, band count and geohash cells."""
    conds: list[str] = []
    params: list[Any] = []
    if q.collections:
        conds.append(f"i.collection IN ({','.join('?' * len(q.collections))})")
        params += list(q.collections)
    if q.ids:
        conds.append(f"i.id IN ({','.join('?' * len(q.ids))})")
        params += list(q.ids)
    if q.wavelength_nm is not None:
        # the few band sets whose coverage holds the range, found once; items are matched by set
        conds.append("i.band_set IN (SELECT band_set FROM band_coverage WHERE lo_nm <= ? AND hi_nm >= ?)")
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
    return conds, params


def _filter_sql(f: PropertyFilter, known: dict[str, set[str]]) -> Sql:
    """One property comparison; SQL semantics, as CQL2: a missing or other-typed value matches nothing."""
    col, cparams = property_sql(f.key, known, "a filter")
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
    return [f"({guard.format(c=col)} AND {col} {f.op} ?)"], [*cparams, *cparams, value]


def where_sql(q: ParsedQuery, known: dict[str, set[str]], *, scenes_only: bool = False) -> tuple[str, list[Any]]:
    """The WHERE clause (over ``items i``) and its parameters; ``scenes_only``: no derived products."""
    conds: list[str] = [_NOT_DERIVED] if scenes_only else []
    params: list[Any] = []
    parts = [_box_sql(q), _time_sql(q), _item_sql(q)] + [_filter_sql(f, known) for f in q.filters]
    if q.cql2 is not None:
        sql, cql_params = filter_sql(q.cql2, known, property_sql, _filter_sql)
        parts.append(([sql], cql_params))
    for c, p in parts:
        conds += c
        params += p
    return " AND ".join(conds) or "1", params


def order_sql(q: ParsedQuery, known: dict[str, set[str]]) -> tuple[str, list[Any]]:
    """`` ORDER BY ...`` as the query asks (nulls last), ties broken by id; and its parameters."""
    order = []
    params: list[Any] = []
    for key, desc in q.sort or (("datetime", False), ("id", False)):
        cparams: list[Any] = []
        if key == "datetime":
            col = "i.t0"
        elif key in _BUILTIN_COLUMNS:
            col = f"i.{key}"
        else:
            col, cparams = property_sql(key, known, "sort")
        order.append(f"{col} IS NULL, {col} {'DESC' if desc else 'ASC'}")
        params += [*cparams, *cparams]
    if ("id", False) not in q.sort and ("id", True) not in q.sort:
        order.append("i.id")
    return " ORDER BY " + ", ".join(order), params
