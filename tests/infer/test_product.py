"""A prediction's products (Zarr v3 + COGs), its STAC item (mlm, processing), and the derived-product publish protocol.

The products are written from synthetic blocks on a 40 x 45 grid of 16 px chunks (3 x 3 chunks, the
last row and column clipped) with the CRS and transform of a real EnMAP scene, then opened in a fresh
process with GDAL's command line tools, rasterio, xarray (+ rioxarray) and zarr: exact values,
nodata, CRS, transform, tiles. The item is checked against STAC 1.1 core and every extension it
declares, offline; broken ones fail. Publishing (``cubelake.derived``) is atomic, create-only for a
new product, ``If-Match`` to replace one, and prunes old versions, on disk and on the S3 test server.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
from rasterio.crs import CRS

from cubelake import derived
from cubelake.catalog import Query
from cubelake.catalog.validate import stac_registry, validate_stac
from cubelake.derived import PREDICTIONS
from cubelake.infer import ModelSpec, load_model, save_model
from cubelake.infer.errors import InferError
from cubelake.infer.item import (
    EXT_MLM,
    EXT_PROCESSING,
    ModelRecord,
    PredictionItemSpec,
    check_prediction_item,
    prediction_item,
    prediction_item_from_spec,
)
from cubelake.infer.product import Asset, PredictionWriter
from cubelake.ingest import IngestOptions, ingest
from cubelake.lake import Lake, open_lake
from cubelake.object_lake import ObjectLake, new_version
from cubelake.storage import CommitConflict
from tests.conftest import REAL, S3Server

SCENE = "enmap_potsdam_tile_96_0"
TIF = REAL / "hsi_enmap_potsdam" / f"{SCENE}.tif"
SHARED_SCHEMAS = REAL.parent.parent / "schemas" / "stac-extensions"
H, W, CHUNK, K = 40, 45, 16, 4  # 3 x 3 chunks: 16, 16, 8 rows and 16, 16, 13 columns
SETTINGS = {"halo": 2, "blend": "cosine", "tile_chunks": 1, "dtype": "fp32", "outputs": ["classes", "probabilities"],
            "prob_dtype": "float16"}


def synthetic(classes: int = K, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Class probabilities (class, y, x) summing to one, their argmax map, and a nodata corner (255 / NaN)."""
    rng = np.random.default_rng(seed)
    probs = rng.random((classes, H, W)).astype(np.float32)
    probs /= probs.sum(axis=0)
    cls = probs.argmax(axis=0).astype(np.uint8 if classes <= 255 else np.uint16)
    cls[:5, :7] = 255 if classes <= 255 else 65535
    probs[:, :5, :7] = np.nan
    return cls, probs


def blocks(cls: np.ndarray | None, probs: np.ndarray | None) -> list[tuple[int, int, Any, Any]]:
    out = []
    for cy in range(3):
        for cx in range(3):
            rows, cols = slice(cy * CHUNK, min(H, (cy + 1) * CHUNK)), slice(cx * CHUNK, min(W, (cx + 1) * CHUNK))
            out.append((cy, cx, None if cls is None else cls[rows, cols],
                        None if probs is None else probs[:, rows, cols]))
    return out


def scene_grid() -> tuple[str, tuple[float, ...]]:
    with rasterio.open(TIF) as src:
        return src.crs.to_wkt(), tuple(src.transform)[:6]


def write_prediction(folder: Path, name: str = "pred", **kw: Any) -> tuple[PredictionWriter, list[Asset]]:
    crs_wkt, transform = scene_grid()
    cls, probs = synthetic()
    writer = PredictionWriter(folder, name, height=H, width=W, chunk=CHUNK, crs_wkt=crs_wkt, transform=transform,
                              classes=K, **kw)
    for cy, cx, c, p in blocks(cls, probs):
        writer.write(cy, cx, c, p)
    return writer, writer.finish()


@pytest.fixture(scope="module")
def scene_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real EnMAP tile ingested (its item is what a prediction derives from)."""
    lake = tmp_path_factory.mktemp("pred") / "lake"
    res = ingest([TIF], lake, IngestOptions(chunk=16, products=("zarr",)))
    assert res[0].outcome.value == "ingested", res[0].message
    return lake


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    class Seg(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = torch.nn.Conv2d(6, K, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(x)

    spec = ModelSpec(name="seg2d", kind="dense", layout="BCHW", bands=6, classes=K, patch=0, receptive_field=1)
    return save_model(Seg(), tmp_path_factory.mktemp("model") / "seg2d.pt", spec)


# -- the products, read back by every tool ----------------------------------------------------------------

_READ = textwrap.dedent("""
    import json, subprocess, sys, tempfile
    from pathlib import Path
    import numpy as np, rasterio, rioxarray, xarray as xr, zarr
    from rio_cogeo.cogeo import cog_validate

    folder = Path(sys.argv[1])
    out = {}
    for o in ("classes", "probabilities"):
        tif = folder / f"pred_{o}.tif"
        info = json.loads(subprocess.run(["gdalinfo", "-json", str(tif)], check=True, capture_output=True,
                                         text=True).stdout)
        plain = Path(tempfile.mkdtemp()) / "plain.tif"
        subprocess.run(["gdal_translate", "-q", "-of", "GTiff", str(tif), str(plain)], check=True)
        with rasterio.open(plain) as ds:
            gdal_values = ds.read().tolist()
        with rasterio.open(tif) as ds:
            out[o] = {"gdal": {"geotransform": info["geoTransform"], "wkt": info["coordinateSystem"]["wkt"],
                               "nodata": [b.get("noDataValue") for b in info["bands"]],
                               "types": [b["type"] for b in info["bands"]], "blocks": [b["block"] for b in info["bands"]],
                               "descriptions": [b.get("description") for b in info["bands"]],
                               "tags": info["metadata"][""], "values": gdal_values},
                      "rasterio": {"epsg": ds.crs.to_epsg(), "wkt": ds.crs.to_wkt(), "transform": list(ds.transform)[:6],
                                   "nodata": ds.nodata, "dtypes": list(ds.dtypes), "blocks": ds.block_shapes,
                                   "values": ds.read().tolist()},
                      "cog_valid": cog_validate(str(tif), quiet=True)[0]}
    path = str(folder / "pred.zarr")
    raw = xr.open_zarr(path, mask_and_scale=False)
    dec = xr.open_zarr(path)
    group = zarr.open_group(path, mode="r")
    out["zarr"] = {
        "format": group.metadata.zarr_format, "consolidated": group.metadata.consolidated_metadata is not None,
        "dims": {v: list(raw[v].dims) for v in ("classes", "probabilities")},
        "dtypes": {v: str(raw[v].dtype) for v in ("classes", "probabilities")},
        "chunks": {v: list(group[v].chunks) for v in ("classes", "probabilities")},
        "fill": {v: group[v].fill_value.item() for v in ("classes", "probabilities")},
        "cf_fill": {v: raw[v].attrs.get("_FillValue", raw[v].encoding.get("_FillValue")) for v in ("classes",)},
        "classes": raw["classes"].values.tolist(), "probabilities": raw["probabilities"].values.astype(float).tolist(),
        "zarr_classes": group["classes"][:].tolist(),
        "decoded_nan": int(dec["classes"].isnull().sum()), "decoded_dtype": str(dec["classes"].dtype),
        "epsg": dec["classes"].rio.crs.to_epsg(), "transform": list(dec["probabilities"].rio.transform())[:6],
        "class_coord": dec["class"].values.tolist(), "class_names": dec["probabilities"].attrs["class_names"],
        "counts": group.attrs["cubelake:class_counts"],
    }
    print(json.dumps(out))
""")


def test_products_open_in_a_fresh_process_with_exact_values(tmp_path: Path) -> None:
    writer, assets = write_prediction(tmp_path, prob_dtype="float16", class_names=["water", "forest", "urban", "crop"])
    crs_wkt, transform = scene_grid()
    cls, probs = synthetic()
    res = subprocess.run([sys.executable, "-c", _READ, str(tmp_path)], capture_output=True, text=True, timeout=300,
                         check=False)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    a, b, c, d, e, f = transform
    for o, expected, dtype, nodata in (("classes", cls[None], "uint8", 255.0),
                                       ("probabilities", probs, "float32", None)):
        gd, rio = got[o]["gdal"], got[o]["rasterio"]
        assert got[o]["cog_valid"]
        assert gd["geotransform"] == [c, a, b, f, d, e]
        assert CRS.from_wkt(gd["wkt"]) == CRS.from_wkt(crs_wkt)
        assert rio["epsg"] == 32633
        assert rio["transform"] == list(transform)
        assert rio["dtypes"] == [dtype] * expected.shape[0]
        assert rio["blocks"] == [[CHUNK, CHUNK]] * expected.shape[0]  # tiles = the scene's chunks
        assert gd["blocks"] == [[CHUNK, CHUNK]] * expected.shape[0]
        assert gd["tags"]["CUBELAKE_PREDICTION"] == "pred"
        for values in (np.array(gd["values"], dtype=dtype), np.array(rio["values"], dtype=dtype)):
            np.testing.assert_array_equal(values, expected)  # NaN where NaN, every other value exact
        if nodata is None:
            assert np.isnan(rio["nodata"])
            assert gd["nodata"] == ["NaN"] * K
            assert gd["descriptions"] == ["water", "forest", "urban", "crop"]
        else:
            assert rio["nodata"] == nodata
            assert gd["nodata"] == [nodata]
    z = got["zarr"]
    assert (z["format"], z["consolidated"]) == (3, True)
    assert z["dims"] == {"classes": ["y", "x"], "probabilities": ["class", "y", "x"]}
    assert z["dtypes"] == {"classes": "uint8", "probabilities": "float16"}
    assert z["chunks"] == {"classes": [CHUNK, CHUNK], "probabilities": [K, CHUNK, CHUNK]}
    assert z["fill"]["classes"] == 255
    assert np.isnan(z["fill"]["probabilities"])
    assert z["cf_fill"] == {"classes": 255}
    np.testing.assert_array_equal(np.array(z["classes"], dtype=np.uint8), cls)
    np.testing.assert_array_equal(np.array(z["zarr_classes"], dtype=np.uint8), cls)
    np.testing.assert_array_equal(np.array(z["probabilities"], dtype=np.float16), probs.astype(np.float16))
    assert (z["decoded_nan"], z["decoded_dtype"]) == (5 * 7, "float32")  # CF-decoded: nodata is NaN
    assert z["epsg"] == 32633
    assert z["transform"] == list(transform)
    assert z["class_coord"] == list(range(K))
    assert z["class_names"] == ["water", "forest", "urban", "crop"]
    expected_counts = np.bincount(cls[cls != 255], minlength=K).tolist()
    assert z["counts"] == expected_counts == writer.class_counts.tolist()
    assert writer.nodata_pixels == 5 * 7
    # the assets: what the catalog says of a scene's products
    by_key = {x.key: x for x in assets}
    assert list(by_key) == ["zarr", "classes", "probabilities"]
    for x in assets:
        path = tmp_path / x.href.removeprefix("./")
        assert x.size == (sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if x.is_folder
                          else path.stat().st_size)
        assert x.checksum.startswith("1e20")
        assert len(x.checksum) == 4 + 64
    assert by_key["classes"].fields["data_type"] == "uint8"
    assert by_key["probabilities"].fields["data_type"] == "float32"  # the COG: GDAL 3.10 writes no Float16
    assert by_key["classes"].fields["raster:spatial_resolution"] == 30.0


def test_many_classes_give_a_uint16_map_and_counts_come_from_probabilities_alone(tmp_path: Path) -> None:
    crs_wkt, transform = scene_grid()
    cls, _ = synthetic(classes=300)
    writer = PredictionWriter(tmp_path, "many", height=H, width=W, chunk=CHUNK, crs_wkt=crs_wkt, transform=transform,
                              classes=300, outputs=("classes",))
    for cy, cx, c, _p in blocks(cls, None):
        writer.write(cy, cx, c, None)
    assets = writer.finish()
    assert [x.key for x in assets] == ["zarr", "classes"]
    assert not (tmp_path / "many_probabilities.tif").exists()
    with rasterio.open(tmp_path / "many_classes.tif") as ds:
        assert (ds.dtypes[0], ds.nodata) == ("uint16", 65535.0)
        np.testing.assert_array_equal(ds.read(1), cls)
    import zarr

    arr = zarr.open_array(str(tmp_path / "many.zarr"), path="classes", mode="r")
    assert (str(arr.dtype), arr.fill_value) == ("uint16", 65535)
    assert writer.class_counts.tolist() == np.bincount(cls[cls != 65535], minlength=300).tolist()
    # probabilities only: the counts are their argmax where every class has a value
    _, probs = synthetic()
    only = PredictionWriter(tmp_path / "p", "p", height=H, width=W, chunk=CHUNK, crs_wkt=crs_wkt, transform=transform,
                            classes=K, outputs=("probabilities",))
    for cy, cx, _c, p in blocks(None, probs):
        only.write(cy, cx, None, p)
    assert [x.key for x in only.finish()] == ["zarr", "probabilities"]
    valid = np.isfinite(probs).all(axis=0)
    assert only.class_counts.tolist() == np.bincount(probs.argmax(axis=0)[valid], minlength=K).tolist()
    assert only.nodata_pixels == 5 * 7


def test_bad_blocks_are_refused_by_name_and_abort_removes_the_files(tmp_path: Path) -> None:
    crs_wkt, transform = scene_grid()
    cls, probs = synthetic()
    todo = blocks(cls, probs)

    def writer(**kw: Any) -> PredictionWriter:
        return PredictionWriter(tmp_path, "bad", height=H, width=W, chunk=CHUNK, crs_wkt=crs_wkt, transform=transform,
                                classes=K, **kw)

    with pytest.raises(InferError, match="chunk=20 px is not a multiple of 16"):
        PredictionWriter(tmp_path, "x", height=H, width=W, chunk=20, crs_wkt=crs_wkt, transform=transform, classes=K)
    with pytest.raises(InferError, match="class_names must be 4 non-empty strings"):
        writer(class_names=["a", "b"])
    w = writer()
    with pytest.raises(InferError, match=r"block \(0, 1\) arrived out of order.*expected \(0, 0\)"):
        w.write(0, 1, todo[1][2], todo[1][3])
    with pytest.raises(InferError, match=r"expected an integer array of shape \(16, 16\)"):
        w.write(0, 0, cls[:10, :10], todo[0][3])
    bad = todo[0][2].copy()
    bad[3, 3] = K  # not a class and not nodata
    with pytest.raises(InferError, match=r"outside 0\.\.3 that are not the nodata value 255"):
        w.write(0, 0, bad, todo[0][3])
    with pytest.raises(InferError, match="has no probabilities, which this prediction writes"):
        w.write(0, 0, todo[0][2], None)
    w.write(*todo[0])
    with pytest.raises(InferError, match="1 of 9 chunks were written"):
        w.finish()
    assert (tmp_path / "bad.zarr").is_dir()
    w.abort()
    w.abort()  # twice is fine
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    with pytest.raises(InferError, match="the writer is aborted"):
        w.write(*todo[1])

    def dies() -> None:
        with writer() as w2:
            w2.write(*todo[0])
            raise RuntimeError("the model failed")

    with pytest.raises(RuntimeError, match="the model failed"):
        dies()  # an exception inside the block aborts the writer
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# -- the STAC item ------------------------------------------------------------------------------------------


def test_the_item_validates_offline_and_records_model_scene_and_settings(tmp_path: Path, scene_lake: Path,
                                                                         model_file: Path) -> None:
    writer, assets = write_prediction(tmp_path, "pred", prob_dtype="float16")
    lm = load_model(model_file)
    version = new_version()
    item = prediction_item(lake=open_lake(scene_lake), name="pred", scene_id=SCENE, model=lm, settings=SETTINGS,
                           assets=assets, version=version, inputs_hash="ab" * 32, class_counts=writer.class_counts)
    assert validate_stac(item) == []
    assert validate_stac(item, stac_registry([SHARED_SCHEMAS])) == []  # the shared official copies too
    scene = json.loads((scene_lake / "scenes" / SCENE / "item.json").read_text())
    assert (item["id"], item["collection"]) == ("pred", "cubelake-predictions")
    assert item["geometry"] == scene["geometry"]
    assert item["bbox"] == scene["bbox"]
    props = item["properties"]
    assert props["datetime"] == scene["properties"]["datetime"]
    assert EXT_MLM in item["stac_extensions"]
    assert EXT_PROCESSING in item["stac_extensions"]
    links = {lk["rel"]: lk["href"] for lk in item["links"]}
    assert links["derived_from"] == f"../../scenes/{SCENE}/item.json"
    assert (scene_lake / "predictions" / "x" / links["derived_from"]).resolve() == \
        (scene_lake / "scenes" / SCENE / "item.json").resolve()
    assert links["root"] == "../../catalog.json"
    # the model, as mlm says it
    assert (props["mlm:name"], props["mlm:architecture"], props["mlm:framework"]) == ("seg2d", "Seg", "PyTorch")
    assert props["mlm:tasks"] == ["semantic-segmentation"]
    assert props["mlm:input"][0]["input"] == {"shape": [-1, 6, -1, -1], "dim_order": ["batch", "channel", "height",
                                                                                      "width"], "data_type": "float32"}
    assert props["mlm:output"][0]["result"]["shape"] == [-1, K, -1, -1]
    assert [c["value"] for c in props["mlm:output"][0]["classification:classes"]] == list(range(K))
    assert props["mlm:total_parameters"] == 6 * K * 9 + K
    model = item["assets"]["model"]
    assert model["roles"][0] == "mlm:model"
    assert model["mlm:artifact_type"] == "torch.jit.save"
    assert model["file:checksum"] == "1220" + lm.sha256
    assert model["href"] == model_file.resolve().as_uri()
    # processing and cubelake's own fields
    assert props["processing:level"] == "L4"
    assert set(props["processing:software"]) == {"cubelake", "torch"}
    assert lm.sha256 in props["processing:lineage"]
    assert props["cubelake:model_sha256"] == lm.sha256
    assert props["cubelake:inputs_hash"] == "ab" * 32
    assert props["cubelake:settings"] == SETTINGS
    assert props["cubelake:version"] == version
    assert props["cubelake:class_counts"] == writer.class_counts.tolist()
    # the grid, exactly the scene's
    for k in ("proj:code", "proj:transform"):
        assert props[k] == scene["properties"][k]
    assert props["proj:shape"] == [H, W]
    for key in ("zarr", "classes", "probabilities"):
        assert item["assets"][key]["href"] == f"./v/{version}/{Path(item['assets'][key]['href']).name}"
        assert not any(k.startswith("proj:") for k in item["assets"][key])  # moved up to the properties


def test_a_broken_item_fails_validation(tmp_path: Path, scene_lake: Path, model_file: Path) -> None:
    writer, assets = write_prediction(tmp_path)
    record = ModelRecord.from_loaded(load_model(model_file))
    scene = json.loads((scene_lake / "scenes" / SCENE / "item.json").read_text())
    spec = PredictionItemSpec("pred", new_version(), scene, record, tuple(assets), SETTINGS, "cd" * 32,
                              tuple(writer.class_counts.tolist()))
    good = prediction_item_from_spec(spec)
    assert validate_stac(good) == []
    # a per-pixel 3-D CNN run in bfloat16 (which mlm's data types call "other") is described validly too
    pixel = dataclasses.replace(record, name="3d", kind="pixel", layout="B1CHW", patch=9, architecture="HybridSN")
    other = prediction_item_from_spec(dataclasses.replace(spec, model=pixel, settings={**SETTINGS, "dtype": "bf16"}))
    assert validate_stac(other) == []
    props = other["properties"]
    assert props["mlm:name"] == "model-3d"  # mlm names start with a letter
    assert props["mlm:tasks"] == ["classification", "semantic-segmentation"]
    assert props["mlm:input"][0]["input"] == {"shape": [-1, 1, 6, 9, 9], "data_type": "other",
                                              "dim_order": ["batch", "channel", "depth", "height", "width"]}
    assert props["mlm:output"][0]["result"]["shape"] == [-1, K]

    def broken(change: Any) -> list[str]:
        item = json.loads(json.dumps(good))
        change(item)
        return validate_stac(item)

    assert any("'mlm:input' is a required property" in p for p in broken(lambda i: i["properties"].pop("mlm:input")))
    assert broken(lambda i: i["assets"].pop("model"))  # mlm needs one asset with the mlm:model role
    assert broken(lambda i: i["assets"]["model"].pop("mlm:artifact_type"))
    assert broken(lambda i: i["properties"]["mlm:output"][0].pop("result"))
    assert broken(lambda i: i["properties"].update({"mlm:tasks": ["guessing"]}))
    assert broken(lambda i: i["properties"].update({"processing:datetime": "2024-01-01T00:00:00+02:00"}))
    assert broken(lambda i: i["properties"].update({"processing:software": {"cubelake": 1}}))
    bad = json.loads(json.dumps(good))
    bad["properties"].pop("mlm:input")
    with pytest.raises(InferError, match=r"breaks the official schemas.*mlm:input"):
        check_prediction_item(bad)
    with pytest.raises(InferError, match="no such scene item"):
        prediction_item(lake=open_lake(scene_lake), name="pred", scene_id="nope", model=record, settings=SETTINGS,
                        assets=assets, version=new_version(), inputs_hash="x", class_counts=writer.class_counts)


# -- publishing: atomic, create-only / If-Match, pruned, on disk and on S3 -----------------------------------


@pytest.fixture(params=["disk", pytest.param("s3", marks=pytest.mark.s3)])
def lake(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    if request.param == "disk":
        return Lake(tmp_path / "lake")
    server: S3Server = request.getfixturevalue("s3_server")
    bucket: str = request.getfixturevalue("s3_bucket")
    monkeypatch.setenv("CUBELAKE_STAGING", str(tmp_path / "staging"))
    return ObjectLake(f"s3://{bucket}/lake", options=server.options)


def build(lake: Any, scene: dict[str, Any], record: ModelRecord, etag: str | None, *,
          fail: bool = False) -> tuple[str, dict[str, Any]]:
    """One prediction build as a run does it: lock, stage, write, describe, publish; ``fail``: the model dies half way."""
    with derived.product_lock(lake, PREDICTIONS, "pred"), derived.product_staging(lake, PREDICTIONS, "pred") as staged:
        crs_wkt, transform = scene_grid()
        cls, probs = synthetic()
        with PredictionWriter(staged, "pred", height=H, width=W, chunk=CHUNK, crs_wkt=crs_wkt, transform=transform,
                              classes=K) as writer:
            for n, (cy, cx, c, p) in enumerate(blocks(cls, probs)):
                if fail and n == 4:
                    raise RuntimeError("the model died half way")
                writer.write(cy, cx, c, p)
            assets = writer.finish()
        version = new_version()
        spec = PredictionItemSpec("pred", version, scene, record, tuple(assets), SETTINGS, "ef" * 32,
                                  tuple(writer.class_counts.tolist()))
        item = prediction_item_from_spec(spec)
        check_prediction_item(item)
        return derived.publish(lake, PREDICTIONS, "pred", staged, item, etag), item


def versions(lake: Any) -> list[str]:
    return sorted(lake.store.list_dirs(PREDICTIONS.key("pred", "v"))[0])


def staging_is_empty(lake: Any, tmp_path: Path) -> bool:
    folder = Path(str(lake.root)) / ".staging" if lake.is_local else tmp_path / "staging" / "cubelake-staging"
    return not folder.exists() or not any(folder.iterdir())


def test_publishing_is_atomic_conditional_and_prunes(lake: Any, tmp_path: Path, scene_lake: Path,
                                                     model_file: Path) -> None:
    scene = json.loads((scene_lake / "scenes" / SCENE / "item.json").read_text())
    record = ModelRecord.from_loaded(load_model(model_file))
    # a build that fails leaves nothing visible
    with pytest.raises(RuntimeError, match="died half way"):
        build(lake, scene, record, None, fail=True)
    assert derived.read_item(lake, PREDICTIONS, "pred") == (None, None)
    assert versions(lake) == []
    assert staging_is_empty(lake, tmp_path)
    # the first build: create-only
    url, first = build(lake, scene, record, None)
    item, etag = derived.read_item(lake, PREDICTIONS, "pred")
    assert item == first
    assert etag is not None
    assert url == lake.store.url_of("predictions/pred/item.json")
    assert derived.is_complete(lake, PREDICTIONS, "pred", item)
    v1 = first["properties"]["cubelake:version"]
    assert versions(lake) == [v1]
    for key in ("zarr", "classes", "probabilities"):
        href = first["assets"][key]["href"].removeprefix("./")
        probe = f"{href}/zarr.json" if key == "zarr" else href
        assert lake.store.exists(PREDICTIONS.key("pred", *probe.split("/")))
    # another build that read no item (it started before the first committed): refused, its upload removed
    with pytest.raises(CommitConflict, match="prediction pred was published by another build"):
        build(lake, scene, record, None)
    assert derived.read_item(lake, PREDICTIONS, "pred")[0] == first
    assert versions(lake) == [v1]
    # a replacement with a stale ETag: refused too
    with pytest.raises(CommitConflict):
        build(lake, scene, record, '"0123456789abcdef"')
    assert versions(lake) == [v1]
    # with the ETag read before the build: replaced; the old version goes (disk) or waits out the grace (S3)
    _, second = build(lake, scene, record, etag)
    v2 = second["properties"]["cubelake:version"]
    assert derived.read_item(lake, PREDICTIONS, "pred")[0] == second
    assert derived.is_complete(lake, PREDICTIONS, "pred", second)
    if lake.is_local:
        assert versions(lake) == [v2]
    else:
        assert versions(lake) == sorted([v1, v2])  # readers elsewhere may still read v1
        assert derived.prune_versions(lake, PREDICTIONS, "pred", keep=v2, grace=dt.timedelta(0)) == [v1]
        assert versions(lake) == [v2]
    assert staging_is_empty(lake, tmp_path)
    # listed and found by place and time
    assert [i["id"] for i in derived.list_items(lake, PREDICTIONS)] == ["pred"]
    listed = derived.list_items(lake, PREDICTIONS, absolute=True)[0]
    assert listed["assets"]["zarr"]["href"] == lake.store.url_of(f"predictions/pred/v/{v2}/pred.zarr")
    w, s, e, n = scene["bbox"]
    assert [i["id"] for i in derived.search_items(lake, PREDICTIONS, Query(bbox=(w, s, e, n)))] == ["pred"]
    assert derived.search_items(lake, PREDICTIONS, Query(bbox=(w + 1, s, e + 1, n))) == []
    assert [i["id"] for i in derived.search_items(lake, PREDICTIONS, Query(datetime="2022-07-24"))] == ["pred"]
    assert derived.search_items(lake, PREDICTIONS, Query(datetime="2023-01-01/2023-12-31")) == []
    # an item whose version is missing is not complete (a reader would find no files)
    gone = json.loads(json.dumps(second))
    gone["properties"]["cubelake:version"] = new_version()
    assert not derived.is_complete(lake, PREDICTIONS, "pred", gone)


def test_names_are_checked() -> None:
    with pytest.raises(derived.DerivedError, match=r"prediction name '\.\./x'"):
        derived.check_name(PREDICTIONS, "../x")
    assert derived.check_name(PREDICTIONS, "scene__model") == "scene__model"
    from cubelake.errors import LakeError
    from cubelake.lake import prediction_key

    assert prediction_key("a", "v", "b") == "predictions/a/v/b"
    with pytest.raises(LakeError, match="not a safe prediction name or key"):
        prediction_key("a/b")
