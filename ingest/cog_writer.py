"""Cloud-Optimized GeoTIFF product whose internal tiles are the lake's chunks.

Calibrated units are written into an uncompressed, tile-aligned staging GeoTIFF (a memcpy
per tile; no read-modify-write because every write is whole tiles), then GDAL's COG driver
compresses it in parallel into the product. GDAL's driver is used instead of rio-cogeo's
``cog_translate`` because ``cog_translate`` drops per-band metadata (the wavelength/FWHM band
tags), measured in FIELD_NOTES; rio-cogeo's ``cog_validate`` checks every product.
"""

from __future__ import annotations

import json
import math
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import rasterio
import rasterio.shutil
import rasterio.windows
from rasterio.crs import CRS
from rasterio.errors import NotGeoreferencedWarning
from rasterio.transform import Affine
from rio_cogeo.cogeo import cog_validate

from cubelake.errors import CubelakeError
from cubelake.grid import Window

from .calibrate import CFEncoder
from .spectral import parse_wavelength_text

__all__ = ["BandMeta", "CogSettings", "CogSink", "write_band_metadata"]


@dataclass(frozen=True, slots=True)
class CogSettings:
    chunk: int = 256
    compression: Literal["zstd", "deflate"] = "zstd"
    level: int | None = None
    overviews: bool = False
    threads: int = 2


@dataclass(frozen=True, slots=True)
class BandMeta:
    number: int  # 1-based source band number
    name: str | None
    wavelength_nm: float | None
    fwhm_nm: float | None


def write_band_metadata(ds: rasterio.io.DatasetWriter, bands: Sequence[BandMeta]) -> None:
    """Band descriptions and tags GDAL readers understand (ENVI-style and GDAL's IMAGERY domain)."""
    for i, b in enumerate(bands, start=1):
        named = b.name if b.name and len(b.name) <= 32 and parse_wavelength_text(b.name) is None else None
        label = named or f"band {b.number}"
        if b.wavelength_nm is not None:
            label = f"{label} ({b.wavelength_nm:.2f} nm)"
            tags: dict[str, Any] = {"wavelength": f"{b.wavelength_nm:.6g}", "wavelength_units": "Nanometers", "source_band": str(b.number)}
            imagery = {"CENTRAL_WAVELENGTH_UM": f"{b.wavelength_nm / 1000:.6g}"}
            if b.fwhm_nm is not None:
                tags["fwhm"] = f"{b.fwhm_nm:.6g}"
                imagery["FWHM_UM"] = f"{b.fwhm_nm / 1000:.6g}"
            ds.update_tags(i, **tags)
            ds.update_tags(i, ns="IMAGERY", **imagery)
        else:
            ds.update_tags(i, source_band=str(b.number))
        ds.set_band_description(i, label)


class CogSink:
    """Receives calibrated units into a staging GeoTIFF; :meth:`finish` writes and validates the COG."""

    def __init__(
        self,
        staging: Path,
        target: Path,
        *,
        shape: tuple[int, int, int],
        encoding: CFEncoder,
        transform: tuple[float, float, float, float, float, float] | None,
        crs_wkt: str | None,
        bands: Sequence[BandMeta],
        tags: dict[str, str],
        settings: CogSettings,
        unit: str | None = None,
    ) -> None:
        nb, ny, nx = shape
        self.staging = staging
        self.target = target
        self.settings = settings
        self._lock = threading.Lock()
        nodata = encoding.fill_value
        profile: dict[str, Any] = {
            "driver": "GTiff",
            "width": nx,
            "height": ny,
            "count": nb,
            "dtype": encoding.dtype,
            "tiled": True,
            "blockxsize": settings.chunk,
            "blockysize": settings.chunk,
            "interleave": "pixel",
            "compress": "none",
            "BIGTIFF": "IF_SAFER",
        }
        if nodata is not None:
            profile["nodata"] = nodata
        if crs_wkt is not None:
            profile["crs"] = CRS.from_wkt(crs_wkt)
        if transform is not None:
            a, b, c, d, e, f = transform
            profile["transform"] = Affine(a, b, c, d, e, f)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotGeoreferencedWarning)  # pixel-grid products are legitimate
            self._ds = rasterio.open(staging, "w", **profile)
        write_band_metadata(self._ds, bands)
        if encoding.is_scaled:
            self._ds.scales = [encoding.scale_factor] * nb
            self._ds.offsets = [encoding.add_offset] * nb
        if unit:
            self._ds.units = [unit] * nb
        self._ds.update_tags(**tags)

    def write(self, window: Window, data: np.ndarray) -> None:
        win = rasterio.windows.Window(window.col_off, window.row_off, window.width, window.height)
        with self._lock:
            self._ds.write(data, window=win)

    def finish(self) -> dict[str, Any]:
        """Compress the staging file into the COG, validate it, delete the staging file."""
        self._ds.close()
        s = self.settings
        opts: dict[str, Any] = {
            "BLOCKSIZE": s.chunk,
            "COMPRESS": s.compression.upper(),
            "PREDICTOR": "YES",  # 2 (horizontal differencing) for integers, 3 (floating point) for floats
            "BIGTIFF": "IF_SAFER",
            "NUM_THREADS": str(max(1, s.threads)),
            "OVERVIEWS": "AUTO" if s.overviews else "NONE",
            "STATISTICS": "NO",
        }
        if s.level is not None:
            opts["LEVEL"] = s.level
        # GDAL 3.10's COG driver writes multi-band images PIXEL-interleaved (all bands of a tile in one block)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotGeoreferencedWarning)
            rasterio.shutil.copy(str(self.staging), str(self.target), driver="COG", **opts)
        self.staging.unlink()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotGeoreferencedWarning)
            valid, errors, cog_warnings = cog_validate(str(self.target), quiet=True)
        if not valid:
            raise CubelakeError(f"{self.target}: the COG written fails rio-cogeo's validation: {errors}")
        return {"valid": valid, "warnings": cog_warnings}

    def abort(self) -> None:
        if not self._ds.closed:
            self._ds.close()


def dataset_tags(record: dict[str, Any]) -> dict[str, str]:
    """cubelake's record as GeoTIFF dataset tags (JSON values), readable with gdalinfo."""
    return {f"CUBELAKE_{k.upper()}": json.dumps(v, allow_nan=True) if not isinstance(v, str) else v for k, v in record.items()}


