"""Landsat Level-1 scenes: one GeoTIFF per band plus an MTL file (text or JSON).

The MTL is the scene: the bands it lists that exist next to it are stacked in band order.
It carries the calibration the profiles use as a worked real case:

* radiance ``L = ML × Q + AL`` (``RADIANCE_MULT/ADD_BAND_n``), W/(m² sr µm);
* TOA reflectance ``ρ = (MR × Q + AR) / sin(θ_sun)`` where ``REFLECTANCE_MULT/ADD_BAND_n`` exist
  (OLI), else ``ρ = π L d² / (ESUN × sin(θ_sun))`` with the TM ESUN table of Chander, Markham &
  Helder (2009), Remote Sens. Environ. 113, 893-903, Table 4. Both are linear in Q, so they are
  recorded as per-band gain/offset. Thermal bands have no reflectance (NaN coefficients).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from datetime import date
from pathlib import Path
from typing import Any

from cubelake.errors import SceneReadError

from ._base import FileCalibration
from .gdal import GdalSource, open_gdal

__all__ = ["ESUN_TM", "is_mtl", "open_landsat", "parse_mtl"]

#: Landsat 5 TM exoatmospheric solar irradiance, W/(m² µm) (Chander et al. 2009, Table 4).
ESUN_TM: dict[int, float] = {1: 1983.0, 2: 1796.0, 3: 1536.0, 4: 1031.0, 5: 220.0, 7: 83.44}

_LINE = re.compile(r"^\s*([A-Z0-9_]+)\s*=\s*(.*?)\s*$")


def is_mtl(path: Path) -> bool:
    name = path.name.upper()
    return name.endswith(("_MTL.TXT", "_MTL.JSON"))


def parse_mtl(path: Path) -> dict[str, Any]:
    """Flatten an MTL (ODL text, NUL padding tolerated, or the JSON form) into ``{KEY: value}``."""
    raw = path.read_bytes().replace(b"\x00", b"").decode("utf-8", errors="replace")
    flat: dict[str, Any] = {}
    if path.suffix.lower() == ".json":
        try:
            tree = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SceneReadError(f"{path}: MTL JSON does not parse: {exc}") from exc

        def walk(node: Any) -> None:
            if isinstance(node, dict):
                for k, v in node.items():
                    if isinstance(v, dict):
                        walk(v)
                    else:
                        flat[k] = v

        walk(tree)
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
        raise SceneReadError(f"{path}: no SPACECRAFT_ID; not a Landsat MTL file")
    return flat


def _earth_sun_distance(mtl: dict[str, Any]) -> float:
    if "EARTH_SUN_DISTANCE" in mtl:
        return float(mtl["EARTH_SUN_DISTANCE"])
    doy = date.fromisoformat(str(mtl["DATE_ACQUIRED"])).timetuple().tm_yday
    # astronomical unit from day of year (Spencer-type approximation, <0.1% error)
    return 1.0 - 0.01672 * math.cos(math.radians(0.9856 * (doy - 4)))


def _band_file(folder: Path, name: str) -> Path | None:
    exact = folder / name
    if exact.is_file():
        return exact
    # copies are often renamed with a prefix (e.g. "tiny_<name>")
    matches = sorted(p for p in folder.iterdir() if p.name.endswith(name) and p.is_file())
    return matches[0] if matches else None


def mtl_band_files(path: Path, mtl: dict[str, Any]) -> list[tuple[int, Path]]:
    """``(band number, file)`` for every numbered band of the MTL that exists on disk."""
    out = []
    for key, value in mtl.items():
        m = re.fullmatch(r"FILE_NAME_BAND_(\d+)", key)
        if m:
            f = _band_file(path.parent, str(value))
            if f is not None:
                out.append((int(m.group(1)), f))
    return sorted(out)


def open_landsat(path: Path) -> GdalSource:
    """Open the bands of a Landsat MTL as one scene with its radiance/TOA-reflectance coefficients."""
    mtl = parse_mtl(path)
    bands = mtl_band_files(path, mtl)
    if str(mtl.get("SPACECRAFT_ID", "")).strip() in ("LANDSAT_7", "LANDSAT_8", "LANDSAT_9"):
        # the panchromatic band 8 is on a 2x finer grid than the others; it is not part of the cube
        bands = [(n, f) for n, f in bands if n != 8]
    if not bands:
        raise SceneReadError(
            f"{path}: none of the band files the MTL lists (FILE_NAME_BAND_n) is in {path.parent}; "
            "put the band GeoTIFFs next to the MTL"
        )
    src = open_gdal(path, band_files=[str(f) for _, f in bands])
    numbers = [n for n, _ in bands]
    sun = math.radians(float(mtl["SUN_ELEVATION"]))
    ml = [float(mtl.get(f"RADIANCE_MULT_BAND_{n}", math.nan)) for n in numbers]
    al = [float(mtl.get(f"RADIANCE_ADD_BAND_{n}", math.nan)) for n in numbers]
    cals = [FileCalibration("radiance", tuple(ml), tuple(al), unit="W/(m2 sr um)", note="MTL RADIANCE_MULT/ADD")]
    rg: list[float] = []
    ro: list[float] = []
    d2 = _earth_sun_distance(mtl) ** 2
    for n, m_, a_ in zip(numbers, ml, al, strict=True):
        if f"REFLECTANCE_MULT_BAND_{n}" in mtl:
            rg.append(float(mtl[f"REFLECTANCE_MULT_BAND_{n}"]) / math.sin(sun))
            ro.append(float(mtl[f"REFLECTANCE_ADD_BAND_{n}"]) / math.sin(sun))
        elif str(mtl.get("SENSOR_ID", "")).strip() == "TM" and n in ESUN_TM:
            k = math.pi * d2 / (ESUN_TM[n] * math.sin(sun))
            rg.append(k * m_)
            ro.append(k * a_)
        else:
            rg.append(math.nan)
            ro.append(math.nan)
    cals.append(
        FileCalibration(
            "toa_reflectance",
            tuple(rg),
            tuple(ro),
            unit="1",
            note="TOA reflectance with sun-elevation correction (REFLECTANCE_MULT/ADD, or TM ESUN, Chander et al. 2009)",
        )
    )
    center = str(mtl.get("SCENE_CENTER_TIME", "")).strip('"').rstrip("Z")[:15]
    dt = f"{mtl['DATE_ACQUIRED']}T{center}Z" if center else str(mtl.get("DATE_ACQUIRED"))
    infos = tuple(dataclasses.replace(b, name=f"B{n}") for b, n in zip(src.meta.bands, numbers, strict=True))
    tags = {
        k: str(v)
        for k, v in mtl.items()
        if k in ("SPACECRAFT_ID", "SENSOR_ID", "LANDSAT_SCENE_ID", "WRS_PATH", "WRS_ROW", "CLOUD_COVER",
                 "SUN_ELEVATION", "SUN_AZIMUTH", "EARTH_SUN_DISTANCE", "DATE_ACQUIRED", "DATA_TYPE")
    }
    meta = dataclasses.replace(
        src.meta,
        path=str(path),
        files=(str(path), *src.meta.files),
        format="Landsat-MTL",
        bands=infos,
        calibrations=tuple(cals),
        datetime=dt,
        tags=tags,
    )
    return src.with_meta(meta)


