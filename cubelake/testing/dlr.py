"""Small DLR deliveries (EnMAP L1B/L1C/L2A, DESIS L1C/L2A) written the way DLR writes them, and broken ones.

Specifications the structure follows:

* **EnMAP**: DLR, "EnMAP HSI Level 1B / Level 1C / Level 2A Product Specification", Doc. ID
  EN-PCV-ICD-2009-2 (the issue could not be confirmed here), XML schema ``metadata_Lx_00-02-00.xsd``.
* **DESIS**: DLR, "DESIS Product Specification", Doc. ID PAV-DLR-ICD-003, Issue 1.0, 2019-06-04.

Neither PDF can be downloaded here, so element names, nesting and file names were cross-checked instead:

* EnMAP, against DLR's own qualification products (``ENMAP01-____L{1B,1C,2A}-DT0000326721_...
  -METADATA.XML``, schema 00.02.00, processor 00.02.04) shipped as test data in
  ``senbox-org/optical-toolbox`` (``opttbx-enmap-reader/src/test/resources/eu/esa/opt/dataio/enmap/
  enmap_L*_gtif_qualification.zip``): root ``level_X``; the ``metadata``/``processing``/``base``/
  ``specific``/``product`` sections and their children as written below; ``bandID[@number]`` with
  ``wavelengthCenterOfBand``, ``FWHMOfBand``, ``GainOfBand``, ``OffsetOfBand``; the level in
  ``specific/code``, ``base/level`` and ``metadata/schema/processingLevel``; ``startTime``/``stopTime`` as
  ``2017-06-26T10:20:20.999936Z``; ``{vnir,swir}ProductQuality/expectedChannelsList``; ``product/image/
  merge`` (L1C/L2A) or ``product/image/{vnir,swir}`` (L1B, whose image comes as ``-SPECTRAL_IMAGE_VNIR.TIF``
  and ``-SPECTRAL_IMAGE_SWIR.TIF``); ``product/bandStatistics/bandID`` (``waveLength``, ``mean``,
  ``stdDeviation``); the ``QL_*`` side files. Also against the public readers ``EnMAP-Box/enmap-box``
  (``enmapboxprocessing/algorithm/importenmapl{1b,2a}algorithm.py``: paths, the no-data-band rule
  ``mean == -1000000 and stdDeviation == 0``, image suffixes), ``GFZ/enpt`` (``enpt/model/metadata/
  metadata_sensorgeo.py``, ``metadata_mapgeo.py``) and ``senbox-org/optical-toolbox`` (``EnmapMetadata.java``,
  ``EnmapL1BMetadata.java``: radiance unit W/m^2/sr/nm, uint16 L1B/L1C data).
* DESIS, against public readers only (no real DESIS XML was found): root ``hsi_doc`` with
  ``processing/ozoneValue``, ``base/spatialCoverage/boundingPolygon/point`` (``frame`` ``point_1``..),
  ``base/temporalCoverage/startTime``/``endTime``, ``base/altitudeCoverage``, and ``specific`` holding the
  scene angles, ``terrain``, ``waterVapour``, ``haze``, ``clouds``, ... and ``bandCharacterisation/band``
  (``bandNumber``, ``wavelengthCenterOfBand``, ``wavelengthWidthOfBand``, ``gainOfBand``, ``offsetOfBand``,
  ``deadPixels``, ``suspiciousPixel``, ``response``, ``wavelengths``): a DESIS granule reader found by the
  search tools (xmltodict over ``hsi_doc``), SISTER's ``desis_to_envi`` (``root[2]`` = base, ``root[3]`` =
  specific), ``acolite/acolite`` (``acolite/desis/metadata*.py``: ``backgroundValue``, ``productType``,
  ``tileID``, ... read by tag name), ``EnMAP-Box/enmap-box`` (``importdesisl{1b,2a}algorithm.py``: the
  ``-SPECTRAL_IMAGE.hdr`` next to the ``.tif``) and the DLR product page (L1B/L1C radiance in
  mW/(cm2 sr um); 235 bands without binning). **Assumed, not confirmed**: the DESIS ``metadata`` section,
  the level in ``base/level`` (as in EnMAP's XML; ``desis_level_element=False`` writes none), the place of
  ``backgroundValue``/``mission``/... under ``specific``, and ``interiorOrientation`` under ``specific``
  (a public DESIS reader, ``hyperproc/readers/desis.py``, warns that ``band`` elements appear there too,
  and gives L2A's gain as 1e-4 with zero offset, int16 DNs, nodata -32768).

Values are invented but plausible: 12 of EnMAP's 224 bands (VNIR then SWIR: the wavelengths step back at
the seam, as in operational products; DLR's 2020 qualification L1C/L2A were sorted by wavelength instead)
and 12 of DESIS's 235, on 20 x 24 pixels, EPSG:32633 30 m (sensor geometry for L1B). Malformed variants
are selected by ``variant``.
"""

from __future__ import annotations

import warnings
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import rasterio
from rasterio.errors import NotGeoreferencedWarning
from rasterio.transform import Affine

__all__ = [
    "BAD_GAIN_BAND",
    "BAD_WL_BAND",
    "DESIS_NAME",
    "ENMAP_BAD",
    "ENMAP_NAME",
    "ENMAP_VNIR",
    "EPSG",
    "HEIGHT",
    "TRANSFORM",
    "VARIANTS",
    "WIDTH",
    "Delivery",
    "Variant",
    "write_desis_delivery",
    "write_enmap_delivery",
]

Variant = Literal["ok", "no_band_characterisation", "band_without_wavelength", "non_numeric_gain",
                  "xml_band_count_differs", "no_image", "truncated_xml", "garbage_xml", "billion_laughs"]
VARIANTS: tuple[Variant, ...] = ("no_band_characterisation", "band_without_wavelength", "non_numeric_gain",
                                 "xml_band_count_differs", "no_image", "truncated_xml", "garbage_xml",
                                 "billion_laughs")

HEIGHT, WIDTH = 20, 24
EPSG = 32633
TRANSFORM = Affine(30.0, 0.0, 399960.0, 0.0, -30.0, 5800020.0)  # 30 m, north up
#: ``{level}`` is filled in; the patterns are those of real deliveries.
ENMAP_NAME = "ENMAP01-____{level}-DT0000001049_20220612T105735Z_001_V010110_20221118T145147Z"
DESIS_NAME = "DESIS-HSI-{level}-DT0483531728_001-20200804T234520-V0210"
XSI = "http://www.w3.org/2001/XMLSchema-instance"

# EnMAP: bands 1-7 VNIR, 8-12 SWIR; SWIR's first band (902 nm) lies below VNIR's last (993 nm).
ENMAP_WL = (418.24, 492.0, 559.5, 664.0, 752.0, 865.0, 993.08, 902.26, 1134.0, 1397.0, 1650.0, 2445.5)
ENMAP_FWHM = (6.5, 6.7, 7.0, 7.6, 8.1, 8.9, 9.5, 11.2, 10.8, 10.1, 9.5, 7.9)
ENMAP_VNIR = 7
ENMAP_BAD = 10  # 1397 nm: a water-vapour band, filled with no data
# DESIS: VNIR only, ~2.55 nm sampling in reality; a spread-out subset here.
DESIS_WL = (402.1, 455.6, 501.4, 549.8, 600.7, 651.5, 700.9, 750.2, 801.6, 850.3, 900.8, 999.1)
DESIS_FWHM = (3.5, 3.4, 3.4, 3.5, 3.5, 3.6, 3.6, 3.6, 3.7, 3.7, 3.8, 3.9)
BAD_WL_BAND = 3  # band_without_wavelength
BAD_GAIN_BAND = 5  # non_numeric_gain


@dataclass(frozen=True, slots=True)
class Delivery:
    """What was written, and what a reader should find in it."""

    folder: Path
    xml: Path
    images: tuple[Path, ...]  # the spectral image(s); L1B: VNIR then SWIR
    side_files: tuple[Path, ...]  # every other file of the delivery (images included)
    product: str  # the expected ``cubelake:product`` tag
    wavelengths_nm: tuple[float, ...]
    fwhm_nm: tuple[float, ...]
    gains: tuple[float, ...]
    offsets: tuple[float, ...]
    bad_bands: tuple[int, ...]  # 1-based
    start_time: str  # as written in the XML
    nodata: float | None  # the image's nodata (GDAL)
    background: float  # the XML's backgroundValue
    dtype: str
    georeferenced: bool


# ------------------------------------------------------------------------------------------- pixels


def _pixels(dtype: str, level: str, nodata: float | None, bad: int | None, seed: int) -> np.ndarray:
    """``(band, y, x)`` DNs: reflectance x 10^4 (L2A) or radiance DNs, a nodata corner, a no-data band."""
    rng = np.random.default_rng(seed)
    n = len(ENMAP_WL)
    low, high = (50, 9000) if level == "L2A" else (100, 30000)
    data = rng.integers(low, high, size=(n, HEIGHT, WIDTH)).astype(dtype)
    if nodata is not None:
        data[:, :3, :4] = nodata  # outside the swath
        if bad is not None:
            data[bad - 1] = nodata
    return data


def _write_tiff(path: Path, data: np.ndarray, nodata: float | None, georeferenced: bool,
                driver: str = "GTiff") -> None:
    profile: dict[str, object] = {"driver": driver, "count": data.shape[0], "height": HEIGHT, "width": WIDTH,
                                  "dtype": str(data.dtype), "nodata": nodata}
    if driver == "GTiff":
        profile.update(interleave="band", tiled=False, compress="deflate")
    if georeferenced:
        profile.update(crs=f"EPSG:{EPSG}", transform=TRANSFORM)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        with rasterio.open(path, "w", **profile) as ds:
            ds.write(data)


def _write_side_tiff(path: Path, georeferenced: bool) -> None:
    _write_tiff(path, np.zeros((1, HEIGHT, WIDTH), dtype="uint8"), None, georeferenced)


# ------------------------------------------------------------------------------------------ XML help


def _sub(parent: ET.Element, tag: str, text: object = None, **attrib: str) -> ET.Element:
    el = ET.SubElement(parent, tag, attrib)
    if text is not None:
        el.text = str(text)
    return el


def _subs(parent: ET.Element, **children: object) -> None:
    for tag, text in children.items():
        _sub(parent, tag, text)


def _polygon(parent: ET.Element, frames: tuple[str, ...], utc: str | None) -> None:
    corners = [(52.43, 13.05), (52.25, 13.02), (52.23, 13.31), (52.41, 13.35)]
    poly = _sub(_sub(parent, "spatialCoverage"), "boundingPolygon")
    for frame, (lat, lon) in zip(frames, [*corners, corners[0], (52.33, 13.18)], strict=False):
        point = _sub(poly, "point")
        _sub(point, "frame", frame)
        _sub(point, "latitude", lat, unit="DEG")
        _sub(point, "longitude", lon, unit="DEG")
        if utc is not None:
            _sub(point, "utcTime", utc)


def _write_xml(root: ET.Element, path: Path, variant: Variant, declaration: bool) -> None:
    """Write ``root`` in UTF-8 (EnMAP's files start at the root element, without an XML declaration),
    then damage it as ``variant`` says."""
    ET.indent(root)
    ET.ElementTree(root).write(path, encoding="UTF-8", xml_declaration=declaration)
    if variant == "truncated_xml":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) * 3 // 5])  # an interrupted download
    elif variant == "garbage_xml":
        path.write_bytes(np.random.default_rng(7).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    elif variant == "billion_laughs":
        path.write_text(_billion_laughs(root.tag), encoding="utf-8")


def _billion_laughs(root_tag: str) -> str:
    """The classic entity bomb (10^9 'lol's, ~3 GB once expanded) under a DLR root element."""
    decls = ['<!ENTITY lol0 "lol">'] + [f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, 10)]
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE {root_tag} [\n  ' + "\n  ".join(decls)
            + f"\n]>\n<{root_tag}><specific><code>&lol9;</code></specific></{root_tag}>\n")


def _damage_bands(table: ET.Element, band_tag: str, fields: tuple[str, str, str, str], variant: Variant) -> None:
    """Apply a band-table ``variant`` to the XML's band elements."""
    bands = table.findall(band_tag)
    if variant == "band_without_wavelength":
        wavelength = bands[BAD_WL_BAND - 1].find(fields[0])
        if wavelength is not None:
            bands[BAD_WL_BAND - 1].remove(wavelength)
    elif variant == "non_numeric_gain":
        gain = bands[BAD_GAIN_BAND - 1].find(fields[2])
        if gain is not None:
            gain.text = "0,0001"  # a decimal comma


# ----------------------------------------------------------------------------------------- EnMAP


def _enmap_gains(level: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    n = len(ENMAP_WL)
    if level == "L2A":
        return (1e-4,) * n, (0.0,) * n
    # radiance in W/(m2 sr nm) per DN: per-band gains and offsets (magnitudes as in DLR's products)
    return (tuple(round(2.5e-6 * (1 + 0.13 * i), 12) for i in range(n)),
            tuple(round(0.046 - 0.0041 * i, 6) for i in range(n)))


def _enmap_metadata(root: ET.Element, name: str, level: str) -> None:
    meta = _sub(root, "metadata")
    schema = _sub(meta, "schema")
    _subs(schema, copyright="(c) DLR EnMAP 2022", versionSchema="00.02.00", name="metadata_Lx_00-02-00.xsd",
          crc="537B11B4", processingLevel=level)
    _subs(meta, name=f"{name}-METADATA.XML", comment=f"EnMAP Level {level[1:]} Product of datatake 1049, tile 1",
          copyright="(c) DLR EnMAP 2022")
    _subs(_sub(root, "processing"), terrainCorrection="Yes", ozoneValue=300, season="summer",
          productFormat="GeoTIFF+Metadata", mapProjection="UTM_Zone_of_Scene_Center",
          imageResampling="Bilinear_Interpolation", DEMDBVersion="SRTM_C1ARC", correctionType="Land_Mode",
          cirrusHazeRemoval="No", bandInterpolation="No", waterType="Turbid")


def _enmap_base(root: ET.Element, level: str, start: str, stop: str) -> None:
    base = _sub(root, "base")
    _polygon(base, ("upper_left", "lower_left", "lower_right", "upper_right", "upper_left", "center"), start)
    _subs(_sub(base, "temporalCoverage"), startTime=start, stopTime=stop)
    _subs(base, revision="01.01.10", altitudeCoverage=653000.0, sphere="earth", format=f"ENMAP_{level}",
          level=level, size=663572413, archivedVersion="01.01.10")


def _channel_quality(specific: ET.Element, detector: str, expected: list[int], missing: list[int]) -> None:
    q = _sub(specific, f"{detector}ProductQuality")
    _subs(q, **{f"{detector}ProductStatus": "OK"}, numChannelsExpected=len(expected),
          expectedChannelsList=",".join(map(str, expected)), numChannelsMissing=len(missing),
          missingChannelsList=",".join(map(str, missing)))


def _enmap_specific(root: ET.Element, level: str, gains: tuple[float, ...], offsets: tuple[float, ...],
                    background: float, variant: Variant) -> None:
    specific = _sub(root, "specific")
    _subs(_sub(specific, "qualityFlag"), overallQuality=1, cloudCover=0, hazeCover=0, sceneWV=2159, sceneAOT=190)
    swir = list(range(ENMAP_VNIR + 1, len(ENMAP_WL) + 1))
    missing = [ENMAP_BAD] if level == "L2A" else []  # L2A: the band is missing; L1C: its statistics say so
    _channel_quality(specific, "vnir", list(range(1, ENMAP_VNIR + 1)), [])
    _channel_quality(specific, "swir", [b for b in swir if b not in missing], missing)
    _subs(specific, mission="EnMAP", satelliteID="01", sensor="HSI", datatakeID="0000001049",
          numberOfSWIRBands=len(swir), numberOfVNIRBands=ENMAP_VNIR, productType="STANDARD_ALL",
          datatakeStart="2022-06-12T10:57:35.123456Z", backgroundValue=background, tileID="01")
    _sub(specific, "widthOfScene", WIDTH, unit="pixel")
    _sub(specific, "heightOfScene", HEIGHT, unit="pixel")
    for angle, value in (("sunElevationAngle", 60.1), ("sunAzimuthAngle", 160.3), ("acrossOffNadirAngle", -0.1),
                         ("alongOffNadirAngle", -0.1), ("sceneAzimuthAngle", 14.2)):
        _subs(_sub(specific, angle), upper_left=value, upper_right=value, lower_right=value, lower_left=value,
              center=value)
    _subs(specific, orbitDirection="DESCENDING", pixelSize=30, code=level)
    if variant == "no_band_characterisation":
        return
    table = _sub(specific, "bandCharacterisation")
    n = len(ENMAP_WL) + (1 if variant == "xml_band_count_differs" else 0)
    for i in range(n):
        k = min(i, len(ENMAP_WL) - 1)
        band = _sub(table, "bandID", number=str(i + 1))
        _subs(band, wavelengthCenterOfBand=ENMAP_WL[k] + (i - k) * 2.0, FWHMOfBand=ENMAP_FWHM[k],
              GainOfBand=gains[k], OffsetOfBand=offsets[k])
    _damage_bands(table, "bandID", ("wavelengthCenterOfBand", "FWHMOfBand", "GainOfBand", "OffsetOfBand"), variant)
    _subs(specific, pixelSizeOfOrthoScene=30, meanSlope=3.1)


def _enmap_product(root: ET.Element, name: str, level: str, image_names: list[str],
                   side_names: list[str]) -> None:
    product = _sub(root, "product")
    image = _sub(product, "image")
    parts = ([("vnir", image_names[0], ENMAP_VNIR), ("swir", image_names[1], len(ENMAP_WL) - ENMAP_VNIR)]
             if level == "L1B" else [("merge", image_names[0], len(ENMAP_WL))])
    for tag, file_name, channels in parts:
        el = _sub(image, tag)
        _subs(el, channels=channels, name=file_name, version="01.01.10", format="binary")
        _subs(_sub(el, "dimension"), columns=WIDTH, rows=HEIGHT)
    if level != "L1B":
        _subs(_sub(product, "ortho"), projection="UTM_Zone33_North", resolution=30, resampling="bilinear")
    files = _sub(product, "productFileInformation")
    for number, file_name in enumerate([f"{name}-METADATA.XML", *side_names], 1):
        el = _sub(files, "file", number=str(number))
        _sub(el, "name", file_name)
        _sub(el, "size", 1375, unit="Kbyte")
        _subs(el, version="01.01.10", format="xml" if file_name.endswith(".XML") else "binary")
    stats = _sub(product, "bandStatistics")
    for i, wl in enumerate(ENMAP_WL, 1):
        nodata = level != "L1B" and i == ENMAP_BAD
        _subs(_sub(stats, "bandID", number=str(i)), waveLength=wl, mean=-1000000 if nodata else 0.0279 + i / 1000,
              stdDeviation=0 if nodata else 0.011)


def _enmap_files(level: str, image_format: str) -> tuple[list[str], list[str]]:
    """Suffixes (after ``<name>-``) of the spectral image(s) and of the side products."""
    ext = ".TIF" if image_format == "GTiff" else ".BSQ"
    detectors = ("_VNIR", "_SWIR") if level == "L1B" else ("",)
    images = [f"SPECTRAL_IMAGE{d}{ext}" for d in detectors]
    side = [f"QL_PIXELMASK{d}.TIF" for d in detectors] + [
        f"QL_QUALITY_{q}.TIF" for q in ("CIRRUS", "CLASSES", "CLOUD", "CLOUDSHADOW", "HAZE", "SNOW")]
    side += [f"QL_QUALITY_TESTFLAGS{d}.TIF" for d in detectors] + ["QL_SWIR.TIF", "QL_VNIR.TIF"]
    return images, side


def _folder(folder: Path, name: str, nested: bool) -> Path:
    out = folder / name if nested else folder
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_enmap_delivery(folder: Path, level: Literal["L1B", "L1C", "L2A"] = "L2A", *,
                         image_format: Literal["GTiff", "ENVI"] = "GTiff", variant: Variant = "ok",
                         nested: bool = True, seed: int = 0) -> Delivery:
    """An EnMAP delivery in ``folder/<name>/`` (``nested=False``: flat in ``folder``).

    L2A: int16 reflectance x 10^4 (gain 1e-4), nodata -32768, band 10 missing from expectedChannelsList.
    L1C: uint16 radiance DNs with per-band gains/offsets, nodata 0, band 10 no-data by its bandStatistics.
    L1B: like L1C in sensor geometry (no CRS) as VNIR and SWIR files, no nodata in the image (the XML's
    backgroundValue 0 applies). ``image_format="ENVI"`` writes ``.BSQ`` + ``.HDR`` instead of GeoTIFF.
    """
    name = ENMAP_NAME.format(level=level)
    out = _folder(folder, name, nested)
    gains, offsets = _enmap_gains(level)
    dtype, nodata = ("int16", -32768.0) if level == "L2A" else ("uint16", 0.0)
    georef = level != "L1B"
    image_suffixes, side_suffixes = _enmap_files(level, image_format)
    data = _pixels(dtype, level, nodata, None if level == "L1B" else ENMAP_BAD, seed)
    images = [out / f"{name}-{s}" for s in image_suffixes]
    if variant != "no_image":
        if level == "L1B":
            _write_tiff(images[0], data[:ENMAP_VNIR], None, False)
            _write_tiff(images[1], data[ENMAP_VNIR:], None, False)
        else:
            _write_tiff(images[0], data, nodata, georef, "GTiff" if image_format == "GTiff" else "ENVI")
        if image_format == "ENVI":  # GDAL writes x.hdr; DLR delivers x.HDR
            for image in images:
                image.with_suffix(".hdr").rename(image.with_suffix(".HDR"))
    side = [out / f"{name}-{s}" for s in side_suffixes]
    for path in side:
        _write_side_tiff(path, georef)
    start, stop = "2022-06-12T10:57:35.123456Z", "2022-06-12T10:57:39.668677Z"
    root = ET.Element("level_X", {f"{{{XSI}}}noNamespaceSchemaLocation": "metadata_Lx_00-02-00.xsd"})
    _enmap_metadata(root, name, level)
    _enmap_base(root, level, start, stop)
    _enmap_specific(root, level, gains, offsets, 0.0, variant)
    _enmap_product(root, name, level, [p.name for p in images], [p.name for p in side])
    xml = out / f"{name}-METADATA.XML"
    _write_xml(root, xml, variant, declaration=False)
    written = [*(images if variant != "no_image" else []), *side]
    if image_format == "ENVI" and variant != "no_image":
        written += [p.with_suffix(".HDR") for p in images]
    return Delivery(out, xml, tuple(images), tuple(sorted(written)), f"enmap-{level.lower()}", ENMAP_WL,
                    ENMAP_FWHM, gains, offsets, () if level == "L1B" else (ENMAP_BAD,), start,
                    None if level == "L1B" else nodata, 0.0, dtype, georef)


# ----------------------------------------------------------------------------------------- DESIS


def _desis_gains(level: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    n = len(DESIS_WL)
    if level == "L2A":
        return (1e-4,) * n, (0.0,) * n
    # radiance in mW/(cm2 sr um) per DN: a different gain and offset for every band
    return (tuple(round(0.0125 + 0.0007 * i, 6) for i in range(n)),
            tuple(round(-0.2 + 0.031 * i, 4) for i in range(n)))


def _desis_head(root: ET.Element, name: str, level: str, start: str, stop: str, with_level: bool) -> None:
    meta = _sub(root, "metadata")
    _subs(meta, name=f"{name}-METADATA.xml", comment=f"DESIS Level {level[1:]} product")
    _subs(_sub(root, "processing"), ozoneValue=300, terrainCorrection="Yes")
    base = _sub(root, "base")
    _polygon(base, ("point_1", "point_2", "point_3", "point_4", "point_1"), None)
    _subs(_sub(base, "temporalCoverage"), startTime=start, endTime=stop)
    _subs(base, altitudeCoverage=408000.0)
    if with_level:
        _sub(base, "level", level)


def _desis_band(table: ET.Element, number: int, wl: float, fwhm: float, gain: float, offset: float) -> None:
    band = _sub(table, "band")
    grid = np.round(wl + np.linspace(-2 * fwhm, 2 * fwhm, 5), 2)
    response = np.round(np.exp(-4 * np.log(2) * ((grid - wl) / fwhm) ** 2), 4)
    _subs(band, bandNumber=number, wavelengthCenterOfBand=wl, wavelengthWidthOfBand=fwhm, gainOfBand=gain,
          offsetOfBand=offset, deadPixels=0, suspiciousPixel=0,
          response=",".join(map(str, response)), wavelengths=",".join(map(str, grid)))


def _desis_specific(root: ET.Element, gains: tuple[float, ...], offsets: tuple[float, ...], variant: Variant) -> None:
    specific = _sub(root, "specific")
    _subs(specific, sunZenithAngle=31.2, sunAzimuthAngle=145.8, sceneIncidenceAngle=4.1, sceneAzimuthAngle=307.9,
          pointingMirrorAngle=0.2, meanAerosolOpticalThickness=0.12, backgroundValue=-32768, mission="DESIS",
          satelliteID="ISS", sensor="HSI", tileID="001", productType="standard", numberOfBands=len(DESIS_WL),
          orbitDirection="ASCENDING", pixelSize=30, widthOfScene=WIDTH, heightOfScene=HEIGHT)
    _subs(_sub(specific, "terrain"), meanGroundElevation=212.0, meanSlope=1.3)
    _subs(_sub(specific, "waterVapour"), meanWaterVapour=1.9)
    for group, child, value in (("haze", "percentageHaze", 0.0), ("clouds", "percentageClouds", 2.5),
                                ("cloudShadow", "percentageCloudShadow", 0.4),
                                ("topoShadow", "percentageTopoShadow", 0.0)):
        _subs(_sub(specific, group), **{child: value})
    if variant != "no_band_characterisation":
        table = _sub(specific, "bandCharacterisation")
        n = len(DESIS_WL) + (1 if variant == "xml_band_count_differs" else 0)
        for i in range(n):
            k = min(i, len(DESIS_WL) - 1)
            _desis_band(table, i + 1, DESIS_WL[k] + (i - k) * 2.5, DESIS_FWHM[k], gains[k], offsets[k])
        _damage_bands(table, "band", ("wavelengthCenterOfBand", "wavelengthWidthOfBand", "gainOfBand",
                                      "offsetOfBand"), variant)
    geometric = _sub(specific, "interiorOrientation")  # its <band> elements are not spectral bands
    for i in range(1, 4):
        _subs(_sub(geometric, "band"), bandNumber=i, lookAngleX=0.01 * i, lookAngleY=0.0)


def _desis_sidecar_header(path: Path, wl: tuple[float, ...], fwhm: tuple[float, ...], gains: tuple[float, ...],
                          offsets: tuple[float, ...]) -> None:
    """The ENVI header DESIS puts next to its ``.tif`` (read by EnMAP-Box's DESIS import)."""
    def brace(values: tuple[float, ...]) -> str:
        return "{" + ", ".join(map(str, values)) + "}"

    path.write_text(f"ENVI\ndescription = {{DESIS spectral image}}\nsamples = {WIDTH}\nlines = {HEIGHT}\n"
                    f"bands = {len(wl)}\nheader offset = 0\nfile type = TIFF\ndata type = 2\ninterleave = bsq\n"
                    f"byte order = 0\nwavelength units = Nanometers\nwavelength = {brace(wl)}\nfwhm = {brace(fwhm)}\n"
                    f"data gain values = {brace(gains)}\ndata offset values = {brace(offsets)}\n"
                    "data ignore value = -32768\n")


def write_desis_delivery(folder: Path, level: Literal["L1C", "L2A"] = "L2A", *, variant: Variant = "ok",
                         nested: bool = True, desis_level_element: bool = True, seed: int = 1) -> Delivery:
    """A DESIS delivery (lower-case ``.xml``/``.tif``) in ``folder/<name>/`` (``nested=False``: flat).

    int16 DNs, nodata -32768: L2A reflectance x 10^4 (gain 1e-4), L1C radiance with per-band gains/offsets.
    ``desis_level_element=False`` writes no level element (the reader then takes it from the file name).
    """
    name = DESIS_NAME.format(level=level)
    out = _folder(folder, name, nested)
    gains, offsets = _desis_gains(level)
    image = out / f"{name}-SPECTRAL_IMAGE.tif"
    if variant != "no_image":
        _write_tiff(image, _pixels("int16", level, -32768.0, None, seed), -32768.0, True)
    header = out / f"{name}-SPECTRAL_IMAGE.hdr"
    _desis_sidecar_header(header, DESIS_WL, DESIS_FWHM, gains, offsets)
    side = [header] + [out / f"{name}-{s}" for s in ("QL_IMAGE.tif", "QL_QUALITY.tif", "QL_QUALITY-2.tif")]
    for path in side[1:]:
        _write_side_tiff(path, True)
    history = out / f"{name}-HISTORY.xml"
    history.write_text('<?xml version="1.0" encoding="UTF-8"?>\n<history><step>L2A processor</step></history>\n')
    start, stop = "2020-08-04T23:45:20.461735Z", "2020-08-04T23:45:24.301114Z"
    root = ET.Element("hsi_doc")
    _desis_head(root, name, level, start, stop, desis_level_element)
    _desis_specific(root, gains, offsets, variant)
    xml = out / f"{name}-METADATA.xml"
    _write_xml(root, xml, variant, declaration=True)
    written = [*([image] if variant != "no_image" else []), *side, history]
    return Delivery(out, xml, (image,), tuple(sorted(written)), f"desis-{level.lower()}", DESIS_WL, DESIS_FWHM,
                    gains, offsets, (), start, -32768.0, -32768.0, "int16", True)

