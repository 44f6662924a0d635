"""Lakes for the loader tests: two synthetic scenes (cog + zarr + refs) and the real EnMAP tiles with labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cubelake.ingest import IngestOptions, ingest
from tests.conftest import REAL, S3Server, hsi_cube, write_geotiff

NODATA = -9999
TAGS = [{"wavelength": str(400 + 20 * i), "fwhm": "10", "wavelength_units": "nm"} for i in range(24)]


@pytest.fixture(scope="session")
def synth_lake(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Scenes ``a`` (300x260, a nodata corner and an all-nodata chunk) and ``b`` (200x330), 24 bands, chunk 64."""
    root = tmp_path_factory.mktemp("loader_lake")
    src = root / "src"
    src.mkdir()
    a = hsi_cube(24, 300, 260, seed=3)
    a[:, :40, :50] = NODATA
    a[:, 64:128, 128:192] = NODATA  # one whole chunk of nodata: zarr stores nothing for it
    b = hsi_cube(24, 200, 330, seed=4)
    write_geotiff(src / "scene_a.tif", a, nodata=NODATA, band_tags=TAGS)
    write_geotiff(src / "scene_b.tif", b, nodata=NODATA, band_tags=TAGS)
    lake = root / "lake"
    res = ingest([src], lake, IngestOptions(chunk=64, products=("cog", "zarr", "refs")))
    assert [r.outcome.value for r in res] == ["ingested", "ingested"], [r.message for r in res]
    return {"lake": lake, "a": a, "b": b, "scenes": [lake / "scenes" / "scene_a", lake / "scenes" / "scene_b"]}


@pytest.fixture(scope="session")
def enmap_lake(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The four real EnMAP L2A tiles, each ingested with its label tile (chunk 16)."""
    lake = tmp_path_factory.mktemp("enmap_lake") / "lake"
    folder = REAL / "hsi_enmap_potsdam"
    scenes = []
    for tif in sorted(folder.glob("enmap_potsdam_tile_*.tif")):
        res = ingest([tif], lake, IngestOptions(chunk=16, products=("cog", "zarr")), labels=folder / "labels" / tif.name)
        assert res[0].outcome.value == "ingested", res[0].message
        scenes.append(lake / "scenes" / tif.stem)
    return {"lake": lake, "scenes": scenes, "folder": folder}


def expected_window(cube: np.ndarray, row: int, col: int, h: int, w: int, fill: float = 0.0) -> np.ndarray:
    """The window of ``cube (band, y, x)`` as the loader gives it with normalize='none': nodata and outside = fill."""
    out = np.full((cube.shape[0], h, w), fill, np.float32)
    y0, y1 = max(row, 0), min(row + h, cube.shape[1])
    x0, x1 = max(col, 0), min(col + w, cube.shape[2])
    part = cube[:, y0:y1, x0:x1].astype(np.float32)
    part[cube[:, y0:y1, x0:x1] == NODATA] = fill
    out[:, y0 - row:y1 - row, x0 - col:x1 - col] = part
    return out



def upload_tiled_tif(path: Path, server: S3Server, bucket: str, shape: tuple[int, int, int], block: int,
                     seed: int) -> str:
    """A pixel-interleaved int16 GeoTIFF of ``shape (bands, y, x)`` tiled ``block``², uploaded; its ``s3://`` URL."""
    bands, h, w = shape
    write_geotiff(path, hsi_cube(bands, h, w, seed=seed), tiled=True, blockxsize=block, blockysize=block,
                  interleave="pixel")
    server.client().upload_file(str(path), bucket, path.name)
    return f"s3://{bucket}/{path.name}"
