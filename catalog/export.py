"""Export the catalog as one stac-geoparquet file (``stac_geoparquet``), readable by geopandas and DuckDB.

Two things in our items do not fit one Arrow schema, and are adapted for the table only (the
JSON items keep STAC's own forms):

- ``nodata`` (of an asset or a band) is a number or the string ``"nan"`` (STAC 1.1); Arrow needs
  one type, so it becomes a float (NaN for "nan");
- ``cubelake:calibration`` holds per-step records of different shapes; it is stored as its
  JSON text.

An item without a location (a scene with no georeferencing) gets an empty polygon, which
stac-geoparquet needs, geopandas reads as an empty shape and ``stac_table_to_items`` reads back
(an empty GeometryCollection does not: it has no ``coordinates``).

Hrefs are absolute and each item has a ``self`` link (``LakeCatalog.export_geoparquet``), so the
file is usable away from the lake.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import stac_geoparquet.arrow as sga

from .schema import BANDS, CB_CALIBRATION

__all__ = ["export_geoparquet", "item_for_arrow"]

_EMPTY = {"type": "Polygon", "coordinates": []}


def _nodata_as_float(obj: dict[str, Any]) -> None:
    if obj.get("nodata") is not None:
        obj["nodata"] = float(obj["nodata"])


def item_for_arrow(item: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``item`` whose fields have one Arrow type across items (see the module docstring)."""
    out = copy.deepcopy(item)
    props = out["properties"]
    for holder in [props, *out.get("assets", {}).values()]:
        _nodata_as_float(holder)
        for band in holder.get(BANDS, []):
            _nodata_as_float(band)
    if CB_CALIBRATION in props:
        props[CB_CALIBRATION] = json.dumps(props[CB_CALIBRATION])
    if out.get("geometry") is None:
        out["geometry"] = _EMPTY
        out["bbox"] = [math.nan] * 4  # stac-geoparquet needs every bbox; NaN = nowhere
    return out


def export_geoparquet(items: Iterable[dict[str, Any]], path: str | Path,
                      collections: dict[str, dict[str, Any]] | None = None) -> int:
    """Write ``items`` as a stac-geoparquet file at ``path`` (atomically); returns how many."""
    path = Path(path)
    count = 0

    def adapted() -> Iterator[dict[str, Any]]:
        nonlocal count
        for it in items:
            count += 1
            yield item_for_arrow(it)

    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        reader = sga.parse_stac_items_to_arrow(adapted())
        sga.to_parquet(reader, tmp, collections=collections)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return count
