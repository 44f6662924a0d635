"""Catalog: STAC 1.1 items for every scene, a SQLite index, and spatial/temporal/spectral search.

>>> from cubelake.catalog import LakeCatalog, Query
>>> cat = LakeCatalog("lake")
>>> hits = cat.search(Query(bbox=(12.9, 52.3, 13.2, 52.5), datetime="2022-06/2022-08", wavelength_nm=(400, 1300)))

Import order: ``schema`` <- ``geohash``, ``coverage`` <- ``query``, ``items`` <- ``index`` <- ``lake``;
``schema`` <- ``validate`` (offline STAC JSON-schema validation).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .index import CatalogIndex, SearchHit
    from .items import collection_dict, collection_id, item_from_record
    from .lake import LakeCatalog, ReindexReport
    from .query import ParsedQuery, PropertyFilter, Query, parse_query
    from .validate import validate_stac

#: Where each public name lives; a module is imported when one of its names is first used (so that
#: ``cubelake catalog search`` does not import the offline schema validation, for one).
_HOMES = {
    "CatalogIndex": "index", "SearchHit": "index",
    "collection_dict": "items", "collection_id": "items", "item_from_record": "items",
    "LakeCatalog": "lake", "ReindexReport": "lake",
    "ParsedQuery": "query", "PropertyFilter": "query", "Query": "query", "parse_query": "query",
    "validate_stac": "validate",
}

__all__ = [
    "CatalogIndex",
    "LakeCatalog",
    "ParsedQuery",
    "PropertyFilter",
    "Query",
    "ReindexReport",
    "SearchHit",
    "collection_dict",
    "collection_id",
    "item_from_record",
    "parse_query",
    "validate_stac",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
