"""Small EMIT granules that follow the EMIT product format, written with netCDF4 (the library JPL's
SDS writes them with).

Specification followed: *EMIT Data Product User Guide* (JPL, version 1.0, 2023) and the product
file layout of the LP DAAC collections EMITL1BRAD / EMITL2ARFL version 001, as read by the
LP DAAC's EMIT-Data-Resources ``emit_tools.py`` and GDAL's netCDF driver (``EMIT_ORTHORECTIFICATION``):

* dimensions ``downtrack``, ``crosstrack``, ``bands`` (root) and ``ortho_y``, ``ortho_x`` (group ``location``);
* root variable ``reflectance`` (L2A, units ``unitless``) or ``radiance`` (L1B, ``uW/cm^2/SR/nm``),
  float32 ``(downtrack, crosstrack, bands)``, ``_FillValue`` -9999;
* group ``sensor_band_parameters``: ``wavelengths`` and ``fwhm`` float32 ``(bands)`` in nm, and in L2A
  ``good_wavelengths`` uint8 ``(bands)`` (1 good, 0 bad);
* group ``location``: ``lat``, ``lon``, ``elev`` float64 ``(downtrack, crosstrack)`` and ``glt_x``, ``glt_y``
  int32 ``(ortho_y, ortho_x)``: 1-based crosstrack / downtrack swath index of each map pixel, 0 = none;
* global attributes ``geotransform`` (6 doubles, GDAL order, EPSG:4326), ``spatial_ref`` (WKT),
  ``time_coverage_start``/``_end`` (``YYYY-MM-DDTHH:MM:SS+0000``), ``title``, ``instrument`` ``EMIT``,
  ``platform`` ``ISS``, ``product_version``, ``flight_line`` and the CF/ACDD attributes.

Real granules are 1280 x 1242 x 285 (about 1.8 GB) and cannot be downloaded here; these keep the
layout and shrink the sizes. The swath is rotated on the map grid as the ISS track is, and the GLT
is the nearest swath pixel of every map pixel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WGS84_WKT = ('GEOGCS["WGS 84",DATUM["WGS_1984",SPHEROID["WGS 84",6378137,298.257223563,AUTHORITY["EPSG","7030"]],'
             'AUTHORITY["EPSG","6326"]],PRIMEM["Greenwich",0,AUTHORITY["EPSG","8901"]],UNIT["degree",'
             '0.0174532925199433,AUTHORITY["EPSG","9122"]],AXIS["Latitude",NORTH],AXIS["Longitude",EAST],'
             'AUTHORITY["EPSG","4326"]]')
RES_DEG = 0.000542232520256367  # EMIT's 60 m grid step


@dataclass(frozen=True)
class EmitGranule:
    path: Path
    swath: np.ndarray  # (downtrack, crosstrack, bands) as written
    glt_x: np.ndarray
    glt_y: np.ndarray
    wavelengths: np.ndarray
    fwhm: np.ndarray
    good: np.ndarray | None
    geotransform: tuple[float, ...]


def emit_wavelengths(n: int) -> tuple[np.ndarray, np.ndarray]:
    """EMIT's first ``n`` band centres: from 381.0 nm every ~7.41 nm (285 reach 2493 nm), FWHM ~8.5 nm."""
    wl = (381.0056 + 7.4097 * np.arange(n)).astype(np.float32)
    return wl, (8.5 + 0.002 * np.arange(n)).astype(np.float32)


def make_glt(n_down: int, n_cross: int, angle_deg: float = 25.0, pad: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """The GLT of a swath rotated by ``angle_deg`` on a north-up map grid: nearest swath pixel, 0 outside."""
    a = math.radians(angle_deg)
    corners = np.array([[0, 0], [0, n_cross], [n_down, 0], [n_down, n_cross]], dtype=float)  # (row, col)
    rot = np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
    mapped = corners @ rot.T
    lo = mapped.min(axis=0) - pad
    hi = mapped.max(axis=0) + pad
    h, w = (np.ceil(hi - lo)).astype(int)
    yy, xx = np.mgrid[0:h, 0:w]
    pts = np.stack([yy.ravel() + lo[0] + 0.5, xx.ravel() + lo[1] + 0.5], axis=1) @ rot  # inverse rotation
    row = np.floor(pts[:, 0]).astype(np.int64).reshape(h, w)
    col = np.floor(pts[:, 1]).astype(np.int64).reshape(h, w)
    inside = (row >= 0) & (row < n_down) & (col >= 0) & (col < n_cross)
    glt_y = np.where(inside, row + 1, 0).astype(np.int32)
    glt_x = np.where(inside, col + 1, 0).astype(np.int32)
    return glt_x, glt_y


def write_emit(path: Path, *, level: str = "L2A", n_down: int = 40, n_cross: int = 30, n_bands: int = 16,
               angle_deg: float = 25.0, seed: int = 0, drop: tuple[str, ...] = (),
               glt_override: tuple[np.ndarray, np.ndarray] | None = None, chunks: bool = True) -> EmitGranule:
    """Write an EMIT L1B RAD or L2A RFL granule; ``drop`` leaves out named pieces (``"location"``,
    ``"location/glt_x"``, ``"sensor_band_parameters"``, ``"sensor_band_parameters/fwhm"``, ``"geotransform"``,
    ``"spatial_ref"``, ``"cube"``) to make malformed variants."""
    import netCDF4

    rng = np.random.default_rng(seed)
    variable, units = ("reflectance", "unitless") if level == "L2A" else ("radiance", "uW/cm^2/SR/nm")
    if level == "L2A":
        swath = rng.uniform(0.0, 0.6, (n_down, n_cross, n_bands)).astype(np.float32)
    else:
        swath = rng.uniform(0.0, 25.0, (n_down, n_cross, n_bands)).astype(np.float32)
    swath[0, 0, :] = -9999.0  # a bad swath pixel, as the SDS flags them
    wl, fw = emit_wavelengths(n_bands)
    good = np.ones(n_bands, dtype=np.uint8)
    good[n_bands // 2 : n_bands // 2 + 2] = 0  # a water-vapour stretch
    glt_x, glt_y = glt_override if glt_override is not None else make_glt(n_down, n_cross, angle_deg)
    gt = (-118.3, RES_DEG, 0.0, 34.2, 0.0, -RES_DEG)
    with netCDF4.Dataset(path, "w", format="NETCDF4") as nc:
        _globals(nc, level, gt, drop)
        nc.createDimension("downtrack", n_down)
        nc.createDimension("crosstrack", n_cross)
        nc.createDimension("bands", n_bands)
        if "cube" not in drop:
            v = nc.createVariable(variable, "f4", ("downtrack", "crosstrack", "bands"), fill_value=-9999.0,
                                  zlib=chunks, chunksizes=(min(16, n_down), n_cross, n_bands) if chunks else None)
            v.long_name = "Surface Reflectance" if level == "L2A" else "Radiance Data"
            v.units = units
            v[:] = swath
        if "sensor_band_parameters" not in drop:
            _band_group(nc, wl, fw, good if level == "L2A" else None, drop)
        if "location" not in drop:
            _location_group(nc, glt_x, glt_y, gt, n_down, n_cross, drop)
    return EmitGranule(path, swath, glt_x, glt_y, wl, fw, good if level == "L2A" else None, gt)


def _globals(nc: object, level: str, gt: tuple[float, ...], drop: tuple[str, ...]) -> None:
    attrs: dict[str, object] = {
        "ncei_template_version": "NCEI_NetCDF_Swath_Template_v2.0",
        "summary": "The Earth Surface Mineral Dust Source Investigation (EMIT) ...",
        "keywords": "Imaging Spectroscopy, minerals, EMIT, dust, radiative forcing",
        "Conventions": "CF-1.63",
        "sensor": "EMIT (Earth Surface Mineral Dust Source Investigation)",
        "instrument": "EMIT",
        "platform": "ISS",
        "institution": "NASA Jet Propulsion Laboratory/California Institute of Technology",
        "license": "https://science.nasa.gov/earth-science/earth-science-data/data-information-policy/",
        "naming_authority": "LPDAAC",
        "date_created": "2023-02-18T04:12:10Z",
        "creator_name": "Jet Propulsion Laboratory/California Institute of Technology",
        "project": "Earth Surface Mineral Dust Source Investigation",
        "publisher_name": "NASA LPDAAC",
        "identifier_product_doi_authority": "https://doi.org",
        "flight_line": "emit20230217t064052_o04805_s000",
        "time_coverage_start": "2023-02-17T06:40:52+0000",
        "time_coverage_end": "2023-02-17T06:41:04+0000",
        "software_build_version": "010621",
        "product_version": "V001",
        "history": "PGE Run Command: {python /beegfs/store/emit/ops/repos/emit-sds-l2a/...}",
        "crosstrack_orientation": "as seen on ground",
        "easternmost_longitude": -118.25,
        "northernmost_latitude": 34.2,
        "westernmost_longitude": -118.3,
        "southernmost_latitude": 34.16,
        "spatialResolution": RES_DEG,
        "spatial_ref": WGS84_WKT,
        "geotransform": np.array(gt, dtype=np.float64),
        "day_night_flag": "Day",
        "title": ("EMIT L2A Estimated Surface Reflectance 60 m V001" if level == "L2A"
                  else "EMIT L1B At-Sensor Calibrated Radiance and Geolocation Data 60 m V001"),
    }
    if level == "L2A":
        attrs["identifier_product_doi"] = "10.5067/EMIT/EMITL2ARFL.001"
    else:
        attrs["identifier_product_doi"] = "10.5067/EMIT/EMITL1BRAD.001"
    for k, v in attrs.items():
        if k not in drop:
            nc.setncattr(k, v)  # type: ignore[attr-defined]


def _band_group(nc: object, wl: np.ndarray, fw: np.ndarray, good: np.ndarray | None, drop: tuple[str, ...]) -> None:
    g = nc.createGroup("sensor_band_parameters")  # type: ignore[attr-defined]
    for name, values, dtype, long_name in (("wavelengths", wl, "f4", "Wavelength Centers"),
                                           ("fwhm", fw, "f4", "Full Width at Half Max"),
                                           ("good_wavelengths", good, "u1", "Wavelengths where reflectance is "
                                            "useable: 1 = good data, 0 = bad data")):
        if values is None or f"sensor_band_parameters/{name}" in drop:
            continue
        v = g.createVariable(name, dtype, ("bands",))
        v.long_name = long_name
        if name != "good_wavelengths":
            v.units = "nm"
        v[:] = values


def _location_group(nc: object, glt_x: np.ndarray, glt_y: np.ndarray, gt: tuple[float, ...], n_down: int,
                    n_cross: int, drop: tuple[str, ...]) -> None:
    g = nc.createGroup("location")  # type: ignore[attr-defined]
    g.createDimension("ortho_y", glt_x.shape[0])
    g.createDimension("ortho_x", glt_x.shape[1])
    rows, cols = np.mgrid[0:n_down, 0:n_cross]
    for name, values in (("lat", 34.2 - rows * RES_DEG), ("lon", -118.3 + cols * RES_DEG),
                         ("elev", np.full((n_down, n_cross), 120.0))):
        v = g.createVariable(name, "f8", ("downtrack", "crosstrack"))
        v[:] = values
    for name, values, long_name in (("glt_x", glt_x, "GLT Sample Lookup"), ("glt_y", glt_y, "GLT Line Lookup")):
        if f"location/{name}" in drop:
            continue
        v = g.createVariable(name, "i4", ("ortho_y", "ortho_x"), fill_value=0)
        v.long_name = long_name
        v.units = "pixel location"
        v[:] = values


def apply_glt(swath: np.ndarray, glt_x: np.ndarray, glt_y: np.ndarray, fill: float = -9999.0) -> np.ndarray:
    """The documented EMIT procedure on whole arrays (EMIT-Data-Resources ``apply_glt``), as ``(band, y, x)``:
    an independent reference for the streaming reader."""
    out = np.full((*glt_x.shape, swath.shape[-1]), fill, dtype=swath.dtype)
    valid = (glt_x != 0) & (glt_y != 0)
    out[valid, :] = swath[glt_y[valid] - 1, glt_x[valid] - 1, :]
    return out.transpose(2, 0, 1)
