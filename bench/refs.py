"""Reference sets (virtual Zarr over COG tiles): cubelake against kerchunk, native Zarr and rasterio.

Three measurements, all in one run, so their ratios compare like with like:

1. **Reference generation** (header only) for one COG of 10,000 tiles: a 25600x25600 int16
   single-band COG (256 tiles, ZSTD level 3, predictor 2, no overviews) written by GDAL's COG
   driver from an empty VRT, so every tile is stored but tiny (the header and tile tables are what
   is read; tile contents do not matter). Timed: ``tiff_layout`` (the header parse alone), the
   GDAL metadata ``build_refs`` reads, ``build_refs``, ``write_refs`` to JSON, and the peer
   ``kerchunk.tiff.tiff_to_zarr`` (tifffile's ``write_fsspec``) without and with a JSON ``target``.
   Medians of ``--repeats`` (after one untimed warm-up call each; page cache warm). Both
   reference sets are checked to point at the same byte ranges.

2. **Full-scene read throughput**: a synthetic HSI scene (``bench/synth.py``; 128 bands int16,
   256 tiles, ``--size-gib`` 1 by default, 64 MiB with ``--quick``) is ingested with cubelake
   (products cog and zarr; chunk 256, COG ZSTD-3 + predictor 2, Zarr blosc zstd-3 shuffle 1 MiB
   blocks) and also converted by GDAL's COG driver with the same settings (unless
   ``--no-gdal-cog``). The whole ``data`` array is then read chunk by chunk through
     refs           cubelake refs of the lake's COG (``build_refs`` + ``write_refs`` JSON, ``open_array``)
     native         the native Zarr v3 product (``zarr.open_group(...)["data"]``)
     kerchunk       kerchunk's refs of the same COG (``tiff_to_zarr``) through fsspec's ReferenceFileSystem
                    (``kerchunk.utils.refs_as_store``: a ``zarr.storage.FsspecStore``), Zarr v2, with
                    imagecodecs' numcodecs codecs; its chunks come out (y, x, band)
     kerchunk_T     the same, each chunk then copied to (band, y, x), as the others return it
     rasterio       rasterio (GDAL 3.10) reading the lake's COG block by block, one dataset per thread
     refs_gdal      cubelake refs of GDAL's COG
     kerchunk_gdal  kerchunk refs of GDAL's COG
   The two COGs differ in one way that matters here: cubelake's writer (imagecodecs) records each
   tile's decoded size in its ZSTD frame, libtiff (GDAL) does not, and decoding a frame of unknown
   size is slower unless the caller passes ``out=`` (cubelake_tiff does; kerchunk's
   imagecodecs_zstd does not).
   Access pattern, the same for all: the 256x256 chunk-aligned windows (all bands) in row-major
   order, read by ``--workers`` threads (default 2, the cores here), each reading one window at a
   time and dropping the result; zarr's codec thread pool is limited to the same number
   (``threading.max_workers``) and blosc's internal threads are off, so at most ``--workers``
   chunks decode at once in every method. Opening the array/dataset is inside the timed part
   (it is small). GDAL_CACHEMAX is 256 MB and every run opens its datasets afresh, so no run
   reads another's cached blocks. MB/s = uncompressed bytes / s (MB = 10^6 bytes), median of
   ``--repeats``; methods run round-robin. Warm runs follow one untimed read by each method; as
   root, cold runs drop the page cache (``sync; echo 3 > /proc/sys/vm/drop_caches``) before each
   read. The CPU other processes used during each run is recorded (``/proc/stat``). Once, every
   method's result is compared window by window with the refs result (kerchunk's after the
   transpose), and CRC32s of refs and native are printed, so no method can be fast by being wrong.

3. **Decode of one tile**, single thread, steps interleaved over rounds (best and median): the
   stored 256x256x128 int16 tile (ZSTD + predictor 2, pixel-interleaved) from each COG, and the
   native Zarr's chunk file of the same pixels (blosc zstd-3 shuffle, 1 MiB blocks). Steps:
   ``imagecodecs.zstd_decode`` without and with ``out=``, the copy the codec makes of the
   read-only decoded buffer, ``delta_decode`` (the predictor) in place and into a new array, the
   (y, x, band) -> (band, y, x) transpose (cubelake's blocked copy and plain numpy), the whole
   ``cubelake_tiff`` decode, kerchunk's codec chain (imagecodecs_zstd + imagecodecs_delta), and
   blosc decoding into a preallocated buffer; with minor page faults and system CPU per call.

    python bench/refs.py --json /tmp/bench/refs.json
    python bench/refs.py --quick          # small smoke run (< 2 minutes)

Inputs and products stay in ``--workdir`` and are reused by later runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import statistics
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sibling helper modules
from common import can_drop_caches, drop_caches  # noqa: E402
from synth import ensure_scene as ensure_synth_scene  # noqa: E402

CHUNK = 256
BANDS = 128
BIG_SIDE = 25600  # 100 x 100 tiles of 256
GDAL_CACHEMAX_MB = 256
MB = 1e6


# -- helpers ------------------------------------------------------------------------------------


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

    from cubelake.ingest.sources.gdal import open_gdal
    from cubelake.refs import build_refs, tiff_layout, write_refs

    url = str(cog.resolve())
    cl_json, kc_json = work / "big.refs.json", work / "big.kerchunk.json"

    def gdal_meta() -> Any:
        src = open_gdal(url)
        try:
            return src.meta
        finally:
            src.close()

    steps: dict[str, Callable[[], Any]] = {
        "cl_layout": lambda: tiff_layout(url),
        "cl_gdal_meta": gdal_meta,
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
    return ensure_synth_scene(work, side, side, bands, CHUNK)


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


def ensure_gdal_cog(src: Path, work: Path) -> Path:
    """GDAL's COG of ``src`` (rasterio's GDAL, same settings as the lake's COG): libtiff ZSTD tiles."""
    import rasterio
    import rasterio.shutil

    path = work / f"{src.stem}_gdal_cog.tif"
    if path.exists():
        with rasterio.open(path) as ds, rasterio.open(src) as s:
            if ds.shape == s.shape and ds.count == s.count and ds.block_shapes[0] == (CHUNK, CHUNK) \
                    and str(ds.compression) == "Compression.zstd":
                return path
        path.unlink()
    print(f"writing {path} with GDAL's COG driver ...", flush=True)
    tmp = path.with_suffix(".partial.tif")
    t, _ = timed(lambda: rasterio.shutil.copy(str(src), str(tmp), driver="COG", BLOCKSIZE=CHUNK, COMPRESS="ZSTD", LEVEL=3,
                                              PREDICTOR="YES", NUM_THREADS=2, OVERVIEWS="NONE", BIGTIFF="IF_SAFER"))
    tmp.rename(path)
    print(f"  written in {t:.1f} s", flush=True)
    return path


Reader = Callable[[tuple[int, int]], np.ndarray]

#: method -> (how it reads, which COG it reads: the lake's, written by cubelake, or GDAL's)
METHODS: dict[str, tuple[str, str]] = {
    "refs": ("refs", "lake"),
    "native": ("native", "lake"),
    "kerchunk": ("kerchunk", "lake"),
    "kerchunk_T": ("kerchunk_T", "lake"),
    "rasterio": ("rasterio", "lake"),
    "refs_gdal": ("refs", "gdal"),
    "kerchunk_gdal": ("kerchunk", "gdal"),
}
LABELS = {
    "refs": "cubelake refs (open_array, cubelake_tiff)",
    "native": "native Zarr v3 (blosc zstd-3 shuffle)",
    "kerchunk": "kerchunk tiff_to_zarr + fsspec reference fs",
    "kerchunk_T": "  the same, chunks copied to (band, y, x)",
    "rasterio": "rasterio block reads of the COG",
    "refs_gdal": "cubelake refs of GDAL's COG",
    "kerchunk_gdal": "kerchunk refs of GDAL's COG",
}


@contextmanager
def open_method(method: str, paths: dict[str, Any]) -> Iterator[Reader]:
    """A reader of one (row, col) chunk-aligned window, all bands, for ``method``."""
    import zarr

    how, which = METHODS[method]
    if how == "refs":
        from cubelake.refs import open_array

        arr = open_array(paths[which]["refs_json"], allowed_roots=[str(paths["work"]), str(paths["lake_root"])])
        yield lambda rc: arr[:, rc[0] : rc[0] + CHUNK, rc[1] : rc[1] + CHUNK]
    elif how == "native":
        arr = zarr.open_group(str(paths["zarr"]), mode="r")["data"]
        yield lambda rc: arr[:, rc[0] : rc[0] + CHUNK, rc[1] : rc[1] + CHUNK]
    elif how in ("kerchunk", "kerchunk_T"):
        from kerchunk.utils import refs_as_store

        arr = zarr.open_array(refs_as_store(paths[which]["kerchunk_refs"], read_only=True), mode="r", zarr_format=2)
        if how == "kerchunk":
            yield lambda rc: arr[rc[0] : rc[0] + CHUNK, rc[1] : rc[1] + CHUNK, :]
        else:
            yield lambda rc: np.ascontiguousarray(np.moveaxis(arr[rc[0] : rc[0] + CHUNK, rc[1] : rc[1] + CHUNK, :], -1, 0))
    elif how == "rasterio":
        import rasterio
        from rasterio.windows import Window

        local = threading.local()
        opened: list[Any] = []
        lock = threading.Lock()

        def read(rc: tuple[int, int]) -> np.ndarray:
            ds = getattr(local, "ds", None)
            if ds is None:
                ds = local.ds = rasterio.open(paths[which]["cog"])
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


def read_all(method: str, paths: dict[str, Any], windows: list[tuple[int, int]], workers: int) -> tuple[float, float]:
    """Seconds to open and read every window with ``workers`` threads, and the cores other
    processes used meanwhile (on average)."""
    b0, c0 = busy_cpu_s(), own_cpu_s()
    t0 = time.perf_counter()
    with open_method(method, paths) as read, ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(read, windows):
            pass
    t = time.perf_counter() - t0
    others = max(0.0, (busy_cpu_s() - b0) - (own_cpu_s() - c0))
    return t, others / t


@contextmanager
def opened_all(methods: list[str], paths: dict[str, Any]) -> Iterator[dict[str, Reader]]:
    with ExitStack() as stack:
        yield {m: stack.enter_context(open_method(m, paths)) for m in methods}


def verify_reads(methods: list[str], paths: dict[str, Any], windows: list[tuple[int, int]]) -> dict[str, Any]:
    """Every method's pixels against the refs result, window by window; also CRCs of refs and native."""
    failures: list[str] = []
    crc = {"refs": 0, "native": 0}
    with opened_all(methods, paths) as rd:
        for rc in windows:
            ref = rd["refs"](rc)
            crc["refs"] = zlib.crc32(np.ascontiguousarray(ref).data, crc["refs"])
            for m in methods[1:]:
                got = rd[m](rc)
                if m == "native":
                    crc["native"] = zlib.crc32(np.ascontiguousarray(got).data, crc["native"])
                if METHODS[m][0] == "kerchunk":
                    got = np.moveaxis(got, -1, 0)
                if got.shape != ref.shape or got.dtype != ref.dtype or not np.array_equal(got, ref):
                    failures.append(f"{m}: window {rc} differs from refs ({got.dtype}{got.shape} vs {ref.dtype}{ref.shape})")
    return {"windows": len(windows), "methods": methods, "failures": failures, "crc32": crc,
            "crc_equal": crc["refs"] == crc["native"]}


def make_refs(cog: Path, out: Path) -> dict[str, Any]:
    """cubelake's refs (written to ``out``) and kerchunk's (in memory) of ``cog``, with their build times."""
    import kerchunk.tiff

    from cubelake.refs import build_refs, write_refs

    t_build, refs = timed(lambda: build_refs(str(cog)))
    write_refs(refs, out, fmt="json")
    t_kc, kc_refs = timed(lambda: kerchunk.tiff.tiff_to_zarr(str(cog)))
    return {"cog": str(cog), "refs_json": out, "kerchunk_refs": kc_refs, "refs_build_s": t_build, "kerchunk_build_s": t_kc}


def bench_reads(products: dict[str, Path], gdal_cog: Path | None, work: Path, side: int, bands: int, repeats: int,
                workers: int, cold: bool) -> dict[str, Any]:
    cog = products["cog"].resolve()
    # "lake" / "gdal": the refs of that COG; targets may lie in the lake or the work folder
    paths: dict[str, Any] = {"zarr": products["zarr"], "lake_root": cog.parents[2], "work": work.resolve(),
                             "lake": make_refs(cog, work / f"{cog.stem}.refs.json")}
    methods = [m for m, (_, which) in METHODS.items() if which == "lake" or gdal_cog is not None]
    if gdal_cog is not None:
        paths["gdal"] = make_refs(gdal_cog.resolve(), work / f"{gdal_cog.stem}.refs.json")
    windows = [(r, c) for r in range(0, side, CHUNK) for c in range(0, side, CHUNK)]
    nbytes = side * side * bands * 2
    print(f"verifying every method against the refs result on {len(windows)} windows ...", flush=True)
    check = verify_reads(methods, paths, windows)
    modes = ["warm", *(["cold"] if cold else [])]
    runs: dict[str, dict[str, list[float]]] = {mode: {m: [] for m in methods} for mode in modes}
    others: dict[str, dict[str, list[float]]] = {mode: {m: [] for m in methods} for mode in modes}
    for mode in modes:
        if mode == "warm":
            for m in methods:  # untimed: page cache and imports
                read_all(m, paths, windows, workers)
        for rnd in range(repeats):
            for m in methods:
                if mode == "cold":
                    drop_caches()
                t, busy = read_all(m, paths, windows, workers)
                runs[mode][m].append(t)
                others[mode][m].append(busy)
                print(f"  {mode} round {rnd} {m:<14} {t:7.3f} s  {nbytes / MB / t:7.0f} MB/s  others used {busy:.2f} cores",
                      flush=True)
    summary = {mode: {m: {"median_s": med(v), "best_s": min(v), "mbps_median": nbytes / MB / med(v),
                          "mbps_best": nbytes / MB / min(v)} for m, v in r.items()} for mode, r in runs.items()}
    cogs = {"lake": {"path": str(cog), "bytes": cog.stat().st_size,
                     "refs_build_s": paths["lake"]["refs_build_s"], "kerchunk_build_s": paths["lake"]["kerchunk_build_s"]}}
    if gdal_cog is not None:
        cogs["gdal"] = {"path": str(gdal_cog), "bytes": gdal_cog.stat().st_size,
                        "refs_build_s": paths["gdal"]["refs_build_s"], "kerchunk_build_s": paths["gdal"]["kerchunk_build_s"]}
    return {"scene_shape": [bands, side, side], "bytes": nbytes, "chunks": len(windows), "methods": methods,
            "cogs": cogs, "zarr": str(products["zarr"]), "zarr_bytes": tree_size(products["zarr"]), "workers": workers,
            "verification": check, "runs_s": runs, "others_cores": others, "summary": summary}


# -- 3. one-tile decode -------------------------------------------------------------------------
def own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def busy_cpu_s() -> float:
    """Non-idle CPU seconds of the whole machine since boot (all cores; iowait counts as idle)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def round_robin(steps: dict[str, Callable[[], Any]], rounds: int) -> dict[str, dict[str, float]]:
    """Each step once per round, steps interleaved so drift hits all alike: best and median seconds per
    call, minor page faults and system CPU seconds per call."""
    times: dict[str, list[float]] = {k: [] for k in steps}
    faults = dict.fromkeys(steps, 0.0)
    sys_s = dict.fromkeys(steps, 0.0)
    for fn in steps.values():  # warm-up
        fn()
    for _ in range(rounds):
        for k, fn in steps.items():
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            faults[k] += r1.ru_minflt - r0.ru_minflt
            sys_s[k] += r1.ru_stime - r0.ru_stime
    return {k: {"best_s": min(v), "median_s": statistics.median(v), "minor_faults": faults[k] / rounds,
                "sys_s": sys_s[k] / rounds} for k, v in times.items()}


def read_tile(cog: Path, r: int, c: int) -> tuple[Any, bytes]:
    from cubelake.refs import tiff_layout

    lay = tiff_layout(str(cog))
    i = r * lay.tiles_across + c
    with open(cog, "rb") as f:
        f.seek(int(lay.offsets[i]))
        return lay, f.read(int(lay.bytecounts[i]))


def zstd_has_size(frame: bytes) -> bool:
    """Whether a ZSTD frame header records the decoded size (Frame_Content_Size present)."""
    if frame[:4] != b"\x28\xb5\x2f\xfd":
        return False
    desc = frame[4]
    return (desc >> 6) != 0 or bool((desc >> 5) & 1)


def bench_decode(products: dict[str, Path], gdal_cog: Path | None, rounds: int) -> dict[str, Any]:
    import imagecodecs
    import kerchunk.tiff
    import numcodecs
    from numcodecs import Blosc

    from cubelake.refs.codec import _to_planar

    cog = products["cog"]
    lay, tile_bytes = read_tile(cog, 0, 0)
    r, c = lay.tiles_down // 2, lay.tiles_across // 2
    lay, tile_bytes = read_tile(cog, r, c)
    rows, cols = lay.tile
    s = lay.samples
    shape = (rows, cols, s)
    nbytes = rows * cols * s * np.dtype(lay.dtype).itemsize
    codec = lay.codec()
    expect = codec.decode(tile_bytes)  # (s, rows, cols)
    tiles = {"lake": tile_bytes}
    if gdal_cog is not None:
        glay, tiles["gdal"] = read_tile(gdal_cog, r, c)
        if glay.tile != lay.tile or glay.samples != s:
            raise AssertionError(f"{gdal_cog}: tiles {glay.tile}x{glay.samples}, expected {lay.tile}x{s}")

    # the native product's chunk file of the same pixels (no shards: data/c/0/r/c)
    zchunk = products["zarr"] / "data" / "c" / "0" / str(r) / str(c)
    blosc = Blosc(cname="zstd", clevel=3, shuffle=Blosc.SHUFFLE, blocksize=1024 * 1024)
    if zchunk.is_file():
        blosc_bytes, blosc_src = zchunk.read_bytes(), str(zchunk)
    else:
        blosc_bytes, blosc_src = blosc.encode(expect), "encoded here (no chunk file found)"
    bout = np.empty_like(expect)
    blosc.decode(blosc_bytes, out=bout)
    if not np.array_equal(bout, expect):
        raise AssertionError(f"{blosc_src}: the blosc chunk differs from the COG tile's pixels")

    decoded = imagecodecs.zstd_decode(tile_bytes, out=nbytes)
    ro = np.frombuffer(decoded, dtype=lay.dtype).reshape(shape)
    diffed = ro.copy()
    tile = imagecodecs.delta_decode(ro.copy(), axis=-2)
    planar = np.empty((s, rows, cols), dtype=tile.dtype)
    steps: dict[str, Callable[[], Any]] = {}
    for which, tb in tiles.items():
        steps[f"zstd_decode, no out= ({which} COG tile)"] = lambda tb=tb: imagecodecs.zstd_decode(tb)
        steps[f"zstd_decode, out=nbytes ({which} COG tile)"] = lambda tb=tb: imagecodecs.zstd_decode(tb, out=nbytes)
    steps.update({
        "copy of the read-only decoded buffer (codec)": lambda: ro.copy(),
        "delta_decode in place (predictor 2, codec)": lambda: imagecodecs.delta_decode(diffed, axis=-2, out=diffed),
        "delta_decode into a new array": lambda: imagecodecs.delta_decode(ro, axis=-2),
        "transpose, cubelake blocked copy (codec)": lambda: _to_planar(tile, planar),
        "transpose, np.ascontiguousarray(moveaxis)": lambda: np.ascontiguousarray(np.moveaxis(tile, -1, 0)),
    })
    for which, tb in tiles.items():
        steps[f"cubelake_tiff decode, all steps ({which} COG tile)"] = lambda tb=tb: codec.decode(tb)
    for which in tiles:
        cog_path = cog if which == "lake" else gdal_cog
        zarray = json.loads(kerchunk.tiff.tiff_to_zarr(str(Path(str(cog_path)).resolve()))[".zarray"])
        kc_comp = numcodecs.get_codec(zarray["compressor"])
        kc_filters = [numcodecs.get_codec(f) for f in zarray.get("filters") or []]

        def kerchunk_chain(tb: bytes = tiles[which], comp: Any = kc_comp, filters: list[Any] = kc_filters) -> Any:
            buf = comp.decode(tb)
            for flt in reversed(filters):
                buf = flt.decode(buf)
            return buf

        got = np.frombuffer(np.ascontiguousarray(kerchunk_chain()), dtype=lay.dtype).reshape(shape)
        if not np.array_equal(np.moveaxis(got, -1, 0), expect):
            raise AssertionError(f"kerchunk's codec chain decodes the {which} tile differently from cubelake_tiff")
        steps[f"kerchunk chain, zstd + delta ({which} COG tile)"] = kerchunk_chain
    steps["blosc zstd-3 shuffle 1M decode, out= (native chunk)"] = lambda: blosc.decode(blosc_bytes, out=bout)
    results = round_robin(steps, rounds)
    for v in results.values():
        v["mbps_best"] = nbytes / MB / v["best_s"]
    return {"tile": [r, c], "shape": list(shape), "decoded_bytes": nbytes, "rounds": rounds,
            "tile_bytes": {k: len(v) for k, v in tiles.items()},
            "zstd_frame_records_size": {k: zstd_has_size(v) for k, v in tiles.items()},
            "blosc_bytes": len(blosc_bytes), "blosc_source": blosc_src, "steps": results}


# -- output -------------------------------------------------------------------------------------
def print_refgen(g: dict[str, Any]) -> None:
    m = g["median_s"]
    print(f"\n1. reference generation: {g['cog']} ({g['tiles']} tiles, {g['cog_bytes'] / 1e6:.2f} MB); "
          f"median of {len(g['times_s']['cl_build'])}, page cache warm")
    rows = [("cubelake tiff_layout (header parse only)", "cl_layout"),
            ("cubelake GDAL metadata (open_gdal(...).meta)", "cl_gdal_meta"), ("cubelake build_refs", "cl_build"),
            ("cubelake write_refs (JSON)", "cl_write"), ("cubelake build_refs + write_refs", "cl_build_write"),
            ("kerchunk tiff_to_zarr (in memory)", "kc_build"), ("kerchunk tiff_to_zarr + JSON target", "kc_build_write")]
    print(f"{'step':<46} {'median s':>9} {'best s':>8}")
    for label, k in rows:
        print(f"{label:<46} {m[k]:>9.3f} {min(g['times_s'][k]):>8.3f}")
    print(f"speed ratio (kerchunk s / cubelake s; > 1 = cubelake faster): build {m['kc_build'] / m['cl_build']:.2f}x, "
          f"build + JSON {m['kc_build_write'] / m['cl_build_write']:.2f}x")
    target = "met" if m["cl_build"] < 1.0 else "MISSED"
    rest = m["cl_build"] - m["cl_layout"] - m["cl_gdal_meta"]
    print(f"target build_refs < 1 s: {target} ({m['cl_build']:.3f} s): header parse {m['cl_layout']:.3f} s, GDAL metadata "
          f"{m['cl_gdal_meta']:.3f} s, the rest (Zarr metadata template, chunk table) {rest:.3f} s")
    print(f"chunks: cubelake {g['refs_chunks']}, kerchunk {g['kerchunk_chunks']}; same byte ranges: {g['same_byte_ranges']}; "
          f"JSON bytes cubelake {g['json_bytes']['cubelake']:,}, kerchunk {g['json_bytes']['kerchunk']:,}")


def print_reads(rd: dict[str, Any]) -> None:
    b, side = rd["bytes"], rd["scene_shape"][1]
    cogs = "; ".join(f"{k} COG {v['bytes'] / 1e6:.0f} MB" for k, v in rd["cogs"].items())
    print(f"\n2. full-scene reads: {rd['scene_shape'][0]}x{side}x{side} int16 ({b / 2**20:.0f} MiB, {rd['chunks']} chunks of "
          f"{CHUNK}x{CHUNK}x{rd['scene_shape'][0]}); {cogs}; Zarr {rd['zarr_bytes'] / 1e6:.0f} MB; "
          f"{rd['workers']} reader threads, each one chunk at a time; median of {len(next(iter(rd['runs_s'].values()))['refs'])}")
    modes = list(rd["summary"])
    head = "".join(f"{mode + ' med s':>12}{mode + ' MB/s':>12}{'best MB/s':>11}" for mode in modes)
    print(f"{'method':<46}{head}")
    for m in rd["methods"]:
        cells = "".join(f"{rd['summary'][mode][m]['median_s']:>12.3f}{rd['summary'][mode][m]['mbps_median']:>12.0f}"
                        f"{rd['summary'][mode][m]['mbps_best']:>11.0f}" for mode in modes)
        print(f"{LABELS[m]:<46}{cells}")
    print("ratios (MB/s of refs / MB/s of the other, medians; > 1 = refs faster)")
    pairs = [("refs", o) for o in ("native", "kerchunk", "kerchunk_T", "rasterio")] + [("refs_gdal", "kerchunk_gdal")]
    for a, o in pairs:
        if a in rd["methods"] and o in rd["methods"]:
            cells = "   ".join(f"{mode} {rd['summary'][mode][a]['mbps_median'] / rd['summary'][mode][o]['mbps_median']:.2f}x"
                               for mode in modes)
            print(f"  {a} / {o:<14} {cells}")
    busiest = max(x for mode in rd["others_cores"].values() for v in mode.values() for x in v)
    if busiest > 0.25:
        print(f"note: other processes used up to {busiest:.2f} cores during a timed run; numbers may be disturbed")
    v = rd["verification"]
    print(f"verification: {v['windows']} windows, every method equal to refs: {not v['failures']}; "
          f"CRC32 refs {v['crc32']['refs']:08x} native {v['crc32']['native']:08x} ({'equal' if v['crc_equal'] else 'DIFFER'})")
    for f in v["failures"][:10]:
        print("  " + f)


def print_decode(d: dict[str, Any]) -> None:
    sizes = ", ".join(f"{k} COG tile {v:,} B (its ZSTD frame records the decoded size: {d['zstd_frame_records_size'][k]})"
                      for k, v in d["tile_bytes"].items())
    print(f"\n3. decode of one {d['shape'][0]}x{d['shape'][1]}x{d['shape'][2]} int16 tile ({d['decoded_bytes'] / 2**20:.0f} MiB "
          f"decoded), single thread, {d['rounds']} interleaved rounds: {sizes}; blosc chunk {d['blosc_bytes']:,} B")
    print(f"{'step':<56} {'best ms':>8} {'med ms':>8} {'MB/s':>7} {'faults':>7} {'sys ms':>7}")
    for name, s in d["steps"].items():
        print(f"{name:<56} {s['best_s'] * 1e3:>8.2f} {s['median_s'] * 1e3:>8.2f} {s['mbps_best']:>7.0f} "
              f"{s['minor_faults']:>7.0f} {s['sys_s'] * 1e3:>7.2f}")
    st = {k: v["best_s"] * 1e3 for k, v in d["steps"].items()}
    print("(MB/s = decoded bytes / best time; faults = minor page faults per call)")
    for which in d["tile_bytes"]:
        no, yes = st[f"zstd_decode, no out= ({which} COG tile)"], st[f"zstd_decode, out=nbytes ({which} COG tile)"]
        print(f"out= speed-up of zstd_decode ({which} COG tile): {no / yes:.2f}x (best times)")
    parts = (st["zstd_decode, out=nbytes (lake COG tile)"] + st["copy of the read-only decoded buffer (codec)"]
             + st["delta_decode in place (predictor 2, codec)"] + st["transpose, cubelake blocked copy (codec)"])
    whole = st["cubelake_tiff decode, all steps (lake COG tile)"]
    blosc = st["blosc zstd-3 shuffle 1M decode, out= (native chunk)"]
    print(f"cubelake_tiff decode {whole:.1f} ms; its steps on reused buffers add up to {parts:.1f} ms; "
          f"blosc decode of the same pixels {blosc:.1f} ms (cubelake_tiff / blosc {whole / blosc:.2f}x)")


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
    ap.add_argument("--no-gdal-cog", action="store_true",
                    help="skip GDAL's COG of the scene (refs/kerchunk over libtiff ZSTD tiles, which record no size)")
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

    products = gdal_cog = None
    side = scene_side(size, a.bands)
    if not {"reads", "decode"} <= skip:
        src = ensure_scene(work, side, a.bands)
        products = ensure_products(src, work, a.workers)
        gdal_cog = None if a.no_gdal_cog else ensure_gdal_cog(src, work)
    if "reads" not in skip and products is not None:
        print(f"\nreading {products['cog'].parent.name} ({'warm and cold' if cold else 'warm'}, {repeats} rounds) ...", flush=True)
        doc["reads"] = bench_reads(products, gdal_cog, work, side, a.bands, repeats, a.workers, cold)
        print_reads(doc["reads"])
    if "decode" not in skip and products is not None:
        doc["decode"] = bench_decode(products, gdal_cog, 5 if a.quick else 15)
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
