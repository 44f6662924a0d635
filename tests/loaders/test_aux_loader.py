"""Aux layers (``cubelake ingest --aux``) delivered by the loader next to ``image``: ``batch["aux"][name]``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from cubelake.ingest import AuxSpec, IngestOptions, ingest
from cubelake.lake import Lake
from cubelake.loaders import CubeDataset, PlanSpec, ProductError, Sampling, Spectral
from tests.ingest.test_align import CHUNK, classes_3857, dsm_4326, gdal_warp, write_scene

RAW = Spectral(normalize="none")


@pytest.fixture(scope="module")
def aux_lake(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("aux_lake")
    dsm, classes = dsm_4326(tmp / "dsm.tif"), classes_3857(tmp / "classes.tif")
    lake = Lake(tmp / "lake")
    (r,) = ingest([write_scene(tmp / "scene.tif")], lake, IngestOptions(chunk=CHUNK, products=("cog", "zarr", "refs")),
                  aux=[AuxSpec("dsm", dsm, resampling="bilinear"), AuxSpec("landcover", classes, kind="categorical")])
    assert r.scene_id is not None
    assert [a.aligned for a in r.aux] == [True, True], r.message
    expected = {"dsm": gdal_warp(dsm, tmp, "bilinear", "float32", float("nan"))[0],
                "landcover": gdal_warp(classes, tmp, "nearest", "uint16", 65535)[0].astype(np.float32)}
    expected["landcover"][expected["landcover"] == 65535] = np.nan  # the widened fill no class takes
    return {"scene": lake.scene_dir(r.scene_id), "expected": expected}


def _window(a: np.ndarray, row: int, col: int, h: int, w: int) -> np.ndarray:
    out = np.full((h, w), np.nan, np.float32)
    y0, y1, x0, x1 = max(row, 0), min(row + h, a.shape[0]), max(col, 0), min(col + w, a.shape[1])
    out[y0 - row:y1 - row, x0 - col:x1 - col] = a[y0:y1, x0:x1]
    return out


@pytest.mark.integration
@pytest.mark.parametrize(("kind", "workers"), [("zarr", 0), ("cog", 0), ("refs", 2)])
def test_aux_windows_equal_gdal_warp_of_the_layer(aux_lake: dict[str, Any], kind: str, workers: int) -> None:
    ds = CubeDataset([aux_lake["scene"]], sampling=Sampling(size=24, stride=20, edge="pad", labels="none"), spectral=RAW,
                     plan=PlanSpec(batch_size=16), prefer=(kind,), aux=["dsm", "landcover"])
    n = 0
    for b in DataLoader(ds, batch_size=None, num_workers=workers):
        assert set(b["aux"]) == {"dsm", "landcover"}
        for name in ("dsm", "landcover"):
            assert tuple(b["aux"][name].shape) == (len(b["scene"]), 1, 24, 24)
        for i, w in enumerate(b["window"].tolist()):
            for name, want in aux_lake["expected"].items():
                np.testing.assert_array_equal(b["aux"][name][i, 0].numpy(), _window(want, *w), err_msg=f"{name} {w}")
            n += 1
    assert n == ds.n_samples()
    if workers == 0:
        m = ds.metrics()
        assert m.redecodes == 0
        assert m.failed_chunks == 0


def test_an_aux_layer_the_scene_lacks_is_named(aux_lake: dict[str, Any], tmp_path: Path) -> None:
    for kind in ("zarr", "cog"):
        with pytest.raises(ProductError, match=r"no aux layer 'ndvi'|no array 'aux_ndvi'.*aux_dsm"):
            CubeDataset([aux_lake["scene"]], prefer=(kind,), aux=["ndvi"])
    with pytest.raises(ValueError, match="named twice"):
        CubeDataset([aux_lake["scene"]], aux=["dsm", "dsm"])
