"""The scenes a cube is built from: chosen by id or catalog search, checked to be one sensor, put on a time axis.

A :class:`CubeScene` is what the build needs of a published scene record: grid, bands, stored
encoding, acquisition time, the product it reads (the scene's Zarr, else its COG) and what
identifies the bytes read (so a changed scene rebuilds the cube).

Time axis: one slice per distinct acquisition time (the record's ``datetime``; a scene known only
by an interval, e.g. a date from its file name, by the interval's start), in time order. Scenes
acquired at the same instant (tiles of one acquisition) share one slice and are mosaicked there:
per value (band and pixel), the first scene in scene-id order that has one wins. A scene whose
acquisition time is unknown is refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cubelake.cube import CFEncoder
from cubelake.lake import AnyLake
from cubelake.record import SceneRecord
from cubelake.storage import join_url

from .errors import CubeSettingsError, DatacubeError, SensorMismatchError
from .grid import SceneExtent

__all__ = ["PRODUCT_ORDER", "CubeScene", "TimeSlice", "check_one_encoding", "check_one_quantity", "check_one_sensor", "load_scenes",
           "scene_from_record", "scene_time", "select_scene_ids", "sensor_differences", "time_slices"]

#: The products a build reads a scene from, in order of preference (both are read window by window).
PRODUCT_ORDER = ("zarr", "cog")
_MAX_LISTED = 8  # differing bands named in a sensor-mismatch message before "and N more"


@dataclass(frozen=True, slots=True)
class CubeScene:
    """A published scene as the build sees it (bands in stored order, times in UTC)."""

    scene_id: str
    time: datetime
    extent: SceneExtent
    band_numbers: tuple[int, ...]
    wavelengths_nm: tuple[float | None, ...]
    fwhm_nm: tuple[float | None, ...]
    band_names: tuple[str | None, ...]
    encoding: CFEncoder
    product: str  # "zarr" or "cog"
    product_url: str  # local path or s3:// URL of the product
    identity: tuple[tuple[str, str | None], ...]  # what identifies the bytes read (hashes, location)
    footprint: dict[str, Any] | None = None  # GeoJSON geometry, WGS84
    lonlat_bbox: tuple[float, float, float, float] | None = None
    unit: str | None = None
    profile: str | None = None

    @property
    def band_count(self) -> int:
        return len(self.band_numbers)


@dataclass(frozen=True, slots=True)
class TimeSlice:
    """One step of the time axis: its instant (UTC) and the scenes mosaicked into it, in priority order."""

    time: datetime
    scene_ids: tuple[str, ...]


def _utc(text: str) -> datetime:
    value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def scene_time(record: SceneRecord) -> datetime | None:
    """The instant a scene stands for on the time axis: its acquisition time, or the start of its interval."""
    acq = record.acquisition
    text = None
    if acq is not None and acq.source != "unknown":
        text = acq.datetime or acq.start_datetime
    elif acq is None:
        text = record.datetime  # records from before acquisition times were resolved
    try:
        return _utc(text) if text else None
    except ValueError:
        return None


def _encoding(record: SceneRecord) -> CFEncoder:
    enc = record.encoding
    fill = enc.fill_value
    fill_value = math.nan if fill == "NaN" else (float(fill) if fill is not None else None)
    return CFEncoder(str(enc.dtype or "float32"), float(enc.scale_factor if enc.scale_factor is not None else 1.0),
                     float(enc.add_offset if enc.add_offset is not None else 0.0), fill_value)


def _product(record: SceneRecord, location: str) -> tuple[str, str, str | None]:
    for kind in PRODUCT_ORDER:
        info = record.products.get(kind)
        if info is not None:
            return kind, join_url(location, info.path), info.blake3 or info.tree_blake3
    raise DatacubeError(f"scene {record.scene_id} has no {' or '.join(PRODUCT_ORDER)} product (it has "
                        f"{sorted(record.products)}); re-ingest it with --products cog,zarr")


def scene_from_record(record: SceneRecord, location: str) -> CubeScene:
    """The :class:`CubeScene` of a published record whose products are in the folder (or URL) ``location``."""
    sid, grid = record.scene_id, record.grid
    if not grid.crs_wkt or not grid.transform or len(grid.transform) < 6:
        raise DatacubeError(f"scene {sid} is not georeferenced (no CRS or geotransform in its record); only scenes "
                            "placed on the map can be reprojected into a cube")
    when = scene_time(record)
    if when is None:
        raise DatacubeError(f"scene {sid}: its acquisition time is unknown, so it has no place on the time axis; "
                            "re-ingest it with a profile whose time rule gives one (time.filename_pattern or "
                            "time.datetime), or leave it out")
    kind, url, checksum = _product(record, location)
    fp = record.footprint
    return CubeScene(
        scene_id=sid, time=when,
        extent=SceneExtent(grid.crs_wkt, tuple(float(v) for v in grid.transform[:6]), grid.height, grid.width),  # type: ignore[arg-type]
        band_numbers=tuple(b.source_band for b in record.bands),
        wavelengths_nm=tuple(None if b.wavelength_nm is None else float(b.wavelength_nm) for b in record.bands),
        fwhm_nm=tuple(None if b.fwhm_nm is None else float(b.fwhm_nm) for b in record.bands),
        band_names=tuple(b.name for b in record.bands),
        encoding=_encoding(record), product=kind, product_url=url,
        identity=(("content_hash", record.content_hash), ("config_hash", record.config_hash), ("product", kind),
                  ("checksum", checksum), ("location", url)),
        footprint=dict(fp.geometry) if fp is not None else None,
        lonlat_bbox=tuple(float(v) for v in fp.bbox[:4]) if fp is not None and len(fp.bbox) >= 4 else None,  # type: ignore[arg-type]
        unit=record.calibration.unit if record.calibration is not None else None,
        profile=record.profile.name,
    )


def select_scene_ids(lake: AnyLake, ids: Sequence[str], query: Any | None) -> list[str]:
    """The ids of the scenes to build from (:func:`cubelake.catalog.select.select_scene_ids`), its errors as the
    datacube's own: nothing chosen is a settings error, scenes not found a datacube error."""
    from cubelake.catalog.select import select_scene_ids as select
    from cubelake.errors import CatalogError, CatalogQueryError

    try:
        return select(lake, ids, query)
    except CatalogQueryError as exc:
        if query is None:
            raise CubeSettingsError(str(exc)) from None
        raise
    except CatalogError as exc:
        raise DatacubeError(str(exc)) from None


def load_scenes(lake: AnyLake, ids: Sequence[str]) -> list[CubeScene]:
    """The published scenes ``ids`` of ``lake``, ordered by time then id; raises naming any missing or unusable one."""
    scenes, missing = [], []
    for sid in ids:
        record = lake.scene_record(sid)
        location = lake.scene_location(sid) if record is not None else None
        if record is None or location is None:
            missing.append(sid)
            continue
        scenes.append(scene_from_record(record, location))
    if missing:
        raise DatacubeError(f"no published scene {', '.join(missing)} in the lake {lake.url}; list its scenes "
                            f"with 'cubelake lake --lake {lake.url}'")
    return sorted(scenes, key=lambda s: (s.time, s.scene_id))


def sensor_differences(ref: CubeScene, other: CubeScene, tolerance_nm: float) -> list[str]:
    """How ``other``'s bands differ from ``ref``'s (count, or centre wavelengths beyond ``tolerance_nm``)."""
    if other.band_count != ref.band_count:
        return [f"{other.band_count} bands, not {ref.band_count}"]
    far = []
    for i, (a, b) in enumerate(zip(ref.wavelengths_nm, other.wavelengths_nm, strict=True)):
        if (a is None) != (b is None):
            far.append(f"band {i + 1} has a centre wavelength in only one of them")
        elif a is not None and b is not None and abs(a - b) > tolerance_nm:
            far.append(f"band {i + 1} at {b:g} nm, not {a:g} nm")
    if len(far) > _MAX_LISTED:
        far = [*far[:_MAX_LISTED], f"and {len(far) - _MAX_LISTED} more band(s)"]
    return far


def check_one_sensor(scenes: Sequence[CubeScene], tolerance_nm: float) -> None:
    """Raise :class:`SensorMismatchError` naming every scene whose bands differ from the first scene's."""
    ref = scenes[0]
    problems = [f"{s.scene_id}: {'; '.join(d)}" for s in scenes[1:] if (d := sensor_differences(ref, s, tolerance_nm))]
    if problems:
        raise SensorMismatchError(
            f"the scenes are not from one sensor; compared with {ref.scene_id} ({ref.band_count} bands, profile "
            f"{ref.profile}), with centre wavelengths within {tolerance_nm:g} nm: " + " | ".join(problems)
            + ". Build one cube per sensor (choose its scenes by id or with --collection), or widen "
            "--wavelength-tolerance if these are one sensor's calibration differences")


def check_one_quantity(scenes: Sequence[CubeScene]) -> None:
    """Every scene's values must be in one unit (reflectance and radiance of one sensor do not mix)."""
    units = {s.unit for s in scenes}
    if len(units) > 1:
        listed = " | ".join(f"{s.scene_id}: {s.unit!r}" for s in scenes)
        raise DatacubeError(f"the scenes' values are in different units ({listed}); build one cube per calibrated "
                            "quantity")


def check_one_encoding(scenes: Sequence[CubeScene]) -> None:
    """For ``--dtype source``: every scene must store its values the same way (type, scale, offset, fill)."""
    ref = scenes[0]
    odd = [f"{s.scene_id}: {s.encoding.to_dict()}" for s in scenes[1:] if not _same_encoding(s.encoding, ref.encoding)]
    if odd:
        raise DatacubeError(f"--dtype source keeps the scenes' stored encoding, but they differ from {ref.scene_id} "
                            f"({ref.encoding.to_dict()}): " + " | ".join(odd) + "; use --dtype float32")


def _same_encoding(a: CFEncoder, b: CFEncoder) -> bool:
    fa, fb = a.fill_value, b.fill_value
    same_fill = fa == fb or (fa is not None and fb is not None and math.isnan(fa) and math.isnan(fb))
    return (a.dtype, a.scale_factor, a.add_offset) == (b.dtype, b.scale_factor, b.add_offset) and same_fill


def time_slices(scenes: Sequence[CubeScene]) -> list[TimeSlice]:
    """The time axis: one slice per distinct acquisition instant, in time order; scene ids sorted within a slice."""
    by_time: dict[datetime, list[str]] = {}
    for s in scenes:
        by_time.setdefault(s.time, []).append(s.scene_id)
    return [TimeSlice(t, tuple(sorted(ids))) for t, ids in sorted(by_time.items())]
