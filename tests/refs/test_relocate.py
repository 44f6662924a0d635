"""A lake survives ``cp -r`` and ``mv``: its references name the scene's COG relative to the set.

A copy gets new mtimes; the recorded size and content fingerprint, not the mtime, decide
whether a target changed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cubelake.errors import StaleReferenceError
from cubelake.ingest import IngestOptions, ingest
from cubelake.ingest.pipeline import Outcome
from cubelake.loaders.sources import open_source
from cubelake.refs import build_refs, load_refs, open_array, open_dataset, write_refs
from cubelake.refs.combine import combine_refs
from tests.conftest import REAL, hsi_cube


@pytest.fixture
def ingested(tmp_path: Path, geotiff) -> tuple[Path, list[str], dict[str, np.ndarray]]:
    """A lake with a striped synthetic scene and a real EnMAP tile, ingested with cog,zarr,refs."""
    src = geotiff("striped.tif", hsi_cube(4, 150, 170), tiled=False, compress="deflate")
    lake = tmp_path / "lake"
    results = ingest([src, REAL / "hsi_enmap_potsdam" / "enmap_potsdam_tile_96_0.tif"], lake,
                     IngestOptions(products=("cog", "zarr", "refs"), chunk=64))
    assert [r.outcome for r in results] == [Outcome.INGESTED] * 2, [r.message for r in results]
    ids = [r.scene_id for r in results]
    values = {sid: open_dataset(_refs(lake, sid))["data"].values for sid in ids}
    return lake, ids, values


def _refs(lake: Path, sid: str) -> Path:
    return lake / "scenes" / sid / f"{sid}.refs.json"


def test_the_ingest_names_its_cog_relative_to_the_refs(ingested) -> None:
    lake, ids, _ = ingested
    for sid in ids:
        doc = json.loads(_refs(lake, sid).read_text())
        assert doc["templates"] == {"t0": f"{sid}.tif"}
        (t,) = json.loads(doc["refs"][".zattrs"])["cubelake:targets"]
        assert t["url"] == f"{sid}.tif"
        assert t["fingerprint"].startswith("blake3-ends64k:")
        assert t["size"] == (lake / "scenes" / sid / f"{sid}.tif").stat().st_size


def test_a_copied_lake_with_new_mtimes_reads_the_same_pixels(ingested, tmp_path: Path) -> None:
    lake, ids, values = ingested
    copy = tmp_path / "copy"
    shutil.copytree(lake, copy, copy_function=shutil.copy)  # shutil.copy does not keep mtimes
    for sid in ids:
        cog = Path("scenes", sid, f"{sid}.tif")
        assert (copy / cog).stat().st_mtime_ns != (lake / cog).stat().st_mtime_ns
        ds = open_dataset(_refs(copy, sid))
        np.testing.assert_array_equal(ds["data"].values, values[sid])
        store = open_array(_refs(copy, sid)).store
        assert {t.url for t in store.refs.targets} == {str((copy / cog).resolve())}  # the copy's, not the original's
        src, orig = open_source(copy / "scenes" / sid, prefer=("refs",)), open_source(lake / "scenes" / sid, prefer=("refs",))
        assert src.version == orig.version  # the loader's disk cache does not depend on where or when
        assert src.url != orig.url


def test_a_moved_lake_reads_the_same_pixels_and_checks_ok(ingested, tmp_path: Path) -> None:
    lake, ids, values = ingested
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    os.rename(lake, moved)
    assert not lake.exists()
    for sid in ids:
        np.testing.assert_array_equal(open_dataset(_refs(moved, sid), lake=moved)["data"].values, values[sid])
    run = subprocess.run([sys.executable, "-m", "cubelake.cli", "refs", "check", str(_refs(moved, ids[0]))],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "unchanged and allowed" in run.stdout


def test_same_size_content_change_in_a_copy_is_stale(ingested, tmp_path: Path) -> None:
    lake, ids, _ = ingested
    copy = tmp_path / "copy"
    shutil.copytree(lake, copy, copy_function=shutil.copy)
    sid = ids[1]
    cog = copy / "scenes" / sid / f"{sid}.tif"
    raw = bytearray(cog.read_bytes())
    size = len(raw)
    raw[-200:] = bytes(b ^ 0xFF for b in raw[-200:])  # same size, other content
    cog.write_bytes(bytes(raw))
    assert cog.stat().st_size == size
    with pytest.raises(StaleReferenceError, match="content differs from the recorded fingerprint") as info:
        open_array(_refs(copy, sid))
    assert str(cog) in str(info.value)
    run = subprocess.run([sys.executable, "-m", "cubelake.cli", "refs", "check", str(_refs(copy, sid))],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert "changed since its references were made" in run.stderr
    assert "Traceback" not in run.stderr
    # the untouched scene of the same copy still opens
    assert open_array(_refs(copy, ids[0])).shape[0] == 4


def test_old_sets_with_absolute_targets_and_mtime_only_still_open(tmp_path: Path, geotiff) -> None:
    data = hsi_cube(3, 128, 128)
    src = geotiff("t.tif", data, tiled=True, blockxsize=64, blockysize=64, compress="zstd")
    refs = build_refs(str(src))
    refs.targets[0] = dataclasses.replace(refs.targets[0], fingerprint=None)  # as cubelake wrote them before
    refs.consolidate()
    old = write_refs(refs, tmp_path / "old.json", relative=False)
    doc = json.loads(old.read_text())
    assert doc["templates"]["t0"] == str(src.resolve())
    assert "fingerprint" not in json.loads(doc["refs"][".zattrs"])["cubelake:targets"][0]
    np.testing.assert_array_equal(open_array(old)[:], data)
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # without a fingerprint the mtime still decides
    with pytest.raises(StaleReferenceError, match="modification time differs"):
        open_array(old)


def test_combine_writes_targets_relative_to_its_output_when_under_its_folder(tmp_path: Path, geotiff) -> None:
    cubes = [hsi_cube(2, 64, 64, seed=s) for s in range(2)]
    sets = []
    for i, c in enumerate(cubes):
        tif = geotiff(f"s{i}.tif", c, tiled=True, blockxsize=64, blockysize=64, compress="zstd")
        sets.append(write_refs(build_refs(str(tif)), tmp_path / f"s{i}.json"))
    inside = write_refs(combine_refs(sets, dim="scene"), tmp_path / "cube.json")
    assert json.loads(inside.read_text())["templates"] == {"t0": "s0.tif", "t1": "s1.tif"}
    outside_dir = tmp_path.parent / f"{tmp_path.name}-out"
    outside_dir.mkdir()
    outside = write_refs(combine_refs(sets, dim="scene"), outside_dir / "cube.json")
    assert json.loads(outside.read_text())["templates"] == {"t0": str((tmp_path / "s0.tif").resolve()),
                                                            "t1": str((tmp_path / "s1.tif").resolve())}
    moved = tmp_path.parent / f"{tmp_path.name}-moved"
    shutil.copytree(tmp_path, moved, copy_function=shutil.copy)
    np.testing.assert_array_equal(open_dataset(moved / "cube.json")["data"].values, np.stack(cubes))
    assert load_refs(moved / "cube.json").urls == [str(moved / "s0.tif"), str(moved / "s1.tif")]
