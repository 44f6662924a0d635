"""PRISMA L1/L2 products: VNIR + SWIR merged, scaled by the product's attributes, L2D georeferenced."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from cubelake.errors import SceneReadError
from cubelake.grid import Window
from cubelake.ingest import load_profile, match_profile
from cubelake.ingest.plan import build_plan
from cubelake.ingest.sources import discover, open_source
from cubelake.testing.prisma import N_SWIR_ZERO, N_VNIR_ZERO, calibrated, write_prisma

NAME = "PRS_L2D_STD_20200613102341_20200613102345_0001.he5"


def _open(path: Path):  # type: ignore[no-untyped-def]
    (inp,) = discover([path])
    return open_source(inp)


def _slot_of(p, detector: str, wavelength: float) -> int:  # type: ignore[no-untyped-def]
    cw = p.cw_vnir if detector == "VNIR" else p.cw_swir
    return int(np.flatnonzero(np.isclose(cw, wavelength))[0])


def test_l2d_metadata_and_merge_order(tmp_path: Path) -> None:
    p = write_prisma(tmp_path / NAME)
    src = _open(p.path)
    m = src.meta
    assert m.format == "PRISMA-L2D"
    n_v, n_s = p.cw_vnir.size - N_VNIR_ZERO, p.cw_swir.size - N_SWIR_ZERO
    assert m.shape == (n_v + n_s, 20, 24)  # unused slots (centre 0) left out
    wl = np.array(m.wavelengths_nm)
    assert np.all(np.diff(wl[:n_v]) > 0)  # VNIR increasing, then SWIR increasing
    assert np.all(np.diff(wl[n_v:]) > 0)
    assert wl[n_v] < wl[n_v - 1]  # one step back at the seam: the overlap
    np.testing.assert_allclose(sorted(wl[:n_v]), sorted(p.cw_vnir[p.cw_vnir > 0]), rtol=1e-6)
    flagged = [b for b in m.bands if b.flagged_bad]
    assert [b.name for b in flagged] == [f"VNIR {int(np.flatnonzero((p.flags_vnir == 0) & (p.cw_vnir > 0))[0]) + 1}"]
    assert m.crs_epsg == 32632
    # corners are pixel centres: the grid's outer edge is half a pixel beyond them
    assert m.transform == (30.0, 0.0, 514185.0 - 15.0, 0.0, -30.0, 5036115.0 + 15.0)
    assert m.datetime == "2020-06-13T10:23:41.123456Z"
    assert match_profile(m) == load_profile("prisma-l2d")
    src.close()


@pytest.mark.parametrize("level", ["L2D", "L1"])
def test_calibrated_values_equal_the_documented_formula(tmp_path: Path, level: str) -> None:
    p = write_prisma(tmp_path / f"PRS_{level}_STD_20200613102341_20200613102345_0001.he5", level=level)
    src = _open(p.path)
    m = src.meta
    (cal,) = m.calibrations
    raw = src.read(Window(2, 3, 9, 11)).astype(np.float64)
    for k, band in enumerate(m.bands):
        detector, slot1 = band.name.split()  # "VNIR 7": 1-based slot in the file's cube
        slot = int(slot1) - 1
        cube = p.vnir if detector == "VNIR" else p.swir
        dn = cube[2:11, slot, 3:14]
        np.testing.assert_array_equal(raw[k], dn)  # the merged cube is the file's band, BIL transposed
        expected = calibrated(p, level, detector, slot, dn)
        np.testing.assert_allclose(cal.gains[k] * raw[k] + cal.offsets[k], expected, rtol=1e-6, atol=1e-9)
        assert band.wavelength_nm == pytest.approx(float((p.cw_vnir if detector == "VNIR" else p.cw_swir)[slot]))
    if level == "L1":
        assert not m.georeferenced
        assert any(i.code == "not_georeferenced" for i in m.issues)
        assert match_profile(m) == load_profile("prisma-l1")
    src.close()


@pytest.mark.parametrize(("policy", "kept_detector"), [("drop", "VNIR"), ("drop-earlier", "SWIR")])
def test_seam_overlap_follows_the_profile_policy(tmp_path: Path, policy: str, kept_detector: str) -> None:
    p = write_prisma(tmp_path / NAME)
    src = _open(p.path)
    m = src.meta
    profile = load_profile("prisma-l2d")
    profile = profile.model_copy(update={"spectral": profile.spectral.model_copy(update={"overlap": policy})})
    plan, issues = build_plan(m, profile)
    assert plan is not None, issues
    kept = plan.bands
    wl = [b.wavelength_nm for b in kept]
    assert all(b > a for a, b in itertools.pairwise(wl))  # de-duplicated: strictly increasing
    vnir_max = max(p.cw_vnir)
    swir_min = min(p.cw_swir[p.cw_swir > 0])
    overlap = [b for b in kept if swir_min <= b.wavelength_nm <= vnir_max]  # type: ignore[operator]
    assert overlap
    assert {b.name.split()[0] for b in overlap} == {kept_detector}  # type: ignore[union-attr]
    src.close()


def test_a_profile_with_overlap_error_rejects_the_seam(tmp_path: Path) -> None:
    p = write_prisma(tmp_path / NAME)
    src = _open(p.path)
    profile = load_profile("prisma-l2d")
    profile = profile.model_copy(update={"spectral": profile.spectral.model_copy(update={"overlap": "error"})})
    _plan, issues = build_plan(src.meta, profile)
    assert any(i.code == "wavelength_order" and i.severity == "error" for i in issues)
    src.close()


@pytest.mark.parametrize(("kwargs", "piece"), [
    ({"drop": ("SWIR_Cube",)}, "no dataset 'HDFEOS/SWATHS/PRS_L2D_HCO/Data Fields/SWIR_Cube'"),
    ({"drop": ("List_Cw_Swir",)}, "attribute 'List_Cw_Swir' missing"),
    ({"drop": ("L2ScaleVnirMax",)}, "attribute 'L2ScaleVnirMax' missing"),
    ({"drop": ("Epsg_Code",)}, "attribute 'Epsg_Code' missing"),
    ({"swir_shape": (20, 17, 24)}, r"'List_Cw_Swir' has 16 values for 17 bands"),
    ({"swir_shape": (19, 16, 24)}, "not on one \\(rows, cols\\) grid"),
])
def test_malformed_products_name_the_missing_piece(tmp_path: Path, kwargs: dict, piece: str) -> None:  # type: ignore[type-arg]
    p = write_prisma(tmp_path / NAME, **kwargs)
    with pytest.raises(SceneReadError, match=piece) as info:
        _open(p.path)
    assert NAME in str(info.value)


def test_truncated_product_is_refused(tmp_path: Path) -> None:
    p = write_prisma(tmp_path / NAME)
    data = p.path.read_bytes()
    p.path.write_bytes(data[: len(data) // 3])
    with pytest.raises(SceneReadError, match=f"{NAME}: not a readable HDF5 file"):
        _open(p.path)


def test_an_unknown_epsg_code_names_the_file(tmp_path: Path) -> None:
    import h5py

    p = write_prisma(tmp_path / NAME)
    with h5py.File(p.path, "r+") as f:
        f.attrs["Epsg_Code"] = np.int32(999999)
    with pytest.raises(SceneReadError, match="Epsg_Code 999999 is not a CRS pyproj knows") as info:
        _open(p.path)
    assert str(info.value).startswith(str(p.path))


def _edit(path: Path, **attrs: object) -> None:
    import h5py

    with h5py.File(path, "r+") as f:
        for key, value in attrs.items():
            if value is None:
                del f.attrs[key]
            else:
                f.attrs[key] = value


def test_bands_are_numbered_from_1_and_the_detectors_counted(tmp_path: Path) -> None:
    p = write_prisma(tmp_path / NAME)
    src = _open(p.path)
    n_v, n_s = p.cw_vnir.size - N_VNIR_ZERO, p.cw_swir.size - N_SWIR_ZERO
    assert [b.number for b in src.meta.bands] == list(range(1, n_v + n_s + 1))
    assert src.meta.tags["prisma:detectors"] == f"VNIR {n_v} + SWIR {n_s} bands"
    src.close()


def test_the_grid_edge_is_half_a_pixel_beyond_the_corner_centres_at_any_pixel_size(tmp_path: Path) -> None:
    p = write_prisma(tmp_path / NAME, rows=20, cols=24)
    _edit(p.path, Product_LRcorner_easting=514185.0 + 25.0 * 23, Product_LRcorner_northing=5036115.0 - 25.0 * 19)
    src = _open(p.path)
    assert src.meta.transform == (25.0, 0.0, 514185.0 - 12.5, 0.0, -25.0, 5036115.0 + 12.5)
    src.close()


@pytest.mark.parametrize(("attrs", "words"), [
    ({"Product_LRcorner_northing": 5036115.0 + 30.0 * 19}, "is not a north-up map grid"),  # rows going north
    ({"Product_LRcorner_easting": 514185.0 - 30.0 * 23}, "is not a north-up map grid"),  # columns going west
    ({"Epsg_Code": np.float64(32632.5)}, "Epsg_Code 32632.5"),
    ({"Epsg_Code": np.int32(-32632)}, "is not a north-up map grid"),
])
def test_a_damaged_l2d_grid_is_refused(tmp_path: Path, attrs: dict, words: str) -> None:  # type: ignore[type-arg]
    p = write_prisma(tmp_path / NAME)
    _edit(p.path, **attrs)
    with pytest.raises(SceneReadError, match=words):
        _open(p.path)


def test_an_l1_needs_its_offsets_and_a_non_zero_scale_factor(tmp_path: Path) -> None:
    name = "PRS_L1_STD_20200613102341_20200613102345_0001.he5"
    p = write_prisma(tmp_path / name, level="L1")
    src = _open(p.path)
    (cal,) = src.meta.calibrations
    assert sorted(set(cal.gains)) == pytest.approx([1 / 200.0, 1 / 100.0])
    assert sorted(set(cal.offsets)) == pytest.approx([-0.05, -0.02])  # radiance = DN / ScaleFactor - Offset
    src.close()
    _edit(p.path, ScaleFactor_Swir=0.0)
    with pytest.raises(SceneReadError, match=r"ScaleFactor_Swir is 0\.0; radiance = DN / ScaleFactor - Offset needs"):
        _open(p.path)
    _edit(p.path, ScaleFactor_Swir=200.0, Offset_Vnir=None)
    with pytest.raises(SceneReadError, match="attribute 'Offset_Vnir' missing"):
        _open(p.path)


def test_grids_that_differ_are_named_with_both_shapes(tmp_path: Path) -> None:
    p = write_prisma(tmp_path / NAME, swir_shape=(19, 16, 24))
    with pytest.raises(SceneReadError, match=rf"VNIR_Cube \({', '.join(map(str, p.vnir.shape))}\) and SWIR_Cube "
                                              r"\(19, 16, 24\) are not on one"):
        _open(p.path)


def test_a_one_column_l2d_has_no_pixel_size_and_is_refused(tmp_path: Path) -> None:
    p = write_prisma(tmp_path / NAME, cols=1)
    with pytest.raises(SceneReadError, match="is not a north-up map grid"):
        _open(p.path)
