"""Synthetic hyperspectral scenes for benchmarks: HSI-like int16 cubes written block by block.

Spectra are mixtures of a few smooth endmembers (as real reflectance is), with spatially
smooth abundances and sensor noise, so codecs see realistic redundancy (blosc-zstd ratio
~1.8-2.5 on int16, like real HSI) rather than pure noise or constant blocks.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import rasterio
from rasterio.transform import from_origin


def endmembers(bands: int, k: int, rng: np.random.Generator) -> np.ndarray:
    wl = np.linspace(400, 2500, bands)
    out = []
    for _ in range(k):
        centers = rng.uniform(400, 2500, 4)
        widths = rng.uniform(80, 500, 4)
        amps = rng.uniform(0.1, 0.5, 4)
        spec = 0.05 + sum(a * np.exp(-0.5 * ((wl - c) / w) ** 2) for a, c, w in zip(amps, centers, widths, strict=True))
        out.append(spec)
    return np.asarray(out)  # (k, bands)


def write_scene(path: Path, *, height: int, width: int, bands: int, block: int = 256, seed: int = 0,
                compress: str | None = None, interleave: str = "pixel") -> Path:
    """Write a tiled GeoTIFF (int16, reflectance x 1e4, nodata -32768) row of blocks by row."""
    rng = np.random.default_rng(seed)
    em = endmembers(bands, 5, rng).astype(np.float32)
    wl = np.linspace(400, 2500, bands)
    profile = {
        "driver": "GTiff", "width": width, "height": height, "count": bands, "dtype": "int16",
        "crs": "EPSG:32633", "transform": from_origin(500000, 5800000, 30, 30), "nodata": -32768,
        "tiled": True, "blockxsize": block, "blockysize": block, "interleave": interleave,
        "BIGTIFF": "YES",
    }
    if compress:
        profile["compress"] = compress
    yy, xx = np.mgrid[0:block, 0:block].astype(np.float32)
    with rasterio.open(path, "w", **profile) as dst:
        for b in range(bands):
            dst.update_tags(b + 1, wavelength=f"{wl[b]:.2f}", fwhm="10", wavelength_units="Nanometers")
        for r0 in range(0, height, block):
            for c0 in range(0, width, block):
                h, w = min(block, height - r0), min(block, width - c0)
                phase = rng.uniform(0, 2 * np.pi, (5, 2))
                ab = np.stack([1 + np.sin((yy + r0) / (30 + 7 * i) + phase[i, 0]) * np.cos((xx + c0) / (40 + 5 * i) + phase[i, 1])
                               for i in range(5)])[:, :h, :w]
                ab /= ab.sum(axis=0, keepdims=True)
                cube = np.tensordot(em.T, ab, axes=1)  # (bands, h, w)
                cube += rng.normal(0, 0.002, cube.shape).astype(np.float32)
                dst.write(np.clip(cube * 10000, -32767, 32767).astype(np.int16), window=rasterio.windows.Window(c0, r0, w, h))
    return path



def ensure_scene(out: Path, height: int, width: int, bands: int, block: int = 256) -> Path:
    """Reuse ``out/synth_HxWxB.tif`` when it has the expected layout, else write it (atomically)."""
    path = out / f"synth_{height}x{width}x{bands}.tif"
    if path.exists():
        with rasterio.open(path) as ds:
            ok = (ds.shape == (height, width) and ds.count == bands and ds.dtypes[0] == "int16"
                  and ds.block_shapes[0] == (block, block) and ds.compression is None
                  and ds.interleaving is not None and ds.interleaving.value == "PIXEL")
        if ok:
            return path
        path.unlink()
    print(f"writing {path} ({height}x{width}x{bands} int16) with bench/synth.py ...", flush=True)
    tmp = path.with_suffix(".partial.tif")
    write_scene(tmp, height=height, width=width, bands=bands, block=block)
    tmp.rename(path)
    return path

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--height", type=int, default=2048)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--bands", type=int, default=128)
    ap.add_argument("--compress", default=None)
    ap.add_argument("--interleave", default="pixel")
    a = ap.parse_args()
    write_scene(a.out, height=a.height, width=a.width, bands=a.bands, compress=a.compress, interleave=a.interleave)


if __name__ == "__main__":
    main()


def cached_scenes(folder: Path, prefix: str, count: int, *, height: int, width: int, bands: int, block: int,
                  seed: int) -> list[Path]:
    """``count`` scenes ``<prefix>NNN.tif`` in ``folder`` (seeds ``seed + i``), reusing those already written
    with this shape; each written beside its name and renamed, so a killed run leaves no half scene."""
    import rasterio

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(count):
        p = folder / f"{prefix}{i:03d}.tif"
        if p.exists():
            with rasterio.open(p) as ds:
                if ds.shape == (height, width) and ds.count == bands:
                    out.append(p)
                    continue
        tmp = p.with_suffix(".partial.tif")
        write_scene(tmp, height=height, width=width, bands=bands, block=block, seed=seed + i)
        tmp.rename(p)
        out.append(p)
    return out
