"""The field's loaders on items from the STAC API: odc-stac and stackstac build xarray cubes from
cubelake items (their ``proj:*`` fields, asset ``bands``, ``data_type`` and ``nodata``) whose values
equal the lake's COG and Zarr products, read over the API's own asset hrefs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pystac
import pytest
import rasterio
import xarray as xr
from pystac_client import Client

from cubelake.testing.lakes import api_server


@pytest.fixture(scope="module")
def api(real_lake: Path) -> Iterator[str]:
    with api_server(real_lake) as url:
        yield url


def _cog(item: pystac.Item) -> np.ndarray:
    with rasterio.open(item.assets["cog"].href) as src:
        return src.read()


def _zarr(real_lake: Path, item: pystac.Item) -> np.ndarray:
    href = item.assets["zarr"].href.split("/lake/", 1)[1]
    with xr.open_zarr(real_lake / href, consolidated=False, mask_and_scale=False) as ds:
        return ds["data"].values


def test_odc_stac_mosaics_the_enmap_tiles_to_the_products(api: str, real_lake: Path) -> None:
    import odc.stac

    items = list(Client.open(api).search(collections=["enmap-l2a"]).items())
    assert len(items) == 4
    n = len(items[0].assets["cog"].extra_fields["bands"])
    bands = [f"cog.{b}" for b in range(1, n + 1)]
    # the four adjacent 32x32 tiles, one acquisition: one 64x64 mosaic on their own grid
    ds = odc.stac.load(items, bands=bands, groupby="solar_day", chunks={})
    assert ds.sizes == {"time": 1, "y": 64, "x": 64}
    assert ds.odc.geobox.crs.epsg == 32633
    assert ds["cog.1"].dtype == np.int16
    assert ds["cog.1"].attrs["nodata"] == -32768
    cube = np.stack([ds[b].values[0] for b in bands])
    for item in items:
        t = item.properties["proj:transform"]
        assert ds.odc.geobox.resolution.x == t[0]
        col = round((t[2] - float(ds.x[0]) + t[0] / 2) / t[0])
        row = round((float(ds.y[0]) - t[5] - t[4] / 2) / -t[4])
        h, w = item.properties["proj:shape"]
        tile = cube[:, row:row + h, col:col + w]
        np.testing.assert_array_equal(tile, _cog(item))
        np.testing.assert_array_equal(tile, _zarr(real_lake, item))
    assert (cube != -32768).any()


def test_stackstac_stacks_single_band_products(api: str, real_lake: Path) -> None:
    """stackstac reads one band per asset (it refuses a multi-band COG, saying so): the Landsat scenes' products.

    stackstac 0.5 reads the CRS from ``proj:epsg`` (projection extension v1); cubelake writes v2's
    ``proj:code``, so ``epsg=`` is given, from ``proj:code``.
    """
    import stackstac

    items = list(Client.open(api).search(collections=["landsat8-oli"]).items())
    assert len(items) == 2
    for item in items:
        t, (h, w) = item.properties["proj:transform"], item.properties["proj:shape"]
        grid = (t[2], t[5] + t[4] * h, t[2] + t[0] * w, t[5])  # the product's grid (proj:bbox is the footprint's)
        da = stackstac.stack([item], assets=["cog"], epsg=int(item.properties["proj:code"].split(":")[1]),
                             resolution=(t[0], -t[4]), bounds=grid, snap_bounds=False,
                             dtype="int16", fill_value=np.int16(-32768), rescale=False)
        got = da.compute().values[0]
        np.testing.assert_array_equal(got, _cog(item))
        np.testing.assert_array_equal(got, _zarr(real_lake, item))
    enmap = next(iter(Client.open(api).search(collections=["enmap-l2a"], max_items=1).items()))
    with pytest.raises(RuntimeError, match="exactly 1 band"):
        stackstac.stack([enmap], assets=["cog"], epsg=32633).compute()
