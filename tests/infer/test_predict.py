"""Predictions in the lake, end to end: ``predict_scene`` / ``cubelake predict`` on real EnMAP tiles, the products
opened in a fresh process, the STAC item validated with lineage, reruns no-ops, found by catalog search, on disk
and on an S3 lake."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cubelake.catalog import LakeCatalog, Query
from cubelake.catalog.validate import validate_stac
from cubelake.infer import load_model
from cubelake.infer.blocks import PredictSettings, predict_blocks
from cubelake.infer.predict import predict_scene
from cubelake.ingest import IngestOptions, ingest
from cubelake.loaders.sources import open_source
from tests.conftest import REAL, S3Server, no_traceback, run_cli

SHARED_SCHEMAS = REAL.parent.parent / "schemas"
TILES = ("enmap_potsdam_tile_96_0", "enmap_potsdam_tile_128_0")


@pytest.fixture(scope="module")
def lake16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real EnMAP tiles as COG + Zarr with 16 px chunks (COG tiles), in a lake with a catalog."""
    lake = tmp_path_factory.mktemp("predict") / "lake"
    tifs = [REAL / "hsi_enmap_potsdam" / f"{t}.tif" for t in TILES]
    res = ingest(tifs, lake, IngestOptions(chunk=16, products=("cog", "zarr")))
    assert [r.outcome.value for r in res] == ["ingested", "ingested"], [r.message for r in res]
    return lake


def _expected(model_path: Path, lake: Path, scene: str, settings: PredictSettings) -> tuple[np.ndarray, np.ndarray]:
    model = load_model(model_path)
    src = open_source(lake / "scenes" / scene)
    g = src.grid
    cls = np.zeros((g.height, g.width), np.uint8)
    probs = np.zeros((model.spec.classes, g.height, g.width), np.float32)
    for b in predict_blocks(model, src, settings):
        y, x = b.cy * g.chunk_y, b.cx * g.chunk_x
        cls[y:y + b.classes.shape[0], x:x + b.classes.shape[1]] = b.classes
        probs[:, y:y + b.classes.shape[0], x:x + b.classes.shape[1]] = b.probs
    return cls, probs


_READ_BACK = """
import json, sys
import numpy as np, rasterio, xarray as xr, zarr
folder, name = sys.argv[1], sys.argv[2]
with rasterio.open(f"{folder}/{name}_classes.tif") as d:
    cls = d.read(1); crs = d.crs.to_wkt(); tr = list(d.transform)[:6]; nodata = d.nodata; tiles = d.block_shapes[0]
with rasterio.open(f"{folder}/{name}_probabilities.tif") as d:
    probs = d.read()
ds = xr.open_dataset(f"{folder}/{name}.zarr", engine="zarr")
z = zarr.open_group(f"{folder}/{name}.zarr", mode="r")
np.save(f"{folder}/cls.npy", cls); np.save(f"{folder}/probs.npy", probs)
np.save(f"{folder}/zcls.npy", ds["classes"].values); np.save(f"{folder}/zprobs.npy", z["probabilities"][:])
print(json.dumps({"crs": crs, "transform": tr, "nodata": nodata, "tiles": list(tiles),
                  "dims": list(ds["probabilities"].dims)}))
"""


def test_a_scene_predicted_into_the_lake(lake16: Path, models: dict[str, Path]) -> None:
    scene = TILES[0]
    res = predict_scene(lake16, scene, models["pixel3d"], PredictSettings(batch=256))
    assert res.status == "predicted"
    assert res.stats.chunks_decoded == 4
    assert res.stats.redecodes == 0
    item = json.loads(Path(res.item_url).read_text())
    folder = Path(res.item_url).parent / "v" / item["properties"]["cubelake:version"]
    out = subprocess.run([sys.executable, "-c", _READ_BACK, str(folder), res.name], capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    meta = json.loads(out.stdout)
    cls, probs = _expected(models["pixel3d"], lake16, scene, PredictSettings(batch=256))
    assert np.array_equal(np.load(folder / "cls.npy"), cls)
    assert np.array_equal(np.load(folder / "zcls.npy"), cls)
    assert np.array_equal(np.load(folder / "probs.npy"), probs)
    assert np.array_equal(np.load(folder / "zprobs.npy"), probs)
    src = open_source(lake16 / "scenes" / scene)
    assert meta["transform"] == pytest.approx(list(src.transform))
    assert meta["nodata"] == 255
    assert meta["tiles"] == [16, 16]
    assert meta["dims"] == ["class", "y", "x"]
    # the item: valid STAC 1.1 + mlm + processing, offline; lineage to the scene; the model and settings recorded
    assert validate_stac(item) == []
    props = item["properties"]
    assert props["mlm:name"] == "pixel3d"
    assert props["processing:level"] == "L4"
    assert props["cubelake:model_sha256"] == load_model(models["pixel3d"]).sha256
    assert props["cubelake:settings"]["halo"] == 2
    derived = [ln for ln in item["links"] if ln["rel"] == "derived_from"]
    assert [(Path(res.item_url).parent / ln["href"]).resolve() for ln in derived] == \
        [(lake16 / "scenes" / scene / "item.json").resolve()]
    scene_item = json.loads((lake16 / "scenes" / scene / "item.json").read_text())
    assert (item["bbox"], item["properties"]["datetime"]) == (scene_item["bbox"], scene_item["properties"]["datetime"])
    assert sum(props["cubelake:class_counts"]) == cls.size
    # searchable like any item
    with LakeCatalog(lake16) as cat:
        hits = cat.search(Query(bbox=tuple(scene_item["bbox"]), collections=["cubelake-predictions"]))
        assert [h.id for h in hits] == [res.name]
        assert cat.validate([SHARED_SCHEMAS]).to_dict()["invalid"] == []
        everything = cat.search(Query(bbox=tuple(scene_item["bbox"])))
    # a plain search finds the prediction too; the loader, given it, reads the scenes only
    assert res.name in [h.id for h in everything]
    from cubelake.loaders import CubeDataset

    ds = CubeDataset(everything, lake=lake16)
    assert sorted(s.scene_id for s in ds.sources) == sorted(h.id for h in everything if h.id != res.name)


def test_a_rerun_is_a_no_op_and_new_settings_make_a_new_version(lake16: Path, models: dict[str, Path]) -> None:
    scene = TILES[1]
    first = predict_scene(lake16, scene, models["seg"])
    item_path = Path(first.item_url)
    before = (item_path.read_bytes(), item_path.stat().st_mtime_ns)
    versions = sorted(p.name for p in (item_path.parent / "v").iterdir())
    again = predict_scene(lake16, scene, models["seg"])
    assert again.status == "up to date"
    assert (item_path.read_bytes(), item_path.stat().st_mtime_ns) == before
    assert sorted(p.name for p in (item_path.parent / "v").iterdir()) == versions
    other = predict_scene(lake16, scene, models["seg"], PredictSettings(blend="cosine", halo=6))
    assert other.status == "predicted"
    new = json.loads(item_path.read_text())
    assert new["properties"]["cubelake:settings"]["blend"] == "cosine"
    assert sorted(p.name for p in (item_path.parent / "v").iterdir()) == [new["properties"]["cubelake:version"]]
    assert new["properties"]["cubelake:version"] not in versions


def test_the_cli_predicts_scenes_chosen_by_search(lake16: Path, models: dict[str, Path], tmp_path: Path) -> None:
    res = run_cli("predict", "--lake", str(lake16), "--model", str(models["spectral1d"]), "--collection", "enmap-l2a",
                  "--outputs", "classes", "--format", "json")
    assert res.returncode == 0, no_traceback(res)
    results = json.loads(res.stdout)["results"]
    assert sorted(r["scene_id"] for r in results) == sorted(TILES)
    assert {r["status"] for r in results} == {"predicted"}
    text = run_cli("predict", "--lake", str(lake16), "--model", str(models["spectral1d"]), "--scene", TILES[0],
                   "--outputs", "classes")
    assert text.returncode == 0, no_traceback(text)
    assert f"{TILES[0]}: up to date" in text.stdout
    listed = run_cli("catalog", "search", "--lake", str(lake16), "--collection", "cubelake-predictions", "--format", "json")
    ids = sorted(f["id"] for f in json.loads(no_traceback(listed) and listed.stdout)["features"])
    assert f"{TILES[0]}__spectral1d" in ids
    assert f"{TILES[1]}__spectral1d" in ids
    # bad input: one line, no traceback, the right exit code
    junk = tmp_path / "junk.pt"
    junk.write_text("x")
    bad = run_cli("predict", "--lake", str(lake16), "--model", str(junk), "--scene", TILES[0])
    assert bad.returncode == 2
    assert "not a TorchScript or torch.export archive" in no_traceback(bad)
    missing = run_cli("predict", "--lake", str(lake16), "--model", str(models["seg"]), "--scene", "no_such_scene")
    assert missing.returncode == 1
    assert "no scene 'no_such_scene'" in no_traceback(missing)
    blend = run_cli("predict", "--lake", str(lake16), "--model", str(models["seg"]), "--scene", TILES[0], "--blend", "x")
    assert blend.returncode == 2
    assert "blend 'x'" in no_traceback(blend)
    small = run_cli("predict", "--lake", str(lake16), "--model", str(models["seg"]), "--scene", TILES[0],
                    "--halo", "1", "--strict-halo")
    assert small.returncode == 1
    assert "receptive field" in no_traceback(small)


@pytest.mark.s3
def test_an_s3_lake_gets_its_predictions_there(s3_server: S3Server, s3_bucket: str, tmp_path: Path,
                                               models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true", "CUBELAKE_CACHE": str(tmp_path / "cache"),
           "CUBELAKE_STAGING": str(tmp_path / "staging")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    url = f"s3://{s3_bucket}/lake"
    res = ingest([REAL / "hsi_enmap_potsdam" / f"{TILES[0]}.tif"], url, IngestOptions(chunk=16, products=("zarr",)))
    assert res[0].outcome.value == "ingested", res[0].message
    out = predict_scene(url, TILES[0], models["spectral1d"])
    assert out.status == "predicted"
    assert out.item_url == f"{url}/predictions/{TILES[0]}__spectral1d/item.json"
    assert predict_scene(url, TILES[0], models["spectral1d"]).status == "up to date"
    with LakeCatalog(url) as cat:
        assert [h.id for h in cat.search(Query(collections=["cubelake-predictions"]))] == [out.name]
        item = cat.get(out.name)
    assert validate_stac(item) == []
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_bucket, Prefix="lake/predictions/")["Contents"]]
    assert any(k.endswith("_classes.tif") for k in keys)
    assert any(k.endswith(".zarr/zarr.json") for k in keys)


def test_results_to_dict(lake16: Path, models: dict[str, Path]) -> None:
    predict_scene(lake16, TILES[0], models["pixel3d"], PredictSettings(batch=256))
    out: Any = predict_scene(lake16, TILES[0], models["pixel3d"], PredictSettings(batch=512)).to_dict()
    assert out["status"] == "up to date"  # the batch size does not change the values: not part of the identity
    assert out["name"] == f"{TILES[0]}__pixel3d"
    assert out["stats"]["halo"] == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_scene_predicted_on_cuda_matches_the_cpu(lake16: Path, models: dict[str, Path]) -> None:
    for name in ("pixel3d", "seg"):
        cpu_cls, cpu_probs = _expected(models[name], lake16, TILES[0], PredictSettings())
        gpu_cls, gpu_probs = _expected(models[name], lake16, TILES[0], PredictSettings(device="cuda"))
        assert np.array_equal(gpu_cls, cpu_cls)
        np.testing.assert_allclose(gpu_probs, cpu_probs, atol=1e-4)
        half_cls, _ = _expected(models[name], lake16, TILES[0], PredictSettings(device="cuda", dtype="bf16"))
        assert (half_cls == cpu_cls).mean() >= 0.95


def _tiled_enmap(folder: Path, nodata_chunk: bool = True) -> Path:
    """The real EnMAP tile repeated to 96 x 128 px (its tags, scales and nodata kept), the first 64 x 64 block nodata."""
    import rasterio

    src = REAL / "hsi_enmap_potsdam" / f"{TILES[0]}.tif"
    dst = folder / "enmap_potsdam_tile_big.tif"
    with rasterio.open(src) as d:
        prof, arr, tags = d.profile.copy(), d.read(), d.tags()
        band_tags = [d.tags(i) for i in range(1, d.count + 1)]
        desc, scales, offsets = d.descriptions, d.scales, d.offsets
    big = np.tile(arr, (1, 3, 4))
    if nodata_chunk:
        big[:, :64, :64] = prof["nodata"]
    prof.update(height=big.shape[1], width=big.shape[2])
    with rasterio.open(dst, "w", **prof) as out:
        out.write(big)
        out.update_tags(**tags)
        for i, t in enumerate(band_tags, 1):
            out.update_tags(i, **t)
        out.descriptions, out.scales, out.offsets = desc, scales, offsets
    return dst


@pytest.fixture(scope="module")
def big_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake of the tiled tile (COG + Zarr, 64 px chunks); its source file stays beside the lake."""
    folder = tmp_path_factory.mktemp("big")
    lake = folder / "lake"
    tif = _tiled_enmap(folder)
    res = ingest([tif], lake, IngestOptions(chunk=64, products=("cog", "zarr")))
    assert res[0].outcome.value == "ingested", res[0].message
    return lake


def test_nodata_chunks_and_every_product_kind(big_lake: Path, models: dict[str, Path]) -> None:
    """A chunk Zarr never stored (all nodata) comes out nodata (255 / NaN); the scene read from its COG gives
    the map its Zarr gives (CF scale from the scene record: the COG's references carry none)."""
    scene = "enmap_potsdam_tile_big"
    zarr_src = open_source(big_lake / "scenes" / scene, prefer=("zarr",))
    cog_src = open_source(big_lake / "scenes" / scene, prefer=("cog",))
    assert (cog_src.kind, cog_src.scale, cog_src.add_offset) == ("cog", zarr_src.scale, zarr_src.add_offset)
    assert zarr_src.valid_chunks() is not None
    assert not zarr_src.valid_chunks()[0, 0]
    for name in ("pixel3d", "seg"):
        maps = []
        for src in (zarr_src, cog_src):
            model = load_model(models[name])
            cls = np.zeros((96, 128), np.uint8)
            probs = np.zeros((model.spec.classes, 96, 128), np.float32)
            for b in predict_blocks(model, src, PredictSettings()):
                y, x = b.cy * 64, b.cx * 64
                cls[y:y + b.classes.shape[0], x:x + b.classes.shape[1]] = b.classes
                probs[:, y:y + b.classes.shape[0], x:x + b.classes.shape[1]] = b.probs
            maps.append((cls, probs))
        (zc, zp), (cc, cp) = maps
        assert (zc[:64, :64] == 255).all()
        assert np.isnan(zp[:, :64, :64]).all()
        assert (zc[64:] != 255).all()
        assert np.isfinite(zp[:, 64:]).all()
        assert np.array_equal(zc, cc)
        np.testing.assert_allclose(zp, cp, atol=1e-6)


def test_what_changes_the_values_changes_the_hash(big_lake: Path, models: dict[str, Path]) -> None:
    """A new preprocessing or spec re-predicts; settings that cannot change a per-pixel model's values do not;
    the same file re-ingested on another grid re-predicts."""
    import json as _json

    from cubelake.infer import ModelSpec, Preprocessing

    scene = "enmap_potsdam_tile_big"
    assert predict_scene(big_lake, scene, models["spectral1d"]).status == "predicted"
    assert predict_scene(big_lake, scene, models["spectral1d"], PredictSettings(blend="mean", tile_chunks=2)).status \
        == "up to date"
    raw = PredictSettings(preprocessing=Preprocessing(normalize="none"))
    redo = predict_scene(big_lake, scene, models["spectral1d"], raw)
    assert redo.status == "predicted"
    item = _json.loads(Path(redo.item_url).read_text())
    assert "in physical values" in item["properties"]["mlm:input"][0]["description"]  # what ran, not the file's
    spec = load_model(models["spectral1d"]).spec
    as_probs = load_model(models["spectral1d"], ModelSpec.from_dict({**spec.to_dict(), "output": "probabilities"}))
    assert predict_scene(big_lake, scene, as_probs, raw).status == "predicted"
    assert predict_scene(big_lake, scene, as_probs, raw).status == "up to date"
    # the scene re-ingested in place (force) with other chunks: a new grid, a new prediction
    tif = big_lake.parent / "enmap_potsdam_tile_big.tif"
    res = ingest([tif], big_lake, IngestOptions(chunk=32, products=("zarr",), force=True))
    assert res[0].outcome.value == "ingested", res[0].message
    assert open_source(big_lake / "scenes" / scene).grid.chunk_y == 32
    again = predict_scene(big_lake, scene, as_probs, raw)
    assert again.status == "predicted"
    assert again.stats.tiles == 12


def test_a_dilated_model_s_receptive_field_is_measured(tmp_path: Path) -> None:
    from cubelake.infer import ModelSpec, measure_receptive_field, save_model

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=40, dilation=40), torch.nn.ReLU(),
                              torch.nn.Conv2d(4, 2, 3, padding=40, dilation=40))
    path = save_model(net, tmp_path / "dilated.pt2", ModelSpec(name="dilated", kind="dense", layout="BCHW", bands=3,
                                                               classes=2, patch=0), format="export")
    assert measure_receptive_field(load_model(path)) == 80
