"""Byte-level ways to damage a real file: copy, truncate, flip, rewrite TIFF tags, special files.

Each function writes one new file (parents created) and never touches the source. Randomness
comes from seeded generators only, so the corpus is the same on every run.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import stat
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import tifffile
from rasterio.errors import NotGeoreferencedWarning

__all__ = [
    "copy",
    "detectable_flip",
    "flip",
    "header_flips",
    "make_fifo",
    "make_socket",
    "remove_special_files",
    "symlink",
    "tiff_ifd_span",
    "tiff_set",
    "tiff_xml",
    "truncate",
    "write_bytes",
    "write_text",
]


def _out(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def copy(src: Path, dst: Path) -> Path:
    """A writable byte copy (the real files are read-only)."""
    shutil.copyfile(src, _out(dst))
    os.chmod(dst, 0o644)
    return dst


def write_bytes(dst: Path, data: bytes) -> Path:
    _out(dst).write_bytes(data)
    return dst


def write_text(dst: Path, text: str) -> Path:
    _out(dst).write_text(text, encoding="utf-8")
    return dst


def truncate(src: Path, dst: Path, keep: float | int) -> Path:
    """The first ``keep`` bytes (an int) or that fraction of the file (a float < 1)."""
    data = src.read_bytes()
    n = keep if isinstance(keep, int) else int(len(data) * keep)
    return write_bytes(dst, data[:n])


def flip(src: Path, dst: Path, offsets: Iterable[int], xor: int = 0xFF) -> Path:
    """Copy with the bytes at ``offsets`` XOR-ed with ``xor``."""
    data = bytearray(src.read_bytes())
    for off in offsets:
        data[off] ^= xor
    return write_bytes(dst, bytes(data))


def tiff_ifd_span(path: Path) -> tuple[int, int]:
    """``(start, end)`` of the first IFD's entries (the header fields a flip should hit)."""
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        entry = 20 if tif.is_bigtiff else 12
        start = page.offset
        return start, start + 8 + entry * len(page.tags)


def header_flips(src: Path, dst: Path, seed: int, count: int = 3) -> Path:
    """``count`` seeded random byte flips inside the first IFD."""
    lo, hi = tiff_ifd_span(src)
    rng = random.Random(seed)
    return flip(src, dst, rng.sample(range(lo + 2, hi), count), xor=rng.randrange(1, 256))


def tiff_set(src: Path, dst: Path, changes: Sequence[tuple[int, Any, int | None]]) -> Path:
    """Copy, then overwrite first-IFD tags in place: ``(tag code, value, new TIFF dtype or None)``."""
    copy(src, dst)
    with tifffile.TiffFile(dst, mode="r+b") as tif:
        tags = tif.pages[0].tags
        for code, value, dtype in changes:
            tag = tags[code]
            count = tag.count
            if isinstance(value, int) and count > 1:
                value = (value,) * count
            tag.overwrite(value, dtype=dtype)
    return dst


def tiff_xml(src: Path, dst: Path, edit: Callable[[str], str]) -> Path:
    """Copy, then rewrite the GDAL_METADATA XML (band tags such as ``wavelength``)."""
    copy(src, dst)
    with tifffile.TiffFile(dst, mode="r+b") as tif:
        tag = tif.pages[0].tags[42112]
        tag.overwrite(edit(tag.value).encode("ascii"))
    return dst


def _gdal_detects(path: Path) -> bool:
    """Whether reading every pixel through GDAL fails (the damage is detectable at all)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotGeoreferencedWarning)
            with rasterio.Env(GDAL_ERROR_ON_LIBJPEG_WARNING="TRUE"), rasterio.open(path) as ds:
                for _, window in ds.block_windows(1):
                    ds.read(window=window)
    except Exception:  # any GDAL failure means detectable
        return True
    return False


def _data_ranges(path: Path) -> list[tuple[int, int]]:
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        return [(o, o + n) for o, n in zip(page.dataoffsets, page.databytecounts, strict=True) if n > 8]


def detectable_flip(src: Path, dst: Path, seed: int, tries: int = 64) -> Path:
    """Flip 4 bytes near the start of one compressed block (the codec's own header and first codes;
    flips deep in JPEG entropy data decode to plausible garbage), choosing (seeded) until GDAL
    cannot decode the block."""
    ranges = _data_ranges(src)
    rng = np.random.default_rng(seed)
    for _ in range(tries):
        lo, hi = ranges[int(rng.integers(len(ranges)))]
        start = int(rng.integers(lo, max(lo + 1, min(hi, lo + 64) - 4)))
        flip(src, dst, range(start, min(start + 4, hi)), xor=int(rng.integers(1, 256)))
        if _gdal_detects(dst):
            return dst
    raise AssertionError(f"no detectable flip of {src} in {tries} tries (seed {seed})")


def make_fifo(path: Path) -> Path:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    os.mkfifo(_out(path))
    return path


def make_socket(path: Path) -> Path:
    """A Unix socket file (bound from its folder: socket paths are limited to ~108 bytes)."""
    _out(path)
    here = os.getcwd()
    os.chdir(path.parent)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(path.name)
    finally:
        os.chdir(here)
    return path


def symlink(path: Path, target: str | Path) -> Path:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    os.symlink(target, _out(path))
    return path


def remove_special_files(root: Path) -> None:
    """Remove the FIFOs and sockets under ``root`` (nothing should trip over them later)."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            with contextlib.suppress(OSError):
                mode = p.lstat().st_mode
                if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
                    p.unlink()
