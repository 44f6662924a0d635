"""Datacubes on a common grid (``cubelake cube build``): scenes in different UTM zones, CRSs and
resolutions reprojected into one Zarr v3 cube ``(time, band, y, x)``.

Every time step is compared with its scene warped alone, whole, onto the cube's grid by GDAL (the
same warper, kernel scale and exact transform): equal for nearest neighbour, equal within float
tolerance for bilinear; and with ``rasterio.warp.reproject`` (which approximates the transform to
1/8 pixel): nearly every pixel equal. Then: the derived grid, the mosaic of scenes of one
instant, refusals (other sensor, unknown time, missing scene) with exit 1 and nothing published,
reruns that do nothing, a changed scene that rebuilds, the cube in a fresh process (xarray, zarr,
rioxarray), the STAC item against the official schemas, memory far below the cube's size, an
``s3://`` lake (scenes read from their COGs over S3), and real EnMAP tiles warped to EPSG:3035.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
import xarray as xr
from pyproj import Transformer
from rasterio.crs import CRS
from rasterio.enums import Resampling
from rasterio.io import MemoryFile
from rasterio.transform import Affine, from_origin
from rasterio.vrt import WarpedVRT

from cubelake import open_dataset
from cubelake.catalog import Query
from cubelake.catalog.validate import stac_registry, validate_stac
from cubelake.datacube import CubeSettings, build_cube, open_cube, read_cube_item, search_cube_items
from cubelake.ingest import IngestOptions, ingest
from cubelake.lake import open_lake
from tests.conftest import REAL, S3Server, hsi_cube, no_traceback, run_cli

NB = 6
NODATA = -9999
TAGS = [{"wavelength": str(450 + 60 * i), "fwhm": "12", "wavelength_units": "nm"} for i in range(NB)]
OTHER_TAGS = [{"wavelength": str(500 + 100 * i), "fwhm": "20", "wavelength_units": "nm"} for i in range(4)]
SHARED_SCHEMAS = REAL.parent.parent / "schemas" / "stac-extensions"


@dataclass(frozen=True)
class Synth:
    name: str
    crs: str
    res: float
    shape: tuple[int, int]  # rows, cols
    center: tuple[float, float]  # lon, lat
    when: str | None
    seed: int
    tags: tuple[dict[str, str], ...] = tuple(TAGS)


#: a, b, c: one sensor in three CRSs and resolutions at three times; d: same instant as a, overlapping it;
#: x: another sensor; u: no acquisition time
SCENES = {
    "scene_a": Synth("scene_a", "EPSG:32632", 30.0, (70, 80), (11.98, 52.40), "2022-07-01T10:00:00Z", 1),
    "scene_b": Synth("scene_b", "EPSG:32633", 20.0, (100, 90), (12.02, 52.41), "2022-07-03T10:00:00Z", 2),
    "scene_c": Synth("scene_c", "EPSG:3035", 25.0, (80, 80), (12.00, 52.39), "2022-07-05T10:00:00Z", 3),
    "scene_d": Synth("scene_d", "EPSG:32632", 30.0, (60, 60), (11.99, 52.405), "2022-07-01T10:00:00Z", 4),
    "scene_x": Synth("scene_x", "EPSG:32632", 30.0, (40, 40), (11.98, 52.40), "2022-07-07T10:00:00Z", 5,
                     tuple(OTHER_TAGS)),
    "scene_u": Synth("scene_u", "EPSG:32632", 30.0, (40, 40), (11.98, 52.40), None, 6),
}


def center_xy(crs: str, lon: float, lat: float) -> tuple[float, float]:
    return Transformer.from_crs("EPSG:4326", crs, always_xy=True).transform(lon, lat)


def write_scene(folder: Path, s: Synth, data: np.ndarray | None = None) -> Path:
    """A GeoTIFF of ``s`` (int16, nodata in one corner, wavelength tags, acquisition time tag)."""
    rows, cols = s.shape
    cube = hsi_cube(len(s.tags), rows, cols, dtype="int16", seed=s.seed) if data is None else data
    cube[:, : rows // 5, : cols // 6] = NODATA
    cx, cy = center_xy(s.crs, *s.center)
    transform = from_origin(round(cx - cols * s.res / 2), round(cy + rows * s.res / 2), s.res, s.res)
    path = folder / f"{s.name}.tif"
    with rasterio.open(path, "w", driver="GTiff", width=cols, height=rows, count=len(s.tags), dtype="int16",
                       crs=s.crs, transform=transform, nodata=NODATA) as dst:
        dst.write(cube)
        if s.when:
            dst.update_tags(acquisition_time=s.when)
        for i, tags in enumerate(s.tags, start=1):
            dst.update_tags(i, **tags)
    return path


def ingest_scenes(lake: Path | str, folder: Path, names: list[str], products: tuple[str, ...] = ("cog", "zarr")) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [write_scene(folder, SCENES[n]) for n in names]
    res = ingest(paths, lake, IngestOptions(chunk=32, products=products))
    assert [r.outcome.value for r in res] == ["ingested"] * len(names), [r.message for r in res]


@pytest.fixture(scope="module")
def synth_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("datacube")
    ingest_scenes(root / "lake", root / "src", list(SCENES))
    return root / "lake"


def given_grid(res: float = 25.0, half: float = 1600.0) -> list[str]:
    """``--crs --resolution --bounds`` of a grid in UTM 32N around the scenes."""
    cx, cy = center_xy("EPSG:32632", 12.0, 52.40)
    x0, y0 = round((cx - half) / res) * res, round((cy - half) / res) * res
    return ["--crs", "EPSG:32632", "--resolution", str(res), "--bounds", str(x0), str(y0), str(x0 + 2 * half),
            str(y0 + 2 * half)]


def given_settings(**kw: Any) -> CubeSettings:
    """:func:`given_grid` as library settings."""
    g = given_grid()
    return CubeSettings(crs=g[1], resolution=float(g[3]), bounds=tuple(float(v) for v in g[5:9]), **kw)  # type: ignore[arg-type]


def cube_json(lake: Path | str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    res = run_cli("cube", "build", "--lake", str(lake), "--format", "json", *args, env=env)
    out = no_traceback(res)
    assert res.returncode == 0, out
    return dict(json.loads(res.stdout))


def whole_scene_warp(scene_dir: Path, cube: xr.Dataset, resampling: str, scale: list[float]) -> np.ndarray:
    """The scene, decoded and whole, warped onto the cube's grid by GDAL in one go (exact transform)."""
    values = open_dataset(scene_dir, chunks=None)["data"].values.astype(np.float32)
    record = json.loads((scene_dir / "scene.json").read_text())["grid"]
    with MemoryFile() as mem:
        with mem.open(driver="GTiff", width=values.shape[2], height=values.shape[1], count=values.shape[0],
                      dtype="float32", crs=CRS.from_wkt(record["crs_wkt"]), transform=Affine(*record["transform"][:6]),
                      nodata=np.nan) as dst:
            dst.write(values)
        with mem.open() as src, WarpedVRT(src, crs=CRS.from_wkt(cube.spatial_ref.attrs["crs_wkt"]),
                                          transform=Affine(*_grid_transform(cube)), width=cube.sizes["x"],
                                          height=cube.sizes["y"], resampling=Resampling[resampling], tolerance=1e-9,
                                          src_nodata=np.nan, nodata=np.nan, dtype="float32", XSCALE=scale[0],
                                          YSCALE=scale[1]) as vrt:
            return np.asarray(vrt.read())


def _grid_transform(cube: xr.Dataset) -> tuple[float, ...]:
    c, a, b, f, d, e = (float(v) for v in cube.spatial_ref.attrs["GeoTransform"].split())
    return a, b, c, d, e, f


def rasterio_reproject(scene_dir: Path, cube: xr.Dataset, resampling: str, scale: list[float]) -> np.ndarray:
    from rasterio.warp import reproject

    values = open_dataset(scene_dir, chunks=None)["data"].values.astype(np.float32)
    record = json.loads((scene_dir / "scene.json").read_text())["grid"]
    out = np.full((values.shape[0], cube.sizes["y"], cube.sizes["x"]), np.nan, np.float32)
    reproject(values, out, src_transform=Affine(*record["transform"][:6]), src_crs=CRS.from_wkt(record["crs_wkt"]),
              dst_transform=Affine(*_grid_transform(cube)), dst_crs=CRS.from_wkt(cube.spatial_ref.attrs["crs_wkt"]),
              resampling=Resampling[resampling], src_nodata=np.nan, dst_nodata=np.nan, XSCALE=scale[0],
              YSCALE=scale[1])
    return out


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(a, b, equal_nan=True))


# -- values ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def abc(synth_lake: Path) -> dict[str, Any]:
    """Three scenes (UTM 32N 30 m, UTM 33N 20 m, LAEA Europe 25 m) onto a given UTM 32N 25 m grid, nearest."""
    return cube_json(synth_lake, "abc", "scene_a", "scene_b", "scene_c", *given_grid(), "--chunk", "32")


@pytest.mark.parametrize("resampling", ["nearest", "bilinear"])
def test_each_time_step_equals_its_scene_warped_alone(synth_lake: Path, resampling: str,
                                                      request: pytest.FixtureRequest) -> None:
    out = request.getfixturevalue("abc") if resampling == "nearest" else cube_json(
        synth_lake, "abc-bilinear", "scene_a", "scene_b", "scene_c", *given_grid(), "--resampling", resampling,
        "--chunk", "32")
    assert out["status"] == "built"
    assert out["shape"] == [3, NB, 128, 128]
    assert out["times"] == ["2022-07-01T10:00:00Z", "2022-07-03T10:00:00Z", "2022-07-05T10:00:00Z"]
    cube = xr.open_dataset(out["zarr"], engine="zarr")
    assert cube["data"].dims == ("time", "band", "y", "x")
    scales = cube.attrs["cubelake:warp_scale"]
    for t, sid in enumerate(["scene_a", "scene_b", "scene_c"]):
        got = cube["data"].isel(time=t).values
        expected = whole_scene_warp(synth_lake / "scenes" / sid, cube, resampling, scales[sid])
        assert np.isfinite(expected).mean() > 0.1, sid  # the scene covers part of the grid
        assert same(np.isnan(got), np.isnan(expected)), sid
        if resampling == "nearest":
            assert same(got, expected), sid
        else:
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7, err_msg=sid)
        # rasterio's reproject approximates the transform to 1/8 pixel: nearly every pixel agrees
        approx = rasterio_reproject(synth_lake / "scenes" / sid, cube, resampling, scales[sid])
        both = np.isfinite(got) & np.isfinite(approx)
        assert both.sum() > 0.95 * np.isfinite(got).sum(), sid
        if resampling == "nearest":  # a few picks differ where the approximation crosses a pixel edge
            assert (got[both] == approx[both]).mean() > 0.99, sid
        else:  # values differ by the 1/8-pixel error of the approximation: < 1e-4 of the value range
            span = float(np.nanmax(got) - np.nanmin(got))
            assert np.abs(got[both] - approx[both]).max() < 1e-4 * span, sid


def test_scenes_of_one_instant_are_mosaicked_first_valid_by_scene_id(synth_lake: Path) -> None:
    out = build_cube(synth_lake, "ad", ["scene_d", "scene_a"], settings=given_settings(chunk=32))
    assert out.times == ("2022-07-01T10:00:00Z",)
    assert out.shape[0] == 1
    cube = xr.open_dataset(out.zarr_url, engine="zarr")
    assert cube.attrs["cubelake:time_scenes"] == [["scene_a", "scene_d"]]
    scales = cube.attrs["cubelake:warp_scale"]
    wa = whole_scene_warp(synth_lake / "scenes" / "scene_a", cube, "nearest", scales["scene_a"])
    wd = whole_scene_warp(synth_lake / "scenes" / "scene_d", cube, "nearest", scales["scene_d"])
    assert (np.isfinite(wa) & np.isfinite(wd)).any()  # they overlap: scene_a wins there
    assert (np.isnan(wa) & np.isfinite(wd)).any()  # scene_d fills where scene_a has nothing
    assert same(cube["data"].isel(time=0).values, np.where(np.isnan(wa), wd, wa))


def test_derived_grid_is_the_majority_crs_at_the_finest_resolution_over_the_union(synth_lake: Path) -> None:
    from rasterio.warp import calculate_default_transform, transform_bounds

    out = cube_json(synth_lake, "derived", "scene_a", "scene_b", "scene_c", "scene_d", "--chunk", "64")
    grid = out["grid"]
    assert grid["epsg"] == 32632  # scene_a and scene_d: two of four
    a, b, c, d, e, f = grid["transform"]
    assert b == d == 0
    assert a == -e
    finest = []
    bounds = []
    for sid in ("scene_a", "scene_b", "scene_c", "scene_d"):
        g = json.loads((synth_lake / "scenes" / sid / "scene.json").read_text())["grid"]
        src = CRS.from_wkt(g["crs_wkt"])
        left, top = g["transform"][2], g["transform"][5]
        right, bottom = left + g["transform"][0] * g["width"], top + g["transform"][4] * g["height"]
        tr, _, _ = calculate_default_transform(src, "EPSG:32632", g["width"], g["height"], left, bottom, right, top)
        finest.append(min(abs(tr.a), abs(tr.e)) if src != CRS.from_epsg(32632) else g["transform"][0])
        bounds.append(transform_bounds(src, "EPSG:32632", left, bottom, right, top, densify_pts=21))
    assert a == pytest.approx(min(finest), rel=1e-5)
    assert 19.0 < a < 21.0  # scene_b's 20 m, seen from the next UTM zone
    minx, maxy = c, f
    maxx, miny = c + a * grid["width"], f + e * grid["height"]
    assert math.isclose(minx / a, round(minx / a), abs_tol=1e-6)  # the origin sits on the pixel lattice
    assert math.isclose(maxy / a, round(maxy / a), abs_tol=1e-6)
    ux0, uy0 = min(bb[0] for bb in bounds), min(bb[1] for bb in bounds)
    ux1, uy1 = max(bb[2] for bb in bounds), max(bb[3] for bb in bounds)
    # the union, grown by less than a pixel on each side
    assert minx <= ux0 < minx + a
    assert maxx - a < ux1 <= maxx
    assert miny <= uy0 < miny + a
    assert maxy - a < uy1 <= maxy
    cube = xr.open_dataset(out["zarr"], engine="zarr")
    assert out["times"] == ["2022-07-01T10:00:00Z", "2022-07-03T10:00:00Z", "2022-07-05T10:00:00Z"]
    for t in range(3):
        assert np.isfinite(cube["data"].isel(time=t).values).any()


def test_derive_grid_rules_without_io() -> None:
    from cubelake.datacube import GridRequest, SceneExtent, derive_grid
    from cubelake.datacube.grid import utm_crs

    def extent(epsg: int, lon: float, lat: float, res: float, n: int = 10) -> SceneExtent:
        crs = CRS.from_epsg(epsg)
        x, y = center_xy(f"EPSG:{epsg}", lon, lat)
        return SceneExtent(crs.to_wkt(), (res, 0.0, x, 0.0, -res, y), n, n)

    assert utm_crs(11.99, 52.4).to_epsg() == 32632
    assert utm_crs(12.01, 52.4).to_epsg() == 32633
    assert utm_crs(-70.6, -33.4).to_epsg() == 32719
    # a tie between two CRSs: the UTM zone of the centre of the lon/lat union (here 13.5 E: zone 33)
    tie = derive_grid([extent(32632, 11.5, 52.0, 30), extent(3035, 15.5, 52.0, 30)], GridRequest(),
                      (11.4, 51.9, 15.6, 52.1))
    assert tie.epsg == 32633
    # given bounds are kept (origin at their top-left corner), the size rounded up to whole pixels
    given = derive_grid([extent(32632, 11.5, 52.0, 30)], GridRequest("EPSG:32632", 20.0, (1000.0, 2000.0, 1101.0, 2040.0)))
    assert given.transform == (20.0, 0.0, 1000.0, 0.0, -20.0, 2040.0)
    assert (given.height, given.width) == (2, 6)


# -- refusals -----------------------------------------------------------------------------------------


def test_scenes_of_another_sensor_are_refused_with_the_difference_named(synth_lake: Path) -> None:
    res = run_cli("cube", "build", "--lake", str(synth_lake), "mixed", "scene_a", "scene_x")
    out = no_traceback(res)
    assert res.returncode == 1, out
    assert "not from one sensor" in out
    assert "scene_x: 4 bands, not 6" in out
    assert not (synth_lake / "datacubes" / "mixed").exists()


@pytest.mark.parametrize(("args", "code", "words"), [
    (["scene_a", "scene_u"], 1, ["scene_u", "acquisition time is unknown"]),
    (["scene_a", "no_such_scene"], 1, ["no_such_scene", "no published scene"]),
    ([], 2, ["no scenes chosen"]),
    (["scene_a", "--resampling", "lanczos"], 2, ["--resampling 'lanczos'"]),
    (["scene_a", "--crs", "EPSG:99999"], 2, ["--crs 'EPSG:99999'"]),
    (["scene_a", "--resolution", "-5"], 2, ["--resolution -5"]),
    (["scene_a", "--crs", "EPSG:32632", "--resolution", "30", "--bounds", "10", "0", "0", "10"], 2, ["--bounds"]),
])
def test_bad_inputs_exit_with_a_clear_message(synth_lake: Path, args: list[str], code: int, words: list[str]) -> None:
    from typer.testing import CliRunner

    from cubelake.cli import app

    res = CliRunner().invoke(app, ["cube", "build", "--lake", str(synth_lake), "refused", *args])
    assert isinstance(res.exception, SystemExit), res.exception  # an exit, not an exception's traceback
    assert res.exit_code == code, res.output
    for w in words:
        assert w in res.output, res.output
    assert not (synth_lake / "datacubes" / "refused").exists()


def test_search_options_choose_the_scenes(synth_lake: Path) -> None:
    out = cube_json(synth_lake, "early", "--datetime", "2022-07-01/2022-07-04", "--collection", "generic",
                    *given_grid(), "--chunk", "64")
    assert out["scenes"] == ["scene_a", "scene_d", "scene_b"]  # by time, then id; x and c are later, u undated
    assert out["times"] == ["2022-07-01T10:00:00Z", "2022-07-03T10:00:00Z"]


# -- the published cube ------------------------------------------------------------------------------


def test_the_cube_opens_in_a_fresh_process_with_xarray_zarr_and_rioxarray(abc: dict[str, Any]) -> None:
    script = textwrap.dedent(f"""
        import json
        import rioxarray  # noqa: F401  (the .rio accessor)
        import xarray as xr
        import zarr

        ds = xr.open_zarr({abc["zarr"]!r})
        group = zarr.open_group({abc["zarr"]!r}, mode="r")
        print(json.dumps({{
            "dims": list(ds["data"].dims), "shape": list(ds["data"].shape), "dtype": str(ds["data"].dtype),
            "epsg": ds["data"].rio.crs.to_epsg(), "transform": list(ds["data"].rio.transform())[:6],
            "times": [str(t)[:19] for t in ds["time"].values], "wavelength": ds["wavelength"].values.tolist(),
            "zarr_format": group.metadata.zarr_format, "chunks": list(group["data"].chunks),
            "nan_fraction": float(ds["data"].isnull().mean()),
        }}))
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["dims"] == ["time", "band", "y", "x"]
    assert got["shape"] == abc["shape"]
    assert got["dtype"] == "float32"
    assert got["epsg"] == 32632
    assert got["transform"] == pytest.approx(abc["grid"]["transform"])
    assert got["times"] == [t[:19] for t in abc["times"]]
    assert got["wavelength"] == [450.0 + 60 * i for i in range(NB)]
    assert got["zarr_format"] == 3
    assert got["chunks"] == [1, NB, 32, 32]
    assert 0 < got["nan_fraction"] < 1  # NaN outside each scene's footprint


def test_the_stac_item_validates_and_the_cube_is_listed(synth_lake: Path, abc: dict[str, Any]) -> None:
    from cubelake.datacube import EXT_DATACUBE

    item_path = Path(abc["item"])
    item = json.loads(item_path.read_text())
    assert validate_stac(item, stac_registry([SHARED_SCHEMAS])) == []
    assert EXT_DATACUBE in item["stac_extensions"]
    dims = item["properties"]["cube:dimensions"]
    assert dims["time"]["values"] == abc["times"]
    assert dims["band"]["values"] == [f"b{i}" for i in range(1, NB + 1)] or len(dims["band"]["values"]) == NB
    a, _, c, _, e, f = abc["grid"]["transform"]
    assert dims["x"]["extent"] == [c, c + a * abc["grid"]["width"]]
    assert dims["y"]["extent"] == [f + e * abc["grid"]["height"], f]
    assert dims["x"]["reference_system"] == 32632
    assert item["properties"]["proj:code"] == "EPSG:32632"
    assert item["properties"]["cubelake:scenes"] == ["scene_a", "scene_b", "scene_c"]
    assert (item_path.parent / item["assets"]["zarr"]["href"]).resolve() == Path(abc["zarr"]).resolve()
    for link in item["links"]:
        if link["rel"] == "derived_from":
            assert (item_path.parent / link["href"]).is_file(), link
    listed = run_cli("cube", "list", "--lake", str(synth_lake), "--format", "json")
    assert listed.returncode == 0, no_traceback(listed)
    features = {f["id"]: f for f in json.loads(listed.stdout)["features"]}
    assert Path(features["abc"]["assets"]["zarr"]["href"]) == Path(abc["zarr"])  # absolute hrefs
    lake = open_lake(synth_lake)
    assert "abc" in [it["id"] for it in search_cube_items(lake, Query(bbox="11.9,52.3,12.1,52.5", datetime="2022-07"))]
    assert search_cube_items(lake, Query(bbox="-70,-40,-60,-30")) == []
    assert search_cube_items(lake, Query(datetime="2023-01/2023-12")) == []
    shown = run_cli("cube", "show", "abc", "--lake", str(synth_lake))
    assert json.loads(shown.stdout) == item


def test_dtype_source_keeps_the_scenes_stored_encoding(synth_lake: Path, abc: dict[str, Any]) -> None:
    out = build_cube(synth_lake, "abc-int16", ["scene_a", "scene_b", "scene_c"],
                     settings=given_settings(chunk=32, dtype="source"))
    raw = xr.open_dataset(out.zarr_url, engine="zarr", mask_and_scale=False)
    assert raw["data"].dtype == np.int16
    assert raw["data"].attrs["_FillValue"] == NODATA
    decoded = xr.open_dataset(out.zarr_url, engine="zarr")["data"].values
    assert same(decoded.astype(np.float32), xr.open_dataset(abc["zarr"], engine="zarr")["data"].values)


# -- idempotence and atomicity -------------------------------------------------------------------------


def test_a_rerun_is_a_no_op_and_a_changed_scene_rebuilds(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    ingest_scenes(lake, tmp_path / "src", ["scene_a", "scene_b"])
    first = build_cube(lake, "ab", ["scene_a", "scene_b"], settings=given_settings(chunk=64))
    assert first.status == "built"
    item_path = Path(first.item_url)
    before = item_path.stat().st_mtime_ns, item_path.read_bytes()
    again = run_cli("cube", "build", "--lake", str(lake), "ab", "scene_a", "scene_b", *given_grid(), "--chunk", "64")
    assert again.returncode == 0, no_traceback(again)
    assert "cube ab is up to date" in again.stdout
    assert (item_path.stat().st_mtime_ns, item_path.read_bytes()) == before
    # scene_b re-ingested with other pixels: the cube is rebuilt, its old version removed
    path = write_scene(tmp_path / "src", SCENES["scene_b"], hsi_cube(NB, 100, 90, dtype="int16", seed=99))
    redone = ingest([path], lake, IngestOptions(chunk=32, products=("cog", "zarr")))[0]
    assert (redone.outcome.value, redone.scene_id) == ("ingested", "scene_b"), redone.message
    third = build_cube(lake, "ab", ["scene_a", "scene_b"], settings=given_settings(chunk=64))
    assert third.status == "built"
    assert third.zarr_url != first.zarr_url
    assert not Path(first.zarr_url).exists()
    assert sorted(p.name for p in (lake / "datacubes" / "ab" / "v").iterdir()) == [Path(third.zarr_url).parent.name]
    cube = open_cube(open_lake(lake), "ab")
    fresh = whole_scene_warp(lake / "scenes" / "scene_b", cube, "nearest", cube.attrs["cubelake:warp_scale"]["scene_b"])
    assert same(cube["data"].isel(time=1).values, fresh)
    # another setting rebuilds too
    assert build_cube(lake, "ab", ["scene_a", "scene_b"], settings=given_settings(chunk=64, resampling="bilinear")).status \
        == "built"
    assert not list((lake / ".staging").iterdir())


def test_a_failed_build_publishes_nothing_and_keeps_the_cube(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    ingest_scenes(lake, tmp_path / "src", ["scene_a", "scene_b"])
    first = build_cube(lake, "ab", ["scene_a", "scene_b"], settings=given_settings(chunk=64))
    item_before = Path(first.item_url).read_bytes()
    (lake / "scenes" / "scene_b" / "scene_b.zarr" / "data" / "zarr.json").unlink()  # a damaged product
    res = run_cli("cube", "build", "--lake", str(lake), "ab", "scene_a", "scene_b", *given_grid(), "--chunk", "64",
                  "--resampling", "bilinear")
    out = no_traceback(res)
    assert res.returncode == 1, out
    assert "scene scene_b: reading its zarr product" in out
    assert Path(first.item_url).read_bytes() == item_before  # the published cube is untouched
    assert Path(first.zarr_url, "zarr.json").is_file()
    assert sorted(p.name for p in (lake / "datacubes" / "ab" / "v").iterdir()) == [Path(first.zarr_url).parent.name]
    assert not list((lake / ".staging").iterdir())


# -- memory, object storage, real scenes ----------------------------------------------------------------

_MEASURE = textwrap.dedent("""
    import json, sys, threading, time, tracemalloc
    from pathlib import Path
    import psutil
    import dask.array, rasterio.vrt, xarray, zarr  # imported before measuring: library code is not cube data
    from cubelake.datacube import CubeSettings
    from cubelake.datacube.build import plan_cube, write_cube
    from cubelake.lake import open_lake

    lake, folder = open_lake(sys.argv[1]), Path(sys.argv[2])
    plan = plan_cube(lake, "big", ["big"], None, CubeSettings(crs="EPSG:32632", resolution=10.0, chunk=256))
    x0, y0 = plan.grid.transform[2], plan.grid.transform[5]  # first a small cube: every lazy import done
    write_cube(plan_cube(lake, "warm", ["big"], None, CubeSettings(crs="EPSG:32632", resolution=10.0, chunk=256,
                                                                   bounds=(x0, y0 - 5120, x0 + 5120, y0))),
               folder / "warm.zarr")
    proc, peak, done = psutil.Process(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.01)

    before = proc.memory_info().rss
    sampler = threading.Thread(target=sample)
    sampler.start()
    tracemalloc.start()
    write_cube(plan, folder / "big.zarr")
    traced = tracemalloc.get_traced_memory()[1]
    done.set()
    sampler.join()
    print(json.dumps({"shape": plan.layout.shape, "traced_peak": traced, "rss_growth": peak[0] - before}))
""")


@pytest.mark.slow
def test_memory_stays_far_below_the_cube_and_the_scene(tmp_path: Path) -> None:
    """A 512 x 512 x 16 scene (16 MiB) upsampled into a ~168 MiB cube, one 256 x 256 block at a time."""
    n, bands = 512, 16
    data = np.random.default_rng(7).random((bands, n, n), dtype=np.float32)
    tif = tmp_path / "big.tif"
    with rasterio.open(tif, "w", driver="GTiff", width=n, height=n, count=bands, dtype="float32", crs="EPSG:32633",
                       transform=from_origin(300000, 5830000, 30, 30), nodata=np.nan, tiled=True) as dst:
        dst.write(data)
        dst.update_tags(acquisition_time="2022-07-01T10:00:00Z")
        for i in range(bands):
            dst.update_tags(i + 1, wavelength=str(500 + 50 * i), wavelength_units="nm")
    assert ingest([tif], tmp_path / "lake", IngestOptions(chunk=128, products=("zarr",)))[0].outcome.value == "ingested"
    res = subprocess.run([sys.executable, "-c", _MEASURE, str(tmp_path / "lake"), str(tmp_path)],
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    cube_bytes = 4 * math.prod(got["shape"])
    assert cube_bytes > 150 * 2**20
    assert got["traced_peak"] < cube_bytes / 10, got  # numpy and zarr buffers: a few blocks, not the cube
    assert got["rss_growth"] < cube_bytes / 2, got  # everything (GDAL too): far from holding the cube
    cube = zarr_open(tmp_path / "big.zarr")
    assert np.isfinite(cube[0, :, 800:1056, 800:1056]).all()  # the middle of the cube is filled


def zarr_open(path: Path) -> Any:
    import zarr

    return zarr.open_array(str(path), path="data", mode="r")


@pytest.mark.s3
def test_an_s3_lake_reads_cogs_over_s3_and_publishes_the_cube_there(s3_server: S3Server, s3_bucket: str,
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true", "CUBELAKE_CACHE": str(tmp_path / "cache"),
           "CUBELAKE_STAGING": str(tmp_path / "staging")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    url = f"s3://{s3_bucket}/lake"
    ingest_scenes(url, tmp_path / "src", ["scene_a", "scene_b"], products=("cog",))  # read through GDAL /vsis3/
    out = cube_json(url, "ab", "scene_a", "scene_b", *given_grid(), "--chunk", "64", "--workers", "2")
    assert out["zarr"].startswith(f"s3://{s3_bucket}/lake/datacubes/ab/v/")
    again = run_cli("cube", "build", "--lake", url, "ab", "scene_a", "scene_b", *given_grid(), "--chunk", "64")
    assert "cube ab is up to date" in no_traceback(again), again.stdout
    # the same scenes in a local lake, read from their Zarr: the same cube
    local = tmp_path / "local"
    ingest_scenes(local, tmp_path / "src-local", ["scene_a", "scene_b"], products=("zarr",))
    expected = build_cube(local, "ab", ["scene_a", "scene_b"], settings=given_settings(chunk=64))
    remote = open_cube(open_lake(url), "ab")
    assert remote["data"].dims == ("time", "band", "y", "x")
    assert same(remote["data"].values, xr.open_dataset(expected.zarr_url, engine="zarr")["data"].values)
    listed = run_cli("cube", "list", "--lake", url, "--format", "json")
    features = json.loads(no_traceback(listed) and listed.stdout)["features"]
    assert [f["id"] for f in features] == ["ab"]
    assert features[0]["assets"]["zarr"]["href"] == out["zarr"]
    item, _ = read_cube_item(open_lake(url), "ab")
    assert item is not None
    assert validate_stac(item, stac_registry([SHARED_SCHEMAS])) == []


@pytest.mark.slow
def test_real_enmap_tiles_reprojected_to_laea_europe(tmp_path: Path) -> None:
    """Two real EnMAP L2A tiles (UTM 33N, one acquisition) into one LAEA Europe 30 m time step."""
    folder = REAL / "hsi_enmap_potsdam"
    tiles = ["enmap_potsdam_tile_96_0", "enmap_potsdam_tile_128_0"]
    lake = tmp_path / "lake"
    res = ingest([folder / f"{t}.tif" for t in tiles], lake, IngestOptions(chunk=32, products=("cog", "zarr")))
    assert [r.outcome.value for r in res] == ["ingested", "ingested"], [r.message for r in res]
    out = cube_json(lake, "potsdam", "--collection", "enmap-l2a", "--crs", "EPSG:3035", "--resolution", "30",
                    "--chunk", "32")
    assert out["times"] == ["2022-07-24T10:45:26Z"]
    assert out["shape"][:2] == [1, 206]  # the bands the EnMAP profile keeps
    cube = xr.open_dataset(out["zarr"], engine="zarr")
    assert cube["wavelength"].values[0] == pytest.approx(418.24)
    scales = cube.attrs["cubelake:warp_scale"]
    first, second = (whole_scene_warp(lake / "scenes" / t, cube, "nearest", scales[t]) for t in sorted(tiles))
    assert (np.isfinite(first) & np.isnan(second)).any()
    assert (np.isfinite(second) & np.isnan(first)).any()  # side by side: each fills its own part
    assert same(cube["data"].isel(time=0).values, np.where(np.isnan(first), second, first))
    assert validate_stac(json.loads(Path(out["item"]).read_text()), stac_registry([SHARED_SCHEMAS])) == []
