"""A small CF-1.8 NetCDF research cube (the generic NetCDF/HDF5 reader's test input), written with netCDF4."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from pyproj import CRS

NetCDFFormat = Literal["NETCDF4", "NETCDF4_CLASSIC", "NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET", "NETCDF3_64BIT_DATA"]
WL_UM = np.round(np.linspace(0.45, 2.4, 10), 4)


def write_cf_cube(path: Path, fmt: NetCDFFormat = "NETCDF4") -> np.ndarray:
    """A CF-1.8 research cube: (time=1, wavelength, y, x) int16 with scale/offset, UTM grid mapping, wavelengths in
    um. Returns the stored DN as (band, y, x)."""
    import netCDF4

    rng = np.random.default_rng(3)
    dn = rng.integers(0, 10000, (10, 12, 15), dtype=np.int16)
    dn[:, 0, 0] = -32768
    with netCDF4.Dataset(path, "w", format=fmt) as nc:
        nc.Conventions = "CF-1.8"
        for name, n in (("time", 1), ("wavelength", 10), ("y", 12), ("x", 15)):
            nc.createDimension(name, n)
        t = nc.createVariable("time", "f8", ("time",))
        t.units, t.calendar, t[:] = "days since 2020-01-01 00:00:00", "standard", [100.5]
        wl = nc.createVariable("wavelength", "f4", ("wavelength",))
        wl.units, wl[:] = "um", WL_UM
        fw = nc.createVariable("fwhm", "f4", ("wavelength",))
        fw.units, fw[:] = "um", np.full(10, 0.2)
        y = nc.createVariable("y", "f8", ("y",))
        y.standard_name, y[:] = "projection_y_coordinate", 5800015.0 - 30.0 * np.arange(12)
        x = nc.createVariable("x", "f8", ("x",))
        x.standard_name, x[:] = "projection_x_coordinate", 300015.0 + 30.0 * np.arange(15)
        crs = nc.createVariable("crs", "i4")
        crs.setncatts(CRS.from_epsg(32633).to_cf())
        v = nc.createVariable("reflectance", "i2", ("time", "wavelength", "y", "x"), fill_value=-32768)
        v.scale_factor, v.add_offset, v.grid_mapping, v.units = 1e-4, 0.0, "crs", "1"
        v.set_auto_maskandscale(False)
        v[0] = dn
    return dn


