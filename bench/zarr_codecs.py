"""Blosc codec choices for the Zarr ``data`` array, measured on real hyperspectral cubes.

Each cube is cut into chunks shaped as the product stores them, ``(bands, y, x)`` C-ordered,
at most 256x256 pixels (the real scenes here are smaller than one chunk, so each is one chunk),
in the dtype the product would store: float32 with NaN where the source has nodata (float
sources, float64 included), the source integer type for integer sources, and the EnMAP tiles
also cast to int16 (they are reflectance x 1e4). For every codec: compression ratio
(uncompressed / compressed bytes), and single-thread encode and decode speed (MB/s of
uncompressed bytes, MB = 10^6 bytes; blosc with one thread, decode into a preallocated buffer;
best of ``--repeats`` timed batches of at least ``--min-time`` seconds each). Every round trip
is checked to be lossless.

    python bench/zarr_codecs.py --json /tmp/bench/zarr_codecs.json
"""

from __future__ import annotations

import argparse
import glob
import json
import platform
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
from numcodecs import Blosc

REAL = Path("/work/shared/data/real")
SYNTH = Path("/tmp/bench/synth_2048x4096x128.tif")
CHUNK = 256

#: name -> (blosc codec, clevel, shuffle, blocksize in bytes; 0 = blosc's automatic choice)
CODECS: dict[str, tuple[str, int, int, int]] = {
    "zstd-1 shuffle": ("zstd", 1, Blosc.SHUFFLE, 0),
    "zstd-1 bitshuffle": ("zstd", 1, Blosc.BITSHUFFLE, 0),
    "zstd-3 shuffle": ("zstd", 3, Blosc.SHUFFLE, 0),
    "zstd-3 shuffle 256K": ("zstd", 3, Blosc.SHUFFLE, 256 * 1024),
    "zstd-3 shuffle 1M": ("zstd", 3, Blosc.SHUFFLE, 1024 * 1024),
    "zstd-3 bitshuffle": ("zstd", 3, Blosc.BITSHUFFLE, 0),
    "zstd-5 shuffle": ("zstd", 5, Blosc.SHUFFLE, 0),
    "zstd-5 shuffle 1M": ("zstd", 5, Blosc.SHUFFLE, 1024 * 1024),
    "zstd-5 bitshuffle": ("zstd", 5, Blosc.BITSHUFFLE, 0),
    "lz4-5 shuffle": ("lz4", 5, Blosc.SHUFFLE, 0),
}
CURRENT = "zstd-3 shuffle 1M"  # cubelake's ZarrCodecSpec default
#: The product's codec family is blosc/zstd with shuffle (the ingest spec); within it, a pick must
#: still encode fast enough not to dominate ingest (>= this many MB/s single-thread on the real cubes).
MIN_ENCODE_MBPS = 150.0


def as_stored(cube: np.ndarray, nodata: float | None) -> np.ndarray:
    """``(band, y, x)`` in the dtype cubelake stores: float32 (nodata -> NaN) or the integer type."""
    if cube.dtype.kind == "f":
        out = cube.astype(np.float32)
        if nodata is not None and not np.isnan(nodata):
            out[cube == nodata] = np.nan
        return out
    return cube


def chunks_of(cube: np.ndarray) -> list[np.ndarray]:
    """Product-shaped chunks ``(bands, <=256, <=256)``, each C-contiguous."""
    _, ny, nx = cube.shape
    return [np.ascontiguousarray(cube[:, y : y + CHUNK, x : x + CHUNK])
            for y in range(0, ny, CHUNK) for x in range(0, nx, CHUNK)]


def load_datasets(synth: Path) -> dict[str, dict[str, Any]]:
    """name -> {'chunks': [...], 'source': str, 'note': str}."""
    import rasterio
    import scipy.io

    sets: dict[str, dict[str, Any]] = {}
    enmap_f, enmap_i = [], []
    paths = sorted(glob.glob(str(REAL / "hsi_enmap_potsdam" / "enmap_potsdam_tile_*.tif")))
    for p in paths:
        with rasterio.open(p) as ds:
            raw = ds.read()
            nodata = ds.nodata
        enmap_f += chunks_of(as_stored(raw, nodata))
        enmap_i += chunks_of(raw.astype(np.int16))  # integers x 1e4 already; nodata -32768 stays
    sets["EnMAP f32"] = {"chunks": enmap_f, "source": f"{len(paths)} EnMAP L2A tiles (224x32x32)"}
    sets["EnMAP i16"] = {"chunks": enmap_i, "source": "the same tiles cast to int16"}
    p = REAL / "hsi_aviris_ng_isofit" / "topoflux" / "ang20160910t185702_2rdn_img"
    with rasterio.open(p) as ds:
        sets["AVIRIS-NG f32"] = {"chunks": chunks_of(as_stored(ds.read(), ds.nodata)),
                                 "source": f"AVIRIS-NG radiance {ds.count}x{ds.height}x{ds.width}"}
    for p in sorted(glob.glob(str(REAL / "hsi_abu_anomaly" / "*.mat"))):
        data = scipy.io.loadmat(p)["data"]  # (y, x, band)
        cube = as_stored(np.ascontiguousarray(data.transpose(2, 0, 1)), None)
        name = Path(p).stem
        sets[f"{name} {'f32' if cube.dtype.kind == 'f' else cube.dtype.name.replace('uint', 'u').replace('int', 'i')}"] = {
            "chunks": chunks_of(cube),
            "source": f"ABU {name} {cube.shape[0]}x{cube.shape[1]}x{cube.shape[2]} (from {data.dtype})"}
    with rasterio.open(synth) as ds:
        win = rasterio.windows.Window(ds.width // 2, ds.height // 2, CHUNK, CHUNK)
        sets["synthetic i16"] = {"chunks": [ds.read(window=win)],
                                 "source": f"{synth.name} window {ds.count}x{CHUNK}x{CHUNK} at row {ds.height // 2}, col {ds.width // 2}"}
    return sets


def best_time(fn: Any, min_time: float, repeats: int) -> float:
    """Seconds per call: best over ``repeats`` batches that each run at least ``min_time``."""
    n = 1
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    n = max(1, int(min_time / max(one, 1e-6)))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def measure(chunks: list[np.ndarray], codec: Blosc, min_time: float, repeats: int) -> dict[str, float]:
    raw = sum(c.nbytes for c in chunks)
    encoded = [codec.encode(c) for c in chunks]
    for c, e in zip(chunks, encoded, strict=True):
        back = np.frombuffer(codec.decode(e), dtype=c.dtype).reshape(c.shape)
        if not np.array_equal(back, c, equal_nan=c.dtype.kind == "f"):
            raise AssertionError(f"{codec}: round trip is not lossless")
    outs = [np.empty_like(c) for c in chunks]

    def enc() -> None:
        for c in chunks:
            codec.encode(c)

    def dec() -> None:
        for e, o in zip(encoded, outs, strict=True):
            codec.decode(e, out=o)

    comp = sum(len(e) for e in encoded)
    return {"raw_bytes": raw, "compressed_bytes": comp, "ratio": raw / comp,
            "encode_mbps": raw / 1e6 / best_time(enc, min_time, repeats),
            "decode_mbps": raw / 1e6 / best_time(dec, min_time, repeats)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--synth", type=Path, default=SYNTH, help="synthetic scene (bench/synth.py) to take a window from")
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds per timed batch")
    ap.add_argument("--repeats", type=int, default=5, help="timed batches; the best counts")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    numcodecs.blosc.set_nthreads(1)
    numcodecs.blosc.use_threads = False
    sets = load_datasets(a.synth)
    for name, s in sets.items():
        c = s["chunks"][0]
        print(f"{name:<18} {len(s['chunks'])} chunk(s) {c.shape} {c.dtype}  {s['source']}")
    results: dict[str, dict[str, dict[str, float]]] = {}
    for cname, (algo, level, shuffle, blocksize) in CODECS.items():
        codec = Blosc(cname=algo, clevel=level, shuffle=shuffle, blocksize=blocksize)
        results[cname] = {name: measure(s["chunks"], codec, a.min_time, a.repeats) for name, s in sets.items()}
        print(f"measured {cname}", flush=True)

    names = list(sets)
    real = [n for n in names if not n.startswith("synthetic")]

    def pooled(cname: str, keys: list[str]) -> dict[str, float]:
        """All of ``keys`` together: bytes / total seconds, so big cubes weigh by size."""
        r = [results[cname][k] for k in keys]
        raw = sum(x["raw_bytes"] for x in r)
        return {"ratio": raw / sum(x["compressed_bytes"] for x in r),
                "encode_mbps": raw / sum(x["raw_bytes"] / x["encode_mbps"] for x in r),
                "decode_mbps": raw / sum(x["raw_bytes"] / x["decode_mbps"] for x in r),
                "ratio_geomean": float(np.exp(np.mean([np.log(x["ratio"]) for x in r])))}

    summary = {c: {"real": pooled(c, real), "synthetic": pooled(c, [n for n in names if n.startswith("synthetic")])}
               for c in CODECS}
    for metric, fmt in (("ratio", "{:>6.2f}"), ("decode_mbps", "{:>6.0f}"), ("encode_mbps", "{:>6.0f}")):
        print(f"\n{metric} (per data set; 'real' = all real cubes pooled)")
        head = "".join(f"{n[:14]:>15}" for n in names)
        print(f"{'codec':<18}{head}{'real':>10}")
        for c in CODECS:
            cells = "".join(f"{fmt.format(results[c][n][metric]):>15}" for n in names)
            print(f"{c:<18}{cells}{fmt.format(summary[c]['real'][metric]):>10}")

    # recommendation among blosc/zstd + shuffle codecs that encode fast enough: decode speed first,
    # then ratio, then encode speed. Codecs whose pooled decode speed on the real cubes is within 10%
    # of the fastest count as equally fast on decode. (lz4 is reported for comparison.)
    family = [c for c in CODECS if CODECS[c][0] == "zstd" and CODECS[c][2] == Blosc.SHUFFLE
              and summary[c]["real"]["encode_mbps"] >= MIN_ENCODE_MBPS]
    fastest = max(summary[c]["real"]["decode_mbps"] for c in family)
    near = [c for c in family if summary[c]["real"]["decode_mbps"] >= 0.9 * fastest]
    pick = max(near, key=lambda c: (round(summary[c]["real"]["ratio_geomean"], 2), summary[c]["real"]["encode_mbps"]))
    s = summary[pick]["real"]
    reason = (f"decodes at {s['decode_mbps']:.0f} MB/s on the real cubes (within 10% of the fastest, "
              f"{fastest:.0f} MB/s) with the best ratio among those (geomean {s['ratio_geomean']:.2f}), "
              f"encoding at {s['encode_mbps']:.0f} MB/s")
    print(f"\nrecommended: {pick}: {reason}")
    if pick != CURRENT:
        cur = summary[CURRENT]["real"]
        print(f"current default {CURRENT}: decode {cur['decode_mbps']:.0f} MB/s, ratio geomean {cur['ratio_geomean']:.2f}, "
              f"encode {cur['encode_mbps']:.0f} MB/s")
    if a.json:
        doc = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
               "machine": {"platform": platform.platform(), "python": platform.python_version(),
                           "numcodecs": numcodecs.__version__, "blosc_threads": 1},
               "datasets": {n: {"source": s["source"], "chunks": len(s["chunks"]),
                                "chunk_shape": list(s["chunks"][0].shape), "dtype": str(s["chunks"][0].dtype)}
                            for n, s in sets.items()},
               "results": results, "summary": summary, "recommended": pick, "reason": reason}
        a.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
