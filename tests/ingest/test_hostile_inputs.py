"""Hostile and damaged inputs: each is a clear rejection (or a warning) naming the file and the field,
never a traceback, a hang, a silent drop, or a read outside the input's folder.

The command-line checks run the real ``cubelake`` in a subprocess: what a user sees is its
stdout/stderr and exit code.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cubelake.ingest import (
    Code,
    IngestOptions,
    Outcome,
    discover,
    ingest,
    iter_ingest,
    validate_scene,
)
from cubelake.ingest.sources import SceneKind
from tests.conftest import hsi_cube, no_traceback, write_geotiff
from tests.conftest import run_cli as cli

L8 = "landsat8_rio_toa"
L8_ID = "LC81060712016134LGN00"
ENMAP = "hsi_enmap_potsdam/enmap_potsdam_tile_96_0.tif"


def landsat_copy(real: Path, dst: Path, edit: dict[str, str | None]) -> Path:
    """The real Landsat 8 scene (MTL + B3) in ``dst``, with MTL fields replaced (``None`` deletes the line)."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(real / L8 / f"{L8_ID}_B3.TIF", dst / f"{L8_ID}_B3.TIF")
    lines = []
    for line in (real / L8 / f"{L8_ID}_MTL.txt").read_text().splitlines():
        key = line.split("=")[0].strip()
        if key in edit:
            if edit[key] is None:
                continue
            line = f"    {key} = {edit[key]}"
        lines.append(line)
    mtl = dst / f"{L8_ID}_MTL.txt"
    mtl.write_text("\n".join(lines) + "\n")
    return mtl


# -- Landsat MTL: confinement and field checks -------------------------------------------------


@pytest.mark.parametrize("name", ["../../../../etc/passwd", "/etc/passwd", "sub/../../x.TIF", "..", "a\\b.TIF"])
def test_mtl_band_paths_stay_in_the_mtl_folder(real: Path, tmp_path: Path, name: str) -> None:
    mtl = landsat_copy(real, tmp_path / "scene", {"FILE_NAME_BAND_3": f'"{name}"'})
    report = validate_scene(mtl)
    assert not report.ok
    (err,) = report.errors
    assert err.code is Code.UNREADABLE
    assert str(mtl) in err.message
    assert "FILE_NAME_BAND_3" in err.message
    assert "plain file name" in err.message
    assert "root:" not in json.dumps(report.to_dict())  # /etc/passwd was never read


@pytest.mark.integration
def test_truncated_mtl_and_zero_sun_elevation_do_not_stop_the_batch(real: Path, tmp_path: Path) -> None:
    text = (real / L8 / f"{L8_ID}_MTL.txt").read_text()
    cut = tmp_path / "cut"
    cut.mkdir()
    shutil.copy(real / L8 / f"{L8_ID}_B3.TIF", cut)
    (cut / f"{L8_ID}_MTL.txt").write_text(text[: text.index("SUN_ELEVATION")])  # no sun angles, no coefficients
    zero = landsat_copy(real, tmp_path / "zero", {"SUN_ELEVATION": "0.0"})
    res = cli("ingest", "--lake", str(tmp_path / "lake"), str(cut), str(zero.parent), str(real / ENMAP))
    out = no_traceback(res)
    assert res.returncode == 1
    assert "2 rejected" in out
    assert "1 ingested" in out
    assert "SUN_ELEVATION is missing (truncated MTL?)" in out
    assert "SUN_ELEVATION = 0: the sun is at or below the horizon" in out
    assert out.count("no usable toa_reflectance coefficients") == 2


@pytest.mark.parametrize(("edit", "needle"), [
    ({"SUN_ELEVATION": "-12.5"}, "SUN_ELEVATION = -12.5: the sun is at or below the horizon"),
    ({"SUN_ELEVATION": '"high"'}, "SUN_ELEVATION = 'high' is not a number"),
    ({"REFLECTANCE_MULT_BAND_3": "abc"}, "no usable toa_reflectance coefficients for band(s) B3"),
])
def test_unusable_sun_angle_or_coefficients_reject_with_the_field(real: Path, tmp_path: Path,
                                                                  edit: dict[str, str], needle: str) -> None:
    mtl = landsat_copy(real, tmp_path / "s", edit)
    report = validate_scene(mtl)
    assert not report.ok
    assert needle in report.summary()


def test_negative_radiance_gain_is_a_warning_on_radiance_and_reflectance(real: Path, tmp_path: Path) -> None:
    mtl = landsat_copy(real, tmp_path / "s", {"RADIANCE_MULT_BAND_3": "-1.2E-02"})
    report = validate_scene(mtl, IngestOptions(profile=None, chunk=256))
    warned = [w for w in report.warnings if w.code is Code.CALIBRATION_SUSPECT]
    assert warned
    assert "RADIANCE_MULT of band(s) B3 is zero or negative" in warned[0].message


def test_negative_gain_in_a_profile_is_warned(tmp_path: Path) -> None:
    from cubelake.ingest import load_profile

    src = write_geotiff(tmp_path / "g.tif", hsi_cube(3, 20, 20, "uint16"))
    prof = tmp_path / "p.yaml"
    prof.write_text("name: neg\ncalibration: {gain: [1.0, -0.5, 1.0], quantity: radiance}\n")
    report = validate_scene(src, IngestOptions(profile=load_profile(prof)))
    (w,) = [w for w in report.warnings if w.code is Code.CALIBRATION_SUSPECT]
    assert w.bands == (2,)
    assert "gain -0.5" in w.message
    assert "radiance will be negative" in w.message


def test_listed_band_missing_on_disk_is_a_warning_not_silent(real: Path) -> None:
    # the sample scene ships B3 only; the MTL lists B1-B11
    report = validate_scene(real / L8 / f"{L8_ID}_MTL.txt")
    (w,) = [w for w in report.warnings if w.code is Code.BANDS_MISSING]
    assert "B1, B2, B4, B5, B6, B7, B9, B10, B11" in w.message
    assert "holds only B3" in w.message


def test_mtl_json_nested_too_deep_is_rejected(tmp_path: Path) -> None:
    mtl = tmp_path / "X_MTL.json"
    mtl.write_text('{"SPACECRAFT_ID": "LANDSAT_8", "A": ' + "[" * 100_000 + "]" * 100_000 + "}")
    report = validate_scene(mtl)
    assert not report.ok
    assert "nested too deeply" in report.errors[0].message
    assert str(mtl) in report.errors[0].message


# -- paths that are not scene files ------------------------------------------------------------


@pytest.mark.integration
def test_fifo_is_rejected_without_being_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "x.tif"
    os.mkfifo(fifo)
    res = cli("ingest", "--lake", str(tmp_path / "lake"), str(fifo), timeout=60)
    out = no_traceback(res)
    assert res.returncode == 1
    assert f"{fifo}: is a named pipe (FIFO), not a regular file" in out


def test_fifo_inside_a_folder_does_not_hang_the_walk(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    os.mkfifo(folder / "pipe.tif")
    write_geotiff(folder / "good.tif", hsi_cube(3, 16, 16, "uint16"))
    results = list(iter_ingest([folder], tmp_path / "lake", IngestOptions(workers=1)))
    assert [r.outcome for r in results] == [Outcome.INGESTED, Outcome.REJECTED]
    assert "named pipe" in results[1].report.errors[0].message


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["empty_folder", "broken_link", "link_loop", "dev_zero"])
def test_paths_that_hold_no_scene_are_rejected_by_name(tmp_path: Path, kind: str) -> None:
    p = tmp_path / "x.tif"
    needle = {"empty_folder": "an empty folder; no scene files in it", "broken_link": "a broken symbolic link",
              "link_loop": "a symbolic link loop", "dev_zero": "is a device, not a regular file"}[kind]
    if kind == "empty_folder":
        p.mkdir()
    elif kind == "broken_link":
        p.symlink_to(tmp_path / "nowhere.tif")
    elif kind == "link_loop":
        p.symlink_to(p)
    else:
        p.symlink_to("/dev/zero")
    res = cli("ingest", "--lake", str(tmp_path / "lake"), str(p), timeout=60)
    out = no_traceback(res)
    assert res.returncode == 1, out
    assert "0 ingested" in out
    assert "1 rejected" in out
    assert needle in out
    assert str(p) in out


def test_a_lake_inside_the_input_folder_is_not_walked_into(tmp_path: Path) -> None:
    folder = tmp_path / "scenes"
    folder.mkdir()
    write_geotiff(folder / "a.tif", hsi_cube(3, 16, 16, "uint16"))
    lake = folder / "lake"
    first = ingest([folder], lake, IngestOptions(workers=1))
    assert [r.outcome for r in first] == [Outcome.INGESTED]
    again = ingest([folder], lake, IngestOptions(workers=1))  # the lake's own COG is not an input
    assert [(Path(r.path).name, r.outcome) for r in again] == [("a.tif", Outcome.UNCHANGED)]
    other = tmp_path / "other"
    other.mkdir()
    shutil.copytree(lake, other / "copy_of_a_lake")  # any cubelake lake found in a walk is skipped
    (only,) = discover([other])  # nothing under the copied lake is a scene: the folder holds no input
    assert only.kind is SceneKind.SPECIAL
    assert only.problem == f"{other}: an empty folder; no scene files in it"
    (named,) = ingest([lake], lake, IngestOptions(workers=1))
    assert named.outcome is Outcome.REJECTED
    assert "is a cubelake lake (or inside one), not an input" in named.report.errors[0].message


@pytest.mark.integration
def test_newline_and_non_utf8_names_are_escaped_not_printed_raw(tmp_path: Path) -> None:
    forged = tmp_path / "a\ningested  fake.tif"
    forged.write_bytes(b"not a tiff")
    raw = os.fsencode(tmp_path) + b"/bad\xff.tif"
    with open(raw, "wb") as f:
        f.write(b"II*\x00garbage")
    res = cli("ingest", "--lake", str(tmp_path / "lake"), str(forged), os.fsdecode(raw))
    out = no_traceback(res)
    assert res.returncode == 1
    assert "a\\ningested  fake.tif" in out  # shown escaped, on one line
    assert not any(line.startswith("ingested  fake") for line in out.splitlines())
    assert "bad\\xff.tif" in out
    assert "not valid UTF-8" in out
    doc = json.loads(cli("ingest", "--lake", str(tmp_path / "lake"), "--format", "json", os.fsdecode(raw)).stdout)
    assert doc["results"][0]["outcome"] == "rejected"


# -- wavelengths -------------------------------------------------------------------------------


def test_decreasing_wavelengths_are_rejected_not_dropped(real: Path, tmp_path: Path) -> None:
    import rasterio

    src = tmp_path / "reversed.tif"
    shutil.copy(real / ENMAP, src)
    with rasterio.open(src, "r+") as ds:
        wl = [float(ds.tags(b)["wavelength"]) for b in range(1, ds.count + 1)]
        for b, w in zip(range(1, ds.count + 1), reversed(wl), strict=True):
            ds.update_tags(b, wavelength=str(w))
    report = validate_scene(src)  # the EnMAP profile (overlap: drop) is picked: a reversed axis is no seam
    assert not report.ok
    (err,) = [e for e in report.errors if e.code is Code.WAVELENGTH_ORDER]
    assert "they decrease at 216 of 217 steps" in err.message
    assert "reverse order" in err.message
    assert str(src) in (err.where or "")


def test_a_real_seam_drop_is_reported(real: Path) -> None:
    report = validate_scene(real / ENMAP)
    (w,) = [w for w in report.warnings if w.code is Code.SPECTRAL_OVERLAP]
    assert w.bands == tuple(range(92, 101))


# -- results as they finish ----------------------------------------------------------------------


@pytest.mark.integration
def test_each_outcome_is_printed_when_its_scene_finishes(tmp_path: Path) -> None:
    a = write_geotiff(tmp_path / "a.tif", hsi_cube(3, 16, 16, "uint16"))
    b = write_geotiff(tmp_path / "b.tif", hsi_cube(3, 16, 16, "uint16", seed=1))
    # the process is killed while publishing b: whatever it printed before must include a's outcome
    res = cli("ingest", "--lake", str(tmp_path / "lake"), str(a), str(b),
              env={"CUBELAKE_FAULT": "before-products:b"})
    assert res.returncode == -9
    assert f"ingested  {a}" in res.stdout
    assert str(b) not in res.stdout


@pytest.mark.integration
def test_rejections_are_listed_once(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tif"
    bad.write_text("not a tiff")
    res = cli("ingest", "--lake", str(tmp_path / "lake"), str(bad))
    out = no_traceback(res)
    assert out.count("named .tif but the content is not a TIFF") == 1


@pytest.mark.integration
def test_numpy_warnings_do_not_leak(tmp_path: Path) -> None:
    data = hsi_cube(3, 16, 16, "float64")
    data[1] = np.nan  # an all-NaN band: statistics of nothing
    data[2, :4] = 1e300  # squares overflow float64
    src = write_geotiff(tmp_path / "odd.tif", data)
    res = cli("validate", str(src))
    assert "Warning" not in res.stderr, res.stderr
    assert res.returncode == 0, res.stdout + res.stderr
    record = validate_scene(src).band_stats
    assert record is not None
    assert record["mean"][1] is None
    assert record["std"][2] is None


# -- ENVI headers, GeoTIFF tags, TIFF block tables, MATLAB files ------------------------------------

AVIRIS = "hsi_aviris_ng_isofit/small_chunk/ang20170323t202244_rdn_7000-7010"


def envi_copy(real: Path, dst: Path, edit: dict[str, str], extra: bytes = b"") -> Path:
    """The real 425-band AVIRIS-NG radiance chunk with header fields replaced (and bytes appended to its data)."""
    dst.mkdir(parents=True, exist_ok=True)
    data = dst / "scene"
    data.write_bytes((real / AVIRIS).read_bytes() + extra)
    lines = (real / f"{AVIRIS}.hdr").read_text().splitlines()
    out = [next((f"{k} = {v}" for k, v in edit.items() if line.split("=")[0].strip() == k), line) for line in lines]
    present = {line.split("=")[0].strip() for line in lines}
    out += [f"{k} = {v}" for k, v in edit.items() if k not in present]
    header = dst / "scene.hdr"
    header.write_text("\n".join(out) + "\n")
    return header


@pytest.mark.parametrize(("edit", "field", "needle"), [
    ({"wavelength": "{376.86, abc, 386.88}"}, "wavelength", "'abc'"),
    ({"fwhm": "{5.57, 5.58, nan}"}, "fwhm", "NaN or infinite"),
    ({"interleave": "zigzag"}, "interleave", "'interleave = zigzag' is not an ENVI interleave"),
    ({"byte order": "7"}, "byte order", "'byte order = 7' must be 0 (little-endian) or 1 (big-endian)"),
    ({"data gain values": "{1, two}"}, "data gain values", "'two'"),
    ({"data ignore value": "none"}, "data ignore value", "is not a number"),
])
def test_envi_header_fields_out_of_their_domain_are_named(real: Path, tmp_path: Path, edit: dict[str, str],
                                                          field: str, needle: str) -> None:
    header = envi_copy(real, tmp_path / "s", edit)
    report = validate_scene(header)
    assert not report.ok
    bad = [e for e in report.errors if e.code is Code.BAD_METADATA]
    assert bad, report.summary()
    assert bad[0].where == f"{header}: {field}"
    assert needle in bad[0].message
    assert report.blocks_checked == 0  # no pixel is read through a header that cannot describe them


def test_envi_data_file_larger_than_the_header_says_is_rejected(real: Path, tmp_path: Path) -> None:
    header = envi_copy(real, tmp_path / "s", {}, extra=b"\0" * 4000)
    report = validate_scene(header)
    (err,) = report.errors
    assert err.code is Code.BAD_METADATA
    assert "4000 bytes more" in err.message
    assert err.where == str(tmp_path / "s" / "scene")


@pytest.mark.integration
def test_geotiff_band_tags_that_are_not_numbers_are_named(tmp_path: Path) -> None:
    src = write_geotiff(tmp_path / "tags.tif", hsi_cube(3, 16, 16, "uint16"),
                        band_tags=[{"wavelength": "500"}, {"wavelength": "six hundred"}, {"wavelength": "700"}])
    res = cli("validate", str(src))
    out = no_traceback(res)
    assert res.returncode == 1
    assert "band tag wavelength = 'six hundred' is not a finite number" in out
    report = validate_scene(src)
    assert report.errors[0].where == f"{src} band 2: wavelength"


@pytest.mark.parametrize(("value", "needle"), [(0, "inside the TIFF header"), (96526, "overlap the next block")])
def test_tiff_block_table_pointing_at_the_header_or_one_place_is_rejected(real: Path, tmp_path: Path, value: int,
                                                                          needle: str) -> None:
    import struct

    import tifffile

    src = tmp_path / "table.tif"
    shutil.copy(real / ENMAP, src)
    with tifffile.TiffFile(src) as tif:
        tag = tif.pages.first.tags["StripOffsets"]
        at, n = tag.valueoffset, tag.count
    with open(src, "r+b") as f:
        f.seek(at)
        f.write(struct.pack(f"<{n}I", *([value] * n)))  # every band's strip at one offset: identical garbage bands
    results = ingest([src], tmp_path / "lake", IngestOptions(workers=1))
    assert results[0].outcome is Outcome.REJECTED
    assert any(needle in e.message for e in results[0].report.errors), results[0].report.summary()
    assert not any((tmp_path / "lake" / "scenes").iterdir())


@pytest.mark.integration
def test_truncated_matlab_v73_is_a_rejection_naming_the_file(real: Path, tmp_path: Path) -> None:
    whole = (real / "hsi_ground_truth/v73_hdf5/KSC_gt.mat").read_bytes()
    cut = tmp_path / "cut.mat"
    cut.write_bytes(whole[: len(whole) // 2])
    res = cli("ingest", "--lake", str(tmp_path / "lake"), str(cut))
    out = no_traceback(res)
    assert res.returncode == 1
    assert f"{cut}: not a readable MATLAB v7.3 (HDF5) file" in out


# -- a full disk ---------------------------------------------------------------------------------


def _on_tmpfs(size: str, script: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (sh) in a private mount namespace where ``$FULL`` is a tmpfs of ``size``."""
    return subprocess.run(["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size={size} tmpfs "$FULL" && {script}'],
                          capture_output=True, text=True, timeout=300, env={**os.environ}, errors="backslashreplace")


@pytest.mark.parametrize("size", ["40k", "300k"])
def test_disk_full_names_the_device_and_the_space_and_leaves_nothing_half_written(real: Path, tmp_path: Path,
                                                                                  size: str) -> None:
    full = tmp_path / "full"
    full.mkdir()
    os.environ["FULL"] = str(full)
    try:
        res = _on_tmpfs(size, f'{sys.executable} -m cubelake.cli ingest --lake "$FULL/lake" {real / ENMAP}; '
                              'echo "rc=$?"; ls -A "$FULL/lake/.staging" "$FULL/lake/scenes"')
    finally:
        del os.environ["FULL"]
    out = no_traceback(res)
    assert f"mounted at {full}" in out
    assert "tmpfs" in out
    assert "free of" in out
    assert "reindex" not in out  # the index is fine; the device is full
    listing = res.stdout[res.stdout.index("rc="):].splitlines()
    if size == "40k":  # not even the catalog index fits
        assert listing[0] == "rc=2"
        assert "the lake cannot be written" in out
    else:
        assert listing[0] == "rc=1"
        assert "no space left for this scene's products" in out
        assert "this scene needs up to about 824.0 KiB" in out  # 206 bands x 32 x 32 int16, COG + Zarr
        assert "Nothing was published" in out
    staged = [ln for ln in listing[1:] if ln and not ln.endswith(":")]
    assert staged == []  # no build left in .staging, nothing in scenes/


@pytest.mark.integration
def test_third_party_log_lines_stay_out_of_the_output(real: Path, tmp_path: Path) -> None:
    fuzz = real / "bad_inputs/image_tiff_fuzz"
    res = cli("ingest", "--lake", str(tmp_path / "lake"), "--products", "cog,zarr,refs", str(fuzz))
    out = no_traceback(res)
    assert "tifffile" not in out  # tifffile logs ERROR lines for these headers; our report says what is wrong
    assert res.returncode == 1
