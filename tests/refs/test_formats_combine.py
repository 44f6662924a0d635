"""Parquet reference sets for large tile counts, and stacking scenes along time/scene."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.transform import from_origin

from cubelake.errors import GridMismatchError, RefsError
from cubelake.refs import (
    PARQUET_THRESHOLD,
    build_refs,
    load_refs,
    open_array,
    open_dataset,
    write_refs,
)
from cubelake.refs.combine import combine_refs
from tests.conftest import hsi_cube


@pytest.mark.slow
def test_parquet_refs_for_more_than_100k_chunks_open_like_json(tmp_path: Path) -> None:
    n = 20480  # 320 x 320 tiles of 64 pixels = 102,400 chunks
    src = tmp_path / "big.tif"
    img = (np.arange(n, dtype=np.uint32)[:, None] * 7 + np.arange(n, dtype=np.uint32)[None, :] * 3).astype(np.uint8)
    with rasterio.open(src, "w", driver="GTiff", width=n, height=n, count=1, dtype="uint8", crs="EPSG:32633",
                       transform=from_origin(0, n, 1, 1), tiled=True, blockxsize=64, blockysize=64,
                       compress="deflate", zlevel=1) as d:
        d.write(img, 1)
    refs = build_refs(str(src))
    assert refs.n_chunks == 102_400 >= PARQUET_THRESHOLD
    pq = write_refs(refs, tmp_path / "big.refs")  # auto: Parquet at this size
    assert pq.is_dir()
    assert (pq / ".zmetadata").is_file()
    assert any(pq.rglob("refs.*.parq"))
    js = write_refs(refs, tmp_path / "big.json", "json")
    assert load_refs(pq).format == "parquet"
    assert load_refs(js).format == "json"
    assert sum(f.stat().st_size for f in pq.rglob("*") if f.is_file()) < js.stat().st_size / 3
    for path in (pq, js):
        arr = open_array(path)
        assert arr.shape == (1, n, n)
        np.testing.assert_array_equal(arr[0, 5000:5100, 7000:7300], img[5000:5100, 7000:7300])
        np.testing.assert_array_equal(arr[0, -70:, -10:], img[-70:, -10:])
    ds = open_dataset(pq)
    assert ds["data"].shape == (1, n, n)


def _scene(tmp_path: Path, name: str, data: np.ndarray, when: str | None, **over) -> Path:
    profile = dict(driver="GTiff", width=data.shape[2], height=data.shape[1], count=data.shape[0], dtype=data.dtype.name,
                   crs="EPSG:32633", transform=from_origin(500000, 4000000, 30, 30), tiled=True, blockxsize=64,
                   blockysize=64, compress="zstd", predictor=2)
    profile.update(over)
    p = tmp_path / f"{name}.tif"
    with rasterio.open(p, "w", **profile) as d:
        d.write(data)
        for b in range(1, data.shape[0] + 1):
            d.update_tags(b, wavelength=str(400 + 10 * b), wavelength_units="nm")
        if when:
            d.update_tags(TIFFTAG_DATETIME=when)
    out = tmp_path / f"{name}.json"
    write_refs(build_refs(str(p)), out)
    return out


def test_scenes_on_one_grid_stack_along_time_in_time_order(tmp_path: Path) -> None:
    cubes = [hsi_cube(4, 100, 150, seed=s) for s in range(3)]
    paths = [_scene(tmp_path, f"s{i}", c, w) for i, (c, w) in
             enumerate(zip(cubes, ["2024:07:01 10:00:00", "2024:05:01 10:00:00", "2024:06:01 10:00:00"], strict=True))]
    stacked = combine_refs(paths)
    out = write_refs(stacked, tmp_path / "cube.json")
    ds = open_dataset(out)
    assert ds["data"].dims == ("time", "band", "y", "x")
    assert [str(t)[:10] for t in ds["time"].values] == ["2024-05-01", "2024-06-01", "2024-07-01"]
    assert list(ds["scene_id"].values) == ["s1", "s2", "s0"]
    for t, i in enumerate([1, 2, 0]):
        np.testing.assert_array_equal(ds["data"].isel(time=t).values, cubes[i])
    np.testing.assert_allclose(ds["wavelength"].values, [410, 420, 430, 440])
    assert len(json.loads(out.read_text())["templates"]) == 3


def test_stack_along_scene_when_times_are_missing(tmp_path: Path) -> None:
    cubes = [hsi_cube(2, 64, 64, seed=s) for s in range(2)]
    paths = [_scene(tmp_path, f"n{i}", c, None) for i, c in enumerate(cubes)]
    with pytest.raises(RefsError, match="no acquisition time"):
        combine_refs(paths)
    ds = open_dataset(write_refs(combine_refs(paths, dim="scene"), tmp_path / "c.json"))
    assert list(ds["scene"].values) == ["n0", "n1"]
    np.testing.assert_array_equal(ds["data"].values, np.stack(cubes))


@pytest.mark.parametrize(("over", "match"), [
    ({"crs": "EPSG:32634"}, "CRS differs"),
    ({"transform": from_origin(500000, 4000000, 20, 20)}, "resolution differs"),
    ({"transform": from_origin(500060, 4000000, 30, 30)}, r"alignment differs: origin offset by \(2, 0\) pixels"),
    ({"width": 128}, "size differs"),
    ({"blockxsize": 128, "blockysize": 128}, "chunk shape differs"),
    ({"compress": "deflate"}, "tile encoding"),
])
def test_scenes_on_different_grids_are_refused_naming_the_difference(tmp_path: Path, over: dict, match: str) -> None:
    a = _scene(tmp_path, "a", hsi_cube(3, 100, 150), "2024:05:01 00:00:00")
    width = over.get("width", 150)
    b = _scene(tmp_path, "b", hsi_cube(3, 100, width, seed=1), "2024:06:01 00:00:00", **over)
    with pytest.raises(GridMismatchError, match=match) as info:
        combine_refs([a, b])
    assert str(b) in str(info.value)


def test_band_mismatch_is_named(tmp_path: Path) -> None:
    a = _scene(tmp_path, "a", hsi_cube(3, 64, 64), "2024:05:01 00:00:00")
    b = _scene(tmp_path, "b", hsi_cube(4, 64, 64), "2024:06:01 00:00:00")
    with pytest.raises(GridMismatchError, match="band count differs"):
        combine_refs([a, b])
