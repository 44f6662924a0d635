"""EMIT L1B/L2A granules: metadata from the product's own fields, GLT orthorectification, bad granules."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import rasterio

from cubelake.errors import SceneReadError
from cubelake.grid import Window
from cubelake.ingest import load_profile, match_profile
from cubelake.ingest.sources import SceneKind, discover, open_source
from cubelake.ingest.sources.emit import read_ortho
from cubelake.testing.emit import apply_glt, write_emit

from ..conftest import S3Server, no_traceback, run_cli

NAME = "EMIT_L2A_RFL_001_20230217T064052_2304804_005.nc"


def _open(path: Path):  # type: ignore[no-untyped-def]
    (inp,) = discover([path])
    return open_source(inp)


def test_l2a_metadata_comes_from_the_granule(tmp_path: Path) -> None:
    g = write_emit(tmp_path / NAME)
    src = _open(g.path)
    m = src.meta
    assert m.format == "EMIT-L2A"
    assert m.shape == (16, *g.glt_x.shape)  # the map grid, not the swath
    assert m.block_shape == g.glt_x.shape  # no native blocks on the map grid (not the swath's 16 x 30 chunks)
    np.testing.assert_allclose(m.wavelengths_nm, g.wavelengths, rtol=1e-6)
    np.testing.assert_allclose(m.fwhm_nm, g.fwhm, rtol=1e-6)
    assert g.good is not None
    assert [b.number for b in m.bands if b.flagged_bad] == [i + 1 for i in np.flatnonzero(g.good == 0)]
    assert m.crs_epsg == 4326
    gt = g.geotransform
    assert m.transform == (gt[1], gt[2], gt[0], gt[4], gt[5], gt[3])
    assert m.datetime == "2023-02-17T06:40:52Z"
    assert m.nodata == -9999.0
    assert m.tags["cubelake:product"] == "emit-l2a"
    assert m.tags["emit:swath_shape"] == "40x30"  # the swath-to-grid lineage travels with the record
    assert "glt_x" in m.tags["emit:orthorectification"]
    assert match_profile(m) == load_profile("emit-l2a")
    src.close()


def test_l1b_radiance_is_picked_by_content_not_name(tmp_path: Path) -> None:
    g = write_emit(tmp_path / "granule.nc", level="L1B")
    src = _open(g.path)
    assert src.meta.format == "EMIT-L1B"
    assert src.meta.tags["units"] == "uW/cm^2/SR/nm"
    assert not any(b.flagged_bad for b in src.meta.bands)  # L1B has no good_wavelengths
    assert match_profile(src.meta) == load_profile("emit-l1b")
    src.close()


@pytest.mark.parametrize("angle", [0.0, 25.0, 63.0])
def test_glt_orthorectification_equals_the_documented_procedure(tmp_path: Path, angle: float) -> None:
    g = write_emit(tmp_path / NAME, angle_deg=angle, seed=int(angle))
    ref = apply_glt(g.swath, g.glt_x, g.glt_y)  # whole arrays, the LP DAAC recipe
    src = _open(g.path)
    h, w = src.meta.height, src.meta.width
    np.testing.assert_array_equal(src.read(Window(0, 0, h, w)), ref)
    rng = np.random.default_rng(1)
    for _ in range(12):  # windows of every size and place, as the ingest's chunks cut the grid
        r, c = int(rng.integers(0, h)), int(rng.integers(0, w))
        win = Window(r, c, int(rng.integers(1, h - r + 1)), int(rng.integers(1, w - c + 1)))
        np.testing.assert_array_equal(src.read(win), ref[:, win.row_off:win.row_end, win.col_off:win.col_end])
    src.close()


def test_a_slab_over_budget_is_split_and_still_exact(tmp_path: Path) -> None:
    g = write_emit(tmp_path / NAME, angle_deg=40.0)
    ref = apply_glt(g.swath, g.glt_x, g.glt_y)
    with h5py.File(g.path) as h:
        cube, gx, gy = h["reflectance"], h["location/glt_x"], h["location/glt_y"]
        win = Window(0, 0, *g.glt_x.shape)
        one_px_budget = 16 * 4  # one swath pixel of all bands: every window splits down to what it sees
        np.testing.assert_array_equal(read_ortho(cube, gx, gy, win, -9999.0, NAME, budget=one_px_budget), ref)


def test_ingest_writes_the_orthorectified_cube(tmp_path: Path) -> None:
    g = write_emit(tmp_path / NAME)
    lake = tmp_path / "lake"
    res = run_cli("ingest", str(g.path), "--lake", str(lake), "--products", "cog,zarr")
    out = no_traceback(res)
    assert res.returncode == 0, out
    scene = lake / "scenes" / NAME.removesuffix(".nc")
    record = json.loads((scene / "scene.json").read_text())
    assert record["profile"]["name"] == "emit-l2a"
    assert record["tags"]["emit:swath_shape"] == "40x30"
    kept = [b["source_band"] for b in record["bands"]]
    assert g.good is not None
    assert not set(kept) & {int(i) + 1 for i in np.flatnonzero(g.good == 0)}
    ref = apply_glt(g.swath, g.glt_x, g.glt_y)[[k - 1 for k in kept]]
    ref[ref == -9999.0] = np.nan  # float products store missing pixels as NaN
    cog = next(scene.glob("*.tif"))
    with rasterio.open(cog) as ds:
        assert ds.crs.to_epsg() == 4326
        np.testing.assert_array_equal(ds.read(), ref)


@pytest.mark.parametrize(("drop", "piece"), [
    (("location",), "no group 'location'"),
    (("location/glt_x",), "no dataset 'location/glt_x'"),
    (("sensor_band_parameters",), "no group 'sensor_band_parameters'"),
    (("sensor_band_parameters/fwhm",), "no dataset 'sensor_band_parameters/fwhm'"),
    (("geotransform",), "attribute 'geotransform' missing"),
    (("spatial_ref",), "attribute 'spatial_ref' missing"),
])
def test_incomplete_granules_name_the_missing_piece(tmp_path: Path, drop: tuple[str, ...], piece: str) -> None:
    g = write_emit(tmp_path / NAME, drop=drop)
    with pytest.raises(SceneReadError, match=piece) as info:
        _open(g.path)
    assert NAME in str(info.value)


def test_a_glt_pointing_outside_the_swath_is_refused_at_read(tmp_path: Path) -> None:
    ok = write_emit(tmp_path / "ok.nc")
    gx, gy = ok.glt_x.copy(), ok.glt_y.copy()
    r, c = (int(v[0]) for v in np.nonzero((gx > 0) & (gy > 0)))
    gy[r, c] = 41  # the swath has 40 rows
    g = write_emit(tmp_path / NAME, glt_override=(gx, gy))
    src = _open(g.path)
    src.read(Window(r + 1, 0, 5, 5))  # windows that do not see the bad entry read
    with pytest.raises(SceneReadError, match=r"location/glt_y holds 41, outside the swath's 1\.\.40"):
        src.read(Window(r, c, 1, 1))
    src.close()


def test_truncated_granule_is_rejected_by_the_cli(tmp_path: Path) -> None:
    g = write_emit(tmp_path / NAME)
    data = g.path.read_bytes()
    g.path.write_bytes(data[: len(data) // 2])
    (inp,) = discover([g.path])
    assert inp.kind is SceneKind.GDAL  # told apart by content when opened
    with pytest.raises(SceneReadError, match="truncated or damaged"):
        open_source(inp)
    res = run_cli("ingest", str(g.path), "--lake", str(tmp_path / "lake"))
    out = no_traceback(res)
    assert res.returncode == 1
    assert NAME in out
    assert not list(tmp_path.glob("lake/scenes/*/scene.json"))  # nothing published


def test_a_granule_on_s3_is_read_in_place_and_equals_the_local_ingest(s3_server: S3Server, s3_bucket: str,
                                                                      tmp_path: Path) -> None:
    g = write_emit(tmp_path / NAME)
    s3_server.client().upload_file(str(g.path), s3_bucket, f"emit/{NAME}")
    env = s3_server.env(tmp_path)
    local, remote = tmp_path / "local", tmp_path / "remote"
    assert run_cli("ingest", str(g.path), "--lake", str(local), "--products", "zarr").returncode == 0
    res = run_cli("ingest", f"s3://{s3_bucket}/emit/", "--lake", str(remote), "--products", "zarr", env=env)
    out = no_traceback(res)
    assert res.returncode == 0, out
    sid = NAME.removesuffix(".nc")
    here = json.loads((local / "scenes" / sid / "scene.json").read_text())
    there = json.loads((remote / "scenes" / sid / "scene.json").read_text())
    assert there["source"]["path"] == f"s3://{s3_bucket}/emit/{NAME}"
    for part in ("bands", "grid", "acquisition", "tags", "profile"):
        assert there[part] == here[part], part
    import zarr

    a = zarr.open_group(str(local / "scenes" / sid / f"{sid}.zarr"), mode="r")
    b = zarr.open_group(str(remote / "scenes" / sid / f"{sid}.zarr"), mode="r")
    name = next(iter(a.array_keys()))
    np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]))


def test_an_oversized_attribute_is_refused_before_it_is_read(tmp_path: Path) -> None:
    g = write_emit(tmp_path / NAME)
    with h5py.File(g.path, "r+") as h:  # a hostile granule: a 'geotransform' of a million numbers
        del h.attrs["geotransform"]
        h.attrs.create("geotransform", np.zeros(1_000_000))
    with pytest.raises(SceneReadError, match=r"attribute 'geotransform' has 1000000 elements, far more than"):
        _open(g.path)
