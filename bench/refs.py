"""Reference sets (virtual Zarr over COG tiles): cubelake against kerchunk, native Zarr and rasterio.

Three measurements, all in one run, so their ratios compare like with like:

1. **Reference generation** (header only) for one COG of ~10,000 tiles: a 25600x25600 int16
   single-band COG (256 tiles, ZSTD level 3, predictor 2, no overviews) written by GDAL's COG
   driver from an empty VRT, so every tile is stored but tiny (the header and tile tables are what
   is read; tile contents do not matter). Timed: ``tiff_layout`` (the header parse alone),
   ``build_refs`` (layout + GDAL metadata + Zarr metadata template), ``write_refs`` to JSON, and
   the peer ``kerchunk.tiff.tiff_to_zarr`` (tifffile's ``write_fsspec``) without and with a JSON
   ``target``. Medians of ``--repeats`` (after one untimed warm-up call each, page cache warm).
   Both reference sets are checked to point at the same byte ranges.

2. **Full-scene read throughput**: a synthetic HSI scene (``bench/synth.py``; 128 bands int16,
   ``--size-gib`` 1 by default, 1/16 of that with ``--quick``) is ingested with cubelake
   (products cog and zarr, chunk 256, ZSTD/blosc-zstd level 3), and the whole ``data`` array is
   read chunk by chunk through
     refs        cubelake refs of the lake's COG (``build_refs`` + ``write_refs`` JSON, ``open_array``)
     native      the native Zarr v3 product (``zarr.open_group(...)["data"]``, blosc zstd-3 shuffle, 1 MiB blocks)
     kerchunk    kerchunk's refs of the same COG (``tiff_to_zarr``) through fsspec's ReferenceFileSystem
                 (``kerchunk.utils.refs_as_store``: a ``zarr.storage.FsspecStore``), Zarr v2, with
                 imagecodecs' numcodecs codecs; its chunks come out (y, x, band)
     kerchunk_T  the same, each chunk then copied to (band, y, x) as the others return it
     rasterio    rasterio (GDAL 3.10) reading the COG block by block, one dataset per thread
   Access pattern, the same for all: the 256x256 chunk-aligned windows (all bands) in row-major
   order, read by ``--workers`` threads (default 2, the cores here), each reading one window at a
   time and dropping the result; zarr's own codec thread pool is limited to the same number
   (``threading.max_workers``) and blosc's internal threads are off, so at most ``--workers``
   chunks decode at once in every method. Opening the array/dataset is inside the timed part
   (it is small). GDAL_CACHEMAX is 256 MB, and every run opens its datasets afresh, so no run
   reads another's cached blocks. MB/s = uncompressed bytes / s (MB = 10^6 bytes), median of
   ``--repeats``; methods run round-robin. Warm runs follow one untimed read of each method; as
   root, cold runs drop the page cache (``sync; echo 3 > /proc/sys/vm/drop_caches``) before each.
   Once, every method's result is compared window by window with the refs result (kerchunk's
   after the transpose), so no method can be fast by being wrong.

3. **Decode of one tile**, single thread: the COG's stored tile of 256x256x128 int16 (ZSTD +
   predictor 2, pixel-interleaved) and the native Zarr's chunk file of the same pixels (blosc
   zstd-3 shuffle, 1 MiB blocks). Steps: ``imagecodecs.zstd_decode`` without and with ``out=``,
   ``delta_decode`` (the predictor), the (y, x, band) -> (band, y, x) transpose (cubelake's blocked
   copy and plain numpy), the whole ``cubelake_tiff`` codec, kerchunk's codec chain
   (imagecodecs_zstd + imagecodecs_delta), and blosc decoding into a preallocated buffer.

    python bench/refs.py --json /tmp/bench/refs.json
    python bench/refs.py --quick          # small smoke run (< 2 minutes)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
CHUNK = 256
BANDS = 128
BIG_SIDE = 25600  # 100 x 100 tiles of 256
GDAL_CACHEMAX_MB = 256
MB = 1e6


# -- helpers ------------------------------------------------------------------------------------
def can_drop_caches() -> bool:
    return os.geteuid() == 0 and os.access("/proc/sys/vm/drop_caches", os.W_OK)


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# -- 1. reference generation --------------------------------------------------------------------
def ensure_big_cog(work: Path, side: int) -> Path:
    """A ``side`` x ``side`` int16 COG, 256 tiles, ZSTD-3 + predictor 2, every tile stored (tiny)."""
    from cubelake.refs import tiff_layout

    path = work / f"tiles_{side}x{side}_zstd.tif"
    want = (side // CHUNK) ** 2
    if path.exists():
        lay = tiff_layout(str(path))
        if lay.n_tiles == want and lay.compression == 50000 and lay.predictor == 2 and int((lay.bytecounts == 0).sum()) == 0:
            return path
        path.unlink()
    import rasterio.shutil

    vrt = work / f"empty_{side}.vrt"
    vrt.write_text(
        f'<VRTDataset rasterXSize="{side}" rasterYSize="{side}"><SRS>EPSG:32633</SRS>'
        "<GeoTransform>500000, 10, 0, 5800000, 0, -10</GeoTransform>"
        '<VRTRasterBand dataType="Int16" band="1"><NoDataValue>-32768</NoDataValue>'
        '<Metadata><MDI key="wavelength">550</MDI><MDI key="fwhm">10</MDI></Metadata></VRTRasterBand></VRTDataset>\n')
    print(f"writing {path} ({side}x{side} int16, {want} tiles) with GDAL's COG driver ...", flush=True)
    tmp = path.with_suffix(".partial.tif")
    rasterio.shutil.copy(str(vrt), str(tmp), driver="COG", BLOCKSIZE=CHUNK, COMPRESS="ZSTD", LEVEL=3, PREDICTOR="YES",
                         NUM_THREADS=2, OVERVIEWS="NONE", BIGTIFF="IF_SAFER")
    tmp.rename(path)
    lay = tiff_layout(str(path))
    if lay.n_tiles != want or int((lay.bytecounts == 0).sum()):
        raise RuntimeError(f"{path}: {lay.n_tiles} tiles, {int((lay.bytecounts == 0).sum())} empty; expected {want} stored")
    return path


def bench_refgen(cog: Path, work: Path, repeats: int) -> dict[str, Any]:
    import kerchunk.tiff

    from cubelake.refs import build_refs, tiff_layout, write_refs

    url = str(cog.resolve())
    cl_json, kc_json = work / "big.refs.json", work / "big.kerchunk.json"
    steps: dict[str, Callable[[], Any]] = {
        "cl_layout": lambda: tiff_layout(url),
        "cl_build": lambda: build_refs(url),
        "kc_build": lambda: kerchunk.tiff.tiff_to_zarr(url),
        "kc_build_write": lambda: kerchunk.tiff.tiff_to_zarr(url, target=str(kc_json), target_options={"mode": "w"}),
    }
    for fn in steps.values():  # warm-up: imports, GDAL driver registration, page cache
        fn()
    times: dict[str, list[float]] = {k: [] for k in (*steps, "cl_write", "cl_build_write")}
    refs = kc = None
    for _ in range(repeats):
        for key, fn in steps.items():
            t, out = timed(fn)
            times[key].append(t)
            if key == "cl_build":
                refs = out
                tw, _ = timed(lambda r=out: write_refs(r, cl_json, fmt="json"))
                times["cl_write"].append(tw)
                times["cl_build_write"].append(t + tw)
            elif key == "kc_build":
                kc = out
    assert refs is not None
    assert kc is not None
    # both sets must point at the same tiles
    ours = sorted((off, n) for _t, off, n in refs.chunks.values())
    theirs = sorted((v[1], v[2]) for k, v in kc.items() if not k.rsplit("/", 1)[-1].startswith(".") and isinstance(v, list))
    same = ours == theirs
    lay = tiff_layout(url)
    return {"cog": url, "cog_bytes": cog.stat().st_size, "tiles": lay.n_tiles, "refs_chunks": refs.n_chunks,
            "kerchunk_chunks": len(theirs), "same_byte_ranges": same,
            "json_bytes": {"cubelake": cl_json.stat().st_size, "kerchunk": kc_json.stat().st_size},
            "times_s": times, "median_s": {k: med(v) for k, v in times.items()}}


# -- 2. full-scene reads ------------------------------------------------------------------------
def scene_side(size_gib: float, bands: int) -> int:
    px = size_gib * 1024**3 / (bands * 2)
    return max(CHUNK, round(math.sqrt(px) / CHUNK) * CHUNK)


def ensure_scene(work: Path, side: int, bands: int) -> Path:
    import rasterio

    path = work / f"synth_{side}x{side}x{bands}.tif"
    if path.exists():
        with rasterio.open(path) as ds:
            ok = ds.shape == (side, side) and ds.count == bands and ds.dtypes[0] == "int16" \
                and ds.block_shapes[0] == (CHUNK, CHUNK)
        if ok:
            return path
        path.unlink()
    print(f"writing {path} ({bands}x{side}x{side} int16) with bench/synth.py ...", flush=True)
    sys.path.insert(0, str(HERE))
    from synth import write_scene

    tmp = path.with_suffix(".partial.tif")
    write_scene(tmp, height=side, width=side, bands=bands)
    tmp.rename(path)
    return path


def lake_products(lake: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for p in sorted((lake / "scenes").glob("*/*")):
        if p.suffix == ".tif":
            found["cog"] = p
        elif p.suffix == ".zarr":
            found["zarr"] = p
    return found


def ensure_products(src: Path, work: Path, workers: int) -> dict[str, Path]:
    """The COG and Zarr v3 products of ``src`` in ``work/lake_<name>`` (ingested once, then reused)."""
    lake = work / f"lake_{src.stem}"
    found = lake_products(lake)
    if {"cog", "zarr"} <= found.keys():
        return found
    from cubelake.ingest import IngestOptions, ingest
    from cubelake.ingest.profile import SensorProfile

    shutil.rmtree(lake, ignore_errors=True)
    profile = SensorProfile.model_validate({"name": "bench", "products": {"chunk": CHUNK, "level": 3},
                                            "bad_bands": {"wavelength_windows_nm": []}})
    print(f"ingesting {src.name} into {lake} (products cog, zarr) ...", flush=True)
    t, res = timed(lambda: ingest([src], lake, IngestOptions(products=("cog", "zarr"), profile=profile, workers=workers)))
    if len(res) != 1 or res[0].outcome not in ("ingested", "unchanged"):
        raise RuntimeError(f"ingest of {src} failed: {[(r.outcome, r.message) for r in res]}")
    print(f"  ingested in {t:.1f} s", flush=True)
    found = lake_products(lake)
    if not {"cog", "zarr"} <= found.keys():
        raise RuntimeError(f"{lake}: products missing, found {found}")
    return found


Reader = Callable[[tuple[int, int]], np.ndarray]


@contextmanager
def open_method(method: str, paths: dict[str, Any]) -> Iterator[Reader]:
    """A reader of one (row, col) chunk-aligned window, all bands, for ``method``."""
    import zarr

    if method == "refs":
        from cubelake.refs import open_array

        arr = open_array(paths["refs_json"], allowed_roots=[str(paths["lake"])])
        yield lambda rc: arr[:, rc[0] : rc[0] + CHUNK, rc[1] : rc[1] + CHUNK]
    elif method == "native":
        arr = zarr.open_group(str(paths["zarr"]), mode="r")["data"]
        yield lambda rc: arr[:, rc[0] : rc[0] + CHUNK, rc[1] : rc[1] + CHUNK]
    elif method in ("kerchunk", "kerchunk_T"):
        from kerchunk.utils import refs_as_store

        arr = zarr.open_array(refs_as_store(paths["kerchunk_refs"], read_only=True), mode="r", zarr_format=2)
        if method == "kerchunk":
            yield lambda rc: arr[rc[0] : rc[0] + CHUNK, rc[1] : rc[1] + CHUNK, :]
        else:
            yield lambda rc: np.ascontiguousarray(np.moveaxis(arr[rc[0] : rc[0] + CHUNK, rc[1] : rc[1] + CHUNK, :], -1, 0))
    elif method == "rasterio":
        import rasterio
        from rasterio.windows import Window

        local = threading.local()
        opened: list[Any] = []
        lock = threading.Lock()

        def read(rc: tuple[int, int]) -> np.ndarray:
            ds = getattr(local, "ds", None)
            if ds is None:
                ds = local.ds = rasterio.open(paths["cog"])
                with lock:
                    opened.append(ds)
            return ds.read(window=Window(rc[1], rc[0], CHUNK, CHUNK))

        try:
            yield read
        finally:
            for ds in opened:
                ds.close()
    else:
        raise ValueError(method)


METHODS = ("refs", "native", "kerchunk", "kerchunk_T", "rasterio")
LABELS = {
    "refs": "cubelake refs (open_array, cubelake_tiff)",
    "native": "native Zarr v3 (blosc zstd-3 shuffle)",
    "kerchunk": "kerchunk tiff_to_zarr + fsspec reference fs",
    "kerchunk_T": "  the same, chunks copied to (band, y, x)",
    "rasterio": "rasterio block reads of the COG",
}


def read_all(method: str, paths: dict[str, Any], windows: list[tuple[int, int]], workers: int) -> float:
    """Seconds to open and read every window with ``workers`` threads."""
    t0 = time.perf_counter()
    with open_method(method, paths) as read, ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(read, windows):
            pass
    return time.perf_counter() - t0


def verify_reads(paths: dict[str, Any], windows: list[tuple[int, int]]) -> dict[str, Any]:
    """Every method's pixels against the refs result, window by window; also CRCs of refs and native."""
    import zlib

    failures: list[str] = []
    crc = {"refs": 0, "native": 0}
    with contextlib_stack([open_method(m, paths) for m in METHODS]) as readers:
        rd = dict(zip(METHODS, readers, strict=True))
        for rc in windows:
            ref = rd["refs"](rc)
            crc["refs"] = zlib.crc32(np.ascontiguousarray(ref).data, crc["refs"])
            for m in METHODS[1:]:
                got = rd[m](rc)
                if m == "native":
                    crc["native"] = zlib.crc32(np.ascontiguousarray(got).data, crc["native"])
                if m == "kerchunk":
                    got = np.moveaxis(got, -1, 0)
                if got.shape != ref.shape or got.dtype != ref.dtype or not np.array_equal(got, ref):
                    failures.append(f"{m}: window {rc} differs from refs ({got.dtype}{got.shape} vs {ref.dtype}{ref.shape})")
    return {"windows": len(windows), "failures": failures, "crc32": crc, "crc_equal": crc["refs"] == crc["native"]}


@contextmanager
def contextlib_stack(cms: list[Any]) -> Iterator[list[Any]]:
    from contextlib import ExitStack

    with ExitStack() as stack:
        yield [stack.enter_context(cm) for cm in cms]


def bench_reads(products: dict[str, Path], work: Path, side: int, bands: int, repeats: int, workers: int,
                cold: bool) -> dict[str, Any]:
    import kerchunk.tiff

    from cubelake.refs import build_refs, write_refs

    cog = products["cog"].resolve()
    refs_json = work / f"{cog.parent.name}.refs.json"
    t_build, refs = timed(lambda: build_refs(str(cog)))
    write_refs(refs, refs_json, fmt="json")
    t_kc, kc_refs = timed(lambda: kerchunk.tiff.tiff_to_zarr(str(cog)))
    paths = {"refs_json": refs_json, "zarr": products["zarr"], "cog": str(cog), "kerchunk_refs": kc_refs,
             "lake": products["cog"].parents[2]}
    windows = [(r, c) for r in range(0, side, CHUNK) for c in range(0, side, CHUNK)]
    nbytes = side * side * bands * 2
    print(f"verifying every method against the refs result on {len(windows)} windows ...", flush=True)
    check = verify_reads(paths, windows)
    modes = ["warm", *(["cold"] if cold else [])]
    runs: dict[str, dict[str, list[float]]] = {mode: {m: [] for m in METHODS} for mode in modes}
    for mode in modes:
        if mode == "warm":
            for m in METHODS:  # untimed: page cache and imports
                read_all(m, paths, windows, workers)
        for rnd in range(repeats):
            for m in METHODS:
                if mode == "cold":
                    drop_caches()
                t = read_all(m, paths, windows, workers)
                runs[mode][m].append(t)
                print(f"  {mode} round {rnd} {m:<11} {t:7.3f} s  {nbytes / MB / t:7.0f} MB/s", flush=True)
    summary = {mode: {m: {"median_s": med(v), "best_s": min(v), "mbps_median": nbytes / MB / med(v),
                          "mbps_best": nbytes / MB / min(v)} for m, v in r.items()} for mode, r in runs.items()}
    return {"scene_shape": [bands, side, side], "bytes": nbytes, "chunks": len(windows),
            "cog": str(cog), "cog_bytes": cog.stat().st_size, "zarr": str(products["zarr"]),
            "zarr_bytes": tree_size(products["zarr"]), "refs_json": str(refs_json),
            "refs_build_s": t_build, "kerchunk_build_s": t_kc, "workers": workers,
            "verification": check, "runs_s": runs, "summary": summary}


# -- 3. one-tile decode -------------------------------------------------------------------------
def per_call(fn: Callable[[], Any], min_time: float, repeats: int) -> float:
    """Seconds per call: median over ``repeats`` batches of at least ``min_time`` seconds each."""
    one, _ = timed(fn)
    n = max(1, int(min_time / max(one, 1e-6)))
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n)
    return statistics.median(out)


def bench_decode(products: dict[str, Path], kc_refs: dict[str, Any] | None, repeats: int, min_time: float) -> dict[str, Any]:
    import imagecodecs
    import numcodecs
    from numcodecs import Blosc

    from cubelake.refs import tiff_layout
    from cubelake.refs.codec import _to_planar

    cog = products["cog"]
    lay = tiff_layout(str(cog))
    r, c = lay.tiles_down // 2, lay.tiles_across // 2
    i = r * lay.tiles_across + c
    with open(cog, "rb") as f:
        f.seek(int(lay.offsets[i]))
        tile_bytes = f.read(int(lay.bytecounts[i]))
    rows, cols = lay.tile
    s = lay.samples
    shape = (rows, cols, s)
    nbytes = rows * cols * s * np.dtype(lay.dtype).itemsize
    codec = lay.codec()
    expect = codec.decode(tile_bytes)  # (s, rows, cols)

    # the native product's chunk file of the same pixels (no shards: data/c/0/r/c)
    zchunk = products["zarr"] / "data" / "c" / "0" / str(r) / str(c)
    blosc = Blosc(cname="zstd", clevel=3, shuffle=Blosc.SHUFFLE, blocksize=1024 * 1024)
    if zchunk.is_file():
        blosc_bytes, blosc_src = zchunk.read_bytes(), str(zchunk)
    else:
        blosc_bytes, blosc_src = blosc.encode(expect), "encoded here (no chunk file found)"
    bout = np.empty_like(expect)
    blosc.decode(blosc_bytes, out=bout)
    blosc_ok = bool(np.array_equal(bout, expect))

    raw = np.frombuffer(imagecodecs.zstd_decode(tile_bytes, out=nbytes), dtype=lay.dtype).reshape(shape).copy()
    diffed = raw.copy()
    tile = imagecodecs.delta_decode(raw.copy(), axis=-2)
    planar = np.empty((s, rows, cols), dtype=tile.dtype)
    steps: dict[str, Callable[[], Any]] = {
        "zstd_decode (no out=)": lambda: imagecodecs.zstd_decode(tile_bytes),
        "zstd_decode (out=nbytes)": lambda: imagecodecs.zstd_decode(tile_bytes, out=nbytes),
        "delta_decode (predictor 2, in place)": lambda: imagecodecs.delta_decode(diffed, axis=-2, out=diffed),
        "transpose, cubelake blocked copy": lambda: _to_planar(tile, planar),
        "transpose, np.ascontiguousarray(moveaxis)": lambda: np.ascontiguousarray(np.moveaxis(tile, -1, 0)),
        "cubelake_tiff codec decode (all steps)": lambda: codec.decode(tile_bytes),
    }
    if kc_refs is not None:
        zarray = json.loads(kc_refs[".zarray"])
        kc_comp = numcodecs.get_codec(zarray["compressor"])
        kc_filters = [numcodecs.get_codec(f) for f in zarray.get("filters") or []]

        def kerchunk_chain() -> Any:
            buf = kc_comp.decode(tile_bytes)
            for flt in reversed(kc_filters):
                buf = flt.decode(buf)
            return buf

        got = np.frombuffer(np.ascontiguousarray(kerchunk_chain()), dtype=lay.dtype).reshape(shape)
        if not np.array_equal(np.moveaxis(got, -1, 0), expect):
            raise AssertionError("kerchunk's codec chain decodes the tile differently from cubelake_tiff")
        steps["kerchunk chain (imagecodecs_zstd + imagecodecs_delta)"] = kerchunk_chain
    steps["blosc zstd-3 shuffle 1M decode (out=)"] = lambda: blosc.decode(blosc_bytes, out=bout)
    results = {}
    for name, fn in steps.items():
        t = per_call(fn, min_time, repeats)
        results[name] = {"ms": t * 1e3, "mbps": nbytes / MB / t}
    return {"tile": [r, c], "shape": list(shape), "decoded_bytes": nbytes, "tile_bytes": len(tile_bytes),
            "blosc_bytes": len(blosc_bytes), "blosc_source": blosc_src, "blosc_equal": blosc_ok, "steps": results}


# -- output -------------------------------------------------------------------------------------
def print_refgen(g: dict[str, Any]) -> None:
    m = g["median_s"]
    print(f"\n1. reference generation: {g['cog']} ({g['tiles']} tiles, {g['cog_bytes'] / 1e6:.2f} MB); "
          f"median of {len(g['times_s']['cl_build'])}, page cache warm")
    rows = [("cubelake tiff_layout (header parse only)", "cl_layout"), ("cubelake build_refs", "cl_build"),
            ("cubelake write_refs (JSON)", "cl_write"), ("cubelake build_refs + write_refs", "cl_build_write"),
            ("kerchunk tiff_to_zarr (in memory)", "kc_build"), ("kerchunk tiff_to_zarr + JSON target", "kc_build_write")]
    print(f"{'step':<44} {'median s':>9} {'best s':>8}")
    for label, k in rows:
        print(f"{label:<44} {m[k]:>9.3f} {min(g['times_s'][k]):>8.3f}")
    print(f"speed ratio (kerchunk s / cubelake s; > 1 = cubelake faster): build {m['kc_build'] / m['cl_build']:.2f}x, "
          f"build + JSON {m['kc_build_write'] / m['cl_build_write']:.2f}x")
    target = "met" if m["cl_build"] < 1.0 else "MISSED"
    print(f"target build_refs < 1 s: {target} ({m['cl_build']:.3f} s); header parse alone {m['cl_layout']:.3f} s")
    print(f"chunks: cubelake {g['refs_chunks']}, kerchunk {g['kerchunk_chunks']}; same byte ranges: {g['same_byte_ranges']}; "
          f"JSON bytes cubelake {g['json_bytes']['cubelake']:,}, kerchunk {g['json_bytes']['kerchunk']:,}")


def print_reads(rd: dict[str, Any]) -> None:
    b, side = rd["bytes"], rd["scene_shape"][1]
    print(f"\n2. full-scene reads: {rd['scene_shape'][0]}x{side}x{side} int16 ({b / 2**20:.0f} MiB, {rd['chunks']} chunks of "
          f"{CHUNK}x{CHUNK}x{rd['scene_shape'][0]}); COG {rd['cog_bytes'] / 1e6:.0f} MB, Zarr {rd['zarr_bytes'] / 1e6:.0f} MB; "
          f"{rd['workers']} reader threads")
    modes = list(rd["summary"])
    head = "".join(f"{mode + ' med s':>12}{mode + ' MB/s':>12}{'best MB/s':>11}" for mode in modes)
    print(f"{'method':<46}{head}")
    for m in METHODS:
        cells = "".join(f"{rd['summary'][mode][m]['median_s']:>12.3f}{rd['summary'][mode][m]['mbps_median']:>12.0f}"
                        f"{rd['summary'][mode][m]['mbps_best']:>11.0f}" for mode in modes)
        print(f"{LABELS[m]:<46}{cells}")
    print("ratios (MB/s of refs / MB/s of the other, medians; > 1 = refs faster)")
    for other in ("native", "kerchunk", "kerchunk_T", "rasterio"):
        cells = "   ".join(f"{mode} {rd['summary'][mode]['refs']['mbps_median'] / rd['summary'][mode][other]['mbps_median']:.2f}x"
                           for mode in modes)
        print(f"  refs / {other:<11} {cells}")
    v = rd["verification"]
    print(f"verification: {v['windows']} windows, every method equal to refs: {not v['failures']}; "
          f"CRC32 refs {v['crc32']['refs']:08x} native {v['crc32']['native']:08x} ({'equal' if v['crc_equal'] else 'DIFFER'})")
    for f in v["failures"][:10]:
        print("  " + f)


def print_decode(d: dict[str, Any]) -> None:
    print(f"\n3. decode of one {d['shape'][0]}x{d['shape'][1]}x{d['shape'][2]} int16 tile ({d['decoded_bytes'] / 2**20:.0f} MiB "
          f"decoded), single thread, median: COG tile {d['tile_bytes']:,} B, blosc chunk {d['blosc_bytes']:,} B")
    print(f"{'step':<56} {'ms':>8} {'MB/s':>8}")
    for name, s in d["steps"].items():
        print(f"{name:<56} {s['ms']:>8.2f} {s['mbps']:>8.0f}")
    st = d["steps"]
    if "zstd_decode (no out=)" in st:
        print(f"out= speed-up of zstd_decode: {st['zstd_decode (no out=)']['ms'] / st['zstd_decode (out=nbytes)']['ms']:.2f}x; "
              f"cubelake_tiff / blosc time: {st['cubelake_tiff codec decode (all steps)']['ms'] / st['blosc zstd-3 shuffle 1M decode (out=)']['ms']:.2f}x")


# -- main ---------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bench/refs"), help="inputs and products (kept and reused)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per measurement (default 3; 2 with --quick)")
    ap.add_argument("--json", type=Path, default=None, help="write all results here")
    ap.add_argument("--quick", action="store_true", help="small smoke run: a 64 MiB scene, shorter decode timing")
    ap.add_argument("--size-gib", type=float, default=None, help="read-benchmark scene size (default 1; 1/16 with --quick)")
    ap.add_argument("--bands", type=int, default=BANDS)
    ap.add_argument("--workers", type=int, default=2, help="reader threads (and zarr codec threads) for every method")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold (page cache dropped) read runs")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: refgen, reads, decode")
    a = ap.parse_args()
    repeats = a.repeats or (2 if a.quick else 3)
    size = a.size_gib if a.size_gib is not None else (1 / 16 if a.quick else 1.0)
    skip = {s for s in a.skip.split(",") if s}

    # before GDAL and zarr start: every method gets the same thread and cache budgets
    os.environ["GDAL_CACHEMAX"] = str(GDAL_CACHEMAX_MB)
    import numcodecs.blosc
    import zarr

    zarr.config.set({"threading.max_workers": a.workers})
    numcodecs.blosc.use_threads = False
    import imagecodecs.numcodecs

    imagecodecs.numcodecs.register_codecs(verbose=False)
    import cubelake.ingest  # (imported before cubelake.refs, which imports it in turn)
    import cubelake.refs  # noqa: F401  (registers cubelake_tiff)

    work = a.workdir
    work.mkdir(parents=True, exist_ok=True)
    cold = not a.no_cold and can_drop_caches()
    if not a.no_cold and not cold:
        print("note: cannot drop the page cache (not root): warm runs only")
    t_start = time.perf_counter()
    doc: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "args": {k: str(v) for k, v in vars(a).items()},
                           "repeats": repeats, "page_cache_dropped_for_cold": cold}

    if "refgen" not in skip:
        big = ensure_big_cog(work, BIG_SIDE)
        doc["refgen"] = bench_refgen(big, work, repeats)
        print_refgen(doc["refgen"])

    products = None
    if not {"reads", "decode"} <= skip:
        side = scene_side(size, a.bands)
        src = ensure_scene(work, side, a.bands)
        products = ensure_products(src, work, a.workers)
    if "reads" not in skip and products is not None:
        print(f"\nreading {products['cog'].parent.name} ({'warm and cold' if cold else 'warm'}, {repeats} rounds) ...", flush=True)
        doc["reads"] = bench_reads(products, work, side, a.bands, repeats, a.workers, cold)
        print_reads(doc["reads"])
    if "decode" not in skip and products is not None:
        import kerchunk.tiff

        kc = kerchunk.tiff.tiff_to_zarr(str(products["cog"].resolve()))
        doc["decode"] = bench_decode(products, kc, 3 if a.quick else 5, 0.1 if a.quick else 0.3)
        print_decode(doc["decode"])

    doc["total_s"] = time.perf_counter() - t_start
    import kerchunk
    import rasterio
    import tifffile

    doc["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                      "versions": {"zarr": zarr.__version__, "numcodecs": numcodecs.__version__,
                                   "imagecodecs": imagecodecs.__version__, "tifffile": tifffile.__version__,
                                   "kerchunk": kerchunk.__version__, "rasterio": rasterio.__version__,
                                   "gdal": rasterio.__gdal_version__}}
    print(f"\ntotal {doc['total_s']:.0f} s")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"wrote {a.json}")
    bad = (doc.get("reads", {}).get("verification", {}).get("failures")
           or ("refgen" in doc and not doc["refgen"]["same_byte_ranges"]))
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
