"""Sensor profiles: bundled ones load and match; bad ones fail with the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cubelake.errors import ProfileError
from cubelake.ingest import builtin_profiles, load_profile, match_profile
from cubelake.ingest.sources import BandInfo, SceneMetadata


def test_bundled_profiles_load() -> None:
    names = set(builtin_profiles())
    assert {"enmap-l2a", "aviris-ng-radiance", "landsat5-tm", "landsat8-oli"} <= names
    for name in names:
        p = load_profile(name)
        assert p.name == name
        assert p.description


def test_profile_digest_changes_with_settings() -> None:
    a = load_profile("enmap-l2a")
    b = a.model_copy(update={"nodata": -1.0})
    assert a.digest() != b.digest()
    assert a.digest() == load_profile("enmap-l2a").digest()


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("name: x\nproducts: {chunk: 250}\n", "products.chunk"),
        ("name: x\nfoo: 1\n", "foo"),
        ("name: x\nencoding: {dtype: float32, scale_factor: 0.1}\n", "scale_factor"),
        ("name: x\nbad_bands: {indices: [0]}\n", "1-based"),
        ("name: x\nbad_bands: {wavelength_windows_nm: [[1500, 1400]]}\n", "lo < hi"),
        ("- just\n- a list\n", "mapping"),
        ("name: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_profiles_name_file_and_field(tmp_path: Path, body: str, needle: str) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(body)
    with pytest.raises(ProfileError) as err:
        load_profile(f)
    assert str(f) in str(err.value)
    assert needle in str(err.value)


def test_unknown_profile_name_lists_the_bundled_ones() -> None:
    with pytest.raises(ProfileError, match="enmap-l2a"):
        load_profile("no-such-profile")


def test_csv_sidecar_as_profile(tmp_path: Path) -> None:
    f = tmp_path / "wl.csv"
    f.write_text("band,wavelength_um,fwhm_um\n1,0.45,0.01\n2,0.55,0.012\n")
    p = load_profile(f)
    assert p.spectral.wavelengths_nm == pytest.approx([450.0, 550.0])
    assert p.spectral.fwhm_nm == pytest.approx([10.0, 12.0])


def test_yaml_profile_with_relative_sidecar(tmp_path: Path) -> None:
    (tmp_path / "wl.yaml").write_text("wavelength_units: um\nwavelength: [0.4, 0.5]\nfwhm: [0.01, 0.01]\n")
    (tmp_path / "p.yaml").write_text("name: s\nspectral: {sidecar: wl.yaml}\n")
    p = load_profile(tmp_path / "p.yaml")
    assert p.spectral.wavelengths_nm == pytest.approx([400.0, 500.0])


def test_sidecar_without_wavelength_column_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "wl.csv"
    f.write_text("band,centre\n1,450\n")
    with pytest.raises(ProfileError, match="no wavelength column"):
        load_profile(f)


def _meta(name: str, count: int, tags: dict[str, str] | None = None) -> SceneMetadata:
    return SceneMetadata(path=f"/d/{name}", files=(f"/d/{name}",), format="GTiff", count=count, height=1, width=1,
                         dtype="float32", bands=tuple(BandInfo(i + 1) for i in range(count)), tags=tags or {})


def test_match_profile_by_name_bands_and_tags() -> None:
    enmap = match_profile(_meta("enmap_potsdam_tile_96_0.tif", 224))
    assert enmap is not None
    assert enmap.name == "enmap-l2a"
    assert match_profile(_meta("enmap_landcover_unstyled.tif", 1)) is None  # a label raster is not EnMAP L2A
    l5 = match_profile(_meta("LT5_MTL.txt", 7, {"SPACECRAFT_ID": "LANDSAT_5", "SENSOR_ID": "TM"}))
    assert l5 is not None
    assert l5.name == "landsat5-tm"
    assert match_profile(_meta("scene.tif", 3)) is None


def test_renamed_enmap_tile_is_detected_by_content(real: Path, tmp_path: Path) -> None:
    import shutil

    from cubelake.ingest import Outcome, ingest

    renamed = tmp_path / "scene.tif"
    shutil.copy(real / "hsi_enmap_potsdam/enmap_potsdam_tile_96_0.tif", renamed)
    (r,) = ingest([renamed], tmp_path / "lake")
    assert r.outcome is Outcome.INGESTED, r.report.summary()
    record = json.loads((tmp_path / "lake" / "scenes" / "scene" / "scene.json").read_text())
    assert record["profile"]["name"] == "enmap-l2a"
    assert record["encoding"]["dtype"] == "int16"  # the profile's encoding, not the generic float32


def test_a_near_miss_suggests_the_profile(real: Path, tmp_path: Path) -> None:
    import shutil

    import rasterio

    from cubelake.ingest import Code, validate_scene

    odd = tmp_path / "scene.tif"
    shutil.copy(real / "hsi_enmap_potsdam/enmap_potsdam_tile_96_0.tif", odd)
    with rasterio.open(odd, "r+") as ds:  # wavelengths shifted by 20 nm: not recognisably EnMAP by content
        for b in range(1, ds.count + 1):
            ds.update_tags(b, wavelength=str(float(ds.tags(b)["wavelength"]) + 20))
    report = validate_scene(odd)
    assert not report.ok  # the generic profile rejects the VNIR/SWIR seam
    (hint,) = [w for w in report.warnings if w.code is Code.PROFILE_SUGGESTED]
    assert "--profile enmap-l2a" in hint.message
    assert "224 bands" in hint.message


def test_content_rules_need_more_than_a_band_count() -> None:
    # 224 bands without EnMAP's wavelengths (e.g. classic AVIRIS) is not EnMAP
    assert match_profile(_meta("scene.tif", 224)) is None
