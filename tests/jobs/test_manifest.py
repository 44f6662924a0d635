"""Manifests: typed, versioned, checked on load with errors that name the file and the field."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cubelake.errors import ConfigError
from cubelake.jobs import Ledger, is_due, load_manifest
from cubelake.jobs.inputs import plan_inputs
from cubelake.lake import Lake
from tests.conftest import REAL, ROOT, no_traceback, run_cli

from .conftest import write_manifest


def test_the_demo_manifest_loads_with_its_defaults_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBELAKE_DATA", str(REAL))
    monkeypatch.delenv("CUBELAKE_LAKE", raising=False)
    m = load_manifest(ROOT / "manifests" / "demo.yaml")
    assert m.name == "demo"
    assert m.version == 1
    assert m.lake == str(ROOT / "lake")  # relative to the manifest's folder
    assert m.inputs[0].path == str(REAL / "hsi_enmap_potsdam")
    assert m.steps.ingest.products == ("cog", "zarr", "refs")
    assert m.steps.stack is not None
    assert m.steps.export is not None
    assert m.steps.gc is not None
    assert m.steps.gc.grace == 6 * 3600
    assert m.resources.memory_per_task == 4 * 1024**3
    assert m.schedule == "0 2 * * *"


def test_per_input_settings_override_the_jobs(manifest: Callable[..., Path], scenes: Path) -> None:
    path = manifest(inputs=[str(scenes / "scene_0.tif"), {"path": str(scenes / "scene_1.tif"),
                                                          "ingest": {"chunk": 32, "products": ["cog"]}}])
    m = load_manifest(path)
    assert m.settings_for(m.inputs[0]).chunk == 64
    s1 = m.settings_for(m.inputs[1])
    assert (s1.chunk, s1.products) == (32, ("cog",))


BAD = [
    ({"inptus": ["x"]}, "inptus: unknown field"),
    ({"schedule": "every night"}, "schedule: 'every night' is not a cron expression"),
    ({"schedule": "61 * * * *"}, "schedule: '61 * * * *' is not a cron expression"),
    ({"version": 2}, "version: manifest version 2 is not supported"),
    ({"name": "../etc"}, "name: '../etc': a job name is"),
    ({"inputs": []}, "inputs: List should have at least 1 item"),
    ({"steps": {"ingest": {"products": ["cog", "tiff"]}}}, "steps.ingest.products: Value error, unknown product"),
    ({"steps": {"ingest": {"chunk": 100}}}, "steps.ingest.chunk: Value error, chunk must be a positive multiple"),
    ({"resources": {"memory_per_task": "lots"}}, "resources.memory_per_task: Value error, 'lots' is not a size"),
    ({"resources": {"workers": 0}}, "resources.workers: Input should be greater than or equal to 1"),
    ({"inputs": [{"path": "a", "stac": "b"}]}, "inputs[0]: Value error, give exactly one of 'path'"),
    ({"steps": {"gc": {"grace": "soon"}}}, "steps.gc.grace: Value error, 'soon' is not a duration"),
]


@pytest.mark.parametrize(("change", "expected"), BAD)
def test_a_bad_manifest_names_the_file_and_the_field(manifest: Callable[..., Path], change: dict[str, object],
                                                     expected: str) -> None:
    path = manifest(**change)
    with pytest.raises(ConfigError) as err:
        load_manifest(path)
    text = str(err.value).replace("Value error, ", "")
    assert str(path) in text
    assert expected.replace("Value error, ", "") in text, text


def test_a_missing_input_is_a_manifest_error(manifest: Callable[..., Path], tmp_path: Path) -> None:
    path = manifest(inputs=[str(tmp_path / "in" / "scene_0.tif"), str(tmp_path / "nowhere" / "x.tif")])
    with pytest.raises(ConfigError, match=r"inputs\[1\]\.path: .*nowhere/x.tif does not exist"):
        load_manifest(path)


def test_an_unset_variable_without_default_is_named(manifest: Callable[..., Path],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_VAR_CUBELAKE", raising=False)
    path = manifest(lake="${NO_SUCH_VAR_CUBELAKE}/lake")
    with pytest.raises(ConfigError, match="environment variable NO_SUCH_VAR_CUBELAKE is not set"):
        load_manifest(path)


def test_not_a_mapping_and_alias_bombs_are_refused(tmp_path: Path) -> None:
    p = tmp_path / "list.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="a manifest is a YAML mapping"):
        load_manifest(p)
    bomb = tmp_path / "bomb.yaml"
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
              f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]"
              for i in range(6)]
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match="alias bomb"):
        load_manifest(bomb)


@pytest.mark.parametrize(("change", "expected"), [
    ({"inptus": ["x"]}, "inptus: unknown field"),
    ({"schedule": "every night"}, "is not a cron expression"),
    ({"inputs": ["/nowhere/at/all.tif"]}, "inputs[0].path: /nowhere/at/all.tif does not exist"),
])
def test_jobs_run_exits_2_on_a_bad_manifest(manifest: Callable[..., Path], change: dict[str, object],
                                            expected: str, tmp_path: Path) -> None:
    path = manifest(**change)
    res = run_cli("jobs", "run", str(path), timeout=120)
    out = no_traceback(res)
    assert res.returncode == 2, out
    assert str(path) in out, out
    assert expected in out, out
    assert not (tmp_path / "lake").exists()  # nothing was started or written


def test_jobs_run_exits_2_when_the_scheduler_cannot_be_reached(manifest: Callable[..., Path]) -> None:
    res = run_cli("jobs", "run", str(manifest()), "--scheduler", "tcp://127.0.0.1:9", timeout=120)
    out = no_traceback(res)
    assert res.returncode == 2, out
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in out, out
    assert "dask scheduler" in out  # how to fix it


def test_a_bad_profile_is_found_before_any_work(manifest: Callable[..., Path]) -> None:
    path = manifest(steps={"ingest": {"profile": "no-such-sensor"}})
    res = run_cli("jobs", "run", str(path), timeout=120)
    out = no_traceback(res)
    assert res.returncode == 2, out
    assert "inputs[0]" in out, out
    assert "no-such-sensor" in out, out


# -- inputs: globs, STAC catalogs, filters ---------------------------------------------------------

def _stac(folder: Path, hrefs: list[str]) -> Path:
    features = [{"type": "Feature", "stac_version": "1.1.0", "id": f"s{i}", "geometry": None, "properties": {},
                 "links": [], "assets": {"data": {"href": h, "roles": ["data"], "type": "image/tiff"},
                                         "thumb": {"href": "thumb.png", "roles": ["thumbnail"]}}}
                for i, h in enumerate(hrefs)]
    path = folder / "items.json"
    path.write_text(json.dumps({"type": "FeatureCollection", "features": features}))
    return path


def test_a_stac_item_collection_names_the_scenes(manifest: Callable[..., Path], scenes: Path,
                                                 tmp_path: Path) -> None:
    stac = _stac(scenes, ["scene_1.tif", "./scene_3.tif"])
    m = load_manifest(manifest(inputs=[{"stac": str(stac)}]))
    plan = plan_inputs(m, {})
    assert sorted(Path(p.name).name for p in plan.todo) == ["scene_1.tif", "scene_3.tif"]


@pytest.mark.parametrize("href", ["../outside.tif", "/etc/passwd", "s3://other-bucket/x.tif"])
def test_a_stac_catalog_cannot_name_files_outside_its_folder(manifest: Callable[..., Path], scenes: Path,
                                                             href: str) -> None:
    stac = _stac(scenes, ["scene_1.tif", href])
    m = load_manifest(manifest(inputs=[{"stac": str(stac)}]))
    with pytest.raises(ConfigError, match=r"inputs\[0\]: .*items.json: (href|asset) .*(outside)"):
        plan_inputs(m, {})


def test_filters_pattern_and_sizes(manifest: Callable[..., Path], scenes: Path) -> None:
    (scenes / "other.tif").write_bytes((scenes / "scene_0.tif").read_bytes())
    m = load_manifest(manifest(filters={"pattern": "scene_[0-2].tif"}))
    plan = plan_inputs(m, {})
    assert sorted(Path(p.name).name for p in plan.todo) == ["scene_0.tif", "scene_1.tif", "scene_2.tif"]
    assert len(plan.filtered) == 4
    assert all("does not match pattern" in why for _, why in plan.filtered)
    size = (scenes / "scene_0.tif").stat().st_size
    m = load_manifest(manifest(filters={"max_size": size - 1}))
    plan = plan_inputs(m, {})
    assert plan.todo == []
    assert all("over max_size" in why for _, why in plan.filtered)
    m = load_manifest(manifest(filters={"min_size": "1GiB"}))
    assert plan_inputs(m, {}).todo == []


def test_a_glob_that_matches_nothing_is_a_note_not_an_error(manifest: Callable[..., Path], tmp_path: Path) -> None:
    m = load_manifest(manifest(inputs=[str(tmp_path / "in" / "*.nothing")]))
    plan = plan_inputs(m, {})
    assert plan.todo == []
    assert "matches nothing" in plan.notes[0]


# -- schedules ------------------------------------------------------------------------------------

def test_due_follows_the_cron_schedule_since_the_last_success(manifest: Callable[..., Path], tmp_path: Path) -> None:
    m = load_manifest(manifest(schedule="0 2 * * *"))
    ledger = Ledger(Lake(tmp_path / "lake"), m.name)
    assert is_due(m, ledger) == (True, "never succeeded")
    ledger.put_run({"run_id": "20261130T020000-aaaaaa", "state": "succeeded", "started": "2026-11-30T02:00:05+00:00"})
    ledger.put_run({"run_id": "20261201T020000-bbbbbb", "state": "failed", "started": "2026-12-01T02:00:05+00:00"})
    due, why = is_due(m, ledger, datetime(2026, 12, 1, 1, 0, tzinfo=UTC))
    assert not due
    assert "next due at 2026-12-01T02:00" in why
    due, why = is_due(m, ledger, datetime(2026, 12, 1, 3, 0, tzinfo=UTC))  # the failed run does not count
    assert due
    assert "fired at 2026-12-01T02:00" in why
    no_schedule = load_manifest(manifest("b.yaml"))
    assert not is_due(no_schedule, ledger)[0]


def test_newer_than_last_success_takes_only_files_changed_since(manifest: Callable[..., Path], scenes: Path) -> None:
    import os

    m = load_manifest(manifest(filters={"newer_than_last_success": True}))
    old = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    for p in scenes.glob("*.tif"):
        os.utime(p, (old, old))
    os.utime(scenes / "scene_3.tif")  # modified now
    plan = plan_inputs(m, {}, since=datetime(2026, 6, 1, tzinfo=UTC))
    assert [Path(p.name).name for p in plan.todo] == ["scene_3.tif"]
    assert all("not modified since the last successful run" in why for _, why in plan.filtered)
    assert len(plan_inputs(m, {}, since=None).todo) == 6  # never succeeded: everything


def test_a_static_stac_catalog_is_followed_within_its_folder(manifest: Callable[..., Path], scenes: Path) -> None:
    sub = scenes / "items"
    sub.mkdir()
    for i in (0, 5):
        (sub / f"s{i}.json").write_text(json.dumps({
            "type": "Feature", "stac_version": "1.1.0", "id": f"s{i}", "geometry": None, "properties": {},
            "links": [], "assets": {"cube": {"href": f"../scene_{i}.tif", "type": "image/tiff; application=geotiff"}}}))
    (scenes / "catalog.json").write_text(json.dumps({
        "type": "Catalog", "stac_version": "1.1.0", "id": "c", "description": "d",
        "links": [{"rel": "item", "href": "items/s0.json"}, {"rel": "item", "href": "./items/s5.json"},
                  {"rel": "self", "href": "catalog.json"}]}))
    m = load_manifest(manifest(inputs=[{"stac": str(scenes / "catalog.json")}]))
    assert sorted(Path(p.name).name for p in plan_inputs(m, {}).todo) == ["scene_0.tif", "scene_5.tif"]


def test_jobs_run_due_runs_what_is_due_and_reports_a_bad_manifest(manifest: Callable[..., Path], scenes: Path,
                                                                   tmp_path: Path) -> None:
    folder = tmp_path / "manifests"
    folder.mkdir()
    due = manifest("manifests/a-due.yaml", name="due-job", schedule="0 2 * * *", inputs=[str(scenes / "scene_0.tif")],
                   steps={"ingest": {"products": ["cog"]}}, resources={"workers": 1, "memory_per_task": "2GiB"})
    manifest("manifests/b-unscheduled.yaml", name="by-hand", inputs=[str(scenes / "scene_1.tif")])
    write_manifest(folder / "c-bad.yaml", {"version": 1, "name": "bad", "lake": str(tmp_path / "lake"),
                                           "inputs": [str(scenes)], "shedule": "0 2 * * *"})
    res = run_cli("jobs", "run", "--due", str(folder), timeout=600)
    out = no_traceback(res)
    assert res.returncode == 2, out  # the bad manifest; the others were still looked at and run
    assert f"{folder / 'c-bad.yaml'}: invalid manifest: shedule: unknown field" in out
    assert f"due     {due}: never succeeded" in out
    assert f"not due {folder / 'b-unscheduled.yaml'}: no schedule" in out
    assert "job due-job run" in out
    assert "1 ingested" in out
    assert (tmp_path / "lake" / "scenes" / "scene_0" / "scene.json").is_file()
    assert not (tmp_path / "lake" / "scenes" / "scene_1").exists()
    again = run_cli("jobs", "run", "--due", str(folder), "--format", "json", timeout=600)
    runs = json.loads(again.stdout)["runs"]
    assert {r.get("job"): r.get("due") for r in runs if "job" in r} == {"due-job": False, "by-hand": False}
    assert any("c-bad.yaml" in r.get("error", "") for r in runs)
