"""STAC 1.1 Items from published scene records, and Collections from index summaries. No I/O.

An item lives next to its products (``scenes/<id>/item.json``), so its asset hrefs are
relative (``./<id>.tif``) and the scene folder moves as one piece. Links are relative too:
the lake's ``catalog.json`` is the root, ``collections/<profile>/collection.json`` the parent.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyproj import CRS
from shapely.geometry import shape

from . import geohash
from .coverage import merged_coverage
from .schema import (
    ASSET_MEDIA_TYPES,
    ASSET_ROLES,
    BANDS,
    CATALOG_ID,
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
    EO_CENTER,
    EO_CLOUD,
    EO_FWHM,
    EXT_VIEW,
    EXTENSIONS,
    FILE_CHECKSUM,
    FILE_SIZE,
    GEOHASH_PRECISION,
    PROJ_BBOX,
    PROJ_CODE,
    PROJ_SHAPE,
    PROJ_TRANSFORM,
    PROJ_WKT2,
    RASTER_OFFSET,
    RASTER_SCALE,
    STAC_VERSION,
    multihash_blake3,
    source_media_type,
)

__all__ = ["CollectionSummary", "collection_dict", "collection_id", "item_from_record", "root_catalog_dict"]

ITEM_FILE = "item.json"
_SAFE = re.compile(r"[^a-z0-9._-]+")


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


def _gsd(grid: dict[str, Any]) -> float | None:
    t, wkt = grid.get("transform"), grid.get("crs_wkt")
    if not t or not wkt:
        return None
    try:
        crs = CRS.from_wkt(wkt)
    except Exception:  # pyproj raises its own CRSError family; an odd WKT just means no gsd
        return None
    if crs.is_projected and crs.axis_info and crs.axis_info[0].unit_name in ("metre", "meter"):
        return round(math.hypot(t[0], t[3]), 6)
    return None


def _acquisition(record: dict[str, Any]) -> dict[str, Any]:
    acq = record.get("acquisition")
    if acq:
        return dict(acq)
    # records written before acquisition times were resolved: the metadata time, if any
    dt = record.get("datetime")
    if dt:
        from datetime import UTC, datetime

        v = datetime.fromisoformat(dt.replace("Z", "+00:00"))
        v = v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC)
        return {"datetime": v.isoformat().replace("+00:00", "Z"), "source": "metadata"}
    return {"datetime": None, "start_datetime": "1970-01-01T00:00:00Z",
            "end_datetime": _time(record.get("ingested_at", "1970-01-01T00:00:00Z").replace("+00:00", "Z")),
            "source": "unknown"}


def _bands(record: dict[str, Any]) -> list[dict[str, Any]]:
    enc = record.get("encoding", {})
    fill = enc.get("_FillValue")
    unit = (record.get("calibration") or {}).get("unit")
    height, width = record["grid"]["height"], record["grid"]["width"]
    out = []
    for b in record["bands"]:
        band: dict[str, Any] = {"name": b.get("name") or f"b{b['source_band']}"}
        if b.get("wavelength_nm") is not None:
            band[EO_CENTER] = round(b["wavelength_nm"] / 1000.0, 7)
        if b.get("fwhm_nm") is not None:
            band[EO_FWHM] = round(b["fwhm_nm"] / 1000.0, 7)
        if fill is not None:
            band["nodata"] = "nan" if fill == "NaN" else fill
        band["data_type"] = enc.get("dtype")
        if unit:
            band["unit"] = unit
        if "scale_factor" in enc:
            band[RASTER_SCALE] = enc["scale_factor"]
            band[RASTER_OFFSET] = enc.get("add_offset", 0.0)
        stats = {k2: b.get(k1) for k1, k2 in (("min", "minimum"), ("max", "maximum"), ("mean", "mean"), ("std", "stddev"))
                 if b.get(k1) is not None}
        if "count" in b and height * width:
            stats["valid_percent"] = round(100.0 * b["count"] / (height * width), 4)
        if stats:
            band["statistics"] = stats
        band["cubelake:source_band"] = b["source_band"]
        out.append(band)
    return out


def _asset(href: str, key: str, info: dict[str, Any], media_type: str) -> dict[str, Any]:
    a: dict[str, Any] = {"href": href, "type": media_type, "roles": ASSET_ROLES[key]}
    if info.get("bytes") is not None:
        a[FILE_SIZE] = info["bytes"]
    if info.get("blake3"):
        a[FILE_CHECKSUM] = multihash_blake3(info["blake3"])
    if info.get("tree_blake3"):
        a[CB_TREE_CHECKSUM] = multihash_blake3(info["tree_blake3"])
    return a


def _assets(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    src = record["source"]
    files = src.get("files", [])
    main = next((f for f in files if f.get("path") == src["path"]), files[0] if len(files) == 1 else None)
    source: dict[str, Any] = {
        "href": src["path"],
        "type": source_media_type(src.get("format", "")),
        "roles": ASSET_ROLES["source"],
        "title": f"source ({src.get('format')}, {len(files)} file{'s' if len(files) != 1 else ''}; "
                 "the item's bands describe the products, not the source)",
        "data_type": src.get("dtype"),
        "cubelake:band_count": (src.get("shape") or [None])[0],
    }
    if main is not None:
        source[FILE_SIZE] = main.get("size")
        if main.get("blake3"):
            source[FILE_CHECKSUM] = multihash_blake3(main["blake3"])
    source["cubelake:files"] = [
        {"href": f["path"], FILE_SIZE: f.get("size"), **({FILE_CHECKSUM: multihash_blake3(f["blake3"])} if f.get("blake3") else {})}
        for f in files
    ]
    assets = {"source": source}
    chunk = record["grid"]["chunk_shape"]
    for key, info in record.get("products", {}).items():
        href = f"./{info['path']}"
        if key == "refs":
            mt = ASSET_MEDIA_TYPES["refs_json" if info.get("format") == "json" else "refs_parquet"]
        else:
            mt = info.get("media_type") or ASSET_MEDIA_TYPES.get(key, "application/octet-stream")
        a = _asset(href, key, info, mt)
        a[CB_CHUNK_SHAPE] = chunk
        if key == "zarr":
            a["cubelake:array"] = info.get("array", "data")
        if key == "refs":
            a["cubelake:in_place"] = info.get("in_place")
            a["cubelake:refs_format"] = info.get("format")
            if info.get("reason_not_in_place"):
                a["cubelake:reason_not_in_place"] = info["reason_not_in_place"]
        assets[key] = a
    labels = record.get("labels")
    if labels and labels.get("cog"):
        assets["labels"] = {"href": f"./{labels['cog']}", "type": ASSET_MEDIA_TYPES["cog"], "roles": ASSET_ROLES["labels"],
                            "title": "per-pixel class labels", "cubelake:classes": labels.get("classes")}
        if labels.get("zarr_array"):
            assets["labels"]["cubelake:zarr_array"] = labels["zarr_array"]
    assets["scene"] = {"href": "./scene.json", "type": "application/json", "roles": ASSET_ROLES["scene"],
                       "title": "cubelake scene record"}
    assets["validation"] = {"href": "./validation.json", "type": "application/json", "roles": ASSET_ROLES["validation"],
                            "title": "validation report"}
    return assets


def item_from_record(record: dict[str, Any]) -> dict[str, Any]:
    """The STAC 1.1 Item of a published scene record (``scene.json``)."""
    sid = record["scene_id"]
    profile = record.get("profile", {})
    settings = profile.get("settings", {})
    stac = settings.get("stac", {}) or {}
    coll = collection_id(profile.get("name", "generic"))
    grid = record["grid"]
    acq = _acquisition(record)
    fp = record.get("footprint")
    geometry = fp["geometry"] if fp else None
    bbox = list(fp["bbox"]) if fp else None

    props: dict[str, Any] = {"datetime": _time(acq.get("datetime"))}
    if acq.get("start_datetime"):
        props["start_datetime"] = _time(acq["start_datetime"])
        props["end_datetime"] = _time(acq["end_datetime"])
    props[CB_DATETIME_SOURCE] = acq.get("source", "unknown")
    created = _time(record.get("ingested_at", "").replace("+00:00", "Z")) or None
    if created:
        props["created"] = props["updated"] = created
    for k in ("platform", "constellation"):
        if stac.get(k):
            props[k] = stac[k]
    if stac.get("instruments"):
        props["instruments"] = list(stac["instruments"])
    gsd = _gsd(grid)
    if gsd is not None:
        props["gsd"] = gsd
    props.update(stac.get("properties", {}))
    tags = record.get("tags") or {}
    for prop, tag in (stac.get("tag_properties") or {}).items():
        if tag in tags and str(tags[tag]).strip():
            value = _number_or_text(str(tags[tag]))
            if prop == EO_CLOUD and not (isinstance(value, int | float) and 0 <= value <= 100):
                continue  # Landsat writes -1 for "not computed"; the eo extension allows 0-100 only
            props[prop] = value

    epsg = grid.get("crs_epsg")
    props[PROJ_CODE] = f"EPSG:{epsg}" if epsg else None
    if not epsg and grid.get("crs_wkt"):
        props[PROJ_WKT2] = grid["crs_wkt"]
    props[PROJ_SHAPE] = [grid["height"], grid["width"]]
    if grid.get("transform"):
        props[PROJ_TRANSFORM] = list(grid["transform"][:6])
    if fp and fp.get("native_bbox"):
        props[PROJ_BBOX] = list(fp["native_bbox"])

    bands = _bands(record)
    props[BANDS] = bands
    merged = merged_coverage([b.get("wavelength_nm") for b in record["bands"]],
                             [b.get("fwhm_nm") for b in record["bands"]])
    props[CB_COVERAGE] = [[round(lo, 4), round(hi, 4)] for lo, hi in merged]
    props[CB_BAND_COUNT] = len(bands)
    hw = grid["height"] * grid["width"]
    counts = [b.get("count") for b in record["bands"] if b.get("count") is not None]
    if counts and hw:
        props[CB_QUALITY] = round(sum(counts) / (len(counts) * hw), 6)
    props[CB_PROFILE] = profile.get("name")
    props[CB_CHUNK_SHAPE] = grid["chunk_shape"]
    props[CB_CALIBRATION] = record.get("calibration")
    warnings = (record.get("validation") or {}).get("warnings", [])
    props[CB_VALIDATION] = {
        "status": "passed_with_warnings" if warnings else "passed",
        "warnings": [{"code": w.get("code"), "message": w.get("message")} for w in warnings],
    }
    props[CB_CONFIG_HASH] = record.get("config_hash")
    props[CB_CONTENT_HASH] = record.get("content_hash")
    props[CB_GEOHASH] = geohash.cover(shape(geometry), GEOHASH_PRECISION) if geometry else []

    extensions = list(EXTENSIONS) + ([EXT_VIEW] if any(k.startswith("view:") for k in props) else [])
    return {
        "type": "Feature",
        "stac_version": STAC_VERSION,
        "stac_extensions": extensions,
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
    return {
        "type": "Collection",
        "stac_version": STAC_VERSION,
        "stac_extensions": list(EXTENSIONS),
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
