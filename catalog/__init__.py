"""Catalog: STAC 1.1 items for every scene, a SQLite index, and spatial/temporal/spectral search.

>>> from cubelake.catalog import LakeCatalog, Query
>>> cat = LakeCatalog("lake")
>>> hits = cat.search(Query(bbox=(12.9, 52.3, 13.2, 52.5), datetime="2022-06/2022-08", wavelength_nm=(400, 1300)))

Import order: ``schema`` <- ``geohash``, ``coverage`` <- ``query``, ``items`` <- ``index`` <- ``lake``;
``schema`` <- ``validate`` (offline STAC JSON-schema validation).
"""

from __future__ import annotations

from .index import CatalogIndex, SearchHit
from .items import collection_dict, collection_id, item_from_record
from .lake import LakeCatalog, ReindexReport
from .query import ParsedQuery, PropertyFilter, Query, parse_query
from .validate import validate_stac

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
