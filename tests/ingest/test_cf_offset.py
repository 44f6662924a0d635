"""A non-zero CF ``add_offset`` (radiance products have them): stored = round((value - add_offset) / scale_factor).

Checked by hand-computed stored integers, and end to end against independent CF decoders: xarray's
``decode_cf`` on the Zarr product and GDAL's band scale/offset on the COG must give back the physical
values of a float32 ingest of the same real scene, within half a storage step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
import xarray as xr

import cubelake
from cubelake.cube import CFEncoder
from cubelake.ingest import IngestOptions, Outcome, ingest
from cubelake.ingest.profile import Encoding, load_profile

ENMAP = "hsi_enmap_potsdam/enmap_potsdam_tile_96_0.tif"
SCALE, OFFSET = 2e-5, 0.4  # reflectance 0..1 -> about -20,000..30,000 in int16


def test_stored_integers_subtract_the_offset_before_scaling() -> None:
    enc = CFEncoder("int16", scale_factor=0.5, add_offset=100.0, fill_value=-32768)
    value = np.array([[[100.0, 101.0, 99.0, 50.0, np.nan, 120.25]]])
    stored, clipped = enc.encode(value)
    assert stored.tolist() == [[[0, 2, -2, -100, -32768, 40]]]
    assert clipped.tolist() == [0]
    back = enc.decode(stored)
    np.testing.assert_array_equal(back[0, 0, :4], [100.0, 101.0, 99.0, 50.0])
    assert np.isnan(back[0, 0, 4])
    assert back[0, 0, 5] == 120.0  # 40.5 rounds to even
    # values above the offset's reach clip at the top, not the bottom, of int16
    top, n = CFEncoder("int16", scale_factor=1.0, add_offset=-1000.0, fill_value=-32768).encode(np.array([[[32000.0]]]))
    assert top.tolist() == [[[32767]]]
    assert n.tolist() == [1]


@pytest.fixture(scope="module")
def lakes(real: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = load_profile("enmap-l2a")
    offset_profile = base.model_copy(update={"encoding": Encoding(dtype="int16", scale_factor=SCALE, add_offset=OFFSET)})
    float_profile = base.model_copy(update={"encoding": Encoding(dtype="float32")})
    root = tmp_path_factory.mktemp("cf_offset")
    out = []
    for name, prof in (("offset", offset_profile), ("float", float_profile)):
        (r,) = ingest([real / ENMAP], root / name, IngestOptions(products=("cog", "zarr", "refs"), workers=1,
                                                                   profile=prof))
        assert r.outcome is Outcome.INGESTED, r.message
        out.append(root / name / "scenes" / "enmap_potsdam_tile_96_0")
    return out[0], out[1]


def test_zarr_and_cog_decode_to_the_physical_values(lakes: tuple[Path, Path]) -> None:
    scaled, floats = lakes
    name = scaled.name
    truth = xr.open_zarr(floats / f"{name}.zarr")["data"].values.astype(np.float64)
    ok = np.isfinite(truth)
    assert ok.mean() > 0.9
    z = xr.open_zarr(scaled / f"{name}.zarr")
    assert z["data"].encoding["add_offset"] == OFFSET
    assert z["data"].encoding["scale_factor"] == SCALE
    cf = z["data"].values  # xarray's own CF decoding: stored * scale_factor + add_offset
    np.testing.assert_allclose(cf[ok], truth[ok], rtol=0, atol=SCALE / 2 + 1e-7)
    assert np.isnan(cf[~ok]).all()
    with rasterio.open(scaled / f"{name}.tif") as ds:
        assert set(ds.offsets) == {OFFSET}
        assert set(ds.scales) == {SCALE}
        stored = ds.read()
    gdal = stored * SCALE + OFFSET
    np.testing.assert_allclose(gdal[ok], truth[ok], rtol=0, atol=SCALE / 2 + 1e-7)
    assert (stored[ok] < 0).any()
    assert (stored[ok] > 0).any()
    for product in (f"{name}.zarr", f"{name}.refs.json"):
        ours = cubelake.open_dataset(scaled / product, chunks=None)["data"].values
        np.testing.assert_allclose(ours[ok], truth[ok], rtol=0, atol=SCALE / 2 + 1e-6)


def test_the_range_ends_are_data_and_only_beyond_them_is_clipped() -> None:
    """The lowest/highest storable value is data (not clipped, not counted); the fill value at an end of the
    type is left out of the range, so no value is ever stored as the fill."""
    enc = CFEncoder("uint16", fill_value=65535.0)
    assert enc.valid_range() == (0.0, 65534.0)
    stored, clipped = enc.encode(np.array([[[70000.0, 65534.0, 0.0, -5.0]]]))
    assert stored.tolist() == [[[65534, 65534, 0, 0]]]
    assert clipped.tolist() == [2]
    low = CFEncoder("int16", fill_value=-32768.0)
    assert low.valid_range() == (-32767.0, 32767.0)
    assert low.encode(np.array([[[-32767.0, 32767.0]]]))[1].tolist() == [0]
    top = float(np.finfo(np.float32).max)
    f32, n = CFEncoder("float32").encode(np.array([[[top, -top, 1e39, np.nan]]]))
    assert n.tolist() == [1]
    assert f32[0, 0, :3].tolist() == [top, -top, top]
    assert np.isnan(f32[0, 0, 3])


@pytest.mark.parametrize("enc", [CFEncoder("uint16", fill_value=0.0), CFEncoder("uint16", fill_value=65535.0),
                                 CFEncoder("float32", fill_value=float("nan")), CFEncoder("int16", 0.5, -2.0, -32768.0),
                                 CFEncoder("float32")])
def test_an_encoder_survives_its_json_record_and_decodes_only_the_fill_as_missing(enc: CFEncoder) -> None:
    import json
    import math

    back = CFEncoder.from_dict(json.loads(json.dumps(enc.to_dict())))  # as read back from scene.json
    assert (back.dtype, back.scale_factor, back.add_offset) == (enc.dtype, enc.scale_factor, enc.add_offset)
    if enc.fill_value is not None and math.isnan(enc.fill_value):
        assert back.fill_value is not None
        assert math.isnan(back.fill_value)
    else:
        assert back.fill_value == enc.fill_value
    stored = np.array([[[1, 2, 300]]], dtype=enc.dtype)
    if enc.fill_value is not None and not math.isnan(enc.fill_value):
        stored[0, 0, 1] = enc.fill_value
    got = back.decode(stored)
    want = stored.astype(np.float64) * enc.scale_factor + enc.add_offset
    if enc.fill_value is not None and not math.isnan(enc.fill_value):
        want[0, 0, 1] = np.nan
    np.testing.assert_array_equal(got, want)
