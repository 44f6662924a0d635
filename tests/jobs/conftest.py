"""Fixtures for the job tests: scenes on one grid, manifests, and a real Dask cluster on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
import yaml
from affine import Affine

from tests.conftest import hsi_cube

DASK = str(Path(sys.executable).with_name("dask"))


def write_scene(path: Path, seed: int, *, bands: int = 24, size: int = 128, when: str | None = None) -> Path:
    """A tiled GeoTIFF with wavelengths, on the same grid as every other scene written here."""
    data = hsi_cube(bands, size, size, "int16", seed=seed)
    profile: dict[str, Any] = {"driver": "GTiff", "width": size, "height": size, "count": bands, "dtype": "int16",
                               "crs": "EPSG:32633", "transform": Affine(30.0, 0.0, 500000.0, 0.0, -30.0, 5800000.0),
                               "tiled": True, "blockxsize": 64, "blockysize": 64}
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data)
        for b in range(1, bands + 1):
            dst.update_tags(b, wavelength=str(400 + 20 * b), wavelength_units="nm")
        dst.update_tags(TIFFTAG_DATETIME=when or f"2024:06:{1 + seed % 28:02d} 10:00:00")
    return path


@pytest.fixture
def scenes(tmp_path: Path) -> Path:
    """Six small scenes on one grid, one acquisition day each, in ``tmp/in``."""
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(6):
        write_scene(folder / f"scene_{i}.tif", i)
    return folder


def write_manifest(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture
def manifest(tmp_path: Path, scenes: Path) -> Callable[..., Path]:
    """Factory: a manifest over ``scenes`` into ``tmp/lake``; keyword arguments replace top-level fields."""
    def make(file: str = "job.yaml", **over: Any) -> Path:
        doc: dict[str, Any] = {"version": 1, "name": "nightly", "lake": str(tmp_path / "lake"),
                               "inputs": [str(scenes / "*.tif")],
                               "steps": {"ingest": {"products": ["cog", "zarr", "refs"], "chunk": 64}},
                               "resources": {"workers": 2, "memory_per_task": "2GiB", "retries": 2}}
        doc.update(over)
        return write_manifest(tmp_path / file, doc)

    return make


@dataclass
class DaskCluster:
    """A real ``dask scheduler`` and ``dask worker`` processes on 127.0.0.1."""

    address: str
    scheduler: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def idle(self, timeout: float = 120) -> None:
        """Wait until no task is running or queued (tasks of killed clients run to their end)."""
        from distributed import Client

        with Client(self.address, timeout="10s", set_as_default=False) as c:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if not any(c.processing().values()) and not c.run_on_scheduler(
                        lambda dask_scheduler: len(dask_scheduler.tasks)):
                    return
                time.sleep(0.2)
        raise AssertionError("the cluster did not become idle")


def _wait_workers(address: str, n: int, timeout: float = 60) -> None:
    from distributed import Client

    with Client(address, timeout="20s", set_as_default=False) as c:
        c.wait_for_workers(n, timeout=timeout)


def start_cluster(folder: Path, worker_envs: list[dict[str, str]]) -> DaskCluster:
    """``dask scheduler`` on a free port, then one ``dask worker`` (no nanny, one thread) per entry of
    ``worker_envs`` (extra environment of that worker)."""
    folder.mkdir(parents=True, exist_ok=True)
    sched_file = folder / "scheduler.json"
    log = open(folder / "scheduler.log", "wb")  # noqa: SIM115 - lives as long as the process
    sched = subprocess.Popen([DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
                              "--scheduler-file", str(sched_file)], stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    while not sched_file.is_file() and time.monotonic() < deadline:
        assert sched.poll() is None, (folder / "scheduler.log").read_text()
        time.sleep(0.1)
    address = json.loads(sched_file.read_text())["address"]
    cluster = DaskCluster(address, sched)
    for i, extra in enumerate(worker_envs):
        wlog = open(folder / f"worker{i}.log", "wb")  # noqa: SIM115
        cluster.workers.append(subprocess.Popen(
            [DASK, "worker", address, "--nthreads", "1", "--no-nanny", "--name", f"w{i}", "--memory-limit", "4GiB",
             "--resources", f"MEMORY={4 * 1024**3}"], stdout=wlog, stderr=wlog, env={**os.environ, **extra}))
    _wait_workers(address, len(worker_envs))
    return cluster


def stop_cluster(cluster: DaskCluster) -> None:
    for p in [*cluster.workers, cluster.scheduler]:
        if p.poll() is None:
            p.terminate()
    for p in [*cluster.workers, cluster.scheduler]:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaskCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("dask"), [{}, {}])
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


def lake_state(lake: Path) -> dict[str, tuple[str | None, str | None, list[str]]]:
    """scene id -> (content hash, config hash, products) of every published scene."""
    out = {}
    for rec in sorted((lake / "scenes").glob("*/scene.json")):
        doc = json.loads(rec.read_text())
        out[doc["scene_id"]] = (doc["source"].get("content_hash"), doc.get("config_hash"), sorted(doc["products"]))
    return out


def scene_mtimes(lake: Path) -> dict[str, int]:
    return {p.parent.name: p.stat().st_mtime_ns for p in (lake / "scenes").glob("*/scene.json")}


def check_scene_complete(folder: Path) -> None:
    """A published scene opens: its record, its COG through GDAL, its Zarr through zarr."""
    import zarr

    doc = json.loads((folder / "scene.json").read_text())
    with rasterio.open(folder / doc["products"]["cog"]["path"]) as src:
        assert src.read(1).shape == (src.height, src.width)
    z = zarr.open_group(str(folder / doc["products"]["zarr"]["path"]), mode="r")
    arr = z["data"]
    assert np.asarray(arr[0, :8, :8]).shape == (8, 8)
