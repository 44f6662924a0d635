"""Small PRISMA products that follow the PRISMA product format, written with h5py.

Specification followed: ASI, *PRISMA Products Specification Document*, PRISMA-ASI-PS, issue 2.3
(2020), as read by public PRISMA readers (prismaread, the EnMAP-Box PRISMA import, HyperCoast):

* HDF5-EOS: ``HDFEOS INFORMATION/StructMetadata.0`` and the swath ``HDFEOS/SWATHS/PRS_<L>_HCO`` with
  ``Data Fields/VNIR_Cube`` and ``SWIR_Cube`` (uint16, band-interleaved by line: ``(rows, bands, cols)``,
  66 and 173 bands in real products) and ``Geolocation Fields/Latitude``/``Longitude`` (L2) or
  ``Latitude_VNIR``/``Longitude_VNIR`` (L1);
* global attributes ``List_Cw_Vnir``/``List_Fwhm_Vnir``/``List_Cw_Vnir_Flags`` (and ``Swir``), in the cube's
  band order, which runs from long to short wavelengths; unused slots have centre 0 and flag 0;
* L1: ``ScaleFactor_Vnir``/``Offset_Vnir`` (radiance = DN / ScaleFactor - Offset); L2: ``L2ScaleVnirMin``/
  ``L2ScaleVnirMax`` (value = Min + DN (Max - Min) / 65535), and ``Swir``;
* L2D: ``Epsg_Code``, ``Product_ULcorner_easting``/``_northing``, ``Product_LRcorner_easting``/``_northing``
  (UTM, pixel centres, 30 m); ``Product_StartTime``/``Product_StopTime``, ``Processing_Level``,
  ``Product_ID``.

Real products are 1000 x 1000 (L2D up to ~1200 x 1200) x 239 bands and need an ASI account; these
keep the layout and shrink the sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

N_VNIR_ZERO, N_SWIR_ZERO = 3, 2  # unused slots: first in VNIR, last in SWIR, as in real products


@dataclass(frozen=True)
class PrismaProduct:
    path: Path
    vnir: np.ndarray  # (rows, bands, cols) DN as written
    swir: np.ndarray
    cw_vnir: np.ndarray  # per slot, file order
    cw_swir: np.ndarray
    fwhm_vnir: np.ndarray
    fwhm_swir: np.ndarray
    flags_vnir: np.ndarray
    flags_swir: np.ndarray
    scale: dict[str, float]


def _slots(lo: float, hi: float, n: int, zeros: int, zeros_first: bool) -> np.ndarray:
    wl = np.linspace(hi, lo, n).astype(np.float32)  # long to short, as the cubes store them
    z = np.zeros(zeros, dtype=np.float32)
    return np.concatenate([z, wl] if zeros_first else [wl, z])


def write_prisma(path: Path, *, level: str = "L2D", rows: int = 20, cols: int = 24, n_vnir: int = 9,
                 n_swir: int = 14, seed: int = 0, drop: tuple[str, ...] = (), bad_vnir_slot: int = 5,
                 swir_shape: tuple[int, int, int] | None = None) -> PrismaProduct:
    """Write a PRISMA L1 / L2B / L2C / L2D product; ``drop`` leaves out named attributes or ``"SWIR_Cube"``."""
    import h5py

    rng = np.random.default_rng(seed)
    cw_v = _slots(402.4, 1010.0, n_vnir, N_VNIR_ZERO, True)
    cw_s = _slots(920.1, 2497.0, n_swir, N_SWIR_ZERO, False)
    # FWHM about the band spacing, as in real products (~10 nm at ~10 nm spacing)
    fw_v = np.where(cw_v > 0, 0.9 * (1010.0 - 402.4) / (n_vnir - 1), 0).astype(np.float32)
    fw_s = np.where(cw_s > 0, 0.9 * (2497.0 - 920.1) / (n_swir - 1), 0).astype(np.float32)
    fl_v, fl_s = (cw_v > 0).astype(np.int8), (cw_s > 0).astype(np.int8)
    fl_v[bad_vnir_slot] = 0  # a band the product flags as unusable
    vnir = rng.integers(1, 60000, (rows, cw_v.size, cols), dtype=np.uint16)
    swir = rng.integers(1, 60000, swir_shape or (rows, cw_s.size, cols), dtype=np.uint16)
    if level == "L2D":
        vnir[0, :, 0] = 0  # the geocoded frame's fill
        swir[0, :, 0] = 0
    scale = ({"ScaleFactor_Vnir": 100.0, "Offset_Vnir": 0.05, "ScaleFactor_Swir": 200.0, "Offset_Swir": 0.02}
             if level == "L1" else
             {"L2ScaleVnirMin": 0.0, "L2ScaleVnirMax": 0.82, "L2ScaleSwirMin": 0.001, "L2ScaleSwirMax": 0.65})
    attrs: dict[str, object] = {
        "Processing_Level": np.bytes_(level.removeprefix("L")), "Product_ID": np.bytes_(f"PRS_{level}_STD"),
        "Product_StartTime": np.bytes_("2020-06-13T10:23:41.123456"),
        "Product_StopTime": np.bytes_("2020-06-13T10:23:45.987654"), "Processor_Version": np.bytes_("3.9-3"),
        "Product_center_lat": 45.46, "Product_center_long": 9.19,
        "List_Cw_Vnir": cw_v, "List_Fwhm_Vnir": fw_v, "List_Cw_Vnir_Flags": fl_v,
        "List_Cw_Swir": cw_s, "List_Fwhm_Swir": fw_s, "List_Cw_Swir_Flags": fl_s,
        **{k: np.float32(v) for k, v in scale.items()},
    }
    if level == "L2D":
        attrs.update({"Epsg_Code": np.int32(32632), "Product_ULcorner_easting": 514185.0,
                      "Product_ULcorner_northing": 5036115.0,
                      "Product_LRcorner_easting": 514185.0 + 30.0 * (cols - 1),
                      "Product_LRcorner_northing": 5036115.0 - 30.0 * (rows - 1)})
    with h5py.File(path, "w") as h:
        for k, v in attrs.items():
            if k not in drop:
                h.attrs[k] = v
        h.create_dataset("HDFEOS INFORMATION/StructMetadata.0", data=np.bytes_("GROUP=SwathStructure\nEND\n"))
        swath = h.create_group(f"HDFEOS/SWATHS/PRS_{level}_HCO")
        data = swath.create_group("Data Fields")
        data.create_dataset("VNIR_Cube", data=vnir, chunks=(min(8, rows), vnir.shape[1], cols), compression="gzip")
        if "SWIR_Cube" not in drop:
            data.create_dataset("SWIR_Cube", data=swir, chunks=(min(8, swir.shape[0]), swir.shape[1], swir.shape[2]),
                                compression="gzip")
        geo = swath.create_group("Geolocation Fields")
        suffix = "_VNIR" if level == "L1" else ""
        geo.create_dataset(f"Latitude{suffix}", data=np.full((rows, cols), 45.46, dtype=np.float32))
        geo.create_dataset(f"Longitude{suffix}", data=np.full((rows, cols), 9.19, dtype=np.float32))
    return PrismaProduct(path, vnir, swir, cw_v, cw_s, fw_v, fw_s, fl_v, fl_s, scale)


def calibrated(p: PrismaProduct, level: str, detector: str, slot: int, dn: np.ndarray) -> np.ndarray:
    """The product's documented value formula for one band slot (float64), independent of the reader."""
    name = detector.capitalize()
    if level == "L1":
        return dn.astype(np.float64) / np.float32(p.scale[f"ScaleFactor_{name}"]) - np.float32(p.scale[f"Offset_{name}"])
    lo, hi = np.float32(p.scale[f"L2Scale{name}Min"]), np.float32(p.scale[f"L2Scale{name}Max"])
    return lo + dn.astype(np.float64) * (float(hi) - float(lo)) / 65535.0
