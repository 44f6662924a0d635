"""The DLR delivery reader (EnMAP L1B/L1C/L2A, DESIS L1C/L2A) on deliveries written like DLR's."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
from rasterio.errors import NotGeoreferencedWarning

from cubelake.errors import SceneReadError
from cubelake.grid import Window
from cubelake.ingest.report import Code
from cubelake.ingest.sources import RasterSource
from cubelake.ingest.sources.dlr import (
    CALIBRATION_NAME,
    XML_MAX_BYTES,
    DlrSource,
    dlr_image_files,
    dlr_image_for,
    dlr_side_files,
    is_dlr_metadata,
    open_dlr,
    parse_dlr_xml,
    read_dlr_metadata,
)
from cubelake.testing.dlr import (
    BAD_GAIN_BAND,
    BAD_WL_BAND,
    EPSG,
    HEIGHT,
    TRANSFORM,
    VARIANTS,
    WIDTH,
    Delivery,
    Variant,
    write_desis_delivery,
    write_enmap_delivery,
)

FULL = Window(0, 0, HEIGHT, WIDTH)


def _write(tmp: Path, product: str, **kw: Any) -> Delivery:
    """The delivery of ``product`` (e.g. ``enmap-l2a``), written in ``tmp``."""
    writers: dict[str, Callable[..., Delivery]] = {"enmap": write_enmap_delivery, "desis": write_desis_delivery}
    mission, level = product.split("-")
    return writers[mission](tmp, level.upper(), **kw)


def _image_pixels(d: Delivery) -> np.ndarray:
    """The delivery's pixels as rasterio reads its image file(s), ``(band, y, x)``."""
    parts = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)  # L1B: sensor geometry
        for image in d.images:
            with rasterio.open(image) as ds:
                parts.append(ds.read())
    return np.concatenate(parts)


@pytest.mark.parametrize("product", ["enmap-l2a", "enmap-l1c", "enmap-l1b", "desis-l2a", "desis-l1c"])
def test_metadata_is_read_from_the_xml(tmp_path: Path, product: str) -> None:
    d = _write(tmp_path, product)
    with open_dlr(d.xml) as src:
        m = src.meta
        assert isinstance(src, RasterSource)
        assert m.tags["cubelake:product"] == product
        assert m.shape == (12, HEIGHT, WIDTH)
        assert m.dtype == d.dtype
        assert m.wavelengths_nm == list(d.wavelengths_nm)  # as delivered: never reordered
        assert m.fwhm_nm == list(d.fwhm_nm)
        assert [b.number for b in m.bands if b.flagged_bad] == list(d.bad_bands)
        cal = m.calibration(CALIBRATION_NAME)
        assert cal is not None
        assert cal.gains == d.gains
        assert cal.offsets == d.offsets
        assert cal.unit == ("1" if product.endswith("l2a") else
                            "W/(m2 sr nm)" if product.startswith("enmap") else "mW/(cm2 sr um)")
        assert m.datetime == d.start_time
        assert m.path == str(d.xml)
        assert m.files[-1] == str(d.xml)
        assert m.files[:-1] == tuple(str(p) for p in d.images)
        assert m.format == ("DLR-EnMAP" if product.startswith("enmap") else "DLR-DESIS")
        assert m.tags["dlr:level"] == product[-3:].upper()


@pytest.mark.parametrize("product", ["enmap-l2a", "enmap-l1c", "desis-l2a"])
def test_orthoproducts_keep_the_image_grid(tmp_path: Path, product: str) -> None:
    d = _write(tmp_path, product)
    with open_dlr(d.xml) as src:
        m = src.meta
        assert m.crs_epsg == EPSG
        assert m.transform == (TRANSFORM.a, TRANSFORM.b, TRANSFORM.c, TRANSFORM.d, TRANSFORM.e, TRANSFORM.f)
        assert m.georeferenced
        assert m.nodata == d.nodata


def test_enmap_l2a_values(tmp_path: Path) -> None:
    m = open_dlr(write_enmap_delivery(tmp_path, "L2A").xml).meta
    assert m.wavelengths_nm[6:8] == [993.08, 902.26]  # the VNIR/SWIR seam steps back
    assert m.nodata == -32768.0
    cal = m.calibration(CALIBRATION_NAME)
    assert cal is not None
    assert cal.gains[0] == 1e-4
    assert m.bands[9].flagged_bad  # missing from swirProductQuality/expectedChannelsList
    assert m.tags["dlr:stop_time"] == "2022-06-12T10:57:39.668677Z"


def test_enmap_l1b_is_stacked_vnir_then_swir_without_crs(tmp_path: Path) -> None:
    d = write_enmap_delivery(tmp_path, "L1B")
    assert [p.name.rsplit("Z-", 1)[1] for p in d.images] == ["SPECTRAL_IMAGE_VNIR.TIF", "SPECTRAL_IMAGE_SWIR.TIF"]
    with open_dlr(d.xml) as src:
        m = src.meta
        assert m.crs_epsg is None
        assert m.crs_wkt is None
        assert m.transform is None
        assert not m.georeferenced
        assert m.nodata == 0.0  # the image has none: the XML's backgroundValue
        assert [i.code for i in m.issues] == [Code.NOT_GEOREFERENCED]
        assert "co-registered" in m.issues[0].message
        np.testing.assert_array_equal(src.read(FULL), _image_pixels(d))
    assert dlr_image_files(d.xml) == d.images
    assert dlr_image_for(d.xml) == d.images[0]


def test_desis_reads_only_spectral_band_elements(tmp_path: Path) -> None:
    d = write_desis_delivery(tmp_path, "L2A")
    text = d.xml.read_text()
    assert text.count("<band>") == 12 + 3  # bandCharacterisation + interiorOrientation
    m = open_dlr(d.xml).meta
    assert m.count == 12
    assert m.fwhm_nm[0] == 3.5  # wavelengthWidthOfBand
    assert not any(b.flagged_bad for b in m.bands)


@pytest.mark.parametrize("product", ["enmap-l2a", "enmap-l1c", "enmap-l1b", "desis-l2a", "desis-l1c"])
def test_pixels_equal_rasterio(tmp_path: Path, product: str) -> None:
    d = _write(tmp_path, product)
    expected = _image_pixels(d)
    with open_dlr(d.xml) as src:
        np.testing.assert_array_equal(src.read(FULL), expected)
        win = Window(3, 5, 11, 7)
        np.testing.assert_array_equal(src.read(win), expected[:, 3:14, 5:12])
        assert list(src.blocks(win)) == list(src.image.blocks(win))


@pytest.mark.parametrize("product", ["enmap-l1c", "desis-l1c", "enmap-l2a"])
def test_calibration_gives_gain_times_dn_plus_offset(tmp_path: Path, product: str) -> None:
    d = _write(tmp_path, product)
    with open_dlr(d.xml) as src:
        cal = src.meta.calibration(CALIBRATION_NAME)
        assert cal is not None
        dn = src.read(FULL).astype(np.float64)
    value = np.asarray(cal.gains)[:, None, None] * dn + np.asarray(cal.offsets)[:, None, None]
    direct = np.stack([g * dn[i] + o for i, (g, o) in enumerate(zip(d.gains, d.offsets, strict=True))])
    np.testing.assert_array_equal(value, direct)
    if product == "enmap-l1c":
        assert len(set(cal.gains)) == 12  # a different gain for every band, not one scale factor


def test_envi_delivery_with_upper_case_header(tmp_path: Path) -> None:
    d = write_enmap_delivery(tmp_path, "L2A", image_format="ENVI")
    header = d.images[0].with_suffix(".HDR")
    assert header.exists()
    assert not d.images[0].with_suffix(".hdr").exists()
    assert dlr_image_for(d.xml) == d.images[0]
    with open_dlr(d.xml) as src:
        m = src.meta
        assert m.tags["dlr:image_format"] == "ENVI"
        assert m.files == (str(d.images[0]), str(header), str(d.xml))
        assert m.wavelengths_nm == list(d.wavelengths_nm)
        assert m.crs_epsg == EPSG
        np.testing.assert_array_equal(src.read(FULL), _image_pixels(d))


def test_is_dlr_metadata(tmp_path: Path) -> None:
    enmap = write_enmap_delivery(tmp_path, "L2A")
    desis = write_desis_delivery(tmp_path, "L2A")
    assert is_dlr_metadata(enmap.xml)
    assert is_dlr_metadata(desis.xml)  # lower-case -METADATA.xml
    other = tmp_path / "S2A_MSIL2A-METADATA.XML"
    other.write_text('<?xml version="1.0"?>\n<!-- not DLR -->\n<n1:Level-2A_User_Product xmlns:n1="x"/>\n')
    renamed = tmp_path / "copy.xml"
    renamed.write_bytes(enmap.xml.read_bytes())
    folder = tmp_path / "folder-METADATA.XML"
    folder.mkdir()
    assert not is_dlr_metadata(other)
    assert not is_dlr_metadata(renamed)  # the name must say METADATA.XML
    assert not is_dlr_metadata(desis.folder / f"{desis.folder.name}-HISTORY.xml")
    assert not is_dlr_metadata(folder)
    assert not is_dlr_metadata(tmp_path / "missing-METADATA.XML")
    assert not is_dlr_metadata(Path("bad\x00name-METADATA.XML"))


@pytest.mark.serial  # a time bound: run alone
def test_is_dlr_metadata_reads_only_the_head(tmp_path: Path) -> None:
    big = tmp_path / "big-METADATA.XML"
    with open(big, "wb") as f:  # a sparse 2 GB file: reading it whole would take seconds
        f.write(b"<level_X>")
        f.truncate(2 * 1024**3)
    t = time.perf_counter()
    assert is_dlr_metadata(big)
    assert time.perf_counter() - t < 0.5
    fifo = tmp_path / "pipe-METADATA.XML"
    os.mkfifo(fifo)
    assert not is_dlr_metadata(fifo)  # never opened: a FIFO would block


def test_side_files_and_image(tmp_path: Path) -> None:
    for d in (write_enmap_delivery(tmp_path, "L2A"), write_desis_delivery(tmp_path, "L2A")):
        assert dlr_image_for(d.xml) == d.images[0]
        side = dlr_side_files(d.xml)
        assert side == list(d.side_files)
        assert d.xml not in side
        names = " ".join(p.name for p in side)
        assert "QL_QUALITY" in names
        assert "SPECTRAL_IMAGE" in names  # not a scene of its own either
    desis_hdr = [p for p in dlr_side_files(d.xml) if p.suffix == ".hdr"]
    assert len(desis_hdr) == 1  # the ENVI header DESIS puts next to its .tif


def test_flat_folder_with_two_deliveries(tmp_path: Path) -> None:
    a = write_enmap_delivery(tmp_path, "L2A", nested=False, seed=3)
    b = write_enmap_delivery(tmp_path, "L1C", nested=False, seed=4)
    assert a.folder == b.folder == tmp_path
    assert set(dlr_side_files(a.xml)).isdisjoint(dlr_side_files(b.xml))
    with open_dlr(a.xml) as sa, open_dlr(b.xml) as sb:
        assert sa.meta.tags["cubelake:product"] == "enmap-l2a"
        assert sb.meta.tags["cubelake:product"] == "enmap-l1c"
        np.testing.assert_array_equal(sa.read(FULL), _image_pixels(a))
        np.testing.assert_array_equal(sb.read(FULL), _image_pixels(b))


_EXPECTED: dict[str, tuple[str, ...]] = {
    "no_band_characterisation": ("no specific/bandCharacterisation element",),
    "band_without_wavelength": (f"band {BAD_WL_BAND} has no wavelengthCenterOfBand",),
    "non_numeric_gain": (f"band {BAD_GAIN_BAND}: ", "ainOfBand = '0,0001' is not a number"),
    "xml_band_count_differs": ("describes 13 bands", "has 12", "SPECTRAL_IMAGE"),
    "no_image": ("no spectral image", "-SPECTRAL_IMAGE."),
    "truncated_xml": ("not well-formed XML", "truncated"),
    "garbage_xml": ("not well-formed XML",),
    "billion_laughs": ("DTD or entities", "billion laughs"),
}


@pytest.mark.serial  # a time bound: run alone
@pytest.mark.parametrize("mission", ["enmap", "desis"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_malformed_delivery_is_refused_naming_file_and_piece(tmp_path: Path, mission: str,
                                                             variant: Variant) -> None:
    d = _write(tmp_path, f"{mission}-l2a", variant=variant)
    t = time.perf_counter()
    with pytest.raises(SceneReadError) as exc:
        open_dlr(d.xml)
    assert time.perf_counter() - t < 1.0  # the entity bomb is refused, not expanded
    message = str(exc.value)
    assert message.startswith(str(d.xml))
    for piece in _EXPECTED[variant]:
        assert piece in message
    if variant == "xml_band_count_differs":
        assert str(d.images[0]) in message  # both files named
    if variant == "no_band_characterisation" and mission == "desis":
        assert "not a DESIS METADATA.XML" in message


def test_every_band_problem_is_listed(tmp_path: Path) -> None:
    d = write_enmap_delivery(tmp_path, "L2A")
    text = d.xml.read_text()
    text = text.replace("<FWHMOfBand>6.5</FWHMOfBand>", "<FWHMOfBand>-6.5</FWHMOfBand>")
    text = text.replace("<OffsetOfBand>0.0</OffsetOfBand>", "<OffsetOfBand>nan</OffsetOfBand>", 1)
    text = text.replace('<bandID number="12">', '<bandID number="twelve">')
    d.xml.write_text(text)
    with pytest.raises(SceneReadError, match=r"3 problem\(s\) in specific/bandCharacterisation") as exc:
        open_dlr(d.xml)
    message = str(exc.value)
    assert "band 1: FWHMOfBand = '-6.5' must be a finite number > 0" in message
    assert "band 1: OffsetOfBand = 'nan' must be a finite number" in message
    assert "bandID element 12: the bandID attribute number = 'twelve' is not a band number" in message


def test_level_elements_must_agree(tmp_path: Path) -> None:
    d = write_enmap_delivery(tmp_path, "L2A")
    d.xml.write_text(d.xml.read_text().replace("<code>L2A</code>", "<code>L1C</code>"))
    with pytest.raises(SceneReadError, match=r"level elements disagree \(specific/code = L1C, base/level = L2A"):
        open_dlr(d.xml)


def test_unknown_level_is_refused(tmp_path: Path) -> None:
    d = write_enmap_delivery(tmp_path, "L2A")
    text = d.xml.read_text()
    for path in ("code", "level", "processingLevel"):
        text = text.replace(f"<{path}>L2A</{path}>", f"<{path}>L0</{path}>")
    d.xml.write_text(text)
    with pytest.raises(SceneReadError, match=r"specific/code = 'L0' is not a level cubelake reads"):
        open_dlr(d.xml)


def test_desis_without_level_element_takes_the_file_name(tmp_path: Path) -> None:
    d = write_desis_delivery(tmp_path, "L1C", desis_level_element=False)
    m = open_dlr(d.xml).meta
    assert m.tags["cubelake:product"] == "desis-l1c"
    assert any(i.code == Code.CALIBRATION_SUSPECT and "file name" in i.message for i in m.issues)


def test_unparseable_start_time_is_a_warning(tmp_path: Path) -> None:
    d = write_desis_delivery(tmp_path, "L2A")
    d.xml.write_text(d.xml.read_text().replace("2020-08-04T23:45:20.461735Z", "yesterday"))
    m = open_dlr(d.xml).meta
    assert m.datetime is None
    assert any(i.code == Code.UNKNOWN_TIME and "base/temporalCoverage/startTime" in i.message for i in m.issues)


def test_oversized_xml_is_not_read(tmp_path: Path) -> None:
    d = write_enmap_delivery(tmp_path, "L2A")
    with open(d.xml, "r+b") as f:
        f.truncate(XML_MAX_BYTES + 1)  # sparse: refused by its size, never read
    with pytest.raises(SceneReadError, match=r"far larger than a DLR METADATA\.XML"):
        open_dlr(d.xml)


def test_headerless_envi_image_is_named(tmp_path: Path) -> None:
    d = write_enmap_delivery(tmp_path, "L2A", image_format="ENVI")
    d.images[0].with_suffix(".HDR").unlink()
    assert dlr_image_for(d.xml) is None
    with pytest.raises(SceneReadError, match=r"SPECTRAL_IMAGE\.BSQ is ENVI data without its header"):
        open_dlr(d.xml)


def test_not_a_dlr_root_is_refused() -> None:
    root = parse_dlr_xml(b"<Level-1C_User_Product><x/></Level-1C_User_Product>", "a-METADATA.XML")
    with pytest.raises(SceneReadError, match="not EnMAP's <level_X> or DESIS's <hsi_doc>"):
        read_dlr_metadata(root, "a-METADATA.XML")


def test_namespaced_xml_is_read(tmp_path: Path) -> None:
    d = write_enmap_delivery(tmp_path, "L2A")
    text = d.xml.read_text().replace("<level_X ", '<level_X xmlns="http://example.org/enmap" ', 1)
    m = read_dlr_metadata(parse_dlr_xml(text.encode(), d.xml.name), d.xml.name)
    assert m.product == "enmap-l2a"
    assert len(m.bands) == 12


def test_source_is_a_plain_wrapper(tmp_path: Path) -> None:
    d = write_desis_delivery(tmp_path, "L2A")
    src = open_dlr(d.xml)
    assert isinstance(src, DlrSource)
    assert src.image.meta.path == str(d.images[0])  # the image's own metadata stays available
    assert src.image.meta.wavelengths_nm != src.meta.wavelengths_nm  # the GeoTIFF itself has none
    src.close()


# ---------------------------------------------------------------- discovery, profile and ingest of deliveries


@pytest.mark.parametrize("product", ["enmap-l2a", "enmap-l1c", "desis-l2a"])
def test_a_delivery_folder_is_one_scene_ingested_with_its_product_profile(tmp_path: Path, product: str) -> None:
    import json

    from cubelake.ingest import load_profile, match_profile
    from cubelake.ingest.sources import SceneKind, discover, open_source

    from ..conftest import no_traceback, run_cli

    d = _write(tmp_path / "in", product)
    (scene,) = discover([tmp_path / "in"])  # the image, quicklooks and masks belong to the XML
    assert (scene.kind, scene.path) == (SceneKind.DLR, d.xml)
    src = open_source(scene)
    assert match_profile(src.meta) == load_profile(product)  # by the XML's own level, not the file name
    dn = src.read(FULL).astype(np.float64)
    src.close()
    lake = tmp_path / "lake"
    res = run_cli("ingest", str(tmp_path / "in"), "--lake", str(lake), "--products", "cog")
    out = no_traceback(res)
    assert res.returncode == 0, out
    (folder,) = (lake / "scenes").iterdir()
    assert folder.name == d.xml.name[: -len("-METADATA.XML")]  # the delivery's name is the scene's id
    record = json.loads((folder / "scene.json").read_text())
    assert record["profile"]["name"] == product
    assert record["acquisition"]["datetime"].startswith(d.start_time[:19])
    kept = [b["source_band"] for b in record["bands"]]
    assert not set(kept) & set(d.bad_bands)
    with rasterio.open(next(folder.glob("*.tif"))) as ds:
        got, scales, offsets = ds.read(masked=True), ds.scales, ds.offsets  # int16 products carry CF scaling
    for k, band in enumerate(kept):
        valid = ~got.mask[k]
        value = got[k].data[valid] * scales[k] + offsets[k]
        expected = d.gains[band - 1] * dn[band - 1] + d.offsets[band - 1]  # the XML's per-band coefficients
        np.testing.assert_allclose(value, expected[valid], rtol=1e-6)


def test_an_l1b_delivery_never_gets_the_l2a_profile(tmp_path: Path) -> None:
    import dataclasses

    from cubelake.ingest import match_profile

    d = _write(tmp_path, "enmap-l1b")
    src = open_dlr(d.xml)
    meta = dataclasses.replace(src.meta, count=224)  # a full-size L1B: 224 bands, named ENMAP01-…
    src.close()
    assert meta.tags["cubelake:product"] == "enmap-l1b"
    found = match_profile(meta)
    assert found is None or found.name != "enmap-l2a"  # radiance is never scaled as reflectance


def test_a_delivery_on_s3_is_read_in_place_and_equals_the_local_ingest(s3_server: Any, s3_bucket: str,
                                                                       tmp_path: Path) -> None:
    import json

    import zarr

    from ..conftest import no_traceback, run_cli

    d = _write(tmp_path / "in", "enmap-l2a")
    client = s3_server.client()
    for f in sorted(d.folder.iterdir()):
        client.upload_file(str(f), s3_bucket, f"deliveries/{d.folder.name}/{f.name}")
    env = s3_server.env(tmp_path)
    local, remote = tmp_path / "local", tmp_path / "remote"
    assert run_cli("ingest", str(d.folder), "--lake", str(local), "--products", "zarr").returncode == 0
    res = run_cli("ingest", f"s3://{s3_bucket}/deliveries/", "--lake", str(remote), "--products", "zarr",
                  "--format", "json", env=env)
    out = no_traceback(res)
    assert res.returncode == 0, out
    results = json.loads(res.stdout)["results"]
    assert len(results) == 1  # the image, masks and quicklooks are the XML's, not scenes
    sid = d.xml.name[: -len("-METADATA.XML")]
    here = json.loads((local / "scenes" / sid / "scene.json").read_text())
    there = json.loads((remote / "scenes" / sid / "scene.json").read_text())
    assert there["source"]["path"] == f"s3://{s3_bucket}/deliveries/{d.folder.name}/{d.xml.name}"
    for part in ("bands", "grid", "acquisition", "profile", "calibration"):
        assert there[part] == here[part], part
    a = zarr.open_group(str(local / "scenes" / sid / f"{sid}.zarr"), mode="r")
    b = zarr.open_group(str(remote / "scenes" / sid / f"{sid}.zarr"), mode="r")
    name = next(iter(a.array_keys()))
    np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]))
