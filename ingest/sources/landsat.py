"""Landsat Level-1 scenes: one GeoTIFF per band plus an MTL file (text or JSON).

The MTL is the scene: the bands it lists that exist next to it are stacked in band order.
It carries the calibration the profiles use as a worked real case:

* radiance ``L = ML × Q + AL`` (``RADIANCE_MULT/ADD_BAND_n``), W/(m² sr µm);
* TOA reflectance ``ρ = (MR × Q + AR) / sin(θ_sun)`` where ``REFLECTANCE_MULT/ADD_BAND_n`` exist
  (OLI), else ``ρ = π L d² / (ESUN × sin(θ_sun))`` with the TM ESUN table of Chander, Markham &
  Helder (2009), Remote Sens. Environ. 113, 893-903, Table 4. Both are linear in Q, so they are
  recorded as per-band gain/offset. Thermal bands have no reflectance (NaN coefficients).

The MTL and its bands may be objects (GDAL ``/vsis3/`` names): the MTL is then read by one bounded
ranged GET, a renamed band found by one listing of the MTL's prefix, and pixels by GDAL's range requests.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Collection, Iterable
from datetime import date
from pathlib import Path
from typing import Any

from cubelake.errors import SceneReadError

from ..report import Code, Issue, warning
from ._base import FileCalibration, display_name, folder_files, is_regular_file, read_bounded
from .gdal import GdalSource, open_gdal

__all__ = ["ESUN_TM", "MTL_MAX_BYTES", "band_file_among", "is_mtl", "mtl_band_files", "open_landsat", "parse_mtl"]

#: Landsat 5 TM exoatmospheric solar irradiance, W/(m² µm) (Chander et al. 2009, Table 4).
ESUN_TM: dict[int, float] = {1: 1983.0, 2: 1796.0, 3: 1536.0, 4: 1031.0, 5: 220.0, 7: 83.44}
#: Real MTL files are 8-30 KB; anything far larger is not one (and is not read whole).
MTL_MAX_BYTES = 1024 * 1024

_LINE = re.compile(r"^\s*([A-Z0-9_]+)\s*=\s*(.*?)\s*$")
_BAND_KEY = re.compile(r"FILE_NAME_BAND_(\d{1,2})")


def is_mtl(path: Path) -> bool:
    name = path.name.upper()
    return name.endswith(("_MTL.TXT", "_MTL.JSON"))


def _read_text(path: Path) -> str:
    raw = read_bounded(path, MTL_MAX_BYTES, "a Landsat MTL")
    return raw.replace(b"\x00", b"").decode("utf-8", errors="replace")


def _flatten_json(path: str, raw: str) -> dict[str, Any]:
    try:
        tree = json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as exc:
        why = "is nested too deeply" if isinstance(exc, RecursionError) else f"does not parse: {exc}"
        raise SceneReadError(f"{path}: MTL JSON {why}; re-download the MTL") from None
    flat: dict[str, Any] = {}
    stack: list[tuple[Any, int]] = [(tree, 0)]
    while stack:  # an explicit stack: a hostile file cannot exhaust the recursion limit
        node, depth = stack.pop()
        if not isinstance(node, dict):
            continue
        if depth > 8:
            raise SceneReadError(f"{path}: MTL JSON groups nest {depth} levels deep (real MTLs use 2-3); not an MTL")
        for k, v in node.items():
            if isinstance(v, dict):
                stack.append((v, depth + 1))
            else:
                flat[str(k)] = v
    return flat


def parse_mtl(path: Path) -> dict[str, Any]:
    """Flatten an MTL (ODL text, NUL padding tolerated, or the JSON form) into ``{KEY: value}``."""
    raw = _read_text(path)
    name = display_name(path)
    flat: dict[str, Any] = {}
    if path.suffix.lower() == ".json":
        flat = _flatten_json(name, raw)
    else:
        for line in raw.splitlines():
            m = _LINE.match(line)
            if not m or m.group(1) in ("GROUP", "END_GROUP"):
                continue
            value: Any = m.group(2).strip('"')
            if re.fullmatch(r"[-+]?\d*\.?\d+(?:[eE][-+]?\d+)?", value):
                value = float(value)
            flat[m.group(1)] = value
    if "SPACECRAFT_ID" not in flat:
        raise SceneReadError(f"{name}: no SPACECRAFT_ID; not a Landsat MTL file (or a truncated one)")
    return flat


def _number(mtl: dict[str, Any], key: str) -> float | None:
    """A finite number from the MTL, or ``None`` when the field is missing or not a number."""
    value = mtl.get(key)
    if isinstance(value, bool) or value is None:
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _earth_sun_distance(mtl: dict[str, Any]) -> float | None:
    d = _number(mtl, "EARTH_SUN_DISTANCE")
    if d is not None and 0.9 < d < 1.1:
        return d
    try:  # missing or out of its domain: it follows from the day of the year
        doy = date.fromisoformat(str(mtl.get("DATE_ACQUIRED", "")).strip()).timetuple().tm_yday
    except ValueError:
        return None
    # astronomical unit from day of year (Spencer-type approximation, <0.1% error)
    return 1.0 - 0.01672 * math.cos(math.radians(0.9856 * (doy - 4)))


def _plain_name(path: Path, key: str, value: Any) -> str:
    """A band file named by the MTL, confined to the MTL's folder (or prefix): a plain file name, nothing else."""
    name = str(value).strip()
    bad = (not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name
           or any(ord(c) < 32 for c in name))
    if bad:
        raise SceneReadError(
            f"{display_name(path)}: {key} = {name!r} is not a plain file name; an MTL may only name band files in "
            f"its own folder ({display_name(path.parent)}). Fix the MTL, or put the band file next to it under a "
            "plain name")
    return name


def band_file_among(name: str, siblings: Iterable[str]) -> str | None:
    """The file of the folder's ``siblings`` (names) that holds band file ``name``: itself, else the first
    (sorted) that ends with it, since copies are often renamed with a prefix (e.g. ``tiny_<name>``)."""
    names = set(siblings)
    if name in names:
        return name
    return min((n for n in names if n.endswith(name)), default=None)


def _band_file(folder: Path, name: str, siblings: Collection[str] | None) -> Path | None:
    if siblings is None:
        exact = folder / name
        if is_regular_file(exact):
            return exact
        siblings = [p.name for p in folder_files(folder)]
    found = band_file_among(name, siblings)
    return None if found is None else folder / found


def mtl_band_files(path: Path, mtl: dict[str, Any],
                   siblings: Collection[str] | None = None) -> tuple[list[tuple[int, Path]], list[int]]:
    """``(band number, file)`` for every numbered band of the MTL on disk, and the listed numbers that are not.

    ``siblings``: the names of the files next to the MTL when a listing already gave them; else they are
    looked up (one ``stat`` or HEAD per band, a listing of the folder only for a renamed band).
    Raises :class:`SceneReadError` when a listed name is not a plain file name in the MTL's folder.
    """
    found: list[tuple[int, Path]] = []
    missing: list[int] = []
    for key, value in mtl.items():
        m = _BAND_KEY.fullmatch(key)
        if m:
            f = _band_file(path.parent, _plain_name(path, key, value), siblings)
            if f is None:
                missing.append(int(m.group(1)))
            else:
                found.append((int(m.group(1)), f))
    return sorted(found), sorted(missing)


def _sun_elevation(mtl: dict[str, Any], name: str, issues: list[Issue]) -> float | None:
    """sin(sun elevation) for the reflectance correction, or ``None`` (with a warning) when unusable."""
    raw = mtl.get("SUN_ELEVATION")
    elev = _number(mtl, "SUN_ELEVATION")
    if elev is None or not 0 < elev <= 90:
        why = ("is missing (truncated MTL?)" if raw is None else
               f"= {raw!r} is not a number" if elev is None else
               f"= {elev:g}: the sun is at or below the horizon" if elev <= 0 else f"= {elev:g} is over 90 degrees")
        issues.append(warning(
            Code.CALIBRATION_SUSPECT,
            f"SUN_ELEVATION {why}; TOA reflectance cannot be computed (radiance still can). Re-download the MTL "
            "if it is damaged", where=f"{name}: SUN_ELEVATION"))
        return None
    return math.sin(math.radians(elev))


def _unusable(mtl: dict[str, Any], keys: list[str], name: str, what: str, issues: list[Issue]) -> None:
    """A warning naming each of ``keys`` that is missing or not a finite number (``what`` it is needed for)."""
    missing = [k for k in keys if k not in mtl]
    bad = [f"{k} = {mtl[k]!r}" for k in keys if k in mtl and _number(mtl, k) is None]
    if missing or bad:
        parts = ([f"{', '.join(missing)} missing"] if missing else []) + ([f"{', '.join(bad)} not a number"]
                                                                           if bad else [])
        issues.append(warning(Code.CALIBRATION_SUSPECT, f"{'; '.join(parts)}: {what}. Re-download the MTL if it is "
                                                        "damaged", where=f"{name}: {(missing or keys)[0]}"))


def _radiance(mtl: dict[str, Any], numbers: list[int], name: str,
              issues: list[Issue]) -> tuple[list[float], list[float]]:
    keys = [f"RADIANCE_{k}_BAND_{n}" for n in numbers for k in ("MULT", "ADD")]
    _unusable(mtl, keys, name, "no radiance (nor TOA reflectance derived from it) for those bands", issues)
    ml = [_number(mtl, f"RADIANCE_MULT_BAND_{n}") for n in numbers]
    al = [_number(mtl, f"RADIANCE_ADD_BAND_{n}") for n in numbers]
    bad = [f"B{n}" for n, m in zip(numbers, ml, strict=True) if m is not None and m <= 0]
    if bad:
        issues.append(warning(
            Code.CALIBRATION_SUSPECT,
            f"RADIANCE_MULT of band(s) {', '.join(bad)} is zero or negative: radiance and reflectance would be "
            "zero or negative; the MTL is probably damaged. Re-download it", where=f"{name}: RADIANCE_MULT"))
    return ([m if m is not None else math.nan for m in ml], [a if a is not None else math.nan for a in al])


def _reflectance(mtl: dict[str, Any], numbers: list[int], ml: list[float], al: list[float],
                 sin_sun: float | None, name: str, issues: list[Issue]) -> tuple[list[float], list[float]]:
    if sin_sun is None:
        return [math.nan] * len(numbers), [math.nan] * len(numbers)
    listed = [f"REFLECTANCE_{k}_BAND_{n}" for n in numbers for k in ("MULT", "ADD")
              if f"REFLECTANCE_MULT_BAND_{n}" in mtl or f"REFLECTANCE_ADD_BAND_{n}" in mtl]
    _unusable(mtl, listed, name, "no TOA reflectance for those bands", issues)
    rg: list[float] = []
    ro: list[float] = []
    d = _earth_sun_distance(mtl)
    tm = str(mtl.get("SENSOR_ID", "")).strip() == "TM"
    raw_d = mtl.get("EARTH_SUN_DISTANCE")
    if tm and d is not None and raw_d is not None and _number(mtl, "EARTH_SUN_DISTANCE") != d:
        issues.append(warning(
            Code.CALIBRATION_SUSPECT,
            f"EARTH_SUN_DISTANCE = {raw_d!r} is not a distance in AU (0.9-1.1); the reflectance uses {d:.5f} AU "
            "computed from DATE_ACQUIRED instead", where=f"{name}: EARTH_SUN_DISTANCE"))
    if tm and d is None:
        issues.append(warning(
            Code.CALIBRATION_SUSPECT,
            f"neither EARTH_SUN_DISTANCE (= {mtl.get('EARTH_SUN_DISTANCE')!r}, must be 0.9-1.1 AU) nor DATE_ACQUIRED "
            f"(= {mtl.get('DATE_ACQUIRED')!r}, must be a date) gives the Earth-Sun distance the TM reflectance "
            "needs; no TOA reflectance. Re-download the MTL if it is damaged", where=f"{name}: EARTH_SUN_DISTANCE"))
    for n, m_, a_ in zip(numbers, ml, al, strict=True):
        mr, ar = _number(mtl, f"REFLECTANCE_MULT_BAND_{n}"), _number(mtl, f"REFLECTANCE_ADD_BAND_{n}")
        if mr is not None and ar is not None:
            rg.append(mr / sin_sun)
            ro.append(ar / sin_sun)
        elif tm and n in ESUN_TM and d is not None:
            k = math.pi * d**2 / (ESUN_TM[n] * sin_sun)
            rg.append(k * m_)
            ro.append(k * a_)
        else:
            rg.append(math.nan)
            ro.append(math.nan)
    return rg, ro


def _bands_on_disk(path: Path, mtl: dict[str, Any], issues: list[Issue]) -> list[tuple[int, Path]]:
    bands, missing = mtl_band_files(path, mtl)
    name, folder = display_name(path), display_name(path.parent)
    if str(mtl.get("SPACECRAFT_ID", "")).strip() in ("LANDSAT_7", "LANDSAT_8", "LANDSAT_9"):
        # the panchromatic band 8 is on a 2x finer grid than the others; it is not part of the cube
        bands = [(n, f) for n, f in bands if n != 8]
        missing = [n for n in missing if n != 8]
    if not bands:
        raise SceneReadError(
            f"{name}: none of the band files the MTL lists (FILE_NAME_BAND_n) is in {folder}; "
            "put the band GeoTIFFs next to the MTL"
        )
    if missing:
        issues.append(warning(
            Code.BANDS_MISSING,
            f"band(s) {', '.join(f'B{n}' for n in missing)} listed in the MTL are not in {folder}; the scene "
            f"holds only {', '.join(f'B{n}' for n, _ in bands)}. Put the missing band files next to the MTL for a "
            "full scene", where=name))
    return bands


def _acquired(mtl: dict[str, Any]) -> str | None:
    day = str(mtl.get("DATE_ACQUIRED", "")).strip()
    try:
        date.fromisoformat(day)
    except ValueError:
        return None
    center = str(mtl.get("SCENE_CENTER_TIME", "")).strip('"').rstrip("Z")[:15]
    return f"{day}T{center}Z" if re.fullmatch(r"\d{2}:\d{2}:\d{2}(\.\d+)?", center) else day


def open_landsat(path: Path) -> GdalSource:
    """Open the bands of a Landsat MTL (a file or ``/vsis3/`` name) as one scene with its radiance/TOA-reflectance
    coefficients."""
    mtl = parse_mtl(path)
    name = display_name(path)
    issues: list[Issue] = []
    bands = _bands_on_disk(path, mtl, issues)
    src = open_gdal(path, band_files=[str(f) for _, f in bands])
    numbers = [n for n, _ in bands]
    ml, al = _radiance(mtl, numbers, name, issues)
    cals = [FileCalibration("radiance", tuple(ml), tuple(al), unit="W/(m2 sr um)", note="MTL RADIANCE_MULT/ADD")]
    rg, ro = _reflectance(mtl, numbers, ml, al, _sun_elevation(mtl, name, issues), name, issues)
    cals.append(
        FileCalibration(
            "toa_reflectance",
            tuple(rg),
            tuple(ro),
            unit="1",
            note="TOA reflectance with sun-elevation correction (REFLECTANCE_MULT/ADD, or TM ESUN, Chander et al. 2009)",
        )
    )
    acquired = _acquired(mtl)
    if acquired is None and "DATE_ACQUIRED" in mtl:
        issues.append(warning(Code.CALIBRATION_SUSPECT, f"DATE_ACQUIRED = {mtl['DATE_ACQUIRED']!r} is not a date "
                                                        "(YYYY-MM-DD): the acquisition time is unknown",
                              where=f"{name}: DATE_ACQUIRED"))
    infos = tuple(dataclasses.replace(b, name=f"B{n}") for b, n in zip(src.meta.bands, numbers, strict=True))
    tags = {
        k: str(v)
        for k, v in mtl.items()
        if k in ("SPACECRAFT_ID", "SENSOR_ID", "LANDSAT_SCENE_ID", "WRS_PATH", "WRS_ROW", "CLOUD_COVER",
                 "SUN_ELEVATION", "SUN_AZIMUTH", "EARTH_SUN_DISTANCE", "DATE_ACQUIRED", "DATA_TYPE")
    }
    meta = dataclasses.replace(
        src.meta,
        path=name,
        files=(str(path), *src.meta.files),
        format="Landsat-MTL",
        bands=infos,
        calibrations=tuple(cals),
        datetime=acquired,
        tags=tags,
        issues=(*src.meta.issues, *issues),
    )
    return src.with_meta(meta)
