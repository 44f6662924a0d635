"""The command line through typer's test runner: exit codes, messages, JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cubelake.cli import app
from tests.conftest import hsi_cube, no_traceback, run_cli, write_geotiff

runner = CliRunner()


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return write_geotiff(tmp_path / "good.tif", hsi_cube(5, 40, 50, "uint16"), nodata=0)


@pytest.fixture
def bad(tmp_path: Path) -> Path:
    p = tmp_path / "bad.tif"
    p.write_text("this is not a tiff")
    return p


def test_ingest_ok_exit_0_and_text_report(tmp_path: Path, good: Path) -> None:
    res = runner.invoke(app, ["ingest", "--lake", str(tmp_path / "lake"), "--chunk", "32", str(good)])
    assert res.exit_code == 0, res.output
    assert "ingested" in res.output
    assert "1 scene(s): 1 ingested, 0 unchanged, 0 rejected" in res.output
    again = runner.invoke(app, ["ingest", "--lake", str(tmp_path / "lake"), "--chunk", "32", str(good)])
    assert again.exit_code == 0
    assert "unchanged" in again.output
    assert "nothing to do" in again.output


def test_ingest_some_rejected_exit_1_names_file_and_reason(tmp_path: Path, good: Path, bad: Path) -> None:
    res = runner.invoke(app, ["ingest", "--lake", str(tmp_path / "lake"), str(bad), str(good)])
    assert res.exit_code == 1
    assert str(bad) in res.output
    assert "content_mismatch" in res.output
    assert "1 ingested" in res.output
    assert "1 rejected" in res.output


def test_ingest_json_output(tmp_path: Path, good: Path, bad: Path) -> None:
    res = runner.invoke(app, ["ingest", "--lake", str(tmp_path / "lake"), "--format", "json", str(good), str(bad)])
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert [r["outcome"] for r in doc["results"]] == ["ingested", "rejected"]
    assert doc["results"][1]["errors"][0]["code"] == "content_mismatch"
    assert Path(doc["results"][0]["products"]["cog"]).is_file()
    assert Path(doc["results"][0]["products"]["zarr"]).is_dir()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--chunk", "100"], "multiple of 16"),
        (["--products", "cog,tiff"], "unknown product"),
        (["--profile", "nope-profile"], "no such profile"),
        (["--format", "xml"], "xml"),
        (["--axes", "zzz"], "axes"),
        (["--max-bytes", "lots"], "not a size"),
    ],
)
def test_usage_errors_exit_2(tmp_path: Path, good: Path, args: list[str], needle: str) -> None:
    res = runner.invoke(app, ["ingest", "--lake", str(tmp_path / "lake"), *args, str(good)])
    assert res.exit_code == 2, res.output
    assert needle in res.output


def test_foreign_lake_folder_is_a_usage_error(tmp_path: Path, good: Path) -> None:
    (tmp_path / "notalake").mkdir()
    (tmp_path / "notalake" / "x").write_text("x")
    res = runner.invoke(app, ["ingest", "--lake", str(tmp_path / "notalake"), str(good)])
    assert res.exit_code == 2
    assert "not a cubelake lake" in res.output


def test_validate_reads_every_block_and_writes_nothing(tmp_path: Path, good: Path, bad: Path) -> None:
    res = runner.invoke(app, ["validate", "--format", "json", "--report-dir", str(tmp_path / "reports"), str(good), str(bad)])
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    ok, rejected = doc["reports"]
    assert ok["ok"] is True
    assert ok["blocks_checked"] >= 1
    assert rejected["ok"] is False
    assert (tmp_path / "reports" / "bad.tif.validation.json").is_file()
    assert not (tmp_path / "lake").exists()
    text = runner.invoke(app, ["validate", str(good)])
    assert text.exit_code == 0
    assert "ok" in text.output


def test_lake_and_profiles_commands(tmp_path: Path, good: Path, bad: Path) -> None:
    runner.invoke(app, ["ingest", "--lake", str(tmp_path / "lake"), str(good), str(bad)])
    res = runner.invoke(app, ["lake", "--lake", str(tmp_path / "lake"), "--format", "json"])
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    assert [s["id"] for s in doc["scenes"]] == ["good"]
    assert doc["scenes"][0]["products"] == {"cog": "good.tif", "zarr": "good.zarr"}
    assert doc["rejected"][0]["errors"] == ["content_mismatch"]
    text = runner.invoke(app, ["lake", "--lake", str(tmp_path / "lake")])
    assert "good: 5 bands 40x50 uint16 [generic] cog=good.tif, zarr=good.zarr" in text.output
    assert "rejected" in text.output
    prof = runner.invoke(app, ["profiles"])
    assert prof.exit_code == 0
    assert "enmap-l2a" in prof.output
    assert "landsat8-oli" in prof.output


def test_quiet_and_verbose_flags(tmp_path: Path, good: Path) -> None:
    """-q: only errors on stderr; default: warnings; -v: the library's INFO lines; -vv: DEBUG too. The
    results on stdout are the same whatever the level; -q works after the command too."""
    runs = {flags: run_cli(*flags[0], "ingest", *flags[1], "--lake", str(tmp_path / f"l{i}"), str(good))
            for i, flags in enumerate([(("-q",), ()), ((), ()), (("-v",), ()), (("-vv",), ()), ((), ("-q",))])}
    for (before, after), res in runs.items():
        assert res.returncode == 0, (before, after, res.stderr)
        no_traceback(res)
        assert res.stdout.startswith(f"ingested  {good}  ("), res.stdout
        assert "ingested: cog + zarr (5 of 5 bands, 40x50, uint16)" in res.stdout
        assert res.stdout.endswith("1 scene(s): 1 ingested, 0 unchanged, 0 rejected\n"), res.stdout
    quiet, default, info, debug, quiet_after = runs.values()
    assert quiet.stderr == ""
    assert quiet_after.stderr == ""
    assert "INFO" not in default.stderr
    assert "DEBUG" not in default.stderr
    assert "INFO     cubelake.catalog.lake" in info.stderr
    assert "catalog item good published" in " ".join(info.stderr.split())
    assert "DEBUG" not in info.stderr
    assert "DEBUG    " in debug.stderr
    assert "INFO     cubelake.catalog.lake" in debug.stderr


def test_missing_input_is_rejected_not_a_crash(tmp_path: Path, good: Path) -> None:
    res = runner.invoke(app, ["ingest", "--lake", str(tmp_path / "lake"), str(tmp_path / "missing.tif"), str(good)])
    assert res.exit_code == 1
    assert "not_found" in res.output
    assert "no such file" in res.output


def test_reingest_with_other_products_keeps_the_published_ones(tmp_path: Path, good: Path) -> None:
    lake = tmp_path / "lake"
    first = runner.invoke(app, ["ingest", "--lake", str(lake), "--chunk", "32", str(good)])
    assert first.exit_code == 0, first.output
    scene = lake / "scenes" / "good"
    assert {p.name for p in scene.iterdir()} >= {"good.tif", "good.zarr"}
    refs = runner.invoke(app, ["ingest", "--lake", str(lake), "--chunk", "32", "--products", "refs", str(good)])
    assert refs.exit_code == 0, refs.output
    assert "kept cog, zarr from the previous version (rebuilt with these settings)" in refs.output
    assert {p.name for p in scene.iterdir()} >= {"good.tif", "good.zarr", "good.refs.json"}
    record = json.loads((scene / "scene.json").read_text())
    assert sorted(record["products"]) == ["cog", "refs", "zarr"]
    again = runner.invoke(app, ["ingest", "--lake", str(lake), "--chunk", "32", "--products", "zarr", str(good)])
    assert "unchanged" in again.output
    assert "kept cog, refs from the previous version" in again.output


def test_the_limits_named_in_messages_are_options(tmp_path: Path, good: Path) -> None:
    res = runner.invoke(app, ["validate", "--max-dimension", "30", str(good)])
    assert res.exit_code == 1
    assert "exceeds the 30-pixel limit per dimension" in res.output
    assert "Raise --max-dimension if it is genuine" in res.output
    ok = runner.invoke(app, ["validate", "--max-dimension", "50", "--max-bands", "5", str(good)])
    assert ok.exit_code == 0, ok.output
    few = runner.invoke(app, ["validate", "--max-bands", "4", str(good)])
    assert "raise --max-bands if genuine" in few.output
    assert runner.invoke(app, ["validate", "--max-bands", "0", str(good)]).exit_code == 2
