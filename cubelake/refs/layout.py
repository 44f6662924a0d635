"""Where a TIFF's tiles are, read from its header only, and whether they can be referenced.

tifffile parses the header (classic and BigTIFF, either byte order, from a local file or any
file-like object such as an fsspec S3 file); this module keeps what a reference set needs and
decides, as pure logic, whether the tiles form chunks that :class:`TiffTileCodec` can decode.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from .codec import COMPRESSIONS, PREDICTORS, TiffTileCodec

__all__ = ["MAX_TILE", "MIN_TILE", "TiffLayout", "read_layout"]

# Tiles outside this range make poor training chunks (too many requests, or too much decoded
# per sample); such files are cogified to the chunk size instead of referenced.
MIN_TILE = 64
MAX_TILE = 4096
_SAMPLE_FORMATS = {1: "u", 2: "i", 3: "f"}


@dataclass(frozen=True, slots=True)
class TiffLayout:
    """The first (full-resolution) image of a TIFF, as a grid of stored tiles."""

    height: int
    width: int
    samples: int
    planar: bool  # PlanarConfiguration 2: one tile set per band
    tiled: bool
    tile: tuple[int, int]  # (rows, cols); for strips (rows_per_strip, width)
    dtype: str  # numpy type with the file's byte order, e.g. ">i2"; "" if not a plain type
    compression: int
    predictor: int
    photometric: int
    bigtiff: bool
    offsets: np.ndarray = field(repr=False)
    bytecounts: np.ndarray = field(repr=False)
    jpegtables: bytes | None = field(default=None, repr=False)
    bits_per_sample: int = 0
    fill_order: int = 1
    extrasamples: tuple[int, ...] = ()
    is_jfif: bool = False

    @property
    def tiles_down(self) -> int:
        return -(-self.height // self.tile[0])

    @property
    def tiles_across(self) -> int:
        return -(-self.width // self.tile[1])

    @property
    def chunk_samples(self) -> int:
        return 1 if self.planar else self.samples

    @property
    def n_tiles(self) -> int:
        return int(self.offsets.size)

    def problems(self, chunk: int | None = None, *, tile_size_rule: bool = True) -> list[str]:
        """Why these tiles cannot be referenced as chunks as they are (empty if they can).

        ``tile_size_rule=False`` skips the training-chunk size range, for COGs cubelake wrote
        itself (a small scene gets tiles the size of the scene).
        """
        out: list[str] = []
        if not self.tiled:
            out.append(f"it is striped ({self.tile[0]} rows per strip), not tiled")
        if self.compression not in COMPRESSIONS:
            out.append(f"its compression ({_compression_name(self.compression)}) has no reference codec; "
                       f"referenceable: {sorted(set(COMPRESSIONS.values()))}")
        if self.predictor not in PREDICTORS:
            out.append(f"its predictor ({self.predictor}) is not 1, 2 or 3")
        if not self.dtype:
            jpeg = " JPEG" if self.compression == 7 else ""
            out.append(f"its{jpeg} samples ({self.bits_per_sample}-bit) are not a whole-byte integer or float type")
        if self.fill_order != 1:
            out.append("its bits are stored in reversed order (FillOrder 2)")
        if self.compression == 7 and self.photometric not in (0, 1, 2, 6):
            out.append(f"JPEG tiles with photometric interpretation {self.photometric} are not supported")
        if self.tiled:
            th, tw = self.tile
            if th != tw:
                out.append(f"its tiles are not square ({th}x{tw})")
            elif tile_size_rule and not MIN_TILE <= th <= MAX_TILE:
                out.append(f"its {th}x{tw} tiles are outside the {MIN_TILE}..{MAX_TILE} pixels that make training chunks")
            elif chunk is not None and th != chunk:
                out.append(f"its {th}x{tw} tiles differ from the requested {chunk}x{chunk} chunks")
        expected = self.tiles_down * self.tiles_across * (self.samples if self.planar else 1)
        if self.offsets.size != expected or self.bytecounts.size != expected:
            out.append(f"it lists {self.offsets.size} tiles where its size needs {expected}")
        return out

    def codec(self) -> TiffTileCodec:
        th, tw = self.tile
        name = COMPRESSIONS[self.compression]
        if name != "jpeg":
            return TiffTileCodec(name, self.predictor, self.dtype, (th, tw, self.chunk_samples))
        colorspace: int | str | None = None
        outcolorspace: int | str | None = None
        if not self.extrasamples:
            if self.photometric == 6:  # YCbCr decoded to RGB, as GDAL does
                outcolorspace = 2
            elif self.photometric == 2:
                if not self.is_jfif:
                    colorspace = 2
                outcolorspace = 2
        if self.planar:  # one single-component (grayscale) JPEG per band, whatever the photometric
            colorspace = None
            outcolorspace = 1
        tables = base64.b64encode(self.jpegtables).decode() if self.jpegtables else None
        return TiffTileCodec(name, 1, self.dtype, (th, tw, self.chunk_samples), jpegtables=tables,
                             colorspace=colorspace, outcolorspace=outcolorspace)

    def tile_index(self, plane: int, row: int, col: int) -> int:
        per_plane = self.tiles_down * self.tiles_across
        return plane * per_plane + row * self.tiles_across + col


def _compression_name(code: int) -> str:
    import tifffile

    try:
        return f"{tifffile.COMPRESSION(code).name} = {code}"
    except ValueError:
        return str(code)


def _dtype(page: Any, byteorder: str) -> str:
    fmt = _SAMPLE_FORMATS.get(int(page.sampleformat))
    bps = page.bitspersample
    if fmt is None or not isinstance(bps, int) or bps not in (8, 16, 32, 64) or (fmt == "f" and bps == 8):
        return ""
    return np.dtype(f"{byteorder}{fmt}{bps // 8}").str


def read_layout(fh: str | BinaryIO) -> TiffLayout:
    """Parse the first image of a TIFF (a path or an open binary file); reads the header only."""
    import tifffile

    with tifffile.TiffFile(fh) as tif:
        page = tif.pages.first
        tiled = bool(page.is_tiled)
        tile = (int(page.tilelength), int(page.tilewidth)) if tiled else (int(page.rowsperstrip or page.imagelength), int(page.imagewidth))
        bps = page.bitspersample if isinstance(page.bitspersample, int) else 0
        return TiffLayout(
            height=int(page.imagelength),
            width=int(page.imagewidth),
            samples=int(page.samplesperpixel),
            planar=int(page.planarconfig) == 2 and int(page.samplesperpixel) > 1,
            tiled=tiled,
            tile=tile,
            dtype=_dtype(page, tif.byteorder),
            compression=int(page.compression),
            predictor=int(page.predictor),
            photometric=int(page.photometric),
            bigtiff=bool(tif.is_bigtiff),
            offsets=np.asarray(page.dataoffsets, dtype=np.uint64),
            bytecounts=np.asarray(page.databytecounts, dtype=np.uint64),
            jpegtables=page.jpegtables,
            bits_per_sample=bps,
            fill_order=int(page.fillorder),
            extrasamples=tuple(int(v) for v in (page.extrasamples or ())),
            is_jfif=bool(getattr(page, "is_jfif", False)),
        )
