"""DLR hyperspectral deliveries: EnMAP (L1B, L1C, L2A) and DESIS (L1B, L1C, L2A).

A delivery is ``<name>-METADATA.XML`` next to ``<name>-SPECTRAL_IMAGE.TIF`` (or ``.BSQ``/``.BIL``/``.BIP``
with an ENVI header; EnMAP L1B: ``-SPECTRAL_IMAGE_VNIR`` and ``-SPECTRAL_IMAGE_SWIR``, one per detector)
and side products (``-QL_PIXELMASK``, ``-QL_QUALITY_*``, ``-QL_VNIR``, ``-HISTORY.xml``, ...), in a folder
or flat. DESIS names its files in lower case (``-METADATA.xml``, ``.tif``). The XML carries what the image
does not: per-band wavelength, FWHM and gain/offset (``value = gain × DN + offset``), bad bands, the
acquisition time and the processing level. Pixels, grid, CRS and nodata come from the image (GDAL).

Element paths (checked against DLR's own EnMAP qualification products and public readers; the fixture
module ``cubelake/testing/dlr.py`` says which, and what is assumed):

* EnMAP, root ``level_X``: ``specific/bandCharacterisation/bandID[@number]`` with
  ``wavelengthCenterOfBand``, ``FWHMOfBand``, ``GainOfBand``, ``OffsetOfBand``; level in ``specific/code``
  (also ``base/level``, ``metadata/schema/processingLevel``); ``base/temporalCoverage/startTime``/
  ``stopTime``; ``specific/backgroundValue``; bad bands are those absent from
  ``specific/{vnir,swir}ProductQuality/expectedChannelsList``, or whose ``product/bandStatistics/bandID``
  has ``mean`` -1000000 and ``stdDeviation`` 0 (EnMAP-Box's no-data-band rule).
* DESIS, root ``hsi_doc``: ``specific/bandCharacterisation/band`` with ``bandNumber``,
  ``wavelengthCenterOfBand``, ``wavelengthWidthOfBand`` (FWHM), ``gainOfBand``, ``offsetOfBand`` (``band``
  also appears elsewhere, so only that path is read); ``base/temporalCoverage/startTime``/``endTime``.
  Where DESIS states its level is not confirmed: ``base/level`` or ``metadata/schema/processingLevel`` as
  in EnMAP's XML, else the level in the file name, with a warning.

The VNIR/SWIR overlap (EnMAP's wavelengths step back near 900-1000 nm) is kept as delivered: bands are
never reordered. The XML is untrusted input: it is read whole only up to :data:`XML_MAX_BYTES`, parsed by
``defusedxml`` with DTDs refused (no entity expansion), and every missing or malformed element is named.
Paths may be GDAL ``/vsis3/`` names: the small-file helpers of :mod:`._base` answer for both.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from xml.etree.ElementTree import Element, ParseError

import numpy as np
from defusedxml import ElementTree as SafeElementTree
from defusedxml.common import DefusedXmlException

from cubelake.errors import SceneReadError
from cubelake.grid import Window
from cubelake.storage import object_at, url_of_gdal_path

from ..report import Code, Issue, warning
from ._base import (
    BandInfo,
    FileCalibration,
    RasterSource,
    SceneMetadata,
    display_name,
    folder_files,
    is_regular_file,
    read_bounded,
)
from .envi import open_envi
from .gdal import open_gdal

__all__ = [
    "CALIBRATION_NAME",
    "LEVELS",
    "XML_MAX_BYTES",
    "DlrBand",
    "DlrMetadata",
    "DlrSource",
    "dlr_image_files",
    "dlr_image_for",
    "dlr_side_files",
    "is_dlr_metadata",
    "open_dlr",
    "parse_dlr_xml",
    "read_dlr_metadata",
]

#: Real METADATA.XML files are 1-5 MB (EnMAP's carries per-band RPCs); anything far larger is not one.
XML_MAX_BYTES = 32 * 1024 * 1024
#: How much of a file :func:`is_dlr_metadata` reads to see its root element.
SNIFF_BYTES = 4096
#: The name of the per-band calibration the XML gives (``value = gain × DN + offset``).
CALIBRATION_NAME = "dlr_gain_offset"
LEVELS = ("L1B", "L1C", "L2A")

_METADATA_SUFFIX = "-METADATA.XML"
_IMAGE_SUFFIXES = (".TIF", ".TIFF", ".GEOTIFF", "_COG.TIF", "_COG.TIFF", ".JP2", ".BSQ", ".BIL", ".BIP")
_ENVI_SUFFIXES = (".BSQ", ".BIL", ".BIP")
_NAME = re.compile(r"<(?:[A-Za-z_][\w.\-]*:)?([A-Za-z_][\w.\-]*)")
_DESIS_NAME_LEVEL = re.compile(r"^DESIS-HSI-(L1B|L1C|L2A)-", re.IGNORECASE)
_NODATA_BAND_MEAN = -1000000.0  # EnMAP bandStatistics of a band filled with no data (EnMAP-Box's rule)
_MAX_LISTED = 8  # problems named in one message; the rest are counted


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where one mission's METADATA.XML keeps each fact."""

    mission: str
    table: str  # parent of the per-band elements
    band: str  # per-band element
    number: str | None  # child holding the band number (None: the ``number`` attribute)
    fields: tuple[str, str, str, str]  # wavelength, FWHM, gain, offset
    levels: tuple[str, ...]
    stop: str
    background: str
    radiance_unit: str


_ENMAP = _Layout("EnMAP", "specific/bandCharacterisation", "bandID", None,
                 ("wavelengthCenterOfBand", "FWHMOfBand", "GainOfBand", "OffsetOfBand"),
                 ("specific/code", "base/level", "metadata/schema/processingLevel"),
                 "base/temporalCoverage/stopTime", "specific/backgroundValue", "W/(m2 sr nm)")
_DESIS = _Layout("DESIS", "specific/bandCharacterisation", "band", "bandNumber",
                 ("wavelengthCenterOfBand", "wavelengthWidthOfBand", "gainOfBand", "offsetOfBand"),
                 ("base/level", "metadata/schema/processingLevel"),
                 "base/temporalCoverage/endTime", ".//backgroundValue", "mW/(cm2 sr um)")
_LAYOUTS = {"level_X": _ENMAP, "hsi_doc": _DESIS}
_START = "base/temporalCoverage/startTime"


@dataclass(frozen=True, slots=True)
class DlrBand:
    """One band as the XML describes it. ``number`` is 1-based, as in the image."""

    number: int
    wavelength_nm: float
    fwhm_nm: float
    gain: float
    offset: float
    bad: bool = False


@dataclass(frozen=True, slots=True)
class DlrMetadata:
    """What a METADATA.XML says about its scene (no pixels, no grid)."""

    mission: str  # "EnMAP" | "DESIS"
    level: str  # one of LEVELS
    bands: tuple[DlrBand, ...]
    start_time: str | None = None  # UTC ISO 8601
    stop_time: str | None = None
    background: float | None = None  # the XML's no-data value
    issues: tuple[Issue, ...] = ()
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def product(self) -> str:
        """The ``cubelake:product`` tag, e.g. ``enmap-l2a``."""
        return f"{self.mission.lower()}-{self.level.lower()}"

    @property
    def unit(self) -> str:
        """The unit of ``gain × DN + offset``: reflectance (L2A) or the mission's radiance unit."""
        return "1" if self.level == "L2A" else _LAYOUTS_BY_MISSION[self.mission].radiance_unit


_LAYOUTS_BY_MISSION = {layout.mission: layout for layout in _LAYOUTS.values()}


class DlrSource:
    """A DLR delivery: the image's pixels (GDAL or ENVI source), described by its METADATA.XML."""

    def __init__(self, image: RasterSource, meta: SceneMetadata) -> None:
        self._image = image
        self._meta = meta

    @property
    def meta(self) -> SceneMetadata:
        return self._meta

    @property
    def image(self) -> RasterSource:
        """The source of the spectral image itself (its own metadata, no XML)."""
        return self._image

    def read(self, window: Window) -> np.ndarray:
        return self._image.read(window)

    def blocks(self, window: Window) -> Sequence[Window]:
        return self._image.blocks(window)

    def close(self) -> None:
        self._image.close()

    def __enter__(self) -> DlrSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------- files


def _delivery_prefix(xml: Path) -> str | None:
    """``<name>`` of ``<name>-METADATA.XML`` (any case), or ``None`` for any other name."""
    name = xml.name
    if len(name) > len(_METADATA_SUFFIX) and name.upper().endswith(_METADATA_SUFFIX):
        return name[: -len(_METADATA_SUFFIX)]
    return None


def _sniff_root(head: bytes) -> str | None:
    """The local name of the root element in the first bytes of an XML file, or ``None``."""
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    pos = 0
    while pos < len(text):
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if text.startswith("<?", pos):
            end = text.find("?>", pos)
            pos = -1 if end < 0 else end + 2
        elif text.startswith("<!--", pos):
            end = text.find("-->", pos + 4)
            pos = -1 if end < 0 else end + 3
        elif text.startswith("<!", pos):  # <!DOCTYPE ...> with or without an internal subset
            close, subset = text.find(">", pos), text.find("[", pos)
            if 0 <= subset < close:
                close = text.find(">", max(text.find("]", subset), subset))
            pos = -1 if close < 0 else close + 1
        else:
            m = _NAME.match(text, pos)
            return m.group(1) if m else None
        if pos < 0:
            return None
    return None


def _head_bytes(path: Path, n: int) -> bytes:
    """The first ``n`` bytes of a regular file or object (raises ``OSError`` when it cannot be read)."""
    url = url_of_gdal_path(path)
    if url is None:
        if not is_regular_file(path):
            raise OSError(f"{path}: not a regular file")
        with open(path, "rb") as f:
            return f.read(n)
    store, key = object_at(url)
    size = store.head(key).size
    return bytes(store.get_ranges(key, [0], [min(n, size)])[0]) if size else b""


def is_dlr_metadata(path: Path) -> bool:
    """Whether ``path`` is a DLR ``<name>-METADATA.XML`` (any case) whose root is EnMAP's ``level_X`` or
    DESIS's ``hsi_doc``. Reads at most :data:`SNIFF_BYTES`; never raises."""
    if _delivery_prefix(path) is None:
        return False
    try:
        return _sniff_root(_head_bytes(path, SNIFF_BYTES)) in _LAYOUTS
    except (OSError, ValueError):  # missing, unreadable, a NUL in the name, a store that cannot answer
        return False


def _listing(xml: Path) -> dict[str, Path]:
    """The files next to ``xml`` by upper-case name (one listing; ``{}`` when the folder cannot be listed)."""
    try:
        return {p.name.upper(): p for p in folder_files(xml.parent)}
    except OSError:
        return {}


@dataclass(frozen=True, slots=True)
class _Images:
    data: tuple[Path, ...] = ()  # one image, or EnMAP L1B's VNIR and SWIR images
    headers: tuple[Path, ...] = ()  # their ENVI headers, when they are ENVI data
    headerless: tuple[Path, ...] = ()  # ENVI data found without a header (not usable)


def _image(stem: str, files: Mapping[str, Path]) -> _Images:
    """The image ``<stem><suffix>`` (any case) among ``files``, with its ENVI header when it is ENVI data."""
    for suffix in _IMAGE_SUFFIXES:
        data = files.get((stem + suffix).upper())
        if data is None:
            continue
        if suffix not in _ENVI_SUFFIXES:
            return _Images((data,))
        header = files.get((stem + ".HDR").upper()) or files.get((data.name + ".HDR").upper())
        if header is not None:
            return _Images((data,), (header,))
        return _Images(headerless=(data,))
    return _Images()


def _find_images(prefix: str, files: Mapping[str, Path]) -> _Images:
    """The spectral image(s) of delivery ``prefix`` among ``files`` (pure)."""
    single = _image(f"{prefix}-SPECTRAL_IMAGE", files)
    if single.data:
        return single
    vnir = _image(f"{prefix}-SPECTRAL_IMAGE_VNIR", files)
    swir = _image(f"{prefix}-SPECTRAL_IMAGE_SWIR", files)
    headerless = single.headerless + vnir.headerless + swir.headerless
    if vnir.data and swir.data:
        return _Images(vnir.data + swir.data, vnir.headers + swir.headers, headerless)
    return _Images(headerless=headerless)


def dlr_image_files(xml: Path) -> tuple[Path, ...]:
    """The spectral image file(s) of a METADATA.XML: one ``-SPECTRAL_IMAGE``, or EnMAP L1B's
    ``-SPECTRAL_IMAGE_VNIR`` and ``-SPECTRAL_IMAGE_SWIR`` (in that order); ``()`` when none is usable."""
    prefix = _delivery_prefix(xml)
    return () if prefix is None else _find_images(prefix, _listing(xml)).data


def dlr_image_for(xml: Path) -> Path | None:
    """The ``-SPECTRAL_IMAGE`` file of a METADATA.XML (``.TIF``/``.TIFF``/``.GEOTIFF``/``_COG.TIF``/``.JP2``, or
    ``.BSQ``/``.BIL``/``.BIP`` that has an ENVI header; any case). For EnMAP L1B, the VNIR image (see
    :func:`dlr_image_files` for both). ``None`` when there is none."""
    files = dlr_image_files(xml)
    return files[0] if files else None


def dlr_side_files(xml: Path) -> list[Path]:
    """Every other file of the delivery: spectral image(s), ENVI headers, ``QL_*`` masks and quicklooks,
    ``HISTORY.xml``, GDAL ``.aux.xml``: none of them is a scene of its own (:func:`open_dlr` reads the
    image through the XML). They are the files next to ``xml`` whose name starts with ``<name>-``."""
    prefix = _delivery_prefix(xml)
    if prefix is None:
        return []
    start = (prefix + "-").upper()
    return sorted(p for key, p in _listing(xml).items() if key.startswith(start) and p.name != xml.name)


# ------------------------------------------------------------------------------------------ the XML


def parse_dlr_xml(data: bytes, name: str) -> Element:
    """The root of a METADATA.XML's bytes, namespaces stripped from tags. DTDs and entities are refused.

    ``name`` names the file in messages. Raises :class:`SceneReadError` for anything that is not
    well-formed, DTD-free XML.
    """
    try:
        root = SafeElementTree.fromstring(data, forbid_dtd=True)
    except DefusedXmlException as exc:
        raise SceneReadError(
            f"{name}: the XML declares a DTD or entities ({type(exc).__name__}); DLR metadata has neither, and "
            "entity expansion ('billion laughs') is refused as unsafe. This is not a DLR METADATA.XML, or it "
            "was altered: re-download the delivery") from None
    except ParseError as exc:
        raise SceneReadError(f"{name}: not well-formed XML ({exc}); the METADATA.XML is truncated or damaged. "
                             "Re-download the delivery") from None
    for el in root.iter():
        if isinstance(el.tag, str) and el.tag.startswith("{"):
            el.tag = el.tag.split("}", 1)[1]
    return root


def _read_xml(xml: Path) -> Element:
    name = display_name(xml)
    data = read_bounded(xml, XML_MAX_BYTES, "a DLR METADATA.XML")
    return parse_dlr_xml(data, name)


def _text(el: Element, path: str) -> str | None:
    """The stripped text of ``path`` under ``el``; ``None`` when the element is missing or empty."""
    found = el.find(path)
    text = (found.text or "").strip() if found is not None else ""
    return text or None


def _band_value(el: Element, tag: str, band: str, positive: bool, problems: list[str]) -> float | None:
    """A finite number from child ``tag`` of a band element, or ``None`` with the problem named."""
    child = el.find(tag)
    raw = (child.text or "").strip() if child is not None else None
    if not raw:
        problems.append(f"{band} has no {tag}" if child is None else f"{band}: {tag} is empty")
        return None
    try:
        value = float(raw)
    except ValueError:
        problems.append(f"{band}: {tag} = {raw[:40]!r} is not a number")
        return None
    if not math.isfinite(value) or (positive and value <= 0):
        problems.append(f"{band}: {tag} = {raw[:40]!r} must be a finite number{' > 0' if positive else ''}")
        return None
    return value


def _band_number(el: Element, layout: _Layout, position: int, problems: list[str]) -> int | None:
    raw = el.get("number") if layout.number is None else _text(el, layout.number)
    what = f'the {layout.band} attribute number' if layout.number is None else layout.number
    try:
        return int((raw or "").strip())
    except ValueError:
        problems.append(f"{layout.band} element {position}: {what} = {raw!r} is not a band number")
        return None


def _bands(root: Element, layout: _Layout, name: str) -> list[DlrBand]:
    """Every band of the band table, or :class:`SceneReadError` naming each problem found."""
    table = root.find(layout.table)
    article = "an" if layout.mission[0] in "AEIOU" else "a"
    what = f"this is not {article} {layout.mission} METADATA.XML, or it is truncated. Re-download the delivery"
    if table is None:
        raise SceneReadError(f"{name}: no {layout.table} element; {what}")
    elements = table.findall(layout.band)
    if not elements:
        raise SceneReadError(f"{name}: no {layout.table}/{layout.band} elements; {what}")
    problems: list[str] = []
    bands: list[DlrBand] = []
    for position, el in enumerate(elements, 1):
        number = _band_number(el, layout, position, problems)
        label = f"band {number}" if number is not None else f"{layout.band} element {position}"
        values = [_band_value(el, tag, label, k < 2, problems) for k, tag in enumerate(layout.fields)]
        if number is not None and all(v is not None for v in values):
            wl, fw, gain, offset = (float(v) for v in values if v is not None)
            bands.append(DlrBand(number, wl, fw, gain, offset))
    numbers = sorted(b.number for b in bands)
    if not problems and numbers != list(range(1, len(elements) + 1)):
        problems.append(f"the band numbers are {_ranges(numbers)}; expected 1-{len(elements)}, each once")
    if problems:
        more = f" (and {len(problems) - _MAX_LISTED} more)" if len(problems) > _MAX_LISTED else ""
        raise SceneReadError(f"{name}: {len(problems)} problem(s) in {layout.table}: "
                             f"{'; '.join(problems[:_MAX_LISTED])}{more}. Re-download the METADATA.XML")
    return sorted(bands, key=lambda b: b.number)


def _ranges(numbers: Sequence[int]) -> str:
    """``1-3, 5, 5`` for a short message (at most 12 items)."""
    parts: list[str] = []
    for n in numbers:
        if parts and parts[-1].split("-")[-1] == str(n - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{n}"
        else:
            parts.append(str(n))
    return ", ".join(parts[:12]) + (", ..." if len(parts) > 12 else "")


def _channel_list(root: Element, path: str, name: str) -> set[int] | None:
    """The band numbers of a comma-separated channel list; ``None`` when the element is missing."""
    el = root.find(path)
    if el is None:
        return None
    out: set[int] = set()
    for item in (el.text or "").split(","):
        if item.strip():
            try:
                out.add(int(item))
            except ValueError:
                raise SceneReadError(f"{name}: {path} holds {item.strip()[:20]!r}, not a band number; "
                                     "re-download the METADATA.XML") from None
    return out


def _enmap_bad_bands(root: Element, count: int, name: str, issues: list[Issue]) -> set[int]:
    """Bands missing from both expectedChannelsLists, plus bands whose statistics say no data."""
    lists = [_channel_list(root, f"specific/{d}ProductQuality/expectedChannelsList", name) for d in ("vnir", "swir")]
    present = [s for s in lists if s is not None]
    expected = set().union(*present)
    bad: set[int] = set()
    if expected:
        bad = set(range(1, count + 1)) - expected
    else:
        issues.append(warning(Code.BANDS_FLAGGED_BAD, "no specific/vnirProductQuality or swirProductQuality "
                                                      "expectedChannelsList: the XML does not say which bands "
                                                      "are missing", where=name))
    for el in root.findall("product/bandStatistics/bandID"):
        mean, std = _text(el, "mean"), _text(el, "stdDeviation")
        try:
            nodata = float(mean or "nan") == _NODATA_BAND_MEAN and float(std or "nan") == 0.0
            number = int(el.get("number") or "")
        except ValueError:
            continue  # statistics are advisory: a damaged entry flags nothing
        if nodata and 1 <= number <= count:
            bad.add(number)
    return bad


def _level(root: Element, layout: _Layout, name: str, issues: list[Issue]) -> str:
    """The processing level the XML states (its level elements must agree)."""
    found = [(p, v.upper()) for p in layout.levels if (v := _text(root, p)) is not None]
    if len({v for _, v in found}) > 1:
        said = ", ".join(f"{p} = {v}" for p, v in found)
        raise SceneReadError(f"{name}: the level elements disagree ({said}); the METADATA.XML is inconsistent. "
                             "Re-download the delivery")
    if found:
        path, level = found[0]
    else:
        m = _DESIS_NAME_LEVEL.match(Path(name).name) if layout is _DESIS else None
        if m is None:
            raise SceneReadError(f"{name}: no processing level: none of {', '.join(layout.levels)} is in the "
                                 "METADATA.XML. Re-download the delivery")
        path, level = "the file name", m.group(1).upper()
        issues.append(warning(Code.CALIBRATION_SUSPECT,
                              f"none of {', '.join(layout.levels)} states the level; took {level} from the file "
                              "name, which decides whether the gains give radiance or reflectance", where=name))
    if level not in LEVELS:
        raise SceneReadError(f"{name}: {path} = {level[:20]!r} is not a level cubelake reads ({', '.join(LEVELS)})")
    return level


def _utc(root: Element, path: str, name: str, issues: list[Issue]) -> str | None:
    """An ISO 8601 UTC time from ``path``; ``None`` (with a warning when present but unparseable)."""
    raw = _text(root, path)
    if raw is None:
        return None
    text = raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        issues.append(warning(Code.UNKNOWN_TIME, f"{path} = {raw[:40]!r} is not an ISO 8601 time", where=name))
        return None
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _background(root: Element, layout: _Layout, name: str, issues: list[Issue]) -> float | None:
    raw = _text(root, layout.background)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        issues.append(warning(Code.BAD_METADATA, f"{layout.background} = {raw[:40]!r} is not a number; the XML's "
                                                 "no-data value is not used", where=name))
        return None


def read_dlr_metadata(root: Element, name: str) -> DlrMetadata:
    """What a parsed METADATA.XML says (pure). ``name`` is the file, for messages and the DESIS level fallback.

    Raises :class:`SceneReadError` naming the file and each missing or malformed element.
    """
    layout = _LAYOUTS.get(root.tag if isinstance(root.tag, str) else "")
    if layout is None:
        raise SceneReadError(f"{name}: the root element is <{str(root.tag)[:40]}>, not EnMAP's <level_X> or "
                             "DESIS's <hsi_doc>; this is not a DLR METADATA.XML")
    issues: list[Issue] = []
    level = _level(root, layout, name, issues)
    bands = _bands(root, layout, name)
    if layout is _ENMAP:
        bad = _enmap_bad_bands(root, len(bands), name, issues)
        bands = [dataclasses.replace(b, bad=b.number in bad) for b in bands]
    start = _utc(root, _START, name, issues)
    stop = _utc(root, layout.stop, name, issues)
    tags = {"dlr:mission": layout.mission, "dlr:level": level,
            **({"dlr:start_time": start} if start else {}), **({"dlr:stop_time": stop} if stop else {})}
    return DlrMetadata(layout.mission, level, tuple(bands), start, stop, _background(root, layout, name, issues),
                       tuple(issues), tags)


# ---------------------------------------------------------------------------------------------- open


def _no_image_message(xml: Path, prefix: str, images: _Images) -> str:
    suffixes = "/".join(s.lstrip(".") for s in _IMAGE_SUFFIXES)
    headerless = "".join(f"; {display_name(p)} is ENVI data without its header (.HDR)" for p in images.headerless)
    return (f"{display_name(xml)}: no spectral image for this METADATA.XML: looked in {display_name(xml.parent)} "
            f"for {prefix}-SPECTRAL_IMAGE.{{{suffixes}}} (any case), or the pair -SPECTRAL_IMAGE_VNIR and "
            f"-SPECTRAL_IMAGE_SWIR{headerless}. Put the delivery's SPECTRAL_IMAGE next to its METADATA.XML")


def _open_image(images: _Images) -> RasterSource:
    if len(images.data) == 1 and images.headers:
        return open_envi(images.headers[0], images.data[0])
    if len(images.data) == 2:  # EnMAP L1B: VNIR bands, then SWIR bands, of the same sensor grid
        return open_gdal(images.data[0], band_files=[str(p) for p in images.data])
    return open_gdal(images.data[0])


def dlr_scene_metadata(image: SceneMetadata, dlr: DlrMetadata, xml_name: str,
                       files: tuple[str, ...]) -> SceneMetadata:
    """The image's metadata (grid, CRS, dtype, layout) with the XML's spectral facts, time and tags (pure)."""
    names = [b.name for b in image.bands] + [None] * max(0, len(dlr.bands) - len(image.bands))
    bands = tuple(BandInfo(b.number, names[b.number - 1], b.wavelength_nm, b.fwhm_nm, b.bad) for b in dlr.bands)
    calibration = FileCalibration(
        CALIBRATION_NAME, tuple(b.gain for b in dlr.bands), tuple(b.offset for b in dlr.bands), unit=dlr.unit,
        note=f"{dlr.mission} METADATA.XML per-band gain and offset: value = gain x DN + offset")
    tags: dict[str, Any] = {**image.tags, **dlr.tags, "dlr:image_format": image.format,
                            "cubelake:product": dlr.product}
    return dataclasses.replace(
        image, path=xml_name, files=files, format=f"DLR-{dlr.mission}", bands=bands,
        calibrations=(calibration, *(c for c in image.calibrations if c.name != CALIBRATION_NAME)),
        nodata=image.nodata if image.nodata is not None else dlr.background, datetime=dlr.start_time,
        tags={k: str(v) for k, v in tags.items()}, issues=(*image.issues, *dlr.issues))


def _l1b_issue(dlr: DlrMetadata, images: _Images, name: str) -> list[Issue]:
    if len(images.data) != 2:
        return []
    return [warning(Code.NOT_GEOREFERENCED,
                    f"{dlr.mission} {dlr.level} is in sensor geometry: its VNIR and SWIR images are stacked pixel "
                    "by pixel, but the two detectors are only co-registered by L1C/L2A processing; use L1C or L2A "
                    "for spectra of one ground pixel", where=name)]


def open_dlr(xml: Path) -> DlrSource:
    """Open a DLR delivery from its ``-METADATA.XML`` (a file or ``/vsis3/`` name) as one scene.

    Raises :class:`SceneReadError` naming the file and the fix: XML unreadable, hostile or missing an
    element, no spectral image, or XML and image disagreeing on the band count.
    """
    name = display_name(xml)
    prefix = _delivery_prefix(xml)
    if prefix is None:
        raise SceneReadError(f"{name}: not a DLR metadata file name; expected <product name>-METADATA.XML")
    dlr = read_dlr_metadata(_read_xml(xml), name)
    images = _find_images(prefix, _listing(xml))
    if not images.data:
        raise SceneReadError(_no_image_message(xml, prefix, images))
    source = _open_image(images)
    count = source.meta.count
    if count != len(dlr.bands):
        source.close()
        shown = " + ".join(display_name(p) for p in images.data)
        raise SceneReadError(
            f"{name}: the METADATA.XML describes {len(dlr.bands)} bands but {shown} has {count}; they are not "
            "one delivery (or one is damaged). Put the delivery's own SPECTRAL_IMAGE next to its METADATA.XML, "
            "or re-download it")
    dlr = dataclasses.replace(dlr, issues=(*dlr.issues, *_l1b_issue(dlr, images, name)))
    files = tuple(str(p) for p in (*images.data, *images.headers, xml))
    return DlrSource(source, dlr_scene_metadata(source.meta, dlr, name, files))
