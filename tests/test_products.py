"""cubelake.open_dataset: a scene's Zarr or references as float32 with wavelength loaded and indexed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import cubelake
from cubelake.errors import CubelakeError
from cubelake.ingest import IngestOptions, Outcome, ingest

ENMAP = "hsi_enmap_potsdam/enmap_potsdam_tile_96_0.tif"


@pytest.fixture(scope="module")
def scene(real: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    lake = tmp_path_factory.mktemp("products") / "lake"
    (r,) = ingest([real / ENMAP], lake, IngestOptions(products=("cog", "zarr", "refs"), workers=1))
    assert r.outcome is Outcome.INGESTED, r.message
    return lake / "scenes" / "enmap_potsdam_tile_96_0"


def test_scene_opens_as_float32_with_an_indexed_wavelength(scene: Path) -> None:
    import rioxarray  # noqa: F401

    ds = cubelake.open_dataset(scene)
    cube = ds["data"]
    assert cube.dtype == np.float32
    assert cube.dims == ("band", "y", "x")
    assert "wavelength" in ds.indexes  # a real index: no dask array behind it
    assert isinstance(ds["wavelength"].data, np.ndarray)
    nir = cube.sel(band=ds.band[(ds.wavelength > 800) & (ds.wavelength < 900)])
    by_index = ds.sel(wavelength=slice(800, 900))["data"]
    assert nir.shape == by_index.shape == (13, 32, 32)
    wl = ds["wavelength"].values
    assert ((wl[np.isin(ds.band.values, nir.band.values)] > 800) & (wl[np.isin(ds.band.values, nir.band.values)] < 900)).all()
    assert str(cube.rio.crs) == "EPSG:32633"
    plain = xr.open_zarr(scene / "enmap_potsdam_tile_96_0.zarr")["data"]  # float64 by xarray's CF rules
    assert plain.dtype == np.float64
    np.testing.assert_array_equal(cube.values, plain.values.astype(np.float32))


def test_refs_and_zarr_give_the_same_cube(scene: Path) -> None:
    z = cubelake.open_dataset(scene / "enmap_potsdam_tile_96_0.zarr", chunks=None)
    r = cubelake.open_dataset(scene / "enmap_potsdam_tile_96_0.refs.json", chunks=None)
    assert r["data"].dtype == np.float32
    np.testing.assert_array_equal(z["data"].values, r["data"].values)
    np.testing.assert_array_equal(z["wavelength"].values, r["wavelength"].values)
    assert list(cubelake.open_dataset(scene, prefer=("refs",)).data_vars) == list(r.data_vars)


def test_the_plain_xarray_route_of_the_readme(scene: Path) -> None:
    ds = xr.open_zarr(scene / "enmap_potsdam_tile_96_0.zarr")
    nir = ((ds.wavelength > 800) & (ds.wavelength < 900)).compute()
    out = ds["data"].sel(band=ds.band[nir]).astype("float32")
    assert out.shape == (13, 32, 32)
    assert out.dtype == np.float32


def test_what_is_not_a_product_is_named(tmp_path: Path) -> None:
    with pytest.raises(CubelakeError, match="not a lake scene folder"):
        cubelake.open_dataset(tmp_path)
