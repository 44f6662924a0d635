"""ASI PRISMA L1 / L2B / L2C / L2D products (HDF5-EOS ``.he5``): VNIR and SWIR merged into one cube.

A PRISMA file keeps its hyperspectral cubes in ``HDFEOS/SWATHS/PRS_<level>_HCO/Data Fields/``:
``VNIR_Cube`` (66 bands) and ``SWIR_Cube`` (173 bands), uint16, band-interleaved by line
``(rows, bands, cols)``. Band centres, FWHM and validity flags are global attributes
(``List_Cw_Vnir``, ``List_Fwhm_Vnir``, ``List_Cw_Vnir_Flags``, and ``..._Swir``), in the cubes'
band order (which runs from long to short wavelengths); unused slots have centre 0.
Values: L1 radiance = DN / ``ScaleFactor_Vnir`` - ``Offset_Vnir`` (W m-2 sr-1 um-1); L2 values =
``L2ScaleVnirMin`` + DN x (``L2ScaleVnirMax`` - ``L2ScaleVnirMin``) / 65535 (and ``Swir``). They
become the file's per-band calibration (``prisma_scale``), applied by the ingest like any other.
L2D is geocoded: ``Epsg_Code`` and the UL/LR corner eastings/northings (pixel centres, as the
ASI's own tools and prismaread read them) give the map grid; L1, L2B and L2C are swaths and
get a pixel grid. Time: ``Product_StartTime``.

The merged cube is VNIR then SWIR, each in increasing wavelength, with the unused slots left out;
flagged bands stay, marked bad. VNIR ends above SWIR's start, so wavelengths step back once at the
seam: the profile's ``spectral.overlap`` policy decides which detector keeps that stretch.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from cubelake.errors import SceneReadError
from cubelake.grid import Window

from ..report import Code, Issue, warning
from ._base import BandInfo, FileCalibration, LockedSource, SceneMetadata, display_name
from .hdf import attr_floats, attr_text, dataset, iso_utc

__all__ = ["PRISMA_LEVELS", "open_prisma", "prisma_level"]

log = logging.getLogger(__name__)

PRISMA_LEVELS = ("L1", "L2B", "L2C", "L2D")
_PRODUCT = "PRISMA"
_DN_MAX = 65535.0


def prisma_level(h5: Any) -> str | None:
    """``"L1"``, ``"L2B"``, ``"L2C"`` or ``"L2D"`` when ``h5`` is a PRISMA hyperspectral product, else ``None``."""
    swaths = h5.get("HDFEOS/SWATHS")
    if swaths is None:
        return None
    for level in PRISMA_LEVELS:
        if f"PRS_{level}_HCO" in swaths:
            return level
    return None


@dataclass(frozen=True, slots=True)
class _Detector:
    """One spectrometer's cube and the bands of it that enter the merged cube (in increasing wavelength)."""

    name: str  # "Vnir" / "Swir"
    cube: Any
    index: np.ndarray  # positions in the cube's band axis
    wavelength: np.ndarray
    fwhm: np.ndarray
    good: np.ndarray
    gain: float
    offset: float


def _detector(h5: Any, path: str, level: str, name: str) -> _Detector:
    cube = dataset(h5, f"HDFEOS/SWATHS/PRS_{level}_HCO/Data Fields/{name.upper()}_Cube", path, product=_PRODUCT,
                   ndim=3)
    n = cube.shape[1]
    cw = np.asarray(attr_floats(h5, f"List_Cw_{name}", path, product=_PRODUCT, n=n))
    fw = np.asarray(attr_floats(h5, f"List_Fwhm_{name}", path, product=_PRODUCT, n=n))
    flags = attr_floats(h5, f"List_Cw_{name}_Flags", path, product=_PRODUCT, n=n, required=False)
    used = np.flatnonzero(cw > 0)
    if used.size == 0:
        raise SceneReadError(f"{display_name(path)}: List_Cw_{name} has no band with a centre wavelength; the "
                             "product is damaged")
    order = used[np.argsort(cw[used], kind="stable")]
    good = np.ones(n, dtype=bool) if flags is None else np.asarray(flags) != 0
    gain, offset = _scale(h5, path, level, name)
    return _Detector(name, cube, order, cw[order], fw[order], good[order], gain, offset)


def _scale(h5: Any, path: str, level: str, name: str) -> tuple[float, float]:
    """``value = gain × DN + offset`` for one detector."""
    if level == "L1":
        (sf,) = attr_floats(h5, f"ScaleFactor_{name}", path, product=f"{_PRODUCT} L1", n=1) or [0.0]
        (off,) = attr_floats(h5, f"Offset_{name}", path, product=f"{_PRODUCT} L1", n=1) or [0.0]
        if sf == 0 or not np.isfinite(sf):
            raise SceneReadError(f"{display_name(path)}: ScaleFactor_{name} is {sf}; radiance = DN / ScaleFactor - "
                                 "Offset needs a finite non-zero factor")
        return 1.0 / sf, -off
    (lo,) = attr_floats(h5, f"L2Scale{name}Min", path, product=f"{_PRODUCT} {level}", n=1) or [0.0]
    (hi,) = attr_floats(h5, f"L2Scale{name}Max", path, product=f"{_PRODUCT} {level}", n=1) or [0.0]
    return (hi - lo) / _DN_MAX, lo


def _grid(h5: Any, path: str, height: int, width: int) -> tuple[int, tuple[float, ...]]:
    """L2D's EPSG code and GDAL-order transform from the corner pixel centres."""
    product = f"{_PRODUCT} L2D"
    (epsg,) = attr_floats(h5, "Epsg_Code", path, product=product, n=1) or [0.0]
    ul_e, ul_n, lr_e, lr_n = (
        (attr_floats(h5, f"Product_{corner}corner_{axis}", path, product=product, n=1) or [0.0])[0]
        for corner, axis in (("UL", "easting"), ("UL", "northing"), ("LR", "easting"), ("LR", "northing")))
    dx = (lr_e - ul_e) / max(1, width - 1)
    dy = (lr_n - ul_n) / max(1, height - 1)
    if not (dx > 0 and dy < 0) or int(epsg) != epsg or epsg <= 0:
        raise SceneReadError(f"{display_name(path)}: Epsg_Code {epsg:g} with corners UL ({ul_e}, {ul_n}) LR ({lr_e}, "
                             f"{lr_n}) is not a north-up map grid; the L2D georeferencing is damaged")
    return int(epsg), (dx, 0.0, ul_e - dx / 2, 0.0, dy, ul_n - dy / 2)



def _bands(dets: list[_Detector]) -> tuple[BandInfo, ...]:
    out: list[BandInfo] = []
    for d in dets:
        for j in range(d.index.size):
            out.append(BandInfo(len(out) + 1, f"{d.name.upper()} {int(d.index[j]) + 1}", float(d.wavelength[j]),
                                float(d.fwhm[j]), not bool(d.good[j])))
    return tuple(out)


def _reader(dets: list[_Detector]) -> Any:
    def get(w: Window) -> np.ndarray:
        parts = []
        for d in dets:
            block = np.asarray(d.cube[w.row_off : w.row_end, :, w.col_off : w.col_end])  # (rows, bands, cols)
            parts.append(block[:, d.index, :].transpose(1, 0, 2))
        return np.concatenate(parts, axis=0)

    return get


def open_prisma(path: str | os.PathLike[str], h5: Any, level: str) -> LockedSource:
    """A PRISMA product's VNIR + SWIR cube (``h5`` is the open file; it is closed with the source)."""
    name = display_name(path)
    dets = [_detector(h5, str(path), level, d) for d in ("Vnir", "Swir")]
    shapes = {(d.cube.shape[0], d.cube.shape[2]) for d in dets}
    if len(shapes) != 1:
        raise SceneReadError(f"{name}: VNIR_Cube {dets[0].cube.shape} and SWIR_Cube {dets[1].cube.shape} are not on "
                             "one (rows, cols) grid; the product is damaged")
    ((height, width),) = shapes
    issues: list[Issue] = []
    crs_epsg, transform = None, None
    if level == "L2D":
        crs_epsg, transform = _grid(h5, str(path), height, width)
    else:
        issues.append(warning(Code.NOT_GEOREFERENCED,
                              f"PRISMA {level} cubes are swaths (geolocated by per-pixel latitude/longitude, not "
                              "a map grid); the product uses a pixel grid. Order L2D for a map grid"))
    gains = tuple(d.gain for d in dets for _ in range(d.index.size))
    offsets = tuple(d.offset for d in dets for _ in range(d.index.size))
    unit = "W m-2 sr-1 um-1" if level in ("L1", "L2B") else "1"
    tags = {"cubelake:product": f"prisma-{level.lower()}", "prisma:level": level,
            "prisma:detectors": f"VNIR {dets[0].index.size} + SWIR {dets[1].index.size} bands"}
    for key in ("Product_ID", "Product_StopTime", "Processor_Version", "Product_center_lat", "Product_center_long"):
        value = attr_text(h5, key, str(path), product=_PRODUCT, required=False)
        if value:
            tags[f"prisma:{key}"] = value[:200]
    chunks = dets[0].cube.chunks
    meta = SceneMetadata(
        path=str(path), files=(str(path),), format=f"PRISMA-{level}", count=len(gains), height=height, width=width,
        dtype=np.result_type(*(d.cube.dtype for d in dets)).name, crs_epsg=crs_epsg,
        crs_wkt=_wkt(crs_epsg, path), transform=transform,  # type: ignore[arg-type]
        bands=_bands(dets), block_shape=(chunks[0], chunks[2]) if chunks else (height, width), interleave="bil",
        datetime=iso_utc(attr_text(h5, "Product_StartTime", str(path), product=_PRODUCT, required=False),
                         "Product_StartTime"),
        tags=tags, calibrations=(FileCalibration("prisma_scale", gains, offsets, unit=unit,
                                                 note="L1: DN / ScaleFactor - Offset; L2: Min + DN (Max - Min) / 65535"),),
        georeferenced=transform is not None, issues=tuple(issues))
    return LockedSource(meta, _reader(dets), h5.close)


def _wkt(epsg: int | None, path: str | os.PathLike[str]) -> str | None:
    if epsg is None:
        return None
    from pyproj import CRS
    from pyproj.exceptions import CRSError

    try:
        return str(CRS.from_epsg(epsg).to_wkt())
    except CRSError as exc:
        raise SceneReadError(f"{path}: Epsg_Code {epsg} is not a CRS pyproj knows ({exc}); the product's "
                             "georeferencing is damaged: get a fresh copy from the provider") from exc
