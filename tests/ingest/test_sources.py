"""Readers of each input format, on the real files in the shared data."""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np
import pytest
import rasterio
import scipy.io

from cubelake.errors import NoCubeError, SceneReadError
from cubelake.grid import Window
from cubelake.ingest.labels import read_label_file
from cubelake.ingest.sources import SceneKind, discover, open_source
from cubelake.ingest.sources.envi import parse_envi_header
from cubelake.ingest.sources.landsat import ESUN_TM, parse_mtl
from cubelake.ingest.sources.matlab import open_mat


def _one(path: Path):  # type: ignore[no-untyped-def]
    (inp,) = discover([path])
    return open_source(inp)


def test_envi_header_parser_multiline_braces() -> None:
    text = "ENVI\nsamples = 3\nwavelength = {\n 400.0, 500.0,\n 600.0}\nband names = {a, b, c}\n"
    fields = parse_envi_header(text, "x.hdr")
    assert fields["samples"] == "3"
    assert fields["wavelength"].replace(" ", "") == "{400.0,500.0,600.0}"
    with pytest.raises(SceneReadError, match="not an ENVI header"):
        parse_envi_header("NOT ENVI\n", "x.hdr")


def test_aviris_ng_wavelengths_from_band_names(real: Path) -> None:
    src = _one(real / "hsi_aviris_ng_isofit/topoflux/ang20160910t185702_2rdn_img.hdr")
    m = src.meta
    assert m.format == "ENVI"
    assert m.shape == (425, 25, 30)
    assert m.wavelengths_nm[0] == pytest.approx(376.44)
    assert m.wavelengths_nm[-1] == pytest.approx(2500.12)
    assert m.nodata == -9999.0
    assert m.crs_epsg == 32611
    # pixels match GDAL's own ENVI reading
    with rasterio.open(real / "hsi_aviris_ng_isofit/topoflux/ang20160910t185702_2rdn_img") as ds:
        np.testing.assert_array_equal(src.read(Window(3, 4, 10, 12)), ds.read(window=rasterio.windows.Window(4, 3, 12, 10)))
    src.close()


def test_aviris_ng_bil_wavelength_and_fwhm_keys(real: Path) -> None:
    src = _one(real / "hsi_aviris_ng_isofit/small_chunk/ang20170323t202244_rdn_7000-7010.hdr")
    assert src.meta.interleave == "bil"
    assert src.meta.fwhm_nm[0] == pytest.approx(5.57)
    assert not src.meta.georeferenced
    src.close()


def test_enmap_band_tags_and_bbl(real: Path) -> None:
    src = _one(real / "hsi_enmap_potsdam/enmap_potsdam_tile_96_0.tif")
    bands = src.meta.bands
    assert bands[0].wavelength_nm == pytest.approx(418.24)
    assert bands[0].fwhm_nm == pytest.approx(6.99561)
    assert [b.number for b in bands if b.flagged_bad] == list(range(130, 136))
    assert src.meta.datetime == "2022-07-24T10:45:26"
    src.close()


def test_envi_header_without_data_file(real: Path) -> None:
    (inp,) = discover([real / "hsi_indian_pines_purdue/indianpines_ds_raw.hdr"])
    assert inp.kind is SceneKind.ENVI
    assert inp.data is None
    src = open_source(inp)
    assert src.meta.shape == (220, 145, 145)
    assert src.meta.dtype == "uint16"
    with pytest.raises(SceneReadError):
        src.read(Window(0, 0, 1, 1))


def test_jasper_ridge_bands_by_pixels_unfolds_column_major(real: Path) -> None:
    path = real / "hsi_jasper_ridge/jasperRidge2_R198.mat"
    src = open_mat(path)
    d = scipy.io.loadmat(path)
    y, nrow = d["Y"], int(d["nRow"].squeeze())
    assert src.meta.shape == (198, 100, 100)
    cube = src.read(Window(0, 0, 100, 100))
    for r, c in [(0, 0), (5, 17), (99, 0), (42, 99)]:
        np.testing.assert_array_equal(cube[:, r, c], y[:, c * nrow + r])
    assert src.meta.dtype == "uint16"


def test_abu_cube_axis_order_and_labels(real: Path) -> None:
    path = real / "hsi_abu_anomaly/abu-urban-2.mat"
    src = open_mat(path)
    d = scipy.io.loadmat(path)
    assert src.meta.shape == (198, 100, 100)
    assert src.meta.dtype == "int16"
    np.testing.assert_array_equal(src.read(Window(10, 20, 3, 4)), d["data"][10:13, 20:24, :].transpose(2, 0, 1))
    np.testing.assert_array_equal(src.labels, d["map"])  # type: ignore[attr-defined]


def test_houston_labels_on_another_grid_are_not_attached(real: Path) -> None:
    src = open_mat(real / "hsi_houston2018_crop/houston_dataset.mat")
    assert src.meta.shape == (48, 128, 128)
    assert src.labels is None
    assert any("clasLabs" in i.message for i in src.meta.issues)


def test_mat_label_maps_are_not_cubes(real: Path) -> None:
    with pytest.raises(NoCubeError, match="--labels"):
        open_mat(real / "hsi_ground_truth/Salinas_gt.mat")
    with pytest.raises(NoCubeError):
        open_mat(real / "hsi_ground_truth/v73_hdf5/Salinas_gt.mat")


def test_v73_label_maps_are_transposed_back(real: Path) -> None:
    v5, _, _ = read_label_file(real / "hsi_ground_truth/Salinas_gt.mat")
    v73, _, _ = read_label_file(real / "hsi_ground_truth/v73_hdf5/Salinas_gt.mat")
    np.testing.assert_array_equal(v5, v73)
    with h5py.File(real / "hsi_ground_truth/v73_hdf5/Salinas_gt.mat") as h:
        assert h["gt"].shape == v5.shape[::-1]


def test_v73_cube_reads_lazily_in_matlab_axis_order(tmp_path: Path) -> None:
    # a v7.3 file as MATLAB writes it: HDF5, 512-byte user block, arrays stored transposed
    cube = np.arange(6 * 5 * 4, dtype=np.uint16).reshape(6, 5, 4)  # MATLAB (y, x, band)
    path = tmp_path / "cube73.mat"
    with h5py.File(path, "w", userblock_size=512) as h:
        h["data"] = cube.T
    with open(path, "r+b") as f:
        f.write(b"MATLAB 7.3 MAT-file".ljust(128, b" "))
    src = open_mat(path)
    assert src.meta.format == "MAT-v7.3"
    assert src.meta.shape == (4, 6, 5)
    np.testing.assert_array_equal(src.read(Window(1, 2, 3, 2)), cube[1:4, 2:4, :].transpose(2, 0, 1))
    src.close()


def test_damaged_mat_is_unreadable_with_scipy_reason(real: Path) -> None:
    with pytest.raises(SceneReadError, match="Expecting miMATRIX"):
        open_mat(real / "bad_inputs/mat/Indian_pines_gt_nul_bytes_replaced.mat")


def test_mtl_text_with_nul_padding(real: Path) -> None:
    mtl = parse_mtl(real / "landsat5_tm_rstoolbox/LT52240631988227CUB02_MTL.txt")
    assert mtl["SPACECRAFT_ID"] == "LANDSAT_5"
    assert mtl["RADIANCE_MULT_BAND_3"] == pytest.approx(1.044)
    assert mtl["SUN_ELEVATION"] == pytest.approx(49.75588889)


def test_landsat8_toa_reflectance_coefficients(real: Path) -> None:
    src = _one(real / "landsat8_rio_toa/LC81060712016134LGN00_MTL.txt")
    cal = src.meta.calibration("toa_reflectance")
    assert cal is not None
    s = math.sin(math.radians(45.66897551))
    assert cal.gains == pytest.approx((2.0e-05 / s,))
    assert cal.offsets == pytest.approx((-0.1 / s,))
    assert src.meta.bands[0].name == "B3"
    assert src.meta.datetime is not None
    assert src.meta.datetime.startswith("2016-05-13T01:23:31")
    src.close()


def test_landsat8_json_mtl_finds_renamed_band_file(real: Path) -> None:
    src = _one(real / "landsat8_rio_toa/LC81390452014295LGN00_MTL.json")
    assert src.meta.count == 1
    assert src.meta.files[-1].endswith("tiny_LC81390452014295LGN00_B5.TIF")
    src.close()


def test_landsat5_tm_reflectance_from_esun(real: Path) -> None:
    src = _one(real / "landsat5_tm_rstoolbox/LT52240631988227CUB02_MTL.txt")
    m = src.meta
    assert m.count == 7
    assert [b.name for b in m.bands] == [f"B{i}" for i in range(1, 8)]
    rad = m.calibration("radiance")
    toa = m.calibration("toa_reflectance")
    assert rad is not None
    assert toa is not None
    # Chander et al. (2009): rho = pi * L * d^2 / (ESUN * sin(sun elevation)); 1988-08-14 is day 227
    d = 1.0 - 0.01672 * math.cos(math.radians(0.9856 * (227 - 4)))
    k = math.pi * d * d / (ESUN_TM[3] * math.sin(math.radians(49.75588889)))
    assert toa.gains[2] == pytest.approx(k * 1.044)
    assert toa.offsets[2] == pytest.approx(k * -2.21398)
    assert math.isnan(toa.gains[5])  # thermal band 6 has no reflectance
    src.close()


def test_discovery_groups_files_into_scenes(real: Path) -> None:
    scenes = discover([real / "landsat5_tm_rstoolbox", real / "hsi_enmap_potsdam", real / "hsi_aviris_ng_isofit"])
    names = sorted(s.path.name for s in scenes)
    # the seven band files belong to the MTL; label tiles belong to their scenes; data files to headers
    assert "LT52240631988227CUB02_B1.TIF" not in names
    assert "LT52240631988227CUB02_MTL.txt" in names
    assert sum(n.startswith("enmap_potsdam_tile_") for n in names) == 4
    assert all(n.endswith(".hdr") for n in names if n.startswith("ang"))
    tiles = [s for s in scenes if s.path.name.startswith("enmap_potsdam_tile_")]
    assert all(s.labels is not None and s.labels.parent.name == "labels" for s in tiles)


def test_discovery_keeps_missing_paths(tmp_path: Path) -> None:
    (s,) = discover([tmp_path / "nope.tif"])
    assert s.kind is SceneKind.MISSING


def test_mat_axis_order_detected_from_the_label_map(tmp_path: Path) -> None:
    cube = np.arange(7 * 5 * 6, dtype=np.int16).reshape(7, 5, 6)  # (band, y, x), unusual in MATLAB
    gt = np.zeros((5, 6), dtype=np.uint8)
    gt[1, 2] = 3
    scipy.io.savemat(tmp_path / "byx.mat", {"cube": cube, "gt": gt})
    src = open_mat(tmp_path / "byx.mat")
    assert src.meta.tags["axes"] == "byx"
    assert src.meta.shape == (7, 5, 6)
    np.testing.assert_array_equal(src.read(Window(0, 0, 5, 6)), cube)
    np.testing.assert_array_equal(src.labels, gt)  # type: ignore[attr-defined]
    # and the user can always say it
    forced = open_mat(tmp_path / "byx.mat", axes="yxb")
    assert forced.meta.shape == (6, 7, 5)
