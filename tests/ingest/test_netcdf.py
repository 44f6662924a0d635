"""Generic NetCDF/HDF5 cubes: variable, axes, wavelengths, CF grid mapping, scale/offset and time from the file."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import rasterio

from cubelake.errors import NoCubeError, SceneReadError
from cubelake.grid import Window
from cubelake.ingest.sources import SourceOptions, discover, open_source
from cubelake.testing.netcdf import WL_UM, write_cf_cube

from ..conftest import no_traceback, run_cli


def _open(path: Path, **options: str):  # type: ignore[no-untyped-def]
    (inp,) = discover([path])
    return open_source(inp, SourceOptions(**options))  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["NETCDF4", "NETCDF3_CLASSIC"])
def test_cf_cube_metadata_and_values(tmp_path: Path, fmt: str) -> None:
    dn = write_cf_cube(tmp_path / "cube.nc", fmt)
    src = _open(tmp_path / "cube.nc")
    m = src.meta
    assert m.format == ("NetCDF3" if fmt == "NETCDF3_CLASSIC" else "NetCDF4/HDF5")
    assert m.shape == (10, 12, 15)
    np.testing.assert_allclose(m.wavelengths_nm, WL_UM * 1000, rtol=1e-6)  # units attribute: um -> nm
    np.testing.assert_allclose(m.fwhm_nm, 200.0, rtol=1e-6)
    assert m.crs_epsg == 32633
    assert m.transform == (30.0, 0.0, 300000.0, 0.0, -30.0, 5800030.0)  # coordinates are pixel centres
    assert m.nodata == -32768
    (cal,) = m.calibrations
    assert (cal.name, cal.gains[0], cal.offsets[0]) == ("cf_scale_offset", pytest.approx(1e-4), 0.0)
    assert m.datetime == "2020-04-10T12:00:00Z"
    np.testing.assert_array_equal(src.read(Window(2, 3, 7, 9)), dn[:, 2:9, 3:12])
    src.close()


def test_south_up_lat_lon_cube_is_read_north_up(tmp_path: Path) -> None:
    import netCDF4

    data = np.arange(8 * 6 * 5, dtype=np.float32).reshape(8, 6, 5)  # (lat, lon, band), lat increasing
    with netCDF4.Dataset(tmp_path / "latlon.nc", "w") as nc:
        for name, n in (("lat", 8), ("lon", 6), ("band", 5)):
            nc.createDimension(name, n)
        nc.createVariable("lat", "f8", ("lat",))[:] = 40.0 + 0.01 * np.arange(8)
        nc.createVariable("lon", "f8", ("lon",))[:] = 10.0 + 0.01 * np.arange(6)
        wl = nc.createVariable("wavelengths", "f4", ("band",))
        wl.units, wl[:] = "nm", [450, 550, 650, 750, 850]
        nc.createVariable("radiance", "f4", ("lat", "lon", "band"))[:] = data
    src = _open(tmp_path / "latlon.nc")
    m = src.meta
    assert m.crs_epsg == 4326
    a, _, c, _, e, f = m.transform
    assert (a, e) == (pytest.approx(0.01), pytest.approx(-0.01))
    assert (c, f) == (pytest.approx(9.995), pytest.approx(40.075))
    assert m.wavelengths_nm == [450, 550, 650, 750, 850]
    # row 0 of the product is the northernmost: the file's last row
    np.testing.assert_array_equal(src.read(Window(0, 0, 8, 6)), data[::-1].transpose(2, 0, 1))
    src.close()


def test_plain_hdf5_cube_in_a_group_with_axes_and_wavelength_variable(tmp_path: Path) -> None:
    cube = np.random.default_rng(0).random((7, 9, 11)).astype(np.float32)  # (y, band, x): BIL
    with h5py.File(tmp_path / "lab.h5", "w") as h:
        g = h.create_group("scan")
        g["cube"] = cube
        g["centres"] = np.linspace(400, 1000, 9)
        g["other"] = np.zeros((3, 3, 3), dtype=np.float32)
    with pytest.raises(SceneReadError, match=r"cannot tell which of .* is the band axis; give --axes"):
        _open(tmp_path / "lab.h5", variable="scan/cube")
    src = _open(tmp_path / "lab.h5", variable="scan/cube", axes="ybx", wavelength_variable="centres")
    assert src.meta.shape == (9, 7, 11)
    assert src.meta.wavelengths_nm[-1] == pytest.approx(1000.0)
    assert not src.meta.georeferenced
    np.testing.assert_array_equal(src.read(Window(1, 2, 3, 4)), cube[1:4, :, 2:6].transpose(1, 0, 2))
    src.close()


def test_missing_variable_and_no_cube_are_clear(tmp_path: Path) -> None:
    write_cf_cube(tmp_path / "cube.nc")
    with pytest.raises(SceneReadError, match=r"cube\.nc: no variable 'refl'; the file has .*reflectance"):
        _open(tmp_path / "cube.nc", variable="refl")
    with h5py.File(tmp_path / "flat.h5", "w") as h:
        h["image"] = np.zeros((4, 5), dtype=np.float32)
    with pytest.raises(NoCubeError, match=r"flat\.h5: no 3-D numeric variable .*--variable"):
        _open(tmp_path / "flat.h5")


def test_cli_ingests_a_cf_cube_with_its_grid_and_scaling(tmp_path: Path) -> None:
    dn = write_cf_cube(tmp_path / "cube.nc")
    lake = tmp_path / "lake"
    res = run_cli("ingest", str(tmp_path / "cube.nc"), "--lake", str(lake), "--variable", "reflectance",
                  "--wavelength-variable", "wavelength", "--products", "cog")
    out = no_traceback(res)
    assert res.returncode == 0, out
    record = json.loads((lake / "scenes" / "cube" / "scene.json").read_text())
    assert record["datetime"] == "2020-04-10T12:00:00Z"
    with rasterio.open(lake / "scenes" / "cube" / "cube.tif") as ds:
        assert ds.crs.to_epsg() == 32633
        assert ds.transform.c == 300000.0
        b = ds.read(1, masked=True)
        expected = dn[0].astype(np.float64) * 1e-4
        np.testing.assert_allclose(b.filled(np.nan)[1:, 1:], expected[1:, 1:], rtol=1e-6)
        assert b.mask[0, 0]  # the _FillValue pixel
    bad = run_cli("ingest", str(tmp_path / "cube.nc"), "--lake", str(lake), "--variable", "nope")
    text = no_traceback(bad)
    assert bad.returncode == 1
    assert "no variable 'nope'" in text


@pytest.mark.parametrize(("fmt", "message"), [
    ("NETCDF4", r"cube\.nc: not a readable HDF5 file .*it is truncated or damaged"),
    ("NETCDF3_CLASSIC", r"cube\.nc: cannot open it as NetCDF/HDF5 .*damaged, truncated"),
])
def test_truncated_netcdf_is_refused_naming_the_file(tmp_path: Path, fmt: str, message: str) -> None:
    write_cf_cube(tmp_path / "cube.nc", fmt)
    data = (tmp_path / "cube.nc").read_bytes()
    (tmp_path / "cube.nc").write_bytes(data[: len(data) // 2])
    with pytest.raises(SceneReadError, match=message):
        _open(tmp_path / "cube.nc")
