"""The Filter extension's queryables: the properties a CQL2 filter can name, as a JSON Schema. Pure."""

from __future__ import annotations

from typing import Any

from .cql import COVERS_WAVELENGTH

__all__ = ["queryables_schema"]

_BUILTIN: dict[str, dict[str, Any]] = {
    "id": {"description": "Item id", "type": "string"},
    "collection": {"description": "Collection id", "type": "string"},
    "geometry": {"description": "The scene footprint (WGS84)", "$ref": "https://geojson.org/schema/Geometry.json"},
    "datetime": {"description": "Acquisition time (the start of an interval)", "type": "string",
                 "format": "date-time"},
}


def _schema_of(types: set[str]) -> dict[str, Any]:
    kinds = sorted(t for t in types if t in ("string", "number", "boolean"))
    if not kinds:
        return {}
    return {"type": kinds[0]} if len(kinds) == 1 else {"type": kinds}


def queryables_schema(known: dict[str, set[str]], url: str) -> dict[str, Any]:
    """The JSON Schema of the queryables ``known`` (property -> JSON types seen by the index)."""
    props: dict[str, Any] = dict(_BUILTIN)
    for key in sorted(known):
        if key in ("datetime", "start_datetime", "end_datetime", "created", "updated"):
            props[key] = {"type": "string", "format": "date-time"}
        else:
            props[key] = {"description": key, **_schema_of(known[key])}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": url,
        "type": "object",
        "title": "Queryables of this cubelake catalog",
        "description": (f"Besides these properties, the function {COVERS_WAVELENGTH}(lo_nm, hi_nm) is true where "
                        "the item's kept bands (centre +- FWHM/2) cover every part of the range, e.g. "
                        f"{COVERS_WAVELENGTH}(450, 1300)."),
        "properties": props,
        "additionalProperties": False,
    }
