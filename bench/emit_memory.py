"""EMIT ingest memory: does ``cubelake ingest`` of a full-size EMIT L2A granule stay in bounded memory?

A real EMIT L2A RFL granule holds a 1280 x 1242 x 285 float32 swath (1.81 GB) and a GLT that
places it, rotated with the ISS track, on a larger north-up map grid. The documented recipe (the
LP DAAC's EMIT-Data-Resources ``emit_xarray(..., ortho=True)`` -> ``apply_glt``) loads the whole
swath and builds the whole orthorectified cube in memory. cubelake's reader
(``cubelake.ingest.sources.emit``) streams it instead: a map-grid window reads its GLT window,
then only the swath slab those GLT entries reach (at most ``SLAB_BUDGET_BYTES``).

The granule is written here (no real granule can be downloaded on this machine) in the layout of
``cubelake/testing/emit.py`` (the EMIT product format), at real size, slab by slab. Storage
of ``reflectance``: as JPL's SDS writes it (``emit_utils.daac_converter.add_variable`` passes only
dimensions and a fill value, so netCDF-C stores it contiguous and uncompressed), unless
``--chunk-rows`` / ``--zlib`` ask for a chunked, deflated variable. Pixel values: three smooth
spectral endmembers mixed with smoothly varying abundances, plus noise (reflectance-like, so the
products compress as real data would, not as white noise).

Methods, each in its own fresh (spawned) process, on the same granule:

  ingest   cubelake.ingest.ingest([granule], lake, products cog,zarr, 2 workers): the whole ingest
           (validation, statistics, BLAKE3 hash of the source, COG + Zarr, catalog)
  naive    xarray.open_dataset(engine="h5netcdf") -> .values of ``reflectance`` (the whole swath)
           -> apply_glt on whole arrays (the LP DAAC recipe, from cubelake/testing/emit.py)
  reader   open_source(granule).read(window) for every 256 x 256 window of the map grid (no writing;
           the time is the open and the reads, not the checksums taken between them)
  ceiling  h5py: read every byte of the swath once, slab by slab (<= 64 MiB) into one buffer

Peak RSS is the process's own high-water mark (VmHWM, reset when the method starts; every method
runs in threads of one process); "before" is its RSS right before the measured work, after the
imports. The page cache is warm for every run (the granule is read once before the first run)
unless ``--cold`` (root: drop caches before each run). Correctness: the reader's and the naive recipe's orthorectified cubes agree (count and sum
of the valid values), and the ingested Zarr equals the reader on sample windows.

    python bench/emit_memory.py                 # real size (+ the small granule, for scaling)
    python bench/emit_memory.py --small         # ~100 MB smoke run
    python bench/emit_memory.py --sizes double --repeats 1 --skip-naive   # 2 x 1280 rows (3.6 GB)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sibling helper modules
from common import busy_cpu_seconds, can_drop_caches, drop_caches, isolated  # noqa: E402

FULL = (1280, 1242, 285)  # an EMIT L2A RFL swath: downtrack, crosstrack, bands
SMALL = (304, 296, 285)  # ~100 MB, same bands
DOUBLE = (2560, 1242, 285)  # twice a granule's downtrack (3.6 GB): does ingest's peak grow with the input?
SIZES = {"small": SMALL, "full": FULL, "double": DOUBLE}
ANGLE_DEG = 25.0
WINDOW = 256
MIB = 1024**2


# -- the granule --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GranuleSpec:
    n_down: int
    n_cross: int
    n_bands: int
    chunk_rows: int = 0  # 0: contiguous (as the SDS writes it); else chunks (rows, crosstrack, bands)
    zlib: int = 0  # deflate level of the chunks (0: none)

    @property
    def nbytes(self) -> int:
        return self.n_down * self.n_cross * self.n_bands * 4

    @property
    def layout(self) -> str:
        if not self.chunk_rows:
            return "contiguous, uncompressed (netCDF-C's default for the SDS's createVariable call)"
        codec = f"zlib level {self.zlib}" if self.zlib else "uncompressed"
        return f"chunked ({self.chunk_rows}, {self.n_cross}, {self.n_bands}), {codec}"


def good_wavelengths(wl: np.ndarray) -> np.ndarray:
    """EMIT L2A's good-band flags: 0 in the 1325-1435 and 1770-1962 nm water-vapour windows (the SDS rule)."""
    bad = ((wl > 1325) & (wl < 1435)) | ((wl > 1770) & (wl < 1962))
    return np.where(bad, 0, 1).astype(np.uint8)


def endmembers(wl: np.ndarray) -> np.ndarray:
    """(3, bands) reflectance spectra: soil-like ramp, vegetation-like red edge, bright flat mineral."""
    x = (wl - 380.0) / 2100.0
    soil = 0.08 + 0.30 * x
    veg = 0.04 + 0.40 / (1 + np.exp(-(wl - 715.0) / 12.0)) * np.exp(-((wl - 1000.0) / 900.0) ** 2)
    bright = 0.45 + 0.05 * np.sin(6 * x)
    return np.stack([soil, veg, bright]).astype(np.float32)


def swath_rows(rng: np.random.Generator, r0: int, r1: int, n_cross: int, em: np.ndarray) -> np.ndarray:
    """Swath rows ``r0:r1`` as ``(rows, crosstrack, bands)`` float32: smooth abundances x endmembers + noise."""
    rr, cc = np.meshgrid(np.arange(r0, r1, dtype=np.float32), np.arange(n_cross, dtype=np.float32),
                         indexing="ij")
    a = np.stack([1.2 + np.sin(rr / 37.0) * np.cos(cc / 53.0), 1.0 + np.cos(rr / 71.0 + cc / 29.0),
                  0.3 + 0.3 * np.sin((rr + cc) / 97.0) ** 2], axis=-1)
    a /= a.sum(axis=-1, keepdims=True)
    out = a.reshape(-1, 3) @ em
    out += rng.standard_normal(out.shape, dtype=np.float32) * np.float32(0.003)
    return out.reshape(r1 - r0, n_cross, em.shape[1])


def write_granule(path: Path, spec: GranuleSpec, seed: int = 0, slab_rows: int = 32) -> dict[str, Any]:
    """Write an EMIT L2A RFL granule of ``spec`` with netCDF4, ``reflectance`` slab by slab (memory: one slab)."""
    import netCDF4

    from cubelake.testing.emit import (
        RES_DEG,
        _band_group,
        _globals,
        _location_group,
        emit_wavelengths,
        make_glt,
    )

    rng = np.random.default_rng(seed)
    wl, fw = emit_wavelengths(spec.n_bands)
    em = endmembers(wl)
    glt_x, glt_y = make_glt(spec.n_down, spec.n_cross, ANGLE_DEG)
    gt = (-118.3, RES_DEG, 0.0, 34.2, 0.0, -RES_DEG)
    t0 = time.perf_counter()
    with netCDF4.Dataset(path, "w", format="NETCDF4") as nc:
        nc.set_fill_off()  # the SDS writes every value; no prefill pass over 1.8 GB
        _globals(nc, "L2A", gt, ())
        for name, n in (("downtrack", spec.n_down), ("crosstrack", spec.n_cross), ("bands", spec.n_bands)):
            nc.createDimension(name, n)
        kw: dict[str, Any] = {"contiguous": True}
        if spec.chunk_rows:
            kw = {"chunksizes": (min(spec.chunk_rows, spec.n_down), spec.n_cross, spec.n_bands),
                  "zlib": spec.zlib > 0, "complevel": spec.zlib or 4}
        v = nc.createVariable("reflectance", "f4", ("downtrack", "crosstrack", "bands"), fill_value=-9999.0, **kw)
        v.long_name, v.units = "Hemispherical-Directional Reflectance Factor", "unitless"
        v.set_auto_maskandscale(False)
        for r0 in range(0, spec.n_down, slab_rows):
            r1 = min(spec.n_down, r0 + slab_rows)
            slab = swath_rows(rng, r0, r1, spec.n_cross, em)
            if r0 == 0:
                slab[0, 0, :] = -9999.0  # a bad swath pixel, as the SDS flags them
            v[r0:r1] = slab
        _band_group(nc, wl, fw, good_wavelengths(wl), ())
        _location_group(nc, glt_x, glt_y, gt, spec.n_down, spec.n_cross, ())
    os.sync()
    return {"path": str(path), "file_bytes": path.stat().st_size, "reflectance_bytes": spec.nbytes,
            "swath_shape": [spec.n_down, spec.n_cross, spec.n_bands], "map_shape": list(glt_x.shape),
            "ortho_bytes": int(glt_x.size) * spec.n_bands * 4,
            "glt_valid_pixels": int(np.count_nonzero(glt_x)), "layout": spec.layout,
            "write_s": round(time.perf_counter() - t0, 2), "angle_deg": ANGLE_DEG}


def warm(path: Path) -> float:
    """Read the file once (page cache warm for every method); seconds."""
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(64 * MIB):
            pass
    return time.perf_counter() - t0


# -- measurements, each run in a fresh process ---------------------------------------------------


def _rss_mib() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss) / MIB


def _reset_peak() -> None:
    """Restart this process's peak-RSS count (VmHWM) from its current RSS.

    A spawned child is forked from the parent before it execs, and Linux carries the parent's RSS at
    the fork into the child's ``ru_maxrss``; so each method resets VmHWM first (``clear_refs`` 5,
    Linux >= 4.0) and reads VmHWM afterwards."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5\n")


def _usage() -> dict[str, float]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    with open("/proc/self/status") as f:
        hwm_kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return {"peak_rss_mib": hwm_kib / 1024, "cpu_s": ru.ru_utime + ru.ru_stime}


def _finish(t0: float, base_rss: float, cpu0: float, **extra: Any) -> dict[str, Any]:
    wall = time.perf_counter() - t0
    u = _usage()
    return {"wall_s": round(wall, 3), "peak_rss_mib": round(u["peak_rss_mib"], 1),
            "rss_before_mib": round(base_rss, 1), "cpu_s": round(u["cpu_s"] - cpu0, 2),
            "process_cpu_s": round(u["cpu_s"], 2), **extra}


class RssSampler:
    """RSS every ``every_s`` seconds in a background thread; ``timeline`` keeps each ``bucket_s`` bucket's highest
    value as ``[t_s, rss_mib]`` (the shape of memory over a run: a plateau, or growth)."""

    def __init__(self, every_s: float = 0.02, bucket_s: float = 1.0) -> None:
        import threading

        self.every_s, self.bucket_s = every_s, bucket_s
        self.buckets: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.perf_counter()
        while not self._stop.is_set():
            b = int((time.perf_counter() - t0) / self.bucket_s)
            self.buckets[b] = max(self.buckets.get(b, 0.0), _rss_mib())
            self._stop.wait(self.every_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def timeline(self) -> list[list[float]]:
        return [[round(b * self.bucket_s, 1), round(v, 1)] for b, v in sorted(self.buckets.items())]


def valid_stats(block: np.ndarray) -> tuple[int, float]:
    """(count, float64 sum) of the values that are neither fill (-9999) nor NaN."""
    ok = np.isfinite(block) & (block != -9999.0)
    return int(np.count_nonzero(ok)), float(np.sum(block[ok], dtype=np.float64))


def child_ingest(path: str, lake: str, workers: int) -> dict[str, Any]:
    """cubelake's ingest (API) of one granule into a new lake; RSS at every stage change."""
    _reset_peak()
    from cubelake.ingest import IngestOptions, ingest

    stages: list[dict[str, Any]] = []

    def progress(ev: Any) -> None:
        if not stages or stages[-1]["stage"] != ev.stage or (ev.stage == "scan" and ev.done == ev.total):
            stages.append({"stage": ev.stage, "done": ev.done, "total": ev.total,
                           "t_s": round(time.perf_counter() - t0, 2),
                           "rss_mib": round(_rss_mib(), 1), "peak_so_far_mib": round(_usage()["peak_rss_mib"], 1)})

    options = IngestOptions(products=("cog", "zarr"), workers=workers)
    base, cpu0 = _rss_mib(), _usage()["cpu_s"]
    t0 = time.perf_counter()
    with RssSampler() as sampler:
        results = ingest([path], lake, options, progress=progress)
    out = _finish(t0, base, cpu0, stages=stages, rss_timeline=sampler.timeline)
    r = results[0]
    if r.outcome.value != "ingested":
        raise RuntimeError(f"ingest of {path} did not succeed: {r.outcome}: {r.message}")
    out.update(scene_id=r.scene_id, products=dict(r.products), message=r.message)
    return out


def child_naive(path: str) -> dict[str, Any]:
    """The LP DAAC recipe: the whole swath through xarray (h5netcdf), then apply_glt on whole arrays."""
    _reset_peak()
    import xarray as xr

    from cubelake.testing.emit import apply_glt

    base, cpu0 = _rss_mib(), _usage()["cpu_s"]
    t0 = time.perf_counter()
    with xr.open_dataset(path, engine="h5netcdf") as ds, \
            xr.open_dataset(path, engine="h5netcdf", group="location") as loc:
        swath = ds["reflectance"].values  # the whole swath (fill -> NaN by xarray's CF decoding)
        # the GLT's _FillValue 0 decodes to NaN; emit_tools' ortho_xr turns it back with nan_to_num
        glt_x, glt_y = (np.nan_to_num(loc[k].values, nan=0).astype(np.int64) for k in ("glt_x", "glt_y"))
    ortho = apply_glt(swath, glt_x, glt_y)  # (band, y, x) view of a (y, x, band) array
    out = _finish(t0, base, cpu0, ortho_shape=list(ortho.shape))
    del swath
    count, total = 0, 0.0
    base_arr = ortho.transpose(1, 2, 0)  # the (y, x, band) array itself: row blocks are contiguous
    for r in range(0, base_arr.shape[0], 64):
        c, s = valid_stats(base_arr[r : r + 64])
        count, total = count + c, total + s
    out.update(valid_count=count, valid_sum=total)
    return out


def child_reader(path: str, window: int) -> dict[str, Any]:
    """cubelake's EMIT reader alone: every ``window``-square window of the map grid, nothing written."""
    _reset_peak()
    from cubelake.grid import Window
    from cubelake.ingest.sources import discover, open_source

    (inp,) = discover([path])
    base, cpu0 = _rss_mib(), _usage()["cpu_s"]
    t0 = time.perf_counter()
    src = open_source(inp)
    h, w = src.meta.height, src.meta.width
    count, total, read_s, n = 0, 0.0, time.perf_counter() - t0, 0  # the open counts, the checksums do not
    try:
        for r in range(0, h, window):
            for c in range(0, w, window):
                t1 = time.perf_counter()
                block = src.read(Window(r, c, min(window, h - r), min(window, w - c)))
                read_s += time.perf_counter() - t1
                cnt, s = valid_stats(block)
                count, total, n = count + cnt, total + s, n + 1
    finally:
        src.close()
    out = _finish(t0, base, cpu0, loop_s=round(time.perf_counter() - t0, 3), windows=n, map_shape=[h, w],
                  valid_count=count, valid_sum=total)
    out["wall_s"] = round(read_s, 3)  # open + reads: the reader's own time, without the checksums
    return out


def child_ceiling(path: str, budget: int) -> dict[str, Any]:
    """Read every byte of ``reflectance`` once with h5py, in row slabs of at most ``budget`` bytes."""
    _reset_peak()
    import h5py

    base, cpu0 = _rss_mib(), _usage()["cpu_s"]
    t0 = time.perf_counter()
    with h5py.File(path, "r") as f:
        ds = f["reflectance"]
        n_down, n_cross, n_bands = ds.shape
        row_bytes = n_cross * n_bands * ds.dtype.itemsize
        rows = ds.chunks[0] if ds.chunks else max(1, budget // row_bytes)
        buf = np.empty((rows, n_cross, n_bands), dtype=ds.dtype)
        for r0 in range(0, n_down, rows):
            r1 = min(n_down, r0 + rows)
            ds.read_direct(buf, np.s_[r0:r1], np.s_[0 : r1 - r0])
    return _finish(t0, base, cpu0, slab_rows=int(rows), slab_mib=round(rows * row_bytes / MIB, 1),
                   storage="chunked" if ds.chunks else "contiguous")


# -- checks after the runs (in this process, window by window) ------------------------------------


def check_zarr(granule: Path, zarr_path: Path) -> list[str]:
    """The ingested Zarr ``data`` equals the reader's output (kept bands) on a few windows of the map grid."""
    import zarr

    from cubelake.grid import Window
    from cubelake.ingest.sources import discover, open_source

    failures: list[str] = []
    group = zarr.open_group(str(zarr_path), mode="r")
    arr: Any = group["data"]
    (inp,) = discover([granule])
    src = open_source(inp)
    try:
        h, w = src.meta.height, src.meta.width
        if tuple(arr.shape[1:]) != (h, w):
            return [f"Zarr data {arr.shape} is not on the map grid {h}x{w}"]
        bands = _kept_bands(group, arr.shape[0])
        for r, c, wh, ww in ((0, 0, 256, 256), (h // 2 - 100, w // 2 - 150, 300, 300), (h - 70, w - 90, 70, 90)):
            want = src.read(Window(r, c, wh, ww))[bands]
            got = np.asarray(arr[:, r : r + wh, c : c + ww])
            if not np.array_equal(np.nan_to_num(got, nan=-9999.0), np.nan_to_num(want, nan=-9999.0)):
                failures.append(f"Zarr differs from the reader in window rows {r}+{wh}, cols {c}+{ww}")
    finally:
        src.close()
    return failures


def _kept_bands(group: Any, n_stored: int) -> np.ndarray:
    """0-based indices of the source bands the product stores: its ``band`` coordinate holds 1-based source
    band numbers (the profile drops EMIT's bad bands)."""
    idx = np.asarray(group["band"][:]).astype(np.int64) - 1
    if idx.shape != (n_stored,):
        raise RuntimeError(f"the Zarr's band coordinate has {idx.shape} values for {n_stored} stored bands")
    return idx


# -- the run ------------------------------------------------------------------------------------

METHODS = ("ceiling", "reader", "ingest", "naive")
LABELS = {
    "ceiling": "ceiling: h5py read of every swath byte (<= 64 MiB slabs)",
    "reader": "cubelake EMIT reader, all 256² map windows, no writing",
    "ingest": "cubelake ingest --products cog,zarr (2 workers)",
    "naive": "naive: xarray whole swath + apply_glt (LP DAAC recipe)",
}


def wait_quiet(max_wait_s: float) -> float:
    """Wait (up to ``max_wait_s``) until other processes use under 0.1 cores for 2 s; seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < max_wait_s:
        b0 = busy_cpu_seconds()
        time.sleep(2.0)
        if (busy_cpu_seconds() - b0) / 2.0 < 0.1:
            break
    return time.monotonic() - t0


def run_method(method: str, granule: Path, work: Path, drop: bool, workers: int) -> dict[str, Any]:
    """One measured run; ``other_cores``: what other processes of the machine used meanwhile, on average."""
    if drop:
        drop_caches()
    t0, busy0 = time.perf_counter(), busy_cpu_seconds()
    r = _run_method(method, granule, work, workers)
    wall, busy = time.perf_counter() - t0, busy_cpu_seconds() - busy0
    r["other_cores"] = round(max(0.0, busy - r["process_cpu_s"]) / wall, 2)
    if method == "ingest":
        lake = work / "lake"
        zarr_path = Path(r["products"]["zarr"])
        r["check_failures"] = check_zarr(granule, zarr_path if zarr_path.is_absolute() else lake / zarr_path)
        r["lake_bytes"] = sum(p.stat().st_size for p in lake.rglob("*") if p.is_file())
        shutil.rmtree(lake, ignore_errors=True)
    return r


def _run_method(method: str, granule: Path, work: Path, workers: int) -> dict[str, Any]:
    if method == "ingest":
        lake = work / "lake"
        shutil.rmtree(lake, ignore_errors=True)
        return isolated(child_ingest, path=str(granule), lake=str(lake), workers=workers)
    if method == "naive":
        return isolated(child_naive, path=str(granule))
    if method == "reader":
        return isolated(child_reader, path=str(granule), window=WINDOW)
    from cubelake.ingest.sources.emit import SLAB_BUDGET_BYTES

    return isolated(child_ceiling, path=str(granule), budget=SLAB_BUDGET_BYTES)


def naive_fits(info: dict[str, Any]) -> tuple[bool, float]:
    """Whether the naive recipe's expected peak (swath x 2 for CF decoding + ortho cube + gathered pixels)
    fits in 80 % of the available memory; and that estimate in MiB."""
    import psutil

    need = 2 * info["reflectance_bytes"] + info["ortho_bytes"] + info["glt_valid_pixels"] * info["swath_shape"][2] * 4
    return need < 0.8 * psutil.virtual_memory().available, need / MIB


def run_size(name: str, spec: GranuleSpec, a: argparse.Namespace, root: Path, drop: bool) -> dict[str, Any]:
    """Write one granule, run every method ``a.repeats`` times (round-robin), check, summarise."""
    work = root / name
    work.mkdir()
    granule = work / f"EMIT_L2A_RFL_001_bench_{name}.nc"
    info = write_granule(granule, spec)
    print(f"[{name}] wrote {granule.name}: swath {spec.n_down}x{spec.n_cross}x{spec.n_bands} float32 = "
          f"{spec.nbytes / 1e9:.2f} GB ({spec.nbytes / 2**30:.2f} GiB), map grid {info['map_shape'][0]}x"
          f"{info['map_shape'][1]}, {info['layout']}; {info['write_s']:.1f} s", flush=True)
    info["warm_read_s"] = round(warm(granule), 2)
    fits, need = naive_fits(info)
    methods = [m for m in METHODS if m != "naive" or (fits and not a.skip_naive)]
    if "naive" not in methods:
        print(f"[{name}] naive skipped ({'--skip-naive' if a.skip_naive else f'needs ~{need:.0f} MiB'})")
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for rnd in range(a.repeats):
        for m in methods:
            waited = wait_quiet(a.quiet_wait)
            r = run_method(m, granule, work, drop, a.workers)
            r["waited_for_quiet_s"] = round(waited, 1)
            runs[m].append(r)
            print(f"[{name}] {m:<8} round {rnd}: {r['wall_s']:7.2f} s  peak RSS {r['peak_rss_mib']:7.0f} MiB "
                  f"(before {r['rss_before_mib']:.0f})  CPU {r['cpu_s']:.1f} s  others {r['other_cores']:.2f} cores",
                  flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return {"granule": info, "runs": runs, "summary": summarise(runs, info), "failures": failures_of(runs)}


def failures_of(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Reader and naive agree on the orthorectified values; the ingested Zarr equals the reader."""
    out = [f for r in runs.get("ingest", []) for f in r["check_failures"]]
    if runs.get("naive") and runs.get("reader"):
        a, b = runs["reader"][0], runs["naive"][0]
        if a["valid_count"] != b["valid_count"] or not math.isclose(a["valid_sum"], b["valid_sum"], rel_tol=1e-9):
            out.append(f"reader ({a['valid_count']} values, sum {a['valid_sum']!r}) and naive "
                       f"({b['valid_count']}, {b['valid_sum']!r}) orthorectify differently")
    return out


def summarise(runs: dict[str, list[dict[str, Any]]], info: dict[str, Any]) -> dict[str, Any]:
    s: dict[str, Any] = {}
    for m, rs in runs.items():
        walls = [r["wall_s"] for r in rs]
        peak = max(r["peak_rss_mib"] for r in rs)
        before = min(r["rss_before_mib"] for r in rs)
        s[m] = {"wall_best_s": min(walls), "walls_s": walls, "peak_rss_mib": peak, "rss_before_mib": before,
                "work_rss_mib": round(max(r["peak_rss_mib"] - r["rss_before_mib"] for r in rs), 1)}
    gran_mib = info["reflectance_bytes"] / MIB
    ratios: dict[str, float] = {"ingest_peak_rss_over_granule": s["ingest"]["peak_rss_mib"] / gran_mib,
                                "ingest_time_over_ceiling": s["ingest"]["wall_best_s"] / s["ceiling"]["wall_best_s"],
                                "reader_time_over_ceiling": s["reader"]["wall_best_s"] / s["ceiling"]["wall_best_s"],
                                "reader_peak_rss_over_granule": s["reader"]["peak_rss_mib"] / gran_mib}
    if "naive" in s:
        ratios["ingest_peak_rss_over_naive"] = s["ingest"]["peak_rss_mib"] / s["naive"]["peak_rss_mib"]
        ratios["naive_peak_rss_over_granule"] = s["naive"]["peak_rss_mib"] / gran_mib
        ratios["ingest_time_over_naive"] = s["ingest"]["wall_best_s"] / s["naive"]["wall_best_s"]
    s["ratios"] = {k: round(v, 3) for k, v in ratios.items()}
    return s


def print_table(results: dict[str, dict[str, Any]]) -> None:
    for name, res in results.items():
        g, s = res["granule"], res["summary"]
        print(f"\n{name}: swath {'x'.join(map(str, g['swath_shape']))} float32, reflectance "
              f"{g['reflectance_bytes'] / MIB:,.0f} MiB, map grid {g['map_shape'][0]}x{g['map_shape'][1]} "
              f"(ortho cube {g['ortho_bytes'] / MIB:,.0f} MiB)")
        print(f"  {'method':<58} {'best s':>8} {'peak RSS MiB':>13} {'before MiB':>11} {'work MiB':>9}")
        for m in METHODS:
            if m in s:
                r = s[m]
                print(f"  {LABELS[m]:<58} {r['wall_best_s']:>8.2f} {r['peak_rss_mib']:>13,.0f} "
                      f"{r['rss_before_mib']:>11,.0f} {r['work_rss_mib']:>9,.0f}")
        print("  ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in s["ratios"].items()))
        last = res["runs"]["ingest"][-1]
        print("  ingest progress events (t s, RSS MiB / peak so far): " + "; ".join(
            f"{st['stage']} {st['done']}/{st['total']} at {st['t_s']}: {st['rss_mib']:.0f}/{st['peak_so_far_mib']:.0f}"
            for st in last["stages"]))
        tl = last["rss_timeline"]
        step = max(1, len(tl) // 12)
        print("  ingest RSS over time (t s: highest MiB in that second): "
              + ", ".join(f"{t:.0f}: {v:.0f}" for t, v in tl[::step]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="only the ~100 MB granule (a smoke run)")
    ap.add_argument("--sizes", default="small,full", help=f"granules to run, of {', '.join(SIZES)}")
    ap.add_argument("--repeats", type=int, default=2, help="rounds over the methods (best time, highest RSS)")
    ap.add_argument("--workers", type=int, default=2, help="ingest worker threads")
    ap.add_argument("--chunk-rows", type=int, default=0, help="chunk reflectance (rows, crosstrack, bands); 0: contiguous")
    ap.add_argument("--zlib", type=int, default=0, help="deflate level of the chunks (with --chunk-rows)")
    ap.add_argument("--skip-naive", action="store_true", help="leave out the whole-array recipe")
    ap.add_argument("--cold", action="store_true", help="drop the page cache before every run (root only)")
    ap.add_argument("--quiet-wait", type=float, default=10.0,
                    help="before each run, wait up to this many seconds for other processes to go idle")
    ap.add_argument("--tmp", type=Path, default=Path("/tmp"), help="the granules go in a new folder here")
    ap.add_argument("--json", type=Path, default=None,
                    help="results (default bench/results/emit_memory.json; emit_memory_<sizes>.json for other --sizes)")
    a = ap.parse_args()
    if a.zlib and not a.chunk_rows:
        ap.error("--zlib needs --chunk-rows (HDF5 compresses chunks only)")
    drop = a.cold and can_drop_caches()
    if a.cold and not drop:
        print("note: not root, the page cache cannot be dropped; runs read the granule warm")
    names = ["small"] if a.small else a.sizes.split(",")
    if unknown := [n for n in names if n not in SIZES]:
        ap.error(f"--sizes: unknown {unknown}; choose from {', '.join(SIZES)}")
    sizes = {n: SIZES[n] for n in names}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the granules' folder is removed
    root = Path(tempfile.mkdtemp(prefix="emit_memory_", dir=a.tmp))
    t0 = time.perf_counter()
    try:
        results = {name: run_size(name, GranuleSpec(*shape, a.chunk_rows, a.zlib), a, root, drop)
                   for name, shape in sizes.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(results)
    scaling = {n: {"reflectance_mib": round(r["granule"]["reflectance_bytes"] / MIB),
                   "ingest_peak_rss_mib": r["summary"]["ingest"]["peak_rss_mib"],
                   "reader_peak_rss_mib": r["summary"]["reader"]["peak_rss_mib"]} for n, r in results.items()}
    print("\ningest peak RSS by granule size: " + "; ".join(
        f"{n} {v['reflectance_mib']:,} MiB -> {v['ingest_peak_rss_mib']:,.0f} MiB" for n, v in scaling.items()))
    failures = [f"{n}: {f}" for n, r in results.items() for f in r["failures"]]
    done = "Zarr == reader on 3 windows" + ("; reader == naive (count and sum of valid values)"
                                           if all("naive" in r["runs"] for r in results.values()) else "")
    print("\nchecks: " + (done if not failures else "FAILED"))
    for f in failures:
        print("  " + f)
    default = "emit_memory.json" if names == ["small", "full"] else f"emit_memory_{'_'.join(names)}.json"
    out = a.json or HERE / "results" / default
    doc = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "total_s": round(time.perf_counter() - t0, 1),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
           "args": {k: str(v) for k, v in vars(a).items()}, "page_cache": "dropped before each run" if drop else "warm",
           "window": WINDOW, "results": results, "scaling": scaling, "failures": failures,
           "spec": {n: asdict(GranuleSpec(*shape, a.chunk_rows, a.zlib)) for n, shape in sizes.items()}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out} ({doc['total_s']} s in all)")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
