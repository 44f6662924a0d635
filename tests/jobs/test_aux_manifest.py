"""Aux layers in job manifests: ``steps.ingest.aux`` (and per input), checked on load, passed to the ingest,
part of the ledger's settings hash, and a changed aux raster redoes its scenes."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
import zarr
from rasterio.transform import from_origin
from rasterio.warp import transform_bounds

from cubelake.errors import ConfigError
from cubelake.jobs import load_manifest
from cubelake.jobs.inputs import settings_hash
from cubelake.jobs.tasks import aux_files, ingest_options
from cubelake.record import SCENE_RECORD_FILE, read_scene_record
from tests.conftest import no_traceback, run_cli

from .conftest import DaskCluster, write_scene

SIZE = 128
SCENE_BOUNDS = (500000.0, 5800000.0 - SIZE * 30, 500000.0 + SIZE * 30, 5800000.0)


def write_dsm(path: Path, offset: float = 0.0, when: str | None = None) -> Path:
    """A float32 DSM in EPSG:4326 over the west half of the job scenes' grid (nodata -9999)."""
    left, bottom, right, top = transform_bounds("EPSG:32633", "EPSG:4326", *SCENE_BOUNDS)
    res = 0.0005
    w, h = int(((left + right) / 2 - left + 0.004) / res), int((top - bottom + 0.008) / res)
    dem = (200 + offset + np.add.outer(np.arange(h), np.arange(w)))[None].astype("float32")
    with rasterio.open(path, "w", driver="GTiff", width=w, height=h, count=1, dtype="float32", crs="EPSG:4326",
                       transform=from_origin(left - 0.004, top + 0.004, res, res), nodata=-9999.0) as ds:
        ds.write(dem)
        if when:
            ds.update_tags(ACQUISITION_DATETIME=when)
    return path


@pytest.fixture
def dsm(tmp_path: Path) -> Path:
    """``tmp/aux/dsm.tif``, beside the manifests (``tmp/job.yaml``) so a manifest names it ``aux/dsm.tif``."""
    (tmp_path / "aux").mkdir()
    return write_dsm(tmp_path / "aux" / "dsm.tif")


def _aux_manifest(manifest: Callable[..., Path], aux: list[dict[str, Any]], file: str = "job.yaml",
                  **over: Any) -> Path:
    steps = {"ingest": {"products": ["cog", "zarr"], "chunk": 64, "aux": aux}}
    return manifest(file, steps=steps, **over)


# -- loading ---------------------------------------------------------------------------------------
def test_aux_entries_load_resolved_and_reach_the_ingest_options(manifest: Callable[..., Path], dsm: Path,
                                                                tmp_path: Path) -> None:
    path = _aux_manifest(manifest, [{"name": "dsm", "path": "aux/dsm.tif", "max_time_delta": "3d"},
                                    {"name": "lc", "path": "aux/*.tif", "kind": "categorical"}])
    m = load_manifest(path)
    dsm_entry, lc_entry = m.steps.ingest.aux or ()
    assert dsm_entry.path == str(dsm)  # relative to the manifest's folder, not the working directory
    assert lc_entry.path == str(tmp_path / "aux" / "*.tif")  # a pattern stays a pattern
    assert dsm_entry.max_time_delta == 3 * 86400
    options = ingest_options(m.settings_for(m.inputs[0]), 1)
    spec_dsm, spec_lc = options.aux
    assert (spec_dsm.name, str(spec_dsm.path), spec_dsm.kind, spec_dsm.method) == ("dsm", str(dsm), "continuous",
                                                                                   "bilinear")
    assert spec_dsm.max_time_delta == timedelta(days=3)
    assert (spec_lc.kind, spec_lc.method, spec_lc.max_time_delta, spec_lc.several) == \
        ("categorical", "nearest", None, True)


def test_an_input_replaces_the_jobs_aux_list(manifest: Callable[..., Path], scenes: Path, dsm: Path) -> None:
    path = manifest(inputs=[str(scenes / "scene_0.tif"),
                            {"path": str(scenes / "scene_1.tif"), "ingest": {"aux": []}},
                            {"path": str(scenes / "scene_2.tif"),
                             "ingest": {"aux": [{"name": "height", "path": "aux/dsm.tif", "resampling": "cubic"}]}}],
                    steps={"ingest": {"aux": [{"name": "dsm", "path": str(dsm)}]}})
    m = load_manifest(path)
    names = [[a.name for a in m.settings_for(spec).aux or ()] for spec in m.inputs]
    assert names == [["dsm"], [], ["height"]]
    third = (m.settings_for(m.inputs[2]).aux or ())[0]
    assert (third.path, third.resampling) == (str(dsm), "cubic")  # an input's paths resolve like the job's


def test_the_settings_hash_follows_the_aux_settings(manifest: Callable[..., Path], dsm: Path,
                                                    tmp_path: Path) -> None:
    other = write_dsm(tmp_path / "aux" / "other.tif")
    base = {"name": "dsm", "path": "aux/dsm.tif"}
    variants = [[], [base], [{**base, "resampling": "cubic"}], [{**base, "max_time_delta": "2d"}],
                [{**base, "max_time_delta": "3d"}], [{**base, "path": "aux/other.tif"}], [{**base, "name": "dem"}],
                [{**base, "kind": "categorical"}], [base, {"name": "dem", "path": str(other)}]]
    hashes = []
    for i, aux in enumerate(variants):
        m = load_manifest(_aux_manifest(manifest, aux, file=f"v{i}.yaml"))
        hashes.append(settings_hash(m.settings_for(m.inputs[0])))
    assert len(set(hashes)) == len(variants), hashes
    # a job without aux layers hashes as before they existed: its ledger does not redo every scene
    plain = load_manifest(manifest("plain.yaml"))
    assert "aux" not in plain.settings_for(plain.inputs[0]).model_dump(mode="json")
    # the same layer written as an absolute path, from another folder: the same settings
    (tmp_path / "elsewhere").mkdir()
    same = load_manifest(_aux_manifest(manifest, [{"name": "dsm", "path": str(dsm)}], file="elsewhere/j.yaml"))
    assert settings_hash(same.settings_for(same.inputs[0])) == hashes[1]


BAD_AUX: list[tuple[Any, str]] = [
    ([{"name": "DSM", "path": "aux/dsm.tif"}], "steps.ingest.aux[0].name: 'DSM': an aux name is 1-32 characters"),
    ([{"name": "data", "path": "aux/dsm.tif"}], "steps.ingest.aux[0].name: 'data' is reserved"),
    ([{"path": "aux/dsm.tif"}], "steps.ingest.aux[0].name: Field required"),
    ([{"name": "dsm", "path": ""}], "steps.ingest.aux[0].path: empty path"),
    ([{"name": "dsm", "path": "aux/dsm.tif", "resampling": "lanczos"}],
     "steps.ingest.aux[0].resampling: Input should be 'nearest', 'bilinear' or 'cubic'"),
    ([{"name": "dsm", "path": "aux/dsm.tif", "kind": "classes"}],
     "steps.ingest.aux[0].kind: Input should be 'continuous' or 'categorical'"),
    ([{"name": "lc", "path": "aux/dsm.tif", "kind": "categorical", "resampling": "bilinear"}],
     "steps.ingest.aux[0]: aux 'lc': a categorical layer is resampled with nearest"),
    ([{"name": "dsm", "path": "aux/dsm.tif", "max_time_delta": "soon"}],
     "steps.ingest.aux[0].max_time_delta: 'soon' is not a duration"),
    ([{"name": "dsm", "path": "aux/dsm.tif", "max_time_delta": -1}],
     "steps.ingest.aux[0].max_time_delta: -1 is not a duration"),
    ([{"name": "dsm", "path": "aux/dsm.tif", "resample": "cubic"}], "steps.ingest.aux[0].resample: unknown field"),
    ([{"name": "dsm", "path": "aux/dsm.tif"}, {"name": "dsm", "path": "aux/dsm.tif"}],
     "steps.ingest.aux: aux name(s) dsm given more than once"),
    ("aux/dsm.tif", "steps.ingest.aux: Input should be a valid tuple"),
    ([{"name": "dsm", "path": "aux/nowhere.tif"}], "steps.ingest.aux[0].path: {tmp}/aux/nowhere.tif does not exist"),
    ([{"name": "dsm", "path": "s3://bucket/dsm.tif"}],
     "steps.ingest.aux[0].path: s3://bucket/dsm.tif: aux rasters are read from local files"),
    ([{"name": "dsm", "path": "${NO_SUCH_AUX_VAR}/dsm.tif"}],
     "steps.ingest.aux[0].path: environment variable NO_SUCH_AUX_VAR is not set"),
]


@pytest.mark.parametrize(("aux", "expected"), BAD_AUX)
def test_a_bad_aux_entry_names_the_file_and_the_field(manifest: Callable[..., Path], dsm: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch, aux: Any,
                                                      expected: str) -> None:
    monkeypatch.delenv("NO_SUCH_AUX_VAR", raising=False)
    path = _aux_manifest(manifest, aux)
    with pytest.raises(ConfigError) as err:
        load_manifest(path)
    text = str(err.value).replace("Value error, ", "")
    assert str(path) in text
    assert expected.format(tmp=tmp_path) in text, text


def test_a_bad_aux_entry_of_an_input_names_the_input(manifest: Callable[..., Path], scenes: Path,
                                                     dsm: Path) -> None:
    path = manifest(inputs=[str(scenes / "scene_0.tif"),
                            {"path": str(scenes / "scene_1.tif"), "ingest": {"aux": [{"name": "x", "path": "no.tif"}]}}])
    with pytest.raises(ConfigError, match=r"inputs\[1\]\.ingest\.aux\[0\]\.path: .*no\.tif does not exist"):
        load_manifest(path)


def test_jobs_run_exits_2_on_a_bad_aux_entry(manifest: Callable[..., Path], dsm: Path, tmp_path: Path) -> None:
    path = _aux_manifest(manifest, [{"name": "dsm", "path": "aux/dsm.tif", "resampling": "lanczos"}])
    res = run_cli("jobs", "run", str(path), timeout=120)
    out = no_traceback(res)
    assert res.returncode == 2, out
    assert str(path) in out, out
    assert "steps.ingest.aux[0].resampling" in out, out
    assert not (tmp_path / "lake").exists()  # nothing was started or written


# -- running (on the module's real Dask cluster: no LocalCluster start per run) -----------------------
def _scene(folder: Path) -> Path:
    """One job scene with a known acquisition time (2024-06-10 10:00 UTC)."""
    folder.mkdir()
    path = write_scene(folder / "scene_a.tif", 3, bands=6)
    with rasterio.open(path, "r+") as ds:
        ds.update_tags(start_time="2024-06-10T10:00:00")
    return path


def _record(lake: Path) -> Any:
    (rec,) = sorted((lake / "scenes").glob("*/" + SCENE_RECORD_FILE))
    return read_scene_record(rec)


def _dsm_layer(lake: Path) -> tuple[Any, np.ndarray]:
    record = _record(lake)
    (layer,) = record.aux
    with rasterio.open(lake / "scenes" / record.scene_id / str(layer.cog)) as ds:
        return layer, ds.read(1)


def _run(path: Path, cluster: DaskCluster) -> str:
    """``cubelake jobs run`` of ``path``; its output, after checking it exited 0 without a traceback."""
    res = run_cli("jobs", "run", str(path), "--scheduler", cluster.address, timeout=300)
    out = no_traceback(res)
    assert res.returncode == 0, out
    return out


@pytest.fixture
def dated_job(manifest: Callable[..., Path], tmp_path: Path) -> Callable[..., Path]:
    """Factory: a manifest over one dated scene with the given aux entries; the DSM (a day before the scene)
    is ``tmp/aux/dsm.tif``."""
    scene = _scene(tmp_path / "one")
    (tmp_path / "aux").mkdir()
    write_dsm(tmp_path / "aux" / "dsm.tif", when="2024-06-09T10:00:00Z")

    def make(*aux: dict[str, Any]) -> Path:
        return _aux_manifest(manifest, list(aux), inputs=[str(scene)])

    return make


def test_a_job_with_an_aux_dsm_builds_the_layer(dated_job: Callable[..., Path], tmp_path: Path,
                                                dask_cluster: DaskCluster) -> None:
    path = dated_job({"name": "dsm", "path": "aux/dsm.tif", "max_time_delta": "3d"})
    lake = tmp_path / "lake"
    out = _run(path, dask_cluster)
    assert "1 ingested" in out, out
    layer, values = _dsm_layer(lake)
    assert (layer.name, layer.kind, layer.resampling) == ("dsm", "continuous", "bilinear")
    assert layer.source == str((tmp_path / "aux" / "dsm.tif").resolve())
    assert layer.time_delta_s == -86400.0  # the DSM's time minus the scene's, within the 3 d allowed
    assert 0.2 < float(np.isfinite(values).mean()) < 0.8  # the west half
    assert np.nanmin(values) >= 200  # the nodata -9999 never leaks into the values
    record = _record(lake)
    z = zarr.open_group(str(lake / "scenes" / record.scene_id / record.products["zarr"].path), mode="r")
    np.testing.assert_array_equal(np.asarray(z["aux_dsm"][...]), values)
    item = json.loads((lake / "scenes" / record.scene_id / "item.json").read_text())
    assert item["assets"]["aux_dsm"]["href"] == f"./{record.scene_id}.aux_dsm.tif"


@pytest.mark.slow
def test_a_changed_aux_raster_or_setting_redoes_the_scene(dated_job: Callable[..., Path], tmp_path: Path,
                                                          dask_cluster: DaskCluster) -> None:
    lake, dsm = tmp_path / "lake", tmp_path / "aux" / "dsm.tif"
    path = dated_job({"name": "dsm", "path": "aux/dsm.tif"})
    _run(path, dask_cluster)
    _, values = _dsm_layer(lake)
    again = _run(path, dask_cluster)
    assert "0 scene(s) to ingest" in again, again  # nothing changed: the ledger skips the scene
    write_dsm(dsm, offset=1000.0, when="2024-06-09T10:00:00Z")  # new heights in the same file, same settings
    out = _run(path, dask_cluster)
    assert "1 ingested" in out, out
    _, changed = _dsm_layer(lake)
    np.testing.assert_allclose(changed[np.isfinite(changed)], values[np.isfinite(values)] + 1000.0, rtol=1e-6)
    # the same job (name, lake), now with nearest: the settings hash changed, so the scene is redone
    out = _run(dated_job({"name": "dsm", "path": "aux/dsm.tif", "resampling": "nearest"}), dask_cluster)
    assert "1 ingested" in out, out
    assert _dsm_layer(lake)[0].resampling == "nearest"
    # a time limit the DSM (a day off) misses: the scene is published without the layer, with a warning
    out = _run(dated_job({"name": "dsm", "path": "aux/dsm.tif", "max_time_delta": "12h"}), dask_cluster)
    assert "1 ingested" in out, out
    record = _record(lake)
    assert record.aux == []
    assert [w.code for w in record.validation.warnings if w.code.startswith("aux")] == ["aux_no_time_match"]


def test_the_ledger_watches_the_aux_rasters_and_candidate_folders(tmp_path: Path, dsm: Path) -> None:
    from cubelake.jobs.spec import AuxEntry

    entries = [AuxEntry(name="dsm", path=str(dsm)), AuxEntry(name="f", path=str(dsm.parent)),
               AuxEntry(name="g", path=str(dsm.parent / "*.tif")), AuxEntry(name="h", path=str(tmp_path / "gone.tif"))]
    watched = aux_files(entries, None)
    assert [w["path"] for w in watched] == [str(dsm), str(dsm.parent)]  # the folder once; a missing file not
    assert [(w["size"], w["mtime_ns"]) for w in watched] == \
        [(p.stat().st_size, p.stat().st_mtime_ns) for p in (dsm, dsm.parent)]
