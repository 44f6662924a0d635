"""STAC 1.1 Items from published scene records, and Collections from index summaries. No I/O.

An item lives next to its products (``scenes/<id>/item.json``), so its asset hrefs are
relative (``./<id>.tif``) and the scene folder moves as one piece. Links are relative too:
the lake's ``catalog.json`` is the root, ``collections/<profile>/collection.json`` the parent.
"""

from __future__ import annotations

import copy
import json
import math
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from pyproj import CRS
from shapely.geometry import shape

from cubelake.products import aux_array_name
from cubelake.record import (
    Acquisition,
    AuxLayer,
    Calibration,
    Footprint,
    Grid,
    ProductInfo,
    SceneRecord,
    Thumbnail,
)

from . import geohash
from .coverage import merged_coverage
from .schema import (
    ASSET_MEDIA_TYPES,
    ASSET_ROLES,
    AZIMUTHS,
    BANDS,
    CATALOG_ID,
    CB_AUX_ARRAYS,
    CB_BAND_COUNT,
    CB_CALIBRATION,
    CB_CHUNK_SHAPE,
    CB_CONFIG_HASH,
    CB_CONTENT_HASH,
    CB_COVERAGE,
    CB_DATETIME_SOURCE,
    CB_GEOHASH,
    CB_PROFILE,
    CB_QUALITY,
    CB_TREE_CHECKSUM,
    CB_VALIDATION,
    DATA_TYPES,
    EO_CENTER,
    EO_FWHM,
    EXTENSION_PREFIXES,
    FILE_CHECKSUM,
    FILE_SIZE,
    GEOHASH_PRECISION,
    PROJ_BBOX,
    PROJ_CODE,
    PROJ_SHAPE,
    PROJ_TRANSFORM,
    PROJ_WKT2,
    PROPERTY_RANGES,
    RASTER_OFFSET,
    RASTER_SCALE,
    STAC_VERSION,
    multihash_blake3,
    source_media_type,
)

__all__ = ["CollectionSummary", "collection_dict", "collection_id", "item_bands", "item_from_record", "item_json",
           "root_catalog_dict", "used_extensions", "with_absolute_hrefs"]

ITEM_FILE = "item.json"
_SAFE = re.compile(r"[^a-z0-9._-]+")
_NUMBER = re.compile(r"[-+]?\d+(\.\d+)?")
_STATS = (("min", "minimum"), ("max", "maximum"), ("mean", "mean"), ("std", "stddev"))


def collection_id(profile_name: str) -> str:
    """A safe collection id for a profile name (lower case, no separators)."""
    cid = _SAFE.sub("-", profile_name.lower()).strip(".-_")
    return cid or "generic"


def _time(value: str | None) -> str | None:
    if value is None:
        return None
    return value if value.endswith("Z") else value.replace("+00:00", "Z")


def _number_or_text(value: str) -> float | int | str:
    """A tag's value as a JSON number when it is a finite one, else its text (NaN is no JSON)."""
    try:
        f = float(value)
    except ValueError:
        return value.strip()
    if not math.isfinite(f):
        return value.strip()
    return int(f) if f.is_integer() and "." not in value else f


def _gsd(grid: Grid) -> float | None:
    t, wkt = grid.transform, grid.crs_wkt
    if not t or not wkt:
        return None
    try:
        crs = CRS.from_wkt(wkt)
    except Exception:  # pyproj raises its own CRSError family; an odd WKT just means no gsd
        return None
    if crs.is_projected and crs.axis_info and crs.axis_info[0].unit_name in ("metre", "meter"):
        return round(math.hypot(t[0], t[3]), 6)
    return None


def _acquisition(record: SceneRecord) -> Acquisition:
    if record.acquisition is not None:
        return record.acquisition
    # records written before acquisition times were resolved: the metadata time, if any
    dt = record.datetime
    if dt:
        from datetime import UTC, datetime

        v = datetime.fromisoformat(dt.replace("Z", "+00:00"))
        v = v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC)
        return Acquisition(datetime=v.isoformat().replace("+00:00", "Z"), source="metadata")
    return Acquisition(datetime=None, start_datetime="1970-01-01T00:00:00Z",
                       end_datetime=_time((record.ingested_at or "1970-01-01T00:00:00Z").replace("+00:00", "Z")),
                       source="unknown")


def _sig(value: float) -> float:
    """A statistic to 7 significant digits: float32 data has no more, and the item stays small."""
    return float(f"{value:.7g}")


def _bands(record: SceneRecord, statistics: bool) -> list[dict[str, Any]]:
    """The STAC 1.1 ``bands`` of a data asset: name, centre and FWHM (µm), optionally statistics."""
    height, width = record.grid.height, record.grid.width
    out = []
    for b in record.bands:
        band: dict[str, Any] = {"name": b.name or f"b{b.source_band}"}
        if b.wavelength_nm is not None:
            band[EO_CENTER] = round(b.wavelength_nm / 1000.0, 7)
        if b.fwhm_nm is not None:
            band[EO_FWHM] = round(b.fwhm_nm / 1000.0, 7)
        if statistics:
            values = {"min": b.min, "max": b.max, "mean": b.mean, "std": b.std}
            stats = {k2: _sig(v) for k1, k2 in _STATS if (v := values[k1]) is not None}
            if b.count is not None and height * width:
                stats["valid_percent"] = round(100.0 * b.count / (height * width), 4)
            if stats:
                band["statistics"] = stats
        out.append(band)
    return out


def _data_fields(record: SceneRecord) -> dict[str, Any]:
    """What every band of a data asset shares, given once on the asset (STAC 1.1 lets bands inherit it)."""
    enc = record.encoding
    out: dict[str, Any] = {}
    if enc.dtype in DATA_TYPES:
        out["data_type"] = enc.dtype
    fill = enc.fill_value
    if fill is not None:
        out["nodata"] = "nan" if fill == "NaN" else fill
    unit = record.calibration.unit if record.calibration is not None else None
    if unit:
        out["unit"] = unit
    if enc.scale_factor is not None:
        out[RASTER_SCALE] = enc.scale_factor
        out[RASTER_OFFSET] = enc.add_offset if enc.add_offset is not None else 0.0
    return out


def _calibration_summary(calibration: Calibration | None) -> dict[str, Any] | None:
    """What the calibration did, without its per-band arrays (those are in ``scene.json``, the ``scene`` asset)."""
    if calibration is None:
        return None
    steps = calibration.steps
    out: dict[str, Any] = {"quantity": calibration.quantity, "unit": calibration.unit,
                           "source_dtype": calibration.source_dtype}
    out["steps"] = [str(s.get("step")) for s in steps]
    for s in steps:
        if s.get("step") == "select_bands":
            out["source_bands"] = s.get("n_source")
            out["bands_kept"] = len(s.get("keep") or [])
            reasons: dict[str, int] = {}
            for why in (s.get("removed") or {}).values():
                kind = _NUMBER.sub("", str(why)).replace(" nm", "").strip() or str(why)  # "wavelength window"
                reasons[kind] = reasons.get(kind, 0) + 1
            out["bands_removed"] = reasons
    return out


def _property_value(prop: str, value: Any) -> Any:
    """A profile or tag value as its extension allows it, or ``None`` to leave it out.

    Landsat writes -1 for a cloud cover it did not compute and azimuths in -180..180; the eo and
    view schemas allow 0..100 and 0..360.
    """
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if prop in AZIMUTHS:
        return value % 360.0 if number else None
    if prop in PROPERTY_RANGES:
        lo, hi = PROPERTY_RANGES[prop]
        if not (number and lo <= value <= hi):
            return None
    return value


def used_extensions(obj: Any) -> list[str]:
    """The extension schema URLs whose field prefixes occur as keys anywhere in ``obj``, in a fixed order."""
    prefixes: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(k, str) and ":" in k:
                    prefixes.add(k.split(":", 1)[0])
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(obj)
    return [url for prefix, url in EXTENSION_PREFIXES.items() if prefix in prefixes]


def item_bands(item: dict[str, Any]) -> list[dict[str, Any]]:
    """The bands of an item's cube: those of its first data asset with ``bands`` (aux layers are not the cube),
    else ``properties.bands``."""
    for asset in (item.get("assets") or {}).values():
        if not isinstance(asset, dict):
            continue
        roles = asset.get("roles") or []
        if "data" in roles and "auxiliary" not in roles and isinstance(asset.get(BANDS), list):
            return list(asset[BANDS])
    bands = (item.get("properties") or {}).get(BANDS)
    return list(bands) if isinstance(bands, list) else []


def _asset(href: str, key: str, info: ProductInfo, media_type: str) -> dict[str, Any]:
    a: dict[str, Any] = {"href": href, "type": media_type, "roles": ASSET_ROLES[key]}
    if info.bytes is not None:
        a[FILE_SIZE] = info.bytes
    if info.blake3:
        a[FILE_CHECKSUM] = multihash_blake3(info.blake3)
    if info.tree_blake3:
        a[CB_TREE_CHECKSUM] = multihash_blake3(info.tree_blake3)
    return a


def _source_asset(record: SceneRecord) -> dict[str, Any]:
    src = record.source
    files = src.files
    main = next((f for f in files if f.path == src.path), files[0] if len(files) == 1 else None)
    source: dict[str, Any] = {
        "href": src.path,
        "type": source_media_type(src.format or ""),
        "roles": ASSET_ROLES["source"],
        "title": f"source ({src.format}, {len(files)} file{'s' if len(files) != 1 else ''}; "
                 "the item's bands describe the products, not the source)",
        "cubelake:band_count": src.shape[0] if src.shape else None,
    }
    if src.dtype in DATA_TYPES:
        source["data_type"] = src.dtype
    if main is not None:
        source[FILE_SIZE] = main.size
        if main.blake3:
            source[FILE_CHECKSUM] = multihash_blake3(main.blake3)
    source["cubelake:files"] = [
        {"href": f.path, FILE_SIZE: f.size, **({FILE_CHECKSUM: multihash_blake3(f.blake3)} if f.blake3 else {})}
        for f in files
    ]
    return source


def _aux_time(text: str | None) -> dict[str, Any]:
    """An aux raster's acquisition (``T`` or ``START/END``, UTC) as the asset's STAC 1.1 time fields."""
    if not text:
        return {}
    start, sep, end = text.partition("/")
    if sep:
        return {"start_datetime": _time(start), "end_datetime": _time(end)}
    return {"datetime": _time(text)}


def _aux_asset(layer: AuxLayer, cog: str) -> dict[str, Any]:
    """The COG of an aux layer (a raster warped onto the scene's grid, so the item's ``proj:`` fields hold).

    STAC 1.1 fields where they fit (``data_type``, ``nodata``, ``statistics``, the source's acquisition as
    ``datetime``, ``bands`` of a multi-band layer); the rest under the names the Zarr array's attributes use.
    """
    a: dict[str, Any] = {
        "href": f"./{cog}", "type": ASSET_MEDIA_TYPES["cog"], "roles": ASSET_ROLES["aux"],
        "title": f"auxiliary layer {layer.name} ({layer.kind}, {layer.resampling} from {PurePath(layer.source).name})",
    }
    if layer.dtype in DATA_TYPES:
        a["data_type"] = layer.dtype
    fill = layer.fill_value
    if fill == "NaN":
        a["nodata"] = "nan"
    elif isinstance(fill, int | float) and math.isfinite(fill):
        a["nodata"] = fill
    if layer.valid_fraction is not None and layer.bands == 1:  # any band valid, for several: not STAC's meaning
        a["statistics"] = {"valid_percent": round(100.0 * float(layer.valid_fraction), 4)}
    a.update(_aux_time(layer.source_datetime))
    if layer.bands > 1:
        names = layer.band_names or []
        a[BANDS] = [{"name": names[i] if i < len(names) and names[i] else f"band {i + 1}"} for i in range(layer.bands)]
    a["cubelake:aux_name"] = layer.name
    a["cubelake:kind"] = layer.kind
    a["cubelake:resampling"] = layer.resampling
    a["cubelake:source"] = layer.source
    # floats always: one Arrow type per field across items (the geoparquet export)
    for key, number in (("time_delta_s", layer.time_delta_s), ("valid_fraction", layer.valid_fraction)):
        if number is not None:
            a[f"cubelake:{key}"] = float(number)
    if layer.classes:
        a["cubelake:classes"] = layer.classes
    if layer.zarr_array:
        a["cubelake:zarr_array"] = layer.zarr_array
    return a


def _thumbnail_asset(thumb: Thumbnail) -> dict[str, Any]:
    """The preview image: a PNG beside the item, titled with the bands it shows."""
    a: dict[str, Any] = {"href": f"./{thumb.path}", "type": thumb.media_type or ASSET_MEDIA_TYPES["png"],
                         "roles": ASSET_ROLES["thumbnail"], "title": thumb.title or "preview"}
    if thumb.description:
        a["description"] = thumb.description
    return a


def _assets(record: SceneRecord) -> dict[str, dict[str, Any]]:
    assets = {"source": _source_asset(record)}
    chunk = record.grid.chunk_shape
    products = record.products
    # every data asset lists the bands; their statistics once, on the COG (what viewers read), else the first
    with_stats = "cog" if "cog" in products else next(iter(products), None)
    shared = _data_fields(record)
    for key, info in products.items():
        href = f"./{info.path}"
        if key == "refs":
            mt = ASSET_MEDIA_TYPES["refs_json" if info.format == "json" else "refs_parquet"]
        else:
            mt = info.media_type or ASSET_MEDIA_TYPES.get(key, "application/octet-stream")
        a = _asset(href, key, info, mt)
        a.update(shared)
        a[BANDS] = _bands(record, statistics=key == with_stats)
        a[CB_CHUNK_SHAPE] = chunk
        if key == "zarr":
            a["cubelake:array"] = info.array or "data"
            aux_arrays = [layer.zarr_array for layer in record.aux if layer.zarr_array]
            if aux_arrays:
                a[CB_AUX_ARRAYS] = aux_arrays
        if key == "refs":
            a["cubelake:in_place"] = info.in_place
            a["cubelake:refs_format"] = info.format
            if info.reason_not_in_place:
                a["cubelake:reason_not_in_place"] = info.reason_not_in_place
        assets[key] = a
    labels = record.labels
    if labels is not None and labels.cog:
        assets["labels"] = {"href": f"./{labels.cog}", "type": ASSET_MEDIA_TYPES["cog"], "roles": ASSET_ROLES["labels"],
                            "title": "per-pixel class labels", "cubelake:classes": labels.classes}
        if labels.zarr_array:
            assets["labels"]["cubelake:zarr_array"] = labels.zarr_array
    for layer in record.aux:
        if layer.cog:
            assets[aux_array_name(layer.name)] = _aux_asset(layer, layer.cog)
    if record.thumbnail is not None:
        assets["thumbnail"] = _thumbnail_asset(record.thumbnail)
    assets["scene"] = {"href": "./scene.json", "type": "application/json", "roles": ASSET_ROLES["scene"],
                       "title": "cubelake scene record"}
    assets["validation"] = {"href": "./validation.json", "type": "application/json", "roles": ASSET_ROLES["validation"],
                            "title": "validation report"}
    return assets


def _absolute(href: str, base: str) -> str:
    """``href`` made absolute against the folder ``base``; URLs (``s3://``, ``https://``) and absolute paths stay."""
    if "://" in href or posixpath.isabs(href):
        return href
    if "://" in base:  # an object-store folder: normalise the key part only (normpath would eat "//")
        scheme, rest = base.split("://", 1)
        return f"{scheme}://{posixpath.normpath(posixpath.join(rest, href))}"
    return posixpath.normpath(posixpath.join(base, href))


def with_absolute_hrefs(item: dict[str, Any], item_path: str, *, in_place: bool = False) -> dict[str, Any]:
    """A copy of ``item`` whose asset and link hrefs are absolute, with a ``self`` link to ``item_path``.

    ``item_path`` is the item file's absolute path; the copy is usable from any working directory
    (search output, the geoparquet export), the file itself keeps relative hrefs so the lake can move.
    ``in_place``: change ``item`` itself (a dict just read, nobody else holds): a deep copy of an item
    with hundreds of bands costs more than reading it (5 ms of the 6 ms per item of a search's JSON).
    """
    base = posixpath.dirname(item_path)
    out = item if in_place else copy.deepcopy(item)
    for asset in (out.get("assets") or {}).values():
        if isinstance(asset, dict) and isinstance(asset.get("href"), str):
            asset["href"] = _absolute(asset["href"], base)
    links = [dict(lk) for lk in out.get("links") or [] if isinstance(lk, dict) and lk.get("rel") != "self"]
    for lk in links:
        if isinstance(lk.get("href"), str):
            lk["href"] = _absolute(lk["href"], base)
    out["links"] = [{"rel": "self", "href": item_path, "type": "application/geo+json"}, *links]
    return out


def item_json(item: dict[str, Any]) -> str:
    """An item as the text of its ``item.json``: strict JSON (no NaN), compact (hundreds of bands per asset;
    ``cubelake catalog show`` prints it indented)."""
    return json.dumps(item, separators=(",", ":"), allow_nan=False) + "\n"


def _time_properties(record: SceneRecord) -> dict[str, Any]:
    """``datetime`` (or a ``start``/``end`` interval), where the time came from, and ``created``/``updated``."""
    acq = _acquisition(record)
    props: dict[str, Any] = {"datetime": _time(acq.datetime)}
    if acq.start_datetime:
        props["start_datetime"] = _time(acq.start_datetime)
        props["end_datetime"] = _time(acq.end_datetime)
    props[CB_DATETIME_SOURCE] = acq.source
    created = _time((record.ingested_at or "").replace("+00:00", "Z")) or None
    if created:
        props["created"] = props["updated"] = created
    return props


def _grid_properties(grid: Grid, fp: Footprint | None) -> dict[str, Any]:
    """The projection extension's properties of the cube's grid."""
    props: dict[str, Any] = {}
    epsg = grid.crs_epsg
    props[PROJ_CODE] = f"EPSG:{epsg}" if epsg else None
    if not epsg and grid.crs_wkt:
        props[PROJ_WKT2] = grid.crs_wkt
    props[PROJ_SHAPE] = [grid.height, grid.width]
    if grid.transform:
        props[PROJ_TRANSFORM] = list(grid.transform[:6])
    if fp and fp.native_bbox:
        props[PROJ_BBOX] = list(fp.native_bbox)
    return props


def item_from_record(record: SceneRecord | Mapping[str, Any]) -> dict[str, Any]:
    """The STAC 1.1 Item of a published scene record (``scene.json``; a parsed one is read as a record)."""
    if not isinstance(record, SceneRecord):
        record = SceneRecord.from_dict(record, "scene record")
    sid = record.scene_id
    profile = record.profile
    stac = profile.settings.get("stac", {}) or {}
    coll = collection_id(profile.name if profile.name is not None else "generic")
    grid = record.grid
    fp = record.footprint
    geometry = fp.geometry if fp else None
    bbox = list(fp.bbox) if fp else None

    props = _time_properties(record)
    for k in ("platform", "constellation"):
        if stac.get(k):
            props[k] = stac[k]
    if stac.get("instruments"):
        props["instruments"] = list(stac["instruments"])
    gsd = _gsd(grid)
    if gsd is not None:
        props["gsd"] = gsd
    props.update(stac.get("properties", {}))
    tags = record.tags
    for prop, tag in (stac.get("tag_properties") or {}).items():
        if tag in tags and str(tags[tag]).strip():
            props[prop] = _number_or_text(str(tags[tag]))
    for prop in [k for k in props if k in PROPERTY_RANGES or k in AZIMUTHS]:
        value = _property_value(prop, props[prop])
        if value is None:
            del props[prop]
        else:
            props[prop] = value

    props.update(_grid_properties(grid, fp))
    merged = merged_coverage([b.wavelength_nm for b in record.bands], [b.fwhm_nm for b in record.bands])
    props[CB_COVERAGE] = [[round(lo, 4), round(hi, 4)] for lo, hi in merged]
    props[CB_BAND_COUNT] = len(record.bands)
    hw = grid.height * grid.width
    counts = [b.count for b in record.bands if b.count is not None]
    if counts and hw:
        props[CB_QUALITY] = round(sum(counts) / (len(counts) * hw), 6)
    props[CB_PROFILE] = profile.name
    props[CB_CHUNK_SHAPE] = grid.chunk_shape
    props[CB_CALIBRATION] = _calibration_summary(record.calibration)
    warnings = record.validation.warnings
    props[CB_VALIDATION] = {
        "status": "passed_with_warnings" if warnings else "passed",
        "warnings": [{"code": w.code, "message": w.message} for w in warnings],
    }
    props[CB_CONFIG_HASH] = record.config_hash
    props[CB_CONTENT_HASH] = record.content_hash
    props[CB_GEOHASH] = geohash.cover(shape(geometry), GEOHASH_PRECISION) if geometry else []

    item: dict[str, Any] = {
        "type": "Feature",
        "stac_version": STAC_VERSION,
        "stac_extensions": [],
        "id": sid,
        "collection": coll,
        "geometry": geometry,
        **({"bbox": bbox} if bbox else {}),
        "properties": props,
        "links": [
            {"rel": "root", "href": "../../catalog.json", "type": "application/json"},
            {"rel": "parent", "href": f"../../collections/{coll}/collection.json", "type": "application/json"},
            {"rel": "collection", "href": f"../../collections/{coll}/collection.json", "type": "application/json"},
        ],
        "assets": _assets(record),
    }
    item["stac_extensions"] = used_extensions(item)
    return item


@dataclass(slots=True)
class CollectionSummary:
    """What the index knows about one collection's items (see ``CatalogIndex.collection_summary``)."""

    id: str
    item_ids: list[str] = field(default_factory=list)
    item_hrefs: list[str] = field(default_factory=list)
    bbox: tuple[float, float, float, float] | None = None
    start: str | None = None
    end: str | None = None
    values: dict[str, list[Any]] = field(default_factory=dict)  # distinct values of text properties
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)  # min/max of numeric ones


def collection_dict(summary: CollectionSummary, description: str = "", stac: dict[str, Any] | None = None) -> dict[str, Any]:
    """A STAC 1.1 Collection for a profile's items; item links are relative to ``collections/<id>/``."""
    stac = stac or {}
    summaries: dict[str, Any] = {k: sorted(v, key=str) for k, v in summary.values.items() if v}
    summaries.update({k: {"minimum": lo, "maximum": hi} for k, (lo, hi) in summary.ranges.items()})
    collection: dict[str, Any] = {
        "type": "Collection",
        "stac_version": STAC_VERSION,
        "stac_extensions": [],
        "id": summary.id,
        "title": summary.id,
        "description": (description or f"Scenes ingested with the '{summary.id}' profile").strip(),
        "license": stac.get("license", "other"),
        **({"keywords": stac["keywords"]} if stac.get("keywords") else {}),
        **({"providers": stac["providers"]} if stac.get("providers") else {}),
        "extent": {
            "spatial": {"bbox": [list(summary.bbox) if summary.bbox else [-180.0, -90.0, 180.0, 90.0]]},
            "temporal": {"interval": [[summary.start, summary.end]]},
        },
        "summaries": summaries,
        "links": [
            {"rel": "root", "href": "../../catalog.json", "type": "application/json"},
            {"rel": "parent", "href": "../../catalog.json", "type": "application/json"},
            *({"rel": "item", "href": f"../../{h}", "type": "application/geo+json"} for h in summary.item_hrefs),
        ],
    }
    collection["stac_extensions"] = used_extensions(collection)
    return collection


def root_catalog_dict(collection_ids: Sequence[str]) -> dict[str, Any]:
    """The lake's root STAC Catalog, linking every non-empty collection."""
    return {
        "type": "Catalog",
        "stac_version": STAC_VERSION,
        "id": CATALOG_ID,
        "description": "cubelake lake: hyperspectral scenes and their analysis-ready products",
        "links": [
            {"rel": "root", "href": "./catalog.json", "type": "application/json"},
            *({"rel": "child", "href": f"./collections/{c}/collection.json", "type": "application/json"}
              for c in collection_ids),
        ],
    }
