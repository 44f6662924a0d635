"""Corpus entries for Landsat MTL scenes: the real TM text MTL and the OLI JSON MTL, edited.

The TM variants share one folder holding copies of the seven real band files; every variant is
an MTL (``LT5_<what>_MTL.txt``) that names them, with one field made wrong: the file cut short,
``SUN_ELEVATION`` 0/negative/non-numeric, ``RADIANCE_MULT`` negative or non-numeric, a band
path climbing out of the folder or absolute, a listed band missing, no ``SPACECRAFT_ID``...
The OLI variants use the real JSON MTL reduced to the band present on disk (B5).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import ops
from .model import Builder, Case, Expect

__all__ = ["LANDSAT_RUNS", "LT5_DIR", "LT5_MTL", "landsat_cases"]

LT5_DIR = "landsat5_tm_rstoolbox"
LT5_ID = "LT52240631988227CUB02"
LT5_MTL = f"{LT5_DIR}/{LT5_ID}_MTL.txt"
L8_JSON = "landsat8_rio_toa/LC81390452014295LGN00_MTL.json"
L8_B5 = "landsat8_rio_toa/tiny_LC81390452014295LGN00_B5.TIF"
LANDSAT_RUNS = ("landsat:ingest", "landsat:validate")
OUTSIDE = "outside_landsat"  # valid band files outside the MTL's folder (never walked by a run)
PASSWD = "root:x:0:0"  # what /etc/passwd starts with: must never be echoed

_OUT_OF_FOLDER = r"outside|escap|not (in|inside|under)|folder|directory|absolute|FILE_NAME_BAND"


def _bands(root: Path, real: Path, folder: str) -> None:
    for n in range(1, 8):
        name = f"{LT5_ID}_B{n}.TIF"
        if not (root / folder / name).exists():
            ops.copy(real / LT5_DIR / name, root / folder / name)


def _mtl_text(real: Path) -> tuple[str, int]:
    raw = (real / LT5_MTL).read_bytes()
    text = raw.rstrip(b"\0").decode("ascii")
    return text, len(raw)


def _set(key: str, value: str) -> Callable[[str, Path], str]:
    rx = re.compile(rf"^(\s*{key} = ).*$", re.MULTILINE)

    def edit(text: str, root: Path) -> str:
        assert rx.search(text), key
        return rx.sub(lambda m: m.group(1) + value.replace("{root}", str(root)), text)

    return edit


def _add(key: str, value: str) -> Callable[[str, Path], str]:
    return lambda text, root: text.replace("    SUN_AZIMUTH", f"    {key} = {value}\n    SUN_AZIMUTH", 1)


def _drop(pattern: str) -> Callable[[str, Path], str]:
    rx = re.compile(rf"^\s*{pattern} = .*\n", re.MULTILINE)
    return lambda text, root: rx.sub("", text)


def _cut_before(marker: str) -> Callable[[str, Path], str]:
    return lambda text, root: text[: text.index(marker)]


def _cut(frac: float) -> Callable[[str, Path], str]:
    return lambda text, root: text[: int(len(text) * frac)]


def _lt5(name: str, edit: Callable[[str, Path], str], folder: str = "b_landsat/lt5") -> Builder:
    def build(root: Path, real: Path) -> None:
        _bands(root, real, folder)
        for n in (1, 2, 3):  # valid band files outside the folder, for the path-escape variants
            src = real / LT5_DIR / f"{LT5_ID}_B{n}.TIF"
            if not (root / OUTSIDE / src.name).exists():
                ops.copy(src, root / OUTSIDE / src.name)
        text, size = _mtl_text(real)
        body = edit(text, root).encode("utf-8")
        ops.write_bytes(root / folder / name, body + b"\0" * max(0, size - len(body)))

    return build


def _case(cid: str, what: str, expect: Expect, edit: Callable[[str, Path], str], **kw: Any) -> Case:
    name = f"LT5_{cid.removeprefix('lt5-').replace('-', '_')}_MTL.txt"
    scene = f"b_landsat/lt5/{name}"
    return Case(f"landsat-{cid}", "landsat", f"{LT5_MTL}: {what}", scene, expect, LANDSAT_RUNS, _lt5(name, edit), **kw)


def _lt5_cases() -> list[Case]:
    r, w = Expect.REJECT, Expect.REJECT_OR_WARN
    neg_mult = re.compile(r"^(\s*RADIANCE_MULT_BAND_\d = )", re.MULTILINE)
    cases = [
        _case("lt5-no-sun-elevation", "cut before IMAGE_ATTRIBUTES (no SUN_ELEVATION)", r,
              _cut_before("  GROUP = IMAGE_ATTRIBUTES"), mention="SUN_ELEVATION"),
        *[_case(f"lt5-trunc-{int(f * 1000):03d}", f"text cut at {f:.0%}", r, _cut(f)) for f in (0.1, 0.33, 0.6, 0.86, 0.9)],
        _case("lt5-sun-zero", "SUN_ELEVATION = 0", r, _set("SUN_ELEVATION", "0.0"), mention="SUN_ELEVATION"),
        _case("lt5-sun-negative", "SUN_ELEVATION = -12.5 (sun below the horizon)", w, _set("SUN_ELEVATION", "-12.5"),
              mention="SUN_ELEVATION"),
        _case("lt5-sun-text", "SUN_ELEVATION = high", r, _set("SUN_ELEVATION", '"high"'), mention="SUN_ELEVATION"),
        _case("lt5-sun-95", "SUN_ELEVATION = 95 (above the zenith)", Expect.ROBUST, _set("SUN_ELEVATION", "95.0")),
        _case("lt5-radiance-mult-negative", "every RADIANCE_MULT_BAND_n negative", w,
              lambda t, root: neg_mult.sub(r"\1-", t), mention=r"RADIANCE_MULT|negative"),
        _case("lt5-radiance-mult-text", "RADIANCE_MULT_BAND_3 = abc", r, _set("RADIANCE_MULT_BAND_3", '"abc"'),
              mention="RADIANCE_MULT"),
        _case("lt5-radiance-add-missing", "every RADIANCE_ADD_BAND_n removed", w, _drop(r"RADIANCE_ADD_BAND_\d"),
              mention="RADIANCE_ADD"),
        _case("lt5-band-etc-passwd", "FILE_NAME_BAND_1 = ../../../../../../../../etc/passwd", w,
              _set("FILE_NAME_BAND_1", '"../../../../../../../../etc/passwd"'), mention=_OUT_OF_FOLDER,
              forbid=(PASSWD,), confine=True),
        _case("lt5-band-dotdot", f"FILE_NAME_BAND_3 = ../../{OUTSIDE}/<a valid band file>", w,
              _set("FILE_NAME_BAND_3", f'"../../{OUTSIDE}/{LT5_ID}_B3.TIF"'), mention=_OUT_OF_FOLDER, confine=True),
        _case("lt5-band-absolute", "FILE_NAME_BAND_2 = an absolute path to a valid band file elsewhere", w,
              _set("FILE_NAME_BAND_2", f'"{{root}}/{OUTSIDE}/{LT5_ID}_B2.TIF"'), mention=_OUT_OF_FOLDER, confine=True),
        _case("lt5-band-missing", "FILE_NAME_BAND_4 names a file that is not on disk", w,
              _set("FILE_NAME_BAND_4", f'"{LT5_ID}_B4_MISSING.TIF"'), mention=r"B4|band 4|BAND_4|missing"),
        _case("lt5-no-spacecraft", "SPACECRAFT_ID removed", r, _drop("SPACECRAFT_ID"), mention="SPACECRAFT_ID|Landsat"),
        _case("lt5-date-text", "DATE_ACQUIRED = yesterday", r, _set("DATE_ACQUIRED", "yesterday"), mention="DATE_ACQUIRED"),
        # the distance also follows from DATE_ACQUIRED (<0.1% off), so a warning naming the field is enough
        _case("lt5-earth-sun-text", "EARTH_SUN_DISTANCE = far", w, _add("EARTH_SUN_DISTANCE", '"far"'),
              mention="EARTH_SUN_DISTANCE"),
        _case("lt5-earth-sun-zero", "EARTH_SUN_DISTANCE = 0", w, _add("EARTH_SUN_DISTANCE", "0.0"),
              mention="EARTH_SUN_DISTANCE"),
        _case("lt5-same-band-twice", "FILE_NAME_BAND_2 names band 1's file", Expect.ROBUST,
              _set("FILE_NAME_BAND_2", f'"{LT5_ID}_B1.TIF"')),
        _case("lt5-spacecraft-landsat8", "SPACECRAFT_ID = LANDSAT_8 on TM bands", Expect.ROBUST,
              _set("SPACECRAFT_ID", '"LANDSAT_8"')),
    ]
    cut_dir = "b_landsat/lt5_band_cut"

    def band_cut(root: Path, real: Path) -> None:
        _lt5(f"{LT5_ID}_MTL.txt", lambda t, r: t, cut_dir)(root, real)
        ops.truncate(real / LT5_DIR / f"{LT5_ID}_B5.TIF", root / cut_dir / f"{LT5_ID}_B5.TIF", 0.5)

    cases += [
        Case("landsat-lt5-band-file-truncated", "landsat", f"{LT5_MTL} whose band 5 file is cut to 50%",
             f"{cut_dir}/{LT5_ID}_MTL.txt", r, LANDSAT_RUNS, band_cut),
        Case("landsat-mtl-is-tiff", "landsat", "a band GeoTIFF named *_MTL.txt", "b_landsat/lt5/LT5_tiffcopy_MTL.txt", r,
             LANDSAT_RUNS, lambda root, real: ops.copy(real / LT5_DIR / f"{LT5_ID}_B1.TIF",
                                                       root / "b_landsat/lt5/LT5_tiffcopy_MTL.txt")),
        Case("landsat-mtl-zero-bytes", "landsat", "a 0-byte *_MTL.txt", "b_landsat/lt5/LT5_empty_MTL.txt", r,
             LANDSAT_RUNS, lambda root, real: ops.write_bytes(root / "b_landsat/lt5/LT5_empty_MTL.txt", b"")),
        Case("landsat-mtl-nul-only", "landsat", "an MTL of 65535 NUL bytes (the padding alone)",
             "b_landsat/lt5/LT5_nul_only_MTL.txt", r, LANDSAT_RUNS,
             lambda root, real: ops.write_bytes(root / "b_landsat/lt5/LT5_nul_only_MTL.txt", b"\0" * 65535)),
    ]
    return cases


def _l8_doc(real: Path) -> dict[str, Any]:
    """The real OLI JSON MTL listing only the band that is on disk (B5)."""
    doc = json.loads((real / L8_JSON).read_text())
    meta = doc["L1_METADATA_FILE"]["PRODUCT_METADATA"]
    for key in [k for k in meta if k.startswith("FILE_NAME_BAND_") and k != "FILE_NAME_BAND_5"]:
        del meta[key]
    return doc


def _l8(cid: str, what: str, expect: Expect, edit: Callable[[dict[str, Any]], Any], raw: Callable[[str], str] | None = None,
        **kw: Any) -> Case:
    name = f"L8_{cid.replace('-', '_')}_MTL.json"
    scene = f"b_landsat/l8/{name}"

    def build(root: Path, real: Path) -> None:
        if not (root / "b_landsat/l8" / Path(L8_B5).name).exists():
            ops.copy(real / L8_B5, root / "b_landsat/l8" / Path(L8_B5).name)
        doc = _l8_doc(real)
        result = edit(doc)
        text = json.dumps(doc if result is None else result, indent=1)
        ops.write_text(root / scene, raw(text) if raw else text)

    return Case(f"landsat-l8-{cid}", "landsat", f"{L8_JSON} (bands not on disk removed): {what}", scene, expect,
                LANDSAT_RUNS, build, **kw)


def _attrs(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        for group in doc["L1_METADATA_FILE"].values():
            if key in group:
                group[key] = value
                return
        raise AssertionError(key)

    return edit


def _l8_cases() -> list[Case]:
    r = Expect.REJECT
    return [
        _l8("ok", "nothing changed (control: must ingest)", Expect.OK, lambda d: None),
        _l8("json-cut", "JSON cut at 50%", r, lambda d: None, raw=lambda t: t[: len(t) // 2]),
        _l8("json-array", "a JSON array instead of an object", r, lambda d: [1, 2, 3]),
        _l8("sun-text", 'SUN_ELEVATION = "abc"', r, _attrs("SUN_ELEVATION", "abc"), mention="SUN_ELEVATION"),
        _l8("sun-null", "SUN_ELEVATION = null", r, _attrs("SUN_ELEVATION", None), mention="SUN_ELEVATION"),
        _l8("refl-mult-negative", "REFLECTANCE_MULT_BAND_5 = -2e-5", Expect.REJECT_OR_WARN,
            _attrs("REFLECTANCE_MULT_BAND_5", -2e-5), mention=r"REFLECTANCE_MULT|negative"),
        _l8("band-etc-passwd", 'FILE_NAME_BAND_5 = "/etc/passwd"', Expect.REJECT_OR_WARN,
            _attrs("FILE_NAME_BAND_5", "/etc/passwd"), mention=_OUT_OF_FOLDER, forbid=(PASSWD,), confine=True),
        _l8("band-list", 'FILE_NAME_BAND_5 = ["a", "b"]', r, _attrs("FILE_NAME_BAND_5", ["a", "b"])),
    ]


def landsat_cases() -> list[Case]:
    return [*_lt5_cases(), *_l8_cases()]
