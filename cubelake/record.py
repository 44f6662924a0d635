"""The scene record (``scene.json``): a typed, versioned model of what a published scene is.

Every published scene folder holds one record: where the scene came from (files, hashes),
how it was built (profile, settings, calibration), what its cube is (grid, bands, encoding,
footprint, time) and which products it has. It is written by the ingest and read by the lake,
the catalog, the loaders and the CLI; all of them go through :class:`SceneRecord`, whose
:meth:`~SceneRecord.from_json` and :meth:`~SceneRecord.to_json` are the only reader and
writer of the format.

A record is untrusted input (a lake can be copied from anywhere): reading one never raises
anything but :class:`~cubelake.errors.CorruptRecordError` (naming the file and what is wrong)
or :class:`~cubelake.errors.RecordVersionError` (written by a newer cubelake). Keys this
version does not know are kept and written back unchanged, so a record passes through an
older or newer cubelake without losing data. Key names on disk are the format's; the JSON
written for a record is the same as before this model existed.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import CorruptRecordError, RecordVersionError

__all__ = [
    "AUX_NAME_RE",
    "AUX_RESERVED_NAMES",
    "MAX_RECORD_BYTES",
    "SCENE_RECORD_FILE",
    "SCENE_RECORD_VERSION",
    "Acquisition",
    "AuxCandidate",
    "AuxLayer",
    "Band",
    "BuildSettings",
    "Calibration",
    "Encoding",
    "Footprint",
    "Grid",
    "Labels",
    "ProductInfo",
    "ProfileInfo",
    "RecordIssue",
    "SceneRecord",
    "SourceFile",
    "SourceInfo",
    "Thumbnail",
    "ValidationSummary",
    "json_safe",
    "read_scene_record",
]

#: The record format this cubelake writes and the newest it reads.
SCENE_RECORD_VERSION = 1
#: The record's file name inside a scene folder.
SCENE_RECORD_FILE = "scene.json"
#: A record of thousands of bands is a few MB; anything far larger is not one.
MAX_RECORD_BYTES = 64 * 1024**2

#: A number kept as the record has it (an int stays an int, so the JSON written back is the same).
Number = int | float

_SAFE_ID = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
#: An aux layer's name (stored as ``aux_<name>``): lower-case letters, digits and ``_``.
AUX_NAME_RE = re.compile(r"[a-z0-9_]{1,32}")
#: Names an aux layer cannot take: the cube's own arrays.
AUX_RESERVED_NAMES = frozenset({"data", "labels"})


def json_safe(value: Any) -> Any:
    """``value`` with non-finite floats as ``None``, numpy scalars as Python ones and tuples as lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(x) for k, x in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(x) for x in value]
    if isinstance(value, np.generic):
        return json_safe(value.item())
    return value


def _relative_name(value: str | None, what: str) -> str | None:
    """A product file named relative to its scene folder: no absolute path, ``..`` or NUL."""
    if value is None:
        return None
    p = PurePosixPath(value)
    if not value or p.is_absolute() or ".." in p.parts or "\x00" in value or "\\" in value:
        raise ValueError(f"{what} {value!r} is not a name inside the scene folder")
    return value


class _Part(BaseModel):
    """A part of the record: immutable, keeps unknown keys, JSON-safe values."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _json_values(cls, data: Any) -> Any:
        return json_safe(data) if isinstance(data, dict) else data


class SourceFile(_Part):
    """One source file: absolute path, size (bytes), mtime (ns) and BLAKE3 (hex)."""

    path: str
    size: int | None = None
    mtime_ns: int | None = None
    blake3: str | None = None


class SourceInfo(_Part):
    """The input the scene was built from."""

    path: str
    format: str | None = None
    files: list[SourceFile] = Field(default_factory=list)
    content_hash: str | None = None
    shape: list[int] = Field(default_factory=list)  # (band, y, x) of the source
    dtype: str | None = None
    nodata: Number | None = None


class ProfileInfo(_Part):
    """The sensor profile the scene was ingested with (``settings``: its product-shaping settings)."""

    name: str | None = None
    origin: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    description: str | None = None  # not written by the ingest; read when present


class BuildSettings(_Part):
    """Everything that shapes the products (the config hash is taken over these)."""

    profile: dict[str, Any] = Field(default_factory=dict)
    products: list[str] = Field(default_factory=list)
    chunk: int | None = None
    shard: int | None = None
    zarr_codec: dict[str, Any] = Field(default_factory=dict)
    calibration: dict[str, Any] = Field(default_factory=dict)


class Grid(_Part):
    """The cube's grid: size (pixels), CRS, affine ``transform`` (GDAL order a..f) and chunking ``(band, y, x)``."""

    height: int
    width: int
    crs_wkt: str | None = None
    crs_epsg: int | None = None
    transform: list[Number] | None = None
    georeferenced: bool = False
    chunk_shape: list[int]
    shard_chunks: int | None = None


class Acquisition(_Part):
    """When the scene was acquired (ISO 8601, UTC), and where that came from."""

    datetime: str | None = None
    start_datetime: str | None = None
    end_datetime: str | None = None
    source: str = "unknown"


class Footprint(_Part):
    """The outline of the valid pixels: GeoJSON ``geometry`` and ``bbox`` (WGS84), ``native_bbox`` (grid CRS)."""

    geometry: dict[str, Any]
    bbox: list[Number]
    native_bbox: list[Number] | None = None
    cell_size: Number | None = None


class Band(_Part):
    """One stored band: its position, source band number (1-based), spectral position (nm) and statistics."""

    index: int | None = None
    source_band: int
    name: str | None = None
    wavelength_nm: Number | None = None
    fwhm_nm: Number | None = None
    count: int | None = None  # valid pixels
    min: Number | None = None
    max: Number | None = None
    mean: Number | None = None
    std: Number | None = None


class Encoding(_Part):
    """How values are stored: ``dtype``, CF ``scale_factor``/``add_offset`` and ``_FillValue`` ("NaN" for NaN)."""

    step: str = "cf_encode"
    dtype: str | None = None
    formula: str | None = None
    scale_factor: Number | None = None
    add_offset: Number | None = None
    fill_value: Number | str | None = Field(default=None, alias="_FillValue")


class Calibration(_Part):
    """The calibration applied (the reversible steps, each a dict as its coder writes it)."""

    source_dtype: str | None = None
    quantity: str | None = None
    unit: str | None = None
    steps: list[dict[str, Any]] = Field(default_factory=list)


class ProductInfo(_Part):
    """One product of the scene: file or folder ``path`` in the scene folder, size, media type, checksums.

    ``zarr``: ``array``; ``refs``: ``format`` (json/parquet), ``zarr_format``, ``chunks``, ``in_place``,
    ``target``, ``reason_not_in_place``; ``cog``: ``validator_warnings``.
    """

    path: str
    format: str | None = None
    array: str | None = None
    bytes: int | None = None
    media_type: str | None = None
    zarr_format: int | None = None
    chunks: int | None = None
    in_place: bool | None = None
    target: dict[str, Any] | None = None
    reason_not_in_place: str | None = None
    blake3: str | None = None
    tree_blake3: str | None = None
    validator_warnings: list[Any] | None = None

    @field_validator("path")
    @classmethod
    def _inside(cls, v: str) -> str:
        return str(_relative_name(v, "product path"))


class Labels(_Part):
    """The scene's per-pixel class labels: where they came from, their type and classes, where they are stored."""

    source: str | None = None
    dtype: str | None = None
    classes: list[int] | None = None
    zarr_array: str | None = None
    cog: str | None = None

    @field_validator("cog")
    @classmethod
    def _inside(cls, v: str | None) -> str | None:
        return _relative_name(v, "label raster")


class AuxCandidate(_Part):
    """A candidate raster of an aux layer that was passed over for this scene, and why (``code``: report code)."""

    path: str
    code: str | None = None
    reason: str | None = None


class AuxLayer(_Part):
    """An auxiliary raster warped onto the scene's grid.

    Stored as ``zarr_array`` (``aux_<name>``, dims ``(y, x)``, or ``(aux_<name>_band, y, x)`` when
    ``bands`` > 1, chunked like the cube) in the scene's Zarr and as the COG ``cog`` beside it.
    ``source``: the raster used; ``source_crs``: its CRS (WKT); ``time_delta_s``: its acquisition
    minus the scene's (s; 0 when they overlap, ``None`` when undated); ``valid_fraction``: share of
    the scene's pixels with a value; ``fill_value``: stored nodata ("NaN" for NaN); ``classes``: the
    values of a categorical layer.
    """

    name: str
    kind: str
    resampling: str
    source: str
    source_crs: str | None = None
    source_datetime: str | None = None
    time_delta_s: Number | None = None
    valid_fraction: Number | None = None
    dtype: str | None = None
    fill_value: Number | str | None = None
    bands: int = 1
    band_names: list[str] | None = None
    classes: list[Number] | None = None
    zarr_array: str | None = None
    cog: str | None = None
    candidates_rejected: list[AuxCandidate] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _aux_name(cls, v: str) -> str:
        if not AUX_NAME_RE.fullmatch(v) or v in AUX_RESERVED_NAMES:
            raise ValueError(f"{v!r} is not an aux layer name (1-32 of a-z, 0-9, _; not data or labels)")
        return v

    @field_validator("cog")
    @classmethod
    def _inside(cls, v: str | None) -> str | None:
        return _relative_name(v, "aux raster")


class Thumbnail(_Part):
    """The scene's preview image (``path``, PNG): its size (px), the stored bands shown (0-based ``bands``, in
    channel order R, G, B or one grey, and their ``wavelengths_nm``), how they were chosen (``mode``:
    true_colour, colour_infrared, false_colour or greyscale) and the STAC asset's ``title``/``description``."""

    path: str
    bytes: int | None = None
    blake3: str | None = None
    media_type: str = "image/png"
    height: int | None = None
    width: int | None = None
    mode: str | None = None
    bands: list[int] = Field(default_factory=list)
    wavelengths_nm: list[Number | None] = Field(default_factory=list)
    title: str | None = None
    description: str | None = None

    @field_validator("path")
    @classmethod
    def _inside(cls, v: str) -> str:
        return str(_relative_name(v, "thumbnail"))


class RecordIssue(_Part):
    """A validation issue as the report writes it."""

    severity: str | None = None
    code: str | None = None
    message: str | None = None
    bands: list[int] = Field(default_factory=list)
    where: str | None = None


class ValidationSummary(_Part):
    """The validation outcome kept in the record (the full report is ``validation.json``)."""

    ok: bool = True
    warnings: list[RecordIssue] = Field(default_factory=list)


class SceneRecord(_Part):
    """A published scene's record (``scene.json``); fields in the order they are written."""

    scene_id: str
    calibration: Calibration | None = None
    config_hash: str | None = None
    version: str | None = None  # the cubelake that wrote it
    content_hash: str | None = None
    format_version: int = SCENE_RECORD_VERSION
    ingested_at: str | None = None
    source: SourceInfo
    profile: ProfileInfo = Field(default_factory=ProfileInfo)
    settings: BuildSettings = Field(default_factory=BuildSettings)
    grid: Grid
    datetime: str | None = None  # the acquisition time as the metadata gives it
    acquisition: Acquisition | None = None  # the resolved time; records before it have only ``datetime``
    footprint: Footprint | None = None
    tags: dict[str, Any] = Field(default_factory=dict)
    bands: list[Band]
    encoding: Encoding = Field(default_factory=Encoding)
    products: dict[str, ProductInfo] = Field(default_factory=dict)
    labels: Labels | None = None
    aux: list[AuxLayer] = Field(default_factory=list)  # absent from records without aux layers
    thumbnail: Thumbnail | None = None  # absent from records written without one (before it existed, or turned off)
    validation: ValidationSummary = Field(default_factory=ValidationSummary)

    @field_validator("scene_id")
    @classmethod
    def _safe_id(cls, v: str) -> str:
        if len(v) > 255 or not _SAFE_ID.fullmatch(v) or ".." in v:
            raise ValueError(f"{v!r} is not a scene id (letters, digits, '.', '_', '-')")
        return v

    # -- reading and writing: the only place the format is parsed or produced --------------------
    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> Self:
        """The record in ``text`` (the content of ``where``, named in errors)."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:  # JSON, UTF-8 or nesting errors
            raise CorruptRecordError(f"{where}: not a JSON scene record ({_short(exc)}); "
                                     "re-ingest the scene to rewrite it") from None
        return cls.from_dict(data, where)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Self:
        """The record of a parsed ``scene.json`` (``where`` names it in errors)."""
        if not isinstance(data, Mapping):
            raise CorruptRecordError(f"{where}: a scene record is a JSON object, got {type(data).__name__}; "
                                     "re-ingest the scene to rewrite it")
        _check_version(data.get("format_version", SCENE_RECORD_VERSION), where)
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise CorruptRecordError(f"{where}: not a valid scene record: {_problems(exc)}; "
                                     "re-ingest the scene to rewrite it") from None
        except RecursionError:
            raise CorruptRecordError(f"{where}: not a valid scene record (nested too deeply); "
                                     "re-ingest the scene to rewrite it") from None

    def to_dict(self) -> dict[str, Any]:
        """The record as ``scene.json`` holds it: the keys that were set or read, unknown ones included."""
        return dict(json_safe(self.model_dump(mode="json", by_alias=True, exclude_unset=True)))

    def to_json(self) -> str:
        """The text of ``scene.json``."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    # -- conveniences for readers ------------------------------------------------------------------
    @property
    def band_count(self) -> int:
        return len(self.bands)

    def product(self, kind: str) -> ProductInfo | None:
        """The product ``kind`` (``cog``, ``zarr``, ``refs``), or ``None`` if the scene has none."""
        return self.products.get(kind)


def _check_version(version: Any, where: str) -> None:
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CorruptRecordError(f"{where}: format_version {_short(version)} is not a positive integer; "
                                 "re-ingest the scene to rewrite it")
    if version > SCENE_RECORD_VERSION:
        raise RecordVersionError(
            f"{where}: scene record format_version {version} is newer than this cubelake reads "
            f"({SCENE_RECORD_VERSION}); upgrade cubelake to read this lake")


def _short(value: object, limit: int = 120) -> str:
    text = repr(value) if not isinstance(value, BaseException) else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _problems(exc: ValidationError, limit: int = 3) -> str:
    """The first few problems of a validation error, each as ``field.path: message``."""
    errors = exc.errors(include_url=False, include_input=False)
    parts = [f"{'.'.join(str(p) for p in e['loc']) or '(record)'}: {e['msg']}" for e in errors[:limit]]
    more = f" (and {len(errors) - limit} more)" if len(errors) > limit else ""
    text = "; ".join(parts)
    return (text if len(text) <= 600 else text[:597] + "...") + more


def read_scene_record(path: str | os.PathLike[str]) -> SceneRecord:
    """The record in the local file ``path``.

    Raises ``FileNotFoundError`` when there is none (callers decide what absence means),
    :class:`CorruptRecordError` when it cannot be read or is not a record, and
    :class:`RecordVersionError` when a newer cubelake wrote it.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise
    except NotADirectoryError as exc:
        raise FileNotFoundError(str(exc)) from None
    except OSError as exc:  # no permission, an I/O error
        raise CorruptRecordError(f"{path}: cannot read the scene record ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read forever
        raise CorruptRecordError(f"{path}: not a regular file; a scene record is a JSON file")
    if st.st_size > MAX_RECORD_BYTES:
        raise CorruptRecordError(f"{path}: {st.st_size} bytes, more than a scene record can be "
                                 f"({MAX_RECORD_BYTES}); re-ingest the scene to rewrite it")
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_RECORD_BYTES + 1)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise CorruptRecordError(f"{path}: cannot read the scene record ({exc.strerror or exc})") from None
    return SceneRecord.from_json(text, str(path))
