"""Corpus entries for raster files: GeoTIFF/BigTIFF, ENVI and MATLAB, each derived from a real file.

TIFF damage: truncations at several fractions, IFD fields rewritten (dimensions, strip/tile
offsets past the end or zero, byte counts, compression, bits per sample, sample format),
compressed blocks flipped until GDAL cannot decode them, seeded random flips in the IFD, and
GDAL band tags (``wavelength``/``fwhm``) made non-numeric or decreasing. ENVI damage: the real
AVIRIS-NG header's fields made non-numeric, unknown or inconsistent, its data file cut or
extended. MATLAB damage: truncated v5 and v7.3 files, flipped headers, no cube, dims claims.
"""

from __future__ import annotations

import functools
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import scipy.io

from . import ops
from .model import Builder, Case, Expect

__all__ = ["ENMAP", "ENVI_HDR", "HYDICE", "LT5B1", "envi_cases", "envi_pair", "hydice_v5", "mat_cases", "tiff_cases",
           "v5_dims_bomb", "v73_file"]

ENMAP = "hsi_enmap_potsdam/enmap_potsdam_tile_96_0.tif"  # 224 bands, band-sequential strips, wavelength tags
LT5B1 = "landsat5_tm_rstoolbox/LT52240631988227CUB02_B1.TIF"  # LZW strips, uint8
DEM = "geotiff_cogeotiff/DEM_BS28_2016_1000_1141.tif"  # float32 strips, IFD at the end of the file
MODEL64 = "geotiff_cogeotiff/model_transformation.tif"  # 64 bands int8, band-sequential strips
RGBA_ZSTD = "geotiff_cogeotiff/rgba8_cog.tiff"  # ZSTD COG, 16x16 tiles
BIG_ENDIAN = "geotiff_cogeotiff/big.endian.tiff"  # "MM" TIFF, ZSTD
NAIP_BIGTIFF = "geotiff_image_tiff/usda_naip_256_webp_z3.tif"  # BigTIFF, WEBP tiles
RX_COG = "geotiff_rioxarray/cog.tif"  # DEFLATE int16 COG, 256 tiles
JPEG_COG = "geotiff_rasterio/cogeo.tif"  # JPEG COG
ENVI_HDR = "hsi_aviris_ng_isofit/small_chunk/ang20170323t202244_rdn_7000-7010.hdr"  # BIL float32, 425 bands
HYDICE = "hsi_abu_anomaly/HYDICE_data.mat"  # v5 (compressed): data 100x80x162 uint16, map 100x80
KSC_V73 = "hsi_ground_truth/v73_hdf5/KSC_gt.mat"  # v7.3 (HDF5 with a 512-byte user block)
SALINAS_V5 = "hsi_ground_truth/Salinas_gt.mat"

TIFF_RUNS = ("tiff:ingest", "tiff:validate")
ENVI_RUNS = ("envi:ingest", "envi:validate")
MAT_RUNS = ("mat:ingest", "mat:validate")

# TIFF tag codes
WIDTH, LENGTH, BITS, COMPRESSION, STRIP_OFFSETS, SAMPLES = 256, 257, 258, 259, 273, 277
ROWS_PER_STRIP, STRIP_COUNTS, PLANAR, TILE_W, TILE_OFFSETS, TILE_COUNTS, SAMPLE_FORMAT = 278, 279, 284, 322, 324, 325, 339
NODATA = 42113
LONG, ASCII = 4, 2


def _from(fn: Callable[..., Any], src: str, dst: str, *args: Any) -> Builder:
    """A builder calling ``fn(real/src, root/dst, *args)``."""

    def build(root: Path, real: Path) -> None:
        fn(real / src, root / dst, *args)

    return build


def _tags(src: str, dst: str, *changes: tuple[int, Any, int | None]) -> Builder:
    """Rewrite IFD tags; a value ``"EOF"`` means 4096 bytes past the end of the file."""

    def build(root: Path, real: Path) -> None:
        past = os.path.getsize(real / src) + 4096
        ops.tiff_set(real / src, root / dst, [(c, past if v == "EOF" else v, d) for c, v, d in changes])

    return build


def _band_tag(name: str, edit: Callable[[int, str], str]) -> Callable[[str], str]:
    """An XML edit applying ``edit(band index, value)`` to every ``<Item name=NAME sample=i>``."""
    rx = re.compile(rf'(<Item name="{name}" sample="(\d+)"[^>]*>)([^<]*)(</Item>)')
    return lambda xml: rx.sub(lambda m: m.group(1) + edit(int(m.group(2)), m.group(3)) + m.group(4), xml)


def _reverse_wavelengths(xml: str) -> str:
    rx = re.compile(r'<Item name="wavelength" sample="\d+">([^<]*)</Item>')
    values = rx.findall(xml)[::-1]
    it = iter(values)
    return rx.sub(lambda m: m.group(0).replace(f">{m.group(1)}<", f">{next(it)}<"), xml)


def _tiff(cid: str, what: str, expect: Expect, build_fn: Callable[[str], Builder], name: str,
          mention: str | None = None, src: str | None = None) -> Case:
    """A case of the TIFF batch. Copies of the EnMAP tile keep an ``enmap_`` name, so the bundled
    enmap-l2a profile still applies to them as to the real tile (else the generic profile rejects
    them for its wavelength overlap, hiding the damage under test)."""
    scene = f"b_tiff/{'enmap_' if src == ENMAP else ''}{name}"
    return Case(cid, "tiff", what, scene, expect, TIFF_RUNS, build_fn(scene), mention=mention)


def _tiff_truncations() -> list[Case]:
    cuts = [(ENMAP, "enmap", 0.05, "inside the GDAL metadata"), (ENMAP, "enmap", 0.5, "half the band strips"),
            (MODEL64, "m64", 0.999, "the last band strip short"), (LT5B1, "lt5b1", 16, "the 8-byte header and a bit"),
            (LT5B1, "lt5b1", 0.33, "a third of the LZW strips"), (LT5B1, "lt5b1", 0.9, "the last strip missing"),
            (DEM, "dem", 0.5, "the IFD (at the end) lost"), (DEM, "dem", 0.999, "the IFD cut"),
            (NAIP_BIGTIFF, "naip_bigtiff", 0.1, "BigTIFF, inside the tiles"),
            (NAIP_BIGTIFF, "naip_bigtiff", 0.5, "BigTIFF, half the tiles"),
            (NAIP_BIGTIFF, "naip_bigtiff", 0.9, "BigTIFF, the last tiles"),
            (RGBA_ZSTD, "rgba_zstd_cog", 0.5, "ZSTD COG, half"), (RX_COG, "rx_deflate_cog", 0.5, "DEFLATE COG, half"),
            (BIG_ENDIAN, "big_endian", 0.6, "big-endian ZSTD, 60%")]
    out = []
    for src, tag, keep, why in cuts:
        label = f"{keep}b" if isinstance(keep, int) else f"{int(keep * 1000):03d}"
        name = f"trunc_{label}.tif" if src == ENMAP else f"trunc_{tag}_{label}.tif"
        expect, mention = Expect.REJECT, None
        if src == DEM and keep == 0.999:  # only tag values after the IFD are lost (the CRS): at least warn
            expect, mention = Expect.REJECT_OR_WARN, r"truncat|end of (the )?file|beyond|past the end"
        out.append(_tiff(f"tiff-trunc-{tag}-{label}", f"{src} truncated ({why})", expect,
                         lambda s, src=src, keep=keep: _from(ops.truncate, src, s, keep), name, mention, src))
    return out


def _tiff_ifd() -> list[Case]:
    e = Expect.REJECT
    rows: list[tuple[str, str, str, tuple[tuple[int, Any, int | None], ...], Expect]] = [
        ("enmap-strip-offsets-past-eof", ENMAP, "all 224 StripOffsets point 4 KiB past the end", ((STRIP_OFFSETS, "EOF", None),), e),
        ("enmap-strip-offsets-zero", ENMAP, "all StripOffsets are 0", ((STRIP_OFFSETS, 0, None),), e),
        ("m64-strip-counts-zero", MODEL64, "all StripByteCounts are 0 (no pixel data at all)", ((STRIP_COUNTS, 0, None),), e),
        ("m64-strip-counts-huge", MODEL64, "StripByteCounts 2^31-1", ((STRIP_COUNTS, 2**31 - 1, LONG),), e),
        ("m64-height-doubled", MODEL64, "ImageLength 20 while strips hold 10 rows", ((LENGTH, 20, None), (ROWS_PER_STRIP, 20, None)), e),
        ("lt5b1-strip-offsets-past-eof", LT5B1, "LZW StripOffsets past the end", ((STRIP_OFFSETS, "EOF", None),), e),
        ("lt5b1-compression-99", LT5B1, "Compression = 99 (no such codec)", ((COMPRESSION, 99, None),), e),
        ("lt5b1-compression-deflate", LT5B1, "LZW strips declared DEFLATE", ((COMPRESSION, 8, None),), e),
        ("lt5b1-compression-none", LT5B1, "LZW strips declared uncompressed", ((COMPRESSION, 1, None),), e),
        ("lt5b1-bits-16", LT5B1, "BitsPerSample 16 on 8-bit LZW strips", ((BITS, 16, None),), e),
        ("lt5b1-samples-0", LT5B1, "SamplesPerPixel = 0", ((SAMPLES, 0, None),), e),
        ("lt5b1-width-0", LT5B1, "ImageWidth = 0", ((WIDTH, 0, None),), e),
        ("lt5b1-planar-3", LT5B1, "PlanarConfiguration = 3", ((PLANAR, 3, None),), e),
        ("lt5b1-rows-per-strip-0", LT5B1, "RowsPerStrip = 0", ((ROWS_PER_STRIP, 0, None),), e),
        ("dem-bits-13", DEM, "float32 declared 13 bits per sample", ((BITS, 13, None),), e),
        ("dem-sampleformat-complex", DEM, "SampleFormat 6 (complex float)", ((SAMPLE_FORMAT, 6, None),), e),
        ("dem-sampleformat-99", DEM, "SampleFormat 99 (undefined)", ((SAMPLE_FORMAT, 99, None),), Expect.ROBUST),
        ("rx-tile-offsets-past-eof", RX_COG, "TileOffsets past the end", ((TILE_OFFSETS, "EOF", None),), e),
        ("rx-tile-offsets-zero", RX_COG, "TileOffsets all 0 (every tile absent)", ((TILE_OFFSETS, 0, None), (TILE_COUNTS, 0, None)), e),
        ("rx-tile-counts-huge", RX_COG, "TileByteCounts 2^31-1", ((TILE_COUNTS, 2**31 - 1, None),), e),
        ("rx-tile-width-7", RX_COG, "TileWidth 7 (not a multiple of 16)", ((TILE_W, 7, None),), e),
        ("naip-bigtiff-tile-offsets-past-eof", NAIP_BIGTIFF, "BigTIFF TileOffsets past the end", ((TILE_OFFSETS, "EOF", None),), e),
        ("dem-nodata-text", DEM, "GDAL_NODATA = 'abc'", ((NODATA, "abc", ASCII),), Expect.ROBUST),
    ]
    return [_tiff(f"tiff-ifd-{cid}", f"{src}: {what}", exp, lambda s, src=src, ch=ch: _tags(src, s, *ch), f"ifd_{cid}.tif",
                  src=src)
            for cid, src, what, ch, exp in rows]


def _tiff_flips() -> list[Case]:
    pixel = [(LT5B1, "lt5b1-lzw", 1), (LT5B1, "lt5b1-lzw", 2), (RX_COG, "rx-deflate", 3), (RGBA_ZSTD, "rgba-zstd", 4),
             (NAIP_BIGTIFF, "naip-webp", 5), (JPEG_COG, "cogeo-jpeg", 6), (BIG_ENDIAN, "big-endian-zstd", 7)]
    out = [_tiff(f"tiff-pixelflip-{tag}-{seed}", f"{src}: 4 bytes of one compressed block flipped (GDAL cannot decode it)",
                 Expect.REJECT, lambda s, src=src, seed=seed: _from(ops.detectable_flip, src, s, seed),
                 f"pixelflip_{tag}_{seed}.tif", mention=r"block|decode|read")
           for src, tag, seed in pixel]
    header = [(LT5B1, "lt5b1", 11), (LT5B1, "lt5b1", 12), (LT5B1, "lt5b1", 13), (RX_COG, "rx", 14), (RX_COG, "rx", 15),
              (DEM, "dem", 16), (MODEL64, "m64", 17)]
    out += [_tiff(f"tiff-ifdflip-{tag}-{seed}", f"{src}: 3 seeded random byte flips in the first IFD", Expect.ROBUST,
                  lambda s, src=src, seed=seed: _from(ops.header_flips, src, s, seed), f"ifdflip_{tag}_{seed}.tif")
            for src, tag, seed in header]
    return out


def _tiff_band_tags() -> list[Case]:
    rows: list[tuple[str, str, Callable[[str], str], Expect, str | None]] = [
        ("wavelength-nonnumeric", "band 5 wavelength = 'n/a'",
         _band_tag("wavelength", lambda i, v: "n/a" if i == 4 else v), Expect.REJECT, "wavelength"),
        ("fwhm-nonnumeric", "band 5 fwhm = 'wide'", _band_tag("fwhm", lambda i, v: "wide" if i == 4 else v),
         Expect.REJECT, "fwhm"),
        ("wavelength-decreasing", "wavelengths in decreasing order", _reverse_wavelengths, Expect.REJECT_OR_WARN,
         r"wavelength.*(order|decreas|increas|revers)|(order|decreas|increas|revers).*wavelength"),
        ("wavelength-nan", "band 5 wavelength = 'nan'", _band_tag("wavelength", lambda i, v: "nan" if i == 4 else v),
         Expect.REJECT, "wavelength"),
        ("wavelength-negative", "band 1 wavelength negative", _band_tag("wavelength", lambda i, v: "-" + v if i == 0 else v),
         Expect.REJECT, "wavelength"),
        ("wavelength-all-equal", "every band's wavelength = 500", _band_tag("wavelength", lambda i, v: "500"),
         Expect.REJECT, "wavelength"),
        ("bbl-text", "bbl = 'maybe' on every band", _band_tag("bbl", lambda i, v: "maybe"), Expect.ROBUST, None),
        ("units-parsecs", "wavelength_units = 'parsecs'", _band_tag("wavelength_units", lambda i, v: "parsecs"),
         Expect.ROBUST, None),
    ]
    return [_tiff(f"tiff-tags-{cid}", f"{ENMAP}: {what}", exp, lambda s, edit=edit: _from(ops.tiff_xml, ENMAP, s, edit),
                  f"tags_{cid}.tif", mention=mention, src=ENMAP)
            for cid, what, edit, exp, mention in rows]


def _tiff_misc() -> list[Case]:
    fuzz = ["oom_crash_sample", "inf_loop_sample", "divide_by_zero_sample", "oor_panic_sample"]
    out = [_tiff(f"tiff-fuzz-{f}", f"bad_inputs/image_tiff_fuzz/{f}.tif (fuzzer-found, copied)", Expect.REJECT,
                 lambda s, f=f: _from(ops.copy, f"bad_inputs/image_tiff_fuzz/{f}.tif", s), f"fuzz_{f}.tif")
           for f in fuzz]
    out.append(_tiff("tiff-zero-bytes", "a 0-byte file named .tif", Expect.REJECT,
                     lambda s: _from(ops.truncate, LT5B1, s, 0), "zero_bytes.tif"))
    out.append(_tiff("tiff-text-named-tif", "SOURCES.md's first KiB named .tif", Expect.REJECT,
                     lambda s: _from(ops.truncate, "SOURCES.md", s, 1024), "text_named.tif"))
    out.append(_tiff("tiff-mat-named-tif", "a MATLAB file named .tif", Expect.REJECT,
                     lambda s: _from(ops.copy, SALINAS_V5, s), "mat_named.tif"))
    return out


def tiff_cases() -> list[Case]:
    return [*_tiff_truncations(), *_tiff_ifd(), *_tiff_flips(), *_tiff_band_tags(), *_tiff_misc()]


# -- ENVI --------------------------------------------------------------------------------------


def _edit_list(key: str, fn: Callable[[list[str]], list[str]]) -> Callable[[str], str]:
    """Edit the brace list of header field ``key`` (values as strings)."""
    rx = re.compile(rf"^({re.escape(key)}\s*=\s*)\{{([^}}]*)\}}", re.MULTILINE)

    def edit(text: str) -> str:
        m = rx.search(text)
        assert m is not None, key
        values = [v.strip() for v in m.group(2).split(",")]
        return text[: m.start()] + m.group(1) + "{" + ",".join(fn(values)) + "}" + text[m.end():]

    return edit


def _set_field(key: str, value: str) -> Callable[[str], str]:
    rx = re.compile(rf"^{re.escape(key)}\s*=.*$", re.MULTILINE)
    return lambda text: rx.sub(f"{key} = {value}", text, count=1) if rx.search(text) else text + f"{key} = {value}\n"


def _replace_at(i: int, new: str) -> Callable[[list[str]], list[str]]:
    return lambda vs: [new if k == i else v for k, v in enumerate(vs)]


def envi_pair(header: str, edit: Callable[[str], str], data: str = "copy", keep: float = 1.0) -> Builder:
    """A header (the real one, edited) and its data file: copied, cut to ``keep``, extended, or absent."""

    def build(root: Path, real: Path) -> None:
        text = (real / ENVI_HDR).read_text(encoding="latin-1")
        hdr = root / header
        ops.write_bytes(hdr, edit(text).encode("latin-1"))
        src = real / ENVI_HDR.removesuffix(".hdr")
        dst = hdr.with_suffix("")
        if data == "copy":
            ops.copy(src, dst)
        elif data == "truncate":
            ops.truncate(src, dst, keep)
        elif data == "extend":
            raw = src.read_bytes()
            ops.write_bytes(dst, raw + raw[: int(len(raw) * keep)])
        elif data == "dir":
            dst.mkdir(parents=True, exist_ok=True)

    return build


def _envi(cid: str, what: str, expect: Expect, edit: Callable[[str], str], data: str = "copy", keep: float = 1.0,
          mention: str | None = None) -> Case:
    # named like the real flight line, so the bundled aviris-ng-radiance profile applies as to the real one
    scene = f"b_envi/ang20170323t202244_rdn_{cid.removeprefix('envi-').replace('-', '_')}.hdr"
    return Case(cid, "envi", f"{ENVI_HDR}: {what}", scene, expect, ENVI_RUNS, envi_pair(scene, edit, data, keep),
                mention=mention)


def _same(text: str) -> str:
    return text


def _cut_header(frac: float) -> Callable[[str], str]:
    return lambda text: text[: int(len(text) * frac)]


def _garble(seed: int) -> Callable[[str], str]:
    def edit(text: str) -> str:
        rng = np.random.default_rng(seed)
        chars = list(text)
        for i in rng.choice(np.arange(5, 400), 12, replace=False):
            chars[int(i)] = chr(int(rng.integers(33, 127)))
        return "".join(chars)

    return edit


def envi_cases() -> list[Case]:
    r, w = Expect.REJECT, Expect.REJECT_OR_WARN
    n = 425
    return [
        _envi("envi-data-trunc-50", "data file cut to 50%", r, _same, "truncate", 0.5),
        _envi("envi-data-trunc-999", "data file 0.1% short", r, _same, "truncate", 0.999),
        _envi("envi-data-larger", "data file 1.5x what the header says", w, _same, "extend", 0.5,
              mention=r"larger|longer|extra|more|size|bytes"),
        _envi("envi-data-missing", "no data file", r, _same, "none"),
        _envi("envi-data-is-dir", "the data file is a directory", r, _same, "dir"),
        _envi("envi-interleave-zigzag", "interleave = zigzag", r, _set_field("interleave", "zigzag"), mention="interleave"),
        _envi("envi-byte-order-7", "byte order = 7", r, _set_field("byte order", "7"), mention="byte order"),
        _envi("envi-wavelength-nonnumeric", "one wavelength is 'n/a'", r, _edit_list("wavelength", _replace_at(4, "n/a")),
              mention="wavelength"),
        _envi("envi-fwhm-nonnumeric", "one fwhm is 'wide'", r, _edit_list("fwhm", _replace_at(4, "wide")), mention="fwhm"),
        _envi("envi-wavelength-nan", "one wavelength is 'nan'", r, _edit_list("wavelength", _replace_at(4, "nan")),
              mention="wavelength"),
        _envi("envi-wavelength-inf", "one wavelength is 'inf'", r, _edit_list("wavelength", _replace_at(n - 1, "inf")),
              mention="wavelength"),
        _envi("envi-wavelength-decreasing", "wavelengths (and fwhm) in decreasing order", w,
              lambda t: _edit_list("fwhm", lambda v: v[::-1])(_edit_list("wavelength", lambda v: v[::-1])(t)),
              mention=r"wavelength.*(order|decreas|increas|revers)|(order|decreas|increas|revers).*wavelength"),
        _envi("envi-wavelength-count", "420 wavelengths for 425 bands", r, _edit_list("wavelength", lambda v: v[:-5]),
              mention="wavelength"),
        _envi("envi-gain-nonnumeric", "data gain values with one 'abc'", r,
              _set_field("data gain values", "{" + ",".join("abc" if i == 7 else "1.0" for i in range(n)) + "}"),
              mention="gain"),
        _envi("envi-offset-nonnumeric", "data offset values with one 'zero'", r,
              _set_field("data offset values", "{" + ",".join("zero" if i == 9 else "0" for i in range(n)) + "}"),
              mention="offset"),
        _envi("envi-gain-negative", "every data gain value is -1", w,
              _set_field("data gain values", "{" + ",".join(["-1.0"] * n) + "}"), mention="gain|negative"),
        _envi("envi-bbl-nonnumeric", "bbl list with one 'x'", r,
              _set_field("bbl", "{" + ",".join("x" if i == 3 else "1" for i in range(n)) + "}"), mention="bbl"),
        _envi("envi-data-type-6", "data type = 6 (complex64)", r, _set_field("data type", "6")),
        _envi("envi-data-type-99", "data type = 99", r, _set_field("data type", "99"), mention="data type"),
        _envi("envi-no-envi-line", "first line 'ENVI' missing", r, lambda t: t.split("\n", 1)[1]),
        _envi("envi-samples-text", "samples = ten", r, _set_field("samples", "ten"), mention="samples"),
        _envi("envi-lines-negative", "lines = -10", r, _set_field("lines", "-10")),
        _envi("envi-bands-zero", "bands = 0", r, _set_field("bands", "0")),
        _envi("envi-header-offset-huge", "header offset = 10^15", r, _set_field("header offset", "1000000000000000")),
        _envi("envi-header-cut-in-list", "header cut inside the wavelength list (unclosed brace)", r, _cut_header(0.3)),
        _envi("envi-header-garbled", "12 seeded random characters of the header replaced", Expect.ROBUST, _garble(21)),
        _envi("envi-ignore-value-text", "data ignore value = none", Expect.ROBUST, _set_field("data ignore value", "none")),
        _envi("envi-units-parsecs", "wavelength units = parsecs", Expect.ROBUST, _set_field("wavelength units", "parsecs")),
        Case("envi-tiff-named-hdr", "envi", f"{LT5B1} named .hdr", "b_envi/tiff_named.hdr", r, ENVI_RUNS,
             _from(ops.copy, LT5B1, "b_envi/tiff_named.hdr")),
        Case("envi-zero-byte-hdr", "envi", "a 0-byte .hdr (no data file)", "b_envi/zero_bytes.hdr", r, ENVI_RUNS,
             _from(ops.truncate, ENVI_HDR, "b_envi/zero_bytes.hdr", 0)),
    ]


# -- MATLAB ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def _hydice_crop(real: Path) -> dict[str, np.ndarray]:
    """A 20x16x162 window of the real HYDICE cube and its anomaly map (uint16 / uint8)."""
    m = scipy.io.loadmat(str(real / HYDICE))
    return {"data": np.ascontiguousarray(m["data"][:20, :16, :]), "map": np.ascontiguousarray(m["map"][:20, :16])}


_V5_HEADER = b"MATLAB 5.0 MAT-file, Platform: GLNXA64, Created on: Mon Jan  1 00:00:00 2024".ljust(116, b" ")


def _savemat(path: Path, arrays: dict[str, Any]) -> None:
    """An uncompressed v5 file with a fixed header text (scipy writes the current time there)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scipy.io.savemat(str(path), arrays, do_compression=False)
    with open(path, "r+b") as f:
        f.write(_V5_HEADER)


_V73_HEADER = (b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Mon Jan  1 00:00:00 2024 HDF5 schema 1.00 ."
               .ljust(116, b" ") + b"\x00" * 8 + b"\x00\x02IM")


def v73_file(path: Path, arrays: dict[str, np.ndarray], bomb_shape: tuple[int, ...] | None = None) -> Path:
    """A MATLAB v7.3 file (HDF5 with the 512-byte user block MATLAB writes); arrays in MATLAB order.

    ``bomb_shape`` adds a chunked ``data`` dataset of that (h5py-order) shape with nothing written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w", userblock_size=512) as h:
        for name, arr in arrays.items():
            ds = h.create_dataset(name, data=np.ascontiguousarray(arr.T), track_times=False)
            ds.attrs["MATLAB_class"] = np.bytes_({"float64": "double", "float32": "single"}.get(arr.dtype.name,
                                                                                              arr.dtype.name))
        if bomb_shape is not None:
            ds = h.create_dataset("data", shape=bomb_shape, dtype="uint16", chunks=(1, 64, 64), track_times=False)
            ds.attrs["MATLAB_class"] = np.bytes_("uint16")
    with open(path, "r+b") as f:
        f.write(_V73_HEADER)
    return path


def hydice_v5(real: Path, path: Path) -> Path:
    """The HYDICE crop (cube and anomaly map) as an uncompressed MATLAB v5 file."""
    _savemat(path, _hydice_crop(real))
    return path


def v5_dims_bomb(real: Path, path: Path, dims: tuple[int, int, int]) -> Path:
    """The HYDICE crop saved as v5, then its array's dimensions subelement rewritten to ``dims``."""
    _savemat(path, {"data": _hydice_crop(real)["data"]})
    raw = bytearray(path.read_bytes())
    mtype, _size = struct.unpack_from("<II", raw, 128)
    assert mtype == 14, "expected an uncompressed miMATRIX first"
    dtype, nbytes = struct.unpack_from("<II", raw, 128 + 24)
    assert (dtype, nbytes) == (5, 12), (dtype, nbytes)
    struct.pack_into("<iii", raw, 128 + 32, *dims)
    path.write_bytes(bytes(raw))
    return path


def _mat(cid: str, what: str, expect: Expect, build: Callable[[Path, Path, Path], Any], name: str,
         mention: str | None = None) -> Case:
    scene = f"b_mat/{name}"

    def b(root: Path, real: Path) -> None:
        build(root, real, root / scene)

    return Case(cid, "mat", what, scene, expect, MAT_RUNS, b, mention=mention)


def _v73_cube(real: Path, path: Path) -> Path:
    return v73_file(path, _hydice_crop(real))


def _v73_cube_cut(keep: float) -> Callable[[Path, Path, Path], Any]:
    def build(root: Path, real: Path, dst: Path) -> None:
        tmp = _v73_cube(real, dst.with_name(dst.name + ".full"))
        ops.truncate(tmp, dst, keep)
        tmp.unlink()

    return build


def _v73_flip(offsets: range) -> Callable[[Path, Path, Path], Any]:
    def build(root: Path, real: Path, dst: Path) -> None:
        tmp = _v73_cube(real, dst.with_name(dst.name + ".full"))
        ops.flip(tmp, dst, offsets)
        tmp.unlink()

    return build


def mat_cases() -> list[Case]:
    r = Expect.REJECT
    crop = _hydice_crop
    cases = [
        _mat(f"mat-v5-trunc-{int(k * 1000):03d}", f"{HYDICE} (zlib-compressed v5) truncated to {k:.0%}", r,
             lambda root, real, dst, k=k: ops.truncate(real / HYDICE, dst, k), f"hydice_trunc_{int(k * 1000):03d}.mat")
        for k in (0.01, 0.3, 0.99)
    ]
    cases += [
        _mat("mat-v5-label-trunc-50", f"{SALINAS_V5} truncated to 50%", r,
             lambda root, real, dst: ops.truncate(real / SALINAS_V5, dst, 0.5), "salinas_gt_trunc_500.mat"),
        _mat("mat-v5-header-flip", f"{HYDICE} with its version/endian bytes (124-127) flipped", r,
             lambda root, real, dst: ops.flip(real / HYDICE, dst, range(124, 128)), "hydice_header_flip.mat"),
        _mat("mat-v5-1d-only", "v5 holding only 1-D arrays (a HYDICE spectrum and a row)", r,
             lambda root, real, dst: _savemat(dst, {"spectrum": crop(real)["data"][0, 0, :].astype(np.float64),
                                                    "row": crop(real)["data"][0, :, 5].astype(np.float64)}),
             "only_1d.mat", mention="cube"),
        _mat("mat-v5-cell", "v5 whose only variable is a cell array holding the cube", r,
             lambda root, real, dst: _savemat(dst, {"c": np.array([crop(real)["data"], "text"], dtype=object)}),
             "cell_only.mat"),
        _mat("mat-v5-complex", "v5 cube of complex values (HYDICE crop + 1j)", r,
             lambda root, real, dst: _savemat(dst, {"data": crop(real)["data"].astype(np.complex128) + 1j}),
             "complex_cube.mat"),
        _mat("mat-v5-nrow-lies", "v5 bands x pixels array with nRow x nCol != pixels", r,
             lambda root, real, dst: _savemat(dst, {"Y": crop(real)["data"].reshape(-1, 162).T,
                                                    "nRow": np.array([[21]]), "nCol": np.array([[16]])}),
             "nrow_lies.mat"),
        _mat("mat-v5-zero-bytes", "a 0-byte .mat", r, lambda root, real, dst: ops.write_bytes(dst, b""), "zero_bytes.mat"),
        _mat("mat-v5-nul-replaced", "bad_inputs/mat/Indian_pines_gt_nul_bytes_replaced.mat (copied)", r,
             lambda root, real, dst: ops.copy(real / "bad_inputs/mat/Indian_pines_gt_nul_bytes_replaced.mat", dst),
             "nul_bytes_replaced.mat"),
        _mat("mat-tiff-named-mat", f"{LT5B1} named .mat", r, lambda root, real, dst: ops.copy(real / LT5B1, dst),
             "tiff_named.mat"),
        _mat("mat-v73-cube-ok", "the HYDICE crop as MATLAB v7.3 (control: must ingest)", Expect.OK,
             lambda root, real, dst: _v73_cube(real, dst), "v73_cube_ok.mat"),
    ]
    cases += [
        _mat(f"mat-v73-trunc-{int(k * 1000):03d}", f"{KSC_V73} (v7.3) truncated to {k:.0%}", r,
             lambda root, real, dst, k=k: ops.truncate(real / KSC_V73, dst, k), f"ksc_v73_trunc_{int(k * 1000):03d}.mat")
        for k in (0.1, 0.5, 0.9)
    ]
    cases += [
        _mat(f"mat-v73-cube-trunc-{int(k * 1000):03d}", f"the v7.3 HYDICE crop truncated to {k:.0%}", r,
             _v73_cube_cut(k), f"v73_cube_trunc_{int(k * 1000):03d}.mat", mention=None)
        for k in (0.3, 0.7, 0.95)
    ]
    cases += [
        _mat("mat-v73-superblock-flip", "the v7.3 HYDICE crop with its HDF5 superblock flipped", r,
             _v73_flip(range(512 + 8, 512 + 24)), "v73_superblock_flip.mat"),
        _mat("mat-v73-signature-flip", "the v7.3 HYDICE crop with the HDF5 signature flipped", r,
             _v73_flip(range(512, 516)), "v73_signature_flip.mat"),
    ]
    return cases
