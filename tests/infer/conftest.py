"""Small real models (defined here, saved with cubelake's spec) and a real EnMAP scene in a lake, for the inference tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from cubelake.infer import ModelSpec, Preprocessing, save_model
from cubelake.ingest import IngestOptions, ingest
from cubelake.loaders.sources import open_source
from tests.conftest import REAL

SCENE = "enmap_potsdam_tile_96_0"
TIF = REAL / "hsi_enmap_potsdam" / f"{SCENE}.tif"


class Pixel3D(torch.nn.Module):
    """A 3-D CNN over a patch (1, bands, p, p): spectral-spatial kernels, then a linear classifier (the seed's kind)."""

    def __init__(self, classes: int = 5) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv3d(1, 4, (7, 3, 3))
        self.c2 = torch.nn.Conv3d(4, 4, (5, 3, 3))
        self.fc = torch.nn.Linear(4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c2(torch.relu(self.c1(x))))
        return self.fc(x.mean(dim=(2, 3, 4)))


class Spectral1D(torch.nn.Module):
    """A 1-D CNN over one pixel's spectrum (1, bands)."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.c = torch.nn.Conv1d(1, 6, 9, stride=2)
        self.fc = torch.nn.Linear(6, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.c(x)).amax(dim=2))


class Seg2D(torch.nn.Module):
    """A dense segmentation net: 3x3, 3x3, 5x5 convolutions (receptive-field radius 1 + 1 + 2 = 4)."""

    def __init__(self, bands: int, classes: int = 4) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(bands, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.c = torch.nn.Conv2d(8, classes, 5, padding=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


SEG_RF = 4


@pytest.fixture(scope="session")
def enmap_scene(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A real EnMAP L2A tile (32 x 32 px) ingested as Zarr with 8 px chunks (4 x 4 chunks), and its values."""
    root = tmp_path_factory.mktemp("infer")
    lake = root / "lake"
    res = ingest([TIF], lake, IngestOptions(chunk=8, products=("zarr",)))
    assert res[0].outcome.value == "ingested", res[0].message
    src = open_source(lake / "scenes" / SCENE)
    raw = zarr.open_group(str(src.url), mode="r")["data"][:]
    phys = raw.astype(np.float32) * np.float32(src.scale) + np.float32(src.add_offset)
    if src.fill_value is not None:
        phys[raw == src.fill_value] = np.nan
    mean = np.nanmean(phys, axis=(1, 2))
    std = np.nanstd(phys, axis=(1, 2))
    pre = Preprocessing(normalize="fixed", mean=tuple(map(float, mean)), std=tuple(map(float, std)))
    norm = (phys - mean[:, None, None]) / std[:, None, None]
    norm[np.isnan(phys)] = 0.0
    return {"lake": lake, "root": root, "src": src, "phys": phys, "pre": pre, "norm": norm.astype(np.float32)}


@pytest.fixture(scope="session")
def models(enmap_scene: dict[str, object], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The three test models, saved with their spec (the scene's normalisation inside)."""
    folder = tmp_path_factory.mktemp("models")
    pre = enmap_scene["pre"]
    bands = int(np.asarray(enmap_scene["phys"]).shape[0])
    torch.manual_seed(0)
    out = {
        "pixel3d": save_model(Pixel3D().eval(), folder / "pixel3d.pt", ModelSpec(
            name="pixel3d", kind="pixel", layout="B1CHW", bands=bands, classes=5, patch=5, preprocessing=pre)),  # type: ignore[arg-type]
        "spectral1d": save_model(Spectral1D().eval(), folder / "spectral1d.pt", ModelSpec(
            name="spectral1d", kind="pixel", layout="B1C", bands=bands, classes=4, patch=1, preprocessing=pre)),  # type: ignore[arg-type]
        "seg": save_model(Seg2D(bands).eval(), folder / "seg.pt2", ModelSpec(
            name="seg", kind="dense", layout="BCHW", bands=bands, classes=4, patch=0, preprocessing=pre),  # type: ignore[arg-type]
            format="export"),
    }
    return out
