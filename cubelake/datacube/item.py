"""The STAC 1.1 Item of a built cube (datacube, projection, eo, raster extensions). No I/O.

The item lives at ``datacubes/<name>/item.json``: its ``zarr`` asset points into the version it
publishes (``./v/<version>/<name>.zarr``), its links lead to the lake's root catalog and to the
item of every scene it was built from (``derived_from``). ``cube:dimensions`` describes the axes
(``time`` with every acquisition instant, ``band`` with the band names, ``x``/``y`` with extent,
step and the CRS), ``cube:variables`` the ``data`` variable.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import shapely
from shapely.geometry import Polygon, box, mapping, shape

from cubelake.catalog.items import used_extensions
from cubelake.catalog.schema import (
    ASSET_MEDIA_TYPES,
    ASSET_ROLES,
    BANDS,
    CB_CHUNK_SHAPE,
    DATA_TYPES,
    EO_CENTER,
    EO_FWHM,
    PROJ_BBOX,
    PROJ_CODE,
    PROJ_SHAPE,
    PROJ_TRANSFORM,
    PROJ_WKT2,
    RASTER_OFFSET,
    RASTER_SCALE,
    STAC_VERSION,
)

from .grid import TargetGrid, apply, edge_pixels
from .scenes import CubeScene, TimeSlice
from .writer import CubeLayout

__all__ = ["CB_BUILD_HASH", "CB_CUBE_VERSION", "CB_SCENES", "CB_TIME_SCENES", "CUBE_DIMENSIONS", "CUBE_VARIABLES",
           "EXT_DATACUBE", "ITEM_FILE", "CubeItemSpec", "cube_item", "iso_utc"]

EXT_DATACUBE = "https://stac-extensions.github.io/datacube/v2.3.0/schema.json"
CUBE_DIMENSIONS = "cube:dimensions"
CUBE_VARIABLES = "cube:variables"
CB_BUILD_HASH = "cubelake:build_hash"  # inputs and settings the published version was built from
CB_CUBE_VERSION = "cubelake:cube_version"  # the version folder v/<version>/ the item publishes
CB_SCENES = "cubelake:scenes"
CB_TIME_SCENES = "cubelake:time_scenes"  # per time step, the scenes mosaicked into it (first valid wins)
ITEM_FILE = "item.json"


def iso_utc(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class CubeItemSpec:
    """Everything the item says: the cube, its inputs, how it was built and where its version lies."""

    name: str
    layout: CubeLayout
    slices: tuple[TimeSlice, ...]
    scenes: tuple[CubeScene, ...]
    resampling: str
    scales: dict[str, tuple[float, float]]  # scene id -> GDAL XSCALE, YSCALE
    build_hash: str
    version: str
    created: datetime
    unit: str | None = None


def _grid_outline(grid: TargetGrid) -> Polygon | None:
    """The grid's outline in longitude/latitude (edges densified), or ``None`` if PROJ cannot carry it."""
    from rasterio.crs import CRS
    from rasterio.warp import transform

    cols, rows = edge_pixels(grid.height, grid.width)
    xs, ys = apply(grid.affine, cols, rows)
    lon, lat = transform(CRS.from_wkt(grid.crs_wkt), CRS.from_epsg(4326), list(xs), list(ys))
    if not (np.isfinite(lon).all() and np.isfinite(lat).all()):
        return None
    return Polygon(zip(lon, lat, strict=True))


def _geometry(grid: TargetGrid, scenes: Sequence[CubeScene]) -> Any:
    """Where the cube has data: the scenes' footprints (their bboxes if unknown), cut to the grid's outline."""
    parts = []
    for s in scenes:
        if s.footprint:
            parts.append(shape(s.footprint))
        elif s.lonlat_bbox is not None:
            parts.append(box(*s.lonlat_bbox))
    outline = _grid_outline(grid)
    if not parts:
        return outline
    union = shapely.union_all([shapely.make_valid(p) for p in parts])
    if outline is None:
        return union
    cut = union.intersection(outline.buffer(0))
    return outline if cut.is_empty else cut


def _bands(layout: CubeLayout) -> list[dict[str, Any]]:
    out = []
    for num, name, wl, fw in zip(layout.band_numbers, layout.band_names, layout.wavelengths_nm, layout.fwhm_nm,
                                 strict=True):
        band: dict[str, Any] = {"name": name or f"b{num}"}
        if wl is not None:
            band[EO_CENTER] = round(wl / 1000.0, 7)
        if fw is not None:
            band[EO_FWHM] = round(fw / 1000.0, 7)
        out.append(band)
    return out


def _data_fields(layout: CubeLayout, unit: str | None) -> dict[str, Any]:
    enc = layout.encoding
    out: dict[str, Any] = {"data_type": enc.dtype} if enc.dtype in DATA_TYPES else {}
    if enc.fill_value is not None:
        out["nodata"] = "nan" if math.isnan(enc.fill_value) else enc.fill_value
    if unit:
        out["unit"] = unit
    return out


def _dimensions(spec: CubeItemSpec) -> dict[str, Any]:
    grid, layout = spec.layout.grid, spec.layout
    minx, miny, maxx, maxy = grid.bounds
    rx, ry = grid.res
    ref: int | str = grid.epsg if grid.epsg else grid.crs_wkt
    times = [iso_utc(s.time) for s in spec.slices]
    return {
        "time": {"type": "temporal", "extent": [times[0], times[-1]], "values": times},
        "band": {"type": "bands", "values": [b["name"] for b in _bands(layout)]},
        "y": {"type": "spatial", "axis": "y", "extent": [miny, maxy], "step": -ry, "reference_system": ref},
        "x": {"type": "spatial", "axis": "x", "extent": [minx, maxx], "step": rx, "reference_system": ref},
    }


def _asset(spec: CubeItemSpec) -> dict[str, Any]:
    layout = spec.layout
    enc = layout.encoding
    asset: dict[str, Any] = {
        "href": f"./v/{spec.version}/{spec.name}.zarr", "type": ASSET_MEDIA_TYPES["zarr"], "roles": ASSET_ROLES["zarr"],
        "title": f"datacube data (time, band, y, x): {len(spec.slices)} time step(s), {len(layout.band_numbers)} bands",
        "cubelake:array": "data", CB_CHUNK_SHAPE: list(layout.chunks), **_data_fields(layout, spec.unit),
    }
    if enc.is_scaled:
        asset[RASTER_SCALE] = enc.scale_factor
        asset[RASTER_OFFSET] = enc.add_offset
    asset[BANDS] = _bands(layout)
    return asset


def _properties(spec: CubeItemSpec) -> dict[str, Any]:
    grid = spec.layout.grid
    times = [iso_utc(s.time) for s in spec.slices]
    props: dict[str, Any] = {"datetime": times[0] if len(times) == 1 else None}
    if len(times) > 1:
        props["start_datetime"], props["end_datetime"] = times[0], times[-1]
    props["created"] = props["updated"] = iso_utc(spec.created)
    props[PROJ_CODE] = f"EPSG:{grid.epsg}" if grid.epsg else None
    if not grid.epsg:
        props[PROJ_WKT2] = grid.crs_wkt
    props[PROJ_SHAPE] = [grid.height, grid.width]
    props[PROJ_TRANSFORM] = list(grid.transform)
    props[PROJ_BBOX] = list(grid.bounds)
    props[CUBE_DIMENSIONS] = _dimensions(spec)
    props[CUBE_VARIABLES] = {"data": {"dimensions": ["time", "band", "y", "x"], "variable_type": "data",
                                      "description": "scene values reprojected onto the grid; NaN/nodata where no "
                                                     "scene has a value", **_data_fields(spec.layout, spec.unit)}}
    props[CB_SCENES] = [s.scene_id for s in spec.scenes]
    props[CB_TIME_SCENES] = [list(s.scene_ids) for s in spec.slices]
    props["cubelake:resampling"] = spec.resampling
    props["cubelake:warp_scale"] = {sid: list(v) for sid, v in sorted(spec.scales.items())}
    props["cubelake:mosaic"] = "first-valid"  # per value, the first scene of a time step (by id) that has one
    props[CB_BUILD_HASH] = spec.build_hash
    props[CB_CUBE_VERSION] = spec.version
    return props


#: The catalog collection of every built cube (the catalog writes its collection.json when it indexes one).
COLLECTION = "cubelake-datacubes"


def cube_item(spec: CubeItemSpec) -> dict[str, Any]:
    """The cube's STAC 1.1 Item, with relative hrefs (it sits in ``datacubes/<name>/``)."""
    geometry = _geometry(spec.layout.grid, spec.scenes)
    item: dict[str, Any] = {
        "type": "Feature",
        "stac_version": STAC_VERSION,
        "stac_extensions": [],
        "id": spec.name,
        "collection": COLLECTION,
        "geometry": mapping(geometry) if geometry is not None else None,
        **({"bbox": [round(v, 7) for v in geometry.bounds]} if geometry is not None else {}),
        "properties": _properties(spec),
        "links": [
            {"rel": "root", "href": "../../catalog.json", "type": "application/json"},
            {"rel": "collection", "href": f"../../collections/{COLLECTION}/collection.json", "type": "application/json"},
            {"rel": "parent", "href": f"../../collections/{COLLECTION}/collection.json", "type": "application/json"},
            *({"rel": "derived_from", "href": f"../../scenes/{s.scene_id}/{ITEM_FILE}", "type": "application/geo+json",
               "title": f"scene {s.scene_id}"} for s in spec.scenes),
        ],
        "assets": {"zarr": _asset(spec)},
    }
    item["stac_extensions"] = [*used_extensions(item), EXT_DATACUBE]
    return dict(json.loads(json.dumps(item, allow_nan=False)))  # plain JSON types (shapely gives tuples)
