"""Geohash cells for the catalog: a re-export of :mod:`cubelake.geohash`, where the code lives.

The loaders shard training samples by the same cells and may not import the catalog, so the
module moved down to the core; ``cubelake.catalog.geohash`` keeps working unchanged.
"""

from __future__ import annotations

from cubelake.geohash import BASE32, cell_bounds, cover, encode, expand, parse_prefix
from cubelake.geohash import MAX_CELLS as MAX_CELLS
from cubelake.geohash import intersects_cells as intersects_cells

__all__ = ["BASE32", "cell_bounds", "cover", "encode", "expand", "parse_prefix"]
