"""ENVI gain/offset, units and a wavelength sidecar given on the command line, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import rasterio
from typer.testing import CliRunner

from cubelake.cli import app
from cubelake.ingest import Outcome, ingest
from cubelake.lake import Lake


def _envi(tmp_path: Path, extra: str, data: np.ndarray, name: str = "cube") -> Path:
    nb, ny, nx = data.shape
    (tmp_path / f"{name}.img").write_bytes(data.astype("<u2").tobytes())  # BSQ
    (tmp_path / f"{name}.hdr").write_text(
        f"ENVI\nsamples = {nx}\nlines = {ny}\nbands = {nb}\nheader offset = 0\nfile type = ENVI Standard\n"
        f"data type = 12\ninterleave = bsq\nbyte order = 0\n{extra}"
    )
    return tmp_path / f"{name}.hdr"


def test_envi_gain_offset_units_and_ignore_value(tmp_path: Path, lake: Lake) -> None:
    rng = np.random.default_rng(3)
    dn = rng.integers(1, 4000, (3, 20, 30)).astype(np.uint16)
    dn[1, 0, :5] = 0  # data ignore value
    hdr = _envi(tmp_path, "wavelength units = Micrometers\nwavelength = {0.45, 0.55, 0.65}\n"
                "fwhm = {0.01, 0.01, 0.01}\ndata gain values = {0.01, 0.02, 0.5}\n"
                "data offset values = {0, -1, 2}\ndata ignore value = 0\n", dn)
    (r,) = ingest([hdr], lake)
    assert r.outcome is Outcome.INGESTED, r.message
    rec = json.loads((lake.scene_dir(r.scene_id) / "scene.json").read_text())  # type: ignore[arg-type]
    assert [b["wavelength_nm"] for b in rec["bands"]] == [450.0, 550.0, 650.0]
    assert [b["fwhm_nm"] for b in rec["bands"]] == [10.0, 10.0, 10.0]
    assert rec["calibration"]["steps"][2]["source"] == "envi_data_gain"
    expected = dn.astype(np.float64) * np.array([0.01, 0.02, 0.5])[:, None, None] + np.array([0, -1, 2])[:, None, None]
    expected = expected.astype(np.float32)
    expected[dn == 0] = np.nan
    with rasterio.open(r.products["cog"]) as ds:
        np.testing.assert_array_equal(ds.read(), expected)
        assert ds.tags(1)["wavelength"] == "450"


def test_cli_profile_csv_sidecar_gives_wavelengths(tmp_path: Path) -> None:
    dn = np.arange(2 * 16 * 16, dtype=np.uint16).reshape(2, 16, 16) + 1
    hdr = _envi(tmp_path, "", dn, name="nowl")
    csv = tmp_path / "wl.csv"
    csv.write_text("band,wavelength_nm,fwhm_nm\n1,500,10\n2,600,10\n")
    res = CliRunner().invoke(app, ["ingest", "--lake", str(tmp_path / "lake"), "--profile", str(csv),
                                   "--format", "json", str(hdr)])
    assert res.exit_code == 0, res.output
    sid = json.loads(res.stdout)["results"][0]["scene_id"]
    rec = json.loads((tmp_path / "lake" / "scenes" / sid / "scene.json").read_text())
    assert [b["wavelength_nm"] for b in rec["bands"]] == [500.0, 600.0]
    bad = tmp_path / "wl3.csv"
    bad.write_text("band,wavelength_nm\n1,500\n2,600\n3,700\n")
    res = CliRunner().invoke(app, ["ingest", "--lake", str(tmp_path / "lake2"), "--profile", str(bad), str(hdr)])
    assert res.exit_code == 1
    assert "wavelength_count" in res.output
    assert "3 wavelengths for a 2-band scene" in res.output
